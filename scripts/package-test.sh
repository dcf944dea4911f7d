#!/usr/bin/env bash
# The package tier: builds the .deb (`make package`), installs it on this machine's PostgreSQL 15
# with apt as a user would, checks that the installed files are the package's, and runs the
# smoke tests against it: the cluster tier (a fresh cluster with pg_tide preloaded, CREATE
# EXTENSION, runs through the real workers) and the upgrade tier (the frozen 0.2.0 brought up to
# date). Runs last in `make test`: the release build stays installed, owned by the package.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
bash scripts/package.sh
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
name=postgresql-15-pg-tide
deb="$PWD/target/${name}_${version}-1_$(dpkg --print-architecture).deb"

echo "==> apt-get install $deb"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --reinstall --allow-downgrades "$deb" >/dev/null
dpkg-query -W -f='${Status} ${Version}\n' "$name" | grep -qx "install ok installed $version-1" || {
    echo "package-test: $name $version-1 is not installed" >&2
    exit 1
}
# Every file the package ships is on disk as the package has it (the .so that cargo pgrx
# install put there was replaced).
dpkg --verify "$name" || { echo "package-test: installed files differ from the package" >&2; exit 1; }
for f in "$($PG_CONFIG --pkglibdir)/pg_tide.so" \
         "$($PG_CONFIG --sharedir)/extension/pg_tide.control" \
         "$($PG_CONFIG --sharedir)/extension/pg_tide--$version.sql"; do
    dpkg -S "$f" | grep -q "^$name: " || { echo "package-test: $f is not from $name" >&2; exit 1; }
done
echo "==> the smoke tests against the installed package"
cargo test -p pg_tide_pg_test --test cluster
cargo test -p pg_tide_pg_test --test upgrade

#!/usr/bin/env bash
# The package tier: builds the .debs (`make package`), installs each with apt as a user would, in
# its own release (PostgreSQL 15 here, 17 and 18 in the chroots of scripts/chroot.sh), checks
# that the installed files are the package's, and runs the smoke tests against it: the cluster
# tier (a fresh cluster with pg_tide preloaded, CREATE EXTENSION, runs through the real workers)
# and the upgrade tier (every frozen version brought up to date); the console's unit is checked
# with systemd-analyze verify and its binary started the way the unit starts it. Runs last in
# `make test`: the release build stays installed, owned by the package.
# `scripts/package-test.sh extension` checks only the extension's package of $PG_CONFIG's
# PostgreSQL, already built (what runs in a chroot).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
what=${1:-all}
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
major=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
[ "$what" = extension ] || bash scripts/package.sh
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
name=postgresql-$major-pg-tide
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
if [ "$what" = extension ]; then
    exit 0
fi
for release in trixie forky; do
    bash scripts/chroot.sh "$release" bash scripts/package-test.sh extension
done
# pg_upgrade from 15 to 17 with pg_tide and its data (in the trixie chroot, where both are).
bash scripts/chroot.sh trixie bash scripts/pg-upgrade-test.sh

# The console's package: installed, its files as shipped, its unit valid, its options file a
# conffile only root reads.
cname=pg-tide-console
cdeb="$PWD/target/${cname}_${version}-1_$(dpkg --print-architecture).deb"
echo "==> apt-get install $cdeb"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --reinstall --allow-downgrades "$cdeb" >/dev/null
dpkg-query -W -f='${Status} ${Version}\n' "$cname" | grep -qx "install ok installed $version-1" || {
    echo "package-test: $cname $version-1 is not installed" >&2
    exit 1
}
dpkg --verify "$cname" || { echo "package-test: installed files of $cname differ from the package" >&2; exit 1; }
unit=/lib/systemd/system/pg-tide-console.service
env_file=$(sed -n 's/^EnvironmentFile=//p' "$unit")
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
dpkg-query -W -f='${Conffiles}\n' "$cname" | grep -q "^ $env_file " || { echo "package-test: $env_file is not a conffile" >&2; exit 1; }
[ "$(stat -c '%a %U' "$env_file")" = "600 root" ] || { echo "package-test: $env_file is not root's alone" >&2; exit 1; }
echo "==> systemd-analyze verify $unit"
systemd-analyze verify "$unit"
"$exec_start" --version | grep -qx "pg_tide-console $version" || { echo "package-test: $exec_start is not $version" >&2; exit 1; }
# Started as the unit starts it: its ExecStart, with the variables of its EnvironmentFile (read
# as systemd reads it: VARIABLE=value lines, # comments), as a user that is not root (systemd
# makes one; nobody here), nothing else in its environment. Only the listen address is moved
# to a free port (8790 may be taken on this machine). It serves its sign-in page there.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
vars=()
while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in ''|'#'*) ;; PG_TIDE_CONSOLE_LISTEN=*) vars+=("PG_TIDE_CONSOLE_LISTEN=127.0.0.1:$port") ;; *) vars+=("$line") ;; esac
done < "$env_file"
log=$(mktemp)
setpriv --reuid=65534 --regid=65534 --clear-groups env -i "${vars[@]}" "$exec_start" > "$log" 2>&1 &
console_pid=$!
trap 'kill $console_pid 2>/dev/null || true' EXIT
python3 - "$port" "$log" <<'PY'
import sys, time, urllib.request
port, log = sys.argv[1], sys.argv[2]
deadline = time.time() + 30
while True:
    try:
        page = urllib.request.urlopen("http://127.0.0.1:%s/login" % port, timeout=5).read().decode()
        break
    except OSError as e:
        if time.time() > deadline:
            sys.exit("package-test: the console did not serve on port %s: %s\n%s" % (port, e, open(log).read()))
        time.sleep(0.2)
assert "Sign in" in page and 'id="sign-in"' in page, page
print("==> the console serves its sign-in page as the unit starts it (as nobody): " + open(log).read().strip())
PY
kill $console_pid
wait $console_pid 2>/dev/null || true
trap - EXIT

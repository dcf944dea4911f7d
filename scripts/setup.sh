#!/usr/bin/env bash
# Installs what pg_tide needs to build, test and run, on Debian 12 as root. Idempotent: when
# everything is present it only checks, in a few seconds.
set -euo pipefail

PGRX_VERSION=0.18.1
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
# python3-prometheus-client: the monitoring tests check tide.metrics() with the reference parser.
# python3-venv: pgspot (the security linter of extension scripts) is installed in a venv from PyPI.
# postgresql-15-cron: pg_cron itself, for the tests of tide.import_pg_cron and the demo.
# chromium, chromium-driver: a real headless browser (through WebDriver) for the console's tests.
# golang-go, golang-github-lib-pq-dev: the Go example worker (examples/go), built without modules.
# dpkg-dev: dpkg-deb and dpkg-shlibdeps for `make package`.
# systemd: systemd-analyze, which the package tier checks the console's unit with.
# openssl: the console tier makes a CA and a server certificate for its cluster's ssl = on.
# prometheus (for promtool), python3-yaml: the console tier checks and tests monitoring/'s alert
# rules and Grafana panels against a recorded scrape of /metrics.
# debootstrap: the chroots of PostgreSQL 17 (Debian trixie) and 18 (forky) (scripts/chroot.sh).
# patroni, etcd-server: the high-availability tier; pgbouncer: the pooler tier.
APT_PACKAGES=(postgresql-15 postgresql-server-dev-15 libclang-dev clang sudo make python3-prometheus-client
              postgresql-15-cron
              python3-venv
              chromium chromium-driver
              golang-go golang-github-lib-pq-dev
              dpkg-dev systemd openssl
              prometheus python3-yaml
              debootstrap patroni etcd-server pgbouncer)
PGSPOT_VERSION=0.9.4
PGSPOT_VENV=${PG_TIDE_PGSPOT_VENV:-$HOME/.cache/pg_tide/pgspot-venv}

say() { printf '==> %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
    echo "setup: run as root (it installs Debian packages); found uid $(id -u)" >&2
    exit 1
fi

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Debian starts its own "main" cluster on 5432 when the package is installed; pg_tide's demo
# and tests run their own clusters and do not need it.

export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo pgrx --version 2>/dev/null | grep -q " $PGRX_VERSION\$"; then
    say "installing cargo-pgrx $PGRX_VERSION (takes a few minutes)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

# CI checks format and lints (scripts/test.sh): rustfmt and clippy come with rustup's default
# profile; add them where a minimal profile left them out.
for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        say "adding the Rust component $component"
        rustup component add "$component"
    fi
done

pgrx_config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
if ! grep -qs "^pg15 = \"$PG_CONFIG\"" "$pgrx_config"; then
    say "pointing pgrx at Debian's PostgreSQL 15"
    cargo pgrx init --pg15 "$PG_CONFIG"
fi

if ! "$PGSPOT_VENV/bin/pgspot" --version 2>/dev/null | grep -q " $PGSPOT_VERSION\$"; then
    say "installing pgspot $PGSPOT_VERSION into $PGSPOT_VENV"
    rm -rf "$PGSPOT_VENV"
    mkdir -p "$(dirname "$PGSPOT_VENV")"
    /usr/bin/python3 -m venv "$PGSPOT_VENV"
    "$PGSPOT_VENV/bin/pip" install -q "pgspot==$PGSPOT_VERSION"
fi

say "setup complete: $(cargo pgrx --version), PostgreSQL $($PG_CONFIG --version | awk '{print $2}'), $("$PGSPOT_VENV/bin/pgspot" --version)"

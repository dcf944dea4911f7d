#!/usr/bin/env bash
# The tiers `make test` runs for PostgreSQL 17 and 18, inside their release's chroot
# (scripts/chroot.sh trixie|forky bash scripts/release-tiers.sh): the SQL API inside PostgreSQL,
# then pg_tide installed into the release's server and the cluster, upgrade, engine, security
# and fuzz tiers against it. PG_MAJOR, PG_CONFIG and PG_TIDE_PG_BIN come from chroot.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${PG_MAJOR:?run through scripts/chroot.sh}" "${PG_CONFIG:?}" "${PG_TIDE_PG_BIN:?}"
say() { printf '\n==> PostgreSQL %s: %s\n' "$PG_MAJOR" "$*"; }

say "the SQL API inside PostgreSQL (cargo pgrx test pg$PG_MAJOR)"
cargo pgrx test "pg$PG_MAJOR" sql_tests --runas postgres --pgdata "/tmp/pg_tide-pgdata-$PG_MAJOR"
# A release build: the package tier's `cargo pgrx package` in this chroot is the same cargo build,
# so it finds it done (CI time: a release build costs about a minute more than a debug one here,
# and saves the package's two).
say "installing pg_tide into PostgreSQL $PG_MAJOR (release build)"
bash scripts/install.sh --release
for tier in ${PG_TIDE_RELEASE_TIERS:-cluster upgrade engine security fuzz}; do
    say "the $tier tier"
    cargo test -p pg_tide_pg_test --test "$tier"
done

#!/usr/bin/env bash
# Builds pg_tide and installs it into Debian's PostgreSQL 15: the library, the current version's
# install script and the upgrade scripts (cargo pgrx install), and the frozen install scripts of
# earlier versions (sql/pg_tide--X.Y.Z.sql), so that `CREATE EXTENSION pg_tide VERSION 'X.Y.Z'`
# and `ALTER EXTENSION pg_tide UPDATE` from it work (the upgrade tier installs the oldest).
# Arguments go to cargo pgrx install (--release for an optimised build).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
cargo pgrx install --pg-config "$PG_CONFIG" "$@"
bash scripts/frozen.sh "$("$PG_CONFIG" --sharedir)/extension"

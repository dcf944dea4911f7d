#!/usr/bin/env bash
# The main job, the way a user runs pg_tide: install the extension into Debian's PostgreSQL 15,
# start a cluster with pg_tide preloaded, create the extension, schedule realistic tasks and
# show their fire times and business windows. The cluster is left running for you to explore.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

PORT=${PG_TIDE_DEMO_PORT:-5499}
DATA=${PG_TIDE_DEMO_DATA:-/var/tmp/pg_tide-demo}
BIN=/usr/lib/postgresql/15/bin
DB=pg_tide_demo

bash scripts/setup.sh

echo "==> building and installing pg_tide (release)"
cargo pgrx install --release --pg-config "$BIN/pg_config"

as_pg() { sudo -u postgres "$@"; }

if [ -f "$DATA/PG_VERSION" ]; then
    echo "==> replacing the previous demo cluster in $DATA"
    as_pg "$BIN/pg_ctl" -D "$DATA" stop -m fast -w >/dev/null 2>&1 || true
    rm -rf "$DATA"
fi
echo "==> starting PostgreSQL 15 on port $PORT with shared_preload_libraries = 'pg_tide'"
mkdir -p "$(dirname "$DATA")"
as_pg "$BIN/initdb" --auth=trust --username=postgres --encoding=UTF8 -D "$DATA" >/dev/null
cat >> "$DATA/postgresql.conf" <<CONF
# pg_tide demo
port = $PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '/tmp'
shared_preload_libraries = 'pg_tide'
pg_tide.database = '$DB'
CONF
as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" start -w -t 60 >/dev/null

PSQL=("$BIN/psql" -X -h 127.0.0.1 -p "$PORT" -U postgres)
"${PSQL[@]}" -q -d postgres -c "CREATE DATABASE $DB"
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 -P pager=off -f demo/demo.sql

cat <<EOT

==> the demo cluster is running. Connect with:

    psql -h 127.0.0.1 -p $PORT -U postgres $DB

    stop it with: make demo-stop
EOT

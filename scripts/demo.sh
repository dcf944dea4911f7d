#!/usr/bin/env bash
# The main job, the way a user runs pg_tide: install the extension into Debian's PostgreSQL 15,
# start a cluster with pg_tide preloaded and its workers, schedule realistic tasks, show their
# fire times and business windows across DST, then watch real runs: on time, a retry, a dead
# letter and its replay; event runs in per-key order under a lock; a long task in batches,
# paused and resumed; pg_cron jobs imported and a VACUUM run at top level; one-off and delayed
# jobs; a queue limit holding; then a failing task's alert, a heartbeat check and the dashboard.
# The cluster is left running for you to explore.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

PORT=${PG_TIDE_DEMO_PORT:-5499}
DATA=${PG_TIDE_DEMO_DATA:-/var/tmp/pg_tide-demo}
DB=pg_tide_demo
. scripts/cluster.sh

bash scripts/setup.sh
install_release
# pg_cron beside pg_tide, for the import of pg_cron jobs the demo shows.
start_cluster "$DATA" "$PORT" "$DB" "shared_preload_libraries = 'pg_tide,pg_cron'
cron.database_name = '$DB'"

PSQL=("$BIN/psql" -X -h 127.0.0.1 -p "$PORT" -U postgres)
"${PSQL[@]}" -q -d postgres -c "CREATE DATABASE $DB"
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 -P pager=off -f demo/demo.sql

cat <<EOT

==> the demo cluster is running. Connect with:

    psql -h 127.0.0.1 -p $PORT -U postgres $DB

    stop it with: make demo-stop
EOT

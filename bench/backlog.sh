#!/usr/bin/env bash
# Claims with a backlog (issue 45; run by bench/bench.sh last, or alone): an external worker's
# claim + complete at batch 1 from 4 clients (a queue's burn-down) and the time of one claim +
# complete, first with only the runs it drains waiting, then with 500,000 runs waiting in the
# same queue. A backlog must not slow a claim (target: the backlog's rate at least 0.9x the
# other's): with 484,000 ready runs the claim's generic plan once cost past jit_above_cost, and
# every claim was JIT-compiled (13.7 ms against 1.2 ms). For comparison, the same backlog with
# JIT forced into the claim (ALTER FUNCTION ... SET jit_above_cost = 0), as it was.
# Figures are printed, never asserted. Uses a throw-away cluster with the release build
# (PG_TIDE_BENCH_INSTALLED=1: the one installed already, as bench/bench.sh leaves it).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

PORT=${PG_TIDE_BENCH_BACKLOG_PORT:-5499}
DATA=${PG_TIDE_BENCH_BACKLOG_DATA:-/var/tmp/pg_tide-bench-backlog}
DB=bench
CLIENTS=4
TX=${PG_TIDE_BENCH_TX1:-2500}   # claim + complete pairs per client in each measurement
BACKLOG=500000
. scripts/cluster.sh

if [ "${PG_TIDE_BENCH_INSTALLED:-}" != 1 ]; then
    bash scripts/setup.sh >/dev/null
    install_release
fi
start_cluster "$DATA" "$PORT" "$DB" "max_connections = 40"
trap 'as_pg "$BIN/pg_ctl" -D "$DATA" stop -m fast -w >/dev/null 2>&1; rm -rf "$DATA"' EXIT

PSQL=("$BIN/psql" -X -q -h 127.0.0.1 -p "$PORT" -U postgres)
"${PSQL[@]}" -d postgres -c "CREATE DATABASE $DB"
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 <<'SQL'
CREATE EXTENSION pg_tide;
ALTER DATABASE bench SET pg_tide.log_runs = off;
SELECT tide.schedule('bench', '0 0 1 1 *', queue => 'bench', overlap => 'allow');
SQL

# Ready runs of the queue, inserted directly (one distinct window each), as the tick would make
# them; then VACUUM ANALYZE, as autovacuum would soon after.
fill() { # $1 = number of runs
    "${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 -v n="$1" <<'SQL'
WITH created AS (
    INSERT INTO tide.run (task_id, trigger, window_start, window_end, biz_date, version, state,
                          reason, executor, queue, owner)
    SELECT t.task_id, 'manual', w, w + interval '1 second', w::date, 1, 'ready', 'bench fixture',
           'external', 'bench', 'postgres'
      FROM tide.task t,
           LATERAL (SELECT coalesce(max(window_end), '2000-01-01') AS s FROM tide.run) last,
           generate_series(1, :n) g,
           LATERAL (SELECT last.s + g * interval '1 second' AS w) x
     WHERE t.name = 'bench'
    RETURNING run_id, task_id)
INSERT INTO tide.pending (run_id, task_id, state, executor, queue, priority, owner)
SELECT run_id, task_id, 'ready', 'external', 'bench', 0, 'postgres' FROM created;
VACUUM ANALYZE tide.run;
VACUUM ANALYZE tide.pending;
SQL
}

# Leaves no run of the queue (a throw-away database: emptied without the bookkeeping a DELETE
# of 500,000 runs would do).
clear_queue() {
    "${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 \
        -c "TRUNCATE tide.run, tide.pending, tide.run_event, tide.count_delta, tide.task_touch" >/dev/null
}

tmp=$(mktemp -d)
cat > "$tmp/tide.sql" <<'SQL'
SELECT array_agg(run_id)::text AS ids, array_agg(lease_token)::text AS tokens
  FROM tide.claim_runs('bench', 'bench', 1) \gset
SELECT count(tide.complete_run(u.run_id, u.token))
  FROM unnest(':ids'::bigint[], ':tokens'::bigint[]) AS u(run_id, token);
SQL

# "tps latency_ms" of $1 (default $TX) claim + complete pairs per client, 4 clients.
measure() {
    "$BIN/pgbench" -n -h 127.0.0.1 -p "$PORT" -U postgres -c "$CLIENTS" -j "$CLIENTS" -t "${1:-$TX}" \
        -f "$tmp/tide.sql" "$DB" 2>/dev/null \
        | awk '/^latency average/ { lat = $4 } /^tps = / { tps = $3 } END { printf "%.0f %.2f\n", tps, lat }'
}
best() { # keeps the better of two "tps latency" pairs (by tps)
    awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " "); print (x[1] + 0 >= y[1] + 0 ? a : b) }'
}

echo "==> claims with a backlog: claim + complete at batch 1, 4 clients, $((CLIENTS * TX)) pairs each (best of 3)"
empty="0 0"
backlog="0 0"
for round in 1 2 3; do
    clear_queue
    fill $((CLIENTS * TX))
    empty=$(best "$empty" "$(measure)")
    clear_queue
    fill $BACKLOG
    backlog=$(best "$backlog" "$(measure)")
done
# The same backlog with JIT forced into the claim, as every claim was before 0.2.3.
"${PSQL[@]}" -d "$DB" -c "ALTER FUNCTION tide._claim(tide.executor, text, text, integer, interval, boolean, bigint) SET jit = on" \
    -c "ALTER FUNCTION tide._claim(tide.executor, text, text, integer, interval, boolean, bigint) SET jit_above_cost = 0" >/dev/null
clear_queue
fill $BACKLOG
jit=$(measure $((TX / 20)))  # (a twentieth: at its rate the full count takes minutes)

set -- $empty; e_tps=$1; e_ms=$2
set -- $backlog; b_tps=$1; b_ms=$2
set -- $jit; j_tps=$1; j_ms=$2
ratio=$(awk -v a="$b_tps" -v b="$e_tps" 'BEGIN { printf "%.2fx", (b > 0 ? a / b : 0) }')
printf '%-52s %10s %14s\n' "" "runs/s" "ms per pair"
printf '%-52s %10s %14s\n' "only the runs drained waiting" "$e_tps" "$e_ms"
printf '%-52s %10s %14s\n' "$BACKLOG runs waiting" "$b_tps" "$b_ms"
printf '%-52s %10s %14s\n' "$BACKLOG waiting, JIT forced into the claim (before)" "$j_tps" "$j_ms"
echo "(target: with the backlog at least 0.9x the rate without: $ratio)"

#!/usr/bin/env bash
# Benchmarks, each printed beside a baseline measured in the same run on the same cluster:
#   0. fire precision: SQL jobs every minute, pg_tide beside pg_cron (Debian's postgresql-15-cron);
#   1. claim+complete throughput, 4 clients, batches of 1 and 50: pg_tide vs a minimal
#      hand-made FOR UPDATE SKIP LOCKED queue table;
#   2. event tasks: tide.emit throughput (in one transaction and from 4 clients) and event
#      claim+complete at batch 50, vs inserting into and working the same baseline queue; bulk
#      tide.enqueue and tide.emit_many beside graphile-worker (from npm) and the bare table;
#   3. the cost of one tide.tick() with 10,000 idle tasks vs with none; monitoring (health,
#      dashboard, the tick's fold and alert evaluation, metrics) with 1 task, 10,000 tasks and
#      1,000,000 finished runs (with the backlog the bulk rows leave, and near the end without
#      it); there, the console's overview over HTTP beside its query in psql, and claim +
#      complete again with the bare queue beside it (claims as history grows);
#   4. the cost of a queue's max_concurrency at batch 50, beside the same path without one;
#   5. backfills: a 10,000-window backfill beside the same windows by tide.rerun one by one;
#      online pickup latency idle and while a backfill runs; the size of the R4.6 record; the
#      SQL executors' no-op throughput with 2 executors and (last, after a restart) with 4,
#      beside the external worker's claim + complete at batch 1;
#   6. a reconciliation of 1,000,000 rows against 1,000,000 with 100 differences, run by the
#      executors (the comparison's own clock time), beside a hand-written FULL OUTER JOIN (with
#      each side's count and sum); the same statement at work_mem 4MB: its memory and spill;
#   7. tide.pending and claims at batch 50 under a snapshot held for 2 minutes (a forgotten
#      BEGIN) while pg_tide and the bare queue churn at 1,000 runs per second each;
#   8. claims with a backlog (bench/backlog.sh): claim + complete at batch 1 with 500,000 runs
#      waiting, beside the same with only the runs drained waiting.
# Figures are printed, never asserted. Uses a throw-away cluster with the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

PORT=${PG_TIDE_BENCH_PORT:-5498}
DATA=${PG_TIDE_BENCH_DATA:-/var/tmp/pg_tide-bench}
DB=bench
CLIENTS=4
TX_BATCH1=${PG_TIDE_BENCH_TX1:-2500}    # transactions per client at batch 1
TX_BATCH50=${PG_TIDE_BENCH_TX50:-300}   # transactions per client at batch 50
. scripts/cluster.sh

bash scripts/setup.sh >/dev/null
install_release
# pg_cron beside pg_tide on the same cluster, for the fire precision row.
start_cluster "$DATA" "$PORT" "$DB" "max_connections = 80
shared_preload_libraries = 'pg_tide,pg_cron'
cron.database_name = '$DB'
cron.host = '127.0.0.1'"
trap 'as_pg "$BIN/pg_ctl" -D "$DATA" stop -m fast -w >/dev/null 2>&1; rm -rf "$DATA"' EXIT

PSQL=("$BIN/psql" -X -q -h 127.0.0.1 -p "$PORT" -U postgres)
"${PSQL[@]}" -d postgres -c "CREATE DATABASE $DB"
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 <<'SQL'
CREATE EXTENSION pg_tide;
-- Waits until cond (a query returning a boolean) holds, or for timeout. It commits between its
-- looks, so that no snapshot is held while pg_tide works: a DO loop without COMMIT keeps its
-- statement's snapshot, and the xmin horizon with it, for as long as it runs, and the claims it
-- is timing then walk every index entry of the runs done since it began (none can be marked
-- dead). pg_tide's figures were measured that way before; the baselines never were.
CREATE PROCEDURE bench_wait(cond text, timeout interval, nap float8 DEFAULT 0.1)
LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + timeout;
    ok boolean;
BEGIN
    LOOP
        EXECUTE cond INTO ok;
        EXIT WHEN ok OR clock_timestamp() >= deadline;
        COMMIT;
        PERFORM pg_sleep(nap);
    END LOOP;
END $$;
-- The scheduler connects once the database exists (it retries every second): wait for it.
CALL bench_wait('SELECT coalesce((SELECT scheduler_alive FROM tide.self_health), false)', '30 seconds', 0.2);
-- The baseline: the smallest queue that is still correct under concurrency.
CREATE TABLE baseline_q (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payload jsonb NOT NULL DEFAULT '{}',
    state text NOT NULL DEFAULT 'ready',
    locked_by integer,
    locked_at timestamptz
);
CREATE INDEX baseline_q_ready ON baseline_q (id) WHERE state = 'ready';
-- An external task whose own schedule never fires during the run (1 January); its windows may
-- run side by side (the fixture's runs are independent windows).
SELECT tide.schedule('bench', '0 0 1 1 *', queue => 'bench', overlap => 'allow');
-- An external event task: keyless events, so they run side by side.
SELECT tide.schedule('bench_ev', NULL, queue => 'bench_ev', topics => ARRAY['bench.ev']);
-- The baseline's emit: one row per event.
CREATE FUNCTION baseline_emit(p jsonb) RETURNS void LANGUAGE sql AS $$ INSERT INTO baseline_q (payload) VALUES (p) $$;
SQL

# Fire precision, first (on a quiet cluster): 10 SQL jobs of pg_cron firing every minute at
# second 0 and 10 SQL tasks of pg_tide firing every minute at second 30 (so they never compete),
# for 4 minutes each; every job records now() (its transaction's start) when it runs. Lateness:
# that instant after the fire instant. Figures for all fires, and for those after each one's
# first minute (the first runs after a server start meet cold caches on both sides).
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 <<'SQL' >/dev/null
CREATE EXTENSION pg_cron;
CREATE TABLE fire_log (who text NOT NULL, at timestamptz NOT NULL);
SELECT cron.schedule('fire_' || g, '* * * * *', $$INSERT INTO fire_log VALUES ('pg_cron', now())$$) FROM generate_series(1, 10) g;
SELECT tide.schedule('fire_' || g, '30 * * * * *', $$INSERT INTO fire_log VALUES ('pg_tide', now())$$) FROM generate_series(1, 10) g;
SQL
echo "==> fire precision: waiting for 40 fires each of pg_cron and pg_tide (about 4 minutes)"
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 -c "CALL bench_wait('SELECT count(*) FILTER (WHERE who = ''pg_cron'') >= 40
    AND count(*) FILTER (WHERE who = ''pg_tide'') >= 40 FROM fire_log', '6 minutes', 1)" >/dev/null
fire=$("${PSQL[@]}" -d "$DB" -At -F '|' -v ON_ERROR_STOP=1 <<'SQL'
SELECT cron.unschedule(jobid) FROM cron.job WHERE jobname LIKE 'fire\_%';
SELECT tide.unschedule('fire_' || g) FROM generate_series(1, 10) g;
WITH x AS (
    SELECT who, date_trunc('minute', at) AS minute,
           extract(epoch FROM at - date_trunc('minute', at)) * 1000 - CASE who WHEN 'pg_tide' THEN 30000 ELSE 0 END AS ms
      FROM fire_log
), y AS (
    SELECT x.*, x.minute = min(x.minute) OVER (PARTITION BY x.who) AS first_minute FROM x
)
SELECT who || label, count(*), round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
       round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1)
  FROM (SELECT y.*, '' AS label FROM y
        UNION ALL SELECT y.*, ', after the first minute' FROM y WHERE NOT y.first_minute) z
 GROUP BY who, label ORDER BY label, who;
SQL
)

fill() { # $1 = number of runs / rows
    "${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 -v n="$1" <<'SQL'
-- Fixture: ready runs inserted directly (one distinct window each), as the tick would create.
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
INSERT INTO baseline_q (payload) SELECT '{}' FROM generate_series(1, :n);
VACUUM ANALYZE tide.run;
VACUUM ANALYZE tide.pending;
VACUUM ANALYZE baseline_q;
SQL
}

tmp=$(mktemp -d)
# Every script claims in one transaction and completes in a second one, as a worker does (it
# works between the two); completion is by id.
cat > "$tmp/tide.sql" <<'SQL'
SELECT array_agg(run_id)::text AS ids, array_agg(lease_token)::text AS tokens
  FROM tide.claim_runs('bench', 'bench', :batch) \gset
SELECT count(tide.complete_run(u.run_id, u.token))
  FROM unnest(':ids'::bigint[], ':tokens'::bigint[]) AS u(run_id, token);
SQL
cat > "$tmp/tide_many.sql" <<'SQL'
SELECT array_agg(run_id)::text AS ids, array_agg(lease_token)::text AS tokens
  FROM tide.claim_runs('bench', 'bench', :batch) \gset
SELECT tide.complete_runs(':ids'::bigint[], ':tokens'::bigint[]);
SQL
cat > "$tmp/baseline.sql" <<'SQL'
WITH c AS MATERIALIZED (
    SELECT id FROM baseline_q WHERE state = 'ready' ORDER BY id LIMIT :batch FOR UPDATE SKIP LOCKED),
claimed AS (
    UPDATE baseline_q q SET state = 'running', locked_by = :client_id, locked_at = now()
      FROM c WHERE q.id = c.id RETURNING q.id)
SELECT string_agg(id::text, ',') AS ids FROM claimed \gset
UPDATE baseline_q SET state = 'done' WHERE id IN (:ids);
SQL

tps() { # $1 = script, $2 = batch, $3 = transactions per client
    "$BIN/pgbench" -n -h 127.0.0.1 -p "$PORT" -U postgres -c "$CLIENTS" -j "$CLIENTS" \
        -t "$3" -D batch="$2" -f "$1" "$DB" 2>/dev/null \
        | sed -nE 's/^tps = ([0-9.]+) .*/\1/p'
}

# The baseline writes no log; pg_tide's per-run log lines (pg_tide.log_runs, default log) are
# measured on their own below, so the comparison is of the queues alone.
"${PSQL[@]}" -d postgres -c "ALTER DATABASE $DB SET pg_tide.log_runs = off" >/dev/null

# Three rounds, pg_tide and the baseline alternating; the best figure of each is kept, which
# evens out the noise of a small machine.
best() { awk -v a="${1:-0}" -v b="$2" 'BEGIN { print (a > b ? a : b) }'; }
declare -A result
for round in 1 2 3; do
    for batch in 1 50; do
        tx=$TX_BATCH1; [ "$batch" = 50 ] && tx=$TX_BATCH50
        fill $((CLIENTS * tx * batch))
        result[base_$batch]=$(best "${result[base_$batch]:-}" "$(tps "$tmp/baseline.sql" "$batch" "$tx")")
        result[tide_$batch]=$(best "${result[tide_$batch]:-}" "$(tps "$tmp/tide.sql" "$batch" "$tx")")
    done
    # complete_runs without a queue and with the queue's max_concurrency (above the 4 x 50 runs
    # in flight, so it admits every claim: the cost of the queue admission itself), in turns
    # first (the tables grow with every fill).
    order="many queued"
    if [ $((round % 2)) = 0 ]; then order="queued many"; fi
    for which in $order; do
        if [ "$which" = queued ]; then
            "${PSQL[@]}" -d "$DB" -c "SELECT tide.create_queue('bench', max_concurrency => 1000)" >/dev/null
        fi
        fill $((CLIENTS * TX_BATCH50 * 50))
        result[${which}_50]=$(best "${result[${which}_50]:-}" "$(tps "$tmp/tide_many.sql" 50 "$TX_BATCH50")")
        if [ "$which" = queued ]; then
            "${PSQL[@]}" -d "$DB" -c "SELECT tide.drop_queue('bench')" >/dev/null
        fi
    done
done
# The same batch path with a log line per run start and success (the default).
"${PSQL[@]}" -d postgres -c "ALTER DATABASE $DB SET pg_tide.log_runs = log" >/dev/null
fill $((CLIENTS * TX_BATCH50 * 50))
result[logged_50]=$(tps "$tmp/tide_many.sql" 50 "$TX_BATCH50")
left=$("${PSQL[@]}" -d "$DB" -Atc "SELECT count(*) FROM tide.run WHERE state <> 'succeeded'")

# Monitoring: tide.health and tide.dashboard (every row made, none sent: sending 10,000 rows to
# psql takes longer than making them), the tick's monitor step (the
# fold of what changed, every tick; the evaluation of alerts, every pg_tide.monitor_interval) and
# tide.metrics(), each the average of 20 calls (ms); once with 1 task and no history (the
# baseline), once over 10,000 idle tasks, and at the end over 1,000,000 finished runs.
cat > "$tmp/m_health.sql" <<'SQL'
SELECT count(*) FROM tide.health;
SQL
cat > "$tmp/m_dashboard.sql" <<'SQL'
SELECT count(*) FROM tide.dashboard;
SQL
cat > "$tmp/m_fold.sql" <<'SQL'
SELECT tide._fold(now());
SQL
cat > "$tmp/m_alerts.sql" <<'SQL'
SELECT tide._evaluate_alerts(now());
SQL
cat > "$tmp/m_metrics.sql" <<'SQL'
SELECT tide.metrics();
SQL
monitor_costs() { # the five figures, ms, after the scheduler's tick has folded what changed
    "${PSQL[@]}" -d "$DB" -c "CALL bench_wait('SELECT NOT EXISTS (SELECT 1 FROM tide.task_touch)', '60 seconds')" >/dev/null
    # The kept figures of 10,000 tasks made a moment ago: analyzed, as autovacuum does within a
    # minute or so (before, health planned from an estimate of a few hundred rows).
    "${PSQL[@]}" -d "$DB" -c "ANALYZE tide.task_stat" >/dev/null
    for m in health dashboard fold alerts metrics; do
        "$BIN/pgbench" -n -h 127.0.0.1 -p "$PORT" -U postgres -c 1 -t 20 -f "$tmp/m_$m.sql" "$DB" 2>/dev/null \
            | sed -nE 's/^latency average = ([0-9.]+) ms/\1/p'
    done | paste -sd ' '
}

# Tick cost: with no tasks due, a tick must not grow with the number of idle tasks.
cat > "$tmp/tick.sql" <<'SQL'
SELECT tide.tick();
SQL
tick_ms() {
    "$BIN/pgbench" -n -h 127.0.0.1 -p "$PORT" -U postgres -c 1 -t 500 -f "$tmp/tick.sql" "$DB" 2>/dev/null \
        | sed -nE 's/^latency average = ([0-9.]+) ms/\1/p'
}
# The claim rounds just wrote hundreds of thousands of rows: vacuum them now, so that autovacuum
# does not do it during the timings below (a tick with 1 task took 12 ms beside 0.6 ms with
# 10,000 tasks a minute later, while autovacuum worked).
"${PSQL[@]}" -d "$DB" -c "VACUUM ANALYZE tide.run, tide.run_event, tide.pending, tide.task_touch, tide.count_delta, baseline_q" >/dev/null
tick_1=$(tick_ms)
mon_1=$(monitor_costs)
# The 10,000 idle tasks, made by one statement and timed, beside pg_cron's cron.schedule making
# 10,000 jobs the same way (unscheduled at once: they would never fire).
cat > "$tmp/schedule_10k.sql" <<'SQL'
SELECT count(tide.schedule('idle_' || g, '0 0 1 1 *', tz => 'Europe/London')) FROM generate_series(1, 10000) g;
SQL
cat > "$tmp/cron_10k.sql" <<'SQL'
SELECT count(cron.schedule('idle_' || g, '0 0 1 1 *', 'SELECT 1')) FROM generate_series(1, 10000) g;
SQL
one_call_ms() { # $1 = script: one transaction, ms
    "$BIN/pgbench" -n -h 127.0.0.1 -p "$PORT" -U postgres -c 1 -t 1 -f "$1" "$DB" 2>/dev/null \
        | sed -nE 's/^latency average = ([0-9.]+) ms/\1/p'
}
cron_10k_ms=$(one_call_ms "$tmp/cron_10k.sql")
"${PSQL[@]}" -d "$DB" -c "SELECT count(cron.unschedule(jobid)) FROM cron.job WHERE jobname LIKE 'idle\_%'" >/dev/null
schedule_10k_ms=$(one_call_ms "$tmp/schedule_10k.sql")
[ "$("${PSQL[@]}" -At -d "$DB" -c "SELECT count(*) FROM tide.task WHERE name LIKE 'idle\_%'")" = 10000 ] \
    || { echo "the 10,000 idle tasks were not made" >&2; exit 1; }
"${PSQL[@]}" -d "$DB" -c "VACUUM ANALYZE tide.task" >/dev/null
tick_10k=$(tick_ms)
mon_10k=$(monitor_costs)

# Event tasks. Emit: 10,000 events in one transaction (one call per event), and one event per
# transaction from 4 clients (in the rounds of bulk enqueue below); the baseline inserts its
# rows the same ways.
cat > "$tmp/emit_one_tx.sql" <<'SQL'
SELECT count(tide.emit('bench.ev', jsonb_build_object('i', g))) FROM generate_series(1, 10000) g;
SQL
cat > "$tmp/base_one_tx.sql" <<'SQL'
SELECT count(baseline_emit(jsonb_build_object('i', g))) FROM generate_series(1, 10000) g;
SQL
cat > "$tmp/emit.sql" <<'SQL'
SELECT tide.emit('bench.ev', '{"i": 1}');
SQL
cat > "$tmp/base_emit.sql" <<'SQL'
SELECT baseline_emit('{"i": 1}');
SQL
one_tx_ms() { # $1 = script: average of 3 transactions, ms
    "$BIN/pgbench" -n -h 127.0.0.1 -p "$PORT" -U postgres -c 1 -t 3 -f "$1" "$DB" 2>/dev/null \
        | sed -nE 's/^latency average = ([0-9.]+) ms/\1/p'
}
emit_tx_ms=$(one_tx_ms "$tmp/emit_one_tx.sql")
base_tx_ms=$(one_tx_ms "$tmp/base_one_tx.sql")
# Event claim + complete_runs at batch 50, on emitted runs.
cat > "$tmp/event_many.sql" <<'SQL'
SELECT array_agg(run_id)::text AS ids, array_agg(lease_token)::text AS tokens
  FROM tide.claim_runs('bench_ev', 'bench', :batch) \gset
SELECT tide.complete_runs(':ids'::bigint[], ':tokens'::bigint[]);
SQL
"${PSQL[@]}" -d postgres -c "ALTER DATABASE $DB SET pg_tide.log_runs = off" >/dev/null
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 -v n=$((CLIENTS * TX_BATCH50 * 50)) <<'SQL' >/dev/null
SELECT count(tide.emit('bench.ev', jsonb_build_object('i', g))) FROM generate_series(1, :n) g;
INSERT INTO baseline_q (payload) SELECT '{}' FROM generate_series(1, :n);
VACUUM ANALYZE tide.run;
VACUUM ANALYZE tide.pending;
VACUUM ANALYZE baseline_q;
SQL
event_50=$(tps "$tmp/event_many.sql" 50 "$TX_BATCH50")
base_ev_50=$(tps "$tmp/baseline.sql" 50 "$TX_BATCH50")

# Bulk enqueue: 20,000 jobs in one call, and one job per transaction from 4 clients:
# tide.enqueue and tide.emit_many (and one tide.emit per transaction) beside the bare table's
# INSERT and graphile-worker's add_jobs / add_job (installed from npm into ~/.cache/pg_tide/graphile, its schema in this
# database); then claim + complete by graphile-worker itself (4 concurrent no-op jobs, one at a
# time and with a local queue of 50) beside pg_tide's rows above.
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 -c "SELECT tide.schedule('bench_job', NULL, queue => 'bench_job', topics => ARRAY['bench.unused_job'])" >/dev/null
cat > "$tmp/bulk_enqueue.sql" <<'SQL'
SELECT count(*) FROM tide.enqueue('bench_job', (SELECT jsonb_agg(jsonb_build_object('i', g)) FROM generate_series(1, 20000) g));
SQL
cat > "$tmp/bulk_emit.sql" <<'SQL'
SELECT tide.emit_many('bench.ev', ARRAY(SELECT jsonb_build_object('i', g) FROM generate_series(1, 20000) g));
SQL
cat > "$tmp/bulk_base.sql" <<'SQL'
INSERT INTO baseline_q (payload) SELECT jsonb_build_object('i', g) FROM generate_series(1, 20000) g;
SQL
cat > "$tmp/one_enqueue.sql" <<'SQL'
SELECT tide.enqueue('bench_job', '{"i": 1}');
SQL
GW_DIR=${PG_TIDE_GRAPHILE_DIR:-$HOME/.cache/pg_tide/graphile}
GW_VERSION=0.17.3
gw=""
gw_why=""
if ! command -v npm >/dev/null 2>&1; then
    apt-get install -y -qq npm >/dev/null 2>&1 || true
fi
if ! command -v npm >/dev/null 2>&1; then
    gw_why="npm is not installed and apt-get could not install it"
elif ! (mkdir -p "$GW_DIR" && cd "$GW_DIR" \
         && { [ -f package.json ] || echo '{"name": "pg_tide-bench-peer", "private": true}' > package.json; } \
         && { grep -q "\"version\": \"$GW_VERSION\"" node_modules/graphile-worker/package.json 2>/dev/null \
              || npm install --no-audit --no-fund --silent "graphile-worker@$GW_VERSION" >/dev/null 2>&1; }); then
    gw_why="npm install graphile-worker@$GW_VERSION failed"
elif ! node "$GW_DIR/node_modules/graphile-worker/dist/cli.js" --connection "postgres://postgres@127.0.0.1:$PORT/$DB" \
        --schema-only >/dev/null 2>&1; then
    gw_why="graphile-worker could not install its schema"
else
    gw=1
fi
cat > "$tmp/gw_bulk.sql" <<'SQL'
SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(
    SELECT ROW('noop', json_build_object('i', g), NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
      FROM generate_series(1, 20000) g));
SQL
cat > "$tmp/gw_one.sql" <<'SQL'
SELECT graphile_worker.add_job('noop', '{"i": 1}'::json);
SQL
# Three rounds, each timing pg_tide and its references back to back (this machine's speed moves
# between minutes, and the rows of one side measured minutes after the other's compared two
# machines): one call of each bulk insert per round (the least time of three is kept), and one
# emit, enqueue, bare INSERT and add_job per transaction from 4 clients (the best rate).
least() { awk -v a="${1:-}" -v b="$2" 'BEGIN { print (a == "" || b < a + 0 ? b : a) }'; }
for round in 1 2 3; do
    bulk_enqueue_ms=$(least "${bulk_enqueue_ms:-}" "$(one_call_ms "$tmp/bulk_enqueue.sql")")
    bulk_emit_ms=$(least "${bulk_emit_ms:-}" "$(one_call_ms "$tmp/bulk_emit.sql")")
    bulk_base_ms=$(least "${bulk_base_ms:-}" "$(one_call_ms "$tmp/bulk_base.sql")")
    if [ -n "$gw" ]; then
        gw_bulk_ms=$(least "${gw_bulk_ms:-}" "$(one_call_ms "$tmp/gw_bulk.sql")")
    fi
    emit_tps=$(best "${emit_tps:-}" "$(tps "$tmp/emit.sql" 1 2000)")
    base_emit_tps=$(best "${base_emit_tps:-}" "$(tps "$tmp/base_emit.sql" 1 2000)")
    one_enqueue_tps=$(best "${one_enqueue_tps:-}" "$(tps "$tmp/one_enqueue.sql" 1 2000)")
    if [ -n "$gw" ]; then
        gw_one_tps=$(best "${gw_one_tps:-}" "$(tps "$tmp/gw_one.sql" 1 2000)")
    fi
done
if [ -n "$gw" ]; then
    gw_drain() { # $1 = batch: jobs per second working off what is queued
        local n
        n=$("${PSQL[@]}" -d "$DB" -At -c "SELECT count(*) FROM graphile_worker.jobs")
        NODE_PATH="$GW_DIR/node_modules" node bench/graphile_drain.js "postgres://postgres@127.0.0.1:$PORT/$DB" "$n" "$1" 2>/dev/null || echo 0
    }
    gw_1=$(gw_drain 1)
    "${PSQL[@]}" -d "$DB" -At -f "$tmp/gw_bulk.sql" -f "$tmp/gw_bulk.sql" -f "$tmp/gw_bulk.sql" >/dev/null
    gw_50=$(gw_drain 50)
fi

# Backfills (last: they use the SQL executors). Online pickup latency (claimed_at - created_at of
# 100 one-off SQL jobs enqueued 50 ms apart, each in a transaction of its own that starts when
# the job is enqueued: created_at is the transaction's start), idle and while a backfill of a
# slow task runs;
# then 10,000 windows of a no-op hourly SQL task by one backfill, beside the same windows
# (another task) put in line by tide.rerun one by one.
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 <<'SQL' >/dev/null
SELECT tide.schedule('online_noop', NULL, topics => ARRAY['bench.unused'], command => 'SELECT 1');
SELECT tide.schedule('bf_slow', '0 * * * *', overlap => 'allow', command => 'SELECT pg_sleep(0.05)');
SELECT tide.schedule('bf_noop', '0 * * * *', overlap => 'allow', command => 'SELECT 1');
SELECT tide.schedule('rr_noop', '0 * * * *', overlap => 'allow', command => 'SELECT 1');
SQL
# Waits until no run of online_noop is left in tide.pending (which holds only unfinished runs: a
# scan of tide.run's history every 100 ms would load the machine while the last are picked up).
online_noop_done() {
    "${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 -c "CALL bench_wait('SELECT NOT EXISTS (SELECT 1 FROM tide.pending p
        JOIN tide.task t ON t.task_id = p.task_id WHERE t.name = ''online_noop'')', '5 minutes')" >/dev/null
}
pickup() { # $1 = label: p50 and p99 in ms
    "${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 -c "DO \$\$ BEGIN FOR i IN 1..100 LOOP
        PERFORM pg_sleep(0.05); COMMIT; PERFORM tide.enqueue('online_noop', jsonb_build_object('probe', '$1', 'i', i)); COMMIT;
        END LOOP; END \$\$" >/dev/null
    online_noop_done
    "${PSQL[@]}" -d "$DB" -At -F ' ' -c "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
        round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1)
        FROM (SELECT extract(epoch FROM r.claimed_at - r.created_at) * 1000 AS ms FROM tide.run r
               WHERE r.args->>'probe' = '$1') x"
}
pickup_idle=$(pickup idle)
# Runs enqueued for later (run_at 200 ms ahead): how late after run_at an idle executor claims
# them (it sleeps until the next one is due, tide._executor_wake, not until its next poll).
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 -c "DO \$\$ DECLARE due timestamptz; BEGIN FOR i IN 1..100 LOOP
    PERFORM pg_sleep(0.05); COMMIT; due := clock_timestamp() + interval '200 milliseconds';
    PERFORM tide.enqueue('online_noop', jsonb_build_object('probe', 'delayed', 'due', due), run_at => due); COMMIT;
    END LOOP; END \$\$" >/dev/null
online_noop_done
pickup_delayed=$("${PSQL[@]}" -d "$DB" -At -F ' ' -c "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
    round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1)
    FROM (SELECT extract(epoch FROM r.claimed_at - (r.args->>'due')::timestamptz) * 1000 AS ms FROM tide.run r
           WHERE r.args->>'probe' = 'delayed') x")
# The references for pickup: external workers that LISTEN, idle, and are sent jobs the same way
# (100, 50 ms apart, each in a transaction of its own): pg_tide's external worker as docs/guide.md
# writes it in Node (pg), whose claim is the run's claimed_at, and graphile-worker's own worker
# (one job at a time), whose claim is its job's locked_at (bench/pickup_peers.js). Both need
# the Node packages installed for graphile-worker above.
peer_pickup() { # $1 = label, $2 = SQL that adds job i, $3 = SQL of the jobs' pickups (ms), then the peer's arguments
    local out pid n=0 label=$1 add=$2 ms=$3
    shift 3
    out="$tmp/peer_$1.out"
    : >"$out"
    NODE_PATH="$GW_DIR/node_modules" node bench/pickup_peers.js "$@" >"$out" 2>&1 &
    pid=$!
    while ! grep -q '^ready' "$out" && kill -0 "$pid" 2>/dev/null && [ "$n" -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
    if ! grep -q '^ready' "$out"; then
        kill "$pid" 2>/dev/null || true
        echo "- - ($label did not start: $(tr '\n' ' ' <"$out" | cut -c1-200))"
        return
    fi
    "${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 -c "DO \$\$ BEGIN FOR i IN 1..100 LOOP
        PERFORM pg_sleep(0.05); COMMIT; $add; COMMIT;
        END LOOP; END \$\$" >/dev/null
    if ! wait "$pid"; then
        echo "- - ($label failed: $(tr '\n' ' ' <"$out" | cut -c1-200))"
        return
    fi
    "${PSQL[@]}" -d "$DB" -At -F ' ' -c "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
        round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1) FROM ($ms) x"
}
pickup_listen="- - (skipped: $gw_why)"
pickup_gw="- - (skipped: $gw_why)"
if [ -n "$gw" ]; then
    "${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
SELECT tide.schedule('listen_probe', NULL, queue => 'listen_probe', topics => ARRAY['bench.unused_probe']);
CREATE TABLE bench_gw_probe (id bigint, created_at timestamptz, locked_at timestamptz);
SQL
    pickup_listen=$(peer_pickup "pg_tide's external worker" \
        "PERFORM tide.enqueue('listen_probe', jsonb_build_object('probe', 'listen', 'i', i))" \
        "SELECT extract(epoch FROM r.claimed_at - r.created_at) * 1000 AS ms FROM tide.run r WHERE r.args->>'probe' = 'listen'" \
        tide "postgres://postgres@127.0.0.1:$PORT/$DB" listen_probe 100)
    pickup_gw=$(peer_pickup graphile-worker \
        "PERFORM graphile_worker.add_job('probe', json_build_object('i', i))" \
        "SELECT extract(epoch FROM g.locked_at - g.created_at) * 1000 AS ms FROM bench_gw_probe g" \
        graphile "postgres://postgres@127.0.0.1:$PORT/$DB" 100)
fi
# SQL executor throughput: 5,000 no-op jobs enqueued in one call, run by the executors (both:
# no backfill runs), from the enqueue's commit to the last one's end (runs/s). The wait polls
# tide.pending by the jobs' ids (a scan of tide.run's history every 50 ms, as before, took a
# fifth of the machine from the executors).
exec_once() {
    "${PSQL[@]}" -d "$DB" -At -v ON_ERROR_STOP=1 <<'SQL' | tail -1
SELECT clock_timestamp() AS t0 \gset
SELECT min(e) AS lo, max(e) AS hi
  FROM tide.enqueue('online_noop', (SELECT jsonb_agg(jsonb_build_object('probe', 'throughput', 'i', g)) FROM generate_series(1, 5000) g)) e \gset
SELECT set_config('bench.lo', :'lo', false), set_config('bench.hi', :'hi', false) \g /dev/null
CALL bench_wait('SELECT NOT EXISTS (SELECT 1 FROM tide.pending p
    WHERE p.run_id BETWEEN current_setting(''bench.lo'')::bigint AND current_setting(''bench.hi'')::bigint)', '5 minutes', 0.05);
SELECT round(count(*) / extract(epoch FROM max(r.finished_at) - :'t0'::timestamptz)::numeric)
  FROM tide.run r WHERE r.run_id BETWEEN :lo AND :hi AND r.state = 'succeeded';
SQL
}
# Best of 3, each beside a round of the external worker's claim + complete at batch 1 (4
# clients), as this machine's speed moves between minutes: prints both, runs/s.
exec_best() {
    local b=0 x=0
    for _ in 1 2 3; do
        fill $((CLIENTS * TX_BATCH1)) >/dev/null
        x=$(best "$x" "$(tps "$tmp/tide.sql" 1 "$TX_BATCH1")")  # (batch 1: runs/s)
        b=$(best "$b" "$(exec_once)")
    done
    echo "$b $x"
}
exec_rate=$(exec_best)
slow_bf=$("${PSQL[@]}" -d "$DB" -At -c "SELECT tide.backfill('bf_slow', current_date - 60, current_date - 2, concurrency => 4, batch => 500, canary => 0, sample => 0)")
pickup_busy=$(pickup busy)
busy_state=$("${PSQL[@]}" -d "$DB" -At -c "SELECT state || ', ' || windows_done || ' of ' || windows_total || ' windows done' FROM tide.backfill_status WHERE backfill_id = $slow_bf")
"${PSQL[@]}" -d "$DB" -At -c "SELECT tide.cancel_backfill($slow_bf)" >/dev/null
bf_wps=$("${PSQL[@]}" -d "$DB" -At -v ON_ERROR_STOP=1 <<'SQL'
SELECT tide.backfill('bf_noop', current_date - 418, current_date - 2, concurrency => 100, batch => 1000, canary => 0, sample => 0) AS id \gset
CALL bench_wait('SELECT NOT EXISTS (SELECT 1 FROM tide.backfill WHERE state = ''running'')', '10 minutes');
SELECT windows_done || ' ' || round(windows_done / extract(epoch FROM finished - started)::numeric) FROM tide.backfill_status WHERE backfill_id = :id;
SQL
)
rr_wps=$("${PSQL[@]}" -d "$DB" -At -v ON_ERROR_STOP=1 <<'SQL'
SELECT clock_timestamp() AS t0 \gset
SELECT count(tide.rerun('rr_noop', window_start => w.window_start)) AS n
  FROM tide.backfill_window w JOIN tide.backfill b USING (backfill_id) JOIN tide.task t USING (task_id)
 WHERE t.name = 'bf_noop' \gset
CALL bench_wait('SELECT NOT EXISTS (SELECT 1 FROM tide.run r JOIN tide.task t USING (task_id)
    WHERE t.name = ''rr_noop'' AND r.state <> ''succeeded'')', '10 minutes');
SELECT count(*) || ' ' || round(count(*) / extract(epoch FROM clock_timestamp() - :'t0'::timestamptz)::numeric)
  FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'rr_noop';
SQL
)
# Monitoring again over 1,000,000 finished runs: this benchmark's runs, topped up with finished
# runs of the event task (most of the history in one task, event runs included), with their
# history rows.
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 <<'SQL' >/dev/null
SELECT greatest(1000000 - count(*), 0) AS n FROM tide.run WHERE finished_at IS NOT NULL \gset
WITH made AS (
    INSERT INTO tide.run (task_id, trigger, dedupe_key, version, state, reason, executor, queue, owner,
                          attempts, tries, topic, created_at, updated_at, started_at, claimed_at, finished_at)
    SELECT t.task_id, 'event', 'bench-history-' || g, 1, 'succeeded', 'bench fixture', 'external', 'bench_ev', 'postgres',
           1, 1, 'bench.ev', now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
           now() - interval '2 days', now() - interval '2 days' + interval '10 milliseconds'
      FROM tide.task t, generate_series(1, :n) g
     WHERE t.name = 'bench_ev'
    RETURNING run_id, owner)
INSERT INTO tide.run_event (run_id, from_state, to_state, reason, owner)
SELECT m.run_id, s.f, s.t, 'bench fixture', m.owner
  FROM made m CROSS JOIN (VALUES (NULL::tide.run_state, 'ready'::tide.run_state), ('ready', 'running'), ('running', 'succeeded')) s(f, t);
-- What those rows count for tide.metrics(), as the claims and completions that write them append it.
INSERT INTO tide.count_delta (task_id, metric, label, value, owner)
SELECT t.task_id, c.metric, c.label, c.value, 'postgres'
  FROM tide.task t, (VALUES ('runs', 'succeeded', :n::double precision), ('duration_sum', '', :n * 0.01),
                            ('duration_count', '', :n), ('wait_sum', '', 0), ('wait_count', '', :n)) c(metric, label, value)
 WHERE t.name = 'bench_ev' AND :n > 0;
VACUUM ANALYZE tide.run;
VACUUM ANALYZE tide.run_event;
SQL
runs_full=$("${PSQL[@]}" -d "$DB" -At -c "SELECT count(*) FROM tide.run WHERE finished_at IS NOT NULL")
mon_full=$(monitor_costs)
backlog_full=$("${PSQL[@]}" -d "$DB" -At -c "SELECT count(*) FROM tide.pending WHERE state = 'ready'")
# The console's overview over the same 10,000 tasks and 1,000,000 runs: the page (first 100
# tasks, each with its last 30 windows) fetched over HTTP by a signed-in superuser, beside the
# same query (console/sql/overview.sql) from psql; average of 20 each (ms).
cargo build -q --release -p pg_tide_console
command -v curl >/dev/null 2>&1 || apt-get install -y -qq curl >/dev/null
CONSOLE_PORT=$((PORT + 100))
target/release/pg_tide-console --database "postgres://127.0.0.1:$PORT/$DB" --listen "127.0.0.1:$CONSOLE_PORT" >/dev/null 2>&1 &
console_pid=$!
trap 'kill $console_pid 2>/dev/null || true; as_pg "$BIN/pg_ctl" -D "$DATA" stop -m fast -w >/dev/null 2>&1; rm -rf "$DATA"' EXIT
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$CONSOLE_PORT/login" && break; sleep 0.1; done
curl -s -o /dev/null -c "$tmp/console.cookies" -d 'user=postgres&password=bench' "http://127.0.0.1:$CONSOLE_PORT/login"
console_http=$(for _ in $(seq 20); do
    curl -s -o "$tmp/overview.html" -w '%{time_total}\n' -b "$tmp/console.cookies" "http://127.0.0.1:$CONSOLE_PORT/"
done | awk '{ s += $1 } END { printf "%.1f", s / NR * 1000 }')
console_rows=$(grep -o 'class="task"' "$tmp/overview.html" | wc -l)
{ echo '\timing on'; for _ in $(seq 20); do
      # Whole-line comments dropped, indented ones too: joined into one line, a comment would
      # swallow the rest of the query.
      echo "PREPARE o(bigint, bigint) AS $(sed -e 's/^[[:space:]]*--.*$//' console/sql/overview.sql | tr '\n' ' ' | sed 's/; *$//');"
      echo 'EXECUTE o(100, 0);'; echo 'DEALLOCATE o;'
  done; } > "$tmp/overview_psql.sql"
console_sql=$("${PSQL[@]}" -d "$DB" -f "$tmp/overview_psql.sql" | sed -nE 's/^Time: ([0-9.]+) ms.*/\1/p' \
    | awk 'NR % 3 == 2 { s += $1; n++ } END { printf "%.1f", s / n }')
kill $console_pid 2>/dev/null || true
# The console's charts and one task's health over the same tasks and runs, with the hourly
# counters full (every task with runs in each of the 192 hours they keep): a task's two charts
# (tide.run_hours for 24 and 168 hours) and its health (tide.task_health) beside tide.health
# filtered to it (what a task's page read before); the overview's two charts (every task of
# the owner); average of 20 each (ms).
"${PSQL[@]}" -d "$DB" -q <<'SQL'
INSERT INTO tide.run_hourly (task_id, hour, succeeded, failed, dead, durations, owner)
SELECT t.task_id, date_trunc('hour', now()) - g * interval '1 hour', 10, 1, 0, '{"30": 8, "34": 2}', t.owner
  FROM tide.task t, generate_series(0, 191) g
ON CONFLICT DO NOTHING;
INSERT INTO tide.owner_hourly (owner, hour, succeeded, failed, dead, durations)
SELECT owner, hour, sum(succeeded), sum(failed), sum(dead), '{"30": 80000, "34": 20000}' FROM tide.run_hourly GROUP BY 1, 2
ON CONFLICT DO NOTHING;
ANALYZE tide.run_hourly;
ANALYZE tide.owner_hourly;
SQL
chart_task=$("${PSQL[@]}" -d "$DB" -At -c "SELECT name FROM tide.task ORDER BY task_id OFFSET 5000 LIMIT 1")
avg_ms() { { echo '\timing on'; for _ in $(seq 20); do echo "$1"; done; } > "$tmp/avg.sql"
    "${PSQL[@]}" -d "$DB" -f "$tmp/avg.sql" | sed -nE 's/^Time: ([0-9.]+) ms.*/\1/p' | awk '{ s += $1; n++ } END { printf "%.1f", s / n }'; }
chart_task_ms=$(avg_ms "SELECT count(*) FROM (SELECT * FROM tide.run_hours('$chart_task', hours => 24) UNION ALL SELECT * FROM tide.run_hours('$chart_task', hours => 168)) x;")
chart_overview_ms=$(avg_ms "SELECT count(*) FROM (SELECT * FROM tide.run_hours(hours => 24) UNION ALL SELECT * FROM tide.run_hours(hours => 168)) x;")
task_health_ms=$(avg_ms "SELECT * FROM tide.task_health('$chart_task');")
health_filtered_ms=$(avg_ms "SELECT * FROM tide.health WHERE task = '$chart_task';")
# Storage: the run ledger and its history with their indexes (and TOAST), per run kept.
storage=$("${PSQL[@]}" -d "$DB" -At -F ' ' -c "SELECT count(*), round((pg_total_relation_size('tide.run') + pg_total_relation_size('tide.run_event'))::numeric / count(*)),
    round(pg_total_relation_size('tide.run')::numeric / count(*)), round(pg_total_relation_size('tide.run_event')::numeric / count(*)),
    round(pg_total_relation_size('tide.pending') / 1048576.0, 1), (SELECT count(*) FROM tide.pending)
    FROM tide.run")
# Claims as history grows: claim + complete_runs at batch 50 again, now beside the 1,000,000
# finished runs (best of 3 rounds, as at the start; log_runs is off as it was then), with the
# bare queue measured beside it again: this machine's speed moves by half between minutes, so
# what is compared is the ratio to the bare queue at the start and now.
history_at_claims=$("${PSQL[@]}" -d "$DB" -At -c "SELECT count(*) FROM tide.run WHERE finished_at IS NOT NULL")
for round in 1 2 3; do
    fill $((CLIENTS * TX_BATCH50 * 50))
    result[late_base_50]=$(best "${result[late_base_50]:-}" "$(tps "$tmp/baseline.sql" 50 "$TX_BATCH50")")
    result[late_50]=$(best "${result[late_50]:-}" "$(tps "$tmp/tide_many.sql" 50 "$TX_BATCH50")")
done
# tide.pending under a held-back xmin: a session keeps one snapshot open (a forgotten BEGIN in
# psql) for HOLD seconds while 4 clients claim and complete at batch 50 at a fixed rate, on
# pg_tide and on the bare queue at once (1,000 runs per second each). Before and at the end of
# the hold: tide.pending's size with its indexes and its live rows, and a short round of claims
# at batch 50 on each queue; then, once the snapshot has ended, the size after a VACUUM.
HOLD=${PG_TIDE_BENCH_HOLD:-120}
HOLD_TPS=20   # transactions of 50 runs per second, per queue
fill $((HOLD * HOLD_TPS * 50 + 4 * CLIENTS * 50 * 50))
pending_size() { "${PSQL[@]}" -d "$DB" -At -c "SELECT round(pg_total_relation_size('tide.pending') / 1048576.0, 1) || ' MB, ' || count(*) || ' rows' FROM tide.pending"; }
hold_before=$(pending_size)
hold_t0=$(tps "$tmp/tide_many.sql" 50 50)
hold_b0=$(tps "$tmp/baseline.sql" 50 50)
PGAPPNAME=pg_tide_bench_hold "${PSQL[@]}" -d "$DB" \
    -c "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM tide.task; SELECT pg_sleep($HOLD + 120); COMMIT" >/dev/null 2>&1 &
hold_pid=$!
"${PSQL[@]}" -d "$DB" -c "DO \$\$ BEGIN
    WHILE NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = 'pg_tide_bench_hold' AND backend_xmin IS NOT NULL)
          AND clock_timestamp() < now() + interval '30 seconds' LOOP
        PERFORM pg_sleep(0.1); END LOOP; END \$\$" >/dev/null
churn=""
for script in tide_many baseline; do
    "$BIN/pgbench" -n -h 127.0.0.1 -p "$PORT" -U postgres -c "$CLIENTS" -j "$CLIENTS" -R "$HOLD_TPS" -T "$HOLD" \
        -D batch=50 -f "$tmp/$script.sql" "$DB" >/dev/null 2>&1 &
    churn="$churn $!"
done
wait $churn || true
hold_during=$(pending_size)
hold_t1=$(tps "$tmp/tide_many.sql" 50 50)
hold_b1=$(tps "$tmp/baseline.sql" 50 50)
"${PSQL[@]}" -d "$DB" -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'pg_tide_bench_hold'" >/dev/null
wait "$hold_pid" 2>/dev/null || true
"${PSQL[@]}" -d "$DB" -c "VACUUM tide.pending" >/dev/null
hold_after=$(pending_size)
# R4.6: the record of pruned succeeded windows, per million hourly windows: all succeeded (one
# range), and the worst case, every other window (a million ranges).
record=$("${PSQL[@]}" -d "$DB" -At -F ' ' -c "SELECT
    (SELECT pg_column_size(range_agg(tstzrange(s, s + interval '1 hour'))) FROM generate_series(timestamptz '2000-01-01', timestamptz '2000-01-01' + interval '999999 hours', interval '1 hour') s),
    (SELECT pg_column_size(range_agg(tstzrange(s, s + interval '1 hour'))) FROM generate_series(timestamptz '2000-01-01', timestamptz '2000-01-01' + interval '1999998 hours', interval '2 hours') s)")
# Reconciliation: 1,000,000 payments against 1,000,000 bank lines of one date, with 100
# differences (40 missing at the bank, 30 lines only at the bank, 30 amounts off by 1). Ours: the
# comparison's duration (recon_result.checked_at - started_at) of tide.rerun of the date, by the
# executors, recording included; the baseline: the
# same comparison written by hand, a FULL OUTER JOIN with each side's count and sum, from psql.
# Both with work_mem 256MB and JIT off; the median of 3 each.
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 <<'SQL' >/dev/null
CREATE TABLE rc_pay AS
    SELECT g AS order_id, round((g % 10000) / 100.0, 2)::numeric(12,2) AS amount, date '2026-01-02' AS day
      FROM generate_series(1, 1000000) g;
CREATE TABLE rc_bank AS SELECT order_id::text AS ref, amount, day FROM rc_pay;
DELETE FROM rc_bank WHERE ref::int % 25000 = 0;
INSERT INTO rc_bank SELECT 'x' || g, 1.00, date '2026-01-02' FROM generate_series(1, 30) g;
UPDATE rc_bank SET amount = amount + 1 WHERE ref IN (SELECT (g * 33332 + 1)::text FROM generate_series(1, 30) g);
VACUUM ANALYZE rc_pay;
VACUUM ANALYZE rc_bank;
SELECT tide.reconcile('rc_bench', '0 6 * * *', biz_window => 'day',
    left_sql => 'SELECT order_id::text AS key, amount FROM rc_pay WHERE day = (SELECT tide.biz_date())',
    right_sql => 'SELECT ref AS key, amount FROM rc_bank WHERE day = (SELECT tide.biz_date())',
    amounts => ARRAY['amount'], tolerance => 0.001, work_mem => '256MB');
CREATE PROCEDURE rc_time(n int) LANGUAGE plpgsql AS $$
DECLARE run bigint; BEGIN
    FOR i IN 1..n LOOP
        run := tide.rerun('rc_bench', biz_date => date '2026-01-02', force => true, version => 'current');
        COMMIT;
        WHILE NOT EXISTS (SELECT 1 FROM tide.run r WHERE r.run_id = run AND r.state IN ('succeeded', 'dead')) LOOP
            PERFORM pg_sleep(0.05);
        END LOOP;
        -- The comparison as the run did it (clock times; the run's own timestamps are its
        -- transactions' start times).
        INSERT INTO rc_times SELECT extract(epoch FROM x.checked_at - x.started_at) * 1000, r.state::text, x.differences
          FROM tide.run r CROSS JOIN LATERAL (SELECT * FROM tide.recon_result x WHERE x.run_id = run
                                               ORDER BY x.result_id DESC LIMIT 1) x
         WHERE r.run_id = run;
        COMMIT;
    END LOOP;
END $$;
CREATE TABLE rc_times (ms float8, state text, differences int);
SQL
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 -c "CALL rc_time(3)" >/dev/null
recon_ours=$("${PSQL[@]}" -d "$DB" -At -F ' ' -c "SELECT round(percentile_disc(0.5) WITHIN GROUP (ORDER BY ms)::numeric), string_agg(DISTINCT state, ','), max(differences) FROM rc_times")
recon_base=$("${PSQL[@]}" -d "$DB" -At -v ON_ERROR_STOP=1 <<'SQL'
SET work_mem = '256MB';
SET jit = off;
CREATE TEMP TABLE t (ms float8);
DO $$ DECLARE t0 timestamptz; d bigint; l text; r text; BEGIN
    FOR i IN 1..3 LOOP
        t0 := clock_timestamp();
        SELECT count(*) INTO d
          FROM (SELECT order_id::text AS key, amount FROM rc_pay WHERE day = date '2026-01-02') a
          FULL JOIN (SELECT ref AS key, amount FROM rc_bank WHERE day = date '2026-01-02') b ON a.key = b.key
         WHERE a.key IS NULL OR b.key IS NULL OR abs(a.amount - b.amount) > 0.001;
        SELECT count(*) || ' ' || sum(amount) INTO l FROM rc_pay WHERE day = date '2026-01-02';
        SELECT count(*) || ' ' || sum(amount) INTO r FROM rc_bank WHERE day = date '2026-01-02';
        INSERT INTO t VALUES (extract(epoch FROM clock_timestamp() - t0) * 1000);
    END LOOP;
END $$;
SELECT round(percentile_disc(0.5) WITHIN GROUP (ORDER BY ms)::numeric) FROM t;
SQL
)
# Memory: the same generated statement at work_mem 4MB, from psql, under EXPLAIN ANALYZE: the
# hash aggregate's peak memory and what it spilled.
recon_small=$("${PSQL[@]}" -d "$DB" -At -v ON_ERROR_STOP=1 <<'SQL'
SET work_mem = '4MB';
SET jit = off;
CREATE TEMP TABLE plan (line text);
DO $$ DECLARE l text; BEGIN
    FOR l IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF) ' || tide._recon_query(jsonb_build_object(
        'left_sql', 'SELECT order_id::text AS key, amount FROM rc_pay WHERE day = date ''2026-01-02''',
        'right_sql', 'SELECT ref AS key, amount FROM rc_bank WHERE day = date ''2026-01-02''',
        'amounts', jsonb_build_array('amount'), 'tolerance', 0.001, 'max_diffs', 10000)) LOOP
        INSERT INTO plan VALUES (l);
    END LOOP;
END $$;
SELECT round(substring(string_agg(line, ' ') FROM 'Execution Time: ([0-9.]+)')::numeric) || ' ' ||
       coalesce(substring(string_agg(line, ' ') FROM 'Memory Usage: ([0-9]+kB)'), '?') || ' ' ||
       coalesce(substring(string_agg(line, ' ') FROM 'Disk Usage: ([0-9]+kB)'), '0kB') FROM plan;
SQL
)
# Monitoring over the same history without the backlog: the ready runs the bulk and event rows
# left, never claimed, deleted (with their history and tide.pending lines), so that the rows
# show what the history costs apart from what waits in tide.pending (health counts each task's
# backlog).
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 <<'SQL' >/dev/null
DELETE FROM tide.run WHERE run_id IN (SELECT p.run_id FROM tide.pending p WHERE p.state = 'ready');
VACUUM ANALYZE tide.pending;
VACUUM ANALYZE tide.run;
VACUUM ANALYZE tide.run_event;
SQL
mon_nobacklog=$(monitor_costs)
# The SQL executors again with pg_tide.executors = 4, the external worker's 4 clients (executors
# are background workers: a restart), last, as it restarts the server; one warm-up round first.
"${PSQL[@]}" -d postgres -c "ALTER SYSTEM SET pg_tide.executors = 4" >/dev/null
as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" restart -m fast -w -t 60 >/dev/null
"${PSQL[@]}" -d "$DB" -c "DO \$\$ BEGIN
    WHILE (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide executor') < 4
          AND clock_timestamp() < now() + interval '60 seconds' LOOP
        PERFORM pg_sleep(0.1); END LOOP; END \$\$" >/dev/null
exec_once >/dev/null
exec_rate_4=$(exec_best)
rm -rf "$tmp"

rate() { awk -v t="$1" -v b="$2" 'BEGIN { printf "%.0f", t * b }'; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0) print "n/a"; else printf "%.0f%%", 100 * a / b }'; }
# ratio_row LABEL TIDE_TPS BASE_TPS: a batch-50 row of runs per second, pg_tide beside the baseline.
ratio_row() {
    local t b
    t=$(rate "$2" 50); b=$(rate "$3" 50)
    printf '%-46s %10s %10s %7s\n' "$1" "$t" "$b" "$(pct "$t" "$b")"
}
echo
echo "==> fire precision: an SQL job every minute, start after its fire time (ms, 10 jobs x 4 minutes each)"
printf '%-46s %10s %10s %7s\n' "" fires p50 p99
echo "$fire" | grep -E '^pg_(cron|tide)[,|]' | while IFS='|' read -r who n p50 p99; do
    printf '%-46s %10s %10s %7s\n' "$who" "$n" "$p50" "$p99"
done
echo "(target for pg_tide: p50 10 ms, p99 50 ms)"
echo
echo "==> claim + complete, $CLIENTS clients (runs per second, best of 3 rounds)"
printf '%-46s %10s %10s %7s\n' "batch, completion" pg_tide baseline ratio
for row in "1 tide_1 complete_run" "50 tide_50 complete_run" "50 many_50 complete_runs" "50 queued_50 complete_runs,+queue+max_concurrency" "50 logged_50 complete_runs,+log_runs+=+log"; do
    set -- $row
    t=$(rate "${result[$2]}" "$1"); b=$(rate "${result[base_$1]}" "$1")
    printf '%-46s %10s %10s %7s\n' "$1, tide.${3//+/ }" "$t" "$b" "$(pct "$t" "$b")"
done
echo "(runs left unfinished by pg_tide: $left; target: batch 50 at least 50% of the baseline)"
echo "queue max_concurrency at batch 50: $(pct "${result[queued_50]}" "${result[many_50]}") of complete_runs without a queue (target: at least 87%, i.e. at most 15% added)"
printf '%-46s %10s %10s %7s\n' "claims as history grows, batch 50" pg_tide baseline ratio
ratio_row "start (the claim rounds' runs only)" "${result[many_50]}" "${result[base_50]}"
ratio_row "over $history_at_claims finished runs" "${result[late_50]}" "${result[late_base_50]}"
echo "(tide.complete_runs; target: flat, the ratio to the bare queue kept as history grows)"
echo "tide.pending under a snapshot held ${HOLD} s (a forgotten BEGIN), 4 clients claiming and completing 1,000 runs/s on each queue:"
printf '%-46s %10s %10s %7s\n' "claims at batch 50 (runs/s)" pg_tide baseline ratio
ratio_row "before the snapshot" "$hold_t0" "$hold_b0"
ratio_row "after ${HOLD} s under it" "$hold_t1" "$hold_b1"
echo "tide.pending with its indexes: $hold_before before; $hold_during after ${HOLD} s under the snapshot; $hold_after once it ended, after a VACUUM"
echo "(target: tide.pending kept near its live size under a snapshot held 10 minutes; this measures ${HOLD} s)"
echo
echo "==> one tide.tick() with nothing due (average of 500, ms)"
printf '%-22s %10s\n' "1 task (baseline)" "$tick_1" "10,000 idle tasks" "$tick_10k"
echo "(target: under 20 ms with 10,000 idle tasks)"
echo
echo "==> monitoring (ms, average of 20 calls): health and dashboard (rows made, not sent), the tick's fold (every tick) and alert evaluation (every pg_tide.monitor_interval), metrics"
printf '%-34s %9s %9s %9s %9s %9s\n' "" health dashboard fold alerts metrics
printf '%-34s %9s %9s %9s %9s %9s\n' "1 task, no history (baseline)" $mon_1
printf '%-34s %9s %9s %9s %9s %9s\n' "10,000 idle tasks" $mon_10k
printf '%-34s %9s %9s %9s %9s %9s\n' "and $runs_full finished runs" $mon_nobacklog
printf '%-34s %9s %9s %9s %9s %9s\n' "  + $backlog_full ready runs waiting" $mon_full
echo "(target: each under 20 ms with 10,000 tasks and with 1,000,000 finished runs)"
printf '%-46s %10s %10s\n' "10,000 tasks made by one statement (s)" pg_tide pg_cron
printf '%-46s %10.1f %10.1f\n' "tide.schedule / cron.schedule" "$(awk -v ms="$schedule_10k_ms" 'BEGIN { print ms / 1000 }')" \
    "$(awk -v ms="$cron_10k_ms" 'BEGIN { print ms / 1000 }')"
echo "(target: at most 5 s for pg_tide; each task's rules are validated, versioned and its next fire worked out)"
printf '%-46s %10s %10s\n' "console overview, first 100 tasks (ms)" HTTP psql
printf '%-46s %10s %10s\n' "10,000 tasks and $runs_full finished runs" "$console_http" "$console_sql"
echo "(HTTP: the whole page, signed in, $console_rows task rows; psql: the same query, console/sql/overview.sql, average of 20 each)"
printf '%-58s %10s ms\n' "a task's charts (tide.run_hours, 24 h and 168 h)" "$chart_task_ms"
printf '%-58s %10s ms\n' "the overview's charts (every task of the owner)" "$chart_overview_ms"
printf '%-58s %10s ms   (tide.health filtered to it: %s ms)\n' "one task's health (tide.task_health)" "$task_health_ms" "$health_filtered_ms"
set -- $storage
echo "storage: $2 bytes per run kept ($1 runs; tide.run $3, tide.run_event $4, each with its indexes); tide.pending $5 MB for $6 rows (target: at most 600 bytes per finished run)"
echo
echo "==> event tasks"
printf '%-46s %10s %10s %7s\n' "" pg_tide baseline ratio
e1=$(awk -v ms="$emit_tx_ms" 'BEGIN { printf "%.0f", 10000 * 1000 / ms }')
b1=$(awk -v ms="$base_tx_ms" 'BEGIN { printf "%.0f", 10000 * 1000 / ms }')
printf '%-46s %10s %10s %7s\n' "emit, 10,000 in one transaction (events/s)" "$e1" "$b1" "$(pct "$e1" "$b1")"
e4=$(rate "$emit_tps" 1); b4=$(rate "$base_emit_tps" 1)
printf '%-46s %10s %10s %7s\n' "emit, 1 per transaction, $CLIENTS clients (events/s)" "$e4" "$b4" "$(pct "$e4" "$b4")"
t=$(rate "$event_50" 50); b=$(rate "$base_ev_50" 50)
printf '%-46s %10s %10s %7s\n' "event claim + complete_runs, batch 50 (runs/s)" "$t" "$b" "$(pct "$t" "$b")"
echo
echo "==> bulk enqueue and graphile-worker $GW_VERSION (jobs per second)"
per_s() { awk -v ms="$1" 'BEGIN { printf "%.0f", 20000 * 1000 / ms }'; }
q1=$(per_s "$bulk_enqueue_ms"); q2=$(per_s "$bulk_emit_ms"); qb=$(per_s "$bulk_base_ms")
q4=$(rate "$one_enqueue_tps" 1)
if [ -n "$gw" ]; then
    qg=$(per_s "$gw_bulk_ms"); g4=$(rate "$gw_one_tps" 1)
    printf '%-46s %10s %10s %10s %7s\n' "" pg_tide graphile bare "vs graphile"
    printf '%-46s %10s %10s %10s %7s\n' "tide.enqueue, 20,000 in one call" "$q1" "$qg" "$qb" "$(pct "$q1" "$qg")"
    printf '%-46s %10s %10s %10s %7s\n' "tide.emit_many, 20,000 in one call" "$q2" "$qg" "$qb" "$(pct "$q2" "$qg")"
    printf '%-46s %10s %10s %10s %7s\n' "tide.enqueue, 1 per transaction, $CLIENTS clients" "$q4" "$g4" "$b4" "$(pct "$q4" "$g4")"
    printf '%-46s %10s %10s %10s %7s\n' "tide.emit, 1 per transaction, $CLIENTS clients" "$e4" "$g4" "$b4" "$(pct "$e4" "$g4")"
    t1=$(rate "${result[tide_1]}" 1); t50=$(rate "${result[many_50]}" 50)
    printf '%-46s %10s %10s %10s %7s\n' "claim + complete, batch 1 (graphile: 4 jobs at once)" "$t1" "$gw_1" "$(rate "${result[base_1]}" 1)" "$(pct "$t1" "$gw_1")"
    printf '%-46s %10s %10s %10s %7s\n' "claim + complete, batch 50 (graphile: local queue 50)" "$t50" "$gw_50" "$(rate "${result[base_50]}" 50)" "$(pct "$t50" "$gw_50")"
    echo "(targets: bulk enqueue at least 50% of graphile's add_jobs; one emit per transaction at least 70% of the bare INSERT ($b4); claim + complete at batch 50 at least 150% of graphile and 65% of bare, at batch 1 80% of bare)"
else
    echo "graphile-worker rows skipped: $gw_why"
    printf '%-46s %10s %10s\n' "" pg_tide bare
    printf '%-46s %10s %10s\n' "tide.enqueue, 20,000 in one call" "$q1" "$qb" "tide.emit_many, 20,000 in one call" "$q2" "$qb"
    printf '%-46s %10s %10s\n' "tide.enqueue, 1 per transaction, $CLIENTS clients" "$q4" "$b4"
fi
echo
echo "==> backfills"
set -- $bf_wps; bfn=$1; bfw=$2
set -- $rr_wps; rrn=$1; rrw=$2
printf '%-46s %10s %10s %7s\n' "" backfill rerun ratio
printf '%-46s %10s %10s %7s\n' "$bfn windows of a no-op SQL task (windows/s)" "$bfw" "$rrw" "$(pct "$bfw" "$rrw")"
echo "(rerun: the same $rrn windows of another task put in line by tide.rerun one by one; the backfill's runs go to one executor, the other kept for online runs, the reruns' to both)"
set -- $pickup_idle; i50=$1; i99=$2
set -- $pickup_busy; b50=$1; b99=$2
printf '%-46s %10s %10s\n' "online pickup by the SQL executors (ms)" p50 p99
set -- $pickup_delayed; d50=$1; d99=$2
printf '%-46s %10s %10s\n' "idle" "$i50" "$i99" "enqueued with run_at, after run_at" "$d50" "$d99" "while a backfill runs ($busy_state)" "$b50" "$b99"
printf '%-46s %10s %10s\n' "references, idle (ms)" p50 p99
set -- $pickup_listen
printf '%-46s %10s %10s %s\n' "pg_tide external worker, LISTEN (Node pg)" "$1" "$2" "${*:3}"
set -- $pickup_gw
printf '%-46s %10s %10s %s\n' "graphile-worker $GW_VERSION, its own worker" "$1" "$2" "${*:3}"
echo "(target: p50 5 ms, p99 20 ms, idle and with run_at; external workers keep their LISTEN path)"
echo "(target: p99 with a backfill at most 1.5x the idle p99: $(pct "$b99" "$i99") of it)"
printf '%-46s %10s %10s %7s\n' "SQL executors, no-op command (runs/s)" executors external ratio
set -- $exec_rate
printf '%-46s %10s %10s %7s\n' "pg_tide.executors = 2 (the default)" "$1" "$(rate "$2" 1)" "$(pct "$1" "$2")"
set -- $exec_rate_4
printf '%-46s %10s %10s %7s\n' "pg_tide.executors = 4" "$1" "$(rate "$2" 1)" "$(pct "$1" "$2")"
echo "(external: an external worker's claim + complete at batch 1, 4 clients, measured beside each round; best of 3 each; target: at least as many)"
set -- $record
echo "succeeded-window record (R4.6), bytes per million hourly windows: $1 when all succeeded, $2 when every other one did"
echo
echo "==> reconciliation, 1,000,000 rows against 1,000,000, 100 differences (ms, median of 3)"
set -- $recon_ours; r_ms=$1; r_state=$2; r_diffs=$3
printf '%-46s %10s %10s %7s\n' "" pg_tide by-hand ratio
printf '%-46s %10s %10s %7s\n' "work_mem 256MB, JIT off" "$r_ms" "$recon_base" "$(pct "$r_ms" "$recon_base")"
echo "(pg_tide: runs $r_state, $r_diffs differences found, classified and recorded, with counts and sums;"
echo " by hand: FULL OUTER JOIN of the two sides plus a count and sum of each, duplicates not looked for;"
echo " target: at most 150% of it)"
set -- $recon_small
echo "the same statement at work_mem 4MB (EXPLAIN ANALYZE from psql): $1 ms; its hash aggregate peaked at $2 of memory and spilled $3 to disk"
echo
# Claims with a backlog, on a cluster of its own (the release build installed above).
PG_TIDE_BENCH_INSTALLED=1 bash bench/backlog.sh

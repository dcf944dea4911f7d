#!/usr/bin/env bash
# The previous release's SQL beside the current one's, on the same library (the release build):
# what a change of pg_tide's SQL costs its hot paths. For each of three rounds, the extension is
# created afresh at the newest frozen version (sql/pg_tide--X.Y.Z.sql; PG_TIDE_BENCH_PREVIOUS: an
# older one), then at the current one,
# and each measures the same things:
#   - one tide.emit per call, 2,000 calls in one transaction (µs per call, the best of four);
#   - one tide.emit and one tide.enqueue per transaction, 2 clients for 8 seconds (pgbench tps);
#   - tide.enqueue and tide.emit_many of 20,000 runs in one call (ms);
#   - claim + complete at batch 1 and batch 50, 2 clients for 8 seconds (pgbench tps) over a
#     backlog of 200,000 enqueued runs.
# Figures are printed side by side, never asserted, each round's and then each version's median
# (one round can be a quarter off either way here): the rounds alternate so that the noise of a
# small machine falls on both (PG_TIDE_BENCH_ROUNDS: how many, 3). Uses a throw-away cluster
# (PG_TIDE_BENCH_INSTALLED=1: with the build installed already).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

PORT=${PG_TIDE_BENCH_PORT:-5497}
DATA=${PG_TIDE_BENCH_DATA:-/var/tmp/pg_tide-bench-versions}
DB=bench
. scripts/cluster.sh

current=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
# PG_TIDE_BENCH_PREVIOUS: an older frozen version to compare with (default: the newest).
previous=${PG_TIDE_BENCH_PREVIOUS:-$(ls sql/ | sed -n 's/^pg_tide--\([0-9.]*\)\.sql$/\1/p' | sort -V | tail -1)}
if [ "$previous" = "$current" ]; then
    echo "the newest frozen version is the current one ($current): nothing to compare" >&2
    exit 1
fi

if [ "${PG_TIDE_BENCH_INSTALLED:-}" != 1 ]; then  # 1: the build installed already
    bash scripts/setup.sh >/dev/null
    install_release
fi
start_cluster "$DATA" "$PORT" "$DB" "max_connections = 40"
trap 'as_pg "$BIN/pg_ctl" -D "$DATA" stop -m fast -w >/dev/null 2>&1; rm -rf "$DATA"' EXIT
PSQL=("$BIN/psql" -X -q -At -h 127.0.0.1 -p "$PORT" -U postgres)
"${PSQL[@]}" -d postgres -c "CREATE DATABASE $DB"
PGBENCH=("$BIN/pgbench" -h 127.0.0.1 -p "$PORT" -U postgres -n -c 2 -j 2 -T 8)
SCRIPTS=$(mktemp -d)
trap 'as_pg "$BIN/pg_ctl" -D "$DATA" stop -m fast -w >/dev/null 2>&1; rm -rf "$DATA" "$SCRIPTS"' EXIT
echo "SELECT tide.emit('t');" > "$SCRIPTS/emit.sql"
echo "SELECT tide.enqueue('jobs');" > "$SCRIPTS/enqueue.sql"
cat > "$SCRIPTS/claim1.sql" <<'SQL'
SELECT run_id AS r, lease_token AS l FROM tide.claim_runs('default', 'w', 1) \gset
SELECT tide.complete_run(:r, :l);
SQL
cat > "$SCRIPTS/claim50.sql" <<'SQL'
SELECT quote_literal(string_agg(run_id::text, ',')) AS r, quote_literal(string_agg(lease_token::text, ',')) AS l
  FROM tide.claim_runs('default', 'w', 50) \gset
SELECT tide.complete_runs(string_to_array(:r, ',')::bigint[], string_to_array(:l, ',')::bigint[]);
SQL
chmod -R a+r "$SCRIPTS"

tps() { # $1 = script: transactions per second
    "${PGBENCH[@]}" -f "$SCRIPTS/$1" "$DB" 2>/dev/null | sed -n 's/^tps = \([0-9]*\)\..*/\1/p'
}

# One version's figures, tab-separated, in the order of the header below.
measure() { # $1 = version
    # The workers hold the database: they are stopped for the DROP (they come back at once).
    for _ in 1 2 3 4 5; do
        "${PSQL[@]}" -d "$DB" -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                                   WHERE backend_type LIKE 'pg_tide%'" >/dev/null
        "${PSQL[@]}" -d "$DB" -c "DROP EXTENSION IF EXISTS pg_tide CASCADE" 2>/dev/null && break
        sleep 1
    done
    "${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 >/dev/null <<SQL
CREATE EXTENSION pg_tide VERSION '$1';
SELECT tide.schedule('jobs', NULL, topics => ARRAY['t']);
SELECT tide.schedule('jobs_many', NULL, topics => ARRAY['u']);
SQL
    local one bulk many
    one=$("${PSQL[@]}" -d "$DB" 2>&1 <<'SQL' | sed -n 's/.*NOTICE:  //p'
DO $$ DECLARE t0 timestamptz; best float8 := 1e9; BEGIN
    FOR k IN 1 .. 4 LOOP
        t0 := clock_timestamp();
        FOR i IN 1 .. 2000 LOOP PERFORM tide.emit('t'); END LOOP;
        best := least(best, extract(epoch FROM clock_timestamp() - t0) * 1e6 / 2000);
    END LOOP;
    RAISE NOTICE '%', round(best::numeric, 1);
END $$;
SQL
)
    bulk=$("${PSQL[@]}" -d "$DB" 2>&1 <<'SQL' | sed -n 's/.*NOTICE:  //p'
DO $$ DECLARE t0 timestamptz := clock_timestamp(); BEGIN
    PERFORM tide.enqueue('jobs', (SELECT jsonb_agg(jsonb_build_object('i', g)) FROM generate_series(1, 20000) g));
    RAISE NOTICE '%', round((extract(epoch FROM clock_timestamp() - t0) * 1e3)::numeric, 0);
END $$;
SQL
)
    many=$("${PSQL[@]}" -d "$DB" 2>&1 <<'SQL' | sed -n 's/.*NOTICE:  //p'
DO $$ DECLARE t0 timestamptz := clock_timestamp(); BEGIN
    PERFORM tide.emit_many('u', (SELECT array_agg(jsonb_build_object('i', g)) FROM generate_series(1, 20000) g));
    RAISE NOTICE '%', round((extract(epoch FROM clock_timestamp() - t0) * 1e3)::numeric, 0);
END $$;
SQL
)
    local emit_tx enqueue_tx c1 c50
    emit_tx=$(tps emit.sql)
    enqueue_tx=$(tps enqueue.sql)
    "${PSQL[@]}" -d "$DB" >/dev/null <<'SQL'
SELECT count(*) FROM tide.enqueue('jobs', (SELECT jsonb_agg(jsonb_build_object('i', g)) FROM generate_series(1, 100000) g));
SELECT count(*) FROM tide.enqueue('jobs', (SELECT jsonb_agg(jsonb_build_object('i', g)) FROM generate_series(1, 100000) g));
VACUUM ANALYZE tide.run;
VACUUM ANALYZE tide.pending;
SQL
    c1=$(tps claim1.sql)
    c50=$(tps claim50.sql)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$one" "$emit_tx" "$enqueue_tx" "$bulk" "$many" "$c1" "$((c50 * 50))"
}

printf 'version\temit µs/call\temit tx/s\tenqueue tx/s\tenqueue 20k ms\temit_many 20k ms\tclaim+complete b1 tx/s\tb50 runs/s\n'
# Each round the other version goes first: what the first leaves (autovacuum of the dropped
# tables, a checkpoint) falls on each alike.
for round in $(seq "${PG_TIDE_BENCH_ROUNDS:-3}"); do
    if [ $((round % 2)) = 1 ]; then
        measure "$previous"
        measure "$current"
    else
        measure "$current"
        measure "$previous"
    fi
done | tee "$SCRIPTS/rows"
# The median of each figure over the rounds, per version: on a small machine one round can be a
# quarter off either way.
median() { # stdin: numbers, one a line
    sort -n | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'
}
for v in "$previous" "$current"; do
    line="median $v"
    for col in 2 3 4 5 6 7 8; do
        line="$line\t$(awk -F'\t' -v v="$v" -v c="$col" '$1 == v { print $c }' "$SCRIPTS/rows" | median)"
    done
    printf '%b\n' "$line"
done

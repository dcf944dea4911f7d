#!/usr/bin/env bash
# Every test tier, in order of speed. Prints each runner's summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

bash scripts/setup.sh

PGDATA_TEST=/tmp/pg_tide-pgdata
summaries=()
run_tier() {
    local name=$1; shift
    printf '\n==> %s: %s\n' "$name" "$*"
    local log
    log=$(mktemp)
    set +e
    "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    set -e
    while IFS= read -r line; do summaries+=("$name: $line"); done < <(grep -E '^test result:' "$log")
    rm -f "$log"
    if [ "$rc" != 0 ]; then
        printf '\n%s FAILED (exit %s)\n' "$name" "$rc"
        exit "$rc"
    fi
}

# 0. Format and lints: what CI refuses before any test runs.
run_tier fmt cargo fmt --all -- --check
run_tier clippy cargo clippy --workspace --all-targets -- -D warnings
# No import circle in src/, between modules or between concept folders.
run_tier modules python3 scripts/modules.py
# 1. Pure logic: the calendar, rules, errors. No PostgreSQL.
run_tier unit cargo test --lib -- --skip sql_tests
# 2. The SQL API inside PostgreSQL, one rolled-back transaction per test.
run_tier pg_test cargo pgrx test pg15 sql_tests --runas postgres --pgdata "$PGDATA_TEST"
# 3. A real cluster with pg_tide preloaded, real connections (the extension as users get it).
run_tier install bash scripts/install.sh
# The installed extension script, as pgspot (the security linter) reads it: no findings.
run_tier pgspot bash scripts/pgspot.sh
run_tier cluster cargo test -p pg_tide_pg_test --test cluster
# Upgrades: each frozen version (sql/pg_tide--X.Y.Z.sql) with data, ALTER EXTENSION pg_tide
# UPDATE, the same schema as a fresh install (pg_dump), every row kept, the workers going on.
run_tier upgrade cargo test -p pg_tide_pg_test --test upgrade
run_tier engine cargo test -p pg_tide_pg_test --test engine
run_tier monitor cargo test -p pg_tide_pg_test --test monitor
run_tier guarantees cargo test -p pg_tide_pg_test --test guarantees
run_tier locks cargo test -p pg_tide_pg_test --test locks
run_tier events cargo test -p pg_tide_pg_test --test events
run_tier queues cargo test -p pg_tide_pg_test --test queues
# Backfills: ranges, modes, canary, sample, pause/resume/cancel, isolation, kill -9 and restart.
run_tier backfill cargo test -p pg_tide_pg_test --test backfill
# Reconciliations: every kind and class, compensation once, alerts, failing sides, postgres_fdw.
run_tier recon cargo test -p pg_tide_pg_test --test recon
# Alert delivery (webhook, e-mail over STARTTLS) by the delivery worker, escalation and
# reminders, the watchdog and the ping, CREATE EXTENSION refusals, alert kinds of every task.
run_tier alerts cargo test -p pg_tide_pg_test --test alerts
# The web console (pg_tide-console): its unit tests, then headless Chromium through
# chromedriver against the console and a cluster with the workers; screenshots of every page at
# desktop and phone width land in target/console-screenshots/.
run_tier console cargo test -p pg_tide_console
# The external workers of examples/ in Python (psycopg 3), Node (pg), Go (lib/pq) and Rust
# (tokio-postgres), each run against a cluster: every kind of run, then SIGTERM mid-run.
run_tier examples bash scripts/examples.sh
# The Python and Node workers through pgbouncer in transaction pooling mode; fencing through it.
run_tier pgbouncer bash scripts/examples.sh pgbouncer
# High availability: two nodes under Patroni with etcd; kill -9 of the leader, rejoin,
# switchover, under load; asynchronous and synchronous_mode.
run_tier patroni cargo test -p pg_tide_pg_test --test patroni
# tide.import_pg_cron against the real pg_cron, preloaded beside pg_tide.
run_tier pg_cron cargo test -p pg_tide_pg_test --test pg_cron
# Three hostile roles and the superuser on one cluster; generated hostile calls of every function.
run_tier security cargo test -p pg_tide_pg_test --test security
run_tier fuzz cargo test -p pg_tide_pg_test --test fuzz
# Two roles share the executors: one's backlog, long commands, 500 every-second tasks or a full
# NOTIFY queue never hold back the other's every-second task; limits; roles that come and go.
run_tier fairness cargo test -p pg_tide_pg_test --test fairness
# Every SQL example of README.md, docs/ and examples/ (pg_test/tests/docs.rs).
run_tier docs cargo test -p pg_tide_pg_test --test docs
# PostgreSQL 17 and 18, each in a Debian chroot (scripts/chroot.sh: trixie, forky; made with
# debootstrap when missing, cached in /var/cache/pg_tide/chroots): the in-database tier, then the
# cluster, upgrade, engine, security and fuzz tiers against pg_tide installed there.
run_tier pg17 bash scripts/chroot.sh trixie bash scripts/release-tiers.sh
run_tier pg18 bash scripts/chroot.sh forky bash scripts/release-tiers.sh
# The Debian packages (make package) for 15, 17 and 18, each installed with apt in its own
# release, then the cluster and upgrade tiers against it; the console's package; pg_upgrade of a
# 15 cluster with pg_tide and data to 17. Last: it leaves the packaged release build installed.
run_tier package bash scripts/package-test.sh

# Runners that ran nothing (empty doc-test binaries) are left out of the summary.
printf '\n==> summary\n'
passed=0
failed=0
for line in "${summaries[@]}"; do
    p=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$line")
    f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")
    [ "$p" = 0 ] && [ "$f" = 0 ] && continue
    printf '%s\n' "$line"
    passed=$((passed + p))
    failed=$((failed + f))
done
printf 'total: %d passed, %d failed\n' "$passed" "$failed"

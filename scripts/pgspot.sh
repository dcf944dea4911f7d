#!/usr/bin/env bash
# pgspot over the installed extension script (what CREATE EXTENSION runs): no errors and no
# warnings. Every function pins search_path to pg_catalog, pg_temp (but the inlined ones below)
# and the script sets it too, so pgspot sees every name resolved safely. Prints a libtest-style
# line for the summary.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PG_TIDE_PGSPOT_VENV:-$HOME/.cache/pg_tide/pgspot-venv}
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
script="${PG_TIDE_PGSPOT_SCRIPT:-$($PG_CONFIG --sharedir)/extension/pg_tide--$version.sql}"
if [ ! -f "$script" ]; then
    echo "pgspot: $script is not installed (run cargo pgrx install first)" >&2
    exit 1
fi
# The one justified exception, PS005 (no search_path) for these functions: SQL functions that
# PostgreSQL inlines into their callers on the hot paths (claims, emits, the tick, health, the
# row-level security policies), which
# a SET clause would forbid. Their bodies qualify every name, operator and type with its schema,
# so pgspot checks them as bodies under an unsafe search_path and finds nothing; they are only
# called from functions that pin search_path. A changed signature drops out of this list and
# fails the check.
inlined=(
    "tide._task_rules(t tide.task)"
    "tide._executor_of(command text)"
    "tide._run_executor(p_rules jsonb,p_window boolean)"
    "tide._open_state(rules jsonb)"
    "tide._lease_length(p_executor tide.executor,rules jsonb,p_lease interval)"
    "tide._gate(p_task_id bigint,p_overlap text,p_window_start timestamptz,p_event_key text,p_long boolean)"
    "tide._gated(p_gate text,p_lock_key text,p_overlap text,p_window_start timestamptz,p_max_concurrency integer)"
    "tide._gating_of(p_task_id bigint,p_version integer,p_args jsonb,p_payload jsonb,p_event_key text,p_biz_date date,p_window_start timestamptz,gate text,lock_key text,gated boolean)"
    "tide._gating_by(p_lock_rule text,p_overlap text,p_long boolean,p_max_concurrency integer,p_task_id bigint,p_task_name text,p_args jsonb,p_payload jsonb,p_event_key text,p_biz_date date,p_window_start timestamptz,gate text,lock_key text,gated boolean)"
    "tide._max_silence(max_silence interval,fire_gap interval,timeout interval)"
    "tide._silence_level(silence interval,max_silence interval)"
    "tide._logfmt(v text)"
    "tide._visible(p_owner name)"
    "tide._short(d interval)"
    "tide._status_rank(status text)"
    "tide._log_on()"
    "tide._setting(name text,fallback text)"
    # SQL functions until 0.2.6 (_le and _counts_of are C functions since, _duration_bucket is
    # gone): the frozen scripts define them.
    "tide._le(seconds double precision)"
    "tide._duration_bucket(d interval)"
    "tide._counts_of(p_to tide.run_state,p_attempts integer,p_claimed timestamptz,p_finished timestamptz,p_started timestamptz,p_fire timestamptz,p_created timestamptz,metric text,label text,value double precision)"
)
args=()
for f in "${inlined[@]}"; do args+=(--proc-without-search-path "$f"); done
# The install script, then each upgrade script (sql/pg_tide--A--B.sql): ALTER EXTENSION UPDATE
# runs them as the superuser too.
scripts=("$script")
for f in sql/pg_tide--*--*.sql; do [ -f "$f" ] && scripts+=("$f"); done
# The justified exceptions to PS002 (CREATE OR REPLACE): 0.2.4 to 0.2.5 replaces in place the
# two functions that row-level security policies and views depend on (tide._visible,
# tide._self). Dropping them would mean ALTER POLICY on 28 tables, an ACCESS EXCLUSIVE lock on
# each, taken while the workers run, and the upgrade tier saw that deadlock. 0.2.5 to 0.2.6
# replaces the trigger function tide._run_changed in place for the same reason (dropping it
# means dropping and creating the trigger on tide.run). In an extension script PostgreSQL itself
# refuses to replace a function that is not the extension's.
replaces_in_place=(sql/pg_tide--0.2.4--0.2.5.sql sql/pg_tide--0.2.5--0.2.6.sql)
failed=0
for s in "${scripts[@]}"; do
    extra=()
    for r in "${replaces_in_place[@]}"; do [ "$s" = "$r" ] && extra=(--ignore PS002); done
    out=$("$VENV/bin/pgspot" "${args[@]}" "${extra[@]}" "$s" 2>&1) || true
    echo "$out" | grep -v '^\s*$' | sed "s|^|pgspot ($(basename "$s")): |"
    summary=$(echo "$out" | grep -E 'Errors: [0-9]+ Warnings: [0-9]+ Unknown: [0-9]+' | tail -1)
    if [ -z "$summary" ]; then
        echo "pgspot did not report a summary for $s" >&2
        exit 1
    fi
    # pgspot stops checking at what it cannot parse (it then still prints a summary): any line
    # but the summary is a finding.
    others=$(echo "$out" | grep -v '^\s*$' | grep -vcE 'Errors: [0-9]+ Warnings: [0-9]+ Unknown: [0-9]+' || true)
    # A clean script is one with no finding at all.
    if [ "$others" != 0 ] || ! echo "$summary" | grep -q 'Errors: 0 Warnings: 0 Unknown: 0'; then
        failed=1
    fi
done
if [ "$failed" = 0 ]; then
    echo "test result: ok. ${#scripts[@]} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out (${scripts[*]})"
else
    echo "test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out"
    exit 1
fi

#!/usr/bin/env bash
# pgspot over the installed extension script (what CREATE EXTENSION runs): no errors and no
# warnings. Every function pins search_path to pg_catalog, pg_temp and the script sets it too,
# so pgspot sees every name resolved safely. Prints a libtest-style line for the summary.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PG_TIDE_PGSPOT_VENV:-$HOME/.cache/pg_tide/pgspot-venv}
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
script="$($PG_CONFIG --sharedir)/extension/pg_tide--$version.sql"
if [ ! -f "$script" ]; then
    echo "pgspot: $script is not installed (run cargo pgrx install first)" >&2
    exit 1
fi
out=$("$VENV/bin/pgspot" "$script" 2>&1) || true
echo "$out" | grep -v '^\s*$' | sed 's/^/pgspot: /'
summary=$(echo "$out" | grep -E 'Errors: [0-9]+ Warnings: [0-9]+ Unknown: [0-9]+' | tail -1)
if [ -z "$summary" ]; then
    echo "pgspot did not report a summary" >&2
    exit 1
fi
# pgspot stops checking at what it cannot parse (it then still prints a summary): any line but
# the summary is a finding.
others=$(echo "$out" | grep -v '^\s*$' | grep -vcE 'Errors: [0-9]+ Warnings: [0-9]+ Unknown: [0-9]+' || true)
# A clean script is one with no finding at all.
if [ "$others" = 0 ] && echo "$summary" | grep -q 'Errors: 0 Warnings: 0 Unknown: 0'; then
    echo "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out ($script)"
else
    echo "test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out ($summary)"
    exit 1
fi

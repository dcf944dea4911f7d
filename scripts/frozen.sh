#!/usr/bin/env bash
# Copies the frozen install scripts of earlier versions (sql/pg_tide--X.Y.Z.sql, never the
# current version's, which the build generates) into an extension directory: $1.
# Used by scripts/install.sh and scripts/package.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=$1
current=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
for f in sql/pg_tide--*.sql; do
    v=${f#sql/pg_tide--}
    v=${v%.sql}
    case "$v" in *--*) continue ;; esac  # an upgrade script: cargo pgrx copies those
    if [ "$v" = "$current" ]; then
        echo "frozen.sh: $f is the current version's script; the build generates it (bump the version)" >&2
        exit 1
    fi
    install -m 644 "$f" "$dest/"
done

#!/usr/bin/env bash
# Stops the demo cluster (with its webhook receiver and console) started by scripts/demo.sh (its data stays until the next demo).
set -euo pipefail
DATA=${PG_TIDE_DEMO_DATA:-/var/tmp/pg_tide-demo}
if [ -f "$DATA/postmaster.pid" ]; then
    sudo -u postgres /usr/lib/postgresql/15/bin/pg_ctl -D "$DATA" stop -m fast -w
else
    echo "no demo cluster is running in $DATA"
fi
if [ -f "$DATA.webhook.pid" ]; then
    kill "$(cat "$DATA.webhook.pid")" 2>/dev/null || true
    rm -f "$DATA.webhook.pid"
fi
if [ -f "$DATA.console.pid" ]; then
    kill "$(cat "$DATA.console.pid")" 2>/dev/null || true
    rm -f "$DATA.console.pid"
fi

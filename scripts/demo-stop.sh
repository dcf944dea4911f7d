#!/usr/bin/env bash
# Stops the demo cluster (and its webhook receiver) started by scripts/demo.sh (its data stays until the next demo).
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

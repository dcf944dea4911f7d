#!/usr/bin/env bash
# The main job, the way a user runs pg_tide: install the extension into Debian's PostgreSQL 15,
# start a cluster with pg_tide preloaded and its workers, schedule realistic tasks, show their
# fire times and business windows across DST, then watch real runs: on time, a retry, a dead
# letter and its replay; event runs in per-key order under a lock; a long task in batches,
# paused and resumed; pg_cron jobs imported (one of another database, run there) and a VACUUM run
# at top level; one-off and delayed
# jobs; a queue limit holding; then a failing task's alert delivered to a webhook receiver the
# demo starts (its channel tested first), a run that cannot start (late_start, and its cause), a
# top-level command cancelled while it runs, a heartbeat check, pg_tide's own health, the
# dashboard, and the console's /metrics as a Prometheus scraper reads it.
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
# Room for pg_tide's command workers (top-level commands, commands in other databases) beside its
# own workers, pg_cron's launcher and the logical replication launcher.
# Alerts evaluated every 2 s rather than 10 (pg_tide.monitor_interval), so that the demo's
# alerts open and resolve while you watch.
start_cluster "$DATA" "$PORT" "$DB" "shared_preload_libraries = 'pg_tide,pg_cron'
cron.database_name = '$DB'
max_worker_processes = 16
pg_tide.monitor_interval = '2s'"

# A webhook receiver on 127.0.0.1 (the demo's alerts arrive there), kept running beside the
# cluster and stopped by make demo-stop.
HOOK_PORT=${PG_TIDE_DEMO_HOOK_PORT:-5497}
HOOK_LOG="$DATA/webhook.log"
HOOK_SECRET=demo-signing-secret
if [ -f "$DATA.webhook.pid" ]; then kill "$(cat "$DATA.webhook.pid")" 2>/dev/null || true; fi
: > "$HOOK_LOG"
python3 scripts/webhook_receiver.py "$HOOK_PORT" "$HOOK_SECRET" "$HOOK_LOG" &
echo $! > "$DATA.webhook.pid"
echo "==> a webhook receiver listens on http://127.0.0.1:$HOOK_PORT (it logs to $HOOK_LOG)"

PSQL=("$BIN/psql" -X -h 127.0.0.1 -p "$PORT" -U postgres)
"${PSQL[@]}" -q -d postgres -c "CREATE DATABASE $DB"
# An application database, where a job moved from pg_cron (schedule_in_database) runs.
"${PSQL[@]}" -q -d postgres -c "CREATE DATABASE ${DB}_app"
# The scheduler connects to the new database within a second or two (it retries every second):
# the demo schedules its first task once it is there.
for _ in $(seq 1 100); do
    up=$("${PSQL[@]}" -qtA -d postgres -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide scheduler' AND datname = '$DB'")
    [ "$up" = 1 ] && break
    sleep 0.1
done
"${PSQL[@]}" -d "$DB" -v ON_ERROR_STOP=1 -P pager=off -v hook_url="http://127.0.0.1:$HOOK_PORT/hooks/ops" \
    -v hook_secret="$HOOK_SECRET" -f demo/demo.sql

echo
echo "==> what the webhook receiver got ($HOOK_LOG):"
cat "$HOOK_LOG"

# The web console against the demo database, kept running beside the cluster (make demo-stop
# stops it).
CONSOLE_PORT=${PG_TIDE_DEMO_CONSOLE_PORT:-8790}
CONSOLE_LOG="$DATA/console.log"
echo "==> building the console (release)"
cargo build -q --release -p pg_tide_console
if [ -f "$DATA.console.pid" ]; then kill "$(cat "$DATA.console.pid")" 2>/dev/null || true; fi
# /metrics too, read as the role scraper, a member of tide_monitor (demo.sql made it): every
# owner's figures and nothing else.
nohup target/release/pg_tide-console --database "postgres://127.0.0.1:$PORT/$DB" \
    --metrics-database "postgres://scraper@127.0.0.1:$PORT/$DB" \
    --listen "127.0.0.1:$CONSOLE_PORT" > "$CONSOLE_LOG" 2>&1 &
echo $! > "$DATA.console.pid"
for _ in $(seq 100); do
    grep -q serving "$CONSOLE_LOG" && break
    sleep 0.1
done
grep -q serving "$CONSOLE_LOG" || { echo "the console did not start:"; cat "$CONSOLE_LOG"; exit 1; }
echo
echo "==> Prometheus scrapes http://127.0.0.1:$CONSOLE_PORT/metrics (as scraper, a member of tide_monitor); a few of its series:"
python3 - "http://127.0.0.1:$CONSOLE_PORT/metrics" <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=30).read().decode()
keep = ('pg_tide_build_info', 'pg_tide_workers{', 'pg_tide_last_tick_timestamp_seconds',
        'pg_tide_deliveries_total{', 'pg_tide_task_last_success_timestamp_seconds{owner="postgres",task="daily_total"}',
        'pg_tide_task_status{owner="postgres",task="partner_import"', 'pg_tide_alerts_open{kind="late_start"')
lines = [l for l in text.splitlines() if l.startswith(keep)]
print("\n".join("    " + l for l in lines))
print("    ... %d lines in all; monitoring/prometheus-rules.yml and grafana-prometheus.json use them" % len(text.splitlines()))
PY

# The console as its user sees it: what the charts of a task and of the overview say, and
# screenshots of both pages at desktop and phone width (Chromium, when installed: make setup).
TASK_ID=$("${PSQL[@]}" -d "$DB" -Atc "SELECT task_id FROM tide.task WHERE name = 'rollup_5s'")
echo
echo "==> the console's charts (tide.run_hours, pg_tide's hourly counters):"
python3 - "http://127.0.0.1:$CONSOLE_PORT" "$TASK_ID" "$PWD/target/console-screenshots" \
    "$PWD/console/static/app.css" <<'PY'
import html, http.cookiejar, os, re, shutil, subprocess, sys, tempfile, urllib.parse, urllib.request
base, task, shots, css = sys.argv[1:5]
jar = http.cookiejar.CookieJar()
web = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
web.open(base + "/login", urllib.parse.urlencode({"user": "postgres", "password": ""}).encode(), timeout=30)
def text(fragment):
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()
pages = {"overview": "/", "task": "/task/" + task}
os.makedirs(shots, exist_ok=True)
browser = shutil.which("chromium")
tmp = tempfile.mkdtemp()
shutil.copy(css, os.path.join(tmp, "app.css"))
for name, path in pages.items():
    page = web.open(base + path, timeout=30).read().decode()
    print("    %s (%s):" % (name, base + path))
    for caption in re.findall(r'<figcaption[^>]*>(.*?)</figcaption>', page, re.S):
        print("      " + " ".join(text(caption).split()))
    if browser:
        local = os.path.join(tmp, name + ".html")
        with open(local, "w") as f:
            f.write(page.replace("/static/app.css", "app.css").replace('<script src="/static/app.js" defer></script>', ""))
        for width, suffix in ((1280, "desktop"), (375, "phone")):
            out = os.path.join(shots, "demo-%s-%s.png" % (name, suffix))
            subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            "--window-size=%d,1600" % width, "--screenshot=" + out, "file://" + local],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=False)
            if os.path.exists(out):
                print("      screenshot: " + os.path.relpath(out))
shutil.rmtree(tmp)
PY

cat <<EOT

==> the demo cluster is running. Connect with:

    psql -h 127.0.0.1 -p $PORT -U postgres $DB

==> the console: http://127.0.0.1:$CONSOLE_PORT
    sign in as postgres (this demo cluster trusts connections from 127.0.0.1, so the password
    is not checked; on a real server every role signs in with its own password)

    stop them with: make demo-stop
EOT

#!/usr/bin/env bash
# pg_upgrade from PostgreSQL 15 to 17 with pg_tide and its data, in the trixie chroot
# (scripts/chroot.sh trixie bash scripts/pg-upgrade-test.sh; the package tier runs it after the
# packages are built). PostgreSQL 15 comes from Debian 12's archive (bookworm, pinned low so
# that it gives only what trixie lacks), pg_tide for it from target/'s postgresql-15-pg-tide
# package, pg_tide for 17 from postgresql-17-pg-tide. A 15 cluster with pg_tide preloaded gets
# tasks, runs (succeeded and dead), an open alert and an event; pg_upgrade makes a 17 cluster of
# it; every task, run, alert and setting is there as it was, and the workers go on (the
# every-second task fires again, a new event runs). Prints a libtest-style line for the summary.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${PG_TIDE_CHROOT:?run in the trixie chroot: scripts/chroot.sh trixie bash scripts/pg-upgrade-test.sh}"
old=/usr/lib/postgresql/15/bin
new=/usr/lib/postgresql/17/bin
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
say() { printf '==> pg_upgrade: %s\n' "$*"; }
fail() { echo "pg-upgrade-test: $*" >&2; exit 1; }

if [ ! -x "$old/postgres" ]; then
    say "installing PostgreSQL 15 from Debian 12 (bookworm) into the chroot"
    echo "deb [check-valid-until=no] http://deb.debian.org/debian bookworm main" > /etc/apt/sources.list.d/bookworm.list
    printf 'Package: *\nPin: release n=bookworm\nPin-Priority: 100\n' > /etc/apt/preferences.d/bookworm
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql-15 >/dev/null
fi
for major in 15 17; do
    deb="target/postgresql-$major-pg-tide_${version}-1_$arch.deb"
    [ -f "$deb" ] || fail "$deb is missing: make package builds it"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --reinstall --allow-downgrades "./$deb" >/dev/null
done

dir=/tmp/pg_tide-pg-upgrade
rm -rf "$dir"
mkdir -p "$dir"
chown postgres "$dir"
port_old=55415
port_new=55417
as_pg() { (cd "$dir" && sudo -u postgres "$@"); }
conf() {
    cat >> "$1/postgresql.conf" <<CONF
port = $2
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
shared_preload_libraries = 'pg_tide'
pg_tide.database = 'tide_up'
pg_tide.tick_interval = 200
CONF
}
sql() { psql -X -q -At -h 127.0.0.1 -p "$1" -U postgres -d tide_up -v ON_ERROR_STOP=1 -c "$2"; }
wait_until() { # wait_until PORT SQL WHAT: polls SQL until it returns t, for 60 s
    local deadline=$((SECONDS + 60))
    until [ "$(sql "$1" "$2" 2>/dev/null || true)" = t ]; do
        [ $SECONDS -lt $deadline ] || fail "timed out waiting for $3"
        sleep 0.2
    done
}
cleanup() {
    for d in old new; do
        [ -f "$dir/$d/postmaster.pid" ] && as_pg "$([ $d = old ] && echo $old || echo $new)/pg_ctl" -D "$dir/$d" stop -m immediate -w >/dev/null 2>&1 || true
    done
}
trap cleanup EXIT

say "a PostgreSQL 15 cluster with pg_tide $version and data"
as_pg "$old/initdb" --auth=trust --username=postgres --encoding=UTF8 -D "$dir/old" >/dev/null
conf "$dir/old" $port_old
as_pg "$old/pg_ctl" -D "$dir/old" -l "$dir/old.log" start -w >/dev/null
psql -X -q -h 127.0.0.1 -p $port_old -U postgres -d postgres -c "CREATE DATABASE tide_up" >/dev/null
sql $port_old "CREATE EXTENSION pg_tide;
    CREATE TABLE up_tick (at timestamptz DEFAULT now(), server int DEFAULT current_setting('server_version_num')::int);
    CREATE TABLE up_event (k text, server int DEFAULT current_setting('server_version_num')::int);
    SELECT tide.schedule('up_every_second', '* * * * * *', 'INSERT INTO up_tick DEFAULT VALUES');
    SELECT tide.schedule('up_fails', '* * * * * *', 'SELECT 1/0', max_attempts => 1);
    SELECT tide.schedule('up_event', NULL, \$\$INSERT INTO up_event (k) VALUES (tide.payload()->>'k')\$\$, topics => '{up}');
    SELECT tide.emit('up', '{\"k\": \"before\"}');" >/dev/null
wait_until $port_old "SELECT (SELECT count(*) FROM up_tick) >= 3 AND EXISTS (SELECT 1 FROM up_event)
                        AND EXISTS (SELECT 1 FROM tide.alert WHERE resolved_at IS NULL)" "runs and an alert on 15"
sql $port_old "SELECT tide.pause('up_fails')" >/dev/null
# What must survive: every task, run (with its state and attempts), run event, alert and
# setting, as one digest each.
digest="SELECT concat_ws(' | ',
    (SELECT md5(string_agg(concat_ws(',', task_id, name, owner, schedule, command, misfire), ';' ORDER BY task_id)) FROM tide.task),
    (SELECT md5(string_agg(concat_ws(',', run_id, task_id, state, attempts, window_start, dedupe_key), ';' ORDER BY run_id)) FROM tide.run WHERE run_id <= %s),
    (SELECT md5(string_agg(concat_ws(',', event_id, run_id, to_state), ';' ORDER BY event_id)) FROM tide.run_event WHERE run_id <= %s),
    (SELECT md5(string_agg(concat_ws(',', alert_id, kind, subject, opened_at, resolved_at), ';' ORDER BY alert_id)) FROM tide.alert),
    (SELECT count(*) FROM tide.run WHERE run_id <= %s))"
as_pg "$old/pg_ctl" -D "$dir/old" stop -m fast -w >/dev/null
# The digest is taken with the workers stopped: start the old cluster once more without them.
as_pg "$old/pg_ctl" -D "$dir/old" -l "$dir/old.log" -o "-c pg_tide.enabled=off" start -w >/dev/null
last=$(sql $port_old "SELECT max(run_id) FROM tide.run")
before=$(sql $port_old "$(printf "$digest" "$last" "$last" "$last")")
runs_before=$(sql $port_old "SELECT count(*) FROM tide.run")
as_pg "$old/pg_ctl" -D "$dir/old" stop -m fast -w >/dev/null

say "pg_upgrade to PostgreSQL 17"
as_pg "$new/initdb" --auth=trust --username=postgres --encoding=UTF8 -D "$dir/new" >/dev/null
conf "$dir/new" $port_new
as_pg "$new/pg_upgrade" -b "$old" -B "$new" -d "$dir/old" -D "$dir/new" -U postgres \
    -p $port_old -P $port_new -s "$dir" > "$dir/pg_upgrade.log" 2>&1 || { tail -30 "$dir/pg_upgrade.log"; fail "pg_upgrade failed"; }
as_pg "$new/pg_ctl" -D "$dir/new" -l "$dir/new.log" -o "-c pg_tide.enabled=off" start -w >/dev/null
after=$(sql $port_new "$(printf "$digest" "$last" "$last" "$last")")
[ "$before" = "$after" ] || fail "tasks, runs, events or alerts differ after pg_upgrade:
  15: $before
  17: $after"
[ "$(sql $port_new "SELECT current_setting('server_version_num')::int / 10000 || ' ' || extversion FROM pg_extension WHERE extname = 'pg_tide'")" = "17 $version" ] \
    || fail "pg_tide $version is not the extension of the 17 cluster"
as_pg "$new/pg_ctl" -D "$dir/new" stop -m fast -w >/dev/null

say "the workers go on, on 17"
as_pg "$new/pg_ctl" -D "$dir/new" -l "$dir/new.log" start -w >/dev/null
sql $port_new "SELECT tide.emit('up', '{\"k\": \"after\"}')" >/dev/null
wait_until $port_new "SELECT EXISTS (SELECT 1 FROM up_tick WHERE server >= 170000)
                        AND EXISTS (SELECT 1 FROM up_event WHERE k = 'after' AND server >= 170000)" \
    "the every-second task and the event on 17"
open=$(sql $port_new "SELECT count(*) FROM tide.alert WHERE resolved_at IS NULL")
[ "$open" -ge 1 ] || fail "the open alert of 15 is not open on 17"
echo "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out ($runs_before runs, $open open alert(s) kept from 15 to 17; the workers went on)"

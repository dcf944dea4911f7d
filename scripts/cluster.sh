# Shared by scripts/demo.sh and bench/bench.sh (sourced, not run): install the release build and
# start a fresh cluster with pg_tide preloaded and its workers in database $DB.
BIN=/usr/lib/postgresql/15/bin

as_pg() { sudo -u postgres "$@"; }

# install_release: builds pg_tide in release mode and installs it into PostgreSQL 15.
install_release() {
    echo "==> building and installing pg_tide (release)"
    bash scripts/install.sh --release >/dev/null
}

# start_cluster DATA PORT DB [extra postgresql.conf lines]: replaces any cluster in DATA.
start_cluster() {
    local data=$1 port=$2 db=$3 extra=${4:-}
    if [ -f "$data/PG_VERSION" ]; then
        as_pg "$BIN/pg_ctl" -D "$data" stop -m fast -w >/dev/null 2>&1 || true
        rm -rf "$data"
    fi
    echo "==> starting PostgreSQL 15 on port $port with shared_preload_libraries = 'pg_tide'"
    mkdir -p "$(dirname "$data")"
    as_pg "$BIN/initdb" --auth=trust --username=postgres --encoding=UTF8 -D "$data" >/dev/null
    cat >> "$data/postgresql.conf" <<CONF
# pg_tide
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '/tmp'
shared_preload_libraries = 'pg_tide'
pg_tide.database = '$db'
$extra
CONF
    as_pg "$BIN/pg_ctl" -D "$data" -l "$data/server.log" start -w -t 60 >/dev/null
}

//! A real PostgreSQL 15 cluster for out-of-process tests: initdb'd as the `postgres` user,
//! `shared_preload_libraries = 'pg_tide'`, reached over TCP on loopback with a Rust client.
//!
//! The extension must already be installed into the server (`cargo pgrx install`); the
//! Makefile's `test` target does that before running these tests.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub use libtest_mimic::Failed;
pub use postgres::{Client, NoTls};

/// A test: gets the shared cluster.
pub type TestFn = fn(&Cluster) -> Result<(), Failed>;

pub fn db_err(e: postgres::Error) -> Failed {
    describe(&e).into()
}

/// The single value of a one-row query.
pub fn one<T: for<'a> postgres::types::FromSql<'a>>(
    c: &mut Client,
    sql: &str,
) -> Result<T, Failed> {
    c.query_one(sql, &[])
        .map_err(|e| format!("{sql}: {}", describe(&e)).into())
        .map(|row| row.get(0))
}

/// Runs one or more statements (no result).
pub fn exec(c: &mut Client, sql: &str) -> Result<(), Failed> {
    c.batch_execute(sql).map_err(db_err)
}

/// One scheduler tick as of `at` (SQL: `now()`, or a timestamptz expression).
pub fn tick(c: &mut Client, at: &str) -> Result<(), Failed> {
    exec(c, &format!("SELECT tide.tick({at})"))
}

/// Claims up to `n` runs of `queue` as worker 'w', with any further named arguments in `extra`
/// (", lease => ..."): (run_id, lease_token), oldest first.
pub fn claim(c: &mut Client, queue: &str, n: i32, extra: &str) -> Result<Vec<(i64, i64)>, Failed> {
    Ok(c
        .query(
            &format!(
                "SELECT run_id, lease_token FROM tide.claim_runs(queue => '{}', worker => 'w', n => {n}{extra})
                  ORDER BY run_id",
                queue.replace('\'', "''")
            ),
            &[],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// Completes each claimed run with its lease token.
pub fn complete(c: &mut Client, runs: &[(i64, i64)]) -> Result<(), Failed> {
    for (run, token) in runs {
        exec(c, &format!("SELECT tide.complete_run({run}, {token})"))?;
    }
    Ok(())
}

/// The SQLSTATE, message and hint of a statement that must fail.
pub fn refused(c: &mut Client, sql: &str) -> Result<(String, String, String), Failed> {
    match c.batch_execute(sql) {
        Ok(()) => Err(format!("expected an error from: {sql}").into()),
        Err(e) => {
            let db = e
                .as_db_error()
                .ok_or_else(|| format!("not a database error: {e}"))?;
            Ok((
                db.code().code().to_string(),
                db.message().to_string(),
                db.hint().unwrap_or_default().to_string(),
            ))
        }
    }
}

/// Every notification `listener` received on `channel`, in order, up to a sentinel that `sender`
/// sends now: notifications arrive in commit order, so those of every transaction committed
/// before this call are in by then (10 s at most for the sentinel to arrive).
pub fn notifications_until_sentinel(
    listener: &mut Client,
    sender: &mut Client,
    channel: &str,
) -> Result<Vec<String>, Failed> {
    use postgres::fallible_iterator::FallibleIterator;
    sender
        .batch_execute(&format!("NOTIFY {channel}, 'sentinel'"))
        .map_err(|e| describe(&e))?;
    let mut out = Vec::new();
    let mut notes = listener.notifications();
    let mut it = notes.timeout_iter(Duration::from_secs(10));
    loop {
        let note = it
            .next()
            .map_err(|e| describe(&e))?
            .ok_or("the sentinel NOTIFY did not arrive within 10 s")?;
        if note.channel() == channel && note.payload() == "sentinel" {
            return Ok(out);
        }
        if note.channel() == channel {
            out.push(note.payload().to_string());
        }
    }
}

/// Starts one cluster (tagged `name`), runs `tests` against it one at a time, stops it and
/// exits with libtest's status.
pub fn run_tests(name: &str, tests: &[(&'static str, TestFn)]) -> ! {
    run_tests_with(name, "", tests)
}

/// As `run_tests`, with more lines for the cluster's postgresql.conf.
pub fn run_tests_with(name: &str, conf: &str, tests: &[(&'static str, TestFn)]) -> ! {
    let args = libtest_mimic::Arguments::from_args();
    let cluster = match Cluster::start_with(name, conf) {
        Ok(c) => std::sync::Arc::new(c),
        Err(e) => {
            eprintln!("could not start a PostgreSQL cluster with pg_tide preloaded:\n{e}");
            eprintln!("(is the extension installed? `make test` runs `cargo pgrx install` first)");
            std::process::exit(1);
        }
    };
    let trials = tests
        .iter()
        .map(|&(test, f)| {
            let cluster = std::sync::Arc::clone(&cluster);
            libtest_mimic::Trial::test(test, move || f(&cluster))
        })
        .collect();
    // Tests share one server (some restart it or kill its processes): one at a time.
    let args = libtest_mimic::Arguments {
        test_threads: Some(1),
        ..args
    };
    let conclusion = libtest_mimic::run(&args, trials);
    drop(cluster);
    conclusion.exit()
}

/// Where Debian's PostgreSQL 15 binaries live; `PG_TIDE_PG_BIN` overrides.
pub fn pg_bin() -> PathBuf {
    std::env::var_os("PG_TIDE_PG_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A command run as the `postgres` OS user (initdb refuses root).
fn as_postgres(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("sudo");
        c.arg("-u").arg("postgres");
        // sudo resets the environment: a tier that sets RUST_BACKTRACE (the fairness tier,
        // checking that no backtrace reaches a client) hands it to the server.
        if let Ok(v) = std::env::var("RUST_BACKTRACE") {
            c.arg("env").arg(format!("RUST_BACKTRACE={v}"));
        }
        c.arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn check(what: &str, out: std::io::Result<Output>) -> Result<Output, String> {
    let out = out.map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A client error with the server's SQLSTATE, message and hint (`postgres::Error`'s own
/// Display says only "db error").
pub fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!(
            "{}: {} (hint: {:?})",
            db.code().code(),
            db.message(),
            db.hint()
        ),
        None => {
            // A connection error says why only in its source (refused, timed out, ...).
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                text += &format!(": {cause}");
                source = cause.source();
            }
            text
        }
    }
}

/// The uid and gid of the `postgres` OS user, for a server or tool the tests start as it
/// (Patroni, pgbouncer).
pub fn postgres_ids() -> Result<(u32, u32), String> {
    let id = |flag: &str| -> Result<u32, String> {
        let out = Command::new("id")
            .args([flag, "postgres"])
            .output()
            .map_err(|e| e.to_string())?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|e| format!("id {flag} postgres: {e}"))
    };
    Ok((id("-u")?, id("-g")?))
}

/// A TCP port on 127.0.0.1 that was free a moment ago, below the kernel's ephemeral range: a port
/// from that range can be given to an outgoing connection (a client, a replication stream)
/// between this check and the server binding it. Never the same port twice in one process.
pub fn free_port() -> Result<u16, String> {
    use std::sync::Mutex;
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u32, ephemeral_low.clamp(10_001, 65_535));
    let mut given = GIVEN.lock().map_err(|e| e.to_string())?;
    // A small generator seeded by the clock and the process: tests in several processes start
    // at different ports.
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        ^ (u64::from(std::process::id()) << 32)
        ^ (given.len() as u64);
    for _ in 0..10_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = (low + (x % u64::from(high - low)) as u32) as u16;
        if given.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return Ok(port);
        }
    }
    Err(format!(
        "no free port between {low} and {high} on 127.0.0.1"
    ))
}

/// The database pg_tide's background workers run in, in test clusters. Tests that need the
/// real workers use it (and unique task names); the others use their own databases, where only
/// their own `tide.tick` calls move time.
pub const WORKERS_DB: &str = "tide_workers";

/// A running cluster. Dropping it stops the server and removes its data directory.
pub struct Cluster {
    pub data_dir: PathBuf,
    pub port: u16,
}

impl Cluster {
    /// initdb + start, with pg_tide preloaded. `name` tags the data directory.
    pub fn start(name: &str) -> Result<Cluster, String> {
        Self::start_with(name, "")
    }

    /// As `start`, with more lines for postgresql.conf (later lines win).
    pub fn start_with(name: &str, extra: &str) -> Result<Cluster, String> {
        let data_dir = PathBuf::from(format!(
            "/tmp/pg_tide-pg_test-{name}-{}",
            std::process::id()
        ));
        if data_dir.exists() {
            let _ = as_postgres(&pg_bin().join("pg_ctl"))
                .arg("-D")
                .arg(&data_dir)
                .args(["stop", "-m", "immediate"])
                .output();
            std::fs::remove_dir_all(&data_dir).map_err(|e| e.to_string())?;
        }
        check(
            "initdb",
            as_postgres(&pg_bin().join("initdb"))
                .args([
                    "--auth=trust",
                    "--username=postgres",
                    "--encoding=UTF8",
                    "--no-sync",
                ])
                .arg("-D")
                .arg(&data_dir)
                .output(),
        )?;
        let port = free_port()?;
        let conf = format!(
            "\n# pg_tide pg_test\nport = {port}\nlisten_addresses = '127.0.0.1'\n\
             unix_socket_directories = '/tmp'\nshared_preload_libraries = 'pg_tide'\n\
             fsync = off\nlog_min_messages = warning\n\
             pg_tide.database = '{WORKERS_DB}'\npg_tide.tick_interval = 200\npg_tide.executors = 2\n\
             pg_tide.allow_unscheduled = on\n{extra}\n"
        );
        append(&data_dir.join("postgresql.conf"), &conf)?;
        let cluster = Cluster { data_dir, port };
        cluster.pg_ctl(&["start", "-w", "-t", "60"])?;
        Ok(cluster)
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<Output, String> {
        let log = self.data_dir.join("server.log");
        check(
            &format!("pg_ctl {}", args.join(" ")),
            as_postgres(&pg_bin().join("pg_ctl"))
                .arg("-D")
                .arg(&self.data_dir)
                .arg("-l")
                .arg(&log)
                .args(args)
                .output(),
        )
    }

    /// Restarts the server and waits until it accepts connections.
    pub fn restart(&self) -> Result<(), String> {
        self.pg_ctl(&["restart", "-w", "-t", "60", "-m", "fast"])?;
        self.wait_ready(Duration::from_secs(60))
    }

    /// Stops the server, keeps it down for `down` (the time a test needs to pass while nothing
    /// runs: fires missed, say), starts it again and waits until it accepts connections.
    pub fn stop_for(&self, down: Duration) -> Result<(), String> {
        self.pg_ctl(&["stop", "-w", "-t", "60", "-m", "fast"])?;
        std::thread::sleep(down);
        self.pg_ctl(&["start", "-w", "-t", "60"])?;
        self.wait_ready(Duration::from_secs(60))
    }

    /// Polls until a connection succeeds or the deadline passes.
    pub fn wait_ready(&self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            match self.connect("postgres") {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("server not ready after {within:?}: {e}"))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    pub fn conn_string(&self, db: &str, user: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} dbname={db} connect_timeout=10",
            self.port
        )
    }

    pub fn connect(&self, db: &str) -> Result<Client, String> {
        self.connect_as(db, "postgres")
    }

    pub fn connect_as(&self, db: &str, user: &str) -> Result<Client, String> {
        Client::connect(&self.conn_string(db, user), NoTls)
            .map_err(|e| format!("connect {db} as {user}: {}", describe(&e)))
    }

    /// A fresh database with pg_tide created in it, so tests do not see each other's tasks.
    pub fn fresh_db(&self, db: &str) -> Result<Client, String> {
        let mut admin = self.connect("postgres")?;
        // One statement per call: DROP/CREATE DATABASE refuse a multi-statement transaction.
        for sql in [
            format!("DROP DATABASE IF EXISTS {db}"),
            format!("CREATE DATABASE {db}"),
        ] {
            admin.batch_execute(&sql).map_err(|e| describe(&e))?;
        }
        self.with_extension(db)
    }

    /// A connection to `db`, with pg_tide created there if it is not yet.
    fn with_extension(&self, db: &str) -> Result<Client, String> {
        let mut client = self.connect(db)?;
        client
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_tide")
            .map_err(|e| format!("CREATE EXTENSION pg_tide: {}", describe(&e)))?;
        Ok(client)
    }

    /// The pids of the backends of a type (`pg_stat_activity.backend_type`).
    pub fn pids(&self, backend_type: &str) -> Result<Vec<i32>, String> {
        let mut admin = self.connect("postgres")?;
        let rows = admin
            .query(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = $1",
                &[&backend_type],
            )
            .map_err(|e| describe(&e))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// A streaming-replication standby of this cluster (pg_basebackup -R), started on its own
    /// port with the same settings, pg_tide preloaded included.
    pub fn standby(&self, name: &str) -> Result<Cluster, String> {
        let data_dir = PathBuf::from(format!(
            "/tmp/pg_tide-pg_test-{name}-{}",
            std::process::id()
        ));
        if data_dir.exists() {
            std::fs::remove_dir_all(&data_dir).map_err(|e| e.to_string())?;
        }
        let port = self.port.to_string();
        check(
            "pg_basebackup",
            as_postgres(&pg_bin().join("pg_basebackup"))
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port,
                    "-U",
                    "postgres",
                    "-R",
                    "-X",
                    "stream",
                    "-c",
                    "fast",
                ])
                .arg("-D")
                .arg(&data_dir)
                .output(),
        )?;
        let standby_port = free_port()?;
        append(
            &data_dir.join("postgresql.conf"),
            &format!("\n# standby\nport = {standby_port}\n"),
        )?;
        let standby = Cluster {
            data_dir,
            port: standby_port,
        };
        standby.pg_ctl(&["start", "-w", "-t", "60"])?;
        Ok(standby)
    }

    /// The workers' database, created with pg_tide on first use and kept.
    pub fn workers_db(&self) -> Result<Client, String> {
        let mut admin = self.connect("postgres")?;
        let exists = admin
            .query_opt(
                "SELECT 1 FROM pg_database WHERE datname = $1",
                &[&WORKERS_DB],
            )
            .map_err(|e| describe(&e))?
            .is_some();
        if !exists {
            admin
                .batch_execute(&format!("CREATE DATABASE {WORKERS_DB}"))
                .map_err(|e| describe(&e))?;
        }
        self.with_extension(WORKERS_DB)
    }

    /// Kills every backend of a type with SIGKILL (the postmaster then restarts all sessions)
    /// and waits until the server accepts connections again. Returns how many were killed.
    pub fn kill_9(&self, backend_type: &str) -> Result<usize, String> {
        let pids = self.pids(backend_type)?;
        // The first kill sends the postmaster into crash recovery, which ends the others: only
        // the first must succeed.
        let mut killed = 0;
        for pid in &pids {
            let out = Command::new("kill").arg("-9").arg(pid.to_string()).output();
            if out.as_ref().is_ok_and(|o| o.status.success()) {
                killed += 1;
            } else if killed == 0 {
                check("kill -9", out)?;
            }
        }
        // Recovery is over when the workers of that type are back with new pids.
        wait_for(
            &format!("{backend_type} to come back after kill -9"),
            Duration::from_secs(60),
            || {
                let Ok(back) = self.pids(backend_type) else {
                    return Ok(None);
                };
                Ok((!back.is_empty() && back.iter().all(|p| !pids.contains(p))).then_some(()))
            },
        )?;
        Ok(killed)
    }

    /// Runs one statement with psql in a database; returns its stdout and stderr (notices,
    /// warnings, errors), whatever its exit status.
    pub fn psql(&self, db: &str, sql: &str) -> Result<(String, String), String> {
        let out = Command::new(pg_bin().join("psql"))
            .args([
                "-X",
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-d", db, "-c", sql])
            .output()
            .map_err(|e| format!("psql: {e}"))?;
        Ok((
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }

    /// Runs a server binary (pg_dump, psql, ...) against this cluster; returns its stdout.
    pub fn tool(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let port = self.port.to_string();
        let out = check(
            program,
            Command::new(pg_bin().join(program))
                .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres"])
                .args(args)
                .output(),
        )?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// The state of a run, as text (for `wait_for` probes).
pub fn run_state(c: &mut Client, run: i64) -> Result<String, String> {
    c.query_one(
        &format!("SELECT state::text FROM tide.run WHERE run_id = {run}"),
        &[],
    )
    .map(|r| r.get(0))
    .map_err(|e| describe(&e))
}

/// The blocks of `table` and its indexes that `sql` reads, counted by the statistics of one
/// transaction (rolled back): a count of pages touched, not a time.
pub fn blocks_read(c: &mut Client, table: &str, sql: &str) -> Result<i64, Failed> {
    let count = format!(
        "SELECT (pg_stat_get_xact_blocks_fetched('{table}'::regclass)
                 + (SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(i.indexrelid)), 0)
                      FROM pg_index i WHERE i.indrelid = '{table}'::regclass))::bigint"
    );
    let mut tx = c.transaction().map_err(db_err)?;
    let before: i64 = tx.query_one(&count, &[]).map_err(db_err)?.get(0);
    tx.batch_execute(sql).map_err(db_err)?;
    let after: i64 = tx.query_one(&count, &[]).map_err(db_err)?.get(0);
    tx.rollback().map_err(db_err)?;
    Ok(after - before)
}

/// Polls `probe` until it returns `Some`, or fails after `within`.
pub fn wait_for<T>(
    what: &str,
    within: Duration,
    mut probe: impl FnMut() -> Result<Option<T>, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + within;
    loop {
        let last = match probe() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => "not yet".to_string(),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "timed out after {within:?} waiting for {what} ({last})"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn append(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(text.as_bytes()).map_err(|e| e.to_string())
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["stop", "-m", "fast", "-w"]);
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}
pub mod example_workers;
pub mod sinks;

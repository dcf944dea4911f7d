//! A real PostgreSQL 15 cluster for out-of-process tests: initdb'd as the `postgres` user,
//! `shared_preload_libraries = 'pg_tide'`, reached over TCP on loopback with a Rust client.
//!
//! The extension must already be installed into the server (`cargo pgrx install`); the
//! Makefile's `test` target does that before running these tests.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub use postgres::{Client, NoTls};

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
        c.arg("-u").arg("postgres").arg(program);
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
        None => e.to_string(),
    }
}

fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// A running cluster. Dropping it stops the server and removes its data directory.
pub struct Cluster {
    pub data_dir: PathBuf,
    pub port: u16,
}

impl Cluster {
    /// initdb + start, with pg_tide preloaded. `name` tags the data directory.
    pub fn start(name: &str) -> Result<Cluster, String> {
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
             fsync = off\nlog_min_messages = warning\n"
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
        let mut client = self.connect(db)?;
        client
            .batch_execute("CREATE EXTENSION pg_tide")
            .map_err(|e| format!("CREATE EXTENSION pg_tide: {}", describe(&e)))?;
        Ok(client)
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

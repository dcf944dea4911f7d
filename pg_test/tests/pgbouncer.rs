//! External workers behind pgbouncer (Debian's, 1.18) in transaction pooling mode, with fewer
//! server connections than clients (docs/operations.md, "Behind a connection pooler"). The
//! Python and Node example workers claim, heartbeat, complete and fail runs through it (the
//! examples tier's scenario, pg_test/src/example_workers.rs): Python LISTENs on a direct
//! connection for its wake-ups, Node only polls. Fencing holds through the pooler: a worker
//! whose lease was taken over cannot complete, and its effect rolls back with the refusal.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use pg_tide_pg_test::example_workers::worker_runs_every_kind;
use pg_tide_pg_test::{
    free_port, postgres_ids, run_tests, wait_for, Client, Cluster, Failed, NoTls, TestFn,
    WORKERS_DB,
};
use postgres::SimpleQueryMessage;

fn main() {
    let tests: &[(&str, TestFn)] = &[
        ("python_worker_through_pgbouncer", |c| {
            through_pgbouncer(c, "python", true)
        }),
        ("node_worker_through_pgbouncer", |c| {
            through_pgbouncer(c, "node", false)
        }),
        ("fencing_through_pgbouncer", fencing_through_pgbouncer),
    ];
    run_tests("pgbouncer", tests)
}

/// pgbouncer in front of the cluster's WORKERS_DB, pool_mode = transaction, two server
/// connections at most. Dropping it stops it.
struct Bouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Bouncer {
    fn start(cluster: &Cluster) -> Result<Bouncer, Failed> {
        let port = free_port()?;
        let dir = PathBuf::from(format!(
            "/tmp/pg_tide-pgbouncer-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir)?;
        let (uid, gid) = postgres_ids()?;
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))?;
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n")?;
        std::fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]
{WORKERS_DB} = host=127.0.0.1 port={server} dbname={WORKERS_DB}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {dir}/users.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = 2
max_client_conn = 50
logfile = {dir}/pgbouncer.log
",
                server = cluster.port,
                dir = dir.display()
            ),
        )?;
        // pgbouncer refuses to run as root.
        let child = Command::new("pgbouncer")
            .arg(dir.join("pgbouncer.ini"))
            .uid(uid)
            .gid(gid)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("pgbouncer (Debian's pgbouncer): {e}"))?;
        let b = Bouncer { child, dir, port };
        wait_for("pgbouncer to listen", Duration::from_secs(30), || {
            Ok(std::net::TcpStream::connect(("127.0.0.1", port))
                .is_ok()
                .then_some(()))
        })?;
        Ok(b)
    }

    fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{WORKERS_DB}?sslmode=disable",
            self.port
        )
    }

    /// A client through the pooler. rust-postgres prepares named statements for `query`: only
    /// the simple protocol (`simple_query`, `batch_execute`) is used on it.
    fn connect(&self) -> Result<Client, Failed> {
        Ok(Client::connect(
            &format!(
                "host=127.0.0.1 port={} user=postgres dbname={WORKERS_DB}",
                self.port
            ),
            NoTls,
        )?)
    }

    /// Transactions pgbouncer passed to WORKERS_DB so far (SHOW STATS on its admin console).
    fn transactions(&self) -> Result<i64, Failed> {
        let mut admin = Client::connect(
            &format!(
                "host=127.0.0.1 port={} user=postgres dbname=pgbouncer",
                self.port
            ),
            NoTls,
        )?;
        let rows = admin.simple_query("SHOW STATS")?;
        for m in rows {
            if let SimpleQueryMessage::Row(r) = m {
                if r.get("database") == Some(WORKERS_DB) {
                    return Ok(r.get("total_xact_count").unwrap_or("0").parse()?);
                }
            }
        }
        // Listed once a client has used it.
        Ok(0)
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The examples' scenario for `lang` with DATABASE_URL through pgbouncer; wake-ups LISTENed
/// for on a direct connection (`listen_direct`) or none (polling).
fn through_pgbouncer(cluster: &Cluster, lang: &str, listen_direct: bool) -> Result<(), Failed> {
    let bouncer = Bouncer::start(cluster)?;
    let direct = format!(
        "postgres://postgres@127.0.0.1:{}/{WORKERS_DB}?sslmode=disable",
        cluster.port
    );
    let listen = if listen_direct {
        direct.as_str()
    } else {
        "none"
    };
    let before = bouncer.transactions()?;
    // Two more clients keep the pool's two server connections busy in turn, so that the
    // worker's transactions land on either (as in production, where many clients share them).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let noise: Vec<_> = (0..2)
        .map(|_| {
            let (stop, mut c) = (stop.clone(), bouncer.connect());
            std::thread::spawn(move || {
                if let Ok(c) = c.as_mut() {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = c.simple_query("SELECT pg_sleep(0.005)");
                        std::thread::sleep(std::time::Duration::from_millis(25));
                    }
                }
            })
        })
        .collect();
    let outcome = worker_runs_every_kind(cluster, lang, &bouncer.url(), &[("LISTEN_URL", listen)]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in noise {
        let _ = t.join();
    }
    outcome?;
    // Its claims, heartbeats, completions and failures went through the pooler: at least one
    // transaction per run it finished (23), and a claim.
    let through = bouncer.transactions()? - before;
    assert!(through > 23, "{through} transactions through pgbouncer");
    Ok(())
}

fn first_row(c: &mut Client, sql: &str) -> Result<Vec<String>, Failed> {
    for m in c.simple_query(sql)? {
        if let SimpleQueryMessage::Row(r) = m {
            return Ok((0..r.len())
                .map(|i| r.get(i).unwrap_or("").to_string())
                .collect());
        }
    }
    Err(format!("no row from {sql}").into())
}

/// Two workers through the pooler: the first's lease expires and the second takes the run;
/// the first's completion is refused, and the effect it wrote in the same transaction rolls
/// back with it; the second completes.
fn fencing_through_pgbouncer(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.workers_db()?;
    admin.batch_execute(
        "CREATE TABLE fence_effect (run_id bigint, worker text);
         SELECT tide.schedule('fenced', NULL, topics => '{fenced}', queue => 'fenced');
         SELECT tide.emit('fenced', '{}');",
    )?;
    let bouncer = Bouncer::start(cluster)?;
    let mut w1 = bouncer.connect()?;
    let mut w2 = bouncer.connect()?;
    let first = first_row(
        &mut w1,
        "SELECT run_id, lease_token FROM tide.claim_runs('fenced', 'w1', lease => interval '1 second')",
    )?;
    let (run, stale) = (first[0].clone(), first[1].clone());
    let second = wait_for(
        "the lease to expire and w2 to take the run",
        Duration::from_secs(30),
        || {
            let rows = w2
                .simple_query("SELECT run_id, lease_token FROM tide.claim_runs('fenced', 'w2')")
                .map_err(|e| e.to_string())?;
            Ok(rows.into_iter().find_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some((r.get(0)?.to_string(), r.get(1)?.to_string())),
                _ => None,
            }))
        },
    )?;
    assert_eq!(second.0, run, "w2 took the same run");
    assert_ne!(second.1, stale, "with a new lease token");
    // w1 still believes it holds the run: its effect and completion, in one transaction.
    let refused = w1.batch_execute(&format!(
        "BEGIN;
         INSERT INTO fence_effect VALUES ({run}, 'w1');
         SELECT tide.complete_run({run}, {stale});
         COMMIT;"
    ));
    let err = refused.expect_err("a stale lease token completes nothing");
    let code = err.code().map(|c| c.code().to_string()).unwrap_or_default();
    w1.batch_execute("ROLLBACK")?;
    w2.batch_execute(&format!(
        "BEGIN;
         INSERT INTO fence_effect VALUES ({run}, 'w2');
         SELECT tide.complete_run({run}, {});
         COMMIT;",
        second.1
    ))?;
    let outcome = first_row(
        &mut admin,
        &format!(
            "SELECT (SELECT state FROM tide.run WHERE run_id = {run}),
                    (SELECT string_agg(worker, ',') FROM fence_effect WHERE run_id = {run})"
        ),
    )?;
    assert_eq!(
        (code.as_str(), outcome[0].as_str(), outcome[1].as_str()),
        ("55000", "succeeded", "w2"),
        "{err}"
    );
    Ok(())
}

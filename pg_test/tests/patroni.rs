//! High availability under Patroni (docs/patroni.md): etcd and two PostgreSQL nodes under
//! Debian's Patroni on 127.0.0.1, pg_tide preloaded on both. Under load (SQL tasks every two
//! seconds, one catching up missed windows and one skipping them; event tasks; four external
//! workers on a multi-host URL with target_session_attrs=read-write) the leader's Patroni and
//! postmaster are killed with kill -9; Patroni promotes the replica; the old leader rejoins as
//! a replica; then `patronictl switchover` moves the leader back. Checked throughout and after:
//! no pg_tide worker runs on a node while it is in recovery; no window runs twice and none is
//! lost (caught up, or skipped as the misfire policy says); no job's or event's effect is
//! doubled; the external workers resume on the new leader. Run once with asynchronous
//! replication (a run committed in the leader's last moment may be lost and its window run
//! again: counted and printed) and once with Patroni's `synchronous_mode` (nothing acknowledged
//! is lost: asserted).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pg_tide_pg_test::{describe, free_port, one, pg_bin, postgres_ids, wait_for, Failed};
use postgres::{Client, NoTls};

const DB: &str = "tide_ha";

/// The status code of GET `path` on Patroni's REST API (None: not answering).
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().ok()?,
        Duration::from_secs(2),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    // The whole response (Patroni logs a reset connection as an error).
    let mut response = Vec::new();
    s.read_to_end(&mut response).ok()?;
    String::from_utf8_lossy(&response)
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

struct Node {
    name: &'static str,
    pg_port: u16,
    api_port: u16,
    config: PathBuf,
    data: PathBuf,
    patroni: Option<Child>,
}

/// etcd and two Patroni nodes. Dropping it stops them all and removes their files.
struct Ha {
    dir: PathBuf,
    etcd: Child,
    nodes: Vec<Node>,
    ids: (u32, u32),
}

impl Ha {
    fn start(tag: &str, synchronous: bool) -> Result<Ha, String> {
        let dir = PathBuf::from(format!("/tmp/pg_tide-patroni-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let ids = postgres_ids()?;
        std::os::unix::fs::chown(&dir, Some(ids.0), Some(ids.1)).map_err(|e| e.to_string())?;
        let (client, peer) = (free_port()?, free_port()?);
        let etcd = Command::new("etcd")
            .args(["--name", "e1", "--data-dir"])
            .arg(dir.join("etcd"))
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-cluster",
                &format!("e1=http://127.0.0.1:{peer}"),
            ])
            .stdout(log_file(&dir, "etcd.log")?)
            .stderr(log_file(&dir, "etcd.log")?)
            .spawn()
            .map_err(|e| format!("etcd (Debian's etcd-server): {e}"))?;
        let mut ha = Ha {
            dir: dir.clone(),
            etcd,
            nodes: Vec::new(),
            ids,
        };
        for name in ["n1", "n2"] {
            let (pg_port, api_port) = (free_port()?, free_port()?);
            let config = dir.join(format!("{name}.yml"));
            let data = dir.join(name);
            std::fs::write(
                &config,
                patroni_config(name, &dir, &data, pg_port, api_port, client, synchronous),
            )
            .map_err(|e| e.to_string())?;
            ha.nodes.push(Node {
                name,
                pg_port,
                api_port,
                config,
                data,
                patroni: None,
            });
        }
        // The first node bootstraps and leads; pg_tide's database and extension are made there;
        // then the second joins as its replica.
        ha.start_patroni(0)?;
        ha.wait_role(0, "leader", Duration::from_secs(90))?;
        let mut c = ha.connect(0, "postgres")?;
        c.batch_execute(&format!("CREATE DATABASE {DB}"))
            .map_err(|e| describe(&e))?;
        let mut c = ha.connect(0, DB)?;
        c.batch_execute("CREATE EXTENSION pg_tide")
            .map_err(|e| describe(&e))?;
        ha.start_patroni(1)?;
        ha.wait_standby(1, synchronous)?;
        Ok(ha)
    }

    fn start_patroni(&mut self, i: usize) -> Result<(), String> {
        let (uid, gid) = self.ids;
        let node = &mut self.nodes[i];
        let log = log_file(&self.dir, &format!("{}.log", node.name))?;
        let child = Command::new("patroni")
            .arg(&node.config)
            .uid(uid)
            .gid(gid)
            .env("HOME", &self.dir)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("patroni (Debian's patroni): {e}"))?;
        node.patroni = Some(child);
        Ok(())
    }

    /// Waits until node `i` answers Patroni's `/leader` or `/replica` health check with 200.
    fn wait_role(&self, i: usize, role: &str, within: Duration) -> Result<(), String> {
        let port = self.nodes[i].api_port;
        wait_for(
            &format!("{} to be {role}", self.nodes[i].name),
            within,
            || Ok((http_status(port, &format!("/{role}")) == Some(200)).then_some(())),
        )
        .map_err(|e| format!("{e}\n{}", self.logs()))
    }

    /// Waits until node `i` is a replica that can take over: streaming, and with
    /// `synchronous_mode` the synchronous standby (Patroni promotes no other, and switches over
    /// to no other).
    fn wait_standby(&self, i: usize, synchronous: bool) -> Result<(), String> {
        let role = if synchronous { "sync" } else { "replica" };
        self.wait_role(i, role, Duration::from_secs(90))
    }

    /// Waits until node `to` has replayed the WAL node `from` had written when asked: the
    /// replica streams and is caught up (Patroni promotes a replica up to
    /// `maximum_lag_on_failover` behind, however long it has not streamed).
    fn wait_replayed(&self, from: usize, to: usize) -> Result<(), String> {
        let lsn: String = wait_for(
            &format!("the WAL position of {}", self.nodes[from].name),
            Duration::from_secs(30),
            || {
                self.connect(from, DB)?
                    .query_one("SELECT pg_current_wal_lsn()::text", &[])
                    .map(|r| Some(r.get(0)))
                    .map_err(|e| describe(&e))
            },
        )
        .map_err(|e| format!("{e}\n{}", self.logs()))?;
        wait_for(
            &format!(
                "{} to replay the WAL of {} up to {lsn}",
                self.nodes[to].name, self.nodes[from].name
            ),
            Duration::from_secs(60),
            || {
                let (done, at): (bool, Option<String>) = self
                    .connect(to, DB)?
                    .query_one(
                        "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false),
                                pg_last_wal_replay_lsn()::text",
                        &[&lsn],
                    )
                    .map(|r| (r.get(0), r.get(1)))
                    .map_err(|e| describe(&e))?;
                if done {
                    Ok(Some(()))
                } else {
                    Err(format!("replayed up to {at:?}"))
                }
            },
        )
        .map_err(|e| format!("{e}\n{}", self.logs()))
    }

    fn leader(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|&i| http_status(self.nodes[i].api_port, "/leader") == Some(200))
    }

    fn connect(&self, i: usize, db: &str) -> Result<Client, String> {
        Client::connect(
            &format!(
                "host=127.0.0.1 port={} user=postgres dbname={db} connect_timeout=5",
                self.nodes[i].pg_port
            ),
            NoTls,
        )
        .map_err(|e| describe(&e))
    }

    /// The URL an application uses: both nodes, the one that takes writes.
    fn multi_host_url(&self) -> String {
        format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname={DB} \
             target_session_attrs=read-write connect_timeout=2",
            self.nodes[0].pg_port, self.nodes[1].pg_port
        )
    }

    /// kill -9 of node `i`'s Patroni and postmaster, as a lost server.
    fn kill_node(&mut self, i: usize) -> Result<(), String> {
        let node = &mut self.nodes[i];
        let postmaster = std::fs::read_to_string(node.data.join("postmaster.pid"))
            .map_err(|e| e.to_string())?
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        if let Some(mut p) = node.patroni.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
        let out = Command::new("kill")
            .args(["-9", &postmaster])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "kill -9 {postmaster}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }

    /// `patronictl switchover`, retried until the leader accepts it. patronictl exits 0 even
    /// when the leader refuses ("Switchover failed, details: 412 ..." or 503 while the candidate
    /// has just rejoined and does not yet report a WAL position within the allowed lag), so
    /// its output decides; an operator would retry the same way.
    fn switchover(&self, from: usize, to: usize) -> Result<(), String> {
        wait_for(
            "patronictl switchover to be accepted",
            Duration::from_secs(90),
            || {
                if self.leader() == Some(to) {
                    return Ok(Some(()));
                }
                let out = Command::new("patronictl")
                    .arg("-c")
                    .arg(&self.nodes[to].config)
                    .args([
                        "switchover",
                        "--leader",
                        self.nodes[from].name,
                        "--candidate",
                        self.nodes[to].name,
                        "--force",
                    ])
                    .env("HOME", &self.dir)
                    .output()
                    .map_err(|e| e.to_string())?;
                let said = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                if out.status.success() && !said.contains("failed") {
                    return Ok(Some(()));
                }
                std::thread::sleep(Duration::from_secs(1));
                Err(format!("patronictl switchover said: {said}"))
            },
        )
        .map_err(|e| format!("{e}\n{}", self.logs()))
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for f in ["n1.log", "n2.log"] {
            let text = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            s += &format!("--- {f}\n");
            for l in tail.iter().rev() {
                s += l;
                s += "\n";
            }
        }
        s
    }
}

impl Drop for Ha {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut p) = node.patroni.take() {
                // SIGTERM: Patroni stops its PostgreSQL, then exits.
                let _ = Command::new("kill").arg(p.id().to_string()).output();
                let deadline = Instant::now() + Duration::from_secs(30);
                while Instant::now() < deadline && matches!(p.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                let _ = p.kill();
                let _ = p.wait();
            }
            if node.data.join("postmaster.pid").exists() {
                let _ = Command::new("sudo")
                    .args(["-u", "postgres"])
                    .arg(pg_bin().join("pg_ctl"))
                    .arg("-D")
                    .arg(&node.data)
                    .args(["stop", "-m", "immediate", "-w"])
                    .output();
            }
        }
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn log_file(dir: &Path, name: &str) -> Result<std::fs::File, String> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .map_err(|e| e.to_string())
}

/// A node's Patroni configuration: short TTL for a quick test (the docs give production
/// values), pg_tide preloaded through the DCS's parameters, pg_rewind to rejoin.
fn patroni_config(
    name: &str,
    dir: &Path,
    data: &Path,
    pg_port: u16,
    api_port: u16,
    etcd_port: u16,
    synchronous: bool,
) -> String {
    format!(
        "scope: pg_tide_ha
name: {name}
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:{api_port}
  connect_address: 127.0.0.1:{api_port}
etcd3:
  hosts: 127.0.0.1:{etcd_port}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 16777216
    synchronous_mode: {synchronous}
    postgresql:
      use_pg_rewind: true
      parameters:
        shared_preload_libraries: pg_tide
        pg_tide.database: {DB}
        pg_tide.tick_interval: 200
        pg_tide.executors: 2
        wal_log_hints: 'on'
        fsync: 'off'
  initdb:
    - encoding: UTF8
  pg_hba:
    - host replication replicator 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
    - local all all trust
postgresql:
  listen: 127.0.0.1:{pg_port}
  connect_address: 127.0.0.1:{pg_port}
  data_dir: {data}
  bin_dir: {bin}
  pgpass: {dir}/{name}.pgpass
  basebackup:
    - checkpoint: fast
  authentication:
    replication: {{username: replicator, password: rep}}
    superuser: {{username: postgres, password: pg}}
    rewind: {{username: postgres, password: pg}}
  parameters:
    unix_socket_directories: {dir}
",
        data = data.display(),
        dir = dir.display(),
        bin = pg_bin().display(),
    )
}

/// What the load saw acknowledged by the server (committed), and when each worker last
/// completed a run.
#[derive(Default)]
struct Seen {
    enqueued: Vec<i64>,
    emitted: Vec<i64>,
    completed: Vec<i64>,
    /// Per worker: the instants of its completions.
    worker_done: Vec<Vec<Instant>>,
    /// Nodes seen running pg_tide workers while in recovery: (node, backend types).
    replica_workers: Vec<(String, String)>,
    /// Errors the load met (connections lost at the failover): counted, not fatal; the last
    /// of each thread (producer, workers) for a failure's message.
    errors: usize,
    last_error: Vec<String>,
}

struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    threads: Vec<JoinHandle<()>>,
}

fn connect_retrying(url: &str, stop: &AtomicBool) -> Option<Client> {
    while !stop.load(Ordering::Relaxed) {
        if let Ok(c) = Client::connect(url, NoTls) {
            return Some(c);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

impl Load {
    fn start(ha: &Ha) -> Result<Load, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen {
            worker_done: vec![Vec::new(); 4],
            last_error: vec![String::new(); 5],
            ..Seen::default()
        }));
        let url = ha.multi_host_url();
        let mut threads = Vec::new();
        // The producer: a job and an event every 100 ms.
        {
            let (stop, seen, url) = (stop.clone(), seen.clone(), url.clone());
            threads.push(std::thread::spawn(move || {
                let mut n: i64 = 0;
                while let Some(mut c) = connect_retrying(&url, &stop) {
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let job = c.query_one(
                            "SELECT r FROM tide.enqueue('ha_job', jsonb_build_object('n', $1::bigint)) r",
                            &[&n],
                        );
                        let event = c.query_one(
                            "SELECT tide.emit('ha_topic', jsonb_build_object('e', $1::bigint))",
                            &[&n],
                        );
                        let mut s = seen.lock().unwrap();
                        match (job, event) {
                            (Ok(_), Ok(_)) => {
                                s.enqueued.push(n);
                                s.emitted.push(n);
                            }
                            (job, event) => {
                                match &job {
                                    Ok(_) => s.enqueued.push(n),
                                    Err(e) => s.last_error[4] = format!("producer: {}", describe(e)),
                                }
                                match &event {
                                    Ok(_) => s.emitted.push(n),
                                    Err(e) => s.last_error[4] = format!("producer: {}", describe(e)),
                                }
                                s.errors += 1;
                                drop(s);
                                if c.is_closed() {
                                    break;
                                }
                                continue;
                            }
                        }
                        drop(s);
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                }
            }));
        }
        // Four external workers: claim, write the effect guarded by the job's key, complete in
        // the same transaction.
        for w in 0..4 {
            let (stop, seen, url) = (stop.clone(), seen.clone(), url.clone());
            threads.push(std::thread::spawn(move || {
                let name = format!("ha-worker-{w}");
                while let Some(mut c) = connect_retrying(&url, &stop) {
                    while !stop.load(Ordering::Relaxed) {
                        let runs = match c.query(
                            "SELECT run_id, lease_token, (args->>'n')::bigint
                               FROM tide.claim_runs('ha_q', $1, n => 5, lease => interval '10 seconds')",
                            &[&name],
                        ) {
                            Ok(r) => r,
                            Err(e) => {
                                let mut s = seen.lock().unwrap();
                                s.errors += 1;
                                s.last_error[w] = format!("claim: {}", describe(&e));
                                break;
                            }
                        };
                        if runs.is_empty() {
                            std::thread::sleep(Duration::from_millis(50));
                            continue;
                        }
                        for r in runs {
                            let (run, token, n): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
                            let done = complete_job(&mut c, run, token, n, &name);
                            let mut s = seen.lock().unwrap();
                            match done {
                                Ok(()) => {
                                    s.completed.push(run);
                                    s.worker_done[w].push(Instant::now());
                                }
                                Err(e) => {
                                    s.errors += 1;
                                    s.last_error[w] = format!("complete: {}", describe(&e));
                                }
                            }
                        }
                        if c.is_closed() {
                            break;
                        }
                    }
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                }
            }));
        }
        // The watch: every 100 ms, each node that answers and is in recovery runs no pg_tide
        // worker.
        for node in &ha.nodes {
            let (stop, seen) = (stop.clone(), seen.clone());
            let (name, port) = (node.name.to_string(), node.pg_port);
            threads.push(std::thread::spawn(move || {
                let url = format!(
                    "host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=2"
                );
                let mut c: Option<Client> = None;
                while !stop.load(Ordering::Relaxed) {
                    if c.as_ref().is_none_or(|c| c.is_closed()) {
                        c = Client::connect(&url, NoTls).ok();
                    }
                    if let Some(cl) = c.as_mut() {
                        // One statement, one snapshot: recovery state and backends together.
                        if let Ok(row) = cl.query_one(
                            "SELECT pg_is_in_recovery(),
                                    (SELECT string_agg(backend_type, ',') FROM pg_stat_activity
                                      WHERE backend_type LIKE 'pg_tide%')",
                            &[],
                        ) {
                            let (recovery, workers): (bool, Option<String>) =
                                (row.get(0), row.get(1));
                            if recovery {
                                if let Some(w) = workers {
                                    seen.lock().unwrap().replica_workers.push((name.clone(), w));
                                }
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }));
        }
        Ok(Load {
            stop,
            seen,
            threads,
        })
    }

    fn finish(self) -> Arc<Mutex<Seen>> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        self.seen
    }
}

fn schema(c: &mut Client) -> Result<(), String> {
    c.batch_execute(
        "CREATE TABLE ha_tick (task text, window_start timestamptz);
         CREATE TABLE ha_event_effect (e bigint);
         CREATE TABLE ha_job_effect (n bigint, worker text);
         SELECT tide.schedule('ha_catch_up', '*/2 * * * * *',
                              'INSERT INTO ha_tick VALUES (''ha_catch_up'', tide.window_start())',
                              misfire => 'catch_up', misfire_threshold => '3 seconds');
         SELECT tide.schedule('ha_skip', '*/2 * * * * *',
                              'INSERT INTO ha_tick VALUES (''ha_skip'', tide.window_start())',
                              misfire => 'skip', misfire_threshold => '3 seconds');
         SELECT tide.schedule('ha_event', NULL,
                              'INSERT INTO ha_event_effect VALUES ((tide.payload()->>''e'')::bigint)',
                              topics => '{ha_topic}');
         SELECT tide.schedule('ha_job', NULL, topics => '{ha_jobs}', queue => 'ha_q');",
    )
    .map_err(|e| describe(&e))
}

/// Waits until node `i` is the leader and takes writes through the multi-host URL.
fn wait_leader(ha: &Ha, i: usize) -> Result<(), String> {
    ha.wait_role(i, "leader", Duration::from_secs(90))?;
    wait_for(
        "the new leader to take writes",
        Duration::from_secs(60),
        || {
            Ok(ha
                .connect(i, DB)
                .and_then(|mut c| {
                    c.query_one("SELECT NOT pg_is_in_recovery()", &[])
                        .map(|r| r.get::<_, bool>(0))
                        .map_err(|e| describe(&e))
                })
                .unwrap_or(false)
                .then_some(()))
        },
    )
}

/// Every worker completes a run after `since`; returns how long the slowest took.
fn workers_resume(seen: &Mutex<Seen>, since: Instant, after: &str) -> Result<Duration, String> {
    wait_for(
        &format!("every external worker to complete a run {after}"),
        Duration::from_secs(60),
        || {
            let s = seen.lock().unwrap();
            let firsts: Vec<Option<Instant>> = s
                .worker_done
                .iter()
                .map(|d| d.iter().copied().find(|t| *t > since))
                .collect();
            if firsts.iter().all(|f| f.is_some()) {
                return Ok(firsts.iter().map(|f| f.unwrap() - since).max());
            }
            Err(format!(
                "not yet: workers done {:?}; jobs enqueued {}; last errors {:?}",
                firsts.iter().map(|f| f.is_some()).collect::<Vec<_>>(),
                s.enqueued.len(),
                s.last_error
            ))
        },
    )
}

fn ha_scenario(synchronous: bool) -> Result<(), Failed> {
    let tag = if synchronous { "sync" } else { "async" };
    let mut ha = Ha::start(tag, synchronous)?;
    schema(&mut ha.connect(0, DB)?)?;
    let load = Load::start(&ha)?;
    // Load on the first leader until every worker has completed runs.
    let started = Instant::now();
    workers_resume(&load.seen, started, "on the first leader")?;
    windows_run(&ha, 0)?;

    // 1. Failover: the leader is lost; Patroni promotes the replica. It streamed until then
    // (with asynchronous replication, what the leader committed in its last moments may be
    // lost, not what it committed long before).
    ha.wait_replayed(0, 1)?;
    let killed_at = Instant::now();
    ha.kill_node(0)?;
    wait_leader(&ha, 1)?;
    let promoted = killed_at.elapsed();
    let resumed = workers_resume(&load.seen, Instant::now(), "after the failover")
        .map_err(|e| format!("{e}\n{}", ha.logs()))?;
    // 2. The old leader comes back and rejoins as a replica (pg_rewind).
    ha.start_patroni(0)?;
    ha.wait_standby(0, synchronous)?;
    windows_run(&ha, 1)?;
    // 3. A switchover back to the first node, once it has caught up.
    ha.wait_replayed(1, 0)?;
    let switch_at = Instant::now();
    ha.switchover(1, 0)?;
    wait_leader(&ha, 0)?;
    ha.wait_standby(1, synchronous)?;
    let switched = switch_at.elapsed();
    let resumed_switch = workers_resume(&load.seen, Instant::now(), "after the switchover")
        .map_err(|e| format!("{e}\n{}", ha.logs()))?;
    windows_run(&ha, 0)?;
    let seen = load.finish();
    let seen = seen.lock().unwrap();

    let leader = ha.leader().ok_or("no leader at the end")?;
    let mut c = ha.connect(leader, DB)?;
    // The rest of the work drains on the final leader: the executors run the events, and a
    // worker here claims what the load's workers (stopped) left in ha_q, including runs whose
    // lease ran out with a worker's connection at a failover and that came back after backoff.
    wait_for(
        "the queue and events to drain",
        Duration::from_secs(90),
        || {
            let runs = c
                .query(
                    "SELECT run_id, lease_token, (args->>'n')::bigint FROM tide.claim_runs('ha_q', 'drain', n => 100)",
                    &[],
                )
                .map_err(|e| describe(&e))?;
            for r in runs {
                complete_job(&mut c, r.get(0), r.get(1), r.get(2), "drain")
                    .map_err(|e| describe(&e))?;
            }
            let open: Option<String> = c
                .query_one(
                    "SELECT string_agg(format('%s %s: %s', name, state, n), ', ')
                       FROM (SELECT t.name, r.state, count(*) AS n
                               FROM tide.run r JOIN tide.task t USING (task_id)
                              WHERE t.name IN ('ha_event', 'ha_job')
                                AND r.state IN ('ready', 'running', 'retry', 'waiting')
                              GROUP BY 1, 2) o",
                    &[],
                )
                .map_err(|e| describe(&e))?
                .get(0);
            match open {
                None => Ok(Some(())),
                Some(open) => Err(format!("open runs: {open}")),
            }
        },
    )?;

    // No pg_tide worker ever ran on a node while it was a replica.
    assert!(
        seen.replica_workers.is_empty(),
        "pg_tide workers on a replica: {:?}",
        &seen.replica_workers[..seen.replica_workers.len().min(5)]
    );
    // No effect doubled: each job, event and window once.
    let doubled: i64 = one(
        &mut c,
        "SELECT (SELECT count(*) - count(DISTINCT n) FROM ha_job_effect)
              + (SELECT count(*) - count(DISTINCT e) FROM ha_event_effect)
              + (SELECT count(*) - count(DISTINCT (task, window_start)) FROM ha_tick)",
    )?;
    assert_eq!(doubled, 0, "doubled effects");
    let runs_doubled: i64 = one(
        &mut c,
        "SELECT count(*) FROM (SELECT r.window_start FROM tide.run r JOIN tide.task t USING (task_id)
                                WHERE t.name IN ('ha_catch_up', 'ha_skip')
                                GROUP BY t.name, r.window_start HAVING count(*) > 1) d",
    )?;
    assert_eq!(runs_doubled, 0, "a window with two runs");
    // Every window of the catch-up task from its first to its last ran once (none lost, the
    // missed ones caught up); the skip task's missed windows are recorded skipped (misfire).
    let (windows, ran, caught_up): (i64, i64, i64) = {
        let r = c
            .query_one(
                "SELECT (extract(epoch FROM max(r.window_start) - min(r.window_start)) / 2)::bigint + 1,
                        count(*) FILTER (WHERE r.state = 'succeeded'),
                        count(*) FILTER (WHERE r.trigger = 'catch_up')
                   FROM tide.run r JOIN tide.task t USING (task_id)
                  WHERE t.name = 'ha_catch_up' AND r.state <> 'running'",
                &[],
            )
            .map_err(|e| describe(&e))?;
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(
        ran, windows,
        "catch_up: every window from first to last ran once"
    );
    assert!(
        caught_up >= 1,
        "catch_up: the windows missed during the failover were caught up"
    );
    let effects: i64 = one(
        &mut c,
        "SELECT count(*) FROM ha_tick WHERE task = 'ha_catch_up'",
    )?;
    assert_eq!(effects, ran, "catch_up: one effect per run");
    let (skipped, gaps): (i64, i64) = {
        let r = c
            .query_one(
                "WITH w AS (SELECT r.window_start, r.state, r.skip_reason FROM tide.run r JOIN tide.task t USING (task_id)
                             WHERE t.name = 'ha_skip')
                 SELECT (SELECT count(*) FROM w WHERE state = 'skipped' AND skip_reason = 'misfire'),
                        (SELECT (extract(epoch FROM max(window_start) - min(window_start)) / 2)::bigint + 1 - count(*) FROM w)",
                &[],
            )
            .map_err(|e| describe(&e))?;
        (r.get(0), r.get(1))
    };
    assert!(
        skipped >= 1,
        "skip: the windows missed during the failover are recorded skipped (misfire)"
    );
    assert_eq!(gaps, 0, "skip: every window has its row, run or skipped");

    // What the load had acknowledged, on the final leader.
    let lost_jobs = missing(
        &mut c,
        "SELECT 1 FROM ha_job_effect WHERE n = i",
        &seen.enqueued,
    )?;
    let lost_events = missing(
        &mut c,
        "SELECT 1 FROM ha_event_effect WHERE e = i",
        &seen.emitted,
    )?;
    let lost_completions = missing(
        &mut c,
        "SELECT 1 FROM tide.run r WHERE r.run_id = i AND r.state = 'succeeded'",
        &seen.completed,
    )?;
    println!(
        "{tag}: promoted {:.1} s after kill -9, workers resumed within {:.1} s; switchover {:.1} s, \
         workers resumed within {:.1} s; {} jobs, {} events, {} completions acknowledged; lost: {lost_jobs} \
         jobs, {lost_events} events, {lost_completions} completions; {} catch-up windows, {skipped} \
         skipped; {} errors met by the load",
        promoted.as_secs_f64(),
        resumed.as_secs_f64(),
        switched.as_secs_f64(),
        resumed_switch.as_secs_f64(),
        seen.enqueued.len(),
        seen.emitted.len(),
        seen.completed.len(),
        caught_up,
        seen.errors,
    );
    if synchronous {
        assert_eq!(
            (lost_jobs, lost_events, lost_completions),
            (0, 0, 0),
            "synchronous_mode: nothing acknowledged is lost"
        );
    }
    drop(c);
    drop(ha);
    Ok(())
}

/// A job's effect, guarded by its key, and its completion, in one transaction (what each
/// external worker does with a run it claimed).
fn complete_job(
    c: &mut Client,
    run: i64,
    token: i64,
    n: i64,
    worker: &str,
) -> Result<(), postgres::Error> {
    let mut tx = c.transaction()?;
    tx.execute(
        "INSERT INTO ha_job_effect (n, worker)
         SELECT $1, $2 WHERE NOT EXISTS (SELECT 1 FROM ha_job_effect WHERE n = $1)",
        &[&n, &worker],
    )?;
    tx.execute("SELECT tide.complete_run($1, $2)", &[&run, &token])?;
    tx.commit()
}

/// How many of `ids` (as `i`) have no row in `exists`, on the final leader.
fn missing(c: &mut Client, exists: &str, ids: &[i64]) -> Result<i64, String> {
    c.query_one(
        &format!("SELECT count(*) FROM unnest($1::bigint[]) i WHERE NOT EXISTS ({exists})"),
        &[&ids],
    )
    .map(|r| r.get(0))
    .map_err(|e| describe(&e))
}

/// Waits until node `i`, the leader, has run two more windows of each scheduled task: the load
/// has gone on there before the next step.
fn windows_run(ha: &Ha, i: usize) -> Result<(), String> {
    let count = |c: &mut Client| -> Result<(i64, i64), String> {
        c.query_one(
            "SELECT count(*) FILTER (WHERE task = 'ha_catch_up'), count(*) FILTER (WHERE task = 'ha_skip')
               FROM ha_tick",
            &[],
        )
        .map(|r| (r.get(0), r.get(1)))
        .map_err(|e| describe(&e))
    };
    let mut c = ha.connect(i, DB)?;
    let (a, b) = count(&mut c)?;
    wait_for(
        &format!("two more windows of each task on {}", ha.nodes[i].name),
        Duration::from_secs(60),
        || {
            let (a2, b2) = count(&mut c)?;
            Ok((a2 >= a + 2 && b2 >= b + 2).then_some(()))
        },
    )
}

fn main() {
    let args = libtest_mimic::Arguments::from_args();
    let trials = vec![
        libtest_mimic::Trial::test(
            "failover_and_switchover_with_asynchronous_replication",
            || ha_scenario(false),
        ),
        libtest_mimic::Trial::test("failover_and_switchover_with_synchronous_mode", || {
            ha_scenario(true)
        }),
    ];
    let args = libtest_mimic::Arguments {
        test_threads: Some(1),
        ..args
    };
    libtest_mimic::run(&args, trials).exit()
}

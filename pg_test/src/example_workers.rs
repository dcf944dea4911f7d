//! The external workers of examples/ (Python, Node, Go, Rust) as the examples and pgbouncer
//! tiers run them: each as its own process against a real cluster, directly or through a
//! pooler. For one language, runs of every kind are emitted to a queue of its own: plain ones,
//! one that fails its first attempt (transient: retried), one that works slowly with
//! heartbeats, one with a business error (dead at once). The scenario waits until the worker has
//! finished them and checks what it wrote and how each run ended; then it emits one more slow
//! run, sends SIGTERM while the worker holds it, and checks that the worker finishes that run
//! and exits 0.
//!
//! scripts/examples.sh prepares the four workers (psycopg in a venv, pg with npm, the Go worker
//! built with Debian's lib/pq, the Rust worker with cargo) and passes where they are in
//! PG_TIDE_EXAMPLE_{PYTHON,NODE,GO,RUST}.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{db_err, one, wait_for, Client, Cluster, Failed};

pub(crate) fn exec(c: &mut Client, sql: &str) -> Result<(), Failed> {
    c.batch_execute(sql).map_err(db_err)
}

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// The command that starts a language's worker, from what scripts/examples.sh prepared.
pub fn worker_command(lang: &str) -> Result<Command, Failed> {
    let var = format!("PG_TIDE_EXAMPLE_{}", lang.to_uppercase());
    let prepared = std::env::var(&var)
        .map_err(|_| format!("{var} is not set: run the examples tier with scripts/examples.sh"))?;
    let mut cmd = match lang {
        // The venv's python with psycopg, on the example's file.
        "python" => {
            let mut c = Command::new(prepared);
            c.arg(examples_dir().join("python/worker.py"));
            c
        }
        // node, in the directory where npm installed pg.
        "node" => {
            let mut c = Command::new(prepared);
            c.arg("worker.js").current_dir(examples_dir().join("node"));
            c
        }
        // The built binaries.
        _ => Command::new(prepared),
    };
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    Ok(cmd)
}

/// A worker process, stopped with SIGKILL if the test ends before it does.
pub struct Worker(pub Option<Child>);

impl Worker {
    pub fn pid(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// Ends it with SIGKILL (a test that failed).
    pub fn kill(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
        }
    }

    /// Its exit status, once it has exited.
    pub fn exited(&mut self) -> Result<Option<std::process::ExitStatus>, String> {
        match self.0.as_mut() {
            Some(child) => child.try_wait().map_err(|e| e.to_string()),
            None => Err("no worker".into()),
        }
    }

    /// What it printed (after it exited).
    pub fn output(&mut self) -> String {
        let Some(child) = self.0.take() else {
            return String::new();
        };
        match child.wait_with_output() {
            Ok(o) => format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => e.to_string(),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How the runs of the task ended: "state:dedupe_key" sorted, with attempts where more than 1.
pub fn outcomes(c: &mut Client, task: &str) -> Result<String, String> {
    c.query_one(
        "SELECT coalesce(string_agg(r.state || ':' || r.dedupe_key || CASE WHEN r.attempts > 1 THEN '#' || r.attempts ELSE '' END,
                                    ' ' ORDER BY r.dedupe_key), '')
           FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = $1",
        &[&task],
    )
    .map(|r| r.get(0))
    .map_err(|e| e.to_string())
}

/// The scenario of the examples tier for one language's worker, connected with `url` (the
/// server, or a pooler in front of it) and the environment `env` (`LISTEN_URL`, say).
pub fn worker_runs_every_kind(
    cluster: &Cluster,
    lang: &str,
    url: &str,
    env: &[(&str, &str)],
) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    let task = format!("squares_{lang}");
    exec(
        &mut c,
        &format!(
            "CREATE TABLE IF NOT EXISTS example_result (key text PRIMARY KEY, n bigint, square bigint, worker text);
             SELECT tide.schedule('{task}', NULL, topics => '{{{task}}}', queue => '{task}',
                                  max_attempts => 3, backoff_base => '1 second', jitter => 'none');
             SELECT tide.emit('{task}', jsonb_build_object('n', g), dedupe_key => '{lang}-' || lpad(g::text, 2, '0'))
               FROM generate_series(1, 20) g;
             SELECT tide.emit('{task}', '{{\"n\": 21, \"flaky\": true}}', dedupe_key => '{lang}-21');
             SELECT tide.emit('{task}', '{{\"n\": 22, \"slow_ms\": 1000}}', dedupe_key => '{lang}-22');
             SELECT tide.emit('{task}', '{{\"n\": -1}}', dedupe_key => '{lang}-bad');"
        ),
    )?;
    let mut cmd = worker_command(lang)?;
    cmd.envs(env.iter().copied());
    let mut worker = Worker(Some(
        cmd.env("DATABASE_URL", url)
            .env("QUEUE", &task)
            .spawn()
            .map_err(|e| format!("{lang} worker: {e}"))?,
    ));

    let plain: Vec<String> = (1..=20)
        .map(|g| format!("succeeded:{lang}-{g:02}"))
        .collect();
    let want = format!(
        "{} succeeded:{lang}-21#2 succeeded:{lang}-22 dead:{lang}-bad",
        plain.join(" ")
    );
    let finished = wait_for(
        &format!("the {lang} worker to finish every run"),
        Duration::from_secs(90),
        || {
            if let Some(status) = worker.exited()? {
                return Err(format!("the {lang} worker exited early ({status})"));
            }
            let got = outcomes(&mut c, &task)?;
            Ok((got == want).then_some(got))
        },
    );
    if let Err(e) = finished {
        worker.kill();
        return Err(format!(
            "{e}\nruns: {}\nworker output:\n{}",
            outcomes(&mut c, &task)?,
            worker.output()
        )
        .into());
    }

    // What it wrote: each square once, by this worker, committed with the completions.
    let written: String = one(
        &mut c,
        &format!(
            "SELECT count(*) || ' rows, ' || count(*) FILTER (WHERE square = n * n) || ' squares, '
                    || count(*) FILTER (WHERE worker LIKE '{lang}-%') || ' by {lang}'
               FROM example_result WHERE key LIKE '{lang}-%'"
        ),
    )?;
    assert_eq!(written, format!("22 rows, 22 squares, 22 by {lang}"));
    // The slow run's heartbeats kept its progress; the dead one says why; the flaky one's first
    // attempt was a transient failure.
    let details: String = one(
        &mut c,
        &format!(
            "SELECT concat_ws(' | ',
                (SELECT checkpoint::text FROM tide.run WHERE dedupe_key = '{lang}-22'),
                (SELECT last_error_kind || ': ' || last_error FROM tide.run WHERE dedupe_key = '{lang}-bad'),
                (SELECT string_agg(e.reason, '; ' ORDER BY e.event_id) FROM tide.run_event e JOIN tide.run r USING (run_id)
                  WHERE r.dedupe_key = '{lang}-21' AND e.to_state = 'retry'))"
        ),
    )?;
    assert!(
        details.starts_with("{\"done_ms\": 1000} | business: n must not be negative, got -1 | ")
            && details.ends_with("flaky: fails its first attempt"),
        "{details}"
    );

    // SIGTERM while it holds a slow run: it finishes that run, then exits 0.
    exec(
        &mut c,
        &format!(
            "SELECT tide.emit('{task}', '{{\"n\": 23, \"slow_ms\": 1500}}', dedupe_key => '{lang}-last')"
        ),
    )?;
    wait_for(
        &format!("the {lang} worker to hold the last run"),
        Duration::from_secs(30),
        || {
            let state: Option<String> = c
                .query_opt(
                    "SELECT state::text FROM tide.run WHERE dedupe_key = $1",
                    &[&format!("{lang}-last")],
                )
                .map_err(|e| e.to_string())?
                .map(|r| r.get(0));
            Ok((state.as_deref() == Some("running")).then_some(()))
        },
    )?;
    let term = Command::new("kill")
        .args(["-TERM", &worker.pid().to_string()])
        .status()?;
    assert!(term.success());
    let status = wait_for(
        &format!("the {lang} worker to exit after SIGTERM"),
        Duration::from_secs(30),
        || worker.exited(),
    )?;
    let output = worker.output();
    assert!(status.success(), "{lang} worker: {status}\n{output}");
    assert!(output.contains("stopped"), "{lang} worker said:\n{output}");
    let last: String = one(
        &mut c,
        &format!(
            "SELECT r.state || ' ' || (SELECT square FROM example_result WHERE key = r.dedupe_key)
               FROM tide.run r WHERE r.dedupe_key = '{lang}-last'"
        ),
    )?;
    assert_eq!(last, "succeeded 529", "the run in hand at SIGTERM");
    let running: i64 = one(
        &mut c,
        &format!("SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = '{task}' AND r.state = 'running'"),
    )?;
    assert_eq!(running, 0);
    Ok(())
}

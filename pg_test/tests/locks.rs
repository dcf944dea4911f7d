//! Per-object locks, fencing and overlap on a real cluster. Runs with the same lock key (of any
//! task) never run at once: a busy key defers a run (recorded, not an attempt) until the holder
//! ends; an expired lock is taken over and its old holder fenced out, its late work rolled back.
//! Overlap queue runs one window at a time, skip records the overlapping run skipped, allow
//! caps at max_concurrency. The stress test: 8 connections, 10,000 runs over 100 keys, workers
//! dying mid-run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_tide_pg_test::{
    claim, db_err, exec, one, refused, run_tests, wait_for, Client, Cluster, Failed, TestFn,
};

fn ids(claimed: &[(i64, i64)]) -> Vec<i64> {
    claimed.iter().map(|c| c.0).collect()
}

fn run_ids(c: &mut Client, sql: &str) -> Result<Vec<i64>, Failed> {
    Ok(c.query(sql, &[])
        .map_err(db_err)?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

fn busy_keys_defer_runs_across_tasks(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("l_defer")?;
    exec(
        &mut c,
        "SELECT tide.schedule('charge', NULL, topics => ARRAY['payment'], lock_key => 'account:{payload.account}');
         SELECT tide.schedule('refund', NULL, topics => ARRAY['payment'], lock_key => 'account:{payload.account}');
         SELECT tide.emit('payment', '{\"account\": 1}');
         SELECT tide.emit('payment', '{\"account\": 2}');",
    )?;
    // Four runs, two per account: one of each account goes, the other waits.
    let first = claim(&mut c, "default", 10, "")?;
    assert_eq!(first.len(), 2, "one run per account: {first:?}");
    let keys: String = one(
        &mut c,
        "SELECT string_agg(key || '=' || run_id || '/' || lease_token, ',' ORDER BY key) FROM tide.lock",
    )?;
    let expected: Vec<String> = first
        .iter()
        .enumerate()
        .map(|(i, (run, token))| format!("account:{}={run}/{token}", i + 1))
        .collect();
    assert_eq!(keys, expected.join(","));
    let deferred: Vec<(i64, String, i32)> = c
        .query(
            "SELECT run_id, reason, attempts FROM tide.run WHERE state = 'ready' ORDER BY run_id",
            &[],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(deferred.len(), 2);
    for (i, (run, reason, attempts)) in deferred.iter().enumerate() {
        let holder = first[i].0;
        assert!(
            reason.starts_with(&format!(
                "deferred: lock account:{} is held by run {holder} until",
                i + 1
            )),
            "{run}: {reason}"
        );
        assert_eq!(*attempts, 0, "a deferral is not an attempt");
        let recorded: i64 = one(
            &mut c,
            &format!("SELECT count(*) FROM tide.run_event WHERE run_id = {run} AND reason LIKE 'deferred: lock%'"),
        )?;
        assert_eq!(recorded, 1, "the deferral is in the history");
    }
    assert!(
        claim(&mut c, "default", 10, "")?.is_empty(),
        "both keys are busy"
    );
    let explained: String = one(
        &mut c,
        &format!(
            "SELECT string_agg(l, E'\\n') FROM tide.explain({}) l",
            deferred[0].0
        ),
    )?;
    assert!(
        explained.contains(&format!(
            "lock key: account:1 (held by run {} until",
            first[0].0
        )),
        "{explained}"
    );

    // A heartbeat renews the lock with the lease.
    let (run, token) = first[0];
    let renewed: bool = one(
        &mut c,
        &format!("SELECT tide.heartbeat_run({run}, {token}) IS NOT NULL"),
    )?;
    assert!(renewed);
    let same: bool = one(
        &mut c,
        &format!("SELECT l.expires_at = r.lease_expires_at FROM tide.lock l JOIN tide.run r USING (run_id) WHERE l.run_id = {run}"),
    )?;
    assert!(same, "the lock expires with the lease");

    // The holder ends: its lock is freed and the waiter goes.
    exec(&mut c, &format!("SELECT tide.complete_run({run}, {token})"))?;
    let held: i64 = one(
        &mut c,
        &format!("SELECT count(*) FROM tide.lock WHERE run_id = {run}"),
    )?;
    assert_eq!(held, 0);
    let next = claim(&mut c, "default", 10, "")?;
    assert_eq!(ids(&next), vec![deferred[0].0], "the waiter of account:1");
    // A failure frees the lock too.
    let (run2, token2) = first[1];
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({run2}, {token2}, 'bank down', 'business')"),
    )?;
    let next = claim(&mut c, "default", 10, "")?;
    assert_eq!(ids(&next), vec![deferred[1].0], "the waiter of account:2");

    // Unstarted runs that adopt new rules take their lock key (and a replayed run its rules').
    exec(
        &mut c,
        "SELECT tide.schedule('sync', NULL, topics => ARRAY['sync']);
         SELECT tide.emit('sync', '{\"account\": 5}');
         SELECT tide.alter('sync', lock_key => 'account:{payload.account}', pending => 'adopt');",
    )?;
    let adopted: String = one(
        &mut c,
        "SELECT r.lock_key || '/' || p.gated FROM tide.run r JOIN tide.pending p USING (run_id)
           JOIN tide.task t ON t.task_id = r.task_id WHERE t.name = 'sync'",
    )?;
    assert_eq!(adopted, "account:5/true");
    Ok(())
}

/// A run enqueued for later (run_at ahead) waits for its instant, whatever wakes its neighbours:
/// when a lock key's holder ends, or a slot of a task's max_concurrency frees, the run woken is
/// the one waiting for it, never one that is not due yet. (Before, the wake-up took the oldest
/// ready run of the key or the task and cleared its wait: a job enqueued for an hour later ran
/// at once.)
fn a_wake_up_never_starts_a_run_enqueued_for_later(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("l_later")?;
    for (task, rules) in [
        ("pay", "lock_key => 'account:{args.account}'"),
        ("mc", "overlap => 'allow', max_concurrency => 1"),
    ] {
        exec(
            &mut c,
            &format!("SELECT tide.schedule('{task}', '0 0 1 1 *', queue => '{task}', {rules})"),
        )?;
        let now_run: i64 = one(
            &mut c,
            &format!("SELECT tide.enqueue('{task}', '{{\"account\": 1}}')"),
        )?;
        let later: i64 = one(
            &mut c,
            &format!(
                "SELECT tide.enqueue('{task}', '{{\"account\": 1}}', run_at => now() + interval '1 hour')"
            ),
        )?;
        let waiter: i64 = one(
            &mut c,
            &format!("SELECT tide.enqueue('{task}', '{{\"account\": 1}}')"),
        )?;
        // The first goes; the third waits for it (parked), the second for its hour.
        let first = claim(&mut c, task, 10, "")?;
        assert_eq!(ids(&first), vec![now_run], "{task}: only the first may go");
        let parked: bool = one(
            &mut c,
            &format!("SELECT parked FROM tide.pending WHERE run_id = {waiter}"),
        )?;
        assert!(parked, "{task}: the third waits for the first");
        let (run, token) = first[0];
        exec(&mut c, &format!("SELECT tide.complete_run({run}, {token})"))?;
        // The wake-up lets the waiter go, and leaves the run enqueued for later waiting.
        let next = claim(&mut c, task, 10, "")?;
        assert_eq!(
            ids(&next),
            vec![waiter],
            "{task}: the waiter goes, not the run due in an hour"
        );
        let (still, due_kept): (String, bool) = {
            let row = c
                .query_one(
                    &format!(
                        "SELECT p.state::text, p.due_at = r.run_after AND p.due_at > now() + interval '50 minutes'
                           FROM tide.pending p JOIN tide.run r USING (run_id) WHERE p.run_id = {later}"
                    ),
                    &[],
                )
                .map_err(db_err)?;
            (row.get(0), row.get(1))
        };
        assert_eq!(still, "ready", "{task}");
        assert!(
            due_kept,
            "{task}: the run enqueued for later keeps its instant"
        );
        let (run, token) = next[0];
        exec(&mut c, &format!("SELECT tide.complete_run({run}, {token})"))?;
        assert!(
            claim(&mut c, task, 10, "")?.is_empty(),
            "{task}: nothing else may go before its hour"
        );
    }
    Ok(())
}

/// The bulk paths (tide.enqueue, tide.emit) work out a run's gating from its task's rules read
/// once per call: each run's serial group, lock key and gated flag are those its rule version
/// gives it, as the insert trigger and a rule change's regating compute them.
fn bulk_paths_gate_runs_as_their_rules_say(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("l_gating")?;
    exec(
        &mut c,
        "SELECT tide.schedule('g_args', '0 0 1 1 *', lock_key => 'acct:{args.account}');
         SELECT tide.schedule('g_plain', '0 0 1 1 *');
         SELECT tide.schedule('g_mc', '0 0 1 1 *', overlap => 'allow', max_concurrency => 2);
         SELECT tide.schedule('g_pay', NULL, topics => ARRAY['g.ev'], lock_key => 'p:{payload.id}:{key}');
         SELECT tide.schedule('g_ev', NULL, topics => ARRAY['g.ev']);
         SELECT tide.enqueue('g_args', '[{\"account\": 1}, {\"account\": 2}, {}]');
         SELECT tide.enqueue('g_plain', '[{}, {}]');
         SELECT tide.enqueue('g_mc', '{}');
         SELECT tide.emit('g.ev', '{\"id\": 5}', event_key => 'k1');
         SELECT tide.emit_many('g.ev', ARRAY['{\"id\": 6}', '{}']::jsonb[]);",
    )?;
    let shown: String = one(
        &mut c,
        "SELECT string_agg(t.name || ' ' || coalesce(r.gate, '-') || ' ' || coalesce(r.lock_key, '-') || ' ' || r.gated,
                           ', ' ORDER BY r.run_id)
           FROM tide.run r JOIN tide.task t USING (task_id)
          WHERE t.name IN ('g_args', 'g_plain', 'g_mc')",
    )?;
    // Enqueued runs have no serial group (no window, no event key); the lock key renders a
    // missing field empty; max_concurrency alone gates.
    assert_eq!(
        shown,
        "g_args - acct:1 true, g_args - acct:2 true, g_args - acct: true, g_plain - - false, \
         g_plain - - false, g_mc - - true"
    );
    let keyed: String = one(
        &mut c,
        "SELECT string_agg(coalesce(r.gate, '-') || ' ' || coalesce(r.lock_key, '-') || ' ' || r.gated, ', ' ORDER BY r.run_id)
           FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'g_pay'",
    )?;
    // An event with a key is serial with the task's other events of that key (task:key).
    let pay: i64 = one(&mut c, "SELECT task_id FROM tide.task WHERE name = 'g_pay'")?;
    assert_eq!(
        keyed,
        format!("{pay}:k1 p:5:k1 true, - p:6: true, - p:: true")
    );
    // Every run, of every task, as its rule version says (the insert trigger's computation).
    let differ: String = one(
        &mut c,
        "SELECT coalesce(string_agg(r.run_id::text, ','), '')
           FROM tide.run r
          CROSS JOIN LATERAL tide._gating_of(r.task_id, r.version, r.args, r.payload, r.event_key, r.biz_date,
                                             r.window_start) g
          WHERE (r.gate, r.lock_key, r.gated) IS DISTINCT FROM (g.gate, g.lock_key, g.gated)",
    )?;
    assert_eq!(differ, "", "runs whose gating differs from their rules'");
    let runs: i64 = one(&mut c, "SELECT count(*) FROM tide.run")?;
    assert_eq!(runs, 12);
    Ok(())
}

fn an_expired_lock_is_taken_over_and_its_holder_fenced(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("l_fence")?;
    exec(
        &mut c,
        "CREATE TABLE ledger (account int, amount int);
         SELECT tide.schedule('post', NULL, topics => ARRAY['post'], lock_key => 'account:{payload.account}',
                              backoff_base => '1 hour');
         SELECT tide.emit('post', '{\"account\": 7}', dedupe_key => 'a');
         SELECT tide.emit('post', '{\"account\": 7}', dedupe_key => 'b');",
    )?;
    let old = claim(&mut c, "default", 1, ", lease => '1 second'")?;
    let (slow, slow_token) = old[0];
    wait_for("the lock to expire", Duration::from_secs(10), || {
        let expired: bool = c
            .query_one("SELECT expires_at < now() FROM tide.lock", &[])
            .map_err(|e| e.to_string())?
            .get(0);
        Ok(expired.then_some(()))
    })?;
    // No tick has taken the slow run back: the claim of the other run takes the lock over and
    // fences the slow holder out.
    let new = claim(&mut c, "default", 10, "")?;
    assert_eq!(new.len(), 1);
    let (fast, fast_token) = new[0];
    assert_ne!(fast, slow);
    let holder: String = one(
        &mut c,
        "SELECT run_id || '/' || lease_token FROM tide.lock WHERE key = 'account:7'",
    )?;
    assert_eq!(holder, format!("{fast}/{fast_token}"));
    let lost: String = one(
        &mut c,
        &format!("SELECT r.state || '/' || a.outcome || '/' || a.error FROM tide.run r JOIN tide.attempt a USING (run_id) WHERE r.run_id = {slow}"),
    )?;
    assert_eq!(
        lost,
        format!("retry/lost/lock account:7 expired (token {slow_token}) and was taken over by run {fast}")
    );
    // The slow worker finishes late: every call is refused and its work rolls back.
    for call in [
        format!("SELECT tide.heartbeat_run({slow}, {slow_token})"),
        format!("SELECT tide.complete_run({slow}, {slow_token})"),
        format!("SELECT tide.fail_run({slow}, {slow_token}, 'late')"),
        format!("SELECT tide.start_step({slow}, {slow_token}, 'post')"),
    ] {
        let mut tx = c.transaction().map_err(db_err)?;
        tx.batch_execute("INSERT INTO ledger VALUES (7, 100)")
            .map_err(db_err)?;
        let err = tx.batch_execute(&call).expect_err(&call);
        let code = err.code().map(|s| s.code().to_string());
        assert_eq!(code.as_deref(), Some("55000"), "{call}: {err}");
        drop(tx); // rolled back
    }
    let rows: i64 = one(&mut c, "SELECT count(*) FROM ledger")?;
    assert_eq!(rows, 0, "the fenced worker changed nothing");
    exec(
        &mut c,
        &format!("BEGIN; INSERT INTO ledger VALUES (7, 100); SELECT tide.complete_run({fast}, {fast_token}); COMMIT;"),
    )?;
    let rows: i64 = one(&mut c, "SELECT count(*) FROM ledger")?;
    assert_eq!(rows, 1);
    Ok(())
}

fn overlap_queue_skip_and_allow(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("l_overlap")?;
    exec(
        &mut c,
        "SELECT tide.schedule('q', '0 * * * *');
         SELECT tide.schedule('s', '0 * * * *', overlap => 'skip');
         SELECT tide.schedule('a', '0 * * * *', overlap => 'allow', max_concurrency => 2);",
    )?;
    let mut windows = HashMap::new();
    for task in ["q", "s", "a"] {
        let mut runs = Vec::new();
        for hours in [4, 3, 2] {
            runs.push(one::<i64>(
                &mut c,
                &format!("SELECT tide.rerun('{task}', window_start => date_trunc('hour', now()) - interval '{hours} hours')"),
            )?);
        }
        windows.insert(task, runs);
    }
    let claimed = ids(&claim(&mut c, "default", 20, "")?);
    let (q, s, a) = (&windows["q"], &windows["s"], &windows["a"]);
    // queue: the oldest window only; skip: the oldest, the others recorded skipped; allow: 2.
    assert_eq!(claimed, vec![q[0], s[0], a[0], a[1]]);
    let skipped: Vec<i64> = run_ids(
        &mut c,
        "SELECT run_id FROM tide.run WHERE state = 'skipped' AND skip_reason = 'overlap' ORDER BY run_id",
    )?;
    assert_eq!(skipped, vec![s[1], s[2]]);
    assert!(
        claim(&mut c, "default", 20, "")?.is_empty(),
        "the rest wait"
    );
    // Ending a run lets the next of its task go.
    for run in [q[0], a[0]] {
        let token: i64 = one(
            &mut c,
            &format!("SELECT lease_token FROM tide.run WHERE run_id = {run}"),
        )?;
        exec(&mut c, &format!("SELECT tide.complete_run({run}, {token})"))?;
    }
    assert_eq!(ids(&claim(&mut c, "default", 20, "")?), vec![q[1], a[2]]);
    // A queue window that fails and retries still holds its place: the next waits for it.
    let token: i64 = one(
        &mut c,
        &format!("SELECT lease_token FROM tide.run WHERE run_id = {}", q[1]),
    )?;
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({}, {token}, 'flaky')", q[1]),
    )?;
    assert!(
        claim(&mut c, "default", 20, "")?.is_empty(),
        "q[2] waits for q[1]"
    );
    // (The other tasks are paused so the tick's new windows of theirs stay out of the claim.)
    exec(
        &mut c,
        "SELECT tide.pause('s'), tide.pause('a'); SELECT tide.tick(now() + interval '2 hours')",
    )?;
    assert_eq!(
        ids(&claim(&mut c, "default", 20, "")?),
        vec![q[1]],
        "the retry first"
    );

    // Bad input.
    for (sql, code, needle) in [
        (
            "SELECT tide.schedule('x', '@daily', overlap => 'sometimes')",
            "22023",
            "unknown overlap \"sometimes\"",
        ),
        (
            "SELECT tide.schedule('x', '@daily', max_concurrency => 2)",
            "22023",
            "max_concurrency 2 needs overlap => 'allow', got overlap queue",
        ),
        (
            "SELECT tide.schedule('x', '@daily', overlap => 'allow', max_concurrency => -1)",
            "22023",
            "max_concurrency must be between 1 and 10000 (0: no limit), got -1",
        ),
        (
            "SELECT tide.schedule('x', '@daily', lock_key => 'account:{account_id}')",
            "22023",
            "unknown placeholder {account_id}",
        ),
        (
            "SELECT tide.schedule('x', '@daily', lock_key => 'account:{args.id')",
            "22023",
            "'{' without '}'",
        ),
        (
            "SELECT tide.alter('q', max_concurrency => 3)",
            "22023",
            "needs overlap => 'allow'",
        ),
    ] {
        let (got, message, hint) = refused(&mut c, sql)?;
        assert_eq!(got, code, "{sql}: {message}");
        assert!(message.contains(needle), "{sql}: {message}");
        assert!(!hint.is_empty(), "{sql}");
    }
    let tasks: i64 = one(&mut c, "SELECT count(*) FROM tide.task")?;
    assert_eq!(tasks, 3, "nothing written");
    let version: i32 = one(&mut c, "SELECT version FROM tide.task WHERE name = 'q'")?;
    assert_eq!(version, 1, "the refused alter wrote nothing");
    Ok(())
}

/// 8 connections claim and complete 10,000 event runs (two tasks on one topic, 5,000 events
/// over 100 keys; each task's runs of a key in emit order, both tasks sharing the key's lock).
/// One claim in about 40 drops its connection mid-run; the real scheduler takes those runs back
/// when their leases expire.
fn stress_8_workers_10000_runs_100_keys(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "DROP TABLE IF EXISTS stress_done;
         CREATE TABLE stress_done (ord bigserial, task text, key text, seq int, run_id bigint);
         SELECT tide.schedule(t, NULL, topics => ARRAY['stress'], lock_key => 'obj:{key}',
                              backoff_base => '100 ms', backoff_cap => '200 ms', jitter => 'none',
                              max_attempts => 50)
           FROM unnest(ARRAY['stress_a', 'stress_b']) t;
         SELECT count(tide.emit('stress', jsonb_build_object('seq', g), event_key => 'k' || (g % 100)))
           FROM generate_series(1, 5000) g;",
    )?;
    let total: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name LIKE 'stress_%'",
    )?;
    assert_eq!(total, 10_000);

    let holders: Arc<Mutex<HashMap<String, i64>>> = Arc::new(Mutex::new(HashMap::new()));
    let violations: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let conn = cluster.conn_string(pg_tide_pg_test::WORKERS_DB, "postgres");
    let mut threads = Vec::new();
    for w in 0..8u64 {
        let (holders, violations, conn) = (holders.clone(), violations.clone(), conn.clone());
        threads.push(std::thread::spawn(move || -> Result<(u64, u64), String> {
            let connect = || Client::connect(&conn, postgres::NoTls).map_err(|e| e.to_string());
            let mut c = connect()?;
            let mut seed = w * 7919 + 1;
            let (mut done, mut deaths) = (0u64, 0u64);
            let deadline = std::time::Instant::now() + Duration::from_secs(600);
            loop {
                if std::time::Instant::now() > deadline {
                    return Err("stress workers did not finish in 10 minutes".into());
                }
                let rows = c
                    .query(
                        "SELECT c.run_id, c.lease_token, c.task, c.event_key, (c.payload->>'seq')::int
                           FROM tide.claim_runs(worker => $1, n => 4, lease => '3 seconds') c",
                        &[&format!("w{w}")],
                    )
                    .map_err(|e| e.to_string())?;
                if rows.is_empty() {
                    let left: i64 = c
                        .query_one(
                            "SELECT count(*) FROM tide.pending p JOIN tide.task t USING (task_id)
                              WHERE t.name LIKE 'stress_%'",
                            &[],
                        )
                        .map_err(|e| e.to_string())?
                        .get(0);
                    if left == 0 {
                        return Ok((done, deaths));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                let claimed: Vec<(i64, i64, String, String, i32)> = rows
                    .iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
                    .collect();
                {
                    let mut h = holders.lock().unwrap();
                    for (run, _, _, key, _) in &claimed {
                        if let Some(other) = h.insert(key.clone(), *run) {
                            violations
                                .lock()
                                .unwrap()
                                .push(format!("key {key}: run {run} while run {other} holds it"));
                        }
                    }
                }
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                if (seed >> 33) % 40 == 0 {
                    // Dies mid-run: the connection drops with the runs claimed.
                    let mut h = holders.lock().unwrap();
                    for (_, _, _, key, _) in &claimed {
                        h.remove(key);
                    }
                    drop(h);
                    drop(c);
                    deaths += 1;
                    c = connect()?;
                    continue;
                }
                for (run, token, task, key, seq) in &claimed {
                    let mut tx = c.transaction().map_err(|e| e.to_string())?;
                    tx.execute(
                        "INSERT INTO stress_done (task, key, seq, run_id) VALUES ($1, $2, $3, $4)",
                        &[task, key, seq, run],
                    )
                    .map_err(|e| e.to_string())?;
                    // Release the key in memory before the commit makes it free for others.
                    holders.lock().unwrap().remove(key);
                    let ok = tx.execute("SELECT tide.complete_run($1, $2)", &[run, token]);
                    match ok {
                        Ok(_) => {
                            tx.commit().map_err(|e| e.to_string())?;
                            done += 1;
                        }
                        Err(e) => {
                            violations
                                .lock()
                                .unwrap()
                                .push(format!("run {run}: completion refused: {e}"));
                        }
                    }
                }
            }
        }));
    }
    let mut finished = 0;
    let mut deaths = 0;
    for t in threads {
        let (d, k) = t.join().map_err(|_| "a stress worker panicked")??;
        finished += d;
        deaths += k;
    }
    let violations = violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:?}");
    assert!(deaths > 0, "some workers died mid-run");
    assert_eq!(finished, 10_000, "every run completed once");
    let (rows, distinct): (i64, i64) = c
        .query_one(
            "SELECT count(*), count(DISTINCT run_id) FROM stress_done",
            &[],
        )
        .map(|r| (r.get(0), r.get(1)))
        .map_err(db_err)?;
    assert_eq!((rows, distinct), (10_000, 10_000), "each run's work once");
    let succeeded: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id)
          WHERE t.name LIKE 'stress_%' AND r.state = 'succeeded'
            AND (SELECT count(*) FROM tide.attempt a WHERE a.run_id = r.run_id AND a.outcome = 'succeeded') = 1",
    )?;
    assert_eq!(succeeded, 10_000, "every run succeeded exactly once");
    let lost: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.attempt a JOIN tide.run r USING (run_id) JOIN tide.task t USING (task_id)
          WHERE t.name LIKE 'stress_%' AND a.outcome = 'lost'",
    )?;
    assert!(lost > 0, "the dead workers' runs were taken back");
    let out_of_order: i64 = one(
        &mut c,
        "SELECT count(*) FROM (
             SELECT seq < lag(seq) OVER (PARTITION BY task, key ORDER BY ord) AS back FROM stress_done) x
          WHERE back",
    )?;
    assert_eq!(out_of_order, 0, "per-key order kept");
    let locks: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.lock WHERE key LIKE 'obj:%'",
    )?;
    assert_eq!(locks, 0, "every lock released");
    Ok(())
}

fn main() {
    let tests: &[(&str, TestFn)] = &[
        (
            "busy_keys_defer_runs_across_tasks",
            busy_keys_defer_runs_across_tasks,
        ),
        (
            "a_wake_up_never_starts_a_run_enqueued_for_later",
            a_wake_up_never_starts_a_run_enqueued_for_later,
        ),
        (
            "bulk_paths_gate_runs_as_their_rules_say",
            bulk_paths_gate_runs_as_their_rules_say,
        ),
        (
            "an_expired_lock_is_taken_over_and_its_holder_fenced",
            an_expired_lock_is_taken_over_and_its_holder_fenced,
        ),
        ("overlap_queue_skip_and_allow", overlap_queue_skip_and_allow),
        (
            "stress_8_workers_10000_runs_100_keys",
            stress_8_workers_10000_runs_100_keys,
        ),
    ];
    run_tests("locks", tests)
}

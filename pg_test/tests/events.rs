//! Event tasks and long tasks on a real cluster. `tide.emit` creates runs in the caller's
//! transaction, once per dedupe key; runs of one key go one at a time in emit order;
//! `emit_on_change` emits table changes; an event task may also have a schedule. Long tasks run
//! batch by batch in the executors, survive a killed executor without redoing committed
//! batches, and obey pause, resume and cancel between batches. The R4.5 property: a task run
//! three times for one window (replay, forced rerun, racing claimers, a lease expiring under a
//! slow worker) leaves the business tables as one run does, and each message is delivered once.

use std::time::Duration;

use pg_tide_pg_test::{
    complete, db_err, exec, one, refused, run_state as state, run_tests, wait_for, Client, Cluster,
    Failed, TestFn, WORKERS_DB,
};

fn claim(c: &mut Client, n: i32) -> Result<Vec<(i64, i64, Option<String>)>, Failed> {
    Ok(c
        .query(
            &format!("SELECT run_id, lease_token, event_key FROM tide.claim_runs(worker => 'w', n => {n}) ORDER BY run_id"),
            &[],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

fn emit_creates_runs_in_the_callers_transaction(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("v_emit")?;
    exec(
        &mut c,
        "SELECT tide.schedule('welcome', NULL, topics => ARRAY['user.created']);
         SELECT tide.schedule('crm', NULL, topics => ARRAY['user.created', 'user.deleted']);
         SELECT tide.schedule('audit', '0 1 * * *', topics => ARRAY['user.deleted']);",
    )?;
    let n: i32 = one(
        &mut c,
        "SELECT tide.emit('user.created', '{\"id\": 1}', dedupe_key => 'user:1')",
    )?;
    assert_eq!(n, 2, "one run per subscribed task");
    let again: i32 = one(
        &mut c,
        "SELECT tide.emit('user.created', '{\"id\": 1}', dedupe_key => 'user:1')",
    )?;
    assert_eq!(again, 0, "a repeated dedupe key is a no-op");
    exec(
        &mut c,
        "BEGIN; SELECT tide.emit('user.created', '{\"id\": 2}'); ROLLBACK;",
    )?;
    let runs: String = one(
        &mut c,
        "SELECT string_agg(t.name || ':' || r.trigger || ':' || r.dedupe_key || ':' || r.payload::text, ',' ORDER BY t.name)
           FROM tide.run r JOIN tide.task t USING (task_id)",
    )?;
    assert_eq!(
        runs, "crm:event:user:1:{\"id\": 1},welcome:event:user:1:{\"id\": 1}",
        "a rolled-back emit left nothing"
    );
    let explained: String = one(
        &mut c,
        "SELECT string_agg(l, E'\\n') FROM tide.run r, tide.explain(r.run_id) l WHERE r.dedupe_key = 'user:1' AND r.task_id = 1",
    )?;
    assert!(
        explained.contains("event run on user.created, dedupe key user:1, payload {\"id\": 1}"),
        "{explained}"
    );
    let outside: bool = one(
        &mut c,
        "SELECT tide.payload() IS NULL AND tide.event_key() IS NULL AND tide.checkpoint() IS NULL",
    )?;
    assert!(outside, "the run context is empty outside a command");
    let none: i32 = one(&mut c, "SELECT tide.emit('nobody.listens')")?;
    assert_eq!(none, 0);
    // Without a dedupe key every emit is its own event; the scheduled task's windows coexist.
    let deleted: i32 = one(
        &mut c,
        "SELECT tide.emit('user.deleted') + tide.emit('user.deleted')",
    )?;
    assert_eq!(deleted, 4);
    exec(
        &mut c,
        // (Two days back: the window of yesterday's date ends at 01:00 today, UTC, and a test
        // run between midnight and 01:00 must not find it still open.)
        "SELECT tide.rerun('audit', biz_date => current_date - 2)",
    )?;
    let audit: String = one(
        &mut c,
        "SELECT string_agg(r.trigger::text, ',' ORDER BY r.trigger::text) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'audit'",
    )?;
    assert_eq!(audit, "event,event,manual");
    // The claim hands the event over.
    let got: String = one(
        &mut c,
        "SELECT string_agg(task || '/' || topic || '/' || payload::text, ',' ORDER BY task)
           FROM tide.claim_runs(n => 2) WHERE topic = 'user.created'",
    )?;
    assert_eq!(
        got,
        "crm/user.created/{\"id\": 1},welcome/user.created/{\"id\": 1}"
    );
    // An event task has no windows.
    let (code, message, hint) = refused(
        &mut c,
        "SELECT tide.rerun('welcome', biz_date => current_date)",
    )?;
    assert_eq!(code, "22023");
    assert_eq!(
        message,
        "task \"welcome\" has no schedule, so it has no windows"
    );
    assert!(hint.contains("tide.alter('welcome', schedule =>"), "{hint}");

    for (sql, code, needle) in [
        ("SELECT tide.emit(NULL)", "22004", "topic NULL"),
        (
            "SELECT tide.emit('has space')",
            "22023",
            "topic 'has space'",
        ),
        (
            "SELECT tide.emit('t', event_key => '')",
            "22023",
            "event_key ''",
        ),
        (
            "SELECT tide.emit('t', dedupe_key => '#5')",
            "22023",
            "dedupe_key '#5'",
        ),
        (
            "SELECT tide.schedule('x', NULL)",
            "22004",
            "schedule must not be NULL for a task without topics",
        ),
        (
            "SELECT tide.schedule('x', NULL, topics => ARRAY['ok', 'not ok'])",
            "22023",
            "topic \"not ok\" is not valid",
        ),
        (
            "SELECT tide.schedule('x', NULL, topics => ARRAY[NULL]::text[])",
            "22023",
            "topic \"\" is not valid",
        ),
        (
            "SELECT tide.alter('welcome', topics => '{}')",
            "22004",
            "schedule must not be NULL",
        ),
    ] {
        let (got, message, hint) = refused(&mut c, sql)?;
        assert_eq!(got, code, "{sql}: {message}");
        assert!(message.contains(needle), "{sql}: {message}");
        assert!(!hint.is_empty(), "{sql}");
    }
    let topics: String = one(
        &mut c,
        "SELECT array_to_string(topics, ',') FROM tide.task WHERE name = 'welcome'",
    )?;
    assert_eq!(topics, "user.created", "the refused alter wrote nothing");
    // A run not started is paused at once, and a paused run can be cancelled.
    let waiting: i64 = one(
        &mut c,
        "SELECT min(run_id) FROM tide.run WHERE state = 'ready'",
    )?;
    let paused: String = one(&mut c, &format!("SELECT tide.pause_run({waiting})"))?;
    assert_eq!(paused, "paused");
    assert!(
        claim(&mut c, 100)?.iter().all(|r| r.0 != waiting),
        "a paused run is not claimed"
    );
    let cancelled: String = one(&mut c, &format!("SELECT tide.cancel_run({waiting})"))?;
    assert_eq!(cancelled, "cancelled");
    assert_eq!(state(&mut c, waiting)?, "cancelled");
    Ok(())
}

fn runs_of_one_key_go_in_emit_order(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("v_order")?;
    exec(
        &mut c,
        "SELECT tide.schedule('ship', NULL, topics => ARRAY['order']);
         SELECT tide.emit('order', '{\"n\": 1}', event_key => 'cust:1');
         SELECT tide.emit('order', '{\"n\": 2}', event_key => 'cust:1');
         SELECT tide.emit('order', '{\"n\": 3}', event_key => 'cust:2');
         SELECT tide.emit('order', '{\"n\": 4}', event_key => 'cust:1');
         SELECT tide.emit('order', '{\"n\": 5}');
         SELECT tide.emit('order', '{\"n\": 6}');",
    )?;
    let mut order = Vec::new();
    // Different keys (and keyless events) go side by side; one key one at a time.
    let first = claim(&mut c, 10)?;
    let keys: Vec<Option<String>> = first.iter().map(|r| r.2.clone()).collect();
    assert_eq!(
        keys,
        vec![Some("cust:1".into()), Some("cust:2".into()), None, None]
    );
    for (run, token, _) in &first {
        order.push(*run);
        complete(&mut c, &[(*run, *token)])?;
    }
    // A failed run keeps its key's place: the next waits for its retry.
    let second = claim(&mut c, 10)?;
    assert_eq!(second.len(), 1);
    let (run, token, _) = second[0];
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({run}, {token}, 'flaky')"),
    )?;
    assert!(claim(&mut c, 10)?.is_empty(), "cust:1's next waits");
    exec(&mut c, "SELECT tide.tick(now() + interval '1 hour')")?;
    let retried = claim(&mut c, 10)?;
    assert_eq!(retried[0].0, run);
    complete(&mut c, &[(run, retried[0].1)])?;
    order.push(run);
    let last = claim(&mut c, 10)?;
    complete(&mut c, &[(last[0].0, last[0].1)])?;
    order.push(last[0].0);
    let ns: String = one(
        &mut c,
        &format!(
            "SELECT string_agg(payload->>'n', ',' ORDER BY array_position(ARRAY{order:?}::bigint[], run_id))
               FROM tide.run WHERE event_key = 'cust:1'"
        ),
    )?;
    assert_eq!(ns, "1,2,4", "cust:1 in emit order");

    // A claim of one run is not left empty by a backlog behind a busy key: the blocked runs are
    // parked and the next claimable run is found.
    exec(
        &mut c,
        "SELECT tide.emit('order', jsonb_build_object('n', g), event_key => 'busy') FROM generate_series(1, 5) g;
         SELECT tide.emit('order', '{\"n\": 99}');",
    )?;
    let head = claim(&mut c, 1)?;
    assert_eq!(head[0].2.as_deref(), Some("busy"));
    let next = claim(&mut c, 1)?;
    assert_eq!(
        next.len(),
        1,
        "the keyless run behind the busy key's backlog"
    );
    let n: String = one(
        &mut c,
        &format!(
            "SELECT payload->>'n' FROM tide.run WHERE run_id = {}",
            next[0].0
        ),
    )?;
    assert_eq!(n, "99");
    let parked: i64 = one(&mut c, "SELECT count(*) FROM tide.pending WHERE parked")?;
    assert_eq!(parked, 4, "the busy key's other runs wait, parked");
    Ok(())
}

/// tide.emit_many: many events in one call, each as tide.emit would make it: one run per event
/// and subscribed task, keys in array order, dedupe keys honoured, bad input refused whole.
fn emit_many_emits_each_event_once(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("v_many")?;
    exec(
        &mut c,
        "SELECT tide.schedule('ship', NULL, topics => ARRAY['order']);
         SELECT tide.schedule('bill', NULL, topics => ARRAY['order']);",
    )?;
    let made: i32 = one(
        &mut c,
        r#"SELECT tide.emit_many('order',
               ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}', '{"n": 4}']::jsonb[],
               event_keys => ARRAY['cust:1', 'cust:1', NULL, 'cust:2'],
               dedupe_keys => ARRAY['o1', 'o2', 'o3', NULL])"#,
    )?;
    assert_eq!(made, 8, "4 events, 2 subscribed tasks");
    // Each task's runs, in run order: the events in array order, with their keys.
    let ship: String = one(
        &mut c,
        "SELECT string_agg(concat_ws('/', payload->>'n', event_key, dedupe_key LIKE '#%'), ' ' ORDER BY run_id)
           FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'ship'",
    )?;
    // (t: a dedupe key of pg_tide's own, #id, for the event given none.)
    assert_eq!(ship, "1/cust:1/f 2/cust:1/f 3/f 4/cust:2/t");
    // Emitting the same dedupe keys again creates nothing for them; the keyless event is new.
    let again: i32 = one(
        &mut c,
        r#"SELECT tide.emit_many('order', ARRAY['{"n": 1}', '{"n": 5}']::jsonb[], dedupe_keys => ARRAY['o1', NULL])"#,
    )?;
    assert_eq!(again, 2, "only the keyless event, for both tasks");
    // Runs of one key go one at a time, in array order: cust:1's first run is claimed, its
    // second waits.
    let claimed = claim(&mut c, 20)?;
    let keys: Vec<Option<String>> = claimed.iter().map(|r| r.2.clone()).collect();
    assert_eq!(
        keys.iter()
            .filter(|k| k.as_deref() == Some("cust:1"))
            .count(),
        2,
        "one cust:1 run per task: {keys:?}"
    );
    // Bad input: nothing is written.
    let before: i64 = one(&mut c, "SELECT count(*) FROM tide.run")?;
    let (code, message, hint) = refused(
        &mut c,
        r#"SELECT tide.emit_many('order', ARRAY['{"n": 1}', '{"n": 2}']::jsonb[], dedupe_keys => ARRAY['ok', '#mine'])"#,
    )?;
    assert_eq!(code, "22023");
    assert!(
        message.contains("element 2") && message.contains("'#mine'"),
        "{message}"
    );
    assert!(hint.contains("pg_tide's own"), "{hint}");
    let (code, message, _) = refused(
        &mut c,
        r#"SELECT tide.emit_many('order', ARRAY['{"n": 1}', '{"n": 2}']::jsonb[], event_keys => ARRAY['k'])"#,
    )?;
    assert_eq!(code, "22023");
    assert!(message.contains("event_keys has 1 elements"), "{message}");
    let (code, _, _) = refused(
        &mut c,
        "SELECT tide.emit_many('bad topic!', ARRAY['{}']::jsonb[])",
    )?;
    assert_eq!(code, "22023");
    // A topic is 1 to 100 characters: 101 and none are refused, 100 is a topic (none subscribes).
    for bad in ["repeat('t', 101)", "''"] {
        let (code, message, _) = refused(&mut c, &format!("SELECT tide.emit({bad})"))?;
        assert_eq!(code, "22023", "{bad}");
        assert!(message.contains("is not valid"), "{bad}: {message}");
    }
    let (code, _, _) = refused(&mut c, "SELECT tide.emit(NULL)")?;
    assert_eq!(code, "22004");
    let none: i32 = one(&mut c, "SELECT tide.emit(repeat('t', 100))")?;
    assert_eq!(none, 0, "a topic of 100 characters is valid");
    let after: i64 = one(&mut c, "SELECT count(*) FROM tide.run")?;
    assert_eq!(after, before, "refused calls write nothing");
    // An empty array is no events.
    let none: i32 = one(&mut c, "SELECT tide.emit_many('order', ARRAY[]::jsonb[])")?;
    assert_eq!(none, 0);
    Ok(())
}

/// SQL event runs of two keys, run by the two real executors: each run's end wakes the next
/// of its key at once. (A lost wake-up would leave the next run parked for pg_tide's park
/// time, a minute: longer than this test waits.)
fn sql_event_runs_go_one_after_another_per_key(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "DROP TABLE IF EXISTS keyed_done;
         CREATE TABLE keyed_done (seq bigint GENERATED ALWAYS AS IDENTITY, key text, n int);
         SELECT tide.schedule('keyed_sql', NULL, topics => ARRAY['keyed'], lock_key => 'keyed:{key}',
             command => $$INSERT INTO keyed_done (key, n) VALUES (tide.event_key(), (tide.payload()->>'n')::int)$$);
         SELECT tide.emit('keyed', jsonb_build_object('n', g), event_key => 'k' || (g % 2)) FROM generate_series(1, 200) g;",
    )?;
    wait_for(
        "200 keyed SQL runs to succeed",
        Duration::from_secs(40),
        || {
            let n: i64 = c
                .query_one(
                    "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id)
                      WHERE t.name = 'keyed_sql' AND r.state = 'succeeded'",
                    &[],
                )
                .map_err(|e| e.to_string())?
                .get(0);
            Ok((n == 200).then_some(()))
        },
    )?;
    let out_of_order: i64 = one(
        &mut c,
        "SELECT count(*) FROM (SELECT n < lag(n) OVER (PARTITION BY key ORDER BY seq) AS back FROM keyed_done) x WHERE back",
    )?;
    assert_eq!(out_of_order, 0, "each key's runs in emit order");
    let rows: i64 = one(&mut c, "SELECT count(*) FROM keyed_done")?;
    assert_eq!(rows, 200);
    Ok(())
}

fn emit_on_change_emits_inserts_and_updates(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("v_change")?;
    exec(
        &mut c,
        "CREATE TABLE orders (id int PRIMARY KEY, customer text, total int);
         SELECT tide.schedule('sync', NULL, topics => ARRAY['order.changed']);",
    )?;
    let name: String = one(
        &mut c,
        "SELECT tide.create_emit_trigger('orders', 'order.changed', 'customer')::text",
    )?;
    assert_eq!(name, "tide_emit_order_changed");
    exec(
        &mut c,
        "INSERT INTO orders VALUES (1, 'ann', 10);
         UPDATE orders SET total = 10 WHERE id = 1;  -- no change: no event
         UPDATE orders SET total = 12 WHERE id = 1;",
    )?;
    exec(
        &mut c,
        "BEGIN; INSERT INTO orders VALUES (2, 'bob', 5); ROLLBACK;",
    )?;
    let events: String = one(
        &mut c,
        "SELECT string_agg(payload->>'op' || ':' || event_key || ':' || (payload->'row'->>'total'), ',' ORDER BY run_id)
           FROM tide.run",
    )?;
    assert_eq!(events, "insert:ann:10,update:ann:12");
    let table: String = one(&mut c, "SELECT payload->>'table' FROM tide.run LIMIT 1")?;
    assert_eq!(table, "public.orders");
    let dropped: bool = one(
        &mut c,
        "SELECT tide.drop_emit_trigger('orders', 'order.changed')",
    )?;
    assert!(dropped);
    exec(&mut c, "INSERT INTO orders VALUES (3, 'cy', 1)")?;
    let runs: i64 = one(&mut c, "SELECT count(*) FROM tide.run")?;
    assert_eq!(runs, 2, "no trigger, no event");
    let again: bool = one(
        &mut c,
        "SELECT tide.drop_emit_trigger('orders', 'order.changed')",
    )?;
    assert!(!again);
    for (sql, code, needle) in [
        (
            "SELECT tide.create_emit_trigger('orders', 'x', 'nope')",
            "42703",
            "table public.orders has no column nope",
        ),
        (
            "SELECT tide.create_emit_trigger(NULL, 'x')",
            "22004",
            "table must not be NULL",
        ),
        (
            "SELECT tide.create_emit_trigger('orders', 'bad topic')",
            "22023",
            "topic 'bad topic' is not valid",
        ),
        (
            "SELECT tide.create_emit_trigger('missing', 'x')",
            "42P01",
            "missing",
        ),
        (
            "SELECT tide.drop_emit_trigger('orders', 'bad topic')",
            "22023",
            "topic 'bad topic' is not valid",
        ),
    ] {
        let (got, message, _) = refused(&mut c, sql)?;
        assert_eq!(got, code, "{sql}: {message}");
        assert!(message.contains(needle), "{sql}: {message}");
    }
    Ok(())
}

/// A long task in the real executors: batches of 5 items with a pause between, each item
/// counted by the batch that did it.
fn long_task_setup(c: &mut Client, task: &str, items: i32, extra: &str) -> Result<(), Failed> {
    exec(
        c,
        &format!(
            "DROP TABLE IF EXISTS {task}_items;
             CREATE TABLE {task}_items (i int PRIMARY KEY, times int NOT NULL DEFAULT 0);
             INSERT INTO {task}_items SELECT g FROM generate_series(1, {items}) g;
             CREATE OR REPLACE FUNCTION {task}_batch(ck jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
             DECLARE last int := coalesce((ck->>'last')::int, 0); n int;
             BEGIN
                 UPDATE {task}_items SET times = times + 1 WHERE i > last AND i <= last + 5;
                 GET DIAGNOSTICS n = ROW_COUNT;
                 RETURN CASE WHEN n = 0 THEN NULL ELSE jsonb_build_object('last', last + 5) END;
             END $$;
             SELECT tide.schedule('{task}', NULL, 'SELECT {task}_batch(tide.checkpoint())',
                                  topics => ARRAY['{task}'], long => true, timeout => '2 seconds',
                                  backoff_base => '100 ms', jitter => 'none'{extra});"
        ),
    )?;
    Ok(())
}

fn batches_done(c: &mut Client, run: i64) -> Result<i32, String> {
    c.query_one(
        &format!("SELECT batches FROM tide.run WHERE run_id = {run}"),
        &[],
    )
    .map(|r| r.get(0))
    .map_err(|e| e.to_string())
}

fn a_killed_long_task_resumes_from_its_checkpoint(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    long_task_setup(&mut c, "long_kill", 60, ", batch_pause => '150 ms'")?;
    exec(&mut c, "SELECT tide.emit('long_kill')")?;
    let run: i64 = one(
        &mut c,
        "SELECT r.run_id FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'long_kill'",
    )?;
    wait_for("three batches", Duration::from_secs(30), || {
        Ok((batches_done(&mut c, run)? >= 3).then_some(()))
    })?;
    // Kill every executor mid-way (SIGKILL: crash recovery restarts all sessions).
    cluster.kill_9("pg_tide executor")?;
    let mut c = cluster.connect(WORKERS_DB)?;
    let at_kill = batches_done(&mut c, run)?;
    assert!(at_kill < 12, "killed mid-way ({at_kill} batches)");
    wait_for("the run to finish", Duration::from_secs(60), || {
        Ok((state(&mut c, run)? == "succeeded").then_some(()))
    })?;
    let (items, once): (i64, i64) = c
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE times = 1) FROM long_kill_items",
            &[],
        )
        .map(|r| (r.get(0), r.get(1)))
        .map_err(db_err)?;
    assert_eq!((items, once), (60, 60), "every item done exactly once");
    let history: String = one(
        &mut c,
        &format!("SELECT string_agg(outcome::text, ',' ORDER BY attempt) FROM tide.attempt WHERE run_id = {run}"),
    )?;
    assert_eq!(
        history, "lost,succeeded",
        "the killed attempt was taken back"
    );
    let batches = batches_done(&mut c, run)?;
    assert_eq!(batches, 13, "12 batches of work and the last, empty one");
    Ok(())
}

fn long_runs_pause_resume_and_cancel_between_batches(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    long_task_setup(&mut c, "long_ctl", 100, ", batch_rate => 5")?;
    exec(&mut c, "SELECT tide.emit('long_ctl', dedupe_key => 'one')")?;
    let run: i64 = one(
        &mut c,
        "SELECT r.run_id FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'long_ctl'",
    )?;
    wait_for("a first batch", Duration::from_secs(30), || {
        Ok((batches_done(&mut c, run)? >= 1).then_some(()))
    })?;
    let asked: String = one(&mut c, &format!("SELECT tide.pause_run({run})"))?;
    assert_eq!(asked, "pausing");
    wait_for("the pause to be taken up", Duration::from_secs(30), || {
        Ok((state(&mut c, run)? == "paused").then_some(()))
    })?;
    let (done_items, batches, lease): (i64, i32, bool) = c
        .query_one(
            &format!(
                "SELECT (SELECT count(*) FROM long_ctl_items WHERE times = 1), r.batches, r.lease_expires_at IS NULL
                   FROM tide.run r WHERE r.run_id = {run}"
            ),
            &[],
        )
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .map_err(db_err)?;
    assert_eq!(done_items, i64::from(batches) * 5, "paused between batches");
    assert!(lease, "a paused run holds no lease");
    let checkpoint: i32 = one(
        &mut c,
        &format!("SELECT (checkpoint->>'last')::int FROM tide.run WHERE run_id = {run}"),
    )?;
    assert_eq!(checkpoint, batches * 5);
    let again: String = one(&mut c, &format!("SELECT tide.pause_run({run})"))?;
    assert_eq!(again, "paused");
    let explained: String = one(
        &mut c,
        &format!("SELECT string_agg(l, E'\\n') FROM tide.explain({run}) l"),
    )?;
    assert!(
        explained.contains(&format!("long run: {batches} batches done"))
            && explained.contains(&format!("next: paused until SELECT tide.resume_run({run})")),
        "{explained}"
    );
    let resumed: String = one(&mut c, &format!("SELECT tide.resume_run({run})"))?;
    assert_eq!(resumed, "ready");
    wait_for("the run to finish", Duration::from_secs(60), || {
        Ok((state(&mut c, run)? == "succeeded").then_some(()))
    })?;
    let once: i64 = one(
        &mut c,
        "SELECT count(*) FROM long_ctl_items WHERE times = 1",
    )?;
    assert_eq!(once, 100, "resumed from its checkpoint: nothing twice");

    // Cancel between batches: committed batches stay, the rest is never done.
    exec(
        &mut c,
        "UPDATE long_ctl_items SET times = 0; SELECT tide.emit('long_ctl', dedupe_key => 'two')",
    )?;
    let second: i64 = one(
        &mut c,
        "SELECT run_id FROM tide.run WHERE dedupe_key = 'two'",
    )?;
    wait_for("a first batch", Duration::from_secs(30), || {
        Ok((batches_done(&mut c, second)? >= 1).then_some(()))
    })?;
    let asked: String = one(
        &mut c,
        &format!("SELECT tide.cancel_run({second}, 'wrong data')"),
    )?;
    assert_eq!(asked, "cancelling");
    wait_for("the cancel to be taken up", Duration::from_secs(30), || {
        Ok((state(&mut c, second)? == "cancelled").then_some(()))
    })?;
    let (done_items, batches): (i64, i32) = c
        .query_one(
            &format!("SELECT (SELECT count(*) FROM long_ctl_items WHERE times = 1), batches FROM tide.run WHERE run_id = {second}"),
            &[],
        )
        .map(|r| (r.get(0), r.get(1)))
        .map_err(db_err)?;
    assert_eq!(done_items, i64::from(batches) * 5);
    assert!(done_items < 100);

    for (sql, code, needle) in [
        (
            format!("SELECT tide.resume_run({run})"),
            "55000",
            format!("run {run} is succeeded, not paused"),
        ),
        (
            format!("SELECT tide.pause_run({run})"),
            "55000",
            format!("run {run} is succeeded"),
        ),
        (
            format!("SELECT tide.cancel_run({run})"),
            "55000",
            format!("run {run} already ended (succeeded)"),
        ),
        (
            "SELECT tide.pause_run(NULL)".to_string(),
            "22004",
            "run_id must not be NULL".to_string(),
        ),
        (
            "SELECT tide.cancel_run(999999)".to_string(),
            "42704",
            "run 999999 does not exist".to_string(),
        ),
        (
            "SELECT tide.schedule('x', '@daily', long => true)".to_string(),
            "22023",
            "long => true needs an SQL command".to_string(),
        ),
        (
            "SELECT tide.schedule('x', '@daily', 'SELECT 1', batch_rate => 2)".to_string(),
            "22023",
            "batch_rate and batch_pause apply to long tasks only".to_string(),
        ),
        (
            "SELECT tide.schedule('x', '@daily', 'SELECT 1', long => true, batch_rate => 2, batch_pause => '1 s')"
                .to_string(),
            "22023",
            "pass batch_rate or batch_pause, not both".to_string(),
        ),
        (
            "SELECT tide.schedule('x', '@daily', 'SELECT 1', long => true, batch_rate => -1)".to_string(),
            "22023",
            "batch_rate must be between 0 and 10000".to_string(),
        ),
    ] {
        let (got, message, hint) = refused(&mut c, &sql)?;
        assert_eq!(got, code, "{sql}: {message}");
        assert!(message.contains(&needle), "{sql}: {message}");
        assert!(!hint.is_empty(), "{sql}");
    }
    Ok(())
}

/// The promise of R4.5 for an external worker's task: one window executed by two claimers
/// racing, by a worker whose lease expired while it was still working (and then finished), by a
/// replay and by a forced rerun leaves one ledger row and one delivered message.
fn an_external_task_run_many_ways_acts_once(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("v_once_ext")?;
    exec(
        &mut c,
        "CREATE TABLE ledger (biz_date date PRIMARY KEY, amount int NOT NULL);
         SELECT tide.schedule('bill', '0 1 * * *', backoff_base => '1 second', jitter => 'none');",
    )?;
    // The worker's work for a claimed run: an upsert keyed by the business date, and a message
    // deduplicated by it, committed together with the completion.
    let work = |c: &mut Client, run: i64, token: i64| -> Result<(), postgres::Error> {
        let mut tx = c.transaction()?;
        tx.batch_execute(&format!(
            "INSERT INTO ledger SELECT biz_date, 100 FROM tide.run WHERE run_id = {run}
               ON CONFLICT (biz_date) DO UPDATE SET amount = EXCLUDED.amount;
             SELECT tide.create_effect('sms', 'bill:' || biz_date) FROM tide.run WHERE run_id = {run};
             SELECT tide.complete_run({run}, {token});"
        ))?;
        tx.commit()
    };
    let run: i64 = one(
        &mut c,
        // (Two days back: yesterday's window ends at 01:00 today.)
        "SELECT tide.rerun('bill', biz_date => current_date - 2)",
    )?;
    // 1. Two claimers race: one gets it.
    let mut other = cluster.connect("v_once_ext")?;
    let a = claim(&mut c, 1)?;
    let b = claim(&mut other, 1)?;
    assert_eq!((a.len(), b.len()), (1, 0), "one claimer wins");
    // 2. Its lease expires while it still works; the run is taken back and claimed again.
    let slow_token = a[0].1;
    exec(&mut c, "SELECT tide.tick(now() + interval '1 hour')")?;
    exec(&mut c, "SELECT tide.tick(now() + interval '2 hours')")?;
    let fresh = claim(&mut other, 1)?;
    assert_eq!(fresh[0].0, run);
    work(&mut other, run, fresh[0].1).map_err(db_err)?;
    let late = work(&mut c, run, slow_token).expect_err("the slow worker is fenced");
    assert_eq!(late.code().map(|s| s.code()), Some("55000"));
    // 3. A replay and 4. a forced rerun of the succeeded window.
    exec(
        &mut c,
        &format!("SELECT tide.replay_run({run}, force => true)"),
    )?;
    let again = claim(&mut c, 1)?;
    work(&mut c, run, again[0].1).map_err(db_err)?;
    exec(
        &mut c,
        "SELECT tide.rerun('bill', biz_date => current_date - 2, force => true)",
    )?;
    let again = claim(&mut c, 1)?;
    work(&mut c, run, again[0].1).map_err(db_err)?;

    let ledger: String = one(
        &mut c,
        "SELECT string_agg(biz_date || '=' || amount, ',') FROM ledger",
    )?;
    let day: String = one(&mut c, "SELECT (current_date - 2)::text")?;
    assert_eq!(ledger, format!("{day}=100"), "as one execution leaves it");
    let successes: i64 = one(
        &mut c,
        &format!(
            "SELECT count(*) FROM tide.attempt WHERE run_id = {run} AND outcome = 'succeeded'"
        ),
    )?;
    assert_eq!(successes, 3, "it really ran three times");
    // Each message once: delivered by a delivery worker, never offered again.
    let offered: i64 = one(
        &mut c,
        "SELECT count(tide.complete_effect(effect_id, lease_token)) FROM tide.claim_effects('sms', n => 10)",
    )?;
    assert_eq!(offered, 1);
    let more: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.claim_effects('sms', n => 10)",
    )?;
    assert_eq!(more, 0);
    Ok(())
}

/// The same for an SQL command task in the real executors (two of them, claiming with SKIP
/// LOCKED): the first run, a forced replay and a forced rerun of the window, against one
/// execution of the same work elsewhere. (An SQL command cannot outlive its lease: the lease is
/// its statement timeout plus a margin.)
fn an_sql_task_run_many_ways_acts_once(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "DROP TABLE IF EXISTS once_ledger, once_reference;
         CREATE TABLE once_ledger (biz_date date PRIMARY KEY, amount int NOT NULL, runs int NOT NULL DEFAULT 1);
         CREATE TABLE once_reference (LIKE once_ledger INCLUDING ALL);
         CREATE OR REPLACE FUNCTION once_bill(target text, day date) RETURNS void LANGUAGE plpgsql AS $$
         BEGIN
             EXECUTE format('INSERT INTO %I (biz_date, amount) VALUES ($1, 100)
                             ON CONFLICT (biz_date) DO UPDATE SET amount = EXCLUDED.amount', target) USING day;
         END $$;
         SELECT tide.schedule('once_sql', '0 1 * * *',
             $$SELECT once_bill('once_ledger', tide.biz_date());
               SELECT tide.create_effect('once_sms', 'bill:' || tide.biz_date())$$,
             timeout => '1 second', backoff_base => '100 ms', jitter => 'none', max_attempts => 10);",
    )?;
    let run: i64 = one(
        &mut c,
        "SELECT tide.rerun('once_sql', biz_date => current_date - 2)",
    )?;
    let finished = |c: &mut Client, attempts: i64| -> Result<(), String> {
        wait_for("the run to succeed", Duration::from_secs(30), || {
            let (s, n): (String, i64) = c
                .query_one(
                    &format!("SELECT r.state::text, (SELECT count(*) FROM tide.attempt a WHERE a.run_id = r.run_id AND a.outcome = 'succeeded') FROM tide.run r WHERE r.run_id = {run}"),
                    &[],
                )
                .map(|r| (r.get(0), r.get(1)))
                .map_err(|e| e.to_string())?;
            Ok((s == "succeeded" && n == attempts).then_some(()))
        })
    };
    finished(&mut c, 1)?;
    exec(
        &mut c,
        &format!("SELECT tide.replay_run({run}, force => true)"),
    )?;
    finished(&mut c, 2)?;
    exec(
        &mut c,
        "SELECT tide.rerun('once_sql', biz_date => current_date - 2, force => true)",
    )?;
    finished(&mut c, 3)?;
    // One execution of the same work, for comparison.
    exec(
        &mut c,
        "SELECT once_bill('once_reference', current_date - 2)",
    )?;
    let differ: i64 = one(
        &mut c,
        "SELECT count(*) FROM ((TABLE once_ledger EXCEPT TABLE once_reference)
                                UNION ALL (TABLE once_reference EXCEPT TABLE once_ledger)) d",
    )?;
    assert_eq!(differ, 0, "three executions leave what one does");
    let messages: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.effect WHERE channel = 'once_sms'",
    )?;
    assert_eq!(messages, 1, "one message for the window");
    let delivered: i64 = one(
        &mut c,
        "SELECT count(tide.complete_effect(effect_id, lease_token)) FROM tide.claim_effects('once_sms', n => 10)",
    )?;
    assert_eq!(delivered, 1);
    assert_eq!(
        one::<i64>(
            &mut c,
            "SELECT count(*) FROM tide.claim_effects('once_sms', n => 10)"
        )?,
        0,
        "delivered once"
    );
    Ok(())
}

/// Waits until one of pg_tide's executors is inside pg_sleep (a command is running).
fn wait_for_a_sleeping_command(c: &mut Client) -> Result<(), Failed> {
    wait_for("a command to be running", Duration::from_secs(30), || {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide executor' AND wait_event = 'PgSleep'",
                &[],
            )
            .map_err(|e| e.to_string())?
            .get(0);
        Ok((n > 0).then_some(()))
    })?;
    Ok(())
}

/// Run control: cancelling a running SQL run interrupts its command (a 60-second pg_sleep
/// ends at once, the command's work is rolled back, the run ends cancelled with who and why);
/// pausing one interrupts it and puts it back in line when resumed; a later replay runs
/// normally. An external worker's run that completed although a cancel was asked leaves no
/// stale request behind: its forced replay is not cancelled at once.
fn running_sql_runs_are_cancelled_and_paused_at_once(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "DROP TABLE IF EXISTS slow_effects;
         CREATE TABLE slow_effects (run bigint, attempt int);
         CREATE OR REPLACE FUNCTION slow_first_attempt() RETURNS void LANGUAGE plpgsql AS $$
         DECLARE a int := (SELECT attempts FROM tide.run WHERE run_id = tide.run_id());
         BEGIN
             INSERT INTO slow_effects VALUES (tide.run_id(), a);
             IF a = 1 THEN PERFORM pg_sleep(60); END IF;
         END $$;
         SELECT tide.schedule('slow_sql', '0 1 * * *', biz_window => 'day', command => 'SELECT slow_first_attempt()',
                              timeout => '2 minutes');",
    )?;
    let effects = |c: &mut Client, run: i64| -> Result<String, Failed> {
        one(
            c,
            &format!("SELECT coalesce(string_agg(attempt::text, ','), '') FROM slow_effects WHERE run = {run}"),
        )
    };
    // Cancel.
    let run: i64 = one(
        &mut c,
        "SELECT tide.rerun('slow_sql', biz_date => current_date - 2)",
    )?;
    wait_for_a_sleeping_command(&mut c)?;
    let asked: String = one(
        &mut c,
        &format!("SELECT tide.cancel_run({run}, 'wrong day')"),
    )?;
    assert_eq!(asked, "cancelling");
    wait_for(
        "the command to be interrupted",
        Duration::from_secs(20),
        || Ok((state(&mut c, run)? == "cancelled").then_some(())),
    )?;
    let reason: String = one(
        &mut c,
        &format!("SELECT reason FROM tide.run WHERE run_id = {run}"),
    )?;
    assert_eq!(
        reason,
        "cancelled while running, its command interrupted and its work rolled back (cancel asked by postgres: wrong day)"
    );
    assert_eq!(
        effects(&mut c, run)?,
        "",
        "the command's work was rolled back"
    );
    // A replay runs normally (its second attempt does not sleep).
    exec(&mut c, &format!("SELECT tide.replay_run({run})"))?;
    wait_for("the replay", Duration::from_secs(30), || {
        Ok((state(&mut c, run)? == "succeeded").then_some(()))
    })?;
    assert_eq!(effects(&mut c, run)?, "2");

    // Pause: interrupted, paused; resumed, it runs again from the start.
    let run: i64 = one(
        &mut c,
        "SELECT tide.rerun('slow_sql', biz_date => current_date - 3)",
    )?;
    wait_for_a_sleeping_command(&mut c)?;
    let asked: String = one(&mut c, &format!("SELECT tide.pause_run({run})"))?;
    assert_eq!(asked, "pausing");
    wait_for(
        "the command to be interrupted",
        Duration::from_secs(20),
        || Ok((state(&mut c, run)? == "paused").then_some(())),
    )?;
    assert_eq!(effects(&mut c, run)?, "");
    let resumed: String = one(&mut c, &format!("SELECT tide.resume_run({run})"))?;
    assert_eq!(resumed, "ready");
    wait_for("the resumed run", Duration::from_secs(30), || {
        Ok((state(&mut c, run)? == "succeeded").then_some(()))
    })?;
    assert_eq!(effects(&mut c, run)?, "2");
    exec(&mut c, "SELECT tide.unschedule('slow_sql')")?;

    // An external run completed after a cancel was asked; its forced replay is not cancelled.
    let mut e = cluster.fresh_db("v_stale_cancel")?;
    exec(
        &mut e,
        "SELECT tide.schedule('ext_ctl', '0 1 * * *', queue => 'ctl')",
    )?;
    let run: i64 = one(
        &mut e,
        "SELECT tide.rerun('ext_ctl', biz_date => current_date - 2)",
    )?;
    let claim_token = |e: &mut Client| -> Result<i64, Failed> {
        one(e, "SELECT lease_token FROM tide.claim_runs('ctl')")
    };
    let token = claim_token(&mut e)?;
    let asked: String = one(&mut e, &format!("SELECT tide.cancel_run({run})"))?;
    assert_eq!(asked, "cancelling");
    exec(&mut e, &format!("SELECT tide.complete_run({run}, {token})"))?;
    exec(
        &mut e,
        &format!("SELECT tide.replay_run({run}, force => true)"),
    )?;
    let token = claim_token(&mut e)?;
    let still_held: bool = one(
        &mut e,
        &format!("SELECT tide.heartbeat_run({run}, {token}) IS NOT NULL"),
    )?;
    assert!(still_held, "the replay is not cancelled by the old request");
    Ok(())
}

/// R1.3: a long task never runs twice at once: two emits of it (no key) run one after the
/// other even with two executors free.
fn long_task_runs_go_one_at_a_time(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "DROP TABLE IF EXISTS long_spans;
         CREATE TABLE long_spans (run bigint, started timestamptz, ended timestamptz);
         CREATE OR REPLACE FUNCTION long_span_batch() RETURNS jsonb LANGUAGE plpgsql AS $$
         DECLARE t timestamptz := clock_timestamp();
         BEGIN
             PERFORM pg_sleep(1);
             INSERT INTO long_spans VALUES (tide.run_id(), t, clock_timestamp());
             RETURN NULL;
         END $$;
         SELECT tide.schedule('long_span', NULL, 'SELECT long_span_batch()', topics => ARRAY['long.span'],
                              long => true);
         SELECT tide.emit('long.span') + tide.emit('long.span');",
    )?;
    wait_for("both runs", Duration::from_secs(30), || {
        let n: i64 = c
            .query_one("SELECT count(*) FROM long_spans", &[])
            .map_err(|e| e.to_string())?
            .get(0);
        Ok((n == 2).then_some(()))
    })?;
    let overlapping: i64 = one(
        &mut c,
        "SELECT count(*) FROM long_spans a JOIN long_spans b
             ON a.run < b.run AND a.started < b.ended AND b.started < a.ended",
    )?;
    assert_eq!(overlapping, 0, "the two runs of the long task overlapped");
    exec(&mut c, "SELECT tide.unschedule('long_span')")?;
    Ok(())
}

/// R10.2: an event task with a fallback scan loses no event even when its emit was lost: 1,000
/// orders, 990 emitted by a trigger and 10 inserted with the trigger disabled; one scan makes
/// exactly 1,000 runs, each key once, and an events_lost alert names the 10. A scan that
/// finds nothing missing resolves it.
fn a_fallback_scan_finds_lost_events(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "DROP TABLE IF EXISTS fb_orders, fb_done;
         CREATE TABLE fb_orders (id int PRIMARY KEY, amount int NOT NULL);
         CREATE TABLE fb_done (key text, amount int);
         CREATE OR REPLACE FUNCTION fb_emit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM tide.emit('fb.order', jsonb_build_object('amount', NEW.amount), NEW.id::text, NEW.id::text);
             RETURN NULL;
         END $$;
         CREATE TRIGGER fb_emit AFTER INSERT ON fb_orders FOR EACH ROW EXECUTE FUNCTION fb_emit();
         SELECT tide.schedule('fb_orders', '0 0 1 1 *', topics => ARRAY['fb.order'],
             command => 'INSERT INTO fb_done VALUES (tide.event_key(), (tide.payload()->>''amount'')::int)',
             fallback => 'SELECT id::text AS key, jsonb_build_object(''amount'', amount) AS payload FROM fb_orders');
         INSERT INTO fb_orders SELECT g, g FROM generate_series(1, 990) g;
         ALTER TABLE fb_orders DISABLE TRIGGER fb_emit;
         INSERT INTO fb_orders SELECT g, g FROM generate_series(991, 1000) g;
         ALTER TABLE fb_orders ENABLE TRIGGER fb_emit;",
    )?;
    let scan: i64 = one(&mut c, "SELECT tide.rerun('fb_orders')")?;
    wait_for("the scan", Duration::from_secs(60), || {
        Ok((state(&mut c, scan)? == "succeeded").then_some(()))
    })?;
    let found: String = one(
        &mut c,
        &format!("SELECT result::text FROM tide.run WHERE run_id = {scan}"),
    )?;
    assert_eq!(
        found,
        r#"{"missing": 10, "scanned": 1000, "missing_keys": ["991", "992", "993", "994", "995", "996", "997", "998", "999", "1000"]}"#
    );
    wait_for("every order's run", Duration::from_secs(120), || {
        let n: i64 = c
            .query_one("SELECT count(*) FROM fb_done", &[])
            .map_err(|e| e.to_string())?
            .get(0);
        Ok((n >= 1000).then_some(()))
    })?;
    let (runs, keys, done, right): (i64, i64, i64, bool) = c
        .query_one(
            "SELECT (SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id)
                      WHERE t.name = 'fb_orders' AND r.window_start IS NULL),
                    (SELECT count(DISTINCT r.event_key) FROM tide.run r JOIN tide.task t USING (task_id)
                      WHERE t.name = 'fb_orders' AND r.window_start IS NULL),
                    (SELECT count(*) FROM fb_done),
                    (SELECT bool_and(d.amount = o.amount) FROM fb_done d JOIN fb_orders o ON o.id::text = d.key)",
            &[],
        )
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .map_err(db_err)?;
    assert_eq!((runs, keys, done, right), (1000, 1000, 1000, true));
    let alert = |c: &mut Client| -> Result<Option<String>, String> {
        c.query_opt(
            "SELECT details->>'keys' FROM tide.alert
              WHERE subject = 'fb_orders' AND kind = 'events_lost' AND resolved_at IS NULL",
            &[],
        )
        .map(|r| r.map(|r| r.get(0)))
        .map_err(|e| e.to_string())
    };
    let keys = wait_for("the events_lost alert", Duration::from_secs(60), || {
        alert(&mut c)
    })?;
    assert_eq!(
        keys,
        r#"["991", "992", "993", "994", "995", "996", "997", "998", "999", "1000"]"#
    );
    // The next scan finds nothing missing: the alert resolves.
    exec(
        &mut c,
        &format!("SELECT tide.replay_run({scan}, force => true)"),
    )?;
    wait_for("the alert to resolve", Duration::from_secs(60), || {
        Ok(alert(&mut c)?.is_none().then_some(()))
    })?;
    let rescan: String = one(
        &mut c,
        &format!("SELECT result->>'missing' FROM tide.run WHERE run_id = {scan}"),
    )?;
    assert_eq!(rescan, "0");
    // A fallback needs an event task with a schedule.
    let (code, message, hint) = refused(
        &mut c,
        "SELECT tide.schedule('fb_bad', '0 1 * * *', command => 'SELECT 1', fallback => 'SELECT 1 AS key')",
    )?;
    assert_eq!(
        (code.as_str(), message.as_str()),
        (
            "22023",
            "task \"fb_bad\": a fallback scan needs an event task (topics) with a schedule, not long or top_level"
        )
    );
    assert!(hint.contains("fallback =>"), "{hint}");
    exec(&mut c, "SELECT tide.unschedule('fb_orders')")?;
    Ok(())
}

/// A fallback scan's keys become dedupe keys of event runs: a key starting with # (pg_tide's
/// own, the keys of events emitted without one) is refused, so that no emitted event is ever
/// mistaken for a key the scan found. The scan is a business failure (dead at once) that names
/// the rule, and it creates nothing.
fn a_fallback_key_of_pg_tides_own_is_refused(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "SELECT tide.schedule('fb_hash', '0 0 1 1 *', topics => ARRAY['fb.hash'], command => 'SELECT 1',
             fallback => 'SELECT k AS key FROM (VALUES (''a''), (''#1'')) v(k)')",
    )?;
    let scan: i64 = one(&mut c, "SELECT tide.rerun('fb_hash')")?;
    wait_for("the scan to end", Duration::from_secs(60), || {
        let s = state(&mut c, scan)?;
        Ok((s != "ready" && s != "running").then_some(s))
    })
    .and_then(|s| {
        (s == "dead")
            .then_some(())
            .ok_or(format!("the scan ended {s}"))
    })?;
    let (error, kind, events): (String, String, i64) = c
        .query_one(
            &format!(
                "SELECT last_error, last_error_kind::text,
                        (SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id)
                          WHERE t.name = 'fb_hash' AND r.window_start IS NULL)
                   FROM tide.run WHERE run_id = {scan}"
            ),
            &[],
        )
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .map_err(db_err)?;
    assert!(error.contains("not starting with #"), "{error}");
    assert_eq!((kind.as_str(), events), ("business", 0));
    exec(&mut c, "SELECT tide.unschedule('fb_hash')")?;
    Ok(())
}

fn main() {
    let tests: &[(&str, TestFn)] = &[
        (
            "emit_many_emits_each_event_once",
            emit_many_emits_each_event_once,
        ),
        (
            "running_sql_runs_are_cancelled_and_paused_at_once",
            running_sql_runs_are_cancelled_and_paused_at_once,
        ),
        (
            "long_task_runs_go_one_at_a_time",
            long_task_runs_go_one_at_a_time,
        ),
        (
            "a_fallback_scan_finds_lost_events",
            a_fallback_scan_finds_lost_events,
        ),
        (
            "a_fallback_key_of_pg_tides_own_is_refused",
            a_fallback_key_of_pg_tides_own_is_refused,
        ),
        (
            "emit_creates_runs_in_the_callers_transaction",
            emit_creates_runs_in_the_callers_transaction,
        ),
        (
            "runs_of_one_key_go_in_emit_order",
            runs_of_one_key_go_in_emit_order,
        ),
        (
            "sql_event_runs_go_one_after_another_per_key",
            sql_event_runs_go_one_after_another_per_key,
        ),
        (
            "emit_on_change_emits_inserts_and_updates",
            emit_on_change_emits_inserts_and_updates,
        ),
        (
            "a_killed_long_task_resumes_from_its_checkpoint",
            a_killed_long_task_resumes_from_its_checkpoint,
        ),
        (
            "long_runs_pause_resume_and_cancel_between_batches",
            long_runs_pause_resume_and_cancel_between_batches,
        ),
        (
            "an_external_task_run_many_ways_acts_once",
            an_external_task_run_many_ways_acts_once,
        ),
        (
            "an_sql_task_run_many_ways_acts_once",
            an_sql_task_run_many_ways_acts_once,
        ),
    ];
    run_tests("events", tests)
}

//! Backfills on a real cluster (R9, R4.6, R14.1): `tide.backfill` runs every window of a range
//! once, through the one idempotency key; modes missing, failed and all (+force); forward and
//! backward; pause, resume, cancel; a precheck that writes or is false creates nothing; a false
//! verify stops after the canary; a failing sample leaves needs_review; max_failures pauses; the
//! runs go to the backfill's own queue below online work; a succeeded window whose run was
//! pruned is still refused without force. With the real executors: a 30-day backfill writes one
//! effect per date, online runs keep running beside it, and kill -9 of an executor or a server
//! restart mid-backfill still ends with every window done once. Bad input is refused with
//! 22023, the value named and a hint, and writes nothing.

use std::time::Duration;

use pg_tide_pg_test::{
    claim, complete, db_err, describe, exec, one, refused, run_tests, tick, wait_for, Client,
    Cluster, Failed, TestFn,
};

/// An external daily task (its runs are claimed by the test) whose windows are the days before
/// today, UTC; its windows may run side by side (with overlap queue, the default, a task's
/// windows go one at a time, a backfill's too).
fn daily_external(c: &mut Client, name: &str) -> Result<(), Failed> {
    exec(
        c,
        &format!("SELECT tide.schedule('{name}', '0 3 * * *', overlap => 'allow')"),
    )
}

/// A date `n` days before today, as SQL.
fn ago(n: i32) -> String {
    format!("(current_date - {n})")
}

/// Runs one window by hand and ends it: `succeeded` or `dead` (a business error).
fn run_date(c: &mut Client, task: &str, days_ago: i32, outcome: &str) -> Result<(), Failed> {
    let run: i64 = one(
        c,
        &format!("SELECT tide.rerun('{task}', biz_date => {})", ago(days_ago)),
    )?;
    let token: i64 = one(
        c,
        &format!("SELECT lease_token FROM tide.claim_runs('default', 'w', 1) WHERE run_id = {run}"),
    )?;
    match outcome {
        "succeeded" => exec(c, &format!("SELECT tide.complete_run({run}, {token})")),
        _ => exec(
            c,
            &format!("SELECT tide.fail_run({run}, {token}, 'broken', 'business')"),
        ),
    }
}

fn status(c: &mut Client, id: i64) -> Result<(String, i32, i32, i32), Failed> {
    let row = c
        .query_one(
            "SELECT state, windows_total, windows_done, windows_failed FROM tide.backfill_status WHERE backfill_id = $1",
            &[&id],
        )
        .map_err(db_err)?;
    Ok((row.get(0), row.get(1), row.get(2), row.get(3)))
}

/// The business dates a backfill plans, in release order, as days ago.
fn planned(c: &mut Client, id: i64) -> Result<Vec<i32>, Failed> {
    Ok(c
        .query(
            "SELECT (current_date - biz_date)::int FROM tide.backfill_window WHERE backfill_id = $1 ORDER BY seq",
            &[&id],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

fn modes_choose_the_windows(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("bf_modes")?;
    daily_external(&mut c, "import")?;
    // Days 7..2 ago: 7 and 5 succeeded, 6 dead, 4 and 3 and 2 never ran.
    run_date(&mut c, "import", 7, "succeeded")?;
    run_date(&mut c, "import", 6, "dead")?;
    run_date(&mut c, "import", 5, "succeeded")?;
    let range = format!("{}, {}", ago(7), ago(2));
    let failed: i64 = one(
        &mut c,
        &format!("SELECT tide.backfill('import', {range}, mode => 'failed', canary => 0)"),
    )?;
    assert_eq!(
        planned(&mut c, failed)?,
        vec![6],
        "failed: the dead window only"
    );
    // Cancelled, its reopened run is cancelled too (a cancelled window counts as failed).
    exec(&mut c, &format!("SELECT tide.cancel_backfill({failed})"))?;
    let missing: i64 = one(
        &mut c,
        &format!("SELECT tide.backfill('import', {range}, canary => 0, batch => 100)"),
    )?;
    assert_eq!(
        planned(&mut c, missing)?,
        vec![6, 4, 3, 2],
        "missing: the cancelled window and those never run"
    );
    exec(&mut c, &format!("SELECT tide.cancel_backfill({missing})"))?;
    let (code, message, hint) = refused(
        &mut c,
        &format!("SELECT tide.backfill('import', {range}, mode => 'all')"),
    )?;
    assert_eq!(code, "22023");
    assert!(
        message.contains("'all'") && hint.contains("force => true"),
        "{message} / {hint}"
    );
    let all: i64 = one(
        &mut c,
        &format!("SELECT tide.backfill('import', {range}, mode => 'all', force => true, canary => 0, batch => 100, \"order\" => 'backward')"),
    )?;
    assert_eq!(
        planned(&mut c, all)?,
        vec![2, 3, 4, 5, 6, 7],
        "all, newest first"
    );
    // Its runs: trigger backfill, in the backfill's queue, below every online run; the window
    // that had a run was reopened, not duplicated.
    let runs: i64 = one(&mut c, "SELECT count(*) FROM tide.run")?;
    assert_eq!(runs, 6, "one run per window");
    let line: String = one(
        &mut c,
        "SELECT string_agg(DISTINCT trigger || ' ' || queue || ' ' || priority, ',') FROM tide.run
          WHERE state = 'ready'",
    )?;
    assert_eq!(line, format!("backfill backfill.{all} -10000"));
    assert!(
        claim(&mut c, "default", 10, "")?.is_empty(),
        "online workers see no backfill run"
    );
    // concurrency 1: one at a time from its queue.
    let first = claim(&mut c, &format!("backfill.{all}"), 10, "")?;
    assert_eq!(first.len(), 1, "concurrency 1");
    let story: String = one(
        &mut c,
        &format!(
            "SELECT string_agg(l, E'\\n') FROM tide.explain({}) l",
            first[0].0
        ),
    )?;
    assert!(
        story.contains(&format!("backfill {all} (")) && story.contains(" of 6, in queue backfill."),
        "explain names the backfill: {story}"
    );
    complete(&mut c, &first)?;
    for _ in 0..5 {
        let next = claim(&mut c, &format!("backfill.{all}"), 10, "")?;
        assert_eq!(next.len(), 1);
        complete(&mut c, &next)?;
    }
    tick(&mut c, "now()")?;
    let (state, total, done, failed_n) = status(&mut c, all)?;
    assert_eq!((state.as_str(), total, done, failed_n), ("done", 6, 6, 0));
    // Its queue went with it.
    let queues: i64 = one(&mut c, "SELECT count(*) FROM tide.queue")?;
    assert_eq!(queues, 0);
    // version: a dead run created under version 1 is reopened under its own rules (original)
    // or the task's rules now (current).
    run_date(&mut c, "import", 9, "dead")?;
    exec(&mut c, "SELECT tide.alter('import', args => '{\"v\": 2}')")?;
    let range9 = format!("{}, {}", ago(9), ago(9));
    let original: i64 = one(&mut c, &format!("SELECT tide.backfill('import', {range9}, mode => 'failed', version => 'original', canary => 0)"))?;
    let v: String = one(&mut c, &format!("SELECT r.version || ' ' || r.args::text FROM tide.run r JOIN tide.backfill_window w USING (run_id) WHERE w.backfill_id = {original}"))?;
    assert_eq!(v, "1 {}");
    exec(&mut c, &format!("SELECT tide.cancel_backfill({original})"))?;
    let current: i64 = one(&mut c, &format!("SELECT tide.backfill('import', {range9}, mode => 'failed', version => 'current', canary => 0)"))?;
    let v: String = one(&mut c, &format!("SELECT r.version || ' ' || r.args::text FROM tide.run r JOIN tide.backfill_window w USING (run_id) WHERE w.backfill_id = {current}"))?;
    assert_eq!(v, "2 {\"v\": 2}");
    // Every change of state is recorded with its reason.
    let history: String = one(
        &mut c,
        &format!("SELECT string_agg(coalesce(from_state, '-') || '>' || to_state, ' ' ORDER BY event_id) FROM tide.backfill_event WHERE backfill_id = {all}"),
    )?;
    assert_eq!(history, "->running running>done");
    Ok(())
}

fn pause_resume_cancel(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("bf_pause")?;
    daily_external(&mut c, "sync")?;
    let id: i64 = one(
        &mut c,
        &format!(
            "SELECT tide.backfill('sync', {}, {}, canary => 0, batch => 2, concurrency => 2)",
            ago(11),
            ago(2)
        ),
    )?;
    let queue = format!("backfill.{id}");
    let first = claim(&mut c, &queue, 10, "")?;
    assert_eq!(first.len(), 2, "a batch of 2");
    let state: String = one(&mut c, &format!("SELECT tide.pause_backfill({id})"))?;
    assert_eq!(state, "paused");
    complete(&mut c, &first)?;
    tick(&mut c, "now()")?;
    assert!(
        claim(&mut c, &queue, 10, "")?.is_empty(),
        "paused: nothing starts"
    );
    let (state, _, done, _) = status(&mut c, id)?;
    assert_eq!(
        (state.as_str(), done),
        ("paused", 2),
        "running windows finished"
    );
    let state: String = one(&mut c, &format!("SELECT tide.resume_backfill({id})"))?;
    assert_eq!(state, "running");
    let eta: bool = one(
        &mut c,
        &format!("SELECT rate > 0 AND eta > interval '0' FROM tide.backfill_status WHERE backfill_id = {id}"),
    )?;
    assert!(eta, "a backfill going on shows its rate and ETA");
    let second = claim(&mut c, &queue, 10, "")?;
    assert_eq!(second.len(), 2, "the next batch after resume");
    complete(&mut c, &second[..1])?;
    let state: String = one(&mut c, &format!("SELECT tide.cancel_backfill({id})"))?;
    assert_eq!(state, "cancelled");
    // The running window finishes; the rest is cancelled and recorded.
    complete(&mut c, &second[1..])?;
    tick(&mut c, "now()")?;
    let counts: String = one(
        &mut c,
        &format!("SELECT windows_done || '/' || windows_cancelled || '/' || windows_total FROM tide.backfill_status WHERE backfill_id = {id}"),
    )?;
    assert_eq!(counts, "4/6/10");
    let never: i64 = one(&mut c, &format!("SELECT count(*) FROM tide.run WHERE queue = '{queue}' AND state NOT IN ('succeeded', 'cancelled')"))?;
    assert_eq!(never, 0);
    let (code, _, hint) = refused(&mut c, &format!("SELECT tide.pause_backfill({id})"))?;
    assert_eq!(code, "55000");
    assert!(!hint.is_empty());
    // Another role sees none of it and may not touch it.
    exec(
        &mut c,
        "DROP ROLE IF EXISTS bf_mallory; CREATE ROLE bf_mallory LOGIN",
    )?;
    let mut mallory = cluster.connect_as("bf_pause", "bf_mallory")?;
    let seen: i64 = one(&mut mallory, "SELECT count(*) FROM tide.backfill_status")?;
    assert_eq!(seen, 0);
    let (code, _, _) = refused(&mut mallory, &format!("SELECT tide.cancel_backfill({id})"))?;
    assert_eq!(code, "42704");
    // A task unscheduled in the middle of a backfill takes it along, and its queue goes.
    daily_external(&mut c, "gone")?;
    let gone: i64 = one(
        &mut c,
        &format!(
            "SELECT tide.backfill('gone', {}, {}, canary => 0)",
            ago(5),
            ago(2)
        ),
    )?;
    exec(&mut c, "SELECT tide.unschedule('gone')")?;
    tick(&mut c, "now()")?;
    let left: i64 = one(
        &mut c,
        &format!("SELECT (SELECT count(*) FROM tide.backfill WHERE backfill_id = {gone}) + (SELECT count(*) FROM tide.queue WHERE name = 'backfill.{gone}')"),
    )?;
    assert_eq!(left, 0);
    Ok(())
}

fn precheck_guards_the_start(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("bf_precheck")?;
    daily_external(&mut c, "load")?;
    exec(&mut c, "CREATE TABLE source_rows (d date); INSERT INTO source_rows SELECT current_date - g FROM generate_series(1, 40) g;")?;
    let range = format!("{}, {}", ago(10), ago(2));
    // A precheck that tries to write.
    exec(&mut c, "CREATE FUNCTION sneaky() RETURNS boolean LANGUAGE sql AS $$ INSERT INTO source_rows VALUES (NULL); SELECT true $$")?;
    let writes: i64 = one(
        &mut c,
        &format!("SELECT tide.backfill('load', {range}, precheck => 'sneaky()')"),
    )?;
    let (state, reason): (String, String) = c
        .query_one(
            "SELECT state, reason FROM tide.backfill_status WHERE backfill_id = $1",
            &[&writes],
        )
        .map(|r| (r.get(0), r.get(1)))
        .map_err(db_err)?;
    assert_eq!(state, "precheck_failed");
    assert!(reason.contains("tried to write"), "{reason}");
    // False, and an error, end the same way; nothing is created.
    let false_id: i64 = one(&mut c, &format!("SELECT tide.backfill('load', {range}, precheck => '(SELECT count(*) > 1000 FROM source_rows)')"))?;
    let failing: i64 = one(
        &mut c,
        &format!("SELECT tide.backfill('load', {range}, precheck => '(SELECT 1/0 = 1)')"),
    )?;
    let reasons: String = one(
        &mut c,
        &format!("SELECT string_agg(state || ': ' || reason, ' | ' ORDER BY backfill_id) FROM tide.backfill_status WHERE backfill_id IN ({false_id}, {failing})"),
    )?;
    assert!(
        reasons.contains("precheck_failed: precheck failed: the precheck returned false")
            && reasons.contains("(22012)"),
        "{reasons}"
    );
    let made: String = one(&mut c, "SELECT (SELECT count(*) FROM tide.run) || '/' || (SELECT count(*) FROM tide.backfill_window) || '/' || (SELECT count(*) FROM source_rows)")?;
    assert_eq!(made, "0/0/40", "no run, no window, no write");
    // A precheck that holds starts the backfill.
    let ok: i64 = one(&mut c, &format!("SELECT tide.backfill('load', {range}, precheck => '(SELECT count(*) = 40 FROM source_rows)')"))?;
    let (state, total, _, _) = status(&mut c, ok)?;
    assert_eq!((state.as_str(), total), ("canary", 9));
    Ok(())
}

/// Runs every run of a backfill's queue to success (as an external worker would), ticking
/// between rounds, until the backfill stops releasing windows; the executors' verify step is
/// called directly (this database has no executors).
fn drive(c: &mut Client, id: i64) -> Result<String, Failed> {
    for _ in 0..50 {
        let got = claim(c, &format!("backfill.{id}"), 100, "")?;
        complete(c, &got)?;
        tick(c, "now()")?;
        exec(c, "SELECT tide._backfill_work()")?;
        let state: String = one(
            c,
            &format!("SELECT state FROM tide.backfill WHERE backfill_id = {id}"),
        )?;
        if got.is_empty() && !["canary", "running", "sampling"].contains(&state.as_str()) {
            return Ok(state);
        }
    }
    Err("the backfill did not end".into())
}

fn canary_and_sample_verify(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("bf_verify")?;
    daily_external(&mut c, "bill")?;
    let range = format!("{}, {}", ago(9), ago(2));
    // A verify that is false for the canary window: nothing else runs.
    let stopped: i64 = one(
        &mut c,
        &format!(
            "SELECT tide.backfill('bill', {range}, canary => 1, verify => 'tide.biz_date() <> {}')",
            ago(9)
        ),
    )?;
    let state = drive(&mut c, stopped)?;
    assert_eq!(state, "verify_failed");
    let (reason, runs): (String, i64) = c
        .query_one(
            "SELECT b.reason, (SELECT count(*) FROM tide.run) FROM tide.backfill_status b WHERE backfill_id = $1",
            &[&stopped],
        )
        .map(|r| (r.get(0), r.get(1)))
        .map_err(db_err)?;
    assert!(
        reason.contains("verify failed for 1 of 1 canary windows")
            && reason.contains("returned false"),
        "{reason}"
    );
    assert_eq!(runs, 1, "only the canary ran");
    exec(&mut c, "SELECT tide.tick(now() + interval '1 minute')")?;
    let alert: String = one(
        &mut c,
        &format!("SELECT kind || ' ' || subject_type FROM tide.alert WHERE subject = '{stopped}' AND resolved_at IS NULL"),
    )?;
    assert_eq!(alert, "backfill backfill");
    // A verify true for the canary but false for one later window, with every window sampled.
    let sampled: i64 = one(
        &mut c,
        &format!(
            "SELECT tide.backfill('bill', {range}, canary => 1, verify => 'tide.biz_date() <> {}', sample => 100, batch => 3)",
            ago(4)
        ),
    )?;
    let state = drive(&mut c, sampled)?;
    assert_eq!(state, "needs_review");
    let reason: String = one(
        &mut c,
        &format!("SELECT reason FROM tide.backfill_status WHERE backfill_id = {sampled}"),
    )?;
    assert!(
        reason.contains("sample check failed for 1 of 7 windows"),
        "{reason}"
    );
    exec(&mut c, "SELECT tide.tick(now() + interval '2 minutes')")?;
    let open: i64 = one(
        &mut c,
        &format!("SELECT count(*) FROM tide.alert WHERE subject = '{sampled}' AND kind = 'backfill' AND resolved_at IS NULL"),
    )?;
    assert_eq!(open, 1);
    // A person accepts it: done, and the alert resolves.
    let state: String = one(&mut c, &format!("SELECT tide.resume_backfill({sampled})"))?;
    assert_eq!(state, "done");
    exec(&mut c, "SELECT tide.tick(now() + interval '3 minutes')")?;
    let open: i64 = one(
        &mut c,
        &format!(
            "SELECT count(*) FROM tide.alert WHERE subject = '{sampled}' AND resolved_at IS NULL"
        ),
    )?;
    assert_eq!(open, 0);
    // A verify that tries to write fails like a false one.
    let writes: i64 = one(
        &mut c,
        &format!("SELECT tide.backfill('bill', {range}, mode => 'all', force => true, canary => 1, verify => $$(SELECT nextval('tide.job_seq') > 0)$$)"),
    )?;
    assert_eq!(drive(&mut c, writes)?, "verify_failed");
    Ok(())
}

fn max_failures_pauses(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("bf_failures")?;
    exec(
        &mut c,
        "SELECT tide.schedule('push', '0 3 * * *', max_attempts => 1, overlap => 'allow')",
    )?;
    let id: i64 = one(
        &mut c,
        &format!("SELECT tide.backfill('push', {}, {}, canary => 0, batch => 5, concurrency => 5, max_failures => 1)", ago(12), ago(2)),
    )?;
    let got = claim(&mut c, &format!("backfill.{id}"), 10, "")?;
    assert_eq!(got.len(), 5);
    for (run, token) in &got[..2] {
        exec(
            &mut c,
            &format!("SELECT tide.fail_run({run}, {token}, 'downstream 503', 'transient')"),
        )?;
    }
    complete(&mut c, &got[2..])?;
    exec(&mut c, "SELECT tide.tick(now() + interval '1 minute')")?;
    let (state, _, done, failed) = status(&mut c, id)?;
    assert_eq!(
        (state.as_str(), done, failed),
        ("paused", 3, 2),
        "2 failures > max_failures 1"
    );
    assert!(
        claim(&mut c, &format!("backfill.{id}"), 10, "")?.is_empty(),
        "no next batch"
    );
    let alert: i64 = one(&mut c, &format!("SELECT count(*) FROM tide.alert WHERE subject = '{id}' AND kind = 'backfill' AND resolved_at IS NULL"))?;
    assert_eq!(alert, 1);
    // Resumed, it counts failures anew.
    let state: String = one(&mut c, &format!("SELECT tide.resume_backfill({id})"))?;
    assert_eq!(state, "running");
    let next = claim(&mut c, &format!("backfill.{id}"), 10, "")?;
    assert_eq!(next.len(), 5);
    Ok(())
}

fn pruned_success_is_remembered(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("bf_pruned")?;
    daily_external(&mut c, "ledger")?;
    for d in (2..=14).rev() {
        run_date(&mut c, "ledger", d, "succeeded")?;
    }
    // 40 days on (the task paused: no new windows), with 30 days of history: all but the
    // latest 10 runs go.
    exec(
        &mut c,
        "SELECT tide.pause('ledger'); SELECT tide.tick(now() + interval '40 days')",
    )?;
    let left: i64 = one(&mut c, "SELECT count(*) FROM tide.run")?;
    assert_eq!(left, 10, "the latest 10 runs are kept");
    let (code, message, hint) = refused(
        &mut c,
        &format!("SELECT tide.rerun('ledger', biz_date => {})", ago(14)),
    )?;
    assert_eq!(code, "55000");
    assert!(
        message.contains("already succeeded") && hint.contains("force => true"),
        "{message} / {hint}"
    );
    let none: i64 = one(
        &mut c,
        &format!(
            "SELECT tide.backfill('ledger', {}, {}, canary => 0)",
            ago(14),
            ago(2)
        ),
    )?;
    let (state, total, _, _) = status(&mut c, none)?;
    assert_eq!((state.as_str(), total), ("done", 0), "nothing missing");
    let forced: i64 = one(
        &mut c,
        &format!(
            "SELECT tide.rerun('ledger', biz_date => {}, force => true)",
            ago(14)
        ),
    )?;
    assert!(forced > 0);
    let ranges: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.succeeded_window, unnest(windows) r",
    )?;
    assert_eq!(ranges, 1, "consecutive windows are one range");
    Ok(())
}

fn bad_input_is_refused(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("bf_bad")?;
    daily_external(&mut c, "daily")?;
    exec(
        &mut c,
        "SELECT tide.schedule('events_only', NULL, topics => ARRAY['x'])",
    )?;
    let cases = [
        (
            format!("SELECT tide.backfill('daily', {}, {})", ago(2), ago(9)),
            "22023",
            "before from_date",
        ),
        (
            format!("SELECT tide.backfill('nope', {}, {})", ago(9), ago(2)),
            "42704",
            "\"nope\" does not exist",
        ),
        (
            "SELECT tide.backfill('daily', '2000-01-01', '2026-01-01')".to_string(),
            "22023",
            "days after from_date",
        ),
        (
            format!(
                "SELECT tide.backfill('daily', {}, {}, pause => '-1 minute')",
                ago(9),
                ago(2)
            ),
            "22023",
            "pause",
        ),
        (
            format!(
                "SELECT tide.backfill('daily', {}, {}, precheck => '(SELECT 1)')",
                ago(9),
                ago(2)
            ),
            "22023",
            "not an SQL boolean",
        ),
        (
            format!(
                "SELECT tide.backfill('daily', {}, {}, verify => 'count(*')",
                ago(9),
                ago(2)
            ),
            "22023",
            "not an SQL boolean",
        ),
        (
            format!(
                "SELECT tide.backfill('daily', {}, {}, mode => 'some')",
                ago(9),
                ago(2)
            ),
            "22023",
            "unknown mode 'some'",
        ),
        (
            format!(
                "SELECT tide.backfill('daily', {}, {}, concurrency => 0)",
                ago(9),
                ago(2)
            ),
            "22023",
            "got 0",
        ),
        (
            format!(
                "SELECT tide.backfill('daily', {}, {}, pause => '1 minute', rate => 1)",
                ago(9),
                ago(2)
            ),
            "22023",
            "not both",
        ),
        (
            format!(
                "SELECT tide.backfill('daily', {}, {}, \"order\" => 'sideways')",
                ago(9),
                ago(2)
            ),
            "22023",
            "'sideways'",
        ),
        (
            "SELECT tide.backfill('daily', current_date + 5, current_date + 9)".to_string(),
            "22023",
            "has ended",
        ),
        (
            "SELECT tide.backfill('daily', NULL, current_date)".to_string(),
            "22004",
            "from_date",
        ),
        (
            "SELECT tide.create_queue('backfill.1')".to_string(),
            "22023",
            "reserved",
        ),
        (
            "SELECT tide.backfill('events_only', current_date - 9, current_date - 2)".to_string(),
            "22023",
            "has no schedule",
        ),
        (
            "SELECT tide.pause_backfill(NULL)".to_string(),
            "22004",
            "backfill_id",
        ),
        (
            "SELECT tide.resume_backfill(424242)".to_string(),
            "42704",
            "backfill 424242 does not exist",
        ),
        (
            "SELECT tide.cancel_backfill(424242)".to_string(),
            "42704",
            "backfill 424242 does not exist",
        ),
    ];
    for (sql, want, text) in cases {
        let (code, message, hint) = refused(&mut c, &sql)?;
        assert_eq!(code, want, "{sql}: {message}");
        assert!(message.contains(text), "{sql}: {message}");
        assert!(!hint.is_empty(), "{sql}: no hint");
    }
    let written: i64 = one(&mut c, "SELECT (SELECT count(*) FROM tide.backfill) + (SELECT count(*) FROM tide.run) + (SELECT count(*) FROM tide.queue)")?;
    assert_eq!(written, 0, "nothing written");
    Ok(())
}

fn a_held_run_waits_for_the_next_round(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("bf_held")?;
    daily_external(&mut c, "held")?;
    run_date(&mut c, "held", 3, "dead")?;
    let run: i64 = one(&mut c, "SELECT run_id FROM tide.run")?;
    // The owner's open transaction holds the dead run (replaying it): the backfill's release
    // does not wait on it beyond a moment; the window stays planned.
    let mut other = cluster.connect("bf_held")?;
    exec(
        &mut other,
        &format!("BEGIN; SELECT tide.replay_run({run});"),
    )?;
    let id: i64 = one(
        &mut c,
        &format!(
            "SELECT tide.backfill('held', {}, {}, mode => 'failed', canary => 0)",
            ago(3),
            ago(3)
        ),
    )?;
    let state: String = one(
        &mut c,
        &format!("SELECT state FROM tide.backfill_window WHERE backfill_id = {id}"),
    )?;
    assert_eq!(state, "planned");
    exec(&mut other, "ROLLBACK")?;
    tick(&mut c, "now()")?;
    let state: String = one(&mut c, &format!("SELECT w.state || ' ' || r.trigger FROM tide.backfill_window w JOIN tide.run r USING (run_id) WHERE w.backfill_id = {id}"))?;
    assert_eq!(state, "released backfill", "released at the next round");
    Ok(())
}

fn deferred_window_scan(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("bf_rescan")?;
    exec(
        &mut c,
        "SELECT tide.schedule('scan', '0 3 * * *', rescan_previous => true, max_attempts => 1, overlap => 'allow');
         SELECT tide.schedule('plain', '0 3 * * *', max_attempts => 1, overlap => 'allow');",
    )?;
    // The window before the next fire's window died out of transient retries.
    let mut dead = |task: &str| -> Result<i64, Failed> {
        let run: i64 = one(
            &mut c,
            &format!("SELECT tide.rerun('{task}', biz_date => (SELECT (next_fire_at AT TIME ZONE 'UTC')::date - 2 FROM tide.task WHERE name = '{task}'))"),
        )?;
        let token: i64 = one(
            &mut c,
            &format!(
                "SELECT lease_token FROM tide.claim_runs('default', 'w', 5) WHERE run_id = {run}"
            ),
        )?;
        exec(
            &mut c,
            &format!(
                "SELECT tide.fail_run({run}, {token}, 'timeout talking to the bank', 'transient')"
            ),
        )?;
        Ok(run)
    };
    let scanned = dead("scan")?;
    let plain = dead("plain")?;
    exec(
        &mut c,
        "SELECT tide.tick((SELECT max(next_fire_at) FROM tide.task))",
    )?;
    let after: String = one(
        &mut c,
        &format!("SELECT string_agg(run_id || ':' || state || ':' || trigger || ':' || left(reason, 20), ',' ORDER BY run_id) FROM tide.run WHERE run_id IN ({scanned}, {plain})"),
    )?;
    assert_eq!(
        after,
        format!("{scanned}:ready:catch_up:deferred window scan,{plain}:dead:manual:gave up after 1 of 1"),
        "only the task with rescan_previous reopens its previous window"
    );
    // Once: dead again, the next fire leaves it dead.
    let token: i64 = one(
        &mut c,
        &format!(
            "SELECT lease_token FROM tide.claim_runs('default', 'w', 5) WHERE run_id = {scanned}"
        ),
    )?;
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({scanned}, {token}, 'still down', 'transient')"),
    )?;
    exec(
        &mut c,
        "SELECT tide.tick((SELECT max(next_fire_at) FROM tide.task))",
    )?;
    let state: String = one(
        &mut c,
        &format!("SELECT state::text FROM tide.run WHERE run_id = {scanned}"),
    )?;
    assert_eq!(state, "dead");
    Ok(())
}

/// Waits until a backfill reaches `want` (any end state stops the wait).
fn wait_backfill(c: &mut Client, id: i64, want: &str, within: Duration) -> Result<(), Failed> {
    let got = wait_for(&format!("backfill {id} to be {want}"), within, || {
        let state: String = c
            .query_one(
                "SELECT state FROM tide.backfill WHERE backfill_id = $1",
                &[&id],
            )
            .map_err(|e| describe(&e))?
            .get(0);
        Ok((state == want
            || [
                "done",
                "verify_failed",
                "needs_review",
                "cancelled",
                "precheck_failed",
            ]
            .contains(&state.as_str()))
        .then_some(state))
    })?;
    assert_eq!(got, want, "backfill {id}");
    Ok(())
}

fn count_of(c: &mut Client, sql: &str) -> Result<i64, String> {
    c.query_one(sql, &[])
        .map(|r| r.get(0))
        .map_err(|e| describe(&e))
}

fn workers_thirty_days_one_effect_each(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "CREATE TABLE bf_effects (d date NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
         SELECT tide.schedule('bf_daily', '0 3 * * *', overlap => 'allow',
                              command => $$INSERT INTO bf_effects (d) SELECT tide.biz_date() FROM pg_sleep(0.05)$$);",
    )?;
    let id: i64 = one(
        &mut c,
        "SELECT tide.backfill('bf_daily', current_date - 31, current_date - 2, concurrency => 2, batch => 10,
                              verify => '(SELECT count(*) = 1 FROM bf_effects WHERE d = tide.biz_date())')",
    )?;
    wait_backfill(&mut c, id, "done", Duration::from_secs(120))?;
    let effects: String = one(
        &mut c,
        "SELECT count(*) || ' ' || count(DISTINCT d) || ' ' || (min(d) = current_date - 31) || ' ' || (max(d) = current_date - 2) FROM bf_effects",
    )?;
    assert_eq!(effects, "30 30 true true", "one effect per date");
    let runs: String = one(
        &mut c,
        "SELECT count(*) || ' ' || string_agg(DISTINCT trigger || ':' || state, ',') FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'bf_daily'",
    )?;
    assert_eq!(runs, "30 backfill:succeeded");
    let history: String = one(
        &mut c,
        &format!("SELECT string_agg(coalesce(from_state, '-') || '>' || to_state, ' ' ORDER BY event_id) FROM tide.backfill_event WHERE backfill_id = {id}"),
    )?;
    assert_eq!(
        history,
        "->canary canary>running running>sampling sampling>done"
    );
    let verified: i64 = one(
        &mut c,
        &format!("SELECT count(*) FROM tide.backfill_window WHERE backfill_id = {id} AND verified"),
    )?;
    assert_eq!(verified, 4, "the canary and a sample of 3 verified");
    // Run again (mode missing): nothing left to do.
    let again: i64 = one(
        &mut c,
        "SELECT tide.backfill('bf_daily', current_date - 31, current_date - 2)",
    )?;
    let state: String = one(&mut c, &format!("SELECT state || ' ' || windows_total FROM tide.backfill_status WHERE backfill_id = {again}"))?;
    assert_eq!(state, "done 0");
    Ok(())
}

fn workers_online_runs_go_first(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "CREATE TABLE bf_slow (d date);
         CREATE TABLE bf_online (n int, at timestamptz DEFAULT clock_timestamp());
         SELECT tide.schedule('bf_slow_task', '0 3 * * *', overlap => 'allow',
                              command => $$INSERT INTO bf_slow SELECT tide.biz_date() FROM pg_sleep(0.4)$$);
         SELECT tide.schedule('bf_online_task', NULL, topics => ARRAY['bf_unused'],
                              command => $$INSERT INTO bf_online (n) VALUES ((tide.args()->>'n')::int)$$);",
    )?;
    let id: i64 = one(
        &mut c,
        "SELECT tide.backfill('bf_slow_task', current_date - 41, current_date - 2, concurrency => 4, batch => 40, canary => 0)",
    )?;
    wait_for(
        "the backfill to start running windows",
        Duration::from_secs(30),
        || Ok((count_of(&mut c, "SELECT count(*) FROM bf_slow")? > 0).then_some(())),
    )?;
    exec(
        &mut c,
        "SELECT count(*) FROM tide.enqueue('bf_online_task', (SELECT jsonb_agg(jsonb_build_object('n', g)) FROM generate_series(1, 5) g))",
    )?;
    // Meanwhile the backfill never holds every executor: with 2 executors, at most one of its
    // runs at a time (its concurrency is 4).
    let mut most = 0;
    wait_for("the online runs", Duration::from_secs(30), || {
        most = most.max(count_of(
            &mut c,
            &format!(
                "SELECT count(*) FROM tide.run WHERE queue = 'backfill.{id}' AND state = 'running'"
            ),
        )?);
        Ok((count_of(&mut c, "SELECT count(*) FROM bf_online")? == 5).then_some(()))
    })?;
    assert!(most <= 1, "{most} backfill runs at once with 2 executors");
    let left: i64 = one(&mut c, "SELECT 40 - count(*) FROM bf_slow")?;
    assert!(
        left > 10,
        "the online runs ran while the backfill went on ({left} windows left)"
    );
    // Cancelled while the executors claim its runs: nothing waits on anything (the not-started
    // runs are cancelled in the claims' lock order), the running one finishes, its queue goes.
    exec(&mut c, &format!("SELECT tide.cancel_backfill({id})"))?;
    wait_for(
        "the cancelled backfill to settle",
        Duration::from_secs(30),
        || {
            let open = count_of(
                &mut c,
                &format!(
                "SELECT (SELECT windows_in_line FROM tide.backfill_status WHERE backfill_id = {id})
                      + (SELECT count(*) FROM tide.queue WHERE name = 'backfill.{id}')"
            ),
            )?;
            Ok((open == 0).then_some(()))
        },
    )?;
    let ended: String = one(
        &mut c,
        &format!("SELECT string_agg(DISTINCT r.state::text, ',' ORDER BY r.state::text) FROM tide.run r WHERE r.queue = 'backfill.{id}'"),
    )?;
    assert_eq!(
        ended, "cancelled,succeeded",
        "run or cancelled, nothing left in line"
    );
    Ok(())
}

fn workers_long_task_waits_without_an_executor(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "CREATE TABLE bf_batches (d date, n int);
         SELECT tide.schedule('bf_long', '0 3 * * *', long => true, batch_pause => '3 seconds',
             command => $$WITH done AS (INSERT INTO bf_batches
                                         VALUES (tide.biz_date(), coalesce((tide.checkpoint()->>'n')::int, 0)))
                          SELECT CASE WHEN coalesce((tide.checkpoint()->>'n')::int, 0) < 2
                                      THEN jsonb_build_object('n', coalesce((tide.checkpoint()->>'n')::int, 0) + 1) END$$);",
    )?;
    let id: i64 = one(
        &mut c,
        "SELECT tide.backfill('bf_long', current_date - 2, current_date - 2, canary => 0)",
    )?;
    // Between batches the run waits in line: no executor holds it.
    let reason = wait_for(
        "the run to wait between batches",
        Duration::from_secs(30),
        || {
            let row = c
                .query_opt(
                    "SELECT r.reason FROM tide.run r JOIN tide.task t USING (task_id)
                  WHERE t.name = 'bf_long' AND r.state = 'waiting'",
                    &[],
                )
                .map_err(|e| describe(&e))?;
            Ok(row.map(|r| r.get::<_, String>(0)))
        },
    )?;
    assert!(reason.starts_with("between batches: 1 done"), "{reason}");
    wait_backfill(&mut c, id, "done", Duration::from_secs(60))?;
    let batches: String = one(
        &mut c,
        "SELECT string_agg(n::text, ',' ORDER BY n) FROM bf_batches",
    )?;
    assert_eq!(batches, "0,1,2", "each batch once, from its checkpoint");
    let run: String = one(
        &mut c,
        "SELECT r.batches || ' ' || r.tries || ' ' || r.trigger FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'bf_long'",
    )?;
    assert_eq!(
        run, "3 1 backfill",
        "the waits between batches are not tries"
    );
    Ok(())
}

fn workers_kill_9_and_restart_mid_backfill(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "CREATE TABLE bf_crash (d date NOT NULL);
         SELECT tide.schedule('bf_crash_task', '0 3 * * *', overlap => 'allow', backoff_base => '1 second',
                              command => $$INSERT INTO bf_crash SELECT tide.biz_date() FROM pg_sleep(0.3)$$);",
    )?;
    let id: i64 = one(
        &mut c,
        "SELECT tide.backfill('bf_crash_task', current_date - 21, current_date - 2, batch => 5, canary => 0)",
    )?;
    wait_for("a few windows", Duration::from_secs(60), || {
        Ok((count_of(&mut c, "SELECT count(*) FROM bf_crash")? >= 3).then_some(()))
    })?;
    cluster.kill_9("pg_tide executor")?;
    let mut c = cluster.workers_db()?;
    wait_for(
        "more windows after kill -9",
        Duration::from_secs(60),
        || Ok((count_of(&mut c, "SELECT count(*) FROM bf_crash")? >= 8).then_some(())),
    )?;
    cluster.restart()?;
    let mut c = cluster.workers_db()?;
    wait_backfill(&mut c, id, "done", Duration::from_secs(180))?;
    let effects: String = one(
        &mut c,
        "SELECT count(*) || ' ' || count(DISTINCT d) FROM bf_crash",
    )?;
    assert_eq!(effects, "20 20", "every window done once");
    let status: String = one(
        &mut c,
        &format!("SELECT windows_done || '/' || windows_total FROM tide.backfill_status WHERE backfill_id = {id}"),
    )?;
    assert_eq!(status, "20/20");
    Ok(())
}

/// R9.2 measured: a backfill with `pause` releases each batch only once the one before it has
/// ended and the pause has passed; one with `rate` starts its windows no faster than the rate.
fn workers_pause_and_rate_space_the_backfill(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "CREATE TABLE bf_spaced (d date);
         SELECT tide.schedule('bf_spaced', '0 3 * * *', overlap => 'allow',
                              command => $$INSERT INTO bf_spaced SELECT tide.biz_date()$$);",
    )?;
    // Six windows in batches of two, two seconds between one batch's end and the next.
    let id: i64 = one(
        &mut c,
        "SELECT tide.backfill('bf_spaced', current_date - 7, current_date - 2, concurrency => 2, batch => 2,
                              pause => '2 seconds', canary => 0)",
    )?;
    wait_backfill(&mut c, id, "done", Duration::from_secs(120))?;
    let batches: Vec<(f64, f64)> = c
        .query(
            "SELECT extract(epoch FROM min(w.released_at))::float8, extract(epoch FROM max(w.finished_at))::float8
               FROM tide.backfill_window w WHERE w.backfill_id = $1
              GROUP BY (w.seq - 1) / 2 ORDER BY (w.seq - 1) / 2",
            &[&id],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(batches.len(), 3, "{batches:?}");
    for pair in batches.windows(2) {
        let (ended, next) = (pair[0].1, pair[1].0);
        assert!(
            next - ended >= 2.0,
            "a batch released {:.3} s after the previous one ended, before its pause of 2 s: {batches:?}",
            next - ended
        );
    }
    let together: i64 = one(
        &mut c,
        &format!(
            "SELECT count(*) FROM (SELECT (seq - 1) / 2 FROM tide.backfill_window WHERE backfill_id = {id}
                                    GROUP BY 1 HAVING count(DISTINCT released_at) > 1) x"
        ),
    )?;
    assert_eq!(together, 0, "the windows of a batch are released together");

    // Five windows released at once, started at most 2 a second.
    let id: i64 = one(
        &mut c,
        "SELECT tide.backfill('bf_spaced', current_date - 14, current_date - 10, concurrency => 5, batch => 10,
                              rate => 2, canary => 0)",
    )?;
    wait_backfill(&mut c, id, "done", Duration::from_secs(120))?;
    let starts: Vec<f64> = c
        .query(
            "SELECT extract(epoch FROM r.started_at)::float8 FROM tide.backfill_window w JOIN tide.run r USING (run_id)
              WHERE w.backfill_id = $1 ORDER BY r.started_at",
            &[&id],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(starts.len(), 5);
    // The queue's token bucket holds one second's worth (2 starts) and refills at 2 a second:
    // the k-th start (k from 1) comes (k - 2) / 2 seconds after the first at the earliest (a
    // tenth allowed for the instants the bucket and the claim read), so five take 1.5 s.
    for (k, at) in starts.iter().enumerate().map(|(i, at)| (i + 1, at)) {
        let earliest = (k as f64 - 2.0).max(0.0) / 2.0;
        assert!(
            at - starts[0] >= earliest * 0.9,
            "start {k} came {:.3} s after the first, before {earliest:.1} s: faster than 2 a second: {starts:?}",
            at - starts[0]
        );
    }
    exec(
        &mut c,
        "SELECT tide.unschedule('bf_spaced'); DROP TABLE bf_spaced;",
    )?;
    Ok(())
}

fn main() {
    let tests: &[(&str, TestFn)] = &[
        ("modes_choose_the_windows", modes_choose_the_windows),
        ("pause_resume_cancel", pause_resume_cancel),
        ("precheck_guards_the_start", precheck_guards_the_start),
        ("canary_and_sample_verify", canary_and_sample_verify),
        ("max_failures_pauses", max_failures_pauses),
        ("pruned_success_is_remembered", pruned_success_is_remembered),
        ("bad_input_is_refused", bad_input_is_refused),
        ("deferred_window_scan", deferred_window_scan),
        (
            "a_held_run_waits_for_the_next_round",
            a_held_run_waits_for_the_next_round,
        ),
        (
            "workers_thirty_days_one_effect_each",
            workers_thirty_days_one_effect_each,
        ),
        ("workers_online_runs_go_first", workers_online_runs_go_first),
        (
            "workers_long_task_waits_without_an_executor",
            workers_long_task_waits_without_an_executor,
        ),
        (
            "workers_pause_and_rate_space_the_backfill",
            workers_pause_and_rate_space_the_backfill,
        ),
        (
            "workers_kill_9_and_restart_mid_backfill",
            workers_kill_9_and_restart_mid_backfill,
        ),
    ];
    run_tests("backfill", tests)
}

//! Guarantees on a real cluster. Deduplicated side effects: `tide.create_effect` records a message once
//! per dedupe key in the caller's transaction, however often the work reruns; delivery workers
//! take them by channel under fenced leases; failed deliveries back off and end dead; an SQL
//! command's sends survive a forced rerun as one message. Steps: a retry or rerun skips the
//! steps already done and gets their output, for external workers (fenced by the lease token)
//! and inside SQL commands.

use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;

use pg_tide_pg_test::{
    db_err, exec, one, refused, run_state, run_tests, wait_for, Client, Cluster, Failed, TestFn,
};

fn claim(c: &mut Client, channel: &str) -> Result<Option<(i64, i64, String)>, Failed> {
    Ok(c
        .query_opt(
            &format!("SELECT effect_id, lease_token, dedupe_key FROM tide.claim_effects('{channel}', worker => 'sender', n => 1)"),
            &[],
        )
        .map_err(db_err)?
        .map(|r| (r.get(0), r.get(1), r.get(2))))
}

/// Runs one window of a command task with the real executors, then again on purpose (a forced
/// replay). `rerun_seen` is a boolean query that turns true once the second run's work is in.
fn run_then_force_rerun(
    c: &mut Client,
    task: &str,
    days_ago: i32,
    rerun_seen: &str,
) -> Result<i64, Failed> {
    let run: i64 = one(
        c,
        &format!("SELECT tide.rerun('{task}', biz_date => current_date - {days_ago})"),
    )?;
    wait_for("the first run to succeed", Duration::from_secs(30), || {
        Ok((run_state(c, run)? == "succeeded").then_some(()))
    })?;
    exec(c, &format!("SELECT tide.replay_run({run}, force => true)"))?;
    wait_for(
        "the forced rerun to succeed",
        Duration::from_secs(30),
        || {
            let seen: bool = c
                .query_one(rerun_seen, &[])
                .map(|r| r.get(0))
                .map_err(|e| e.to_string())?;
            Ok((seen && run_state(c, run)? == "succeeded").then_some(()))
        },
    )?;
    Ok(run)
}

fn sends_are_recorded_once_per_key(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("e_once")?;
    let first: i64 = one(
        &mut c,
        "SELECT tide.create_effect('sms', 'invoice:7:reminder', '{\"to\": \"+1555\"}')",
    )?;
    let again: i64 = one(
        &mut c,
        "SELECT tide.create_effect('sms', 'invoice:7:reminder', '{\"to\": \"+1556\"}')",
    )?;
    assert_eq!(
        again, first,
        "recorded once; the second call returns the same effect"
    );
    // A rolled-back transaction records nothing.
    exec(
        &mut c,
        "BEGIN; SELECT tide.create_effect('sms', 'invoice:8:reminder'); ROLLBACK;",
    )?;
    let keys: String = one(
        &mut c,
        "SELECT string_agg(dedupe_key || '@' || channel || '/' || state, ',') FROM tide.effect",
    )?;
    assert_eq!(keys, "invoice:7:reminder@sms/pending");
    let kept: String = one(&mut c, "SELECT payload->>'to' FROM tide.effect")?;
    assert_eq!(kept, "+1555", "the repeated call wrote nothing");
    // Another role's identical key is its own message (keys are per owner).
    exec(&mut c, "DROP ROLE IF EXISTS carol; CREATE ROLE carol LOGIN")?;
    let mut carol = cluster.connect_as("e_once", "carol")?;
    let theirs: i64 = one(
        &mut carol,
        "SELECT tide.create_effect('sms', 'invoice:7:reminder')",
    )?;
    assert_ne!(theirs, first, "carol's key is her own effect");
    let seen: i64 = one(&mut carol, "SELECT count(*) FROM tide.effect")?;
    assert_eq!(seen, 1, "carol sees only her own");

    for (sql, code, needle) in [
        (
            "SELECT tide.create_effect('bad channel', 'k')",
            "22023",
            "'bad channel'",
        ),
        ("SELECT tide.create_effect(NULL, 'k')", "22023", "NULL"),
        (
            "SELECT tide.create_effect('sms', ' ')",
            "22023",
            "dedupe_key must not be empty",
        ),
        (
            "SELECT tide.create_effect('sms', NULL)",
            "22004",
            "dedupe_key must not be empty, got NULL",
        ),
        (
            "SELECT tide.create_effect('sms', 'k', NULL)",
            "22023",
            "payload must not be NULL",
        ),
        (
            "SELECT tide.create_effect('sms', 'k', max_attempts => 0)",
            "22023",
            "got 0",
        ),
        ("SELECT tide.claim_effects('sms', n => 0)", "22023", "got 0"),
        (
            "SELECT tide.claim_effects('bad channel')",
            "22023",
            "'bad channel'",
        ),
        (
            "SELECT tide.claim_effects('sms', lease => '0 seconds')",
            "22023",
            "lease must be an interval of 1 second to 30 days, got 0 seconds",
        ),
        (
            "SELECT tide.complete_effect(-1, 1)",
            "42704",
            "no side effect -1",
        ),
        (
            "SELECT tide.fail_effect(1, 1, NULL)",
            "22004",
            "error must not be NULL",
        ),
        ("SELECT tide.replay_effect(1)", "55000", "is not dead"),
    ] {
        let (got, message, hint) = refused(&mut c, sql)?;
        assert_eq!(got, code, "{sql}: {message}");
        assert!(message.contains(needle), "{sql}: {message}");
        assert!(!hint.is_empty(), "{sql}: no hint");
    }
    let rows: i64 = one(&mut c, "SELECT count(*) FROM tide.effect")?;
    assert_eq!(rows, 2, "refused calls write nothing");
    Ok(())
}

fn delivery_is_fenced_and_never_repeated_once_delivered(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("e_fence")?;
    let mut listener = cluster.connect("e_fence")?;
    exec(&mut listener, "LISTEN pg_tide_effect")?;
    exec(
        &mut c,
        "SELECT tide.create_effect('push', 'order:1:shipped', '{\"order\": 1}')",
    )?;
    let note = listener
        .notifications()
        .timeout_iter(Duration::from_secs(10))
        .next()
        .map_err(db_err)?
        .ok_or("no NOTIFY pg_tide_effect within 10 s")?;
    // A hint with no name in it: a channel's name is its owner's, and any role may LISTEN.
    assert_eq!(note.payload(), "");

    let (id, first, key) = claim(&mut c, "push")?.ok_or("nothing to deliver")?;
    assert_eq!(key, "order:1:shipped");
    // No lease given (NULL, the default): held for one minute.
    let held: f64 = one(
        &mut c,
        &format!("SELECT extract(epoch FROM lease_expires_at - now())::float8 FROM tide.effect WHERE effect_id = {id}"),
    )?;
    assert!((30.0..=60.0).contains(&held), "held for {held} s");
    assert!(
        claim(&mut c, "push")?.is_none(),
        "a message is handed to one worker at a time"
    );
    // The worker stalls past its lease: the tick hands the message out again, same key.
    exec(&mut c, "SELECT tide.tick(now() + interval '2 minutes')")?;
    let (again, second, key2) = claim(&mut c, "push")?.ok_or("not handed out again")?;
    assert_eq!((again, key2.as_str()), (id, "order:1:shipped"));
    assert!(second > first, "a new, larger fencing token");
    // The first worker comes back: fenced out, nothing changes.
    let (code, message, _) = refused(
        &mut c,
        &format!("SELECT tide.complete_effect({id}, {first})"),
    )?;
    assert_eq!(code, "55000", "{message}");
    let state: String = one(
        &mut c,
        &format!("SELECT state::text FROM tide.effect WHERE effect_id = {id}"),
    )?;
    assert_eq!(state, "sending");
    exec(
        &mut c,
        &format!("SELECT tide.complete_effect({id}, {second})"),
    )?;
    // Delivered: never handed out again, whatever the tick does.
    exec(&mut c, "SELECT tide.tick(now() + interval '1 hour')")?;
    assert!(claim(&mut c, "push")?.is_none());
    let (attempts, state): (i32, String) = {
        let row = c
            .query_one(
                &format!("SELECT attempts, state::text FROM tide.effect WHERE effect_id = {id}"),
                &[],
            )
            .map_err(db_err)?;
        (row.get(0), row.get(1))
    };
    assert_eq!((attempts, state.as_str()), (2, "delivered"));
    Ok(())
}

fn failed_deliveries_back_off_then_die(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("e_retry")?;
    exec(
        &mut c,
        "SELECT tide.create_effect('mail', 'welcome:9', max_attempts => 2)",
    )?;
    let (id, token, _) = claim(&mut c, "mail")?.ok_or("nothing to deliver")?;
    let state: String = one(
        &mut c,
        &format!("SELECT tide.fail_effect({id}, {token}, 'provider answered 503')::text"),
    )?;
    assert_eq!(state, "pending");
    // Full jitter: the first retry comes within 10 s.
    let wait: f64 = one(
        &mut c,
        &format!("SELECT extract(epoch FROM available_at - now())::float8 FROM tide.effect WHERE effect_id = {id}"),
    )?;
    assert!((0.0..=10.0).contains(&wait), "retry after {wait} s");
    let token = wait_for("the retry to come due", Duration::from_secs(15), || {
        let mut c2 = cluster.connect("e_retry")?;
        Ok(claim(&mut c2, "mail")
            .map_err(|e| format!("{e:?}"))?
            .map(|(_, t, _)| t))
    })?;
    let state: String = one(
        &mut c,
        &format!("SELECT tide.fail_effect({id}, {token}, 'provider answered 503')::text"),
    )?;
    assert_eq!(state, "dead", "two attempts allowed");
    assert!(claim(&mut c, "mail")?.is_none());
    // A person puts it back; a permanent error kills it at once.
    exec(&mut c, &format!("SELECT tide.replay_effect({id})"))?;
    let (_, token, _) = claim(&mut c, "mail")?.ok_or("not redelivered")?;
    // A kind that means nothing for a delivery is refused, and the effect stays held.
    let (code, message, hint) = refused(
        &mut c,
        &format!("SELECT tide.fail_effect({id}, {token}, 'x', kind => 'permanent')"),
    )?;
    assert_eq!(code, "22023", "{message}");
    assert!(message.contains("'permanent'"), "{message}");
    assert!(hint.contains("business"), "{hint}");
    let state: String = one(
        &mut c,
        &format!("SELECT state::text FROM tide.effect WHERE effect_id = {id}"),
    )?;
    assert_eq!(state, "sending", "a refused fail_effect changes nothing");
    let state: String = one(
        &mut c,
        &format!(
            "SELECT tide.fail_effect({id}, {token}, 'no such mailbox', kind => 'business')::text"
        ),
    )?;
    assert_eq!(state, "dead");
    let error: String = one(
        &mut c,
        &format!("SELECT last_error FROM tide.effect WHERE effect_id = {id}"),
    )?;
    assert_eq!(error, "no such mailbox");
    // The kind is spelled as tide.fail_run takes it: any case, spaces around.
    exec(&mut c, "SELECT tide.create_effect('mail', 'welcome:10')")?;
    let (other, token, _) = claim(&mut c, "mail")?.ok_or("nothing to deliver")?;
    let state: String = one(
        &mut c,
        &format!("SELECT tide.fail_effect({other}, {token}, 'no such mailbox', kind => ' Business ')::text"),
    )?;
    assert_eq!(state, "dead");
    Ok(())
}

fn a_command_rerun_sends_once(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "CREATE TABLE IF NOT EXISTS e_statements (biz_date date PRIMARY KEY, made int NOT NULL DEFAULT 1);
         SELECT tide.schedule('e_statement', '0 1 * * *', biz_window => 'day', command => $$
             INSERT INTO e_statements (biz_date) VALUES (tide.biz_date())
                 ON CONFLICT (biz_date) DO UPDATE SET made = e_statements.made + 1;
             SELECT tide.create_effect('mail', 'statement:' || tide.biz_date(), jsonb_build_object('day', tide.biz_date()))
         $$);",
    )?;
    // The business table sees the rerun (made = 2); the message does not.
    let run = run_then_force_rerun(
        &mut c,
        "e_statement",
        3,
        "SELECT made = 2 FROM e_statements",
    )?;
    let effects: String = one(
        &mut c,
        "SELECT string_agg(dedupe_key || ' run ' || run_id, ',') FROM tide.effect WHERE channel = 'mail'",
    )?;
    assert_eq!(
        effects,
        format!("statement:{} run {run}", {
            let d: String = one(&mut c, "SELECT (current_date - 3)::text")?;
            d
        })
    );
    Ok(())
}

fn steps_done_are_skipped_by_retries_and_reruns(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("g_steps")?;
    exec(
        &mut c,
        "SELECT tide.schedule('etl', '0 0 1 1 *', max_attempts => 3, backoff_base => '1 second')",
    )?;
    let run: i64 = one(
        &mut c,
        "SELECT tide.rerun('etl', window_start => (date_trunc('year', now() AT TIME ZONE 'UTC') - interval '1 year') AT TIME ZONE 'UTC')",
    )?;
    let claim_run = |c: &mut Client| -> Result<i64, Failed> {
        let row = c
            .query_one(
                "SELECT run_id, lease_token FROM tide.claim_runs(worker => 'w1')",
                &[],
            )
            .map_err(db_err)?;
        assert_eq!(row.get::<_, i64>(0), run);
        Ok(row.get(1))
    };
    let step = |c: &mut Client, token: i64, name: &str| -> Result<String, Failed> {
        one(
            c,
            &format!("SELECT done || ' ' || coalesce(output::text, '-') FROM tide.start_step({run}, {token}, '{name}')"),
        )
    };
    // Attempt 1: fetch is done, then the worker fails before load is done.
    let first = claim_run(&mut c)?;
    assert_eq!(step(&mut c, first, "fetch")?, "false -");
    exec(
        &mut c,
        &format!("SELECT tide.complete_step({run}, {first}, 'fetch', '{{\"rows\": 10}}')"),
    )?;
    assert_eq!(step(&mut c, first, "load")?, "false -");
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({run}, {first}, 'connection reset')"),
    )?;
    // The old token can no longer record steps.
    let (code, message, _) = refused(
        &mut c,
        &format!("SELECT tide.complete_step({run}, {first}, 'load')"),
    )?;
    assert_eq!(code, "55000", "{message}");
    // Attempt 2: fetch is skipped with its output, load is done this time.
    exec(&mut c, "SELECT tide.tick(now() + interval '1 minute')")?;
    let second = claim_run(&mut c)?;
    assert_eq!(step(&mut c, second, "fetch")?, "true {\"rows\": 10}");
    assert_eq!(step(&mut c, second, "load")?, "false -");
    exec(
        &mut c,
        &format!(
            "SELECT tide.complete_step({run}, {second}, 'load'); SELECT tide.complete_run({run}, {second})"
        ),
    )?;
    // A forced replay skips both.
    exec(
        &mut c,
        &format!("SELECT tide.replay_run({run}, force => true)"),
    )?;
    let third = claim_run(&mut c)?;
    assert_eq!(step(&mut c, third, "fetch")?, "true {\"rows\": 10}");
    assert_eq!(step(&mut c, third, "load")?, "true -");
    let steps: String = one(
        &mut c,
        &format!("SELECT string_agg(name || ':' || done || '@' || attempt, ' ' ORDER BY name) FROM tide.step WHERE run_id = {run}"),
    )?;
    assert_eq!(
        steps, "fetch:true@1 load:true@2",
        "each step records the attempt that did it"
    );
    let explained: String = one(
        &mut c,
        &format!("SELECT string_agg(l, E'\\n') FROM tide.explain({run}) l"),
    )?;
    assert!(
        explained.contains("step fetch done by attempt 1"),
        "{explained}"
    );

    for (sql, code, needle) in [
        (
            format!("SELECT tide.start_step({run}, {third}, ' ')"),
            "22023",
            "step name must not be empty",
        ),
        (
            format!("SELECT tide.complete_step({run}, {third}, 'fetch')"),
            "55000",
            "already done",
        ),
        (
            format!("SELECT tide.start_step({run}, NULL, 'x')"),
            "22004",
            "token must not be NULL",
        ),
        (
            "SELECT tide.start_step(-5, 1, 'x')".to_string(),
            "42704",
            "run -5 does not exist",
        ),
        (
            "SELECT tide.start_step('x')".to_string(),
            "55000",
            "inside a task's command only",
        ),
        (
            "SELECT tide.complete_step('x')".to_string(),
            "55000",
            "inside a task's command only",
        ),
    ] {
        let (got, message, hint) = refused(&mut c, &sql)?;
        assert_eq!(got, code, "{sql}: {message}");
        assert!(message.contains(needle), "{sql}: {message}");
        assert!(!hint.is_empty(), "{sql}: no hint");
    }
    let rows: i64 = one(&mut c, "SELECT count(*) FROM tide.step")?;
    assert_eq!(rows, 2, "refused calls write nothing");
    Ok(())
}

fn a_command_skips_its_done_steps_on_rerun(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "CREATE TABLE IF NOT EXISTS g_charges (biz_date date, charged_at timestamptz DEFAULT clock_timestamp());
         CREATE TABLE IF NOT EXISTS g_reports (biz_date date, made_at timestamptz DEFAULT clock_timestamp());
         SELECT tide.schedule('g_charge', '0 1 * * *', biz_window => 'day', command => $$
             INSERT INTO g_charges (biz_date) SELECT tide.biz_date() WHERE NOT (SELECT done FROM tide.start_step('charge'));
             SELECT tide.complete_step('charge', jsonb_build_object('day', tide.biz_date()))
               WHERE NOT (SELECT done FROM tide.start_step('charge'));
             INSERT INTO g_reports (biz_date) VALUES (tide.biz_date())
         $$);",
    )?;
    run_then_force_rerun(&mut c, "g_charge", 4, "SELECT count(*) = 2 FROM g_reports")?;
    let charges: i64 = one(&mut c, "SELECT count(*) FROM g_charges")?;
    assert_eq!(
        charges, 1,
        "the charge step ran once; the unguarded report ran twice"
    );
    Ok(())
}

fn a_taken_back_run_resumes_from_its_checkpoint(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("g_checkpoint")?;
    exec(
        &mut c,
        "SELECT tide.schedule('backfill', '0 0 1 1 *', lease => '1 minute')",
    )?;
    let run: i64 = one(
        &mut c,
        "SELECT tide.rerun('backfill', window_start => (date_trunc('year', now() AT TIME ZONE 'UTC') - interval '1 year') AT TIME ZONE 'UTC')",
    )?;
    let claim = |c: &mut Client| -> Result<(i64, Option<String>), Failed> {
        let row = c
            .query_one(
                "SELECT run_id, lease_token, checkpoint::text FROM tide.claim_runs(worker => 'w1')",
                &[],
            )
            .map_err(db_err)?;
        assert_eq!(row.get::<_, i64>(0), run);
        Ok((row.get(1), row.get(2)))
    };
    let (first, checkpoint) = claim(&mut c)?;
    assert_eq!(checkpoint, None, "a fresh run starts from the beginning");
    // Two batches done, each committed with its checkpoint; then the worker disappears.
    for upto in [1000, 2000] {
        exec(
            &mut c,
            &format!("SELECT tide.heartbeat_run({run}, {first}, '{{\"done_upto\": {upto}}}')"),
        )?;
    }
    exec(&mut c, "SELECT tide.tick(now() + interval '5 minutes')")?;
    // The lost lease counted as an attempt; the retry comes due and resumes at the checkpoint.
    exec(&mut c, "SELECT tide.tick(now() + interval '2 hours')")?;
    let (second, checkpoint) = claim(&mut c)?;
    assert_eq!(checkpoint.as_deref(), Some("{\"done_upto\": 2000}"));
    // The first worker's late heartbeat is fenced out and does not move the checkpoint back.
    let (code, _, _) = refused(
        &mut c,
        &format!("SELECT tide.heartbeat_run({run}, {first}, '{{\"done_upto\": 1000}}')"),
    )?;
    assert_eq!(code, "55000");
    exec(
        &mut c,
        &format!("SELECT tide.complete_run({run}, {second})"),
    )?;
    let outcomes: String = one(
        &mut c,
        &format!("SELECT string_agg(outcome::text, ',' ORDER BY attempt) FROM tide.attempt WHERE run_id = {run}"),
    )?;
    assert_eq!(outcomes, "lost,succeeded");
    Ok(())
}

fn main() {
    let tests: &[(&str, TestFn)] = &[
        (
            "sends_are_recorded_once_per_key",
            sends_are_recorded_once_per_key,
        ),
        (
            "delivery_is_fenced_and_never_repeated_once_delivered",
            delivery_is_fenced_and_never_repeated_once_delivered,
        ),
        (
            "failed_deliveries_back_off_then_die",
            failed_deliveries_back_off_then_die,
        ),
        ("a_command_rerun_sends_once", a_command_rerun_sends_once),
        (
            "steps_done_are_skipped_by_retries_and_reruns",
            steps_done_are_skipped_by_retries_and_reruns,
        ),
        (
            "a_command_skips_its_done_steps_on_rerun",
            a_command_skips_its_done_steps_on_rerun,
        ),
        (
            "a_taken_back_run_resumes_from_its_checkpoint",
            a_taken_back_run_resumes_from_its_checkpoint,
        ),
    ];
    run_tests("guarantees", tests)
}

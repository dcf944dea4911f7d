//! Monitoring on a real cluster: task health, heartbeat checks, alerts and their NOTIFY, the
//! Prometheus metrics (checked with the reference parser), run log lines, `tide.explain` and
//! history pruning. Time is driven through `tide.tick` with explicit instants, each test in its
//! own database; where a success must lie in the past, the test moves its finish time back (a
//! fixture: runs can only succeed at the real `now()`).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use pg_tide_pg_test::{
    blocks_read, db_err, describe, exec, notifications_until_sentinel, one, refused, run_tests,
    tick, Client, Cluster, Failed, TestFn,
};

// Tasks of these tests fire once a year ('0 0 1 1 *', 1 January), so that no tick of a test
// creates a run by itself: every run is made by `past_run`.

/// A claimable run of a yearly task: the window that began `years` years ago (1 January),
/// made with tide.rerun.
fn past_run(c: &mut Client, task: &str, years: i32) -> Result<i64, Failed> {
    one(
        c,
        &format!(
            "SELECT tide.rerun('{}', window_start => (date_trunc('year', now() AT TIME ZONE 'UTC') - interval '{years} years') AT TIME ZONE 'UTC')",
            task.replace('\'', "''")
        ),
    )
}

fn claim_run(c: &mut Client, run: i64) -> Result<i64, Failed> {
    let (id, token): (i64, i64) = c
        .query_opt(
            "SELECT run_id, lease_token FROM tide.claim_runs(worker => 'w1')",
            &[],
        )
        .map_err(db_err)?
        .map(|r| (r.get(0), r.get(1)))
        .ok_or_else(|| format!("nothing to claim, expected run {run}"))?;
    assert_eq!(id, run, "the oldest ready run is claimed first");
    Ok(token)
}

/// Claims and completes a run; returns nothing, the run is then succeeded.
fn succeed(c: &mut Client, run: i64) -> Result<(), Failed> {
    let token = claim_run(c, run)?;
    exec(c, &format!("SELECT tide.complete_run({run}, {token})"))
}

/// Moves a finished run's finish (and claim) back in time, as if it had succeeded then.
fn backdate(c: &mut Client, run: i64, by: &str) -> Result<(), Failed> {
    exec(
        c,
        &format!(
            "UPDATE tide.run SET finished_at = finished_at - interval '{by}', claimed_at = claimed_at - interval '{by}'
              WHERE run_id = {run}"
        ),
    )
}

/// Task `w` (yearly, max_attempts 1): its window of three years ago succeeded, and the one of
/// two years ago failed as a business error (dead).
fn success_then_dead_window(c: &mut Client) -> Result<(), Failed> {
    let ok = past_run(c, "w", 3)?;
    succeed(c, ok)?;
    let bad = past_run(c, "w", 2)?;
    let token = claim_run(c, bad)?;
    exec(
        c,
        &format!("SELECT tide.fail_run({bad}, {token}, 'no such row', 'business')"),
    )
}

/// The newest run of event task `e`.
fn newest_of_e(c: &mut Client) -> Result<i64, Failed> {
    one(
        c,
        "SELECT max(run_id) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'e'",
    )
}

/// Emits an event to task `e` and fails its run as transient: it waits for its retry.
fn emit_and_fail(c: &mut Client) -> Result<(), Failed> {
    exec(c, "SELECT tide.emit('e')")?;
    let failing = newest_of_e(c)?;
    let token = claim_run(c, failing)?;
    exec(
        c,
        &format!("SELECT tide.fail_run({failing}, {token}, 'timeout')"),
    )
}

fn status_at(c: &mut Client, task: &str, at: &str) -> Result<String, Failed> {
    one(
        c,
        &format!("SELECT status FROM tide._health({at}) WHERE task = '{task}'"),
    )
}

/// Open alerts as "subject_type:subject:kind" (sorted), with their counts.
fn open_alerts(c: &mut Client) -> Result<String, Failed> {
    one(
        c,
        "SELECT coalesce(string_agg(subject_type || ':' || subject || ':' || kind || 'x' || count, ' '
                                    ORDER BY subject_type, subject, kind::text), '')
           FROM tide.alert WHERE resolved_at IS NULL",
    )
}

/// Every pg_tide_alert payload received up to a sentinel this test sends itself.
fn alert_notes(listener: &mut Client, sender: &mut Client) -> Result<Vec<String>, Failed> {
    notifications_until_sentinel(listener, sender, "pg_tide_alert")
}

/// The notifications of an event whose alert is of a kind: a notification names the event and
/// the alert, whose kind is read from tide.alert, as a listener does.
fn count_notes(c: &mut Client, notes: &[String], event: &str, kind: &str) -> Result<i64, Failed> {
    let notes: Vec<&str> = notes.iter().map(String::as_str).collect();
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM unnest($1::text[]) n(payload)
               JOIN tide.alert a ON a.alert_id = (n.payload::jsonb->>'alert_id')::bigint
              WHERE n.payload::jsonb->>'event' = $2 AND a.kind::text = $3",
            &[&notes, &event, &kind],
        )
        .map_err(db_err)?
        .get(0);
    Ok(n)
}

fn silent_task_turns_late_then_down_and_alerts_once(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_silence")?;
    let mut listener = cluster.connect("m_silence")?;
    exec(&mut listener, "LISTEN pg_tide_alert")?;
    exec(
        &mut c,
        "SELECT tide.schedule('etl', '0 0 1 1 *');
         SELECT tide.monitor('etl', max_silence => '10 minutes', severity => 'critical')",
    )?;
    assert_eq!(status_at(&mut c, "etl", "now()")?, "never_ran");
    let run = past_run(&mut c, "etl", 2)?;
    succeed(&mut c, run)?;
    assert_eq!(status_at(&mut c, "etl", "now()")?, "ok");
    // The last success 15 minutes ago: late (10 minutes allowed); 25 minutes: down (twice that).
    backdate(&mut c, run, "15 minutes")?;
    assert_eq!(status_at(&mut c, "etl", "now()")?, "late");
    assert_eq!(
        status_at(&mut c, "etl", "now() + interval '10 minutes'")?,
        "down"
    );

    tick(&mut c, "now()")?;
    assert_eq!(open_alerts(&mut c)?, "task:etl:silencex1");
    let severity: String = one(&mut c, "SELECT severity::text FROM tide.alert")?;
    assert_eq!(severity, "critical", "the task's severity");
    // Evaluated again (a later instant): still one open alert, seen twice.
    tick(&mut c, "now() + interval '1 minute'")?;
    assert_eq!(open_alerts(&mut c)?, "task:etl:silencex2");
    // Down: a second kind opens beside it.
    tick(&mut c, "now() + interval '11 minutes'")?;
    assert_eq!(open_alerts(&mut c)?, "task:etl:downx1 task:etl:silencex3");

    // A success resolves both.
    let run2 = past_run(&mut c, "etl", 1)?;
    succeed(&mut c, run2)?;
    tick(&mut c, "now()")?;
    assert_eq!(open_alerts(&mut c)?, "");
    // Silent again 12 minutes later: a new opening, resolved when time is back at now.
    tick(&mut c, "now() + interval '12 minutes'")?;
    assert_eq!(open_alerts(&mut c)?, "task:etl:silencex1");
    tick(&mut c, "now()")?;
    assert_eq!(open_alerts(&mut c)?, "");
    let resolved: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.alert WHERE resolved_at IS NOT NULL",
    )?;
    assert_eq!(resolved, 3, "silence, down, and the second silence");

    let notes = alert_notes(&mut listener, &mut c)?;
    assert_eq!(
        count_notes(&mut c, &notes, "opened", "silence")?,
        2,
        "{notes:?}"
    );
    assert_eq!(
        count_notes(&mut c, &notes, "opened", "down")?,
        1,
        "{notes:?}"
    );
    assert_eq!(
        count_notes(&mut c, &notes, "resolved", "silence")?,
        2,
        "{notes:?}"
    );
    assert_eq!(
        count_notes(&mut c, &notes, "resolved", "down")?,
        1,
        "{notes:?}"
    );
    assert_eq!(
        notes.len(),
        6,
        "one NOTIFY per opening and resolution: {notes:?}"
    );
    let first: String = c
        .query_one(
            "SELECT subject FROM tide.alert WHERE alert_id = ($1::text::jsonb->>'alert_id')::bigint",
            &[&notes[0]],
        )
        .map_err(db_err)?
        .get(0);
    assert_eq!(first, "etl", "{}", notes[0]);
    Ok(())
}

fn derived_max_silence_and_monitor_settings(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_settings")?;
    exec(
        &mut c,
        "SELECT tide.schedule('hourly', '0 * * * *');
         SELECT tide.schedule('weekdays', '0 9 * * 1-5', timeout => '30 minutes');
         SELECT tide.schedule('london', '0 2 * * *', tz => 'Europe/London');",
    )?;
    // Longest gap between fires plus the timeout (at most that gap): hourly 1 h + 1 h;
    // weekdays Friday to Monday 72 h + 30 min; London daily 25 h (the autumn day) + 1 h.
    let derived: String = one(
        &mut c,
        "SELECT string_agg(name || '=' || tide._max_silence(t.max_silence, t.fire_gap, t.timeout), ' ' ORDER BY name) FROM tide.task t",
    )?;
    assert_eq!(derived, "hourly=02:00:00 london=26:00:00 weekdays=72:30:00");

    let set: String = one(
        &mut c,
        "SELECT tide.monitor('hourly', max_silence => '3 hours', severity => 'info')::text",
    )?;
    assert!(
        set.contains("\"derived\": false") && set.contains("03:00:00") && set.contains("\"info\""),
        "{set}"
    );
    let version: i32 = one(
        &mut c,
        "SELECT version FROM tide.task WHERE name = 'hourly'",
    )?;
    assert_eq!(
        version, 1,
        "monitoring settings are not rules: no new version"
    );
    let back: String = one(
        &mut c,
        "SELECT tide.monitor('hourly', max_silence => '0')::text",
    )?;
    assert!(
        back.contains("\"derived\": true")
            && back.contains("02:00:00")
            && back.contains("\"info\""),
        "{back}"
    );
    // A schedule change recomputes the gap.
    exec(
        &mut c,
        "SELECT tide.alter('hourly', schedule => '*/15 * * * *')",
    )?;
    let after: String = one(
        &mut c,
        "SELECT tide._max_silence(t.max_silence, t.fire_gap, t.timeout)::text FROM tide.task t WHERE name = 'hourly'",
    )?;
    assert_eq!(after, "00:30:00");

    for (sql, code, needle) in [
        (
            "SELECT tide.monitor('nope', severity => 'info')",
            "42704",
            "\"nope\"",
        ),
        (
            "SELECT tide.monitor(NULL)",
            "22004",
            "task must not be NULL",
        ),
        (
            "SELECT tide.monitor('london', severity => 'loud')",
            "22023",
            "\"loud\"",
        ),
        (
            "SELECT tide.monitor('london', max_silence => '-1 hour')",
            "22023",
            "-01:00:00",
        ),
    ] {
        let (got, message, hint) = refused(&mut c, sql)?;
        assert_eq!(got, code, "{sql}: {message}");
        assert!(message.contains(needle), "{sql}: {message}");
        assert!(!hint.is_empty(), "{sql}: no hint");
    }
    let unchanged: String = one(
        &mut c,
        "SELECT severity::text FROM tide.task WHERE name = 'london'",
    )?;
    assert_eq!(unchanged, "warning", "refused calls change nothing");
    Ok(())
}

fn heartbeat_checks_go_late_then_down(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_checks")?;
    // create_check returns the name the other check functions take (trimmed).
    let made: String = one(
        &mut c,
        "SELECT tide.create_check(' backup ', '1 hour', grace => '10 minutes', severity => 'critical')",
    )?;
    assert_eq!(made, "backup");
    exec(
        &mut c,
        "SELECT tide.create_check('report', '0 3 * * *', tz => 'Asia/Shanghai');",
    )?;
    let status = |c: &mut Client, name: &str, at: &str| -> Result<String, Failed> {
        one(
            c,
            &format!("SELECT status FROM tide._check_status({at}) WHERE kind = 'check' AND name = '{name}'"),
        )
    };
    // No beat yet: new, and never alerting.
    assert_eq!(status(&mut c, "backup", "now() + interval '1 day'")?, "new");
    tick(&mut c, "now() + interval '1 day'")?;
    assert_eq!(open_alerts(&mut c)?, "");

    let expected: bool = one(
        &mut c,
        "SELECT tide.heartbeat_check('backup') BETWEEN now() + interval '1 hour' AND clock_timestamp() + interval '1 hour'",
    )?;
    assert!(expected, "the next beat is expected one period later");
    assert_eq!(
        status(&mut c, "backup", "now() + interval '59 minutes'")?,
        "up"
    );
    assert_eq!(
        status(&mut c, "backup", "now() + interval '65 minutes'")?,
        "late"
    );
    assert_eq!(
        status(&mut c, "backup", "now() + interval '71 minutes'")?,
        "down"
    );
    tick(&mut c, "now() + interval '65 minutes'")?;
    assert_eq!(open_alerts(&mut c)?, "check:backup:silencex1");
    tick(&mut c, "now() + interval '71 minutes'")?;
    assert_eq!(
        open_alerts(&mut c)?,
        "check:backup:downx1 check:backup:silencex2"
    );
    // A new beat resolves them.
    exec(
        &mut c,
        "SELECT tide.heartbeat_check('backup', message => 'done in 4 min')",
    )?;
    tick(&mut c, "now() + interval '1 minute'")?;
    assert_eq!(open_alerts(&mut c)?, "");

    // A failed beat is down at once; pausing silences the check.
    exec(
        &mut c,
        "SELECT tide.heartbeat_check('backup', ok => false, message => 'disk full')",
    )?;
    assert_eq!(status(&mut c, "backup", "now()")?, "down");
    let paused: bool = one(&mut c, "SELECT tide.pause_check('backup')")?;
    let again: bool = one(&mut c, "SELECT tide.pause_check('backup')")?;
    assert!(
        paused && !again,
        "true when it changed, false when it already was"
    );
    assert_eq!(
        status(&mut c, "backup", "now() + interval '1 day'")?,
        "paused"
    );
    tick(&mut c, "now() + interval '1 day'")?;
    assert_eq!(open_alerts(&mut c)?, "");
    let resumed: bool = one(&mut c, "SELECT tide.resume_check('backup')")?;
    assert!(resumed);
    assert_eq!(
        status(&mut c, "backup", "now() + interval '30 minutes'")?,
        "up"
    );

    // A cron check expects its beat at the next fire after the last beat, in its time zone:
    // 03:00 in Shanghai is 19:00 UTC the day before.
    let next: bool = one(
        &mut c,
        "SELECT tide.heartbeat_check('report') = (SELECT min(d) FROM generate_series(date_trunc('day', now()) - interval '1 day',
                                                                         date_trunc('day', now()) + interval '2 days',
                                                                         interval '1 day') g,
                                              LATERAL (SELECT g + interval '19 hours' AS d) x
                                        WHERE d > now())",
    )?;
    assert!(next, "the report beat is expected at the next 19:00 UTC");

    // Tasks are listed beside checks, their successes counting as beats.
    exec(&mut c, "SELECT tide.schedule('t', '0 * * * *')")?;
    let kinds: String = one(&mut c, "SELECT string_agg(kind || ':' || name || ':' || status, ' ' ORDER BY kind, name) FROM tide.check_status")?;
    assert_eq!(kinds, "check:backup:up check:report:up task:t:new");

    for (sql, code, needle) in [
        (
            "SELECT tide.create_check('x', '0 3 * *')",
            "22023",
            "0 3 * *",
        ),
        (
            "SELECT tide.create_check('x', '1 day', tz => 'Mars/Base')",
            "22023",
            "Mars/Base",
        ),
        (
            "SELECT tide.create_check('x', '1 day', grace => '-1 minute')",
            "22023",
            "-00:01:00",
        ),
        ("SELECT tide.create_check('x', '-1 day')", "22023", "-1 day"),
        (
            "SELECT tide.create_check('x', '1 day', severity => 'loud')",
            "22023",
            "\"loud\"",
        ),
        (
            "SELECT tide.create_check(' ', '1 day')",
            "22023",
            "must not be empty",
        ),
        (
            "SELECT tide.create_check('x', NULL)",
            "22004",
            "must not be NULL",
        ),
        ("SELECT tide.heartbeat_check('nope')", "42704", "\"nope\""),
        ("SELECT tide.pause_check('nope')", "42704", "\"nope\""),
        ("SELECT tide.resume_check('nope')", "42704", "\"nope\""),
        ("SELECT tide.drop_check(NULL)", "22004", "name"),
    ] {
        let (got, message, hint) = refused(&mut c, sql)?;
        assert_eq!(got, code, "{sql}: {message}");
        assert!(message.contains(needle), "{sql}: {message}");
        assert!(!hint.is_empty(), "{sql}: no hint");
    }
    let checks: i64 = one(&mut c, "SELECT count(*) FROM tide.check")?;
    assert_eq!(checks, 2, "refused declarations write nothing");
    let dropped: bool = one(&mut c, "SELECT tide.drop_check('report')")?;
    let nothing: bool = one(&mut c, "SELECT tide.drop_check('report')")?;
    assert!(
        dropped && !nothing,
        "a removal is true once, then false: nothing by that name"
    );
    let left: String = one(&mut c, "SELECT string_agg(name, ',') FROM tide.check")?;
    assert_eq!(left, "backup");
    Ok(())
}

fn failures_skips_need_check_and_dead_letters_alert(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_kinds")?;
    exec(
        &mut c,
        "SELECT tide.schedule('f', '0 0 1 1 *', max_attempts => 10, backoff_base => '1 second', jitter => 'none');
         SELECT tide.monitor('f', max_silence => '30 days');",
    )?;
    let run = past_run(&mut c, "f", 3)?;
    // Three failed attempts in a row (retries made due by ticks a minute apart).
    for i in 1..=3 {
        let token = claim_run(&mut c, run)?;
        exec(
            &mut c,
            &format!("SELECT tide.fail_run({run}, {token}, 'timeout {i}')"),
        )?;
        tick(&mut c, &format!("now() + interval '{i} minutes'"))?;
    }
    let failures: i32 = one(
        &mut c,
        "SELECT consecutive_failures FROM tide._health(now()) WHERE task = 'f'",
    )?;
    assert_eq!(failures, 3);
    assert_eq!(status_at(&mut c, "f", "now()")?, "failing");
    assert_eq!(open_alerts(&mut c)?, "task:f:consecutive_failuresx1");
    // A business error: dead letter.
    let token = claim_run(&mut c, run)?;
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({run}, {token}, 'no such account', 'business')"),
    )?;
    tick(&mut c, "now() + interval '4 minutes'")?;
    assert_eq!(
        open_alerts(&mut c)?,
        "task:f:consecutive_failuresx2 task:f:dead_letterx1"
    );
    // Replayed and successful: both resolve.
    exec(&mut c, &format!("SELECT tide.replay_run({run})"))?;
    succeed(&mut c, run)?;
    tick(&mut c, "now() + interval '5 minutes'")?;
    assert_eq!(open_alerts(&mut c)?, "");
    assert_eq!(status_at(&mut c, "f", "now()")?, "ok");

    // Short counts: need_check, resolved by a person.
    let short = past_run(&mut c, "f", 2)?;
    let token = claim_run(&mut c, short)?;
    exec(
        &mut c,
        &format!("SELECT tide.complete_run({short}, {token}, expected => 10, actual => 7)"),
    )?;
    tick(&mut c, "now() + interval '6 minutes'")?;
    assert_eq!(open_alerts(&mut c)?, "task:f:need_checkx1");
    exec(
        &mut c,
        &format!("SELECT tide.resolve_run({short}, 'accept')"),
    )?;
    tick(&mut c, "now() + interval '7 minutes'")?;
    assert_eq!(open_alerts(&mut c)?, "");

    // Repeated skips: a task whose missed windows are skipped, after an outage of 6 hours.
    exec(
        &mut c,
        "SELECT tide.schedule('s', '0 * * * *', misfire => 'skip');
         SELECT tide.monitor('s', max_silence => '30 days');",
    )?;
    tick(
        &mut c,
        "(SELECT next_fire_at + interval '5 hours 30 minutes' FROM tide.task WHERE name = 's')",
    )?;
    let (skipped, streak): (i64, i32) = {
        let row = c
            .query_one(
                "SELECT (SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 's' AND r.state = 'skipped'),
                        (SELECT consecutive_skips FROM tide._health(now()) WHERE task = 's')",
                &[],
            )
            .map_err(db_err)?;
        (row.get(0), row.get(1))
    };
    assert!(skipped > 3, "the outage left {skipped} skipped windows");
    assert_eq!(
        i64::from(streak),
        skipped,
        "every skipped window is in the streak"
    );
    assert_eq!(open_alerts(&mut c)?, "task:s:repeated_skipsx1");
    Ok(())
}

/// The counters of `tide.metrics()` as runs are claimed and finished through every path (claims
/// of one and of many, `complete_run` and a short completion, `complete_runs`, failures and
/// their retries, a run cancelled before it started, a short completion accepted, windows
/// created skipped by the tick; an SQL run of `tide.tick`'s executor path
/// is not here: no workers), before and after a tick folds them, equal what the history says:
/// every function that writes history rows counts them (there is no trigger on tide.run_event).
fn counters_match_history(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_counters")?;
    exec(
        &mut c,
        "SELECT tide.schedule('cq', NULL, topics => '{cq}', queue => 'cq', max_attempts => 3,
                              backoff_base => '1 second', jitter => 'none');
         SELECT tide.emit_many('cq', array_fill('{}'::jsonb, ARRAY[40]));
         -- One by one: successes, a short completion (need_check), failures.
         SELECT tide.complete_run(run_id, lease_token) FROM tide.claim_runs('cq', n => 5);
         SELECT tide.complete_run(run_id, lease_token, expected => 3, actual => 2) FROM tide.claim_runs('cq', n => 1);
         SELECT tide.fail_run(run_id, lease_token, 'try again') FROM tide.claim_runs('cq', n => 4);
         SELECT tide.fail_run(run_id, lease_token, 'bad row', 'business') FROM tide.claim_runs('cq', n => 2);
         -- In batches.
         SELECT tide.complete_runs(array_agg(run_id), array_agg(lease_token)) FROM tide.claim_runs('cq', n => 10);
         SELECT tide.complete_runs(array_agg(run_id), array_agg(lease_token)) FROM tide.claim_runs('cq', n => 7);
         SELECT tide.cancel_run(max(run_id)) FROM tide.run;",
    )?;
    // The retries come due (their second attempts start and end), and the fold moves the
    // counts into tide.run_count.
    tick(&mut c, "now() + interval '1 minute'")?;
    exec(
        &mut c,
        "SELECT tide.complete_runs(array_agg(run_id), array_agg(lease_token)) FROM tide.claim_runs('cq', n => 3);
         SELECT tide.complete_run(run_id, lease_token) FROM tide.claim_runs('cq', n => 1);
         -- The short completion accepted by a person (a state change through tide._run_changed).
         SELECT tide.resolve_run(run_id, 'accept') FROM tide.run WHERE state = 'need_check';
         -- Windows created skipped by the tick (misfire => 'skip', after an outage of 5 hours).
         SELECT tide.schedule('cs', '0 * * * *', misfire => 'skip');",
    )?;
    tick(
        &mut c,
        "(SELECT next_fire_at + interval '5 hours 30 minutes' FROM tide.task WHERE name = 'cs')",
    )?;
    let counted = "SELECT string_agg(metric || '/' || label || '=' || round(v::numeric, 3), ' ' ORDER BY metric, label)
                     FROM (SELECT x.metric, x.label, sum(x.value) AS v
                             FROM (SELECT metric, label, value FROM tide.run_count
                                   UNION ALL SELECT metric, label, value FROM tide.count_delta) x
                            GROUP BY 1, 2) y";
    // From the history: every outcome reached; the duration of every success (the run was not
    // run again); the wait of every run that started (its first start).
    let history = "SELECT string_agg(metric || '/' || label || '=' || round(v::numeric, 3), ' ' ORDER BY metric, label)
                     FROM (SELECT 'runs' AS metric, e.to_state::text AS label, count(*)::float8 AS v
                             FROM tide.run_event e
                            WHERE e.to_state IN ('succeeded', 'need_check', 'dead', 'skipped', 'cancelled')
                            GROUP BY 2
                           UNION ALL
                           SELECT 'duration_count', '', count(*) FROM tide.run r WHERE r.state = 'succeeded'
                           UNION ALL
                           SELECT 'duration_sum', '', sum(extract(epoch FROM r.finished_at - r.claimed_at))
                             FROM tide.run r WHERE r.state = 'succeeded'
                           UNION ALL
                           SELECT 'wait_count', '', count(*) FROM tide.run r WHERE r.started_at IS NOT NULL
                           UNION ALL
                           SELECT 'wait_sum', '', sum(extract(epoch FROM greatest(r.started_at - r.created_at, interval '0')))
                             FROM tide.run r WHERE r.started_at IS NOT NULL
                           UNION ALL
                           SELECT 'duration_bucket', tide._le(extract(epoch FROM r.finished_at - r.claimed_at)), count(*)
                             FROM tide.run r WHERE r.state = 'succeeded' GROUP BY 2
                           UNION ALL
                           SELECT 'wait_bucket', tide._le(extract(epoch FROM greatest(r.started_at - r.created_at, interval '0'))), count(*)
                             FROM tide.run r WHERE r.started_at IS NOT NULL GROUP BY 2) y";
    let want: String = one(&mut c, history)?;
    assert!(
        want.contains("runs/succeeded=27")
            && want.contains("runs/need_check=1")
            && want.contains("runs/dead=2")
            && want.contains("runs/cancelled=1")
            && want.contains("runs/skipped="),
        "the scenario: {want}"
    );
    assert!(
        want.contains("duration_bucket/") && want.contains("wait_bucket/"),
        "the scenario's buckets: {want}"
    );
    assert_eq!(one::<String>(&mut c, counted)?, want, "before the fold");
    // The buckets' bounds: a value goes to the smallest bound it is at most; above the
    // largest, to none (the +Inf bucket is the count).
    let les: String = one(
        &mut c,
        "SELECT string_agg(coalesce(tide._le(x), '-'), ' ' ORDER BY x)
           FROM unnest(ARRAY[0, 0.01, 0.0101, 0.05, 0.1, 0.2, 0.5, 1, 1.5, 5, 10, 30, 45, 60, 300, 900, 901,
                             3600, 21600, 21600.5, 1e9]::float8[]) x",
    )?;
    assert_eq!(
        les,
        "0.01 0.01 0.05 0.05 0.1 0.5 0.5 1 5 5 10 30 60 60 300 900 3600 3600 21600 - -"
    );
    // What no duration can be still gets an answer, never an error: NULL and NaN no bucket
    // (+Inf only), a negative one the first.
    let odd: String = one(
        &mut c,
        "SELECT concat_ws(' ', coalesce(tide._le(NULL), '-'), coalesce(tide._le('NaN'), '-'),
                          coalesce(tide._le('Infinity'), '-'), tide._le(-1))",
    )?;
    assert_eq!(odd, "- - - 0.01");
    tick(&mut c, "now() + interval '2 minutes'")?;
    assert_eq!(one::<String>(&mut c, counted)?, want, "after the fold");
    Ok(())
}

/// What health reads from history, as the tick keeps it (tide.task_stat), is what the runs say:
/// right after a fold, after runs changed with no fold since, and a day later.
fn kept_health_figures_match_history(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_kept")?;
    exec(
        &mut c,
        "SELECT tide.schedule('w', '0 0 1 1 *', max_attempts => 1);
         SELECT tide.schedule('e', NULL, topics => '{e}', max_attempts => 5, backoff_base => '1 hour', jitter => 'none');
         SELECT tide.schedule('idle', '0 0 1 1 *');",
    )?;
    // A window task: a success, then a dead window; an event task: a success, then a failure
    // waiting for its retry.
    success_then_dead_window(&mut c)?;
    let first: i64 = one(&mut c, "SELECT tide.emit('e')::bigint")?;
    let emitted = newest_of_e(&mut c)?;
    assert_eq!(first, 1);
    succeed(&mut c, emitted)?;
    emit_and_fail(&mut c)?;

    // The figures health shows at an instant, and the same computed from the runs alone (the
    // kept ones deleted and every task noted, in a transaction rolled back).
    let shown = |c: &mut Client, at: &str| -> Result<String, Failed> {
        one(
            c,
            &format!(
                "SELECT string_agg(format('%s %s %s %s %s %s %s %s', task, status, last_state, last_success,
                                          consecutive_failures, consecutive_skips, retries_24h, p50_duration), ' | ' ORDER BY task)
                   FROM tide._health({at})"
            ),
        )
    };
    let from_runs = |c: &mut Client, at: &str| -> Result<String, Failed> {
        let mut tx = c.transaction().map_err(db_err)?;
        tx.batch_execute(
            "DELETE FROM tide.task_stat; DELETE FROM tide.task_touch;
             INSERT INTO tide.task_touch (task_id, owner) SELECT task_id, owner FROM tide.task",
        )
        .map_err(db_err)?;
        let text: String = tx
            .query_one(
                &format!(
                    "SELECT string_agg(format('%s %s %s %s %s %s %s %s', task, status, last_state, last_success,
                                              consecutive_failures, consecutive_skips, retries_24h, p50_duration), ' | ' ORDER BY task)
                       FROM tide._health({at})"
                ),
                &[],
            )
            .map_err(db_err)?
            .get(0);
        tx.rollback().map_err(db_err)?;
        Ok(text)
    };
    let kept = |c: &mut Client| -> Result<(i64, i64), Failed> {
        let row = c
            .query_one(
                "SELECT (SELECT count(*) FROM tide.task_stat), (SELECT count(*) FROM tide.task_touch)",
                &[],
            )
            .map_err(db_err)?;
        Ok((row.get(0), row.get(1)))
    };

    // The tick folds: every task's figures are kept, nothing is left to recompute, and health
    // shows what the runs say. The instant is fixed (a statement's now() is its
    // transaction's start: ask for one a little ahead of every run above).
    let at = "(SELECT now() + interval '1 second')";
    let at_fixed: String = one(&mut c, &format!("SELECT {at}::text"))?;
    let at = format!("'{at_fixed}'::timestamptz");
    tick(&mut c, &at)?;
    assert_eq!(
        kept(&mut c)?,
        (3, 0),
        "kept figures of 3 tasks, nothing touched"
    );
    let after_fold = shown(&mut c, &at)?;
    assert_eq!(after_fold, from_runs(&mut c, &at)?);
    assert!(
        after_fold.contains("w failing dead"),
        "the dead window shows: {after_fold}"
    );
    assert!(
        after_fold.contains("e failing retry"),
        "the failed event run shows: {after_fold}"
    );

    // A success of the window task with no fold since: health shows it at once.
    let fixed = past_run(&mut c, "w", 1)?;
    succeed(&mut c, fixed)?;
    let (_, touched) = kept(&mut c)?;
    assert!(touched > 0, "the changed task is noted for the next fold");
    let later: String = one(&mut c, "SELECT (now() + interval '2 seconds')::text")?;
    let later = format!("'{later}'::timestamptz");
    let before_fold = shown(&mut c, &later)?;
    assert_ne!(before_fold, after_fold);
    assert_eq!(before_fold, from_runs(&mut c, &later)?);
    // Folded again: the same.
    tick(&mut c, &later)?;
    assert_eq!(kept(&mut c)?, (3, 0));
    assert_eq!(shown(&mut c, &later)?, before_fold);

    // A day later the runs counted in the last 24 hours have left it: the kept 24-hour figures
    // no longer hold, and health computes them again.
    let day: String = one(&mut c, "SELECT (now() + interval '25 hours')::text")?;
    let day = format!("'{day}'::timestamptz");
    let next_day = shown(&mut c, &day)?;
    assert_eq!(next_day, from_runs(&mut c, &day)?);
    assert_ne!(next_day, before_fold, "the 24-hour figures moved on");
    Ok(())
}

/// The tick's alert evaluation makes health rows only for the tasks that may have something to
/// report, found from their kept figures and unfinished runs. What it finds is what every task's
/// health says: at several instants (a later one has kept figures that no longer hold and tasks
/// gone silent) and with every threshold at its lowest (1).
fn alert_causes_match_every_tasks_health(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_causes")?;
    exec(
        &mut c,
        "SELECT tide.schedule('w', '0 0 1 1 *', max_attempts => 1);
         SELECT tide.schedule('e', NULL, topics => '{e}', max_attempts => 5, backoff_base => '1 hour', jitter => 'none');
         SELECT tide.schedule('p', '0 0 1 1 *'); SELECT tide.pause('p');
         SELECT count(tide.schedule('idle_' || g, '0 0 1 1 *')) FROM generate_series(1, 20) g;",
    )?;
    // w: a success three years ago, then a dead window; e: a failure waiting for its retry, and
    // three runs ready.
    success_then_dead_window(&mut c)?;
    emit_and_fail(&mut c)?;
    exec(&mut c, "SELECT tide.emit('e') FROM generate_series(1, 3)")?;
    let now: String = one(&mut c, "SELECT (now() + interval '1 second')::text")?;
    let now = format!("'{now}'::timestamptz");
    tick(&mut c, &now)?;
    let kept: i64 = one(&mut c, "SELECT count(*) FROM tide.task_stat")?;
    assert_eq!(kept, 23, "every task's figures are kept");

    let compare = |c: &mut Client, at: &str| -> Result<String, Failed> {
        let found: String = one(
            c,
            &format!(
                "SELECT coalesce(string_agg(subject || ':' || kind, ' ' ORDER BY subject, kind::text), '')
                   FROM tide._alert_causes({at}) WHERE subject_type = 'task'"
            ),
        )?;
        let expected: String = one(
            c,
            &format!(
                "SELECT coalesce(string_agg(h.task || ':' || v.k, ' ' ORDER BY h.task, v.k), '')
                   FROM tide._health({at}) h
                  CROSS JOIN LATERAL (VALUES
                    ('silence', NOT h.paused AND tide._silence_level(h.silence, h.max_silence) >= 1),
                    ('down', NOT h.paused AND tide._silence_level(h.silence, h.max_silence) = 2),
                    ('consecutive_failures', h.consecutive_failures >= tide._setting('alert_failures', '3')::integer),
                    ('dead_letter', h.dead > 0),
                    ('need_check', h.need_check > 0),
                    ('repeated_skips', h.consecutive_skips > tide._setting('alert_skips', '3')::integer),
                    ('retries', h.retries_24h >= tide._setting('alert_retries', '10')::integer),
                    ('backlog', h.backlog >= tide._setting('alert_backlog', '1000')::integer),
                    ('catch_up_limit', h.catch_up_limited_24h > 0),
                    ('not_ready', h.not_ready_24h > 0),
                    ('schedule_error', h.tick_error IS NOT NULL),
                    ('held', h.held_since <= {at} - tide._setting('alert_held_after', '1h')::interval),
                    ('late_start', h.oldest_ready > (SELECT tide._start_deadline(t.start_deadline, t.fire_gap, r.window_start IS NOT NULL)
                                                       FROM tide.task t, tide.run r
                                                      WHERE t.task_id = h.task_id AND r.run_id = h.oldest_ready_id)))
                    AS v(k, hit)
                  WHERE v.hit"
            ),
        )?;
        assert_eq!(found, expected, "at {at}");
        Ok(found)
    };
    let found = compare(&mut c, &now)?;
    assert_eq!(found, "w:dead_letter", "the defaults");
    let later = format!("{now} + interval '3 years'");
    let found = compare(&mut c, &later)?;
    assert!(
        found.contains("idle_7:down") && found.contains("w:down") && !found.contains("p:"),
        "three years on, the yearly tasks are down, the paused one is not: {found}"
    );
    exec(
        &mut c,
        "SET pg_tide.alert_failures = 1; SET pg_tide.alert_skips = 1; SET pg_tide.alert_retries = 1;
         SET pg_tide.alert_backlog = 1;",
    )?;
    let found = compare(&mut c, &now)?;
    // (e's failed attempt was its first: no retry yet.)
    for cause in [
        "e:backlog",
        "e:consecutive_failures",
        "w:consecutive_failures",
    ] {
        assert!(found.contains(cause), "{cause} in {found}");
    }
    compare(&mut c, &later)?;
    // A task whose max_silence is shortened is a candidate at once (its change notes it), and
    // after the next fold by its kept figures.
    exec(
        &mut c,
        "RESET ALL; SELECT tide.monitor('idle_3', max_silence => '1 minute')",
    )?;
    let soon = format!("{now} + interval '5 minutes'");
    let found = compare(&mut c, &soon)?;
    // (e's three event runs have waited five minutes by then: pg_tide.start_deadline's default.)
    assert_eq!(
        found, "e:late_start idle_3:down idle_3:silence w:dead_letter",
        "before the fold"
    );
    tick(&mut c, &now)?;
    let touched: i64 = one(&mut c, "SELECT count(*) FROM tide.task_touch")?;
    assert_eq!(touched, 0);
    assert_eq!(compare(&mut c, &soon)?, found, "after the fold");
    Ok(())
}

/// Health looks for stale kept figures among the kept rows alone: every task has kept figures
/// or a touch row. A new task shows before any fold; a task whose kept row went (deleted by
/// hand here) is noted again by the next evaluation of the monitor step, which shows it in its
/// alerts and in health at once, and the next fold keeps its figures again.
fn every_task_keeps_figures_or_a_touch_row(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_touch")?;
    exec(
        &mut c,
        "SELECT tide.schedule('k', '0 0 1 1 *', max_attempts => 1);",
    )?;
    let row = |c: &mut Client, task: &str| -> Result<Option<String>, Failed> {
        one(
            c,
            &format!(
                "SELECT (SELECT format('%s %s %s %s', task, status, coalesce(last_state::text, '-'), consecutive_failures)
                           FROM tide.health WHERE task = '{task}')"
            ),
        )
    };
    let counts = |c: &mut Client| -> Result<(i64, i64), Failed> {
        let r = c
            .query_one(
                "SELECT (SELECT count(*) FROM tide.task_stat s JOIN tide.task t USING (task_id) WHERE t.name = 'k'),
                        (SELECT count(*) FROM tide.task_touch u JOIN tide.task t USING (task_id) WHERE t.name = 'k')",
                &[],
            )
            .map_err(db_err)?;
        Ok((r.get(0), r.get(1)))
    };
    // New: no kept figures yet, but noted, and shown.
    assert_eq!(counts(&mut c)?, (0, 1));
    assert_eq!(row(&mut c, "k")?.as_deref(), Some("k never_ran - 0"));
    // A dead window, folded: kept, nothing noted.
    let bad = past_run(&mut c, "k", 1)?;
    let token = claim_run(&mut c, bad)?;
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({bad}, {token}, 'no such row', 'business')"),
    )?;
    tick(&mut c, "now()")?;
    assert_eq!(counts(&mut c)?, (1, 0));
    let kept = row(&mut c, "k")?;
    assert_eq!(kept.as_deref(), Some("k failing dead 1"));
    // The kept row lost: the monitor step's next evaluation (due: an instant a monitor interval
    // later) notes the task again and alerts on its dead run; health shows it as before.
    exec(&mut c, "DELETE FROM tide.task_stat")?;
    exec(&mut c, "DELETE FROM tide.alert")?;
    tick(&mut c, "now() + interval '1 hour'")?;
    let noted = counts(&mut c)?;
    assert!(noted.1 >= 1, "noted again: {noted:?}");
    assert_eq!(row(&mut c, "k")?, kept);
    let alerts: String = one(
        &mut c,
        "SELECT string_agg(kind::text, ',' ORDER BY kind) FROM tide.alert WHERE subject = 'k' AND resolved_at IS NULL",
    )?;
    assert!(alerts.contains("dead_letter"), "{alerts}");
    // The next fold keeps its figures again.
    tick(&mut c, "now() + interval '1 hour 1 second'")?;
    assert_eq!(counts(&mut c)?, (1, 0));
    assert_eq!(row(&mut c, "k")?, kept);
    Ok(())
}

/// Every way of creating runs notes the task, so that task health recomputes it: the tick's
/// fire, tide.enqueue and tide.emit (with pg_tide's keys and with the caller's),
/// tide.emit_many (all through tide._create_runs, as tide.rerun, fallback scans and
/// reconciliations are).
/// (tide.run has no INSERT trigger for it.) Each creation follows a fold that kept the task's
/// last run as succeeded (or none): health at that instant shows the new run's state only if the task was
/// noted.
fn every_way_of_creating_runs_notes_its_task(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_created")?;
    exec(
        &mut c,
        "SELECT tide.schedule('y', '0 0 1 1 *');
         SELECT tide.schedule('j', NULL, topics => ARRAY['m.unused']);
         SELECT tide.schedule('ev', NULL, topics => ARRAY['m.ev']);",
    )?;
    // Half a minute after the yearly task's next fire.
    let at: String = one(
        &mut c,
        "SELECT ((date_trunc('year', now() AT TIME ZONE 'UTC') + interval '1 year' + interval '30 seconds')
                 AT TIME ZONE 'UTC')::text",
    )?;
    let at = format!("'{at}'::timestamptz");
    let last_state = |c: &mut Client, task: &str| -> Result<Option<String>, Failed> {
        one(
            c,
            &format!(
                "SELECT (SELECT last_state::text FROM tide._health({at}) WHERE task = '{task}')"
            ),
        )
    };
    // Folded with no run yet; then the tick at the fire creates the window's run.
    tick(&mut c, "now()")?;
    assert_eq!(last_state(&mut c, "y")?, None);
    tick(&mut c, &at)?;
    let fired: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'y'",
    )?;
    assert_eq!(fired, 1, "the tick fired the yearly task");
    assert_eq!(
        last_state(&mut c, "y")?.as_deref(),
        Some("ready"),
        "the tick's fire"
    );
    for (task, call) in [
        ("j", "SELECT count(*) FROM tide.enqueue('j', '{}')"),
        (
            "j",
            "SELECT count(*) FROM tide.enqueue('j', '[{}, {}]', dedupe_key => 'k1')",
        ),
        ("ev", "SELECT tide.emit('m.ev')"),
        ("ev", "SELECT tide.emit('m.ev', dedupe_key => 'e1')"),
        (
            "ev",
            "SELECT tide.emit_many('m.ev', ARRAY['{}', '{}']::jsonb[])",
        ),
    ] {
        // Everything ready run and succeeded, and folded.
        exec(
            &mut c,
            "SELECT tide.complete_runs(array_agg(run_id), array_agg(lease_token))
               FROM tide.claim_runs('default', worker => 'w', n => 1000)",
        )?;
        tick(&mut c, &at)?;
        let before = last_state(&mut c, task)?;
        assert!(
            matches!(before.as_deref(), None | Some("succeeded")),
            "before {call}: {before:?}"
        );
        exec(&mut c, call)?;
        assert_eq!(
            last_state(&mut c, task)?.as_deref(),
            Some("ready"),
            "{call}"
        );
    }
    Ok(())
}

/// Parses Prometheus text with the reference parser (Python's prometheus_client); returns one
/// line per sample: "name{label=value,...} value", labels sorted.
fn parse_prometheus(text: &str) -> Result<Vec<String>, Failed> {
    const PARSER: &str = "
import sys
from prometheus_client.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        labels = ','.join('%s=%s' % kv for kv in sorted(s.labels.items()))
        print('%s|%s{%s} %r' % (family.type, s.name, labels, s.value))
";
    Ok(reference_parser(PARSER, text)?
        .lines()
        .map(str::to_string)
        .collect())
}

/// Runs a Python program with the reference parser on the exposition; returns what it printed.
fn reference_parser(program: &str, text: &str) -> Result<String, Failed> {
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", program])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!("python3: {e} (scripts/setup.sh installs python3-prometheus-client)")
        })?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(text.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "the Prometheus parser refused tide.metrics():\n{}\n--- text ---\n{text}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn metrics_parse_as_prometheus_text(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_metrics")?;
    // A name that needs escaping in a label value.
    exec(
        &mut c,
        r#"SELECT tide.schedule('odd "name" \ here', '0 0 1 1 *', max_attempts => 1);
           SELECT tide.schedule('plain', '0 0 1 1 *');
           SELECT tide.create_check('backup', '1 day');"#,
    )?;
    for h in 1..=2 {
        let run = past_run(&mut c, "plain", h)?;
        succeed(&mut c, run)?;
    }
    // The third completed inside a COPY (SELECT ...) TO STDOUT: it counts like any call (only a
    // restore's COPY into tide.run_event brings counts of its own).
    let run = past_run(&mut c, "plain", 3)?;
    let token = claim_run(&mut c, run)?;
    let mut out = String::new();
    std::io::Read::read_to_string(
        &mut c
            .copy_out(&format!(
                "COPY (SELECT tide.complete_run({run}, {token})) TO STDOUT"
            ))
            .map_err(db_err)?,
        &mut out,
    )?;
    let dead = past_run(&mut c, r#"odd "name" \ here"#, 1)?;
    let token = claim_run(&mut c, dead)?;
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({dead}, {token}, 'bad row', 'business')"),
    )?;
    tick(&mut c, "now()")?;

    let text: String = one(&mut c, "SELECT tide.metrics()")?;
    let samples = parse_prometheus(&text)?;
    let has = |line: &str| samples.iter().any(|s| s == line);
    for line in [
        "counter|pg_tide_runs_total{outcome=succeeded,owner=postgres,task=plain} 3.0",
        r#"counter|pg_tide_runs_total{outcome=dead,owner=postgres,task=odd "name" \ here} 1.0"#,
        "gauge|pg_tide_task_unresolved_runs{owner=postgres,state=dead,task=odd \"name\" \\ here} 1.0",
        "histogram|pg_tide_run_duration_seconds_count{owner=postgres,task=plain} 3.0",
        "histogram|pg_tide_run_duration_seconds_bucket{le=+Inf,owner=postgres,task=plain} 3.0",
        "gauge|pg_tide_check_status{check=backup,owner=postgres,status=new} 1.0",
        "gauge|pg_tide_alerts_open{kind=dead_letter,severity=warning} 1.0",
        "gauge|pg_tide_task_status{owner=postgres,status=ok,task=plain} 1.0",
        "gauge|pg_tide_task_status{owner=postgres,status=failing,task=odd \"name\" \\ here} 1.0",
    ] {
        assert!(has(line), "missing {line} in:\n{}", samples.join("\n"));
    }
    for family in [
        "pg_tide_queue_wait_seconds",
        "pg_tide_task_backlog",
        "pg_tide_task_silence_seconds",
        "pg_tide_task_duration_p95_seconds",
    ] {
        assert!(
            samples.iter().any(|s| s.contains(&format!("|{family}"))),
            "no {family} samples"
        );
    }
    // The three successes of `plain`: the buckets are cumulative, each holding at least what
    // the one below holds, and the last (+Inf) all three. (How long each took is the machine's:
    // a first completion in a fresh session can take over 10 ms while caches fill.)
    let plain_buckets: Vec<&String> = samples
        .iter()
        .filter(|s| {
            s.starts_with("histogram|pg_tide_run_duration_seconds_bucket{")
                && s.contains("task=plain}")
        })
        .collect();
    assert_eq!(
        plain_buckets.len(),
        14,
        "13 bounds and +Inf: {plain_buckets:?}"
    );
    let counts: Vec<f64> = plain_buckets
        .iter()
        .filter_map(|s| s.rsplit(' ').next()?.parse().ok())
        .collect();
    assert!(
        counts.len() == 14 && counts.windows(2).all(|w| w[0] <= w[1]) && counts[13] == 3.0,
        "{plain_buckets:?}"
    );

    // The view tide.metric holds the same samples as rows: the reference parser's reading of
    // the text, compared in SQL with the view (labels with owner and task put back).
    // One transaction: the same now() for both (silences are measured to it).
    let mut tx = c.transaction().map_err(db_err)?;
    let text: String = tx
        .query_one("SELECT tide.metrics()", &[])
        .map_err(db_err)?
        .get(0);
    let parsed = parse_prometheus_json(&text)?;
    let compare = "
        WITH parsed AS (
            SELECT e->>0 AS kind, e->>1 AS metric, e->2 AS labels, (e->>3)::float8 AS value
              FROM jsonb_array_elements($1::text::jsonb) e),
        viewed AS (
            SELECT kind, metric, labels || jsonb_strip_nulls(jsonb_build_object('owner', owner, 'task', task)) AS labels, value
              FROM tide.metric)
        SELECT format('%s parsed, %s in the view; only parsed: %s; only in the view: %s',
                      (SELECT count(*) FROM parsed), (SELECT count(*) FROM viewed),
                      (SELECT coalesce(string_agg(x::text, ', '), '-') FROM (SELECT * FROM parsed EXCEPT ALL SELECT * FROM viewed) x),
                      (SELECT coalesce(string_agg(x::text, ', '), '-') FROM (SELECT * FROM viewed EXCEPT ALL SELECT * FROM parsed) x))";
    let got: String = tx.query_one(compare, &[&parsed]).map_err(db_err)?.get(0);
    tx.rollback().map_err(db_err)?;
    let n = samples.len();
    assert_eq!(
        got,
        format!("{n} parsed, {n} in the view; only parsed: -; only in the view: -")
    );
    Ok(())
}

/// As `parse_prometheus`, as a JSON array of [type, name, labels, value] (value as text: NaN
/// and infinities are not JSON numbers).
fn parse_prometheus_json(text: &str) -> Result<String, Failed> {
    const PARSER: &str = "
import json, sys
from prometheus_client.parser import text_string_to_metric_families
print(json.dumps([[f.type, s.name, s.labels, repr(s.value)]
                  for f in text_string_to_metric_families(sys.stdin.read()) for s in f.samples]))
";
    reference_parser(PARSER, text)
}

fn pruning_removes_only_what_it_should(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_prune")?;
    exec(
        &mut c,
        "SELECT tide.schedule('p', '0 0 1 1 *', max_attempts => 1)",
    )?;
    // 14 finished runs of past windows: the oldest dead, the next need_check, 12 succeeded.
    let mut runs = Vec::new();
    for h in (1..=14).rev() {
        runs.push(past_run(&mut c, "p", h)?);
    }
    let token = claim_run(&mut c, runs[0])?;
    exec(
        &mut c,
        &format!(
            "SELECT tide.fail_run({}, {token}, 'bad', 'business')",
            runs[0]
        ),
    )?;
    let token = claim_run(&mut c, runs[1])?;
    exec(
        &mut c,
        &format!(
            "SELECT tide.complete_run({}, {token}, expected => 2, actual => 1)",
            runs[1]
        ),
    )?;
    for &run in &runs[2..] {
        succeed(&mut c, run)?;
    }
    // A resolved alert from long ago, and a run still ready (never pruned).
    exec(
        &mut c,
        "INSERT INTO tide.alert (subject_type, subject, kind, severity, opened_at, last_seen_at, resolved_at, owner)
         VALUES ('task', 'p', 'backlog', 'warning', now() - interval '9 days', now() - interval '9 days', now() - interval '8 days', 'postgres');
         SELECT tide.pause('p');",
    )?;
    let ready = past_run(&mut c, "p", 20)?;
    // Side effects: one delivered (pruned with old history), one still pending and one dead
    // (both kept: they are not done).
    exec(
        &mut c,
        "SELECT tide.create_effect('sms', 'sent'), tide.create_effect('sms', 'given_up', max_attempts => 1);
         SELECT tide.complete_effect(e.effect_id, e.lease_token) FROM tide.claim_effects('sms', n => 1) e;
         SELECT tide.fail_effect(e.effect_id, e.lease_token, 'no such number') FROM tide.claim_effects('sms', n => 1) e;
         SELECT tide.create_effect('sms', 'waiting');",
    )?;
    let effects = |c: &mut Client| -> Result<String, Failed> {
        one(
            c,
            "SELECT string_agg(dedupe_key || ':' || state, ',' ORDER BY dedupe_key) FROM tide.effect",
        )
    };
    assert_eq!(
        effects(&mut c)?,
        "given_up:dead,sent:delivered,waiting:pending"
    );
    let counter = |c: &mut Client| -> Result<String, Failed> {
        let text: String = one(c, "SELECT tide.metrics()")?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with("pg_tide_runs_total{owner=\"postgres\",task=\"p\""))
            .collect::<Vec<_>>()
            .join(" "))
    };
    let before = counter(&mut c)?;

    // Nothing is old enough yet at the default retention (30 days).
    tick(&mut c, "now() + interval '2 days'")?;
    let all: i64 = one(&mut c, "SELECT count(*) FROM tide.run")?;
    assert_eq!(all, 15);
    assert_eq!(
        effects(&mut c)?,
        "given_up:dead,sent:delivered,waiting:pending"
    );
    // With a retention of one day, two days on: the 12 succeeded runs are old; the 10 newest
    // windows are kept whatever they are, so the 2 oldest succeeded ones go. Dead, need_check
    // and the ready run stay.
    exec(&mut c, "SET pg_tide.history_retention = '1d'")?;
    tick(&mut c, "now() + interval '2 days 1 minute'")?;
    let kept: String = one(
        &mut c,
        "SELECT string_agg(state::text, ',' ORDER BY window_start) FROM tide.run",
    )?;
    assert_eq!(
        kept,
        "ready,dead,need_check,succeeded,succeeded,succeeded,succeeded,succeeded,succeeded,succeeded,succeeded,succeeded,succeeded"
    );
    let gone: String = one(
        &mut c,
        &format!("SELECT string_agg(run_id::text, ',' ORDER BY run_id) FROM unnest(ARRAY[{}, {}]) r(run_id)
                  WHERE NOT EXISTS (SELECT 1 FROM tide.run x WHERE x.run_id = r.run_id)", runs[2], runs[3]),
    )?;
    assert_eq!(
        gone,
        format!("{},{}", runs[2], runs[3]),
        "the two oldest succeeded runs"
    );
    let orphans: i64 = one(
        &mut c,
        "SELECT (SELECT count(*) FROM tide.attempt a WHERE NOT EXISTS (SELECT 1 FROM tide.run r WHERE r.run_id = a.run_id))
              + (SELECT count(*) FROM tide.run_event e WHERE NOT EXISTS (SELECT 1 FROM tide.run r WHERE r.run_id = e.run_id))",
    )?;
    assert_eq!(orphans, 0, "attempts and history go with their runs");
    let still_ready: String = one(
        &mut c,
        &format!("SELECT state::text FROM tide.run WHERE run_id = {ready}"),
    )?;
    assert_eq!(still_ready, "ready");
    let alerts: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.alert WHERE resolved_at < now() - interval '1 day'",
    )?;
    assert_eq!(alerts, 0, "the old resolved alert is pruned");
    let open: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.alert WHERE resolved_at IS NULL AND kind = 'dead_letter'",
    )?;
    assert_eq!(open, 1, "open alerts stay");
    assert_eq!(
        effects(&mut c)?,
        "given_up:dead,waiting:pending",
        "the delivered effect is pruned"
    );
    // Counters never go down: pruned runs still count.
    assert_eq!(counter(&mut c)?, before);
    Ok(())
}

/// The fields of a run log line, in order (R8.7).
const LOG_KEYS: [&str; 10] = [
    "event", "task", "run_id", "biz_date", "trigger", "version", "attempt", "state", "duration",
    "error",
];

/// The key=value fields of a `pg_tide: event=...` log line, in order; a quoted value is a JSON
/// string (tide._logfmt).
fn log_fields(line: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(start) = line.find("pg_tide: ") else {
        return out;
    };
    let mut rest = &line[start + "pg_tide: ".len()..];
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().to_string();
        let after = &rest[eq + 1..];
        let (value, next) = if after.starts_with('"') {
            // The closing quote: the first one not escaped.
            let bytes = after.as_bytes();
            let mut i = 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            let quoted = &after[..(i + 1).min(after.len())];
            (
                serde_json::from_str::<String>(quoted).unwrap_or_else(|_| quoted.to_string()),
                &after[(i + 1).min(after.len())..],
            )
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            (after[..end].to_string(), &after[end..])
        };
        out.push((key, value));
        rest = next.trim_start();
    }
    out
}

fn run_log_lines(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_logs")?;
    let log = cluster.data_dir.join("server.log");
    let read_from = |offset: usize| -> Result<String, String> {
        let text = std::fs::read_to_string(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        Ok(text.get(offset..).unwrap_or_default().to_string())
    };
    exec(&mut c, "SELECT tide.schedule('logged task', '0 0 1 1 *', max_attempts => 3, backoff_base => '1 second')")?;
    let start = read_from(0)?.len();
    let run = past_run(&mut c, "logged task", 2)?;
    let token = claim_run(&mut c, run)?;
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({run}, {token}, 'connection reset')"),
    )?;
    tick(&mut c, "now() + interval '1 minute'")?;
    succeed(&mut c, run)?;
    // The lines are written by this backend before its statements return; the file is read
    // until they are all there (the logging collector may lag).
    let lines = pg_tide_pg_test::wait_for("the run log lines", Duration::from_secs(10), || {
        let text = read_from(start)?;
        let lines: Vec<String> = text
            .lines()
            .filter(|l| l.contains("pg_tide: event=") && l.contains(&format!("run_id={run} ")))
            .map(str::to_string)
            .collect();
        Ok((lines.len() >= 4).then_some(lines))
    })?;
    let events: Vec<&str> = lines
        .iter()
        .map(|l| {
            l.split("event=")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .unwrap_or("")
        })
        .collect();
    assert_eq!(
        events,
        ["start", "failure", "start", "success"],
        "{lines:#?}"
    );
    assert!(
        lines[1].contains("task=\"logged task\"")
            && lines[1].contains("error=\"connection reset\""),
        "{}",
        lines[1]
    );
    assert!(
        lines[1].contains("attempt=1 state=retry") && lines[1].contains("trigger=manual"),
        "{}",
        lines[1]
    );
    assert!(
        lines[3].contains("attempt=2 state=succeeded") && lines[3].contains("duration="),
        "{}",
        lines[3]
    );
    assert!(lines.iter().all(|l| l.contains(" LOG: ")), "{lines:#?}");
    // R8.7: every line has every field, in order, with the run's own business date and rule
    // version.
    let (biz_date, version): (String, String) = {
        let row = c
            .query_one(
                &format!("SELECT biz_date::text, version::text FROM tide.run WHERE run_id = {run}"),
                &[],
            )
            .map_err(db_err)?;
        (row.get(0), row.get(1))
    };
    for line in &lines {
        let f = log_fields(line);
        let keys: Vec<&str> = f.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, LOG_KEYS, "{line}");
        let get = |k: &str| {
            f.iter()
                .find(|(x, _)| x == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        assert_eq!(get("task"), "logged task", "{line}");
        assert_eq!(get("run_id"), run.to_string(), "{line}");
        assert_eq!(get("biz_date"), biz_date, "{line}");
        assert_eq!(get("trigger"), "manual", "{line}");
        assert_eq!(get("version"), version, "{line}");
    }
    // Off: nothing; an idle tick logs nothing either way.
    let mark = read_from(0)?.len();
    exec(&mut c, "SET pg_tide.log_runs = 'off'")?;
    let quiet = past_run(&mut c, "logged task", 3)?;
    succeed(&mut c, quiet)?;
    exec(&mut c, "RESET pg_tide.log_runs")?;
    tick(&mut c, "now() + interval '2 minutes'")?;
    // A marker written after: once it is in the file, everything before it is too.
    exec(&mut c, "DO $$ BEGIN RAISE LOG 'm_logs marker'; END $$")?;
    let after = pg_tide_pg_test::wait_for("the marker", Duration::from_secs(10), || {
        let text = read_from(mark)?;
        Ok(text.contains("m_logs marker").then_some(text))
    })?;
    let stray: Vec<&str> = after.lines().filter(|l| l.contains("pg_tide:")).collect();
    assert!(stray.is_empty(), "{stray:#?}");
    let (code, _, _) = refused(&mut c, "SET pg_tide.log_runs = 'loud'")?;
    assert_eq!(code, "22023");
    // A skip line (last: the silence its missed fires open is logged too): fires missed by more than the misfire threshold, recorded as skipped.
    exec(
        &mut c,
        "SELECT tide.schedule('skipped task', '*/10 * * * *', misfire => 'skip')",
    )?;
    let mark = read_from(0)?.len();
    tick(&mut c, "now() + interval '35 minutes'")?;
    let skipped: (i64, String) = {
        let row = c
            .query_one(
                "SELECT r.run_id, r.biz_date::text FROM tide.run r JOIN tide.task t USING (task_id)
                  WHERE t.name = 'skipped task' AND r.state = 'skipped' ORDER BY r.run_id LIMIT 1",
                &[],
            )
            .map_err(db_err)?;
        (row.get(0), row.get(1))
    };
    let skip_line = pg_tide_pg_test::wait_for("a skip line", Duration::from_secs(10), || {
        let text = read_from(mark)?;
        Ok(text
            .lines()
            .find(|l| {
                l.contains("pg_tide: event=skip") && l.contains(&format!("run_id={} ", skipped.0))
            })
            .map(str::to_string))
    })?;
    let f = log_fields(&skip_line);
    let keys: Vec<&str> = f.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, LOG_KEYS, "{skip_line}");
    let values: Vec<&str> = f.iter().map(|(_, v)| v.as_str()).collect();
    assert_eq!(
        values,
        [
            "skip",
            "skipped task",
            &skipped.0.to_string(),
            &skipped.1,
            "skip:misfire",
            "1",
            "0",
            "skipped",
            "-",
            "-"
        ],
        "{skip_line}"
    );

    Ok(())
}

fn explain_tells_the_story_of_a_run(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_explain")?;
    exec(
        &mut c,
        "SELECT tide.schedule('x', '0 0 1 1 *', max_attempts => 2, backoff_base => '1 second')",
    )?;
    let run = past_run(&mut c, "x", 2)?;
    let token = claim_run(&mut c, run)?;
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({run}, {token}, 'deadlock detected')"),
    )?;
    tick(&mut c, "now() + interval '1 minute'")?;
    let token = claim_run(&mut c, run)?;
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({run}, {token}, 'deadlock again')"),
    )?;
    let lines: Vec<String> = c
        .query(&format!("SELECT * FROM tide.explain({run})"), &[])
        .map_err(db_err)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let text = lines.join("\n");
    let events: i64 = one(
        &mut c,
        &format!("SELECT count(*) FROM tide.run_event WHERE run_id = {run}"),
    )?;
    let history = lines.iter().filter(|l| l.contains(" -> ")).count();
    assert_eq!(history as i64, events, "one line per state change:\n{text}");
    assert!(
        lines[0].starts_with(&format!("run {run} of task x, rule version 1")),
        "{text}"
    );
    assert!(text.contains("trigger: manual"), "{text}");
    assert!(
        text.contains("#1 by w1")
            && text.contains("failed after")
            && text.contains("deadlock detected"),
        "{text}"
    );
    assert!(
        text.contains("#2 by w1") && text.contains("deadlock again"),
        "{text}"
    );
    assert!(text.contains("state: dead"), "{text}");
    assert!(
        lines
            .last()
            .is_some_and(|l| l.contains(&format!("tide.replay_run({run})"))),
        "{text}"
    );
    let (code, message, hint) = refused(&mut c, "SELECT * FROM tide.explain(-1)")?;
    assert_eq!((code.as_str(), message.as_str()), ("42704", "no run -1"));
    assert!(!hint.is_empty());
    Ok(())
}

fn dashboard_is_worst_first_in_80_columns(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_dashboard")?;
    exec(
        &mut c,
        "SELECT tide.schedule('a_fine_task_with_a_long_name_indeed', '0 0 1 1 *');
         SELECT tide.schedule('b_broken', '0 0 1 1 *', max_attempts => 1);
         SELECT tide.schedule('c_paused', '0 0 1 1 *');
         SELECT tide.pause('c_paused');",
    )?;
    let ok = past_run(&mut c, "a_fine_task_with_a_long_name_indeed", 1)?;
    succeed(&mut c, ok)?;
    let bad = past_run(&mut c, "b_broken", 1)?;
    let token = claim_run(&mut c, bad)?;
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({bad}, {token}, 'x', 'business')"),
    )?;
    let order: String = one(&mut c, "SELECT string_agg(status, ',') FROM tide.dashboard")?;
    assert_eq!(order, "failing,ok,paused");
    // Within a status: the more severe first, then the longer silent, then by name. Three tasks
    // made in one transaction (the same silence), one of them critical.
    exec(
        &mut c,
        "SELECT tide.schedule('z_never', '0 0 1 1 *');
         SELECT tide.schedule('y_never', '0 0 1 1 *');
         SELECT tide.schedule('x_never_critical', '0 0 1 1 *');
         SELECT tide.monitor('x_never_critical', severity => 'critical');",
    )?;
    exec(&mut c, "SELECT tide.schedule('w_never_newer', '0 0 1 1 *')")?;
    let order: String = one(&mut c, "SELECT string_agg(task, ',') FROM tide.dashboard")?;
    assert_eq!(
        order,
        "b_broken,x_never_critical,y_never,z_never,w_never_newer,a_fine_task_with,c_paused"
    );
    let (text, errors) = cluster.psql("m_dashboard", "SELECT * FROM tide.dashboard")?;
    assert!(
        errors.is_empty() && text.contains("b_broken"),
        "{text}{errors}"
    );
    let widest = text.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(widest <= 80, "{widest} columns:\n{text}");
    // Row-level security: another role sees none of these tasks.
    exec(&mut c, "DROP ROLE IF EXISTS eve; CREATE ROLE eve LOGIN")?;
    let mut eve = cluster.connect_as("m_dashboard", "eve")?;
    let seen: i64 = one(&mut eve, "SELECT count(*) FROM tide.health")?;
    assert_eq!(seen, 0);
    Ok(())
}

fn alerts_are_delivered_once_per_opening(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_delivery")?;
    exec(
        &mut c,
        "SELECT tide.schedule('d', '0 0 1 1 *', max_attempts => 1);
         SELECT tide.monitor('d', max_silence => '30 days', severity => 'critical');
         SELECT tide.schedule('quiet', '0 0 1 1 *', max_attempts => 1);
         SELECT tide.monitor('quiet', max_silence => '30 days', severity => 'info');
         SELECT tide.create_alert_route('chat:ops');
         SELECT tide.create_alert_route('pager', min_severity => 'critical', kinds => ARRAY['dead_letter'], resolved => false);",
    )?;
    let deliveries = |c: &mut Client| -> Result<String, Failed> {
        one(
            c,
            "SELECT coalesce(string_agg(e.channel || ' ' || (e.payload->>'event') || ' ' || (e.payload->>'subject') || ' '
                                         || (e.payload->>'kind') || ' ' || (e.dedupe_key = format('alert:%s:%s:%s', e.payload->>'alert_id', e.payload->>'event', e.channel)),
                                         ', ' ORDER BY e.effect_id), '')
               FROM tide.effect e",
        )
    };
    let dead = past_run(&mut c, "d", 1)?;
    let token = claim_run(&mut c, dead)?;
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({dead}, {token}, 'bad file', 'business')"),
    )?;
    let quiet = past_run(&mut c, "quiet", 1)?;
    let token = claim_run(&mut c, quiet)?;
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({quiet}, {token}, 'bad file', 'business')"),
    )?;
    tick(&mut c, "now()")?;
    // chat:ops takes warning and above; the info task's alert goes nowhere; the pager takes the
    // critical dead letter only.
    assert_eq!(
        deliveries(&mut c)?,
        "chat:ops opened d dead_letter true, pager opened d dead_letter true"
    );
    // Evaluated again: the alert is still open (count 2), nothing is sent twice.
    tick(&mut c, "now() + interval '1 minute'")?;
    assert_eq!(
        open_alerts(&mut c)?,
        "task:d:dead_letterx2 task:quiet:dead_letterx2"
    );
    assert_eq!(
        deliveries(&mut c)?,
        "chat:ops opened d dead_letter true, pager opened d dead_letter true"
    );
    // Resolved: chat:ops hears of it, the pager (resolved => false) does not.
    exec(&mut c, &format!("SELECT tide.replay_run({dead})"))?;
    tick(&mut c, "now() + interval '2 minutes'")?;
    assert_eq!(
        deliveries(&mut c)?,
        "chat:ops opened d dead_letter true, pager opened d dead_letter true, chat:ops resolved d dead_letter true"
    );
    // A delivery worker takes them from its channel.
    let taken: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.claim_effects('chat:ops', n => 10)",
    )?;
    assert_eq!(taken, 2);

    for (sql, code, needle) in [
        (
            "SELECT tide.create_alert_route('bad channel')",
            "22023",
            "'bad channel'",
        ),
        (
            "SELECT tide.create_alert_route('x', min_severity => 'loud')",
            "22023",
            "\"loud\"",
        ),
        (
            "SELECT tide.create_alert_route('x', kinds => ARRAY['silence', 'fire'])",
            "22023",
            "'fire'",
        ),
        (
            "SELECT tide.drop_alert_route('no such')",
            "22023",
            "'no such'",
        ),
    ] {
        let (got, message, hint) = refused(&mut c, sql)?;
        assert_eq!(got, code, "{sql}: {message}");
        assert!(message.contains(needle), "{sql}: {message}");
        assert!(!hint.is_empty(), "{sql}: no hint");
    }
    let dropped: bool = one(&mut c, "SELECT tide.drop_alert_route('pager')")?;
    let nothing: bool = one(&mut c, "SELECT tide.drop_alert_route('pager')")?;
    assert!(dropped && !nothing, "true once, then false: no route to it");
    let routes: String = one(
        &mut c,
        "SELECT string_agg(channel, ',') FROM tide.alert_route",
    )?;
    assert_eq!(routes, "chat:ops");
    Ok(())
}

/// Task health of a task with few runs reads those runs, not the history of the others: when
/// one event task holds most of the history, the planner took the primary key's order for "the
/// newest event runs of this task" and walked back through every run (2 seconds per task with
/// 1,000,000 runs: a fold of 10,000 new tasks stalled the tick for many minutes). The console's
/// page of a task lists its runs the same way (it scanned tide.run whole: 15 seconds over
/// 1,160,000 runs).
fn health_of_a_quiet_task_skips_the_busy_ones(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("m_skew")?;
    exec(
        &mut c,
        "SELECT tide.schedule('firehose', NULL, topics => ARRAY['firehose'], queue => 'firehose');
         SELECT tide.schedule('quiet', NULL, topics => ARRAY['quiet'], queue => 'quiet');
         SELECT tide.schedule('idle_one', '0 0 1 1 *', queue => 'idle');
         SELECT tide.emit_many('firehose', (SELECT array_agg(jsonb_build_object('i', g)) FROM generate_series(1, 50000) g));
         SELECT tide.emit_many('quiet', ARRAY['{}', '{}', '{}']::jsonb[]);
         ANALYZE tide.run;",
    )?;
    for task in ["quiet", "idle_one"] {
        let read = blocks_read(
            &mut c,
            "tide.run",
            &format!(
                "SELECT count(*) FROM tide._task_history(now(),
                     ARRAY(SELECT task_id FROM tide.task WHERE name = '{task}'))"
            ),
        )?;
        assert!(
            read < 100,
            "the health figures of {task} read {read} blocks of tide.run: the 50,000 runs of another task were walked"
        );
    }
    // The console's list of a task's runs (as its page asks it: no filter, then one state),
    // for a task with runs without a window, one with a window, and one with both.
    exec(
        &mut c,
        "SELECT tide.schedule('hourly_one', '0 * * * *', queue => 'idle', topics => ARRAY['hourly_one']);
         SELECT tide.rerun('hourly_one', window_start => date_trunc('hour', now()) - g * interval '1 hour')
           FROM generate_series(1, 5) g;
         SELECT tide.emit_many('hourly_one', ARRAY['{}', '{}']::jsonb[]);
         ANALYZE tide.run;",
    )?;
    for task in ["quiet", "idle_one", "hourly_one"] {
        for state in ["NULL", "'dead'"] {
            let id: i64 = one(
                &mut c,
                &format!("SELECT task_id FROM tide.task WHERE name = '{task}'"),
            )?;
            let page = TASK_RUNS_SQL
                .replace("$1", &id.to_string())
                .replace("$2", &format!("{state}::text"))
                .replace("$3", "NULL::text")
                .replace("$4", "NULL::text")
                .replace("$5", "101::bigint")
                .replace("$6", "0::bigint");
            let read = blocks_read(&mut c, "tide.run", &page)?;
            assert!(
                read < 100,
                "the console's runs of {task} (state {state}) read {read} blocks of tide.run: the 50,000 runs of another task were walked"
            );
        }
    }
    let listed: i64 = one(
        &mut c,
        &format!(
            "SELECT count(*) FROM ({}) x",
            TASK_RUNS_SQL
                .replace(
                    "$1",
                    "(SELECT task_id FROM tide.task WHERE name = 'hourly_one')"
                )
                .replace("$2", "NULL::text")
                .replace("$3", "NULL::text")
                .replace("$4", "NULL::text")
                .replace("$5", "100::bigint")
                .replace("$6", "0::bigint")
        ),
    )?;
    let runs: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'hourly_one'",
    )?;
    assert_eq!(
        listed,
        runs.min(100),
        "the page lists the task's newest runs, both kinds"
    );
    // The dead letters (the console's page of them too) read the dead runs, not the history.
    exec(
        &mut c,
        "SELECT tide.fail_run(c.run_id, c.lease_token, 'no such account', 'business')
           FROM tide.claim_runs('quiet', 'w', 1) c",
    )?;
    let read = blocks_read(&mut c, "tide.run", "SELECT count(*) FROM tide.dead_letter")?;
    assert!(
        read < 100,
        "tide.dead_letter read {read} blocks of tide.run: the 50,000 runs of another task were walked"
    );
    let dead: String = one(
        &mut c,
        "SELECT string_agg(task || ': ' || last_error, ', ') FROM tide.dead_letter",
    )?;
    assert_eq!(dead, "quiet: no such account");
    // The busy task's own figures still come from its newest runs.
    let last: String = one(
        &mut c,
        "SELECT last_state::text FROM tide._task_history(now(), ARRAY(SELECT task_id FROM tide.task WHERE name = 'firehose'))",
    )?;
    assert_eq!(last, "ready");
    Ok(())
}

/// The console's query for the runs of one task (console/src/pages/task.rs).
const TASK_RUNS_SQL: &str = include_str!("../../console/sql/task_runs.sql");

/// A Grafana SQL query with its macros expanded as Grafana's PostgreSQL data source expands
/// them, for the last 6 hours: `$__timeFilter(col)` and `$__timeGroupAlias(col, 5m)`. Any other
/// macro or variable is refused: the test would not know what Grafana makes of it.
fn expand_grafana_macros(sql: &str) -> Result<String, Failed> {
    let mut out = String::new();
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let (name, args_start) = match after.find('(') {
            Some(i) => (&after[..i], i + 1),
            None => return Err(format!("a bare $ in: {sql}").into()),
        };
        let close = after[args_start..]
            .find(')')
            .ok_or_else(|| format!("unclosed {name}( in: {sql}"))?;
        let args: Vec<&str> = after[args_start..args_start + close]
            .split(',')
            .map(str::trim)
            .collect();
        let range = "'now'::timestamptz - interval '6 hours' AND 'now'::timestamptz";
        match (name, args.as_slice()) {
            ("$__timeFilter", [col]) => out.push_str(&format!("{col} BETWEEN {range}")),
            ("$__timeGroupAlias", [col, "5m"]) => out.push_str(&format!(
                "floor(extract(epoch from {col})/300)*300 AS \"time\""
            )),
            _ => return Err(format!("unknown Grafana macro {name}({args:?}) in: {sql}").into()),
        }
        rest = &after[args_start + close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Every query of the Grafana dashboard in the repository (monitoring/grafana-dashboard.json)
/// runs against a database with tasks, successes, a dead letter and its alert, and returns rows;
/// each panel reads pg_tide through the data source the dashboard asks for on import.
fn grafana_dashboard_queries_run(cluster: &Cluster) -> Result<(), Failed> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../monitoring/grafana-dashboard.json"
    );
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut c = cluster.fresh_db("m_grafana")?;
    exec(
        &mut c,
        "SELECT tide.schedule('g_ok', '0 0 1 1 *');
         SELECT tide.schedule('g_bad', '0 0 1 1 *', max_attempts => 1);",
    )?;
    for h in 1..=3 {
        let run = past_run(&mut c, "g_ok", h)?;
        succeed(&mut c, run)?;
    }
    let dead = past_run(&mut c, "g_bad", 1)?;
    let token = claim_run(&mut c, dead)?;
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({dead}, {token}, 'bad row', 'business')"),
    )?;
    past_run(&mut c, "g_bad", 2)?;
    tick(&mut c, "now()")?;

    let panels = dashboard["panels"].as_array().ok_or("no panels")?;
    assert!(panels.len() >= 6, "{} panels", panels.len());
    let mut ran = 0;
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or("?");
        assert_eq!(
            panel["datasource"]["type"], "grafana-postgresql-datasource",
            "{title}: the PostgreSQL data source"
        );
        let targets = panel["targets"].as_array().ok_or("no targets")?;
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            let raw = target["rawSql"].as_str().ok_or("no rawSql")?;
            let sql = expand_grafana_macros(raw)?;
            let rows = c
                .query(sql.as_str(), &[])
                .map_err(|e| format!("panel {title:?}: {}\n{sql}", describe(&e)))?;
            // pg_tide itself is shown only in the database pg_tide serves; every other panel
            // has rows here.
            if !raw.contains("tide.self_health") {
                assert!(!rows.is_empty(), "panel {title:?} returned no rows:\n{sql}");
            }
            if target["format"] == "time_series" {
                let time = rows[0].columns()[0].name();
                assert_eq!(
                    time, "time",
                    "{title}: a time series starts with its time column"
                );
            }
            ran += 1;
        }
    }
    assert!(ran >= panels.len());
    Ok(())
}

/// The hourly counters (tide.run_hours) count each attempt's end in its hour, by outcome, as
/// history does; tide.task_health is tide.health's row of one task; both refuse bad input, and
/// the counters follow a role's rows to another (tide.reassign_owned).
fn hourly_counters_and_one_tasks_health(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "DROP ROLE IF EXISTS hc_old; DROP ROLE IF EXISTS hc_new;
         CREATE ROLE hc_old; CREATE ROLE hc_new;
         GRANT tide_worker TO hc_old, hc_new;
         SET ROLE hc_old;
         SELECT tide.schedule('hc', NULL, topics => '{hc}', queue => 'hc', max_attempts => 3);
         SELECT tide.emit_many('hc', array_fill('{}'::jsonb, ARRAY[5]));
         CREATE TEMP TABLE hc_claimed AS SELECT * FROM tide.claim_runs('hc', 'w', 5);
         SELECT tide.complete_run(run_id, lease_token) FROM (SELECT * FROM hc_claimed ORDER BY run_id LIMIT 3) x;
         SELECT tide.fail_run(run_id, lease_token, 'no', 'business') FROM (SELECT * FROM hc_claimed ORDER BY run_id OFFSET 3 LIMIT 1) x;
         SELECT tide.fail_run(run_id, lease_token, 'later', 'transient') FROM (SELECT * FROM hc_claimed ORDER BY run_id OFFSET 4) x;
         RESET ROLE;
         SET ROLE hc_new;
         SELECT tide.schedule('hc2', NULL, topics => '{hc2}', queue => 'hc2');
         SELECT tide.emit('hc2');
         SELECT tide.complete_run(run_id, lease_token) FROM tide.claim_runs('hc2', 'w', 1);
         RESET ROLE;",
    )?;
    tick(&mut c, "now()")?;
    let counted = |c: &mut Client, sql: &str| -> Result<String, Failed> {
        one(
            c,
            &format!(
                "SELECT concat_ws(' ', sum(succeeded), sum(failed), sum(dead), sum(skipped), sum(need_check), sum(cancelled),
                                  bool_and(p50_duration <= p95_duration) FILTER (WHERE succeeded > 0),
                                  count(*))
                   FROM {sql}"
            ),
        )
    };
    // As history says: 3 succeeded, 1 failed and tried again, 1 dead; in the last two hours
    // (this one and the one before: an hour may begin while the test runs); a p50 no longer
    // than the p95.
    assert_eq!(
        counted(
            &mut c,
            "tide.run_hours('hc', owner => 'hc_old', hours => 2)"
        )?,
        "3 1 1 0 0 0 t 2"
    );
    let from_history: String = one(
        &mut c,
        "SELECT concat_ws(' ', count(*) FILTER (WHERE e.to_state = 'succeeded'), count(*) FILTER (WHERE e.to_state = 'retry'),
                          count(*) FILTER (WHERE e.to_state = 'dead'))
           FROM tide.run_event e JOIN tide.run r USING (run_id) JOIN tide.task t USING (task_id) WHERE t.name = 'hc'",
    )?;
    assert_eq!(from_history, "3 1 1");
    assert_eq!(
        counted(&mut c, "tide.run_hours(owner => 'hc_old', hours => 168)")?,
        "3 1 1 0 0 0 t 168",
        "the owner's figures: a week of hours"
    );
    // Each role sees its own: hc_new does not see hc_old's task, nor its hours.
    exec(&mut c, "SET ROLE hc_new")?;
    let (code, msg, hint) = refused(
        &mut c,
        "SELECT * FROM tide.run_hours('hc', owner => 'hc_old')",
    )?;
    assert_eq!(code, "42704", "{msg}");
    assert!(
        msg.contains("task \"hc\" of role hc_old does not exist"),
        "{msg}"
    );
    assert!(hint.contains("SELECT name, owner FROM tide.task"), "{hint}");
    assert_eq!(
        counted(&mut c, "tide.run_hours(hours => 2)")?,
        "1 0 0 0 0 0 t 2"
    );
    exec(&mut c, "RESET ROLE")?;
    // One task's health is tide.health's row of it.
    let same: bool = one(
        &mut c,
        "SELECT (SELECT row(h.*)::text FROM tide.task_health('hc', owner => 'hc_old') h)
              = (SELECT row(h.*)::text FROM tide.health h WHERE h.task = 'hc' AND h.owner = 'hc_old')",
    )?;
    assert!(same, "task_health and health agree");
    let status: String = one(
        &mut c,
        "SELECT status || ' ' || dead FROM tide.task_health('hc', 'hc_old')",
    )?;
    assert_eq!(status, "failing 1");
    // Bad input: refused with its value named and a hint.
    for (sql, code, says) in [
        (
            "SELECT * FROM tide.run_hours(hours => 0)",
            "22023",
            "hours 0 is out of range",
        ),
        (
            "SELECT * FROM tide.run_hours('hc', 'hc_old', 193)",
            "22023",
            "hours 193 is out of range",
        ),
        (
            "SELECT * FROM tide.run_hours(hours => NULL)",
            "22023",
            "hours NULL is out of range",
        ),
        (
            "SELECT * FROM tide.task_health(NULL)",
            "22004",
            "task must not be NULL",
        ),
        (
            "SELECT * FROM tide.task_health('no such task')",
            "42704",
            "task \"no such task\" does not exist",
        ),
        (
            "SELECT * FROM tide.preview('hc2', owner => 'hc_old')",
            "42704",
            "hc2",
        ),
    ] {
        let (got, msg, hint) = refused(&mut c, sql)?;
        assert_eq!(got, code, "{sql}: {msg}");
        assert!(msg.contains(says), "{sql}: {msg}");
        assert!(!hint.is_empty(), "{sql}: a hint");
    }
    // REASSIGN: hc_old's hours are added to hc_new's (both had runs this hour).
    exec(&mut c, "SELECT tide.reassign_owned('hc_old', 'hc_new')")?;
    assert_eq!(
        counted(&mut c, "tide.run_hours(owner => 'hc_new', hours => 2)")?,
        "4 1 1 0 0 0 t 2"
    );
    let left: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.owner_hourly WHERE owner = 'hc_old'",
    )?;
    assert_eq!(left, 0);
    exec(
        &mut c,
        "DROP TABLE hc_claimed; SELECT tide.drop_owned('hc_new'); DROP ROLE hc_old; DROP ROLE hc_new;",
    )?;
    Ok(())
}

fn main() {
    let tests: &[(&str, TestFn)] = &[
        (
            "hourly_counters_and_one_tasks_health",
            hourly_counters_and_one_tasks_health,
        ),
        (
            "health_of_a_quiet_task_skips_the_busy_ones",
            health_of_a_quiet_task_skips_the_busy_ones,
        ),
        (
            "silent_task_turns_late_then_down_and_alerts_once",
            silent_task_turns_late_then_down_and_alerts_once,
        ),
        (
            "derived_max_silence_and_monitor_settings",
            derived_max_silence_and_monitor_settings,
        ),
        (
            "heartbeat_checks_go_late_then_down",
            heartbeat_checks_go_late_then_down,
        ),
        (
            "failures_skips_need_check_and_dead_letters_alert",
            failures_skips_need_check_and_dead_letters_alert,
        ),
        (
            "metrics_parse_as_prometheus_text",
            metrics_parse_as_prometheus_text,
        ),
        (
            "grafana_dashboard_queries_run",
            grafana_dashboard_queries_run,
        ),
        (
            "pruning_removes_only_what_it_should",
            pruning_removes_only_what_it_should,
        ),
        ("run_log_lines", run_log_lines),
        (
            "explain_tells_the_story_of_a_run",
            explain_tells_the_story_of_a_run,
        ),
        (
            "dashboard_is_worst_first_in_80_columns",
            dashboard_is_worst_first_in_80_columns,
        ),
        (
            "alerts_are_delivered_once_per_opening",
            alerts_are_delivered_once_per_opening,
        ),
        (
            "every_task_keeps_figures_or_a_touch_row",
            every_task_keeps_figures_or_a_touch_row,
        ),
        (
            "every_way_of_creating_runs_notes_its_task",
            every_way_of_creating_runs_notes_its_task,
        ),
        (
            "kept_health_figures_match_history",
            kept_health_figures_match_history,
        ),
        (
            "alert_causes_match_every_tasks_health",
            alert_causes_match_every_tasks_health,
        ),
        ("counters_match_history", counters_match_history),
    ];
    run_tests("monitor", tests)
}

//! Reconciliation and compensation on a real cluster with pg_tide's workers (R7): a
//! reconciliation is a task whose runs compare two sides; every kind of difference
//! (missing_right, missing_left, mismatch, duplicate), tolerance, a `when` rule, and every class
//! (auto_fix makes one fix run per difference, replay reruns another task's window once, human
//! alerts); reconciling one date three times compensates once; a difference fixed by its
//! compensation is marked fixed by the next run; a human difference alerts until
//! `tide.resolve_diff` closes it; a side that fails or writes fails the run as a business error
//! naming the side; too many differences compensate nothing; one side through postgres_fdw.
//! Bad input is refused with 22023, the value named and a hint, and writes nothing.

use std::time::Duration;

use pg_tide_pg_test::{
    db_err, exec, one, refused, run_state, run_tests, wait_for, Client, Cluster, Failed, TestFn,
};

/// Runs the reconciliation's window of the day before yesterday (again, with force) and waits
/// until the executors finished it; returns the run id.
fn reconcile_date(c: &mut Client, name: &str) -> Result<i64, Failed> {
    let run: i64 = one(
        c,
        &format!(
            "SELECT tide.rerun('{name}', biz_date => current_date - 2, force => true, version => 'current')"
        ),
    )?;
    let state = wait_run(c, run)?;
    if state != "succeeded" {
        let error: Option<String> = one(
            c,
            &format!("SELECT last_error FROM tide.run WHERE run_id = {run}"),
        )?;
        eprintln!("{name}: run {run} {state}: {error:?}");
    }
    Ok(run)
}

/// Waits until a run has finished (any final state) and returns the state.
fn wait_run(c: &mut Client, run: i64) -> Result<String, Failed> {
    Ok(wait_for(
        &format!("run {run} to finish"),
        Duration::from_secs(30),
        || {
            let s = run_state(c, run)?;
            Ok(matches!(
                s.as_str(),
                "succeeded" | "dead" | "need_check" | "cancelled"
            )
            .then_some(s))
        },
    )?)
}

/// The differences a run recorded: (key, kind, class, status).
fn diffs(c: &mut Client, run: i64) -> Result<Vec<(String, String, String, String)>, Failed> {
    Ok(c.query(
        "SELECT key, kind, class, status FROM tide.recon_diff WHERE run_id = $1 ORDER BY key, kind",
        &[&run],
    )
    .map_err(db_err)?
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
    .collect())
}

fn d(key: &str, kind: &str, class: &str, status: &str) -> (String, String, String, String) {
    (key.into(), kind.into(), class.into(), status.into())
}

fn every_kind_and_class(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    let p = "rk";
    exec(
        &mut c,
        &format!(
            "CREATE TABLE {p}_pay (order_id int, amount numeric(12,2), paid_at timestamptz);
             CREATE TABLE {p}_bank (ref text, amount numeric(12,3), booked_on date);
             CREATE TABLE {p}_source (ref text, amount numeric(12,3), booked_on date);
             INSERT INTO {p}_pay SELECT k, a, (current_date - 2) + interval '10 hours'
               FROM (VALUES (1, 10.00), (2, 20.00), (4, 40.00), (5, 50.00), (6, 60.00), (7, 70.00), (7, 70.00)) v(k, a);
             INSERT INTO {p}_pay VALUES (8, 80.00, (current_date - 1) + interval '10 hours');
             INSERT INTO {p}_bank SELECT r, a, current_date - 2
               FROM (VALUES ('1', 10.00), ('3', 30.00), ('4', 40.50), ('5', 55.00), ('6', 60.005), ('7', 70.00)) v(r, a);
             -- The right amount of k5, which the import loads.
             INSERT INTO {p}_source VALUES ('5', 50.00, current_date - 2);
             -- The fixes: push a missing payment to the bank table, adjust an amount; the
             -- import reloads a date from the source.
             SELECT tide.schedule('{p}_push', '0 0 1 1 *',
                 command => $$INSERT INTO {p}_bank VALUES (tide.args()->>'key', (tide.args()->'left'->>'amount')::numeric, (tide.args()->>'biz_date')::date)$$);
             SELECT tide.schedule('{p}_adjust', '0 0 1 1 *',
                 command => $$UPDATE {p}_bank SET amount = (tide.args()->'left'->>'amount')::numeric WHERE ref = tide.args()->>'key'$$);
             SELECT tide.schedule('{p}_import', '0 5 * * *', biz_window => 'day',
                 command => $$UPDATE {p}_bank b SET amount = s.amount FROM {p}_source s
                               WHERE s.ref = b.ref AND s.booked_on = b.booked_on AND b.booked_on = tide.biz_date()$$);
             SELECT tide.reconcile('{p}_recon', '0 6 * * *', tz => 'UTC', biz_window => 'day',
                 left_sql => $$SELECT order_id::text AS key, amount FROM {p}_pay
                               WHERE paid_at >= tide.window_start() AND paid_at < tide.window_end()$$,
                 right_sql => $$SELECT ref AS key, amount FROM {p}_bank WHERE booked_on = tide.biz_date()$$,
                 amounts => ARRAY['amount'], tolerance => 0.01,
                 rules => '[{{\"kind\": \"missing_right\", \"class\": \"auto_fix\", \"fix_task\": \"{p}_push\"}},
                            {{\"kind\": \"mismatch\", \"when\": \"abs(l.amount - r.amount) < 1\", \"class\": \"auto_fix\", \"fix_task\": \"{p}_adjust\"}},
                            {{\"kind\": \"mismatch\", \"class\": \"replay\", \"replay_task\": \"{p}_import\"}},
                            {{\"kind\": \"missing_left\", \"class\": \"human\", \"severity\": \"critical\"}}]');",
        ),
    )?;
    // A reconciliation is a task: same name, its own schedule, and the built-in command.
    let (kind, version): (String, i32) = {
        let row = c
            .query_one(
                &format!("SELECT reconcile->>'tolerance', version FROM tide.task WHERE name = '{p}_recon'"),
                &[],
            )
            .map_err(db_err)?;
        (row.get(0), row.get(1))
    };
    assert_eq!((kind.as_str(), version), ("0.01", 1), "stored as version 1");

    let run1 = reconcile_date(&mut c, &format!("{p}_recon"))?;
    assert_eq!(run_state(&mut c, run1)?, "succeeded");
    let row = c
        .query_one(
            "SELECT status, left_count, right_count, left_sums->>'amount', right_sums->>'amount',
                    differences, by_kind->>'missing_right', by_kind->>'missing_left', by_kind->>'mismatch',
                    by_kind->>'duplicate', biz_date = current_date - 2
               FROM tide.recon_result WHERE run_id = $1",
            &[&run1],
        )
        .map_err(db_err)?;
    let got: (String, i64, i64, String, String, i32) = (
        row.get(0),
        row.get(1),
        row.get(2),
        row.get(3),
        row.get(4),
        row.get(5),
    );
    // R7.1: counts and sums of each side (7 rows paid that day; 6 at the bank).
    assert_eq!(
        got,
        (
            "needs_human".into(),
            7,
            6,
            "320.00".into(),
            "265.505".into(),
            5
        )
    );
    let kinds: (String, String, String, String, bool) =
        (row.get(6), row.get(7), row.get(8), row.get(9), row.get(10));
    assert_eq!(
        kinds,
        ("1".into(), "1".into(), "2".into(), "1".into(), true),
        "by kind, for the run's business date"
    );
    assert_eq!(
        diffs(&mut c, run1)?,
        vec![
            d("2", "missing_right", "auto_fix", "open"),
            d("3", "missing_left", "human", "open"),
            d("4", "mismatch", "auto_fix", "open"),
            d("5", "mismatch", "replay", "open"),
            d("7", "duplicate", "human", "open"),
        ],
        "k1 matches, k6 is within the tolerance, k8 is another day"
    );
    let (cols, left, right): (Vec<String>, String, String) = {
        let r = c
            .query_one(
                "SELECT columns, \"left\"::text, \"right\"::text FROM tide.recon_diff WHERE run_id = $1 AND key = '4'",
                &[&run1],
            )
            .map_err(db_err)?;
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(
        cols,
        vec!["amount".to_string()],
        "a mismatch names its columns"
    );
    assert_eq!(
        (left.as_str(), right.as_str()),
        (
            r#"{"rows": 1, "amount": 40.00}"#,
            r#"{"rows": 1, "amount": 40.500}"#
        )
    );
    let dup: String = one(
        &mut c,
        &format!("SELECT \"left\"::text FROM tide.recon_diff WHERE run_id = {run1} AND key = '7'"),
    )?;
    assert_eq!(
        dup, r#"{"rows": 2, "amount": 140.00}"#,
        "a duplicate: its rows and sum"
    );

    // The compensations: one run of each fix task per difference, with the difference as args
    // and a dedupe key of reconciliation, date, kind and key; one rerun of the import's date.
    let fix: Vec<(String, String, String)> = c
        .query(
            &format!(
                "SELECT t.name, r.dedupe_key, r.args->>'kind' FROM tide.run r JOIN tide.task t USING (task_id)
                  WHERE t.name IN ('{p}_push', '{p}_adjust') ORDER BY t.name"
            ),
            &[],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        fix,
        vec![
            (
                format!("{p}_adjust"),
                format!("#recon:{p}_recon:{}:mismatch:4", date_ago(&mut c, 2)?),
                "mismatch".into()
            ),
            (
                format!("{p}_push"),
                format!("#recon:{p}_recon:{}:missing_right:2", date_ago(&mut c, 2)?),
                "missing_right".into()
            ),
        ]
    );
    let replay: i64 = one(
        &mut c,
        &format!("SELECT action_run_id FROM tide.recon_diff WHERE run_id = {run1} AND key = '5'"),
    )?;
    let (replay_task, trigger): (String, String) = {
        let r = c
            .query_one(
                "SELECT t.name, r.trigger::text FROM tide.run r JOIN tide.task t USING (task_id) WHERE r.run_id = $1",
                &[&replay],
            )
            .map_err(db_err)?;
        (r.get(0), r.get(1))
    };
    assert_eq!(
        (replay_task, trigger),
        (format!("{p}_import"), "reconcile".into())
    );

    // The health of the reconciliation, and its metrics.
    let health: (String, i32, i32) = {
        let r = c
            .query_one(
                &format!("SELECT status, open_differences, differences_for_a_person FROM tide.health WHERE task = '{p}_recon'"),
                &[],
            )
            .map_err(db_err)?;
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(health, ("unbalanced".into(), 5, 2));
    let metrics: String = one(&mut c, "SELECT tide.metrics()")?;
    assert!(
        metrics.contains(&format!(
            "pg_tide_reconciliation_open_differences{{owner=\"postgres\",task=\"{p}_recon\",for=\"person\"}} 2"
        )) && metrics.contains(&format!(
            "pg_tide_reconciliation_rows{{owner=\"postgres\",task=\"{p}_recon\",side=\"left\"}} 7"
        )),
        "{metrics}"
    );
    // The 80-column views: the reconciliation, and its open differences (a person's first).
    let status: (String, String, i64, i64, i64, i64) = {
        let r = c
            .query_one(
                &format!("SELECT name, status, \"left\", \"right\", open, human FROM tide.recon_status WHERE name = '{p}_recon'"),
                &[],
            )
            .map_err(db_err)?;
        (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5))
    };
    assert_eq!(
        status,
        (format!("{p}_recon"), "needs_human".into(), 7, 6, 5, 2)
    );
    let open: Vec<(String, String)> = c
        .query(
            &format!("SELECT key, class FROM tide.recon_open WHERE recon = '{p}_recon'"),
            &[],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        open.iter()
            .take(2)
            .map(|(_, c)| c.as_str())
            .collect::<Vec<_>>(),
        vec!["human", "human"],
        "{open:?}"
    );
    assert_eq!(open.len(), 5);
    // A human difference alerts, at the highest severity of its rules (k3 critical).
    let severity: String = wait_for("the reconciliation alert", Duration::from_secs(20), || {
        c.query_opt(
            &format!(
                "SELECT severity::text FROM tide.alert WHERE subject = '{p}_recon' AND kind = 'reconciliation' AND resolved_at IS NULL"
            ),
            &[],
        )
        .map(|r| r.map(|r| r.get(0)))
        .map_err(|e| e.to_string())
    })?;
    assert_eq!(severity, "critical");

    // The compensations run (the executors), then the date is reconciled twice more.
    for run in c
        .query(
            &format!(
                "SELECT r.run_id FROM tide.run r JOIN tide.task t USING (task_id)
                  WHERE t.name IN ('{p}_push', '{p}_adjust', '{p}_import')"
            ),
            &[],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| r.get::<_, i64>(0))
    {
        assert_eq!(
            wait_run(&mut c, run)?,
            "succeeded",
            "compensation run {run}"
        );
    }
    let run2 = reconcile_date(&mut c, &format!("{p}_recon"))?;
    let run3 = reconcile_date(&mut c, &format!("{p}_recon"))?;
    assert_eq!(run2, run1, "a rerun of the date reopens the same run");
    assert_eq!(
        one::<i64>(
            &mut c,
            &format!("SELECT count(*) FROM tide.recon_result WHERE run_id = {run1}")
        )?,
        3,
        "one result per reconciliation, nothing overwritten"
    );
    let last: i64 = one(
        &mut c,
        &format!("SELECT max(result_id) FROM tide.recon_result WHERE run_id = {run3}"),
    )?;
    let (status, remaining): (String, Vec<String>) = {
        let r = c
            .query_one(
                "SELECT r.status, ARRAY(SELECT key FROM tide.recon_diff x WHERE x.result_id = r.result_id ORDER BY key)
                   FROM tide.recon_result r WHERE r.result_id = $1",
                &[&last],
            )
            .map_err(db_err)?;
        (r.get(0), r.get(1))
    };
    assert_eq!(
        (status.as_str(), remaining),
        ("needs_human", vec!["3".to_string(), "7".to_string()]),
        "the compensated differences are gone; the human ones remain"
    );
    // Compensated once: one run per fix, one replay of the import (one reopen by a reconcile).
    assert_eq!(
        one::<i64>(
            &mut c,
            &format!(
                "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name IN ('{p}_push', '{p}_adjust')"
            )
        )?,
        2
    );
    assert_eq!(
        one::<i64>(
            &mut c,
            &format!(
                "SELECT count(*) FROM tide.run_event e WHERE e.run_id = {replay} AND e.reason LIKE 'replay asked by reconciliation%'"
            )
        )?,
        1,
        "the replay was asked for once"
    );
    // The first run's compensated rows are fixed by the next run; the human ones stay open.
    let first: Vec<(String, String, Option<i64>)> = c
        .query(
            "SELECT key, status, fixed_by_run FROM tide.recon_diff
              WHERE result_id = (SELECT min(result_id) FROM tide.recon_result WHERE run_id = $1) ORDER BY key",
            &[&run1],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        first,
        vec![
            ("2".into(), "fixed".into(), Some(run1)),
            ("3".into(), "open".into(), None),
            ("4".into(), "fixed".into(), Some(run1)),
            ("5".into(), "fixed".into(), Some(run1)),
            ("7".into(), "open".into(), None),
        ]
    );

    // A person resolves the human differences; the alert resolves.
    let k3: i64 = one(
        &mut c,
        &format!("SELECT diff_id FROM tide.recon_diff WHERE result_id = {last} AND key = '3'"),
    )?;
    let k7: i64 = one(
        &mut c,
        &format!("SELECT diff_id FROM tide.recon_diff WHERE result_id = {last} AND key = '7'"),
    )?;
    assert_eq!(
        one::<String>(
            &mut c,
            &format!("SELECT tide.resolve_diff({k3}, 'accept', 'bank fee, booked by hand')")
        )?,
        "accepted"
    );
    assert_eq!(
        one::<String>(
            &mut c,
            &format!("SELECT tide.resolve_diff({k7}, 'fixed', 'refunded')")
        )?,
        "fixed"
    );
    let open: i64 = one(
        &mut c,
        &format!("SELECT count(*) FROM tide.recon_diff WHERE task_id = (SELECT task_id FROM tide.task WHERE name = '{p}_recon') AND status = 'open'"),
    )?;
    assert_eq!(
        open, 0,
        "resolving one closes every open row of that difference"
    );
    wait_for("the alert to resolve", Duration::from_secs(20), || {
        let n: i64 = c
            .query_one(
                &format!(
                    "SELECT count(*) FROM tide.alert WHERE subject = '{p}_recon' AND kind = 'reconciliation' AND resolved_at IS NULL"
                ),
                &[],
            )
            .map_err(|e| e.to_string())?
            .get(0);
        Ok((n == 0).then_some(()))
    })?;
    let (code, msg, hint) = refused(&mut c, &format!("SELECT tide.resolve_diff({k3}, 'accept')"))?;
    assert_eq!(code, "55000", "{msg} / {hint}");
    // An accepted difference seen again with the same values stays accepted.
    let run4 = reconcile_date(&mut c, &format!("{p}_recon"))?;
    let statuses: Vec<(String, String)> = c
        .query(
            "SELECT key, status FROM tide.recon_diff
              WHERE result_id = (SELECT max(result_id) FROM tide.recon_result WHERE run_id = $1) ORDER BY key",
            &[&run4],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        statuses,
        vec![("3".into(), "accepted".into()), ("7".into(), "open".into())],
        "k3 accepted stays accepted; k7 marked fixed by hand but still there is open again"
    );
    // tide.explain of a reconciliation run tells its result.
    let story = explain(&mut c, run1)?;
    assert!(
        story.contains("reconciliation at ") && story.contains("needs_human; left 7 rows"),
        "{story}"
    );
    let story = explain(&mut c, replay)?;
    assert!(
        story.contains(&format!("of reconciliation {p}_recon on")),
        "{story}"
    );
    Ok(())
}

/// The story `tide.explain` tells of a run, its lines joined.
fn explain(c: &mut Client, run: i64) -> Result<String, Failed> {
    one(
        c,
        &format!("SELECT string_agg(line, E'\\n') FROM tide.explain({run}) line"),
    )
}

fn date_ago(c: &mut Client, n: i32) -> Result<String, Failed> {
    one(c, &format!("SELECT (current_date - {n})::text"))
}

/// A side that fails names the side; one that writes is refused; a NULL key is a business
/// error; each dead at once (business errors are not retried).
fn failing_sides_fail_the_run(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "CREATE TABLE rf_a (k text, v numeric);
         INSERT INTO rf_a VALUES ('a', 1), ('b', 0);
         CREATE TABLE rf_log (x int);
         CREATE FUNCTION rf_logged(k text) RETURNS text LANGUAGE plpgsql AS
             $$BEGIN INSERT INTO rf_log VALUES (1); RETURN k; END$$;",
    )?;
    let cases = [
        (
            "rf_div",
            "SELECT k AS key, 1 / v AS v FROM rf_a",
            "SELECT k AS key, v FROM rf_a",
            "the left side failed (22012)",
        ),
        (
            "rf_write",
            "SELECT k AS key, v FROM rf_a",
            "SELECT rf_logged(k) AS key, v FROM rf_a",
            "the right side tried to write",
        ),
        (
            "rf_null",
            "SELECT NULL::text AS key, v FROM rf_a",
            "SELECT k AS key, v FROM rf_a",
            "the left side returned 2 rows whose key is NULL",
        ),
    ];
    for (name, left, right, expect) in cases {
        exec(
            &mut c,
            &format!(
                "SELECT tide.reconcile('{name}', '0 6 * * *', biz_window => 'day',
                     left_sql => $${left}$$, right_sql => $${right}$$, amounts => ARRAY['v'])"
            ),
        )?;
        let run = reconcile_date(&mut c, name)?;
        let (state, error, attempts): (String, String, i32) = {
            let r = c
                .query_one(
                    "SELECT state::text, last_error, attempts FROM tide.run WHERE run_id = $1",
                    &[&run],
                )
                .map_err(db_err)?;
            (r.get(0), r.get(1), r.get(2))
        };
        assert_eq!(state, "dead", "{name}: {error}");
        assert!(error.contains(expect), "{name}: {error}");
        assert_eq!(attempts, 1, "{name}: a business error is not retried");
    }
    assert_eq!(
        one::<i64>(&mut c, "SELECT count(*) FROM rf_log")?,
        0,
        "nothing written"
    );
    Ok(())
}

/// A fix that ran without fixing its difference is not made again: the difference is escalated
/// to a person (status needs_human, an alert), with the reason.
fn a_fix_that_does_not_fix_escalates(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "CREATE TABLE re_l AS SELECT 'k1'::text AS key, 5::numeric AS v;
         CREATE TABLE re_r (key text, v numeric);
         SELECT tide.schedule('re_noop', '0 0 1 1 *', command => 'SELECT 1');
         SELECT tide.reconcile('re_recon', '0 6 * * *', biz_window => 'day',
             left_sql => 'SELECT key, v FROM re_l', right_sql => 'SELECT key, v FROM re_r', amounts => ARRAY['v'],
             rules => '[{\"kind\": \"missing_right\", \"class\": \"auto_fix\", \"fix_task\": \"re_noop\"}]');",
    )?;
    let run = reconcile_date(&mut c, "re_recon")?;
    let fix: i64 = one(
        &mut c,
        &format!("SELECT action_run_id FROM tide.recon_diff WHERE run_id = {run}"),
    )?;
    assert_eq!(wait_run(&mut c, fix)?, "succeeded");
    reconcile_date(&mut c, "re_recon")?;
    let row = c
        .query_one(
            "SELECT r.status, d.escalated, d.reason, d.action_run_id FROM tide.recon_result r JOIN tide.recon_diff d USING (result_id)
              WHERE r.result_id = (SELECT max(result_id) FROM tide.recon_result WHERE run_id = $1)",
            &[&run],
        )
        .map_err(db_err)?;
    let (status, escalated, reason, action): (String, bool, String, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(
        (status.as_str(), escalated, action),
        ("needs_human", true, fix)
    );
    assert!(
        reason.contains(&format!(
            "fix run {fix} ended (succeeded) before this run and the difference remains"
        )),
        "{reason}"
    );
    assert_eq!(
        one::<i64>(
            &mut c,
            "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 're_noop'"
        )?,
        1,
        "no second fix run"
    );
    wait_for("the escalation alert", Duration::from_secs(20), || {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM tide.alert WHERE subject = 're_recon' AND kind = 'reconciliation' AND resolved_at IS NULL",
                &[],
            )
            .map_err(|e| e.to_string())?
            .get(0);
        Ok((n == 1).then_some(()))
    })?;
    Ok(())
}

/// A backfill of a reconciliation compares each business date once, through the task's windows.
fn backfill_reconciles_each_date(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "CREATE TABLE rb_l AS SELECT current_date - g AS day, 'k' || g AS key, g::numeric AS v FROM generate_series(2, 4) g;
         CREATE TABLE rb_r AS SELECT * FROM rb_l WHERE day <> current_date - 3;
         SELECT tide.reconcile('rb_recon', '0 6 * * *', biz_window => 'day',
             left_sql => 'SELECT key, v FROM rb_l WHERE day = tide.biz_date()',
             right_sql => 'SELECT key, v FROM rb_r WHERE day = tide.biz_date()', amounts => ARRAY['v']);",
    )?;
    let id: i64 = one(
        &mut c,
        "SELECT tide.backfill('rb_recon', current_date - 4, current_date - 2, canary => 0, sample => 0)",
    )?;
    wait_for("the backfill to end", Duration::from_secs(30), || {
        let state: String = c
            .query_one(
                "SELECT state FROM tide.backfill_status WHERE backfill_id = $1",
                &[&id],
            )
            .map_err(|e| e.to_string())?
            .get(0);
        Ok((state == "done").then_some(()))
    })?;
    let got: Vec<(i32, String)> = c
        .query(
            "SELECT current_date - biz_date, status FROM tide.recon_result WHERE reconciliation = 'rb_recon' ORDER BY biz_date",
            &[],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        got,
        vec![
            (4, "balanced".to_string()),
            (3, "needs_human".to_string()),
            (2, "balanced".to_string())
        ]
    );
    Ok(())
}

/// Past max_diffs a run records the first differences and compensates none.
fn too_many_differences_compensate_nothing(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "CREATE TABLE rm_l AS SELECT g::text AS key, 1::numeric AS v FROM generate_series(1, 5) g;
         CREATE TABLE rm_r (key text, v numeric);
         SELECT tide.schedule('rm_fix', '0 0 1 1 *', command => 'SELECT 1');
         SELECT tide.reconcile('rm_recon', '0 6 * * *', biz_window => 'day',
             left_sql => 'SELECT key, v FROM rm_l', right_sql => 'SELECT key, v FROM rm_r', amounts => ARRAY['v'],
             rules => '[{\"kind\": \"missing_right\", \"class\": \"auto_fix\", \"fix_task\": \"rm_fix\"}]', max_diffs => 3);",
    )?;
    let run = reconcile_date(&mut c, "rm_recon")?;
    let row = c
        .query_one(
            "SELECT status, differences, truncated, (SELECT count(*) FROM tide.recon_diff x WHERE x.run_id = r.run_id)
               FROM tide.recon_result r WHERE run_id = $1",
            &[&run],
        )
        .map_err(db_err)?;
    let got: (String, i32, bool, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(got, ("needs_human".into(), 5, true, 3));
    assert_eq!(
        one::<i64>(
            &mut c,
            "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'rm_fix'"
        )?,
        0,
        "no compensation past max_diffs"
    );
    Ok(())
}

/// One side is a foreign table (postgres_fdw) of another database on the same cluster.
fn postgres_fdw_side(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.connect("postgres")?;
    exec(&mut admin, "DROP DATABASE IF EXISTS recon_remote")?;
    exec(&mut admin, "CREATE DATABASE recon_remote")?;
    let mut remote = cluster.connect("recon_remote")?;
    exec(
        &mut remote,
        "CREATE TABLE bank_lines (ref text, amount numeric, booked_on date);
         INSERT INTO bank_lines VALUES ('1', 10, current_date - 2), ('2', 21, current_date - 2), ('9', 90, current_date - 2);",
    )?;
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        &format!(
            "CREATE EXTENSION IF NOT EXISTS postgres_fdw;
             CREATE SERVER bank_srv FOREIGN DATA WRAPPER postgres_fdw
                 OPTIONS (host '127.0.0.1', port '{}', dbname 'recon_remote');
             CREATE USER MAPPING FOR postgres SERVER bank_srv OPTIONS (user 'postgres');
             CREATE FOREIGN TABLE remote_bank (ref text, amount numeric, booked_on date)
                 SERVER bank_srv OPTIONS (table_name 'bank_lines');
             CREATE TABLE rp_pay (id int, amount numeric, day date);
             INSERT INTO rp_pay VALUES (1, 10, current_date - 2), (2, 20, current_date - 2), (3, 30, current_date - 2);
             SELECT tide.reconcile('rp_recon', '0 6 * * *', biz_window => 'day',
                 left_sql => 'SELECT id::text AS key, amount FROM rp_pay WHERE day = tide.biz_date()',
                 right_sql => 'SELECT ref AS key, amount FROM remote_bank WHERE booked_on = (SELECT tide.biz_date())',
                 amounts => ARRAY['amount']);",
            cluster.port
        ),
    )?;
    // The date goes to the remote server as a parameter (the documented form).
    let plan: Vec<String> = c
        .query(
            "EXPLAIN (VERBOSE) SELECT ref AS key, amount FROM remote_bank WHERE booked_on = (SELECT tide.biz_date())",
            &[],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        plan.iter()
            .any(|l| l.contains("Remote SQL") && l.contains("WHERE ((booked_on = $1::date))")),
        "{plan:?}"
    );
    let run = reconcile_date(&mut c, "rp_recon")?;
    assert_eq!(run_state(&mut c, run)?, "succeeded");
    let row = c
        .query_one(
            "SELECT left_count, right_count, ARRAY(SELECT key || ':' || kind FROM tide.recon_diff x
                                                    WHERE x.result_id = r.result_id ORDER BY key)
               FROM tide.recon_result r WHERE run_id = $1",
            &[&run],
        )
        .map_err(db_err)?;
    let got: (i64, i64, Vec<String>) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        got,
        (
            3,
            3,
            vec![
                "2:mismatch".to_string(),
                "3:missing_right".to_string(),
                "9:missing_left".to_string()
            ]
        )
    );
    Ok(())
}

/// Bad definitions: 22023 (22004 for NULL), the value named, a hint, nothing written.
fn bad_input_is_refused(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("t_recon_bad")?;
    exec(
        &mut c,
        "CREATE TABLE l (id int, amount numeric, day date);
         CREATE TABLE r (ref text, amount numeric, note text);
         SELECT tide.schedule('fix', '0 0 1 1 *', command => 'SELECT 1');",
    )?;
    let ok_l = "$$SELECT id::text AS key, amount FROM l$$";
    let ok_r = "$$SELECT ref AS key, amount FROM r$$";
    let call = |l: &str, r: &str, extra: &str| {
        format!(
            "SELECT tide.reconcile('rc', '0 6 * * *', left_sql => {l}, right_sql => {r}, amounts => ARRAY['amount']{extra})"
        )
    };
    let cases: Vec<(String, &str, &str)> = vec![
        (call("$$SELECT id, amount FROM l$$", ok_r, ""), "22023", "left_sql has no usable column key"),
        (call(ok_l, "$$SELECT ref AS key, note FROM r$$", ""), "22023", "right_sql has no amount column amount"),
        (call(ok_l, "$$SELECT ref AS key, note AS amount FROM r$$", ""), "22023", "amount column amount of right_sql is not a number"),
        (call(ok_l, "$$SELECT nonsense FROM$$", ""), "22023", "right_sql is not a query"),
        (call(ok_l, ok_r, ", rules => '[{\"kind\": \"missing_right\", \"class\": \"magic\"}]'"), "22023", "unknown class 'magic'"),
        (call(ok_l, ok_r, ", rules => '[{\"kind\": \"missing_right\", \"class\": \"auto_fix\", \"fix_task\": \"nope\"}]'"), "22023", "fix_task 'nope' is not another task"),
        (call(ok_l, ok_r, ", rules => '[{\"kind\": \"missing_right\", \"class\": ]'"), "22023", "rules is not valid JSON"),
        (call(ok_l, ok_r, ", rules => '{\"kind\": \"missing_right\"}'"), "22023", "rules must be a JSON array"),
        (call(ok_l, ok_r, ", rules => '[{\"kind\": \"mismatch\", \"class\": \"human\", \"when\": \"l.amount\"}]'"), "22023", "rule 1 when 'l.amount' is not a boolean"),
        (call(ok_l, ok_r, ", rules => '[{\"kind\": \"lost\", \"class\": \"human\"}]'"), "22023", "rule 1 has unknown kind 'lost'"),
        (call(ok_l, ok_r, ", tolerance => -0.01"), "22023", "tolerance must be a number of at least 0, got -0.01"),
        (call(ok_l, ok_r, ", max_diffs => 0"), "22023", "max_diffs must be between 1 and 1000000, got 0"),
        (call(ok_l, ok_r, ", work_mem => 'lots'"), "22023", "work_mem must be a size"),
        (call("NULL", ok_r, ""), "22004", "left_sql must not be NULL"),
        (
            "SELECT tide.reconcile('fix', '0 6 * * *', left_sql => 'SELECT id::text AS key FROM l', right_sql => 'SELECT ref AS key FROM r')".to_string(),
            "42710",
            "task \"fix\" already exists and is not a reconciliation",
        ),
    ];
    for (sql, code, text) in &cases {
        let (got, msg, hint) = refused(&mut c, sql)?;
        assert_eq!(&got, code, "{sql}: {msg}");
        assert!(msg.contains(text), "{sql}: {msg}");
        assert!(!hint.is_empty(), "{sql}: no hint");
    }
    assert_eq!(
        one::<i64>(&mut c, "SELECT count(*) FROM tide.task WHERE name = 'rc'")?,
        0,
        "nothing written"
    );
    // A reconciliation's command is built in: tide.alter cannot replace it.
    exec(&mut c, &format!("SELECT tide.reconcile('rc', '0 6 * * *', left_sql => {ok_l}, right_sql => {ok_r}, amounts => ARRAY['amount'])"))?;
    let (code, msg, _) = refused(&mut c, "SELECT tide.alter('rc', command => 'SELECT 1')")?;
    assert_eq!(code, "22023", "{msg}");
    assert!(msg.contains("is a reconciliation"), "{msg}");
    // The same definition again is a no-op; another one needs replace.
    exec(&mut c, &format!("SELECT tide.reconcile('rc', '0 6 * * *', left_sql => {ok_l}, right_sql => {ok_r}, amounts => ARRAY['amount'])"))?;
    let (code, msg, _) = refused(
        &mut c,
        &format!("SELECT tide.reconcile('rc', '0 6 * * *', left_sql => {ok_l}, right_sql => {ok_r}, amounts => ARRAY['amount'], tolerance => 1)"),
    )?;
    assert_eq!(code, "42710", "{msg}");
    exec(&mut c, &format!("SELECT tide.reconcile('rc', '0 6 * * *', left_sql => {ok_l}, right_sql => {ok_r}, amounts => ARRAY['amount'], tolerance => 1, replace => true)"))?;
    assert_eq!(
        one::<i32>(&mut c, "SELECT version FROM tide.task WHERE name = 'rc'")?,
        2,
        "a changed definition is the next rule version"
    );
    // resolve_diff's own bad input.
    for (sql, code) in [
        ("SELECT tide.resolve_diff(NULL, 'accept')", "22004"),
        ("SELECT tide.resolve_diff(1, 'ignore')", "22023"),
        ("SELECT tide.resolve_diff(424242, 'accept')", "42704"),
    ] {
        let (got, msg, hint) = refused(&mut c, sql)?;
        assert_eq!(got, code, "{sql}: {msg}");
        assert!(!hint.is_empty(), "{sql}");
    }
    Ok(())
}

/// Results older than history_retention go once none of their differences is open; removing a
/// reconciliation removes its history.
fn history_is_pruned_and_removed(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "CREATE TABLE rh_l (key text, v numeric);
         CREATE TABLE rh_r (key text, v numeric);
         INSERT INTO rh_l VALUES ('a', 1);
         SELECT tide.reconcile('rh_recon', '0 6 * * *', biz_window => 'day',
             left_sql => 'SELECT key, v FROM rh_l', right_sql => 'SELECT key, v FROM rh_r', amounts => ARRAY['v']);",
    )?;
    // The first comparison: a open; accepted. The second: a (still accepted) and b, open.
    reconcile_date(&mut c, "rh_recon")?;
    exec(
        &mut c,
        "SELECT tide.resolve_diff(diff_id, 'accept') FROM tide.recon_diff WHERE reconciliation = 'rh_recon';
         INSERT INTO rh_l VALUES ('b', 2);",
    )?;
    reconcile_date(&mut c, "rh_recon")?;
    let results = |c: &mut Client| -> Result<Vec<String>, Failed> {
        Ok(c
            .query(
                "SELECT string_agg(d.key || ':' || d.status, ',' ORDER BY d.key) FROM tide.recon_result r
                   JOIN tide.recon_diff d USING (result_id)
                  WHERE r.reconciliation = 'rh_recon' GROUP BY r.result_id ORDER BY r.result_id",
                &[],
            )
            .map_err(db_err)?
            .iter()
            .map(|r| r.get(0))
            .collect())
    };
    assert_eq!(
        results(&mut c)?,
        vec!["a:accepted".to_string(), "a:accepted,b:open".to_string()]
    );
    exec(
        &mut c,
        "SELECT tide._prune(now() + interval '400 days', 5000)",
    )?;
    assert_eq!(
        results(&mut c)?,
        vec!["a:accepted,b:open".to_string()],
        "the result with an open difference stays"
    );
    exec(&mut c, "SELECT tide.unschedule('rh_recon')")?;
    assert_eq!(
        one::<i64>(
            &mut c,
            "SELECT (SELECT count(*) FROM tide.recon_result WHERE reconciliation = 'rh_recon')
                  + (SELECT count(*) FROM tide.recon_diff WHERE reconciliation = 'rh_recon')"
        )?,
        0,
        "removed with the reconciliation"
    );
    Ok(())
}

fn main() {
    let tests: &[(&str, TestFn)] = &[
        ("bad_input_is_refused", bad_input_is_refused),
        ("every_kind_and_class", every_kind_and_class),
        ("failing_sides_fail_the_run", failing_sides_fail_the_run),
        (
            "a_fix_that_does_not_fix_escalates",
            a_fix_that_does_not_fix_escalates,
        ),
        (
            "backfill_reconciles_each_date",
            backfill_reconciles_each_date,
        ),
        (
            "too_many_differences_compensate_nothing",
            too_many_differences_compensate_nothing,
        ),
        ("postgres_fdw_side", postgres_fdw_side),
        (
            "history_is_pruned_and_removed",
            history_is_pruned_and_removed,
        ),
    ];
    run_tests("recon", tests)
}

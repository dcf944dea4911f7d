//! Moving over from pg_cron, against the real pg_cron (Debian's postgresql-15-cron, 1.4) preloaded
//! beside pg_tide, in the layout pg_cron users have: pg_cron and pg_tide in one database, jobs
//! sent to others with `cron.schedule_in_database`.
//!
//! - `tide.import_pg_cron()` reports what each job becomes (its settings, and in words how it
//!   will behave differently) and, with `apply => true`, creates the tasks as the jobs' roles and
//!   unschedules those jobs in one transaction; what cannot be carried over stays with the reason.
//! - Imported jobs keep pg_cron's meaning: jobs of two databases run in their own, a job whose
//!   owner lost CONNECT fails with the server's error while the others go on, two statements are
//!   all or nothing (as under pg_cron, checked before the import too), a failing job is attempted
//!   once, fires missed while the server is down are recorded as skipped and not run.
//! - What cannot run where it is scheduled is refused when it is made: VACUUM and CREATE INDEX
//!   CONCURRENTLY pasted into `tide.schedule`, a database that does not exist, is too long a
//!   name, a template, refuses connections or is closed to the owner.
//! - `tide.job_run_details` answers pg_cron's own queries.

use std::time::Duration;

use pg_tide_pg_test::{
    db_err, exec, one, refused, run_tests_with, wait_for, Client, Cluster, Failed, TestFn,
};

/// Where pg_cron lives (cron.database_name) and pg_tide serves (pg_tide.database).
const CRON_DB: &str = "tide_cron";
/// An application database the jobs are sent to.
const APP_DB: &str = "tide_cron_app";

fn rows(c: &mut Client, sql: &str) -> Result<Vec<String>, Failed> {
    Ok(c.query(sql, &[])
        .map_err(db_err)?
        .iter()
        .map(|r| r.get::<_, Option<String>>(0).unwrap_or_default())
        .collect())
}

fn text(c: &mut Client, sql: &str) -> Result<Option<String>, String> {
    c.query_opt(sql, &[])
        .map_err(|e| pg_tide_pg_test::describe(&e))
        .map(|r| r.and_then(|r| r.get::<_, Option<String>>(0)))
}

/// pg_tide's database with pg_cron created in it, and no job or task left by an earlier test.
fn cron_db(cluster: &Cluster) -> Result<Client, Failed> {
    let mut admin = cluster.connect("postgres")?;
    if admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&CRON_DB])
        .map_err(db_err)?
        .is_none()
    {
        exec(&mut admin, &format!("CREATE DATABASE {CRON_DB}"))?;
    }
    let mut c = cluster.connect(CRON_DB)?;
    exec(
        &mut c,
        "CREATE EXTENSION IF NOT EXISTS pg_tide; CREATE EXTENSION IF NOT EXISTS pg_cron;
         SELECT count(cron.unschedule(jobid)) FROM cron.job;
         DELETE FROM tide.task;",
    )?;
    Ok(c)
}

/// The state of the task's latest run once it is one of `states`.
fn wait_state(c: &mut Client, task: &str, states: &str) -> Result<String, Failed> {
    let sql = format!(
        "SELECT r.state::text FROM tide.run r JOIN tide.task t USING (task_id)
          WHERE t.name = '{task}' AND r.state::text = ANY ('{{{states}}}') ORDER BY r.run_id DESC LIMIT 1"
    );
    Ok(wait_for(
        &format!("a run of {task} in {states}"),
        Duration::from_secs(60),
        || text(c, &sql),
    )?)
}

fn import_reports_then_moves_jobs(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cron_db(cluster)?;
    exec(
        &mut c,
        "DROP ROLE IF EXISTS cron_bob; CREATE ROLE cron_bob LOGIN;
         GRANT USAGE ON SCHEMA cron TO cron_bob;
         DROP TABLE IF EXISTS tally; CREATE TABLE tally (n integer);
         ALTER TABLE tally OWNER TO cron_bob;
         -- pg_cron 1.4's syntax: names or none, macros, lists, ranges, steps, several
         -- statements, inactive jobs, another database.
         SELECT cron.schedule('nightly-vacuum', '30 3 * * *', 'VACUUM (ANALYZE) tally');
         SELECT cron.schedule('*/15 8-18 * * 1-5', 'SELECT 1');
         SELECT cron.schedule('monthly', '@monthly', 'SELECT 2; SELECT 3');
         SELECT cron.schedule('paused-one', '0 12 1,15 * *', 'SELECT 4');
         UPDATE cron.job SET active = false WHERE jobname = 'paused-one';
         SELECT cron.schedule('never', '0 0 30 2 *', 'SELECT 5');
         SELECT cron.schedule_in_database('elsewhere', '0 1 * * *', 'SELECT 6', 'postgres');",
    )?;
    let mut bob = cluster.connect_as(CRON_DB, "cron_bob")?;
    exec(
        &mut bob,
        "SELECT cron.schedule('bobs-count', '* * * * *', 'INSERT INTO tally VALUES (1)')",
    )?;

    // A role sees its own jobs only.
    let bobs = rows(
        &mut bob,
        "SELECT jobname || '>' || task || '|' || owner || '|' || action FROM tide.import_pg_cron()",
    )?;
    assert_eq!(bobs, ["bobs-count>bobs-count|cron_bob|to import"]);

    // The report (no apply) writes nothing. Several statements run as one transaction (no
    // top-level mode); a job of another database runs there.
    let report = rows(
        &mut c,
        "SELECT concat_ws('|', coalesce(jobname, '-'), task, schedule, tz, owner, coalesce(database, '-'), top_level,
                          paused, settings->>'max_attempts', settings->>'misfire', settings->>'timeout', action, problem)
           FROM tide.import_pg_cron() ORDER BY jobid",
    )?;
    assert_eq!(
        report,
        [
            "nightly-vacuum|nightly-vacuum|30 3 * * *|GMT|postgres|-|t|f|1|skip|00:00:00|to import",
            "-|pg_cron_2|*/15 8-18 * * 1-5|GMT|postgres|-|f|f|1|skip|00:00:00|to import",
            "monthly|monthly|@monthly|GMT|postgres|-|f|f|1|skip|00:00:00|to import",
            "paused-one|paused-one|0 12 1,15 * *|GMT|postgres|-|f|t|1|skip|00:00:00|to import",
            "never|never|0 0 30 2 *|GMT|postgres|-|f|f|1|skip|00:00:00|kept in pg_cron|cron expression \"0 0 30 2 *\" never fires",
            "elsewhere|elsewhere|0 1 * * *|GMT|postgres|postgres|f|f|1|skip|00:00:00|to import",
            "bobs-count|bobs-count|* * * * *|GMT|cron_bob|-|f|f|1|skip|00:00:00|to import",
        ]
    );
    // In words, how each will behave differently: what is recorded and alerted, and what is
    // committed how and where.
    let mut said = |task: &str, words: &str| -> Result<bool, Failed> {
        let sql = format!(
            "SELECT count(*) FROM tide.import_pg_cron() i, unnest(i.differences) d
              WHERE i.task = '{task}' AND d LIKE '%{words}%'"
        );
        Ok(one::<i64>(&mut c, &sql)? == 1)
    };
    assert!(said("nightly-vacuum", "run at top level")?);
    assert!(said("monthly", "committed with its run''s record")?);
    assert!(said("elsewhere", "run in database postgres")?);
    for task in ["nightly-vacuum", "monthly", "elsewhere"] {
        assert!(said(task, "recorded: every run")?, "{task}");
        assert!(said(task, "alerted: a run that fails")?, "{task}");
        assert!(said(task, "serialized: at most")?, "{task}");
        assert!(said(task, "recorded as skipped")?, "{task}");
        assert!(
            !said(task, "retried")?,
            "{task}: one attempt, as in pg_cron"
        );
    }
    let kept: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.import_pg_cron() WHERE differences IS NULL",
    )?;
    assert_eq!(
        kept, 1,
        "only a job that stays in pg_cron has no differences"
    );
    let nothing: i64 = one(
        &mut c,
        "SELECT (SELECT count(*) FROM tide.task) * 100 + (SELECT count(*) FROM cron.job)",
    )?;
    assert_eq!(nothing, 7, "a report creates no task and keeps every job");
    // Opting into more is one argument each.
    let more: String = one(
        &mut c,
        "SELECT concat_ws('|', settings->>'max_attempts', settings->>'misfire', settings->>'timeout',
                          (SELECT count(*) FROM unnest(differences) d WHERE d LIKE 'retried%' OR d LIKE 'bounded%'))
           FROM tide.import_pg_cron(max_attempts => 3, misfire => 'catch_up', timeout => '2 hours')
          WHERE task = 'monthly'",
    )?;
    assert_eq!(more, "3|catch_up|02:00:00|2");

    // Apply: the tasks exist (as the jobs' roles), the jobs left pg_cron, in one transaction.
    let applied = rows(
        &mut c,
        "SELECT task || '|' || action FROM tide.import_pg_cron(apply => true) ORDER BY jobid",
    )?;
    assert_eq!(applied.len(), 7);
    assert!(
        applied.contains(&"nightly-vacuum|imported".to_string()),
        "{applied:?}"
    );
    let left = rows(&mut c, "SELECT jobname FROM cron.job ORDER BY jobid")?;
    assert_eq!(left, ["never"], "only what could not be carried over stays");
    let tasks = rows(
        &mut c,
        "SELECT concat_ws('|', name, owner, schedule, tz, coalesce(database, '-'), top_level, paused, max_attempts,
                          misfire, timeout, misfire_threshold)
           FROM tide.task ORDER BY task_id",
    )?;
    assert_eq!(
        tasks,
        [
            "nightly-vacuum|postgres|30 3 * * *|GMT|-|t|f|1|skip|00:00:00|00:01:00",
            "pg_cron_2|postgres|*/15 8-18 * * 1-5|GMT|-|f|f|1|skip|00:00:00|00:01:00",
            "monthly|postgres|@monthly|GMT|-|f|f|1|skip|00:00:00|00:01:00",
            "paused-one|postgres|0 12 1,15 * *|GMT|-|f|t|1|skip|00:00:00|00:01:00",
            "elsewhere|postgres|0 1 * * *|GMT|postgres|f|f|1|skip|00:00:00|00:01:00",
            "bobs-count|cron_bob|* * * * *|GMT|-|f|f|1|skip|00:00:00|00:01:00",
        ]
    );
    // Importing again changes nothing: the rest is still reported, with its reason.
    let again = rows(
        &mut c,
        "SELECT task || '|' || action FROM tide.import_pg_cron(apply => true)",
    )?;
    assert_eq!(again, ["never|kept in pg_cron"]);

    // The imported VACUUM job runs at top level as its owner; the two statements run in one
    // transaction with their run; the job of the other database runs there.
    exec(
        &mut c,
        "SELECT tide.rerun('nightly-vacuum'); SELECT tide.rerun('monthly'); SELECT tide.rerun('elsewhere');",
    )?;
    for task in ["nightly-vacuum", "monthly", "elsewhere"] {
        assert_eq!(
            wait_state(&mut c, task, "succeeded,dead")?,
            "succeeded",
            "{task}"
        );
    }
    let tags = rows(
        &mut c,
        "SELECT t.name || '=' || coalesce(r.result->>'tag', 'rows ' || (r.result->>'row_count'))
           FROM tide.run r JOIN tide.task t USING (task_id)
          WHERE t.name IN ('nightly-vacuum', 'monthly', 'elsewhere') ORDER BY t.name",
    )?;
    assert_eq!(
        tags,
        [
            "elsewhere=SELECT 1",
            "monthly=rows 1",
            "nightly-vacuum=VACUUM"
        ]
    );

    // Bad input: nothing imported, each with its SQLSTATE, the value named and a hint.
    for (sql, code, named) in [
        ("SELECT * FROM tide.import_pg_cron(NULL)", "22004", "apply"),
        (
            "SELECT * FROM tide.import_pg_cron(true, max_attempts => NULL)",
            "22004",
            "max_attempts",
        ),
        (
            "SELECT * FROM tide.import_pg_cron(true, max_attempts => 0)",
            "22023",
            "got 0",
        ),
        (
            "SELECT * FROM tide.import_pg_cron(true, misfire => 'later')",
            "22023",
            "'later'",
        ),
        (
            "SELECT * FROM tide.import_pg_cron(true, timeout => '-1 hour')",
            "22023",
            "-3600 seconds",
        ),
    ] {
        let (got, message, hint) = refused(&mut c, sql)?;
        assert_eq!(got, code, "{sql}: {message}");
        assert!(message.contains(named), "{sql}: {message}");
        assert!(!hint.is_empty(), "{sql}");
    }
    let still: i64 = one(&mut c, "SELECT count(*) FROM cron.job")?;
    assert_eq!(still, 1);
    let mut other = cluster.fresh_db("tide_no_cron")?;
    let (code, message, hint) = refused(&mut other, "SELECT * FROM tide.import_pg_cron()")?;
    assert_eq!(code, "55000", "{message}");
    assert!(message.contains("tide_no_cron"), "{message}");
    assert!(hint.contains("cron.database_name"), "{hint}");
    exec(&mut c, "DELETE FROM tide.task")?;
    Ok(())
}

/// pg_cron's common layout: pg_cron (and pg_tide) in one database, jobs sent to the application
/// database and to `postgres`. Imported, each runs in its own database as its owner; a job
/// whose owner lost CONNECT fails with the server's error, recorded, and the others go on.
fn jobs_of_two_databases_run_in_their_own(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.connect("postgres")?;
    exec(
        &mut admin,
        &format!("DROP DATABASE IF EXISTS {APP_DB} WITH (FORCE)"),
    )?;
    exec(&mut admin, &format!("CREATE DATABASE {APP_DB}"))?;
    exec(
        &mut admin,
        "DROP ROLE IF EXISTS cron_app; CREATE ROLE cron_app LOGIN;
         DROP TABLE IF EXISTS pg_tally; CREATE TABLE pg_tally (db text, who text);",
    )?;
    let mut app = cluster.connect(APP_DB)?;
    exec(
        &mut app,
        &format!(
            "CREATE TABLE app_tally (db text, who text); ALTER TABLE app_tally OWNER TO cron_app;
             REVOKE CONNECT ON DATABASE {APP_DB} FROM PUBLIC; GRANT CONNECT ON DATABASE {APP_DB} TO cron_app;"
        ),
    )?;
    let mut c = cron_db(cluster)?;
    exec(
        &mut c,
        &format!(
            "SELECT cron.schedule_in_database('to-postgres', '0 4 * * *',
                 'INSERT INTO pg_tally VALUES (current_database(), current_user)', 'postgres');
             SELECT cron.schedule_in_database('to-app', '* * * * *',
                 'INSERT INTO app_tally VALUES (current_database(), current_user)', '{APP_DB}', 'cron_app');"
        ),
    )?;
    let imported = rows(
        &mut c,
        "SELECT concat_ws('|', task, owner, database, top_level, action) FROM tide.import_pg_cron(apply => true) ORDER BY jobid",
    )?;
    assert_eq!(
        imported,
        [
            "to-postgres|postgres|postgres|f|imported".to_string(),
            format!("to-app|cron_app|{APP_DB}|f|imported"),
        ]
    );
    let jobs: i64 = one(&mut c, "SELECT count(*) FROM cron.job")?;
    assert_eq!(jobs, 0, "both left pg_cron");
    // pg_cron may have run to-app before the import: count from here.
    let before: i64 = one(&mut app, "SELECT count(*) FROM app_tally")?;
    // The '2 seconds' job fires on its own; the other is run now.
    exec(&mut c, "SELECT tide.rerun('to-postgres')")?;
    assert_eq!(
        wait_state(&mut c, "to-postgres", "succeeded,dead")?,
        "succeeded"
    );
    wait_for(
        "two scheduled runs of to-app",
        Duration::from_secs(60),
        || {
            let n: i64 = c
                .query_one(
                    "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id)
                      WHERE t.name = 'to-app' AND r.trigger = 'scheduled' AND r.state = 'succeeded'",
                    &[],
                )
                .map_err(|e| pg_tide_pg_test::describe(&e))?
                .get(0);
            Ok((n >= 1).then_some(()))
        },
    )?;
    let in_app: String = one(
        &mut app,
        &format!("SELECT concat_ws('|', count(*) > {before}, min(db), min(who), max(who)) FROM app_tally"),
    )?;
    assert_eq!(in_app, format!("t|{APP_DB}|cron_app|cron_app"));
    let in_postgres: String = one(
        &mut admin,
        "SELECT string_agg(db || '/' || who, ',') FROM pg_tally",
    )?;
    assert_eq!(in_postgres, "postgres/postgres");
    // As pg_cron's run view says it.
    let details = rows(
        &mut c,
        "SELECT DISTINCT concat_ws('|', jobname, database, username, status, return_message)
           FROM tide.job_run_details ORDER BY 1",
    )?;
    assert_eq!(
        details,
        [
            format!("to-app|{APP_DB}|cron_app|succeeded|INSERT 0 1"),
            "to-postgres|postgres|postgres|succeeded|INSERT 0 1".to_string(),
        ]
    );

    // The owner loses CONNECT: the next run fails with the server's error and is recorded
    // (dead: one attempt); the job of the other database goes on.
    exec(
        &mut app,
        &format!("REVOKE CONNECT ON DATABASE {APP_DB} FROM cron_app"),
    )?;
    let error = wait_for(
        "a run of to-app refused by its database",
        Duration::from_secs(90),
        || {
            text(
                &mut c,
                "SELECT r.last_error FROM tide.run r JOIN tide.task t USING (task_id)
                  WHERE t.name = 'to-app' AND r.state = 'dead' AND r.attempts = 1 LIMIT 1",
            )
        },
    )?;
    assert!(
        error.contains(&format!("permission denied for database \"{APP_DB}\"")),
        "{error}"
    );
    exec(
        &mut c,
        "SELECT tide.rerun('to-postgres', biz_date => current_date - 5)",
    )?;
    wait_for("to-postgres to run again", Duration::from_secs(60), || {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id)
                  WHERE t.name = 'to-postgres' AND r.state = 'succeeded'",
                &[],
            )
            .map_err(|e| pg_tide_pg_test::describe(&e))?
            .get(0);
        Ok((n == 2).then_some(()))
    })?;
    // Changing the task now is refused as making it is: the owner cannot work there.
    let mut owner = cluster.connect_as(CRON_DB, "cron_app")?;
    let (code, message, hint) = refused(
        &mut owner,
        "SELECT tide.alter('to-app', command => 'SELECT 1')",
    )?;
    assert_eq!(code, "42501", "{message}");
    assert!(message.contains(APP_DB), "{message}");
    assert!(hint.contains("GRANT CONNECT"), "{hint}");
    exec(&mut owner, "SELECT tide.unschedule('to-app')")?;
    exec(&mut c, "SELECT tide.unschedule('to-postgres')")?;
    Ok(())
}

/// Two statements, the second failing: nothing of the first is kept, under pg_cron (one simple
/// query, one implicit transaction) and once imported (one transaction with the run); the
/// imported job is attempted once, as pg_cron does, and goes to the dead letters.
fn two_statements_are_all_or_nothing_before_and_after_import(
    cluster: &Cluster,
) -> Result<(), Failed> {
    let mut c = cron_db(cluster)?;
    exec(
        &mut c,
        "DROP TABLE IF EXISTS ledger; CREATE TABLE ledger (n integer);
         SELECT cron.schedule('half', '* * * * *', 'INSERT INTO ledger VALUES (1); SELECT 1 / 0');",
    )?;
    let failed = wait_for(
        "pg_cron to run the job and fail",
        Duration::from_secs(90),
        || {
            text(
                &mut c,
                "SELECT return_message FROM cron.job_run_details d JOIN cron.job j USING (jobid)
                  WHERE j.jobname = 'half' AND d.status = 'failed' LIMIT 1",
            )
        },
    )?;
    assert!(failed.contains("division by zero"), "{failed}");
    let kept: i64 = one(&mut c, "SELECT count(*) FROM ledger")?;
    assert_eq!(kept, 0, "pg_cron keeps nothing of the first statement");

    let imported = rows(
        &mut c,
        "SELECT concat_ws('|', task, top_level, action) FROM tide.import_pg_cron(apply => true)",
    )?;
    assert_eq!(imported, ["half|f|imported"]);
    exec(&mut c, "SELECT tide.rerun('half')")?;
    assert_eq!(wait_state(&mut c, "half", "dead")?, "dead");
    let dead: String = one(
        &mut c,
        "SELECT concat_ws('|', r.attempts, r.tries, r.last_error_kind, r.last_error,
                          (SELECT count(*) FROM tide.attempt a WHERE a.run_id = r.run_id),
                          (SELECT count(*) FROM tide.dead_letter d WHERE d.run_id = r.run_id))
           FROM tide.run r JOIN tide.task t USING (task_id)
          WHERE t.name = 'half' AND r.state = 'dead' ORDER BY r.run_id LIMIT 1",
    )?;
    assert_eq!(
        dead, "1|1|business|division by zero|1|1",
        "attempted once, dead, in the dead letters"
    );
    let kept: i64 = one(&mut c, "SELECT count(*) FROM ledger")?;
    assert_eq!(
        kept, 0,
        "pg_tide keeps nothing of the first statement either"
    );
    exec(&mut c, "SELECT tide.unschedule('half')")?;
    Ok(())
}

/// The server stopped across two fires of an imported job: the fires it missed are recorded as
/// skipped (misfire) and never run, as pg_cron runs nothing it missed; the job goes on.
fn missed_fires_are_skipped_not_run(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cron_db(cluster)?;
    exec(
        &mut c,
        "SELECT cron.schedule('every-minute', '* * * * *', 'SELECT 1');",
    )?;
    let imported = rows(
        &mut c,
        "SELECT concat_ws('|', task, settings->>'misfire', settings->>'misfire_threshold', action)
           FROM tide.import_pg_cron(apply => true)",
    )?;
    assert_eq!(imported, ["every-minute|skip|00:01:00|imported"]);
    // Down from now until two minute boundaries lie more than a minute (the misfire threshold)
    // behind: the fires at those two are missed; the one after them is late by a few seconds.
    let (first, stopped_at): (f64, f64) = {
        let row = c
            .query_one(
                "SELECT extract(epoch FROM date_trunc('minute', now()) + interval '1 minute')::float8,
                        extract(epoch FROM now())::float8",
                &[],
            )
            .map_err(db_err)?;
        (row.get(0), row.get(1))
    };
    drop(c);
    let down = first + 128.0 - stopped_at;
    cluster.stop_for(Duration::from_secs_f64(down))?;
    let mut c = cluster.connect(CRON_DB)?;
    let missed = wait_for(
        "the two missed fires to be recorded",
        Duration::from_secs(60),
        || {
            text(
                &mut c,
                &format!(
                    "SELECT string_agg(concat_ws('|', r.state, r.skip_reason, r.attempts), ',' ORDER BY r.fire_at)
                       FROM tide.run r JOIN tide.task t USING (task_id)
                      WHERE t.name = 'every-minute' AND r.fire_at IN (to_timestamp({first}), to_timestamp({first} + 60))
                     HAVING count(*) = 2"
                ),
            )
        },
    )?;
    assert_eq!(missed, "skipped|misfire|0,skipped|misfire|0");
    // The next fire, late by seconds, runs; so do the ones after it.
    let next = wait_for("the fire after the stop", Duration::from_secs(60), || {
        text(
            &mut c,
            &format!(
                "SELECT r.state::text FROM tide.run r JOIN tide.task t USING (task_id)
                  WHERE t.name = 'every-minute' AND r.fire_at = to_timestamp({first} + 120)
                    AND r.state IN ('succeeded', 'dead')"
            ),
        )
    })?;
    assert_eq!(next, "succeeded");
    exec(&mut c, "SELECT tide.unschedule('every-minute')")?;
    Ok(())
}

/// A command that cannot run inside a transaction block, pasted into tide.schedule as a pg_cron
/// user writes it, is refused at once with the statement named and the hint; with top_level it
/// is accepted and runs. Several ordinary statements are accepted (one transaction).
fn commands_that_cannot_run_where_scheduled_are_refused(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cron_db(cluster)?;
    exec(
        &mut c,
        "DROP TABLE IF EXISTS big_table; CREATE TABLE big_table (x integer);",
    )?;
    for (sql, statement) in [
        (
            "SELECT tide.schedule('nightly', '0 3 * * *', command => 'VACUUM big_table')",
            "VACUUM",
        ),
        (
            "SELECT tide.schedule('nightly', '0 3 * * *', command => 'CREATE INDEX CONCURRENTLY ON big_table (x)')",
            "CREATE INDEX CONCURRENTLY",
        ),
        (
            "SELECT tide.schedule('nightly', '0 3 * * *', command => 'DELETE FROM big_table; VACUUM big_table')",
            "VACUUM",
        ),
        (
            "SELECT tide.schedule('nightly', '0 3 * * *', command => 'REINDEX TABLE CONCURRENTLY big_table')",
            "REINDEX CONCURRENTLY",
        ),
        (
            "SELECT tide.schedule('nightly', '0 3 * * *', command => 'BEGIN; DELETE FROM big_table; COMMIT')",
            "BEGIN",
        ),
    ] {
        let (code, message, hint) = refused(&mut c, sql)?;
        assert_eq!(code, "22023", "{sql}: {message}");
        assert!(
            message.contains(&format!("\"nightly\": {statement} cannot run inside a transaction block")),
            "{sql}: {message}"
        );
        assert!(hint.contains("top_level => true"), "{sql}: {hint}");
    }
    let (code, message, hint) = refused(
        &mut c,
        "SELECT tide.schedule('nightly', '0 3 * * *', command => 'VACUUM big_tabel big_table')",
    )?;
    assert_eq!(code, "42601", "{message}");
    assert!(message.contains("does not parse"), "{message}");
    assert!(!hint.is_empty());
    let none: i64 = one(&mut c, "SELECT count(*) FROM tide.task")?;
    assert_eq!(none, 0, "nothing written");

    // With top_level it runs; several ordinary statements are one transaction.
    exec(
        &mut c,
        "SELECT tide.schedule('nightly', '0 3 * * *', command => 'VACUUM big_table', top_level => true);
         SELECT tide.schedule('rollup', '0 * * * *', command => 'INSERT INTO big_table VALUES (1); INSERT INTO big_table VALUES (2)');
         SELECT tide.rerun('nightly'); SELECT tide.rerun('rollup');",
    )?;
    assert_eq!(
        wait_state(&mut c, "nightly", "succeeded,dead")?,
        "succeeded"
    );
    assert_eq!(wait_state(&mut c, "rollup", "succeeded,dead")?, "succeeded");
    // tide.alter checks the task as it will be.
    for sql in [
        "SELECT tide.alter('rollup', command => 'VACUUM big_table')",
        "SELECT tide.alter('nightly', top_level => false)",
    ] {
        let (code, message, hint) = refused(&mut c, sql)?;
        assert_eq!(code, "22023", "{sql}: {message}");
        assert!(
            message.contains("VACUUM cannot run inside a transaction block"),
            "{sql}: {message}"
        );
        assert!(hint.contains("top_level => true"), "{sql}");
    }
    let versions: String = one(
        &mut c,
        "SELECT string_agg(name || '=' || version, ',' ORDER BY name) FROM tide.task",
    )?;
    assert_eq!(
        versions, "nightly=1,rollup=1",
        "a refused alter changes nothing"
    );
    exec(&mut c, "DELETE FROM tide.task")?;
    Ok(())
}

/// A task's database: one that does not exist, too long a name, a template, one that refuses
/// connections or one its owner may not connect to is refused when the task is made (each its
/// own SQLSTATE, the value named, a hint; nothing written). One dropped or closed afterwards
/// fails the run clearly, and never stops the others.
fn a_database_that_cannot_be_reached_is_refused(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.connect("postgres")?;
    for sql in [
        "DROP DATABASE IF EXISTS tide_cron_closed",
        "CREATE DATABASE tide_cron_closed",
        "ALTER DATABASE tide_cron_closed ALLOW_CONNECTIONS false",
        "DROP DATABASE IF EXISTS tide_cron_gone",
        "CREATE DATABASE tide_cron_gone",
        "DROP DATABASE IF EXISTS tide_cron_private",
        "CREATE DATABASE tide_cron_private",
        "REVOKE CONNECT ON DATABASE tide_cron_private FROM PUBLIC",
        "DROP ROLE IF EXISTS cron_carol",
        "CREATE ROLE cron_carol LOGIN",
    ] {
        exec(&mut admin, sql)?;
    }
    let mut c = cron_db(cluster)?;
    let mut carol = cluster.connect_as(CRON_DB, "cron_carol")?;
    let long = "x".repeat(64);
    for (who, sql, code, named) in [
        ("postgres", "SELECT tide.schedule('r', '@daily', 'SELECT 1', database => 'no_such_db')".to_string(), "3D000", "\"no_such_db\" does not exist"),
        ("postgres", format!("SELECT tide.schedule('r', '@daily', 'SELECT 1', database => '{long}')"), "22023", "is too long (64 bytes, at most 63)"),
        ("postgres", "SELECT tide.schedule('r', '@daily', 'SELECT 1', database => 'template1')".to_string(), "22023", "\"template1\" is a template"),
        ("postgres", "SELECT tide.schedule('r', '@daily', 'SELECT 1', database => 'tide_cron_closed')".to_string(), "55000", "\"tide_cron_closed\" is not currently accepting connections"),
        ("carol", "SELECT tide.schedule('r', '@daily', 'SELECT 1', database => 'tide_cron_private')".to_string(), "42501", "permission denied for database \"tide_cron_private\""),
        ("postgres", "SELECT tide.schedule('r', '@daily', database => 'postgres')".to_string(), "22023", "needs an SQL command"),
        ("postgres", "SELECT tide.schedule('r', '@daily', 'SELECT 1', database => 'postgres', ready_check => 'true')".to_string(), "22023", "readiness check"),
    ] {
        let client = if who == "carol" { &mut carol } else { &mut c };
        let (got, message, hint) = refused(client, &sql)?;
        assert_eq!(got, code, "{sql}: {message}");
        assert!(message.contains(named), "{sql}: {message}");
        assert!(!hint.is_empty(), "{sql}");
    }
    let none: i64 = one(&mut c, "SELECT count(*) FROM tide.task")?;
    assert_eq!(none, 0, "nothing written");

    // A database dropped after the task was made: its runs fail clearly; other work goes on.
    exec(
        &mut c,
        "SELECT tide.schedule('to-gone', '@daily', 'SELECT 1', database => 'tide_cron_gone', max_attempts => 1);
         SELECT tide.schedule('here', '@daily', 'SELECT 1', max_attempts => 1);",
    )?;
    exec(
        &mut admin,
        "ALTER DATABASE tide_cron_closed ALLOW_CONNECTIONS true",
    )?;
    exec(
        &mut c,
        "SELECT tide.schedule('to-closed', '@daily', 'SELECT 1', database => 'tide_cron_closed', max_attempts => 1);",
    )?;
    exec(&mut admin, "DROP DATABASE tide_cron_gone")?;
    exec(
        &mut admin,
        "ALTER DATABASE tide_cron_closed ALLOW_CONNECTIONS false",
    )?;
    exec(
        &mut c,
        "SELECT tide.rerun('to-gone'); SELECT tide.rerun('to-closed'); SELECT tide.rerun('here');",
    )?;
    assert_eq!(wait_state(&mut c, "to-gone", "succeeded,dead")?, "dead");
    assert_eq!(wait_state(&mut c, "to-closed", "succeeded,dead")?, "dead");
    assert_eq!(wait_state(&mut c, "here", "succeeded,dead")?, "succeeded");
    let errors = rows(
        &mut c,
        "SELECT t.name || ': ' || r.last_error FROM tide.run r JOIN tide.task t USING (task_id)
          WHERE t.name IN ('to-gone', 'to-closed') ORDER BY t.name",
    )?;
    assert_eq!(
        errors,
        [
            "to-closed: database \"tide_cron_closed\" is not currently accepting connections",
            "to-gone: database \"tide_cron_gone\" does not exist",
        ]
    );
    exec(&mut c, "DELETE FROM tide.task")?;
    Ok(())
}

/// pg_cron's own queries of its run view, with tide. for cron.: the latest runs, failures,
/// a job's last run by name, joined with tide.job; each role sees its own rows.
fn job_run_details_answers_pg_crons_queries(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cron_db(cluster)?;
    exec(
        &mut c,
        "DROP ROLE IF EXISTS cron_dave; CREATE ROLE cron_dave LOGIN;
         SELECT tide.schedule('ok', '@daily', 'SELECT 1', max_attempts => 1);
         SELECT tide.schedule('broken', '@daily', 'SELECT 1 / 0', max_attempts => 1);
         SELECT tide.schedule('slow', '@daily', 'SELECT pg_sleep(30)', max_attempts => 1);
         SELECT tide.rerun('ok'); SELECT tide.rerun('broken'); SELECT tide.rerun('slow');",
    )?;
    wait_state(&mut c, "ok", "succeeded")?;
    wait_state(&mut c, "broken", "dead")?;
    wait_state(&mut c, "slow", "running")?;
    // pg_cron's README: the latest runs.
    let latest = rows(
        &mut c,
        "SELECT concat_ws('|', command, status, return_message, end_time IS NOT NULL, runid IS NOT NULL)
           FROM (select * from tide.job_run_details order by start_time desc limit 5) d ORDER BY command",
    )?;
    assert_eq!(
        latest,
        [
            "SELECT 1|succeeded|1 row|t|t",
            "SELECT 1 / 0|failed|division by zero|t|t",
            "SELECT pg_sleep(30)|running|f|t",
        ]
    );
    // The failures, the latest first.
    let failures = rows(
        &mut c,
        "SELECT r.command FROM tide.job_run_details r WHERE status != 'succeeded' AND status != 'running'
          ORDER BY start_time DESC LIMIT 5",
    )?;
    assert_eq!(failures, ["SELECT 1 / 0"]);
    // A job's last run, found by its name in tide.job (as cron.job), and a join of the two.
    let last: String = one(
        &mut c,
        "SELECT status FROM tide.job_run_details
          WHERE jobid = (SELECT jobid FROM tide.job WHERE jobname = 'broken')
          ORDER BY start_time DESC LIMIT 1",
    )?;
    assert_eq!(last, "failed");
    let joined = rows(
        &mut c,
        "SELECT j.jobname || '|' || j.schedule || '|' || j.active || '|' || d.status
           FROM tide.job j JOIN tide.job_run_details d USING (jobid) ORDER BY j.jobname",
    )?;
    assert_eq!(
        joined,
        [
            "broken|@daily|true|failed",
            "ok|@daily|true|succeeded",
            "slow|@daily|true|running"
        ]
    );
    // Another role sees none of these.
    let mut dave = cluster.connect_as(CRON_DB, "cron_dave")?;
    let theirs: i64 = one(
        &mut dave,
        "SELECT (SELECT count(*) FROM tide.job_run_details) + (SELECT count(*) FROM tide.job)",
    )?;
    assert_eq!(theirs, 0);
    exec(
        &mut c,
        "SELECT tide.cancel_run(run_id) FROM tide.run WHERE state = 'running'; DELETE FROM tide.task;",
    )?;
    Ok(())
}

fn main() {
    let tests: &[(&str, TestFn)] = &[
        (
            "workers_import_reports_then_moves_jobs",
            import_reports_then_moves_jobs,
        ),
        (
            "workers_jobs_of_two_databases_run_in_their_own",
            jobs_of_two_databases_run_in_their_own,
        ),
        (
            "workers_two_statements_are_all_or_nothing_before_and_after_import",
            two_statements_are_all_or_nothing_before_and_after_import,
        ),
        (
            "workers_missed_fires_are_skipped_not_run",
            missed_fires_are_skipped_not_run,
        ),
        (
            "workers_commands_that_cannot_run_where_scheduled_are_refused",
            commands_that_cannot_run_where_scheduled_are_refused,
        ),
        (
            "workers_a_database_that_cannot_be_reached_is_refused",
            a_database_that_cannot_be_reached_is_refused,
        ),
        (
            "workers_job_run_details_answers_pg_crons_queries",
            job_run_details_answers_pg_crons_queries,
        ),
    ];
    run_tests_with(
        "pg_cron",
        &format!(
            "shared_preload_libraries = 'pg_tide,pg_cron'\ncron.database_name = '{CRON_DB}'\npg_tide.database = '{CRON_DB}'\nmax_worker_processes = 24"
        ),
        tests,
    )
}

//! Moving over from pg_cron, against the real pg_cron (Debian's postgresql-15-cron, 1.4) preloaded
//! beside pg_tide: `tide.import_pg_cron()` reports what each job becomes and, with
//! `apply => true`, creates the tasks as the jobs' roles and unschedules those jobs in one
//! transaction; what cannot be carried over stays in pg_cron with the reason. The imported
//! tasks then run: a VACUUM job at top level.

use std::time::Duration;

use pg_tide_pg_test::{
    db_err, one, refused, run_tests_with, wait_for, Client, Cluster, Failed, TestFn,
};

const CRON_DB: &str = "tide_cron";

fn exec(c: &mut Client, sql: &str) -> Result<(), Failed> {
    c.batch_execute(sql).map_err(db_err)
}

fn rows(c: &mut Client, sql: &str) -> Result<Vec<String>, Failed> {
    Ok(c.query(sql, &[])
        .map_err(db_err)?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect())
}

fn import_reports_then_moves_jobs(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db(CRON_DB)?;
    exec(
        &mut c,
        "CREATE EXTENSION pg_cron;
         DROP ROLE IF EXISTS cron_bob; CREATE ROLE cron_bob LOGIN;
         GRANT USAGE ON SCHEMA cron TO cron_bob;
         CREATE TABLE tally (n integer);
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

    // The report (no apply) writes nothing.
    let report = rows(
        &mut c,
        "SELECT concat_ws('|', coalesce(jobname, '-'), task, schedule, tz, owner, top_level, paused, action, problem)
           FROM tide.import_pg_cron() ORDER BY jobid",
    )?;
    assert_eq!(
        report,
        [
            "nightly-vacuum|nightly-vacuum|30 3 * * *|GMT|postgres|t|f|to import",
            "-|pg_cron_2|*/15 8-18 * * 1-5|GMT|postgres|f|f|to import",
            "monthly|monthly|@monthly|GMT|postgres|t|f|to import",
            "paused-one|paused-one|0 12 1,15 * *|GMT|postgres|f|t|to import",
            "never|never|0 0 30 2 *|GMT|postgres|f|f|kept in pg_cron|cron expression \"0 0 30 2 *\" never fires",
            "elsewhere|elsewhere|0 1 * * *|GMT|postgres|f|f|kept in pg_cron|it runs in database postgres: import it there",
            "bobs-count|bobs-count|* * * * *|GMT|cron_bob|f|f|to import",
        ]
    );
    let nothing: i64 = one(
        &mut c,
        "SELECT (SELECT count(*) FROM tide.task) * 100 + (SELECT count(*) FROM cron.job)",
    )?;
    assert_eq!(nothing, 7, "a report creates no task and keeps every job");

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
    assert_eq!(
        left,
        ["never", "elsewhere"],
        "only what could not be carried over stays"
    );
    let tasks = rows(
        &mut c,
        "SELECT concat_ws('|', name, owner, schedule, tz, top_level, paused) FROM tide.task ORDER BY task_id",
    )?;
    assert_eq!(
        tasks,
        [
            "nightly-vacuum|postgres|30 3 * * *|GMT|t|f",
            "pg_cron_2|postgres|*/15 8-18 * * 1-5|GMT|f|f",
            "monthly|postgres|@monthly|GMT|t|f",
            "paused-one|postgres|0 12 1,15 * *|GMT|f|t",
            "bobs-count|cron_bob|* * * * *|GMT|f|f",
        ]
    );
    // Importing again changes nothing: the rest is still reported, with its reason.
    let again = rows(
        &mut c,
        "SELECT task || '|' || action FROM tide.import_pg_cron(apply => true)",
    )?;
    assert_eq!(
        again,
        ["never|kept in pg_cron", "elsewhere|kept in pg_cron"]
    );

    // The imported VACUUM job runs at top level as its owner.
    exec(&mut c, "SELECT tide.run_now('nightly-vacuum')")?;
    let state = wait_for(
        "the imported VACUUM to run",
        Duration::from_secs(60),
        || {
            let s: Option<String> = c
                .query_opt(
                    "SELECT r.state::text FROM tide.run r JOIN tide.task t USING (task_id)
                  WHERE t.name = 'nightly-vacuum' AND r.state IN ('succeeded', 'dead')",
                    &[],
                )
                .map_err(|e| pg_tide_pg_test::describe(&e))?
                .map(|r| r.get(0));
            Ok(s)
        },
    )?;
    assert_eq!(state, "succeeded");

    // Bad input.
    let (code, message, hint) = refused(&mut c, "SELECT * FROM tide.import_pg_cron(NULL)")?;
    assert_eq!(code, "22004", "{message}");
    assert!(message.contains("apply"), "{message}");
    assert!(!hint.is_empty());
    let mut other = cluster.fresh_db("tide_no_cron")?;
    let (code, message, hint) = refused(&mut other, "SELECT * FROM tide.import_pg_cron()")?;
    assert_eq!(code, "55000", "{message}");
    assert!(message.contains("tide_no_cron"), "{message}");
    assert!(hint.contains("cron.database_name"), "{hint}");
    Ok(())
}

fn main() {
    let tests: &[(&str, TestFn)] = &[(
        "workers_import_reports_then_moves_jobs",
        import_reports_then_moves_jobs,
    )];
    run_tests_with(
        "pg_cron",
        &format!(
            "shared_preload_libraries = 'pg_tide,pg_cron'\ncron.database_name = '{CRON_DB}'\npg_tide.database = '{CRON_DB}'"
        ),
        tests,
    )
}

//! Out-of-process tests: what a user of pg_tide sees through real connections to a real
//! cluster with pg_tide preloaded. One cluster is shared; each test uses its own database.

use pg_tide_pg_test::{db_err, exec, one, run_tests, Cluster, Failed, TestFn};

/// The version in the extension's Cargo.toml, which `cargo pgrx install` writes into the control
/// file.
fn extension_version() -> String {
    include_str!("../../Cargo.toml")
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap_or("unknown")
        .to_string()
}

/// The server loads pg_tide at start and the extension installs with its schema.
fn preloaded_and_installed(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("t_installed")?;
    let preload: String = one(&mut c, "SHOW shared_preload_libraries")?;
    assert_eq!(preload, "pg_tide");
    let version: String = one(
        &mut c,
        "SELECT extversion FROM pg_extension WHERE extname = 'pg_tide'",
    )?;
    assert_eq!(version, extension_version());
    let functions: i64 = one(
        &mut c,
        "SELECT count(*) FROM pg_proc WHERE pronamespace = 'tide'::regnamespace
            AND proname IN ('schedule', 'alter', 'unschedule', 'pause', 'resume', 'next_fires', 'preview')",
    )?;
    assert_eq!(functions, 7);
    // Every function and table is documented in the catalog (\df+ and \d+ show it).
    let undocumented: String = one(
        &mut c,
        "SELECT coalesce(string_agg(what, ', '), '') FROM (
             SELECT p.oid::regprocedure::text AS what FROM pg_proc p
              WHERE pronamespace = 'tide'::regnamespace AND obj_description(p.oid, 'pg_proc') IS NULL
             UNION ALL
             SELECT c.oid::regclass::text FROM pg_class c
              WHERE relnamespace = 'tide'::regnamespace AND relkind = 'r'
                AND obj_description(c.oid, 'pg_class') IS NULL) u",
    )?;
    assert_eq!(undocumented, "", "objects without COMMENT");
    Ok(())
}

/// Bad input reaches a client as SQLSTATE, a message naming the value, and a hint; the
/// transaction it happened in wrote nothing.
fn bad_input_reaches_the_client_with_code_and_hint(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("t_bad_input")?;
    let err = c
        .query(
            "SELECT tide.schedule('bill', '0 1 * * *', tz => 'Asia/Shangai')",
            &[],
        )
        .expect_err("an unknown zone must be refused");
    let db = err.as_db_error().ok_or("not a database error")?;
    assert_eq!(db.code().code(), "22023");
    assert_eq!(db.message(), "unknown time zone \"Asia/Shangai\"");
    assert!(
        db.hint().unwrap_or_default().contains("'Asia/Shanghai'"),
        "{:?}",
        db.hint()
    );

    let err = c
        .query("SELECT tide.schedule('bill', '0 0 30 2 *')", &[])
        .expect_err("a cron that never fires must be refused");
    let db = err.as_db_error().ok_or("not a database error")?;
    assert_eq!(
        (db.code().code(), db.message()),
        ("22023", "cron expression \"0 0 30 2 *\" never fires")
    );

    c.batch_execute("SELECT tide.schedule('bill', '0 1 * * *')")
        .map_err(db_err)?;
    let err = c
        .query("SELECT tide.schedule('bill', '0 2 * * *')", &[])
        .expect_err("a duplicate name must be refused");
    assert_eq!(err.code().map(|s| s.code()), Some("23505"));
    let schedule: String = one(&mut c, "SELECT schedule FROM tide.task WHERE name = 'bill'")?;
    assert_eq!(schedule, "0 1 * * *");
    Ok(())
}

/// Row-level security with real login roles on separate connections.
fn roles_see_only_their_own_tasks(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.fresh_db("t_rls")?;
    admin
        .batch_execute(
            "DROP ROLE IF EXISTS tide_alice; DROP ROLE IF EXISTS tide_bob;
             CREATE ROLE tide_alice LOGIN; CREATE ROLE tide_bob LOGIN;",
        )
        .map_err(db_err)?;
    let mut alice = cluster.connect_as("t_rls", "tide_alice")?;
    let mut bob = cluster.connect_as("t_rls", "tide_bob")?;
    alice
        .batch_execute("SELECT tide.schedule('alice_bill', '0 1 * * *', tz => 'Asia/Shanghai')")
        .map_err(db_err)?;
    bob.batch_execute("SELECT tide.schedule('bob_sync', '@hourly')")
        .map_err(db_err)?;
    let alice_sees: String = one(&mut alice, "SELECT string_agg(name, ',') FROM tide.task")?;
    let bob_sees: String = one(&mut bob, "SELECT string_agg(name, ',') FROM tide.task")?;
    assert_eq!(
        (alice_sees.as_str(), bob_sees.as_str()),
        ("alice_bill", "bob_sync")
    );
    let err = bob
        .query(
            "SELECT tide.alter('alice_bill', schedule => '0 2 * * *')",
            &[],
        )
        .expect_err("bob must not change alice's task");
    assert_eq!(err.code().map(|s| s.code()), Some("42704"));
    let all: i64 = one(&mut admin, "SELECT count(*) FROM tide.task")?;
    assert_eq!(all, 2, "the superuser sees every task");
    Ok(())
}

/// pg_dump keeps tasks and their versions; a restore into a new database has the same rules
/// and new tasks get fresh ids.
fn pg_dump_keeps_tasks_versions_and_runs(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("t_dump_src")?;
    c.batch_execute(
        "SELECT tide.schedule('daily_bill', '0 1 * * *', tz => 'Asia/Shanghai', biz_window => 'day');
         SELECT tide.alter('daily_bill', queue => 'billing');
         -- Its failed run below waits an hour for its retry: the tick after it must not move it
         -- (with the default full jitter, a retry may come due at once: CI saw it once).
         SELECT tide.schedule('ny_sync', '0 * * * *', tz => 'America/New_York',
                              backoff_base => '1 hour', jitter => 'none');",
    )
    .map_err(db_err)?;
    let summary =
        "SELECT string_agg(t.name || '@' || v.version || '=' || (v.rules->>'queue') || '/' || t.tz,
                                     ',' ORDER BY t.name, v.version)
                     FROM tide.task t JOIN tide.task_version v USING (task_id)";
    let before: String = one(&mut c, summary)?;
    assert_eq!(before, "daily_bill@1=default/Asia/Shanghai,daily_bill@2=billing/Asia/Shanghai,ny_sync@1=default/America/New_York");
    // Runs with attempts and history: one succeeded, one waiting for its retry.
    c.batch_execute(
        "SELECT tide.rerun('ny_sync', window_start => date_trunc('hour', now()) - interval '3 hours');
         SELECT tide.rerun('ny_sync', window_start => date_trunc('hour', now()) - interval '2 hours');
         SELECT tide.complete_run(run_id, lease_token) FROM tide.claim_runs(n => 1);
         SELECT tide.fail_run(run_id, lease_token, 'timeout') FROM tide.claim_runs(n => 1);
         SELECT tide.schedule('on_signup', NULL, topics => ARRAY['signup']);
         SELECT tide.emit('signup', '{\"id\": 1}', event_key => 'u1');",
    )
    .map_err(db_err)?;
    let runs = "SELECT concat_ws('|', (SELECT string_agg(state::text, ',' ORDER BY run_id) FROM tide.run),
                                 (SELECT count(*) FROM tide.attempt), (SELECT count(*) FROM tide.run_event))";
    // The counters of tide.metrics(): those above folded by a tick, the event run's success
    // not yet.
    c.batch_execute("SELECT tide.tick()").map_err(db_err)?;
    c.batch_execute("SELECT tide.complete_run(run_id, lease_token) FROM tide.claim_runs(n => 1)")
        .map_err(db_err)?;
    // Three runs: two succeeded (three history rows each: created, claimed, ended), one waiting
    // for its retry (the same three); three attempts.
    let runs_before: String = one(&mut c, runs)?;
    assert_eq!(runs_before, "succeeded,retry,succeeded|3|9");
    let before: String = one(&mut c, summary)?;
    let counters = "SELECT string_agg(l, ' ' ORDER BY l) FROM regexp_split_to_table(tide.metrics(), E'\n') l
                     WHERE l ~ '^pg_tide_(runs_total|run_duration_seconds_count|queue_wait_seconds_count)'";
    let counters_before: String = one(&mut c, counters)?;
    for task in ["ny_sync", "on_signup"] {
        assert!(
            counters_before.contains(&format!("task=\"{task}\",outcome=\"succeeded\"}} 1")),
            "{task}'s success counted: {counters_before}"
        );
    }
    let health = "SELECT string_agg(concat_ws(' ', task, status, last_state, consecutive_failures, last_success), ', ' ORDER BY task)
                    FROM tide.health WHERE task <> 'pg_tide'";
    let health_before: String = one(&mut c, health)?;

    let dump_file = format!("/tmp/pg_tide-pg_test-dump-{}.sql", std::process::id());
    cluster.tool("pg_dump", &["-d", "t_dump_src", "-f", &dump_file])?;
    let mut admin = cluster.connect("postgres")?;
    admin
        .batch_execute("DROP DATABASE IF EXISTS t_dump_dst")
        .map_err(db_err)?;
    admin
        .batch_execute("CREATE DATABASE t_dump_dst")
        .map_err(db_err)?;
    // Restore the way a user would: psql, stopping at the first error.
    let restored = cluster.tool(
        "psql",
        &[
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            "t_dump_dst",
            "-f",
            &dump_file,
        ],
    );
    let _ = std::fs::remove_file(&dump_file);
    restored?;
    let mut dst = cluster.connect("t_dump_dst")?;
    let after: String = one(&mut dst, summary)?;
    assert_eq!(after, before);
    let runs_after: String = one(&mut dst, runs)?;
    assert_eq!(
        runs_after, runs_before,
        "runs, attempts and history restored, none recorded twice"
    );
    let counters_after: String = one(&mut dst, counters)?;
    assert_eq!(
        counters_after, counters_before,
        "counters restored, the restored history not counted again"
    );
    let health_after: String = one(&mut dst, health)?;
    assert_eq!(health_after, health_before);
    // Fencing tokens continue after the restore: a new claim gets a larger token.
    dst.batch_execute("SELECT tide.tick(now() + interval '1 hour')")
        .map_err(db_err)?;
    let token: i64 = one(&mut dst, "SELECT lease_token FROM tide.claim_runs(n => 1)")?;
    let max_token: i64 = one(&mut c, "SELECT max(lease_token) FROM tide.attempt")?;
    assert!(token > max_token, "token {token} <= {max_token}");
    // Event ids continue too: a new event is not taken for the restored one (its key is #id).
    let emitted: i32 = one(
        &mut dst,
        "SELECT tide.emit('signup', '{\"id\": 2}', event_key => 'u2')",
    )?;
    assert_eq!(emitted, 1, "a new event after the restore is a new run");
    let id: i64 = one(
        &mut dst,
        "SELECT tide.schedule('new_after_restore', '@daily')",
    )?;
    let max_before: i64 = one(&mut c, "SELECT max(task_id) FROM tide.task")?;
    assert!(
        id > max_before,
        "restored identity sequence must continue: {id} <= {max_before}"
    );
    Ok(())
}

/// Tasks survive a server restart unchanged.
fn tasks_survive_a_restart(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("t_restart")?;
    c.batch_execute("SELECT tide.schedule('month_end', '0 6 1 * *', tz => 'Europe/London', biz_window => 'month')")
        .map_err(db_err)?;
    let before: String = one(
        &mut c,
        "SELECT concat_ws(',', schedule, tz, biz_window, version, next_fire_at) FROM tide.task",
    )?;
    drop(c);
    cluster.restart()?;
    let mut c = cluster.connect("t_restart")?;
    let after: String = one(
        &mut c,
        "SELECT concat_ws(',', schedule, tz, biz_window, version, next_fire_at) FROM tide.task",
    )?;
    assert_eq!(after, before);
    Ok(())
}

/// The workers are woken, not found by their poll: on a server whose poll interval is a minute
/// (`pg_tide.tick_interval = 60s`), an emitted SQL run, a task's first fire a few seconds ahead,
/// a retry due a second later, and a run whose data is marked ready all run within seconds. Each wait below is far shorter than
/// the poll interval: without the wake-ups (src/wake.rs) every one of them would time out.
/// Waits until the scheduler and every executor are up in the connection's database (each
/// notes its latch in shared memory as it connects).
fn workers_up(c: &mut postgres::Client) -> Result<(), Failed> {
    pg_tide_pg_test::wait_for("the workers", std::time::Duration::from_secs(30), || {
        let up: bool = c
            .query_one(
                "SELECT scheduler_alive AND executors_alive = executors_expected FROM tide.self_health",
                &[],
            )
            .map_err(|e| e.to_string())?
            .get(0);
        Ok(up.then_some(()))
    })?;
    Ok(())
}

fn workers_are_woken_not_polled(_shared: &Cluster) -> Result<(), Failed> {
    let cluster = Cluster::start_with("woken", "pg_tide.tick_interval = 60000")?;
    let mut c = cluster.workers_db()?;
    // The workers poll once a minute, so every run below must come from a wake-up.
    workers_up(&mut c)?;
    let state = |c: &mut postgres::Client, task: &str, want: &str| -> Result<Option<()>, String> {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = $1 AND r.state::text = $2",
                &[&task, &want],
            )
            .map_err(|e| e.to_string())?
            .get(0);
        Ok((n > 0).then_some(()))
    };
    let within = std::time::Duration::from_secs(15);
    c.batch_execute(
        "SELECT tide.schedule('woken_event', NULL, topics => '{w}', command => 'SELECT 1');
         SELECT tide.emit('w');",
    )
    .map_err(db_err)?;
    pg_tide_pg_test::wait_for("the emitted run", within, || {
        state(&mut c, "woken_event", "succeeded")
    })?;
    // A task whose next fire is two seconds ahead: the scheduler sleeps until then.
    c.batch_execute("SELECT tide.schedule('woken_fire', '*/2 * * * * *', 'SELECT 1')")
        .map_err(db_err)?;
    pg_tide_pg_test::wait_for("the first fire", within, || {
        state(&mut c, "woken_fire", "succeeded")
    })?;
    c.batch_execute("SELECT tide.pause('woken_fire')")
        .map_err(db_err)?;
    // A run that fails once, retried a second later.
    c.batch_execute(
        "CREATE SEQUENCE woken_tries;  -- not rolled back with the failed attempt
         SELECT tide.schedule('woken_retry', NULL, topics => '{r}', backoff_base => '1 second', jitter => 'none',
             command => $c$SELECT CASE WHEN nextval('woken_tries') < 2 THEN tide.transient_error('once') END$c$);
         SELECT tide.emit('r');",
    )
    .map_err(db_err)?;
    pg_tide_pg_test::wait_for("the retried run", within, || {
        state(&mut c, "woken_retry", "succeeded")
    })?;
    let attempts: i32 = one(
        &mut c,
        "SELECT r.attempts FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'woken_retry'",
    )?;
    assert_eq!(attempts, 2);
    // A run that waits for a marker and a check: marking the data ready has it checked now.
    c.batch_execute(
        "SELECT tide.schedule('woken_ready', '0 0 1 1 *', 'SELECT 1', biz_window => 'day',
                              ready_dataset => 'woken_ds', ready_check => 'SELECT true');
         SELECT tide.rerun('woken_ready', biz_date => DATE '2026-01-01' - 1);",
    )
    .map_err(db_err)?;
    c.batch_execute("SELECT tide.mark_ready('woken_ds', DATE '2026-01-01' - 1)")
        .map_err(db_err)?;
    pg_tide_pg_test::wait_for("the marked run", within, || {
        state(&mut c, "woken_ready", "succeeded")
    })?;
    // A run enqueued for two seconds ahead: an idle executor sleeps until it is due.
    c.batch_execute(
        "SELECT tide.schedule('woken_later', NULL, topics => '{woken_never}', command => 'SELECT 1');
         SELECT tide.enqueue('woken_later', run_at => now() + interval '2 seconds');",
    )
    .map_err(db_err)?;
    pg_tide_pg_test::wait_for("the delayed run", within, || {
        state(&mut c, "woken_later", "succeeded")
    })?;
    let early: bool = one(
        &mut c,
        "SELECT r.started_at < r.created_at + interval '2 seconds' FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'woken_later'",
    )?;
    assert!(!early, "the delayed run started before its run_at");
    // A readiness check that fails once and is checked again a second later.
    c.batch_execute(
        "CREATE SEQUENCE woken_checks;
         SELECT tide.schedule('woken_recheck', '0 0 1 1 *', 'SELECT 1', biz_window => 'day',
                              recheck_interval => '1 second',
                              ready_check => $c$SELECT nextval('woken_checks') >= 2$c$);
         SELECT tide.rerun('woken_recheck', biz_date => DATE '2026-01-01' - 1);",
    )
    .map_err(db_err)?;
    pg_tide_pg_test::wait_for("the re-checked run", within, || {
        state(&mut c, "woken_recheck", "succeeded")
    })?;
    let checks: i64 = one(&mut c, "SELECT last_value FROM woken_checks")?;
    assert!(
        checks >= 2,
        "the run succeeded after {checks} readiness checks"
    );
    Ok(())
}

/// The scheduler makes a fire's runs ahead of it and commits them at the fire instant: while
/// five tasks fire every two seconds, a client looking all the time never sees a run whose fire
/// is still ahead, and no command runs before its run's fire.
fn fire_runs_appear_at_their_instant(_shared: &Cluster) -> Result<(), Failed> {
    let cluster = Cluster::start_with("ahead", "pg_tide.tick_interval = 60000")?;
    let mut c = cluster.workers_db()?;
    workers_up(&mut c)?;
    c.batch_execute(
        "CREATE TABLE ahead_log (run_id bigint NOT NULL, at timestamptz NOT NULL);
         SELECT tide.schedule('ahead_' || g, '*/2 * * * * *',
                              'INSERT INTO ahead_log VALUES (tide.run_id(), now())')
           FROM generate_series(1, 5) g;",
    )
    .map_err(db_err)?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        // A run is visible from its commit on, and the clock is read after the snapshot: a run
        // committed at its fire instant never shows a fire still ahead.
        let (ahead, done): (i64, i64) = c
            .query_one(
                "SELECT (SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id)
                          WHERE t.name LIKE 'ahead%' AND r.fire_at > clock_timestamp()),
                        (SELECT count(*) FROM ahead_log)",
                &[],
            )
            .map(|row| (row.get(0), row.get(1)))
            .map_err(db_err)?;
        assert_eq!(ahead, 0, "a run was visible before its fire instant");
        if done >= 15 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {done} of 15 runs in a minute"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let early: i64 = one(
        &mut c,
        "SELECT count(*) FROM ahead_log l JOIN tide.run r USING (run_id) WHERE l.at < r.fire_at",
    )?;
    assert_eq!(early, 0, "a command ran before its run's fire instant");
    Ok(())
}

/// One function creates runs and two write their history (src/runs/record.sql): in the
/// installed schema no other function inserts into tide.run, and only the creator (a run's first
/// row) and tide._write_history (every change) insert into tide.run_event. A new creator or
/// writer that bypassed them would skip the bookkeeping they own (pending lines, counts, wake-ups).
fn one_creator_and_one_change_writer(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("c_writers")?;
    let writers = |c: &mut postgres::Client, table: &str| -> Result<Vec<String>, Failed> {
        Ok(c.query(
            "SELECT p.proname::text FROM pg_proc p
                  WHERE p.pronamespace = 'tide'::regnamespace
                    AND p.prosrc ~* ('insert\\s+into\\s+tide\\.' || $1 || '\\s*\\(')
                  ORDER BY 1",
            &[&table],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| r.get(0))
        .collect())
    };
    assert_eq!(writers(&mut c, "run")?, ["_create_runs"]);
    assert_eq!(
        writers(&mut c, "run_event")?,
        ["_create_runs", "_write_history"]
    );
    // The pattern finds a writer: a function of the test's own that inserts runs is listed.
    exec(
        &mut c,
        "CREATE FUNCTION tide.c_probe() RETURNS void LANGUAGE plpgsql
             AS $$ BEGIN INSERT INTO tide.run (task_id) VALUES (0); END $$",
    )?;
    assert_eq!(writers(&mut c, "run")?, ["_create_runs", "c_probe"]);
    Ok(())
}

fn main() {
    let tests: &[(&str, TestFn)] = &[
        ("preloaded_and_installed", preloaded_and_installed),
        (
            "bad_input_reaches_the_client_with_code_and_hint",
            bad_input_reaches_the_client_with_code_and_hint,
        ),
        (
            "roles_see_only_their_own_tasks",
            roles_see_only_their_own_tasks,
        ),
        (
            "pg_dump_keeps_tasks_versions_and_runs",
            pg_dump_keeps_tasks_versions_and_runs,
        ),
        ("tasks_survive_a_restart", tasks_survive_a_restart),
        ("workers_are_woken_not_polled", workers_are_woken_not_polled),
        (
            "fire_runs_appear_at_their_instant",
            fire_runs_appear_at_their_instant,
        ),
        (
            "one_creator_and_one_change_writer",
            one_creator_and_one_change_writer,
        ),
    ];
    run_tests("shared", tests)
}

//! Security and isolation on a real cluster: three non-superuser roles (alice, bob, mallory) and
//! the superuser share one database and pg_tide's executors. Each row of the security review's
//! table (D1 to D12) is a regression test here, and the model is checked end to end: what each
//! role can see, change, claim and run; commands always run as their owner in a sealed session
//! state; one bad task or one held lock cannot stop anyone else's work.

use std::time::Duration;

use pg_tide_pg_test::{
    db_err, exec, notifications_until_sentinel, one, refused, run_tests, wait_for, Client, Cluster,
    Failed, TestFn, WORKERS_DB,
};

/// The three hostile-but-fair roles, created once per cluster, with the right to create tables
/// in `public` and schemas in `db`.
fn roles(admin: &mut Client, db: &str) -> Result<(), Failed> {
    exec(
        admin,
        &format!(
            "DO $$ BEGIN
                 IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'alice') THEN CREATE ROLE alice LOGIN; END IF;
                 IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'bob') THEN CREATE ROLE bob LOGIN; END IF;
                 IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mallory') THEN CREATE ROLE mallory LOGIN; END IF;
             END $$;
             GRANT CREATE ON SCHEMA public TO alice, bob, mallory;
             GRANT CREATE ON DATABASE {db} TO mallory;"
        ),
    )
}

/// Count of a role's runs of a task in a state, as that role sees them.
fn runs_in(c: &mut Client, task: &str, state: &str) -> Result<i64, String> {
    c.query_one(
        "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id)
          WHERE t.name = $1 AND t.owner = current_user AND r.state::text = $2",
        &[&task, &state],
    )
    .map(|r| r.get(0))
    .map_err(|e| e.to_string())
}

/// Waits until `n` runs of the caller's task are in `state`.
fn wait_runs(
    c: &mut Client,
    task: &str,
    state: &str,
    n: i64,
    within: Duration,
) -> Result<(), Failed> {
    wait_for(&format!("{n} runs of {task} {state}"), within, || {
        Ok((runs_in(c, task, state)? >= n).then_some(()))
    })?;
    Ok(())
}

/// Waits until no run of the caller's task is unfinished.
fn wait_settled(c: &mut Client, task: &str, within: Duration) -> Result<(), Failed> {
    wait_for(&format!("the runs of {task} to settle"), within, || {
        let open: i64 = c
            .query_one(
                "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id)
                  WHERE t.name = $1 AND t.owner = current_user
                    AND r.state IN ('waiting', 'ready', 'running', 'retry')",
                &[&task],
            )
            .map_err(|e| e.to_string())?
            .get(0);
        Ok((open == 0).then_some(()))
    })?;
    Ok(())
}

fn code_of(c: &mut Client, sql: &str) -> Result<String, Failed> {
    Ok(refused(c, sql)?.0)
}

/// D1: a command's session-level settings (here a search_path that puts the attacker's schema
/// before pg_catalog) do not outlive its run: the next commands, run as bob and as the
/// superuser, call pg_catalog.now(), not mallory's, and mallory stays an ordinary role.
fn d1_settings_do_not_outlive_a_run(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.workers_db()?;
    roles(&mut admin, WORKERS_DB)?;
    exec(
        &mut admin,
        "DROP SCHEMA IF EXISTS mallory CASCADE; DROP TABLE IF EXISTS d1_seen;",
    )?;
    let mut mallory = cluster.connect_as(WORKERS_DB, "mallory")?;
    exec(
        &mut mallory,
        "CREATE SCHEMA mallory; GRANT USAGE ON SCHEMA mallory TO PUBLIC;
         CREATE TABLE mallory.victims (who name); GRANT INSERT ON mallory.victims TO PUBLIC;
         CREATE FUNCTION mallory.now() RETURNS timestamptz LANGUAGE plpgsql AS $f$
         BEGIN
             INSERT INTO mallory.victims VALUES (current_user);
             BEGIN EXECUTE 'ALTER ROLE mallory SUPERUSER'; EXCEPTION WHEN others THEN NULL; END;
             RETURN pg_catalog.statement_timestamp();
         END $f$;
         SELECT tide.schedule('d1_poison', NULL, topics => ARRAY['d1.poison'],
             command => $c$SELECT set_config('search_path', 'mallory, pg_catalog', false)$c$);
         SELECT tide.emit('d1.poison') FROM generate_series(1, 8);",
    )?;
    wait_runs(
        &mut mallory,
        "d1_poison",
        "succeeded",
        8,
        Duration::from_secs(60),
    )?;

    let mut bob = cluster.connect_as(WORKERS_DB, "bob")?;
    exec(
        &mut bob,
        "SELECT tide.schedule('d1_bob', NULL, topics => ARRAY['d1.victim'], command => 'SELECT now()');",
    )?;
    let mut alice = cluster.connect_as(WORKERS_DB, "alice")?;
    exec(
        &mut alice,
        "CREATE TABLE d1_seen (search_path text, who name);
         SELECT tide.schedule('d1_alice', NULL, topics => ARRAY['d1.victim'],
             command => $c$INSERT INTO d1_seen SELECT current_setting('search_path'), current_user$c$);",
    )?;
    exec(
        &mut admin,
        "SELECT tide.schedule('d1_root', NULL, topics => ARRAY['d1.victim'], command => 'SELECT now()');
         SELECT tide.emit('d1.victim') FROM generate_series(1, 8);",
    )?;
    wait_settled(&mut admin, "d1_root", Duration::from_secs(60))?;
    wait_settled(&mut bob, "d1_bob", Duration::from_secs(60))?;
    wait_settled(&mut alice, "d1_alice", Duration::from_secs(60))?;
    let victims: i64 = one(&mut admin, "SELECT count(*) FROM mallory.victims")?;
    assert_eq!(victims, 0, "mallory's now() ran in someone else's command");
    let escalated: bool = one(
        &mut admin,
        "SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'",
    )?;
    assert!(!escalated, "mallory became a superuser");
    let succeeded = (
        runs_in(&mut admin, "d1_root", "succeeded")?,
        runs_in(&mut bob, "d1_bob", "succeeded")?,
    );
    assert_eq!(succeeded, (8, 8));
    // Every later command started from the executor's own search_path.
    let seen: String = one(
        &mut alice,
        "SELECT count(*) || ':' || string_agg(DISTINCT search_path || '/' || who, ',') FROM d1_seen",
    )?;
    assert_eq!(seen, "8:\"$user\", public/alice");
    exec(&mut admin, "ALTER ROLE mallory NOSUPERUSER")?;
    Ok(())
}

/// D2: a command cannot create temporary objects in the shared executor, so nothing it leaves
/// can capture another owner's statements: the superuser's 14 audit rows all land in the real
/// table.
fn d2_temporary_objects_are_refused(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.workers_db()?;
    roles(&mut admin, WORKERS_DB)?;
    exec(
        &mut admin,
        "DROP TABLE IF EXISTS audit_log; CREATE TABLE audit_log (line text);",
    )?;
    let mut mallory = cluster.connect_as(WORKERS_DB, "mallory")?;
    exec(
        &mut mallory,
        "SELECT tide.schedule('d2_temp', NULL, topics => ARRAY['d2.temp'], max_attempts => 1,
             command => $c$CREATE TEMP TABLE IF NOT EXISTS audit_log (line text)$c$);
         SELECT tide.emit('d2.temp') FROM generate_series(1, 6);",
    )?;
    wait_settled(&mut mallory, "d2_temp", Duration::from_secs(60))?;
    let error: String = one(
        &mut mallory,
        "SELECT min(r.last_error) || ' x' || count(*) FROM tide.run r JOIN tide.task t USING (task_id)
          WHERE t.name = 'd2_temp' AND r.state = 'dead'",
    )?;
    assert_eq!(
        error,
        "cannot create temporary table within security-restricted operation x6"
    );
    exec(
        &mut admin,
        "SELECT tide.schedule('d2_audit', NULL, topics => ARRAY['d2.audit'],
             command => $c$INSERT INTO audit_log VALUES (tide.payload()->>'n')$c$);
         SELECT tide.emit('d2.audit', jsonb_build_object('n', g)) FROM generate_series(1, 14) g;",
    )?;
    wait_runs(
        &mut admin,
        "d2_audit",
        "succeeded",
        14,
        Duration::from_secs(60),
    )?;
    let rows: i64 = one(
        &mut admin,
        "SELECT count(DISTINCT line) FROM public.audit_log",
    )?;
    assert_eq!(rows, 14, "every audit row in the real table");
    Ok(())
}

/// D3: a command that makes its session read-only does not stop the executors.
fn d3_session_defaults_do_not_stop_executors(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.workers_db()?;
    roles(&mut admin, WORKERS_DB)?;
    exec(&mut admin, "DROP TABLE IF EXISTS d3_done")?;
    let mut mallory = cluster.connect_as(WORKERS_DB, "mallory")?;
    exec(
        &mut mallory,
        "SELECT tide.schedule('d3_ro', NULL, topics => ARRAY['d3.ro'],
             command => $c$SELECT set_config('default_transaction_read_only', 'on', false),
                                  set_config('statement_timeout', '1', false),
                                  set_config('lock_timeout', '1', false)$c$);
         SELECT tide.emit('d3.ro') FROM generate_series(1, 6);",
    )?;
    wait_runs(
        &mut mallory,
        "d3_ro",
        "succeeded",
        6,
        Duration::from_secs(60),
    )?;
    let mut alice = cluster.connect_as(WORKERS_DB, "alice")?;
    exec(
        &mut alice,
        "CREATE TABLE d3_done (n int, ro text);
         SELECT tide.schedule('d3_alice', NULL, topics => ARRAY['d3.alice'],
             command => $c$INSERT INTO d3_done SELECT 1, current_setting('transaction_read_only') FROM pg_sleep(0.01)$c$);
         SELECT tide.emit('d3.alice') FROM generate_series(1, 6);",
    )?;
    wait_runs(
        &mut alice,
        "d3_alice",
        "succeeded",
        6,
        Duration::from_secs(60),
    )?;
    let ro: String = one(
        &mut alice,
        "SELECT string_agg(DISTINCT ro, ',') FROM d3_done",
    )?;
    assert_eq!(ro, "off");
    Ok(())
}

/// D4: absurd rules are refused before they are written; nobody but pg_tide writes its tables;
/// and a task whose stored rules break anyway (here corrupted by hand, as a superuser) is
/// recorded as broken, alerts, and is retried, while every other task keeps firing.
fn d4_one_bad_task_cannot_stop_the_tick(cluster: &Cluster) -> Result<(), Failed> {
    let db = "s_tick";
    let mut admin = cluster.fresh_db(db)?;
    roles(&mut admin, db)?;
    let mut mallory = cluster.connect_as(db, "mallory")?;
    for option in [
        "ready_timeout => '1000000 years'",
        "source_retention => '1000000 years'",
        "args => (SELECT (repeat('[', 200) || repeat(']', 200))::jsonb)",
        "args => (SELECT ('{\"a\":' || repeat('[', 200) || repeat(']', 200) || '}')::jsonb)",
    ] {
        let code = code_of(
            &mut mallory,
            &format!("SELECT tide.schedule('m_bad', '* * * * *', {option})"),
        )?;
        assert_eq!(code, "22023", "{option}");
    }
    exec(
        &mut mallory,
        "SELECT tide.schedule('m_task', '* * * * *', misfire => 'latest');",
    )?;
    for sql in [
        "UPDATE tide.task SET args = '{\"a\": 1}'",
        "INSERT INTO tide.run (task_id, trigger, window_start, window_end, version, state, reason, executor, queue, owner)
         SELECT task_id, 'manual', now(), now() + interval '1 s', 1, 'ready', 'forged', 'external', 'default', 'mallory' FROM tide.task",
        "DELETE FROM tide.task",
    ] {
        assert_eq!(code_of(&mut mallory, sql)?, "42501", "{sql}");
    }
    let mut alice = cluster.connect_as(db, "alice")?;
    exec(
        &mut alice,
        "SELECT tide.schedule('a_task', '* * * * *', misfire => 'latest');",
    )?;
    // Rules that no longer validate, as an older version might have stored them.
    exec(
        &mut admin,
        "UPDATE tide.task SET source_retention = '1000000 years', misfire = 'catch_up' WHERE name = 'm_task'",
    )?;
    let tick = "SELECT tide.tick(now() + interval '3 minutes')";
    exec(&mut admin, tick)?;
    let alice_runs = runs_in(&mut alice, "a_task", "ready")?;
    assert!(alice_runs >= 1, "alice's task fired");
    let broken: String = one(
        &mut mallory,
        "SELECT (tick_error IS NOT NULL)::text || ':' || (tick_retry_at > now())::text FROM tide.task WHERE name = 'm_task'",
    )?;
    assert_eq!(broken, "true:true", "the broken task records its error");
    let alert: String = one(
        &mut mallory,
        "SELECT details->>'error' FROM tide.alert
          WHERE subject = 'm_task' AND kind = 'schedule_error' AND resolved_at IS NULL",
    )?;
    assert!(alert.contains("source_retention"), "{alert}");
    // Fixed, the task fires again at its next try and the alert resolves.
    exec(
        &mut admin,
        "UPDATE tide.task SET source_retention = NULL, misfire = 'latest' WHERE name = 'm_task'",
    )?;
    exec(&mut admin, "SELECT tide.tick(now() + interval '2 hours')")?;
    let fixed: String = one(
        &mut mallory,
        "SELECT (tick_error IS NULL)::text || ':' || (SELECT count(*) FROM tide.run r WHERE r.state <> 'skipped' AND r.task_id = t.task_id) FROM tide.task t WHERE name = 'm_task'",
    )?;
    assert_eq!(fixed, "true:1");
    let open: i64 = one(
        &mut mallory,
        "SELECT count(*) FROM tide.alert WHERE subject = 'm_task' AND kind = 'schedule_error' AND resolved_at IS NULL",
    )?;
    assert_eq!(open, 0);
    Ok(())
}

/// D5: the claim path: absurd leases are refused, nobody writes tide.pending, and no advisory
/// lock a role can take (pg_tide takes none that a user could hold) freezes a task's runs, let
/// alone everyone's claims.
fn d5_claims_cannot_be_frozen(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.workers_db()?;
    roles(&mut admin, WORKERS_DB)?;
    exec(&mut admin, "DROP TABLE IF EXISTS d5_done")?;
    let mut mallory = cluster.connect_as(WORKERS_DB, "mallory")?;
    for option in [
        "timeout => '1000000 years'",
        "lease => '290000 years'",
        "timeout => '178000000 years'",
    ] {
        assert_eq!(
            code_of(
                &mut mallory,
                &format!("SELECT tide.schedule('d5_bad', '* * * * *', {option})")
            )?,
            "22023",
            "{option}"
        );
    }
    assert_eq!(
        code_of(
            &mut mallory,
            "INSERT INTO tide.pending (run_id, task_id, state, executor, queue, priority, owner)
             VALUES (999999, 1, 'ready', 'sql', 'default', 1000, 'mallory')"
        )?,
        "42501"
    );
    exec(
        &mut admin,
        "CREATE TABLE d5_done (who text); GRANT INSERT ON d5_done TO bob, alice;",
    )?;
    let mut bob = cluster.connect_as(WORKERS_DB, "bob")?;
    exec(&mut bob, "SET statement_timeout = '20s'")?;
    let bob_task: i64 = one(
        &mut bob,
        "SELECT tide.schedule('d5_bob', NULL, topics => ARRAY['d5.bob'], priority => 1000,
             lock_key => 'acct:{key}', command => $c$INSERT INTO d5_done VALUES ('bob')$c$)",
    )?;
    let mut alice = cluster.connect_as(WORKERS_DB, "alice")?;
    exec(
        &mut alice,
        "SELECT tide.schedule('d5_alice', NULL, topics => ARRAY['d5.alice'],
             command => $c$INSERT INTO d5_done VALUES ('alice')$c$);",
    )?;
    // Mallory holds, at session level, every advisory lock pg_tide 0.1 took for this task.
    let class = 1_952_064_613;
    exec(
        &mut mallory,
        &format!(
            "SELECT pg_advisory_lock({class}, hashtext(k))
               FROM unnest(ARRAY['gate:{bob_task}:k1', 'task:{bob_task}', 'lock:bob:acct:k1', 'emit:k1']) k"
        ),
    )?;
    exec(&mut bob, "SELECT tide.emit('d5.bob', event_key => 'k1')")?;
    exec(&mut alice, "SELECT tide.emit('d5.alice')")?;
    wait_runs(&mut bob, "d5_bob", "succeeded", 1, Duration::from_secs(30))?;
    wait_runs(
        &mut alice,
        "d5_alice",
        "succeeded",
        1,
        Duration::from_secs(30),
    )?;
    exec(&mut mallory, "SELECT pg_advisory_unlock_all()")?;
    Ok(())
}

/// D5, the row-lock side: a role's open transaction that holds its own task's row and its own
/// lock key (mid-claim, say) delays that role's runs only; the executors go on with everyone
/// else's, even when the held runs come first in priority.
fn d5_a_roles_open_transaction_delays_only_its_own_runs(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.workers_db()?;
    roles(&mut admin, WORKERS_DB)?;
    exec(&mut admin, "DROP TABLE IF EXISTS d5b_done")?;
    exec(
        &mut admin,
        "CREATE TABLE d5b_done (who text); GRANT INSERT ON d5b_done TO mallory, alice;",
    )?;
    let mut mallory = cluster.connect_as(WORKERS_DB, "mallory")?;
    exec(&mut mallory, "SET statement_timeout = '30s'")?;
    exec(
        &mut mallory,
        "SELECT tide.schedule('d5b_conc', NULL, topics => ARRAY['d5b.conc'], priority => 1000,
             overlap => 'allow', max_concurrency => 1,
             command => $c$INSERT INTO d5b_done VALUES ('mallory conc')$c$);
         SELECT tide.schedule('d5b_keyed', NULL, topics => ARRAY['d5b.keyed'], priority => 1000,
             lock_key => 'acct:1', command => $c$INSERT INTO d5b_done VALUES ('mallory keyed')$c$);
         SELECT tide.schedule('d5b_ext', NULL, topics => ARRAY['d5b.ext'], lock_key => 'acct:1', queue => 'd5b');",
    )?;
    // Mallory's worker claims the external run (taking lock acct:1) and stays in its
    // transaction; another session of hers holds her task's row.
    exec(&mut mallory, "SELECT tide.emit('d5b.ext')")?;
    exec(
        &mut mallory,
        "BEGIN; SELECT * FROM tide.claim_runs('d5b', worker => 'slow');",
    )?;
    let mut mallory2 = cluster.connect_as(WORKERS_DB, "mallory")?;
    exec(&mut mallory2, "BEGIN; SELECT tide.pause('d5b_conc');")?;
    let mut mallory3 = cluster.connect_as(WORKERS_DB, "mallory")?;
    exec(&mut mallory3, "SET statement_timeout = '30s'")?;
    exec(
        &mut mallory3,
        "SELECT tide.emit('d5b.conc'); SELECT tide.emit('d5b.keyed');",
    )?;
    let mut alice = cluster.connect_as(WORKERS_DB, "alice")?;
    exec(
        &mut alice,
        "SELECT tide.schedule('d5b_alice', NULL, topics => ARRAY['d5b.alice'],
             command => $c$INSERT INTO d5b_done VALUES ('alice')$c$);
         SELECT tide.emit('d5b.alice') FROM generate_series(1, 5);",
    )?;
    wait_runs(
        &mut alice,
        "d5b_alice",
        "succeeded",
        5,
        Duration::from_secs(30),
    )?;
    // Once mallory's transactions end, her runs go too.
    exec(&mut mallory, "COMMIT")?;
    exec(&mut mallory2, "ROLLBACK")?;
    wait_runs(
        &mut mallory3,
        "d5b_conc",
        "succeeded",
        1,
        Duration::from_secs(90),
    )?;
    let done: String = one(
        &mut admin,
        "SELECT string_agg(DISTINCT who, ',' ORDER BY who) FROM d5b_done",
    )?;
    assert!(done.starts_with("alice,mallory conc"), "{done}");
    Ok(())
}

/// D6: step records carry their owner and cannot be forged: mallory cannot mark the
/// superuser's charge step done.
fn d6_steps_cannot_be_forged(cluster: &Cluster) -> Result<(), Failed> {
    let db = "s_steps";
    let mut admin = cluster.fresh_db(db)?;
    roles(&mut admin, db)?;
    exec(&mut admin, "SELECT tide.schedule('pay', '0 * * * *')")?;
    let run: i64 = one(
        &mut admin,
        "SELECT tide.rerun('pay', window_start => date_trunc('hour', now()) - interval '2 hours')",
    )?;
    let token: i64 = one(
        &mut admin,
        "SELECT lease_token FROM tide.claim_runs(worker => 'w')",
    )?;
    let mut mallory = cluster.connect_as(db, "mallory")?;
    assert_eq!(
        code_of(
            &mut mallory,
            &format!(
                "INSERT INTO tide.step (run_id, name, done, output, attempt, owner)
                 VALUES ({run}, 'charge', true, '{{\"charged\": 0}}', 1, 'mallory')"
            )
        )?,
        "42501"
    );
    // Tokens are sequential; knowing one does not let another role act on the run.
    for sql in [
        format!("SELECT * FROM tide.start_step({run}, {token}, 'charge')"),
        format!("SELECT tide.complete_step({run}, {token}, 'charge', '{{}}')"),
        format!("SELECT tide.complete_run({run}, {token})"),
        format!("SELECT tide.heartbeat_run({run}, {token})"),
    ] {
        assert_eq!(code_of(&mut mallory, &sql)?, "42704", "{sql}");
    }
    let done: bool = one(
        &mut admin,
        &format!("SELECT done FROM tide.start_step({run}, {token}, 'charge')"),
    )?;
    assert!(!done, "the charge step must run");
    Ok(())
}

/// D7: names belong to their owner. The superuser's check `offsite_backup` is its own, beats
/// land there, and a role learns nothing of another's names; versions and history cannot be
/// forged and rules cannot be changed around tide.alter.
fn d7_names_belong_to_their_owner(cluster: &Cluster) -> Result<(), Failed> {
    let db = "s_names";
    let mut admin = cluster.fresh_db(db)?;
    roles(&mut admin, db)?;
    let mut mallory = cluster.connect_as(db, "mallory")?;
    let mut alice = cluster.connect_as(db, "alice")?;
    exec(
        &mut mallory,
        "SELECT tide.create_check('offsite_backup', '1 day');",
    )?;
    exec(
        &mut admin,
        "SELECT tide.create_check('offsite_backup', '1 day');
         SELECT tide.heartbeat_check('offsite_backup');",
    )?;
    let beats: String = one(
        &mut admin,
        "SELECT string_agg(owner || '=' || beats, ',' ORDER BY owner) FROM tide.check WHERE name = 'offsite_backup'",
    )?;
    assert_eq!(beats, "mallory=0,postgres=1");
    let mallory_sees: String = one(
        &mut mallory,
        "SELECT string_agg(owner || ':' || beats, ',') FROM tide.check",
    )?;
    assert_eq!(mallory_sees, "mallory:0");
    // Two roles may use one task name; errors about another role's name read as "no such task".
    exec(
        &mut alice,
        "SELECT tide.schedule('daily_bill', '0 1 * * *')",
    )?;
    exec(
        &mut alice,
        "SELECT tide.schedule('alice_only', '0 1 * * *')",
    )?;
    exec(
        &mut mallory,
        "SELECT tide.schedule('daily_bill', '0 2 * * *')",
    )?;
    let theirs = refused(
        &mut mallory,
        "SELECT tide.alter('alice_only', priority => 5)",
    )?;
    let nobodys = refused(
        &mut mallory,
        "SELECT tide.alter('nobody_has_this', priority => 5)",
    )?;
    assert_eq!(theirs.0, "42704");
    assert_eq!(
        theirs.1.replace("alice_only", "X"),
        nobodys.1.replace("nobody_has_this", "X")
    );
    for sql in [
        "SELECT tide.pause('alice_only')",
        "SELECT tide.rerun('alice_only', biz_date => current_date - 2)",
        "SELECT * FROM tide.preview('alice_only')",
        "SELECT tide.monitor('alice_only', max_silence => '1 day')",
        "SELECT tide.confirm('alice_only', 1)",
    ] {
        assert_eq!(code_of(&mut mallory, sql)?, "42704", "{sql}");
    }
    // A removal of a name the caller does not have removes nothing, as for a name nobody has.
    let removed: bool = one(&mut mallory, "SELECT tide.unschedule('alice_only')")?;
    assert!(
        !removed,
        "mallory's unschedule of alice's task removes nothing"
    );
    let kept: i64 = one(
        &mut admin,
        "SELECT count(*) FROM tide.task WHERE name = 'alice_only'",
    )?;
    assert_eq!(kept, 1, "alice's task is still there");
    exec(&mut mallory, "SELECT tide.pause('daily_bill')")?;
    let paused: String = one(
        &mut admin,
        "SELECT string_agg(owner || '=' || paused, ',' ORDER BY owner) FROM tide.task WHERE name = 'daily_bill'",
    )?;
    assert_eq!(paused, "alice=false,mallory=true");
    for sql in [
        "UPDATE tide.task SET max_attempts = 1000000",
        "INSERT INTO tide.task_version (task_id, version, rules, owner) SELECT task_id, 99, '{}', 'mallory' FROM tide.task",
        "INSERT INTO tide.run_event (run_id, to_state, reason, owner) VALUES (1, 'succeeded', 'forged', 'mallory')",
        "INSERT INTO tide.check (name, period, owner) VALUES ('x', '1 day', 'mallory')",
        "UPDATE tide.check SET beats = 100",
        "INSERT INTO tide.effect (channel, dedupe_key, owner) VALUES ('sms', 'k', 'mallory')",
        "INSERT INTO tide.ready_marker (dataset, biz_date) VALUES ('orders', current_date)",
        "INSERT INTO tide.lock (owner, key, run_id, task_id, lease_token, expires_at) VALUES ('mallory', 'k', 1, 1, 1, now())",
        "INSERT INTO tide.alert_route (channel) VALUES ('x')",
        "SELECT nextval('tide.lease_token_seq')",
    ] {
        assert_eq!(code_of(&mut mallory, sql)?, "42501", "{sql}");
    }
    Ok(())
}

/// D8: hostile strings are refused cheaply: a 4 MB time zone name is refused at once (no "did
/// you mean" over every zone), and a call cancelled by the client ends at once.
fn d8_hostile_strings_are_refused_cheaply(cluster: &Cluster) -> Result<(), Failed> {
    let db = "s_strings";
    let mut admin = cluster.fresh_db(db)?;
    roles(&mut admin, db)?;
    let mut mallory = cluster.connect_as(db, "mallory")?;
    exec(&mut mallory, "SET statement_timeout = '20s'")?;
    for sql in [
        "SELECT * FROM tide.next_fires('* * * * *', tz => repeat('x', 4194304))",
        "SELECT tide.schedule('t', '* * * * *', tz => repeat('Europe/Berlin', 100000))",
        "SELECT tide.schedule(repeat('n', 100000), '* * * * *')",
        "SELECT tide.schedule('t', repeat('* ', 1000000))",
        "SELECT tide.create_check(repeat('c', 100000), '1 day')",
        "SELECT tide.mark_ready(repeat('d', 100000), current_date)",
        "SELECT tide.emit('t', event_key => repeat('k', 100000))",
        "SELECT tide.schedule('t', '* * * * *', lock_key => repeat('k', 100000))",
    ] {
        let (code, message, _) = refused(&mut mallory, sql)?;
        assert_eq!(code, "22023", "{sql}: {message}");
        assert!(
            message.len() < 400,
            "the message quotes a bounded part: {message}"
        );
    }
    // The 4 MB zone again, watched from outside: either it is refused before anyone sees it
    // busy, or a cancel ends it within seconds (it used to spin a minute, cancel or not).
    let conn = cluster.conn_string(db, "mallory");
    let call = std::thread::spawn(move || -> Result<String, String> {
        let mut c = postgres::Client::connect(&conn, postgres::NoTls).map_err(|e| e.to_string())?;
        match c
            .batch_execute("SELECT * FROM tide.next_fires('* * * * *', tz => repeat('y', 4194304))")
        {
            Ok(()) => Ok("ok".into()),
            Err(e) => Ok(e.code().map(|s| s.code().to_string()).unwrap_or_default()),
        }
    });
    let mut watcher = cluster.connect(db)?;
    let busy = wait_for(
        "the call to end or be seen running",
        Duration::from_secs(20),
        || {
            if call.is_finished() {
                return Ok(Some(None));
            }
            let rows = watcher
                .query(
                    "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND usename = 'mallory'
                    AND state = 'active' AND query LIKE '%repeat(''y''%'",
                    &[&db],
                )
                .map_err(|e| e.to_string())?;
            Ok(rows.first().map(|r| Some(r.get::<_, i32>(0))))
        },
    )?;
    if let Some(pid) = busy {
        exec(&mut watcher, &format!("SELECT pg_cancel_backend({pid})"))?;
        wait_for("the cancelled call to end", Duration::from_secs(10), || {
            Ok(call.is_finished().then_some(()))
        })?;
    }
    let code = call.join().map_err(|_| "the calling thread panicked")??;
    assert!(code == "22023" || code == "57014", "{code}");
    Ok(())
}

/// D9: a run whose executor dies is taken back as soon as the scheduler sees the executor gone
/// (not after its timeout plus a minute), and the task's later windows flow.
fn d9_a_dead_executors_run_is_taken_back_at_once(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.workers_db()?;
    // The task fires every two seconds, one window at a time. Its first run hangs for ten
    // minutes (the task's timeout is the default hour); every other run is quick.
    exec(
        &mut admin,
        "DROP TABLE IF EXISTS d9_log;
         CREATE TABLE d9_log (run bigint);
         CREATE OR REPLACE FUNCTION d9_work() RETURNS void LANGUAGE plpgsql AS $f$
         BEGIN
             IF tide.run_id() = (SELECT min(r.run_id) FROM tide.run r JOIN tide.task t USING (task_id)
                                  WHERE t.name = 'd9_every_2s')
                AND (SELECT attempts FROM tide.run WHERE run_id = tide.run_id()) = 1 THEN
                 PERFORM pg_sleep(600);
             END IF;
             INSERT INTO d9_log VALUES (tide.run_id());
         END $f$;
         SELECT tide.schedule('d9_every_2s', '*/2 * * * * *', misfire => 'latest', backoff_base => '1 second',
                              command => 'SELECT d9_work()');",
    )?;
    let run: i64 = wait_for("a d9 run to be running", Duration::from_secs(30), || {
        let rows = admin
            .query(
                "SELECT r.run_id FROM tide.run r JOIN tide.task t USING (task_id)
                  WHERE t.name = 'd9_every_2s' AND r.state = 'running'",
                &[],
            )
            .map_err(|e| e.to_string())?;
        Ok(rows.first().map(|r| r.get::<_, i64>(0)))
    })?;
    drop(admin);
    let killed = cluster.kill_9("pg_tide executor")?;
    assert!(killed >= 1);
    let mut admin = cluster.workers_db()?;
    let outcome = wait_for("the run to be taken back", Duration::from_secs(20), || {
        let rows = admin
            .query(
                "SELECT outcome::text FROM tide.attempt WHERE run_id = $1",
                &[&run],
            )
            .map_err(|e| e.to_string())?;
        Ok(rows.first().map(|r| r.get::<_, String>(0)))
    })?;
    assert_eq!(outcome, "lost");
    wait_for("later windows to succeed", Duration::from_secs(30), || {
        let n: i64 = admin
            .query_one("SELECT count(DISTINCT run) FROM d9_log", &[])
            .map_err(|e| e.to_string())?
            .get(0);
        Ok((n >= 3).then_some(()))
    })?;
    let explained: String = one(
        &mut admin,
        &format!("SELECT string_agg(line, E'\\n') FROM tide.explain({run}) line"),
    )?;
    assert!(explained.contains("is gone"), "{explained}");
    exec(&mut admin, "SELECT tide.unschedule('d9_every_2s')")?;
    Ok(())
}

/// D10: no input reaches the user as an internal error: dates past what the calendar can
/// compute, JSON nested past what Rust parses, infinities.
fn d10_no_internal_errors(cluster: &Cluster) -> Result<(), Failed> {
    let db = "s_internal";
    let mut admin = cluster.fresh_db(db)?;
    roles(&mut admin, db)?;
    let mut mallory = cluster.connect_as(db, "mallory")?;
    exec(
        &mut mallory,
        "SELECT tide.schedule('hourly', '0 * * * *');
         SELECT tide.schedule('keyed', NULL, topics => ARRAY['k'], lock_key => 'k:{payload.a}');",
    )?;
    for (sql, want) in [
        ("SELECT * FROM tide.next_fires('* * * * *', after => '262144-01-01')", "22008"),
        ("SELECT * FROM tide.next_fires('* * * * *', after => '294276-01-01')", "22008"),
        ("SELECT * FROM tide.next_fires('* * * * *', after => 'infinity')", "22008"),
        ("SELECT * FROM tide.next_fires('* * * * *', after => '4000-01-01 BC')", "22008"),
        ("SELECT * FROM tide.preview('hourly', after => '270000-06-01')", "22008"),
        ("SELECT tide.rerun('hourly', biz_date => '270000-06-01')", "22008"),
        ("SELECT tide.rerun('hourly', biz_date => 'infinity')", "22008"),
        ("SELECT tide.rerun('hourly', window_start => '-infinity')", "22008"),
        (
            "SELECT tide.schedule('deep', '@daily', args => (SELECT ('{\"a\":' || repeat('[', 129) || repeat(']', 129) || '}')::jsonb))",
            "22023",
        ),
        (
            "SELECT tide.alter('hourly', args => (SELECT ('{\"a\":' || repeat('[', 129) || repeat(']', 129) || '}')::jsonb))",
            "22023",
        ),
        ("SELECT tide.schedule('big', '@daily', args => '{\"a\": 1e400}')", "22023"),
        ("SELECT tide._backoff_delay(2147483647, '10 s', 100, '1 day', 'full', 0.5) IS NULL", "ok"),
        ("SELECT tide.claim_runs(n => 2147483647)", "22023"),
    ] {
        match c_result(&mut mallory, sql)? {
            None => assert_eq!(want, "ok", "{sql} succeeded"),
            Some(code) => assert_eq!(code, want, "{sql}"),
        }
    }
    // A payload nested deeper than Rust parses still gets its lock key.
    let n: i32 = one(
        &mut mallory,
        "SELECT tide.emit('k', ('{\"a\": \"x\", \"b\": ' || repeat('[', 1000) || repeat(']', 1000) || '}')::jsonb)",
    )?;
    assert_eq!(n, 1);
    let key: String = one(&mut mallory, "SELECT lock_key FROM tide.run")?;
    assert_eq!(key, "k:x");
    let n: i32 = one(&mut mallory, "SELECT tide.emit('k', '{\"a\": 1e400}')")?;
    assert_eq!(n, 1);
    Ok(())
}

/// None when `sql` succeeds, else its SQLSTATE.
fn c_result(c: &mut Client, sql: &str) -> Result<Option<String>, Failed> {
    match c.batch_execute(sql) {
        Ok(()) => Ok(None),
        Err(e) => Ok(Some(
            e.as_db_error()
                .map(|d| d.code().code().to_string())
                .ok_or_else(|| format!("{sql}: {e}"))?,
        )),
    }
}

/// D11: absurd values are refused with a proper SQLSTATE instead of being stored (or silently
/// ignored later).
fn d11_absurd_input_is_refused(cluster: &Cluster) -> Result<(), Failed> {
    let db = "s_absurd";
    let mut admin = cluster.fresh_db(db)?;
    roles(&mut admin, db)?;
    let mut mallory = cluster.connect_as(db, "mallory")?;
    exec(&mut mallory, "SELECT tide.schedule('t', '@daily')")?;
    for (sql, want) in [
        (
            "SELECT tide.schedule('x', '@daily', timeout => '178000000 years')",
            "22023",
        ),
        (
            "SELECT tide.schedule('x', '@daily', lease => '290000 years')",
            "22023",
        ),
        (
            "SELECT tide.schedule('x', '@daily', backoff_base => '-1 month 31 days')",
            "22023",
        ),
        (
            "SELECT tide.alter('t', backoff_cap => '-1 month 31 days')",
            "22023",
        ),
        (
            "SELECT tide.alter('t', misfire_threshold => '1 day -1 second')",
            "22023",
        ),
        (
            "SELECT tide.schedule('x', '@daily', recheck_interval => '100 years')",
            "22023",
        ),
        (
            "SELECT tide.monitor('t', max_silence => '5000 years')",
            "22023",
        ),
        (
            "SELECT tide.create_check('c', '1 day', grace => '10000 years')",
            "22023",
        ),
        ("SELECT tide.create_check('c', '1000 years')", "22023"),
        ("SELECT tide.mark_ready('orders', 'infinity')", "22008"),
        ("SELECT tide.mark_ready('orders', '-infinity')", "22008"),
        ("SELECT tide.create_check(E' \\t\\n ', '1 day')", "22023"),
        ("SELECT tide.schedule(E'\\t\\n', '@daily')", "22023"),
        ("SELECT tide.drop_emit_trigger(NULL, 'x')", "22004"),
        ("SELECT tide.create_emit_trigger(NULL, 'x')", "22004"),
        (
            "SELECT tide.create_effect('sms', repeat('k', 5000))",
            "22023",
        ),
        ("SELECT tide.fail_run(NULL, NULL, 'x')", "22004"),
    ] {
        assert_eq!(c_result(&mut mallory, sql)?.as_deref(), Some(want), "{sql}");
    }
    let task: String = one(
        &mut mallory,
        "SELECT backoff_cap::text || ',' || misfire_threshold::text FROM tide.task WHERE name = 't'",
    )?;
    assert_eq!(
        task, "01:00:00,00:01:00",
        "refused changes leave the task as it was"
    );
    Ok(())
}

/// What each role can see, change, claim and run: only its own, whatever it tries; the
/// superuser sees everything and acts on another role's run by id.
fn roles_see_change_claim_and_run_only_their_own(cluster: &Cluster) -> Result<(), Failed> {
    let db = "s_roles";
    let mut admin = cluster.fresh_db(db)?;
    roles(&mut admin, db)?;
    let mut alice = cluster.connect_as(db, "alice")?;
    let mut bob = cluster.connect_as(db, "bob")?;
    exec(
        &mut alice,
        "SELECT tide.schedule('work', '0 * * * *', queue => 'shared')",
    )?;
    exec(
        &mut bob,
        "SELECT tide.schedule('work', '0 * * * *', queue => 'shared')",
    )?;
    let a_run: i64 = one(
        &mut alice,
        "SELECT tide.rerun('work', window_start => date_trunc('hour', now()) - interval '3 hours')",
    )?;
    let b_run: i64 = one(
        &mut bob,
        "SELECT tide.rerun('work', window_start => date_trunc('hour', now()) - interval '3 hours')",
    )?;
    // Claims by a role take only its own runs, even from a shared queue.
    let claimed: String = one(
        &mut bob,
        "SELECT string_agg(run_id::text, ',') FROM tide.claim_runs('shared', n => 10)",
    )?;
    assert_eq!(claimed, b_run.to_string());
    let a_token: i64 = one(
        &mut alice,
        "SELECT lease_token FROM tide.claim_runs('shared', n => 10)",
    )?;
    for sql in [
        format!("SELECT tide.complete_run({a_run}, {a_token})"),
        format!("SELECT tide.fail_run({a_run}, {a_token}, 'x')"),
        format!("SELECT tide.cancel_run({a_run})"),
        format!("SELECT tide.cancel_run({a_run})"),
        format!("SELECT tide.pause_run({a_run})"),
        format!("SELECT tide.replay_run({a_run})"),
        format!("SELECT tide.resolve_run({a_run}, 'accept')"),
        format!("SELECT * FROM tide.explain({a_run})"),
    ] {
        assert_eq!(code_of(&mut bob, &sql)?, "42704", "{sql}");
    }
    let seen: String = one(
        &mut bob,
        "SELECT concat_ws('|', (SELECT count(*) FROM tide.task), (SELECT count(*) FROM tide.run),
                          (SELECT count(*) FROM tide.run_event), (SELECT count(*) FROM tide.task_version),
                          (SELECT count(*) FROM tide.health), (SELECT count(*) FROM tide.check_status))",
    )?;
    assert_eq!(
        seen, "1|1|2|1|1|1",
        "bob sees his task, run, history, version, health"
    );
    let metrics: String = one(&mut bob, "SELECT tide.metrics()")?;
    assert!(!metrics.contains("owner=\"alice\""), "{metrics}");
    // The superuser sees both and may act on alice's run by id.
    let all: i64 = one(&mut admin, "SELECT count(*) FROM tide.run")?;
    assert_eq!(all, 2);
    exec(
        &mut admin,
        &format!("SELECT tide.complete_run({a_run}, {a_token})"),
    )?;
    let by: String = one(
        &mut alice,
        &format!("SELECT state::text FROM tide.run WHERE run_id = {a_run}"),
    )?;
    assert_eq!(by, "succeeded");
    // Internal functions that change anything are not callable by roles at all.
    assert_eq!(
        code_of(
            &mut bob,
            &format!("SELECT tide._fail({b_run}, 'x', 'business', NULL, 'failed', now())")
        )?,
        "42501"
    );
    // (tide._seal_end is called by a command running as its owner, to switch back; it does
    // nothing without the key only the executor holds.)
    let callable: String = one(
        &mut bob,
        "SELECT coalesce(string_agg(p.oid::regprocedure::text, ', '), '') FROM pg_proc p
          WHERE p.pronamespace = 'tide'::regnamespace AND p.provolatile = 'v'
            AND p.prorettype <> 'trigger'::regtype
            AND (p.proname LIKE '\\_%' OR p.proname = 'tick') AND p.proname <> '_seal_end'
            AND has_function_privilege('bob', p.oid, 'EXECUTE')",
    )?;
    assert_eq!(callable, "", "internal functions bob may call");
    assert_eq!(
        code_of(&mut bob, "SELECT * FROM tide._seal_end(12345)")?,
        "42501",
        "a guessed key"
    );
    Ok(())
}

/// A command starts from the executor's pristine session and leaves nothing behind: settings,
/// advisory locks, prepared statements, listen registrations and temporary objects of an
/// earlier command (of another owner) are gone, and the command cannot change its role.
fn commands_run_sealed(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.workers_db()?;
    roles(&mut admin, WORKERS_DB)?;
    exec(&mut admin, "DROP TABLE IF EXISTS sealed_seen")?;
    let mut mallory = cluster.connect_as(WORKERS_DB, "mallory")?;
    exec(
        &mut mallory,
        "SELECT tide.schedule('leave_things', NULL, topics => ARRAY['sealed.leave'],
             command => $c$SELECT set_config('my.leak', 'mallory', false), pg_advisory_lock(4242),
                                  set_config('work_mem', '64kB', false)$c$);
         SELECT tide.schedule('prepare_things', NULL, topics => ARRAY['sealed.leave'], max_attempts => 1,
             command => 'PREPARE leak AS SELECT 1');
         SELECT tide.schedule('listen_things', NULL, topics => ARRAY['sealed.leave'], max_attempts => 1,
             command => 'LISTEN leak');
         SELECT tide.schedule('role_things', NULL, topics => ARRAY['sealed.leave'], max_attempts => 1,
             command => 'SET ROLE postgres');
         SELECT tide.emit('sealed.leave') FROM generate_series(1, 6);",
    )?;
    for task in [
        "leave_things",
        "prepare_things",
        "listen_things",
        "role_things",
    ] {
        wait_settled(&mut mallory, task, Duration::from_secs(60))?;
    }
    let dead: String = one(
        &mut mallory,
        "SELECT string_agg(DISTINCT t.name || ':' || r.state || ':' || r.last_error, ',' ORDER BY t.name || ':' || r.state || ':' || r.last_error)
           FROM tide.run r JOIN tide.task t USING (task_id)
          WHERE t.name IN ('prepare_things', 'listen_things', 'role_things')",
    )?;
    assert_eq!(
        dead,
        "listen_things:dead:cannot execute LISTEN within security-restricted operation,\
         prepare_things:dead:cannot execute PREPARE within security-restricted operation,\
         role_things:dead:cannot set parameter \"role\" within security-definer function",
        "LISTEN, PREPARE and SET ROLE are refused"
    );
    let mut alice = cluster.connect_as(WORKERS_DB, "alice")?;
    exec(
        &mut alice,
        "CREATE TABLE sealed_seen (leak text, work_mem text, locks bigint, prepared bigint, channels bigint,
                                   temp_schema oid, who name, super boolean);
         SELECT tide.schedule('observe', NULL, topics => ARRAY['sealed.observe'],
             command => $c$INSERT INTO sealed_seen
                 SELECT current_setting('my.leak', true), current_setting('work_mem'),
                        (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
                        (SELECT count(*) FROM pg_prepared_statements),
                        (SELECT count(*) FROM pg_listening_channels()),
                        pg_my_temp_schema(), current_user,
                        (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)$c$);
         SELECT tide.emit('sealed.observe') FROM generate_series(1, 6);",
    )?;
    wait_runs(
        &mut alice,
        "observe",
        "succeeded",
        6,
        Duration::from_secs(60),
    )?;
    let work_mem: String = one(&mut admin, "SELECT current_setting('work_mem')")?;
    let seen: String = one(
        &mut alice,
        "SELECT string_agg(DISTINCT concat_ws('|', coalesce(leak, ''), work_mem, locks, prepared, channels, temp_schema, who, super), ',')
           FROM sealed_seen",
    )?;
    assert_eq!(seen, format!("|{work_mem}|0|0|0|0|alice|f"));
    Ok(())
}

/// Roles that fit a company: a team role owns tasks and its member sees and changes them; a
/// worker role (tide_worker) claims and finishes the runs of the queue granted to it; an app role
/// (tide_producer) emits to the granted topic and enqueues into the granted task; tide_admin sees
/// and manages everything; an outsider reaches nothing, and is told so. Whatever runs, runs as
/// the task's owner, never as the role that caused it, never as a superuser.
fn predefined_roles_teams_and_grants(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.workers_db()?;
    exec(
        &mut admin,
        "DO $$ BEGIN
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'g_team') THEN CREATE ROLE g_team NOLOGIN; END IF;
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'g_alice') THEN CREATE ROLE g_alice LOGIN IN ROLE g_team; END IF;
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'g_worker') THEN CREATE ROLE g_worker LOGIN IN ROLE tide_worker; END IF;
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'g_app') THEN CREATE ROLE g_app LOGIN IN ROLE tide_producer; END IF;
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'g_ops') THEN CREATE ROLE g_ops LOGIN IN ROLE tide_admin; END IF;
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'g_eve') THEN CREATE ROLE g_eve LOGIN; END IF;
         END $$;
         GRANT CREATE ON SCHEMA public TO g_team;",
    )?;
    let predefined: i64 = one(&mut admin, "SELECT count(*) FROM pg_roles WHERE rolname IN ('tide_admin', 'tide_worker', 'tide_producer') AND NOT rolcanlogin")?;
    assert_eq!(predefined, 3, "CREATE EXTENSION made the predefined roles");
    let mut alice = cluster.connect_as(WORKERS_DB, "g_alice")?;
    let mut worker = cluster.connect_as(WORKERS_DB, "g_worker")?;
    let mut app = cluster.connect_as(WORKERS_DB, "g_app")?;
    let mut ops = cluster.connect_as(WORKERS_DB, "g_ops")?;
    let mut eve = cluster.connect_as(WORKERS_DB, "g_eve")?;
    // The team owns the tasks: its member creates them as the team.
    exec(
        &mut alice,
        "SET ROLE g_team;
         CREATE TABLE IF NOT EXISTS g_seen (who text, superuser boolean, payload jsonb);
         SELECT tide.schedule('g_ship', NULL, topics => '{g_orders}', queue => 'g_pay');
         SELECT tide.schedule('g_log', NULL, 'INSERT INTO public.g_seen SELECT current_user, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user), tide.payload()',
                              topics => '{g_orders}');
         SELECT tide.grant('claim', 'g_pay', 'tide_worker');
         SELECT tide.grant('emit', 'g_orders', 'tide_producer');
         SELECT tide.grant('enqueue', 'g_ship', 'g_app');
         RESET ROLE;",
    )?;
    // Who sees the tasks: the team's member and tide_admin; not the worker, the app or eve.
    let count = |c: &mut Client, sql: &str| -> Result<i64, Failed> { one(c, sql) };
    let sql = "SELECT count(*) FROM tide.task WHERE name IN ('g_ship', 'g_log')";
    assert_eq!(
        (
            count(&mut alice, sql)?,
            count(&mut ops, sql)?,
            count(&mut worker, sql)?,
            count(&mut app, sql)?,
            count(&mut eve, sql)?
        ),
        (2, 2, 0, 0, 0)
    );
    // The member changes the team's task by name; tide_admin pauses and resumes it; eve cannot.
    let version: i32 = one(&mut alice, "SELECT tide.alter('g_ship', priority => 5)")?;
    assert_eq!(version, 2);
    let paused: bool = one(&mut ops, "SELECT tide.pause('g_ship')")?;
    let resumed: bool = one(&mut ops, "SELECT tide.resume('g_ship')")?;
    assert!(paused && resumed);
    // A name two roles use is ambiguous for tide_admin, who must SET ROLE to the owner.
    exec(
        &mut eve,
        "SELECT tide.schedule('g_ship', NULL, topics => '{g_eve_own}')",
    )?;
    let (code, message, hint) = refused(&mut ops, "SELECT tide.pause('g_ship')")?;
    assert_eq!(code, "42P08", "{message}");
    assert!(hint.contains("SET ROLE"), "{hint}");
    let mine: bool = one(&mut eve, "SELECT tide.unschedule('g_ship')")?;
    assert!(mine, "eve's own g_ship");
    assert_eq!(code_of(&mut eve, "SELECT tide.pause('g_ship')")?, "42704");
    assert_eq!(
        code_of(&mut worker, "SELECT tide.alter('g_ship', priority => 1)")?,
        "42704"
    );
    let not_eves: bool = one(&mut eve, "SELECT tide.unschedule('g_ship')")?;
    assert!(!not_eves);
    // A grant is its giver's: eve granting herself the team's topic reaches nothing.
    let granted: bool = one(&mut eve, "SELECT tide.grant('emit', 'g_orders', 'g_eve')")?;
    assert!(granted);
    // The app emits to the granted topic: a run of each subscribed task, owned by the team.
    let created: i32 = one(&mut app, "SELECT tide.emit('g_orders', '{\"order\": 7}')")?;
    assert_eq!(created, 2);
    let enqueued: i64 = one(
        &mut app,
        "SELECT count(*) FROM tide.enqueue('g_ship', '{\"order\": 8}')",
    )?;
    assert_eq!(enqueued, 1);
    assert_eq!(
        code_of(&mut app, "SELECT tide.enqueue('g_log', '{}')")?,
        "42704",
        "g_log was not granted for enqueue"
    );
    let owners: String = one(&mut admin, "SELECT string_agg(DISTINCT r.owner, ',') FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name IN ('g_ship', 'g_log')")?;
    assert_eq!(owners, "g_team");
    let app_sees: i64 = one(&mut app, "SELECT count(*) FROM tide.run")?;
    assert_eq!(
        app_sees, 0,
        "the runs are the team's, not the app's to read"
    );
    // eve's emit reaches nothing, and she is told: a WARNING, never a silent 0.
    let eve_created: i32 = one(&mut eve, "SELECT tide.emit('g_orders', '{}')")?;
    assert_eq!(eve_created, 0);
    let warned = {
        let mut config = postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(cluster.port)
            .user("g_eve")
            .dbname(WORKERS_DB);
        let notices = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let sink = notices.clone();
        config.notice_callback(move |n| {
            if let Ok(mut v) = sink.lock() {
                v.push(format!(
                    "{}: {} ({})",
                    n.severity(),
                    n.message(),
                    n.hint().unwrap_or_default()
                ));
            }
        });
        let mut eve2 = config.connect(postgres::NoTls).map_err(db_err)?;
        exec(&mut eve2, "SELECT tide.emit('g_orders', '{}')")?;
        let joined = notices.lock().map(|v| v.join("\n")).unwrap_or_default();
        joined
    };
    assert!(
        warned.contains("WARNING: tide.emit: no task you may reach subscribes to topic 'g_orders'"),
        "{warned}"
    );
    assert!(warned.contains("tide.grant('emit'"), "{warned}");
    // The worker claims the granted queue's runs and finishes them; eve claims nothing there.
    assert_eq!(
        count(
            &mut eve,
            "SELECT count(*) FROM tide.claim_runs('g_pay', 'eve', 10)"
        )?,
        0
    );
    let claimed = worker
        .query(
            "SELECT run_id, lease_token FROM tide.claim_runs('g_pay', 'w1', 10)",
            &[],
        )
        .map_err(db_err)?;
    assert_eq!(
        claimed.len(),
        2,
        "the emitted and the enqueued run of g_ship"
    );
    for row in &claimed {
        let (run, token): (i64, i64) = (row.get(0), row.get(1));
        exec(&mut worker, &format!("SELECT tide.heartbeat_run({run}, {token}); SELECT tide.complete_run({run}, {token})"))?;
    }
    let done: i64 = one(&mut alice, "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'g_ship' AND r.state = 'succeeded'")?;
    assert_eq!(done, 2, "the team's member sees its runs finished");
    // g_log's command ran as the team, never as the app that emitted, never as a superuser.
    let seen = wait_for("g_log to run", Duration::from_secs(60), || {
        let row = admin
            .query_opt("SELECT who, superuser FROM g_seen LIMIT 1", &[])
            .map_err(|e| e.to_string())?;
        Ok(row.map(|r| (r.get::<_, String>(0), r.get::<_, bool>(1))))
    })?;
    assert_eq!(seen, ("g_team".to_string(), false));
    // Revoked: the worker's next claim finds nothing, though a run is ready.
    exec(
        &mut alice,
        "SET ROLE g_team; SELECT tide.revoke('claim', 'g_pay', 'tide_worker'); RESET ROLE;",
    )?;
    exec(&mut app, "SELECT tide.enqueue('g_ship', '{\"order\": 9}')")?;
    assert_eq!(
        count(
            &mut worker,
            "SELECT count(*) FROM tide.claim_runs('g_pay', 'w1', 10)"
        )?,
        0
    );
    let ready: i64 = one(&mut ops, "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'g_ship' AND r.state = 'ready'")?;
    assert_eq!(ready, 1, "tide_admin sees it waiting");
    // Bad grants are refused clearly.
    let (code, message, hint) = refused(&mut alice, "SELECT tide.grant('own', 'x', 'g_app')")?;
    assert_eq!(code, "22023");
    assert!(
        message.contains("unknown privilege 'own'") && hint.contains("claim"),
        "{message}"
    );
    let (code, message, _) = refused(
        &mut alice,
        "SELECT tide.grant('claim', 'g_pay', 'nobody_at_all')",
    )?;
    assert_eq!(code, "42704");
    assert!(message.contains("nobody_at_all"), "{message}");
    let (code, message, hint) = refused(&mut alice, "SELECT tide.revoke('claim', NULL, 'g_app')")?;
    assert_eq!(code, "22004", "{message}");
    assert!(!hint.is_empty());
    assert_eq!(
        code_of(&mut alice, "SELECT tide.revoke('own', 'g_pay', 'g_app')")?,
        "22023"
    );
    exec(&mut alice, "SET ROLE g_team; SELECT tide.unschedule('g_ship'); SELECT tide.unschedule('g_log'); RESET ROLE;")?;
    Ok(())
}

/// No role makes its code run as another: a readiness check runs as its task's owner (never as
/// whoever emitted, never as a superuser); an emit trigger needs the table's owner; a lock key
/// and a payload are data, never code; a SECURITY DEFINER function runs as its owner, so
/// mallory's function called from mallory's command is mallory's, not the executor's superuser.
fn no_role_runs_its_code_as_another(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.workers_db()?;
    roles(&mut admin, WORKERS_DB)?;
    exec(
        &mut admin,
        "DROP TABLE IF EXISTS public.x_checks, public.x_bob_orders, public.x_defs; DROP FUNCTION IF EXISTS public.x_whoami()",
    )?;
    let mut bob = cluster.connect_as(WORKERS_DB, "bob")?;
    let mut mallory = cluster.connect_as(WORKERS_DB, "mallory")?;
    exec(
        &mut bob,
        "CREATE TABLE public.x_checks (who name, super boolean);
         GRANT INSERT ON public.x_checks TO PUBLIC;
         CREATE TABLE public.x_bob_orders (id int);
         SELECT tide.schedule('x_checked', NULL, topics => ARRAY['x.go'], command => 'SELECT 1',
             -- Ready only when checked as bob, not a superuser: else the run never goes.
             ready_check => $c$SELECT current_user = 'bob' AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)$c$,
             lock_key => 'x:{payload.id}');
         SELECT tide.grant('emit', 'x.go', 'mallory');",
    )?;
    // A second task's command records who runs it; mallory emits to both.
    exec(
        &mut bob,
        "SELECT tide.schedule('x_recorded', NULL, topics => ARRAY['x.go'],
             command => 'INSERT INTO public.x_checks SELECT current_user, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)');",
    )?;
    let created: i32 = one(
        &mut mallory,
        "SELECT tide.emit('x.go', '{\"id\": \"1); DROP TABLE x_checks; --\"}')",
    )?;
    assert_eq!(created, 2);
    wait_runs(
        &mut bob,
        "x_checked",
        "succeeded",
        1,
        Duration::from_secs(60),
    )?;
    wait_runs(
        &mut bob,
        "x_recorded",
        "succeeded",
        1,
        Duration::from_secs(60),
    )?;
    let who: String = one(
        &mut bob,
        "SELECT string_agg(DISTINCT who || ':' || super, ',') FROM public.x_checks",
    )?;
    assert_eq!(
        who, "bob:false",
        "bob's commands run as bob, though mallory emitted"
    );
    let key: String = one(&mut bob, "SELECT r.lock_key FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'x_checked'")?;
    assert_eq!(
        key, "x:1); DROP TABLE x_checks; --",
        "a payload in a lock key is text"
    );
    let checked_by: i64 = one(
        &mut bob,
        "SELECT count(*) FROM tide.run_event e JOIN tide.run r USING (run_id) JOIN tide.task t USING (task_id)
          WHERE t.name = 'x_checked' AND e.to_state = 'ready'",
    )?;
    assert!(
        checked_by >= 1,
        "the readiness check ran (as bob) and let the run go"
    );
    // An emit trigger on bob's table is bob's to install.
    assert_eq!(
        code_of(
            &mut mallory,
            "SELECT tide.create_emit_trigger('public.x_bob_orders', 'x.go')"
        )?,
        "42501"
    );
    // mallory's SECURITY DEFINER function, called by mallory's command, runs as mallory.
    exec(
        &mut mallory,
        "CREATE TABLE public.x_defs (who name, super boolean);
         CREATE FUNCTION public.x_whoami() RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public
             AS $f$ INSERT INTO public.x_defs SELECT current_user, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) $f$;
         SELECT tide.schedule('x_definer', NULL, topics => ARRAY['x.def'], command => 'SELECT public.x_whoami()');
         SELECT tide.emit('x.def');",
    )?;
    wait_runs(
        &mut mallory,
        "x_definer",
        "succeeded",
        1,
        Duration::from_secs(60),
    )?;
    let definer: String = one(
        &mut mallory,
        "SELECT string_agg(who || ':' || super, ',') FROM public.x_defs",
    )?;
    assert_eq!(definer, "mallory:false");
    exec(
        &mut bob,
        "SELECT tide.unschedule('x_checked'); SELECT tide.unschedule('x_recorded')",
    )?;
    exec(&mut mallory, "SELECT tide.unschedule('x_definer')")?;
    Ok(())
}

/// D12: alert notifications carry no role's data. Any role may LISTEN on any channel, so
/// `pg_tide_alert` says only what happened and to which alert; what the alert is about (its
/// task, its details, such as a failed run's error) is read from `tide.alert`, where each role
/// sees its own. Mallory listens while a run of alice's fails with a secret in its error.
fn d12_alert_notifications_carry_no_roles_data(cluster: &Cluster) -> Result<(), Failed> {
    let db = "s_notify";
    let mut admin = cluster.fresh_db(db)?;
    roles(&mut admin, db)?;
    let mut alice = cluster.connect_as(db, "alice")?;
    let mut mallory = cluster.connect_as(db, "mallory")?;
    exec(&mut mallory, "LISTEN pg_tide_alert")?;
    exec(
        &mut alice,
        "SELECT tide.schedule('a_payments', '* * * * *', misfire => 'latest')",
    )?;
    exec(&mut admin, "SELECT tide.tick(now() + interval '3 minutes')")?;
    let failed: i64 = one(
        &mut alice,
        "SELECT count(tide.fail_run(c.run_id, c.lease_token, 'card 4111-secret refused', 'business'))
           FROM tide.claim_runs('default', 'alice-worker', 1) c",
    )?;
    assert_eq!(failed, 1, "alice's run was claimed and failed");
    let opened: i64 = one(
        &mut admin,
        "SELECT (tide._evaluate_alerts(now())->>'alerts_opened')::bigint",
    )?;
    assert!(opened >= 1, "no alert opened for the dead run");
    let alert_id: i64 = one(
        &mut alice,
        "SELECT alert_id FROM tide.alert WHERE subject = 'a_payments' AND kind = 'dead_letter'",
    )?;
    // Every notification up to a sentinel sent after the evaluation.
    let notes = notifications_until_sentinel(&mut mallory, &mut admin, "pg_tide_alert")?;
    let expected = format!("{{\"event\": \"opened\", \"alert_id\": {alert_id}}}");
    assert!(
        notes.contains(&expected),
        "the opening of alert {alert_id} was not notified as {expected}: {notes:?}"
    );
    for note in &notes {
        let keys: i64 = mallory
            .query_one(
                "SELECT count(*) FROM jsonb_object_keys($1::text::jsonb) k WHERE k NOT IN ('event', 'alert_id')",
                &[note],
            )
            .map_err(db_err)?
            .get(0);
        assert_eq!(
            keys, 0,
            "a notification says more than what happened: {note}"
        );
        assert!(
            !note.contains("secret") && !note.contains("a_payments"),
            "a notification carries alice's data: {note}"
        );
    }
    let seen: i64 = one(
        &mut mallory,
        &format!("SELECT count(*) FROM tide.alert WHERE alert_id = {alert_id}"),
    )?;
    assert_eq!(seen, 0, "mallory reads alice's alert");
    Ok(())
}

/// Membership as PostgreSQL 16 and later define it: a role acts for another in pg_tide (sees and
/// changes its tasks, receives its alerts, holds tide_admin's powers) only if it may SET ROLE to
/// it. A membership granted `WITH SET FALSE` gives nothing here, even with INHERIT (running a
/// role's task is acting as that role). On 15 every membership may SET ROLE, and the grant
/// options do not exist.
fn memberships_without_set_role_give_nothing(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = cluster.workers_db()?;
    let version: i32 = one(
        &mut admin,
        "SELECT current_setting('server_version_num')::int",
    )?;
    exec(
        &mut admin,
        "DO $$ BEGIN
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'm_team') THEN CREATE ROLE m_team NOLOGIN; END IF;
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'm_setter') THEN CREATE ROLE m_setter LOGIN; END IF;
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'm_inheritor') THEN CREATE ROLE m_inheritor LOGIN; END IF;
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'm_viewer') THEN CREATE ROLE m_viewer LOGIN; END IF;
         END $$;
         SET ROLE m_team;
         SELECT tide.schedule('m_job', NULL, topics => '{m_topic}');
         RESET ROLE;",
    )?;
    // The test itself: false for a role that does not exist or is NULL, true for a superuser.
    let edges: String = one(
        &mut admin,
        "SELECT concat_ws(',', tide._can_set_role(NULL, 'm_team'), tide._can_set_role('m_team', NULL),
                               tide._can_set_role('no such role', 'm_team'), tide._can_set_role('m_setter', 'no such role'),
                               tide._can_set_role('postgres', 'm_team'), tide._can_set_role('m_team', 'm_team'))",
    )?;
    assert_eq!(edges, "f,f,f,f,t,t");
    if version < 160000 {
        // 15: no grant options; a member may always SET ROLE, and acts for the role.
        let (code, message, _) = refused(
            &mut admin,
            "GRANT m_team TO m_inheritor WITH INHERIT TRUE, SET FALSE",
        )?;
        assert_eq!(code, "42601", "{message}");
        exec(&mut admin, "GRANT m_team TO m_setter")?;
        let mut setter = cluster.connect_as(WORKERS_DB, "m_setter")?;
        let sees: i64 = one(
            &mut setter,
            "SELECT count(*) FROM tide.task WHERE name = 'm_job'",
        )?;
        assert_eq!(
            sees, 1,
            "a member acts for its role on PostgreSQL {version}"
        );
        return Ok(());
    }
    exec(
        &mut admin,
        "GRANT m_team TO m_setter WITH INHERIT FALSE, SET TRUE;
         GRANT m_team TO m_inheritor WITH INHERIT TRUE, SET FALSE;
         GRANT tide_admin TO m_viewer WITH INHERIT TRUE, SET FALSE;",
    )?;
    let mut setter = cluster.connect_as(WORKERS_DB, "m_setter")?;
    let mut inheritor = cluster.connect_as(WORKERS_DB, "m_inheritor")?;
    let mut viewer = cluster.connect_as(WORKERS_DB, "m_viewer")?;
    // PostgreSQL calls all three members (pg_has_role's MEMBER): pg_tide does not.
    let members: i64 = one(
        &mut admin,
        "SELECT count(*) FROM (VALUES ('m_setter', 'm_team'), ('m_inheritor', 'm_team'), ('m_viewer', 'tide_admin')) v(m, r)
          WHERE pg_has_role(m, r, 'MEMBER')",
    )?;
    assert_eq!(members, 3);
    let sql = "SELECT count(*) FROM tide.task WHERE name = 'm_job'";
    let seen = (
        one::<i64>(&mut setter, sql)?,
        one::<i64>(&mut inheritor, sql)?,
        one::<i64>(&mut viewer, sql)?,
    );
    assert_eq!(
        seen,
        (1, 0, 0),
        "who sees m_team's task (setter, inheritor, viewer)"
    );
    // The one who may SET ROLE changes the task; the others find no such task.
    let v: i32 = one(&mut setter, "SELECT tide.alter('m_job', priority => 3)")?;
    assert_eq!(v, 2);
    for c in [&mut inheritor, &mut viewer] {
        assert_eq!(
            code_of(c, "SELECT tide.alter('m_job', priority => 4)")?,
            "42704"
        );
        assert_eq!(code_of(c, "SELECT tide.pause('m_job')")?, "42704");
    }
    // Alerts reach the channels of the roles that act for the owner only.
    let routed: String = one(
        &mut admin,
        "SELECT string_agg(m || '=' || tide._routed(m, 'm_team'), ',' ORDER BY m)
           FROM unnest(ARRAY['m_inheritor', 'm_setter', 'm_viewer']) m",
    )?;
    assert_eq!(routed, "m_inheritor=false,m_setter=true,m_viewer=false");
    exec(
        &mut admin,
        "SET ROLE m_team; SELECT tide.unschedule('m_job'); RESET ROLE;",
    )?;
    Ok(())
}

fn main() {
    let tests: &[(&str, TestFn)] = &[
        (
            "d1_settings_do_not_outlive_a_run",
            d1_settings_do_not_outlive_a_run,
        ),
        (
            "d2_temporary_objects_are_refused",
            d2_temporary_objects_are_refused,
        ),
        (
            "d3_session_defaults_do_not_stop_executors",
            d3_session_defaults_do_not_stop_executors,
        ),
        (
            "d4_one_bad_task_cannot_stop_the_tick",
            d4_one_bad_task_cannot_stop_the_tick,
        ),
        ("d5_claims_cannot_be_frozen", d5_claims_cannot_be_frozen),
        (
            "d5_a_roles_open_transaction_delays_only_its_own_runs",
            d5_a_roles_open_transaction_delays_only_its_own_runs,
        ),
        ("d6_steps_cannot_be_forged", d6_steps_cannot_be_forged),
        (
            "d7_names_belong_to_their_owner",
            d7_names_belong_to_their_owner,
        ),
        (
            "d8_hostile_strings_are_refused_cheaply",
            d8_hostile_strings_are_refused_cheaply,
        ),
        (
            "d9_a_dead_executors_run_is_taken_back_at_once",
            d9_a_dead_executors_run_is_taken_back_at_once,
        ),
        ("d10_no_internal_errors", d10_no_internal_errors),
        ("d11_absurd_input_is_refused", d11_absurd_input_is_refused),
        (
            "roles_see_change_claim_and_run_only_their_own",
            roles_see_change_claim_and_run_only_their_own,
        ),
        ("commands_run_sealed", commands_run_sealed),
        (
            "predefined_roles_teams_and_grants",
            predefined_roles_teams_and_grants,
        ),
        (
            "memberships_without_set_role_give_nothing",
            memberships_without_set_role_give_nothing,
        ),
        (
            "no_role_runs_its_code_as_another",
            no_role_runs_its_code_as_another,
        ),
        (
            "d12_alert_notifications_carry_no_roles_data",
            d12_alert_notifications_carry_no_roles_data,
        ),
    ];
    run_tests("security", tests)
}

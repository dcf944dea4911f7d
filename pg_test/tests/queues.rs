//! Queues with limits on a real cluster (R14.1: nothing can start a retry storm): a queue's
//! max_concurrency holds for external workers and for pg_tide's SQL executors; its rate paces
//! starts (replaying many dead runs at once included); pause and resume; its retry budget makes
//! retries wait and opens an alert until it refills; limits belong to their role. Bad input is
//! refused with SQLSTATE, the value and a hint, and writes nothing. A bulk enqueue has the
//! workers analyze `tide.pending` at once, so kept plans are not made from an empty table.

use std::time::{Duration, Instant};

use pg_tide_pg_test::{
    blocks_read, claim, complete, exec, one, refused, run_tests, wait_for, Client, Cluster, Failed,
    TestFn,
};

fn running(c: &mut Client, queue: &str) -> Result<i64, Failed> {
    one(
        c,
        &format!("SELECT count(*) FROM tide.run WHERE queue = '{queue}' AND state = 'running'"),
    )
}

fn max_concurrency_holds_for_external_workers(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("q_conc")?;
    exec(
        &mut c,
        "SELECT tide.schedule('call_api', NULL, topics => ARRAY['unused'], queue => 'api');
         SELECT count(*) FROM tide.enqueue('call_api', (SELECT jsonb_agg(jsonb_build_object('i', g)) FROM generate_series(1, 10) g));",
    )?;
    let name: String = one(
        &mut c,
        "SELECT tide.create_queue('api', max_concurrency => 2)",
    )?;
    assert_eq!(name, "api");
    // Two workers asking for many get two runs between them.
    let first = claim(&mut c, "api", 10, "")?;
    let mut other = cluster.connect("q_conc")?;
    let second = claim(&mut other, "api", 10, "")?;
    assert_eq!((first.len(), second.len()), (2, 0), "at most 2 running");
    // A run that ends frees its slot at once (its end wakes the next).
    complete(&mut c, &first[..1])?;
    let third = claim(&mut other, "api", 10, "")?;
    assert_eq!(third.len(), 1, "one slot freed, one run");
    assert_eq!(running(&mut c, "api")?, 2);
    // Work everything off, two at a time at most.
    let mut held = vec![first[1], third[0]];
    let mut done = 1;
    while done < 10 {
        complete(&mut c, &held[..1])?;
        held.remove(0);
        done += 1;
        held.extend(claim(&mut other, "api", 10, "")?);
        assert!(running(&mut c, "api")? <= 2);
    }
    assert!(held.is_empty());

    // Two claims at once: the first one's slots are taken (locked until it commits), so the
    // second one finds none free and does not wait: never more than the limit.
    exec(
        &mut c,
        "SELECT count(*) FROM tide.enqueue('call_api', (SELECT jsonb_agg(jsonb_build_object('i', g)) FROM generate_series(1, 6) g));",
    )?;
    exec(&mut c, "BEGIN")?;
    // (n => 2: a claim locks the candidates it looks at; the second claim must find others.)
    let first_claim = claim(&mut c, "api", 2, "")?;
    assert_eq!(first_claim.len(), 2);
    let raced = claim(&mut other, "api", 10, "")?;
    assert_eq!(
        raced.len(),
        0,
        "the second claim finds no free slot while the first is open"
    );
    exec(&mut c, "COMMIT")?;
    assert_eq!(running(&mut c, "api")?, 2);
    complete(&mut c, &first_claim)?;
    let rest = claim(&mut other, "api", 10, "")?;
    assert_eq!(rest.len(), 2, "the slots freed, the parked runs go");
    complete(&mut c, &rest)?;
    // Work off the rest (each end wakes the next).
    loop {
        let got = claim(&mut other, "api", 10, "")?;
        if got.is_empty() {
            break;
        }
        assert!(got.len() <= 2);
        complete(&mut c, &got)?;
    }
    let left: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.pending WHERE queue = 'api'",
    )?;
    assert_eq!(left, 0, "every run of the queue went");

    // A higher limit lets more go at once; dropping the queue removes the limit.
    exec(
        &mut c,
        "SELECT count(*) FROM tide.enqueue('call_api', (SELECT jsonb_agg(jsonb_build_object('i', g)) FROM generate_series(1, 10) g));",
    )?;
    assert_eq!(claim(&mut c, "api", 10, "")?.len(), 2);
    exec(
        &mut c,
        "SELECT tide.create_queue('api', max_concurrency => 5)",
    )?;
    assert_eq!(claim(&mut c, "api", 10, "")?.len(), 3);
    let dropped: bool = one(&mut c, "SELECT tide.drop_queue('api')")?;
    let again: bool = one(&mut c, "SELECT tide.drop_queue('api')")?;
    assert!(dropped && !again);
    assert_eq!(claim(&mut c, "api", 10, "")?.len(), 5, "no limit any more");

    // Pause and resume a whole queue (declaring it if it had no limits).
    exec(
        &mut c,
        "SELECT count(*) FROM tide.enqueue('call_api', '[{}, {}, {}]')",
    )?;
    let paused: bool = one(&mut c, "SELECT tide.pause_queue('api')")?;
    let paused_again: bool = one(&mut c, "SELECT tide.pause_queue('api')")?;
    assert!(paused && !paused_again);
    assert_eq!(
        claim(&mut c, "api", 10, "")?.len(),
        0,
        "a paused queue starts nothing"
    );
    let resumed: bool = one(&mut c, "SELECT tide.resume_queue('api')")?;
    assert!(resumed);
    assert_eq!(
        claim(&mut c, "api", 10, "")?.len(),
        3,
        "resumed: all three go"
    );

    // Limits belong to their role: bob's runs in a queue named 'api' are not held by the
    // superuser's queue of that name, and bob's queue holds only bob's.
    exec(
        &mut c,
        "DROP ROLE IF EXISTS q_bob; CREATE ROLE q_bob LOGIN;
         SELECT tide.create_queue('api', max_concurrency => 1);",
    )?;
    let mut bob = cluster.connect_as("q_conc", "q_bob")?;
    exec(
        &mut bob,
        "SELECT tide.schedule('bobs', NULL, topics => ARRAY['unused'], queue => 'api');
         SELECT count(*) FROM tide.enqueue('bobs', '[{}, {}, {}]');",
    )?;
    assert_eq!(
        claim(&mut bob, "api", 10, "")?.len(),
        3,
        "another role's queue does not hold bob"
    );
    exec(
        &mut bob,
        "SELECT tide.create_queue('api', max_concurrency => 1);
         SELECT count(*) FROM tide.enqueue('bobs', '[{}, {}, {}]');",
    )?;
    assert_eq!(
        claim(&mut bob, "api", 10, "")?.len(),
        0,
        "bob's own queue is at its limit already"
    );
    let seen: String = one(
        &mut bob,
        "SELECT string_agg(owner || '/' || name, ',') FROM tide.queue",
    )?;
    assert_eq!(seen, "q_bob/api", "a role sees its own queues only");

    // A candidate the queue admits but its serial group holds back (an event of a key whose
    // earlier event is running) gives its room back at once: the next run, of another key,
    // takes it in the same claim.
    exec(
        &mut c,
        "SELECT tide.create_queue('keyed', max_concurrency => 2);
         SELECT tide.schedule('keyed_api', NULL, topics => ARRAY['keyed.ev'], queue => 'keyed');
         SELECT tide.emit('keyed.ev', event_key => 'x');
         SELECT tide.emit('keyed.ev', event_key => 'x');
         SELECT tide.emit('keyed.ev', event_key => 'y');",
    )?;
    let holder = claim(&mut c, "keyed", 1, "")?;
    assert_eq!(holder.len(), 1);
    let next = claim(&mut c, "keyed", 1, "")?;
    assert_eq!(
        next.len(),
        1,
        "the second run of key x waits; the run of key y goes"
    );
    let key: String = one(
        &mut c,
        &format!(
            "SELECT event_key FROM tide.run WHERE run_id = {}",
            next[0].0
        ),
    )?;
    assert_eq!(key, "y");
    let held: i64 = one(&mut c, "SELECT tide._queue_running(current_user, 'keyed')")?;
    assert_eq!(held, 2, "the queue counts two: the two running runs");
    Ok(())
}

fn sql_executors_honour_queues(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "CREATE TABLE IF NOT EXISTS q_slow_spans (n integer PRIMARY KEY, started timestamptz, ended timestamptz);
         SELECT tide.create_queue('q_slow', max_concurrency => 1);
         SELECT tide.schedule('q_slow_work', NULL, topics => ARRAY['unused'], queue => 'q_slow',
                              command => $$INSERT INTO q_slow_spans
                                          SELECT s.n, s.started, clock_timestamp()
                                            FROM (SELECT (tide.args()->>'n')::int AS n, clock_timestamp() AS started,
                                                         pg_sleep(0.2) AS slept) s$$);",
    )?;
    exec(
        &mut c,
        "SELECT count(*) FROM tide.enqueue('q_slow_work',
             (SELECT jsonb_agg(jsonb_build_object('n', g)) FROM generate_series(1, 6) g));",
    )?;
    wait_for(
        "six runs of a queue with max_concurrency 1",
        Duration::from_secs(60),
        || {
            let done: i64 = c
                .query_one(
                    "SELECT count(*) FROM q_slow_spans WHERE ended IS NOT NULL",
                    &[],
                )
                .map_err(|e| pg_tide_pg_test::describe(&e))?
                .get(0);
            Ok((done == 6).then_some(()))
        },
    )?;
    // The executors took them one at a time: no two spans overlap.
    let overlaps: i64 = one(
        &mut c,
        "SELECT count(*) FROM q_slow_spans a JOIN q_slow_spans b ON a.n < b.n
          WHERE a.started < b.ended AND b.started < a.ended",
    )?;
    if overlaps > 0 {
        // What each run went through, to tell how two came to run at once.
        let story: String = one(
            &mut c,
            "SELECT string_agg(format('n=%s run %s: %s attempts %s, %s claimed %s by pid %s, started %s, finished %s; events %s',
                                      r.args->>'n', r.run_id, r.state, r.attempts, r.lease_owner, r.claimed_at,
                                      r.executor_pid, s.started, r.finished_at,
                                      (SELECT string_agg(e::text, ' ') FROM tide.run_event e WHERE e.run_id = r.run_id)),
                              E'\n' ORDER BY s.started)
               FROM tide.run r JOIN tide.task t USING (task_id)
               LEFT JOIN q_slow_spans s ON s.n = (r.args->>'n')::int
              WHERE t.name = 'q_slow_work'",
        )?;
        return Err(format!(
            "SQL runs of a max_concurrency 1 queue overlapped ({overlaps}):\n{story}"
        )
        .into());
    }
    exec(
        &mut c,
        "SELECT tide.unschedule('q_slow_work'); SELECT tide.drop_queue('q_slow')",
    )?;
    Ok(())
}

/// A queue's rate paces starts, and replaying many dead runs at once goes at that pace: with
/// rate r (a bucket of max(1, r) tokens, full at first), the k-th start (from 0) comes at least
/// (k - r + 1) / r seconds after the first.
fn rate_paces_starts_and_replays(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("q_rate")?;
    exec(
        &mut c,
        "SELECT tide.schedule('push', NULL, topics => ARRAY['unused'], queue => 'partner', max_attempts => 1);
         SELECT count(*) FROM tide.enqueue('push', (SELECT jsonb_agg(jsonb_build_object('i', g)) FROM generate_series(1, 12) g));
         SELECT count(tide.fail_run(run_id, lease_token, 'partner down')) FROM tide.claim_runs('partner', 'w', 100);",
    )?;
    let dead: i64 = one(&mut c, "SELECT count(*) FROM tide.dead_letter")?;
    assert_eq!(dead, 12);
    exec(
        &mut c,
        "SELECT tide.create_queue('partner', rate => 4);
         SELECT count(tide.replay_run(run_id)) FROM tide.dead_letter;",
    )?;
    // Workers ask as fast as they can; the tick (driven here: nothing else moves time in this
    // database) lets parked runs look again when their token is due.
    let mut started = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while started < 12 {
        assert!(
            Instant::now() < deadline,
            "12 replays did not start within 30 s"
        );
        let got = claim(&mut c, "partner", 100, "")?;
        started += got.len();
        complete(&mut c, &got)?;
        exec(&mut c, "SELECT tide.tick()")?;
    }
    let late: String = one(
        &mut c,
        "SELECT coalesce(string_agg(k || ':' || round(extract(epoch FROM at - first)::numeric, 3), ' '), '')
           FROM (SELECT claimed_at AS at, min(claimed_at) OVER () AS first,
                        row_number() OVER (ORDER BY claimed_at) - 1 AS k
                   FROM tide.run WHERE trigger = 'replay') s
          WHERE k >= 4 AND at - first < make_interval(secs => (k - 4 + 1) / 4.0 - 0.01)",
    )?;
    assert_eq!(
        late, "",
        "starts that came faster than the rate allows (k:seconds)"
    );
    Ok(())
}

/// The retry budget: more transient failures than the budget in its window make the next
/// retries wait for it to refill, open an alert on the queue, and the alert resolves once it has
/// refilled.
fn retry_budget_holds_back_a_retry_storm(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("q_budget")?;
    exec(
        &mut c,
        "SELECT tide.schedule('bank_sync', NULL, topics => ARRAY['unused'], queue => 'bank', max_attempts => 10,
                              backoff_base => '1 second', backoff_cap => '1 second', jitter => 'none');
         SELECT tide.create_queue('bank', retry_budget => 3, retry_window => '1 minute');
         SELECT count(*) FROM tide.enqueue('bank_sync', (SELECT jsonb_agg(jsonb_build_object('i', g)) FROM generate_series(1, 5) g));
         SELECT count(tide.fail_run(run_id, lease_token, 'bank timeout')) FROM (
             SELECT * FROM tide.claim_runs('bank', 'w', 100) ORDER BY run_id) c;",
    )?;
    // Three retries within the budget wait their backoff (1 s); the 4th and 5th wait for the
    // budget: 1 minute / 3 = 20 s per failure beyond it, so 20 s and 40 s.
    let waits: String = one(
        &mut c,
        "SELECT string_agg(round(extract(epoch FROM run_after - updated_at))::text, ',' ORDER BY run_id) FROM tide.run",
    )?;
    assert_eq!(waits, "1,1,1,20,40");
    let reason: String = one(
        &mut c,
        "SELECT reason FROM tide.run ORDER BY run_id DESC LIMIT 1",
    )?;
    assert!(
        reason.contains("the retry budget of queue bank is spent"),
        "{reason}"
    );
    exec(&mut c, "SELECT tide.tick()")?;
    let alert: String = one(
        &mut c,
        "SELECT string_agg(concat_ws('|', subject_type, subject, kind, severity, details->>'retry_budget'), ' '
                           ORDER BY subject_type, kind::text)
           FROM tide.alert WHERE resolved_at IS NULL",
    )?;
    // The queue's budget is spent; and the enqueued runs' failures in a row are an alert of
    // their task too.
    assert_eq!(
        alert,
        "queue|bank|retry_budget|warning|3 task|bank_sync|consecutive_failures|warning"
    );
    // Two minutes later the budget has refilled: the alert resolves.
    exec(&mut c, "SELECT tide.tick(now() + interval '2 minutes')")?;
    let open: i64 = one(
        &mut c,
        "SELECT count(*) FROM tide.alert WHERE resolved_at IS NULL AND kind = 'retry_budget'",
    )?;
    assert_eq!(open, 0);
    Ok(())
}

fn bad_queue_input_is_refused(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("q_bad")?;
    for (sql, code, needle) in [
        ("SELECT tide.create_queue(NULL)", "22004", "name"),
        (
            "SELECT tide.create_queue('has space')",
            "22023",
            "'has space'",
        ),
        (
            "SELECT tide.create_queue('q', max_concurrency => 0)",
            "22023",
            "got 0",
        ),
        (
            "SELECT tide.create_queue('q', rate => -1)",
            "22023",
            "got -1",
        ),
        (
            "SELECT tide.create_queue('q', rate => 'NaN')",
            "22023",
            "NaN",
        ),
        (
            "SELECT tide.create_queue('q', retry_budget => 0)",
            "22023",
            "got 0",
        ),
        (
            "SELECT tide.create_queue('q', retry_budget => 5, retry_window => '1 second')",
            "22023",
            "00:00:01",
        ),
        ("SELECT tide.pause_queue(repeat('x', 64))", "22023", "xxxx"),
        ("SELECT tide.drop_queue('')", "22023", "''"),
        ("SELECT tide.resume_queue(NULL)", "22004", "name"),
        (
            "SELECT tide.schedule('t', '@daily', backoff_base => '1 ms')",
            "22023",
            "100 milliseconds",
        ),
        (
            "SELECT tide.schedule('t', '@daily', lease => '10 ms')",
            "22023",
            "1 second",
        ),
    ] {
        let (got, message, hint) = refused(&mut c, sql)?;
        assert_eq!(got, code, "{sql}: {message}");
        assert!(message.contains(needle), "{sql}: {message}");
        assert!(!hint.is_empty(), "{sql}");
    }
    let written: i64 = one(
        &mut c,
        "SELECT (SELECT count(*) FROM tide.queue) + (SELECT count(*) FROM tide.task)",
    )?;
    assert_eq!(written, 0, "refused calls write nothing");
    Ok(())
}

/// A role that holds its own rate-limited queue's row in an open transaction, with runs of the
/// highest priority in that queue, does not stop pg_tide's executors from running everyone
/// else's work.
fn a_held_queue_row_stalls_no_one_else(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "DROP ROLE IF EXISTS q_mallory; CREATE ROLE q_mallory LOGIN;
         CREATE TABLE IF NOT EXISTS q_others_done (n integer PRIMARY KEY);
         SELECT tide.schedule('q_others', NULL, topics => ARRAY['unused'],
                              command => 'INSERT INTO q_others_done VALUES ((tide.args()->>''n'')::int)');",
    )?;
    let mut mallory = cluster.connect_as(pg_tide_pg_test::WORKERS_DB, "q_mallory")?;
    exec(
        &mut mallory,
        "SELECT tide.schedule('m_first', NULL, topics => ARRAY['unused'], queue => 'm_paced',
                              priority => 1000, command => 'SELECT 1');
         SELECT tide.create_queue('m_paced', rate => 1);",
    )?;
    exec(
        &mut mallory,
        "BEGIN; SELECT tide.create_queue('m_paced', rate => 2);",
    )?;
    // From a second session, her runs (of the highest priority) are ready while her first
    // session holds the queue's row.
    let mut mallory_too = cluster.connect_as(pg_tide_pg_test::WORKERS_DB, "q_mallory")?;
    exec(
        &mut mallory_too,
        "SELECT count(*) FROM tide.enqueue('m_first', '[{}, {}, {}, {}, {}, {}, {}, {}, {}, {}]')",
    )?;
    exec(
        &mut c,
        "SELECT count(*) FROM tide.enqueue('q_others', (SELECT jsonb_agg(jsonb_build_object('n', g)) FROM generate_series(1, 5) g));",
    )?;
    wait_for(
        "everyone else's runs while mallory holds her queue",
        Duration::from_secs(30),
        || {
            let done: i64 = c
                .query_one("SELECT count(*) FROM q_others_done", &[])
                .map_err(|e| pg_tide_pg_test::describe(&e))?
                .get(0);
            Ok((done == 5).then_some(()))
        },
    )?;
    exec(&mut mallory, "ROLLBACK")?;
    exec(&mut c, "SELECT tide.unschedule('q_others')")?;
    Ok(())
}

/// A fresh database with a queue limited to `limit` running and an event task `in_<queue>`
/// with `runs` one-off runs enqueued in it.
fn limited_queue(
    cluster: &Cluster,
    db: &str,
    queue: &str,
    limit: i32,
    runs: i32,
) -> Result<Client, Failed> {
    let mut c = cluster.fresh_db(db)?;
    exec(
        &mut c,
        &format!(
            "SELECT tide.schedule('in_{queue}', NULL, topics => ARRAY['unused'], queue => '{queue}');
             SELECT tide.create_queue('{queue}', max_concurrency => {limit});
             SELECT count(*) FROM tide.enqueue('in_{queue}', (SELECT jsonb_agg(jsonb_build_object('i', g)) FROM generate_series(1, {runs}) g));"
        ),
    )?;
    Ok(c)
}

/// A queue at its limit with many more ready runs than a claim looks at in its rounds: claims
/// return nothing (they used to fall out of their rounds holding parked candidates and fail on
/// a run without a lease token), and the run that ends lets the next one go.
fn a_full_queue_claims_nothing(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = limited_queue(cluster, "q_full", "single", 1, 60)?;
    let held = claim(&mut c, "single", 1, "")?;
    assert_eq!(held.len(), 1);
    let mut other = cluster.connect("q_full")?;
    for n in [1, 1, 3, 1, 2] {
        let got = claim(&mut other, "single", n, "")?;
        assert!(got.is_empty(), "the queue is full, claimed {got:?}");
    }
    assert_eq!(running(&mut c, "single")?, 1);
    complete(&mut c, &held)?;
    let next = claim(&mut other, "single", 5, "")?;
    assert_eq!(next.len(), 1, "the run that ended lets one more go");
    assert_eq!(running(&mut c, "single")?, 1);
    Ok(())
}

/// Leaves the second run of a `max_concurrency 1` queue (of two) parked although the queue has
/// room: another session's claim parks it (the queue is full) and commits only after the first
/// run ended, which therefore woke nothing. The run waits for its fallback, seconds away.
fn park_behind_an_ended_run(
    cluster: &Cluster,
    c: &mut Client,
    db: &str,
    queue: &str,
) -> Result<(), Failed> {
    let held = claim(c, queue, 1, "")?;
    assert_eq!(held.len(), 1);
    let mut parker = cluster.connect(db)?;
    exec(&mut parker, "BEGIN")?;
    assert!(claim(&mut parker, queue, 1, "")?.is_empty());
    let parked: bool = one(
        &mut parker,
        &format!(
            "SELECT bool_and(parked) FROM tide.pending WHERE queue = '{queue}' AND state = 'ready'"
        ),
    )?;
    assert!(parked, "the claim in progress parked the second run");
    complete(c, &held)?;
    exec(&mut parker, "COMMIT")?;
    let waits: bool = one(
        c,
        &format!(
            "SELECT bool_and(parked AND due_at > now() + interval '1 second')
               FROM tide.pending WHERE queue = '{queue}' AND state = 'ready'"
        ),
    )?;
    assert!(
        waits,
        "the end woke nothing: the run waits for its fallback"
    );
    assert_eq!(running(c, queue)?, 0);
    Ok(())
}

/// A run parked for room by a claim that commits after a run of its queue ended goes with the
/// next claim. The end looked for parked runs to wake before that parking was visible, so it woke
/// none; the run would have waited for its fallback (seconds). A claim that finds nothing wakes
/// the parked runs of its queues that have room.
fn a_run_parked_while_another_ended_goes_with_the_next_claim(
    cluster: &Cluster,
) -> Result<(), Failed> {
    let mut c = limited_queue(cluster, "q_race", "race", 1, 2)?;
    park_behind_an_ended_run(cluster, &mut c, "q_race", "race")?;
    // The next claim takes it at once.
    let next = claim(&mut c, "race", 1, "")?;
    assert_eq!(next.len(), 1, "the parked run goes with the next claim");
    assert_eq!(running(&mut c, "race")?, 1);
    complete(&mut c, &next)?;
    Ok(())
}

/// That wake-up keeps to the queues the claimer may take from: a role granted one queue of an
/// owner, claiming from another queue of that owner, gets nothing and wakes nothing there.
fn a_claim_wakes_parked_runs_only_in_its_own_queues(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = limited_queue(cluster, "q_race_grant", "race_b", 1, 2)?;
    exec(
        &mut c,
        "DROP ROLE IF EXISTS q_granted; CREATE ROLE q_granted LOGIN;
         SELECT tide.create_queue('race_a', max_concurrency => 1);
         SELECT tide.grant('claim', 'race_a', 'q_granted');",
    )?;
    park_behind_an_ended_run(cluster, &mut c, "q_race_grant", "race_b")?;
    let mut granted = cluster.connect_as("q_race_grant", "q_granted")?;
    assert!(claim(&mut granted, "race_b", 1, "")?.is_empty());
    let still: bool = one(
        &mut c,
        "SELECT bool_and(parked) FROM tide.pending WHERE queue = 'race_b' AND state = 'ready'",
    )?;
    assert!(
        still,
        "a queue not granted to the claimer: its parked run is left alone"
    );
    // Its owner's claim takes it.
    assert_eq!(claim(&mut c, "race_b", 1, "")?.len(), 1);
    Ok(())
}

/// A queue's running count (kept in shared memory) follows rollbacks, whole and to a savepoint,
/// is counted again after a crash (kill -9 sends the server through crash recovery, which
/// clears shared memory) and after new limits, and a transaction left open by one of the
/// queue's completions does not stall the claims that must count it again: they come back
/// empty and the queue goes on once it ends.
fn running_count_survives_rollback_and_crash(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = limited_queue(cluster, "q_count", "cq", 2, 12)?;
    // A claim rolled back gives its room back, and so does one rolled back to a savepoint.
    exec(&mut c, "BEGIN")?;
    assert_eq!(claim(&mut c, "cq", 5, "")?.len(), 2);
    exec(&mut c, "ROLLBACK")?;
    exec(&mut c, "BEGIN; SAVEPOINT s")?;
    assert_eq!(claim(&mut c, "cq", 5, "")?.len(), 2);
    exec(&mut c, "ROLLBACK TO SAVEPOINT s")?;
    let held = claim(&mut c, "cq", 5, "")?;
    assert_eq!(held.len(), 2, "the room of the rolled-back claim is back");
    exec(&mut c, "COMMIT")?;
    let mut other = cluster.connect("q_count")?;
    assert_eq!(
        claim(&mut other, "cq", 5, "")?.len(),
        0,
        "two running: full"
    );
    // A completion rolled back gives nothing back.
    exec(&mut c, "BEGIN")?;
    complete(&mut c, &held[..1])?;
    exec(&mut c, "ROLLBACK")?;
    assert_eq!(
        claim(&mut other, "cq", 5, "")?.len(),
        0,
        "still two running"
    );

    // A crash clears shared memory: the count is counted again from the runs.
    drop((c, other));
    cluster.kill_9("pg_tide executor")?;
    let mut c = cluster.connect("q_count")?;
    let mut other = cluster.connect("q_count")?;
    // (New runs: the earlier ones were parked by the claims that found the queue full.)
    exec(
        &mut c,
        "SELECT count(*) FROM tide.enqueue('in_cq', '[{}, {}, {}]')",
    )?;
    assert_eq!(
        claim(&mut other, "cq", 5, "")?.len(),
        0,
        "after the crash: still full"
    );
    complete(&mut c, &held[..1])?;
    let next = claim(&mut other, "cq", 5, "")?;
    assert_eq!(next.len(), 1, "one ended, one more goes");
    let counted: i64 = one(&mut c, "SELECT tide._queue_running(current_user, 'cq')")?;
    assert_eq!(counted, 2);

    // New limits make the count stale; a completion left open in a transaction holds the
    // queue's lock, so the claim that must count again comes back empty (it does not wait for
    // that transaction), and the queue goes on once the transaction ends.
    exec(&mut c, "BEGIN")?;
    complete(&mut c, &next)?;
    exec(
        &mut other,
        "SELECT tide.create_queue('cq', max_concurrency => 3)",
    )?;
    assert_eq!(
        claim(&mut other, "cq", 5, "")?.len(),
        0,
        "cannot count again now"
    );
    exec(&mut c, "COMMIT")?;
    // Limit 3 with one running: two more go (the runs parked meanwhile look again within
    // seconds: this database has no scheduler, the test ticks), and no more.
    wait_for(
        "the queue to go on after the open completion ended",
        Duration::from_secs(30),
        || {
            exec(&mut other, "SELECT tide.tick()").map_err(|e| format!("{e:?}"))?;
            claim(&mut other, "cq", 5, "").map_err(|e| format!("{e:?}"))?;
            let now = running(&mut c, "cq").map_err(|e| format!("{e:?}"))?;
            assert!(now <= 3, "{now} running with a limit of 3");
            Ok((now == 3).then_some(()))
        },
    )?;
    let counted: i64 = one(&mut c, "SELECT tide._queue_running(current_user, 'cq')")?;
    assert_eq!(counted, 3);
    Ok(())
}

/// A bulk enqueue after a quiet spell: the plans sessions keep for claims, probes and completions
/// were made while `tide.pending` was nearly empty, and scan it whole for every run until its
/// statistics change, which autovacuum does only at its next round (up to a minute). pg_tide's
/// workers analyze it themselves once it holds far more runs than the catalog says: an ANALYZE
/// that is not autovacuum's comes, and the catalog then counts the backlog.
fn a_bulk_enqueue_refreshes_pending_statistics(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(&mut c, "VACUUM tide.pending")?;
    let known: f32 = one(
        &mut c,
        "SELECT reltuples FROM pg_class WHERE oid = 'tide.pending'::regclass",
    )?;
    let analyzed: i64 = one(
        &mut c,
        "SELECT pg_stat_get_analyze_count('tide.pending'::regclass)",
    )?;
    // Past the threshold: four times what the catalog counts, and 1,000 more.
    let n = (4.0 * known.max(0.0)) as i64 + 2000;
    exec(
        &mut c,
        &format!(
            "SELECT tide.schedule('bulk_stats', NULL, topics => ARRAY['unused'], queue => 'bulk_stats');
             SELECT count(*) FROM tide.enqueue('bulk_stats',
                 (SELECT jsonb_agg(jsonb_build_object('i', g)) FROM generate_series(1, {n}) g));"
        ),
    )?;
    let counted = wait_for(
        "an ANALYZE of tide.pending by pg_tide's workers",
        Duration::from_secs(60),
        || {
            let row = c
                .query_one(
                    "SELECT pg_stat_get_analyze_count('tide.pending'::regclass),
                            (SELECT reltuples FROM pg_class WHERE oid = 'tide.pending'::regclass)",
                    &[],
                )
                .map_err(|e| pg_tide_pg_test::describe(&e))?;
            let (count, tuples): (i64, f32) = (row.get(0), row.get(1));
            Ok((count > analyzed).then_some(tuples))
        },
    )?;
    assert!(
        f64::from(counted) >= n as f64 * 0.9,
        "after the ANALYZE the catalog counts the backlog of {n} runs (it says {counted})"
    );
    exec(&mut c, "SELECT tide.unschedule('bulk_stats')")?;
    Ok(())
}

/// The executors' readiness probe, asked at each round of work (before an idle executor's
/// pickup), reads the waiting runs and their own rule versions, not every task's: joined, the
/// planner could merge the few waiting runs with all the rule versions (10,000 tasks and a
/// backlog of 50,000 runs elsewhere: 11-20 ms per probe, every pickup 8 ms instead of 2).
fn readiness_probe_reads_only_waiting_runs(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("q_probe")?;
    exec(
        &mut c,
        // The busy task first: the merge was estimated cheap when the runs' task ids sorted
        // before most of the rule versions.
        "SELECT tide.schedule('firehose', NULL, topics => ARRAY['firehose'], queue => 'firehose');
         SELECT tide.emit_many('firehose', (SELECT array_agg(jsonb_build_object('i', g)) FROM generate_series(1, 50000) g));
         SELECT count(tide.schedule('many_' || g, '0 0 1 1 *')) FROM generate_series(1, 10000) g;
         ANALYZE tide.task_version; ANALYZE tide.task; ANALYZE tide.run; ANALYZE tide.pending;",
    )?;
    let read = blocks_read(
        &mut c,
        "tide.task_version",
        "SELECT count(*) FROM tide._claim_check()",
    )?;
    assert!(
        read < 10,
        "with no run waiting, the readiness probe read {read} blocks of the 10,000 tasks' rule versions"
    );
    Ok(())
}

fn main() {
    let tests: &[(&str, TestFn)] = &[
        (
            "max_concurrency_holds_for_external_workers",
            max_concurrency_holds_for_external_workers,
        ),
        (
            "workers_sql_executors_honour_queues",
            sql_executors_honour_queues,
        ),
        (
            "rate_paces_starts_and_replays",
            rate_paces_starts_and_replays,
        ),
        (
            "retry_budget_holds_back_a_retry_storm",
            retry_budget_holds_back_a_retry_storm,
        ),
        ("bad_queue_input_is_refused", bad_queue_input_is_refused),
        ("a_full_queue_claims_nothing", a_full_queue_claims_nothing),
        (
            "a_run_parked_while_another_ended_goes_with_the_next_claim",
            a_run_parked_while_another_ended_goes_with_the_next_claim,
        ),
        (
            "a_claim_wakes_parked_runs_only_in_its_own_queues",
            a_claim_wakes_parked_runs_only_in_its_own_queues,
        ),
        (
            "running_count_survives_rollback_and_crash",
            running_count_survives_rollback_and_crash,
        ),
        (
            "workers_a_held_queue_row_stalls_no_one_else",
            a_held_queue_row_stalls_no_one_else,
        ),
        (
            "workers_a_bulk_enqueue_refreshes_pending_statistics",
            a_bulk_enqueue_refreshes_pending_statistics,
        ),
        (
            "readiness_probe_reads_only_waiting_runs",
            readiness_probe_reads_only_waiting_runs,
        ),
    ];
    run_tests("queues", tests)
}

-- Claiming runs: the claim itself (tide._claim, for external workers through tide.claim_runs
-- and for pg_tide's executors), an executor's next claim committed with the end of its run,
-- and the lease a worker keeps with tide.heartbeat_run. Candidates are fixed first, then queue
-- limits (src/queues/queues.sql), then serial groups, overlap and locks (src/locks/locks.sql).
--
-- As in every file of runs/: each state change is an UPDATE of tide.run, checked and recorded by
-- tide._run_changed. The public functions run as the extension's owner
-- (src/security/caller.rs): each acts only on runs the caller may act on (tide._may_act: its
-- own, a role it is a member of, or any for a superuser), and reports another role's run exactly
-- as a run that does not exist.

CREATE FUNCTION tide._claim(p_executor tide.executor, p_queue text, p_worker text, p_n integer, p_lease interval,
                            p_online_only boolean DEFAULT false, p_after bigint DEFAULT NULL)
RETURNS TABLE (run_id bigint, lease_token bigint, lease_expires_at timestamptz, task text, args jsonb,
               window_start timestamptz, window_end timestamptz, biz_date date, attempt integer,
               version integer, checkpoint jsonb, trigger tide.run_trigger, dedupe_key text,
               priority integer, owner name, timeout interval, topic text, event_key text, payload jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT: with a backlog the generic plan's cost estimate passes jit_above_cost, and
-- compiling it cost ten times the claim itself (13.7 ms against 1.2 ms with 484,000 ready
-- runs). Nothing here scans enough to gain from it.
SET jit = off
-- Generic plans always: re-planning the claim statements for each call cost more than running
-- them (measured: batch 1 went from 43% to 62% of the baseline).
SET plan_cache_mode = force_generic_plan
-- A kept plan made while tide.pending was vacuumed empty scanned and sorted the whole table at
-- every claim once a backlog arrived (an SQL executor's pickup went from 2 ms to 600 ms with
-- 160,000 runs of an external queue waiting, until autovacuum analyzed the table; 18 ms with
-- this setting). The claim indexes serve every candidate query in order; a sequential scan
-- never does much better than them, on a table that can grow at any moment.
SET enable_seqscan = off
-- Candidates are taken with SKIP LOCKED; this bounds any other wait (on a row a role's open
-- transaction holds), so that one role's lock never stalls everyone's claims.
SET lock_timeout = '1s'
AS $$
DECLARE
    ids bigint[];
    owners name[];
    queues text[];
    gated boolean;
    candidates bigint[];
    -- The admitted runs whose queues counted them (tide._queue_admit).
    counted_ids bigint[] := '{}';
    token bigint;
    ignored text;
    why text;
    -- A role claims the runs of the roles it acts for (its own, its teams'), and of the queues
    -- granted to it (tide.grant('claim', ...)); a superuser, tide_admin (and pg_tide's
    -- executors) any role's.
    owners_ok name[] := tide._acts_for();
    g_owners name[];
    g_queues text[];
    is_sql boolean := p_executor = 'sql';
    -- Whether a queue this claim may take from has limits (tide.queue): then its candidates
    -- go through tide._queue_admit.
    limited boolean;
    -- Whether this claim woke runs parked for room already (tide._wake_parked).
    rechecked boolean := false;
    n_claimed bigint;
    -- The roles whose runs this claim looks at, in turn, and one role's candidates.
    turn name[];
    who name;
    w_ids bigint[];
    w_owners name[];
    w_queues text[];
    w_gated boolean;
BEGIN
    IF p_queue IS NULL AND p_executor = 'external' THEN
        RAISE EXCEPTION 'queue must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'pass the queue your tasks use, such as ''default''';
    END IF;
    IF p_queue IS NOT NULL THEN
        PERFORM tide._text_arg('queue', p_queue, 63, 'pass the queue your tasks use, such as ''default''');
    END IF;
    IF p_worker IS NOT NULL THEN
        PERFORM tide._text_arg('worker', p_worker, 200, 'name the worker, such as its host and pid');
    END IF;
    why := 'claimed by ' || coalesce(p_worker, 'a worker')
           || CASE WHEN p_after IS NOT NULL THEN ', committed with the end of run ' || p_after ELSE '' END;
    IF p_n IS NULL OR p_n < 1 OR p_n > 1000 THEN
        RAISE EXCEPTION 'n must be between 1 and 1000, got %', coalesce(p_n::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'claim at most 1000 runs at a time; batches of 10 to 100 work well';
    END IF;
    PERFORM tide._bounded('lease', p_lease, false);
    IF NOT is_sql THEN
        -- Noted whatever it finds: a late run of this queue then is not for want of workers.
        PERFORM tide._queue_claimed(p_queue);
    END IF;
    IF owners_ok IS NOT NULL THEN
        SELECT array_agg(g.owner), array_agg(g.object) INTO g_owners, g_queues FROM tide._granted('claim') g;
    END IF;
    limited := EXISTS (SELECT 1 FROM tide.queue q
                        WHERE (p_queue IS NULL OR q.name = p_queue)
                          AND (owners_ok IS NULL OR q.owner = ANY (owners_ok) OR q.owner = ANY (g_owners)));
    -- An executor's claim committed with the end of its previous run (p_after) is made before
    -- that run's queue room is given back (at the commit): when that run's own queue has limits,
    -- the run it would take could be parked for want of the very room being freed. The executor
    -- claims again after the commit instead. Other queues' limits do not matter here: their
    -- room is not waiting for this commit (their candidates are admitted as in any claim).
    IF p_after IS NOT NULL AND limited
       AND EXISTS (SELECT 1 FROM tide.run r JOIN tide.queue q ON q.owner = r.owner AND q.name = r.queue
                    WHERE r.run_id = p_after) THEN
        RETURN;
    END IF;
    -- The executors choose under a lock of their own, held until the claim commits, so that the
    -- next executor's choice counts this claim (src/security/share.rs).
    IF is_sql AND NOT tide._share_lock(p_after IS NULL) THEN
        RETURN;  -- (a claim made with the end of a run does not wait: see src/security/share.rs)
    END IF;
    -- The candidates are fixed in an array first: a LIMIT subquery under FOR UPDATE SKIP LOCKED
    -- may be re-evaluated and claim more rows than asked. Each candidate's run is locked with
    -- its line, and one whose run is locked is skipped: a change of a run in progress (run
    -- control, a rule change holding it, R12.3) holds the run and then writes its line, so a
    -- claim that held the line and waited for the run would deadlock with it. When every candidate has to wait (it
    -- is parked, out of the candidates, by tide._admit) the next ones are looked at, a few
    -- rounds at most: a claimer must not come back empty while other runs are claimable.
    FOR round IN 1..10 LOOP
        -- Whose runs, in turn (src/security/share.sql): priority orders a role's own runs only.
        -- An executor takes from the role that occupies the fewest executors, ties at random, up
        -- to each role's limit. An external claim that may take several roles' runs takes them
        -- from the roles in an order drawn at random at each claim.
        -- (Again after parked runs were woken: their owners may have had no other ready run.)
        IF turn IS NULL AND is_sql THEN
            turn := tide._executor_turn(owners_ok, g_owners);
        ELSIF turn IS NULL AND owners_ok IS NULL THEN
            -- Every role with ready runs in the queue: a loose scan of pending_claim_idx, one
            -- probe per role (ORDER BY ... LIMIT 1, not min(): min of a name is min of text,
            -- which no index serves, and read every ready run of the queue).
            WITH RECURSIVE o(owner) AS (
                (SELECT p.owner FROM tide.pending p
                  WHERE p.state = 'ready' AND NOT p.parked AND p.executor = p_executor AND p.queue = p_queue
                  ORDER BY p.owner LIMIT 1)
                UNION ALL
                SELECT (SELECT p.owner FROM tide.pending p
                         WHERE p.state = 'ready' AND NOT p.parked AND p.executor = p_executor AND p.queue = p_queue
                           AND p.owner > o.owner
                         ORDER BY p.owner LIMIT 1)
                  FROM o WHERE o.owner IS NOT NULL
            )
            SELECT coalesce(array_agg(o.owner ORDER BY random()), '{}') INTO turn FROM o WHERE o.owner IS NOT NULL;
        ELSIF turn IS NULL THEN
            SELECT coalesce(array_agg(DISTINCT u.o), '{}') INTO turn
              FROM unnest(owners_ok || coalesce(ARRAY(SELECT g.o FROM unnest(g_owners, g_queues) g(o, q) WHERE g.q = p_queue), '{}')) u(o);
            IF cardinality(turn) > 1 THEN
                turn := ARRAY(SELECT u.o FROM unnest(turn) u(o) ORDER BY random());
            END IF;
        END IF;
        ids := '{}';
        owners := '{}';
        queues := '{}';
        gated := false;
        FOREACH who IN ARRAY turn LOOP
            EXIT WHEN cardinality(ids) >= p_n;
            IF p_queue IS NULL THEN
                SELECT array_agg(c.run_id), array_agg(c.owner), array_agg(c.queue), bool_or(c.gated)
                  INTO w_ids, w_owners, w_queues, w_gated FROM (
                    SELECT p.run_id, p.owner, p.queue, p.gated FROM tide.pending p JOIN tide.run r ON r.run_id = p.run_id
                     -- Without a queue, the claimer is an SQL executor (external workers must name
                     -- one, above): written out, so that the plan kept for any executor uses the
                     -- index of SQL runs, pending_claim_any_idx.
                     WHERE p.state = 'ready' AND NOT p.parked AND p.executor = 'sql' AND p.owner = who
                       AND (p.due_at IS NULL OR p.due_at <= statement_timestamp())
                       AND (owners_ok IS NULL OR p.owner = ANY (owners_ok)
                            OR (g_owners IS NOT NULL AND (p.owner, p.queue) IN (SELECT u.o, u.q FROM unnest(g_owners, g_queues) u(o, q))))
                       -- Backfill runs claim at priority - 10000, after every online run; one
                       -- executor keeps to online runs.
                       AND (NOT p_online_only OR p.priority > -5000)
                     ORDER BY p.priority DESC, p.run_id
                     LIMIT p_n - cardinality(ids) FOR UPDATE OF p, r SKIP LOCKED) c;
            ELSE
                SELECT array_agg(c.run_id), array_agg(c.owner), array_agg(c.queue), bool_or(c.gated)
                  INTO w_ids, w_owners, w_queues, w_gated FROM (
                    SELECT p.run_id, p.owner, p.queue, p.gated FROM tide.pending p JOIN tide.run r ON r.run_id = p.run_id
                     WHERE p.state = 'ready' AND NOT p.parked AND p.executor = p_executor AND p.queue = p_queue
                       AND p.owner = who
                       AND (p.due_at IS NULL OR p.due_at <= statement_timestamp())
                       AND (owners_ok IS NULL OR p.owner = ANY (owners_ok)
                            OR (g_owners IS NOT NULL AND (p.owner, p.queue) IN (SELECT u.o, u.q FROM unnest(g_owners, g_queues) u(o, q))))
                     ORDER BY p.priority DESC, p.run_id
                     LIMIT p_n - cardinality(ids) FOR UPDATE OF p, r SKIP LOCKED) c;
            END IF;
            IF w_ids IS NOT NULL THEN
                ids := ids || w_ids;
                owners := owners || w_owners;
                queues := queues || w_queues;
                gated := gated OR w_gated;
            END IF;
        END LOOP;
        IF cardinality(ids) = 0 THEN
            ids := NULL;
        END IF;
        IF ids IS NULL THEN
            -- Nothing claimable: runs parked for room in a queue that has room now missed their
            -- wake-up (tide._wake_parked); they are woken and looked at once more.
            IF limited AND NOT rechecked AND tide._wake_parked(p_executor, p_queue, owners_ok, g_owners, g_queues) > 0 THEN
                rechecked := true;
                turn := NULL;
                CONTINUE;
            END IF;
            RETURN;
        END IF;
        IF NOT limited THEN
            -- Looked at again with the candidates: under READ COMMITTED the test above read an
            -- older snapshot than the candidates' statement, and a transaction that made (or
            -- paused) a queue and a run in it may have committed between the two.
            limited := EXISTS (SELECT 1 FROM tide.queue q
                                 JOIN unnest(owners, queues) AS c(owner, queue) ON q.owner = c.owner AND q.name = c.queue);
        END IF;
        IF limited THEN
            -- Queue limits first (paused, max_concurrency, rate): the candidates they hold back
            -- are parked, and the next ones are looked at.
            SELECT a.admitted, a.counted INTO candidates, counted_ids FROM tide._queue_admit(ids, owners, queues) a;
            IF cardinality(candidates) = 0 THEN
                -- All parked: nothing of this round is claimed (if it was the last round, the
                -- claim returns nothing).
                ids := '{}';
                CONTINUE;
            END IF;
            IF cardinality(candidates) < cardinality(ids) THEN
                ids := candidates;
                SELECT array_agg(p.owner ORDER BY u.n), bool_or(p.gated) INTO owners, gated
                  FROM unnest(ids) WITH ORDINALITY AS u(id, n) JOIN tide.pending p ON p.run_id = u.id;
            END IF;
        END IF;
        -- One fencing token per claim: larger than any earlier claim's, so a run claimed again is
        -- never completed with an older one.
        token := coalesce(token, nextval('tide.lease_token_seq'));
        EXIT WHEN NOT gated;
        -- Serial groups, overlap, concurrency and locks decide which may go (src/locks/locks.sql).
        candidates := ids;
        ids := tide._admit(candidates, token, p_executor, p_lease);
        IF cardinality(counted_ids) > 0 AND cardinality(ids) < cardinality(candidates) THEN
            -- The room reserved for the candidates that must wait after all goes back at once.
            PERFORM tide._queue_unreserve(g.owner, g.queue, g.n::integer)
               FROM (SELECT p.owner, p.queue, count(*) AS n FROM tide.pending p
                      WHERE p.run_id = ANY (counted_ids) AND p.run_id <> ALL (ids)
                      GROUP BY p.owner, p.queue) g;
            counted_ids := ARRAY(SELECT c FROM unnest(counted_ids) c WHERE c = ANY (ids));
        END IF;
        IF ids = candidates THEN
            EXIT;  -- all admitted, in the same order: the owners are the candidates'
        END IF;
        IF cardinality(ids) > 0 THEN
            SELECT array_agg(p.owner ORDER BY u.n) INTO owners
              FROM unnest(ids) WITH ORDINALITY AS u(id, n) JOIN tide.pending p ON p.run_id = u.id;
            EXIT;
        END IF;
        -- A candidate another claim is deciding about right now stays a candidate: looking again
        -- would only find it again.
        EXIT WHEN EXISTS (SELECT 1 FROM tide.pending p
                           WHERE p.run_id = ANY (candidates) AND p.state = 'ready' AND NOT p.parked);
    END LOOP;
    IF cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    UPDATE tide.pending p SET state = 'running', due_at = NULL, counted = p.run_id = ANY (counted_ids)
     WHERE p.run_id = ANY (ids);
    -- This path writes its own history rows below, one statement for the batch.
    ignored := set_config('tide.history', 'written', true);
    RETURN QUERY
        UPDATE tide.run r
           SET state = 'running',
               attempts = r.attempts + 1,
               tries = r.tries + 1,
               lease_owner = p_worker,
               lease_token = token,
               lease_length = l.length,
               lease_expires_at = statement_timestamp() + l.length,
               executor_pid = CASE WHEN is_sql THEN pg_backend_pid() END,
               executor_start = CASE WHEN is_sql THEN tide._backend_start() END,
               started_at = coalesce(r.started_at, statement_timestamp()),
               claimed_at = statement_timestamp(),
               run_after = NULL,
               finished_at = NULL,
               updated_at = statement_timestamp(),
               reason = why
          FROM tide.task_version v
          JOIN tide.task t ON t.task_id = v.task_id,
               LATERAL (SELECT tide._lease_length(p_executor, v.rules, p_lease) AS length) l
         WHERE r.run_id = ANY (ids) AND v.task_id = r.task_id AND v.version = r.version
        RETURNING r.run_id, r.lease_token, r.lease_expires_at, t.name, r.args, r.window_start, r.window_end,
                  r.biz_date, r.attempts, r.version, r.checkpoint, r.trigger, r.dedupe_key, r.priority, r.owner,
                  (v.rules->>'timeout')::interval, r.topic, r.event_key, r.payload;
    GET DIAGNOSTICS n_claimed = ROW_COUNT;
    ignored := set_config('tide.history', '', true);
    IF n_claimed < cardinality(ids) THEN
        -- Runs the update left: their task was deleted (with its versions) by a REPEATABLE
        -- READ transaction that could not see them (tide._sweep_gone would delete them at the
        -- next monitoring step). They are deleted now, with their lines, their locks and the
        -- room their queues counted (the trigger run_deleted), and nothing is recorded of them.
        candidates := ids;
        SELECT coalesce(array_agg(r.run_id ORDER BY u.n), '{}'), array_agg(r.owner ORDER BY u.n) INTO ids, owners
          FROM unnest(candidates) WITH ORDINALITY AS u(id, n) JOIN tide.run r ON r.run_id = u.id
         WHERE r.lease_token = token AND r.state = 'running';
        DELETE FROM tide.run r WHERE r.run_id = ANY (candidates) AND r.run_id <> ALL (ids);
        IF cardinality(ids) = 0 THEN
            RETURN;
        END IF;
    END IF;
    -- The history rows, and what they count: the tasks touched, and the wait from fire (or
    -- creation) of each run's first start (tide._write_history).
    PERFORM tide._write_history(array_agg(ROW(r.run_id, r.task_id, r.owner, 'ready', 'running', why, NULL, NULL, NULL,
                                              NULL, NULL, NULL, NULL, NULL, NULL, r.attempts, NULL, r.started_at,
                                              r.fire_at, r.created_at)::tide.run_change), true)
       FROM tide.run r WHERE r.run_id = ANY (ids);
    IF tide._log_on() THEN
        PERFORM tide._log_runs('start', ids);
    END IF;
END
$$;
COMMENT ON FUNCTION tide._claim(tide.executor, text, text, integer, interval, boolean, bigint) IS
    'Internal: the one claim path of external workers and pg_tide''s SQL executors (p_online_only: no backfill runs; p_after: the run whose end an executor commits this claim with, named in the history); returns the claim context with the run''s priority, owner and timeout. Its instants are the claim statement''s start.';

-- An SQL executor's next run, claimed in the transaction that ends its previous one (p_after),
-- so that one commit, and one disk flush, records both: the claim is still on record before the
-- next command starts, as a claim committed on its own would be. Only in READ COMMITTED (the
-- claim then reads with a snapshot of its own; an older one would find its candidates changed
-- since). Whatever goes wrong in the claim is undone alone, in the subtransaction the executor
-- opens around this call (src/workers/mod.rs): the run just ended stays ended, and the executor
-- claims after the commit, as usual.
CREATE FUNCTION tide._claim_next(p_worker text, p_online_only boolean, p_after bigint)
RETURNS TABLE (run_id bigint, lease_token bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- Its one statement is a call of tide._claim: one generic plan, not one planned at every run.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    id bigint;
    token bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN;
    END IF;
    SELECT c.run_id, c.lease_token INTO id, token
      FROM tide._claim('sql', NULL, p_worker, 1, NULL, p_online_only, p_after) c;
    IF id IS NOT NULL THEN
        run_id := id;
        lease_token := token;
        RETURN NEXT;
    END IF;
END
$$;
COMMENT ON FUNCTION tide._claim_next(text, boolean, bigint) IS
    'Internal: an SQL executor''s next run, claimed in the transaction that ends its previous run (one commit for both); nothing when the claim fails or must wait for that commit.';

CREATE FUNCTION tide.claim_runs(queue text DEFAULT 'default', worker text DEFAULT NULL, n integer DEFAULT 1,
                           lease interval DEFAULT NULL)
RETURNS TABLE (run_id bigint, lease_token bigint, lease_expires_at timestamptz, task text, args jsonb,
               window_start timestamptz, window_end timestamptz, biz_date date, attempt integer,
               version integer, checkpoint jsonb, trigger tide.run_trigger, dedupe_key text,
               topic text, event_key text, payload jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- A thin wrapper (tide._claim checks the arguments), in PL/pgSQL: its plan is kept, where an SQL
-- function with a SET clause is parsed and planned at every call (measured: batch 1 went from
-- 43% to 48% of the baseline).
AS $$
BEGIN
    RETURN QUERY
    SELECT c.run_id, c.lease_token, c.lease_expires_at, c.task, c.args, c.window_start, c.window_end,
           c.biz_date, c.attempt, c.version, c.checkpoint, c.trigger, c.dedupe_key, c.topic, c.event_key, c.payload
      FROM tide._claim('external', claim_runs.queue, claim_runs.worker, claim_runs.n, claim_runs.lease) c
     ORDER BY c.priority DESC, c.run_id;
END
$$;
COMMENT ON FUNCTION tide.claim_runs(text, text, integer, interval) IS
    'claim_runs(queue => ''default'', worker => NULL, n => 1, lease => task''s lease): claims up to n ready runs of the caller''s external tasks (a superuser: any role''s) (FOR UPDATE SKIP LOCKED, priority then oldest) and returns their context with a fencing lease_token (and, for event runs, the topic, event key and payload). Runs of a serial group (overlap queue, one event key), of a task at its max_concurrency or whose lock is busy are not returned (see tide.lock).';

CREATE FUNCTION tide.heartbeat_run(run_id bigint, lease_token bigint, progress jsonb DEFAULT NULL) RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    expires timestamptz;
    held_lock text;
BEGIN
    PERFORM tide._jsonb_arg('progress', heartbeat_run.progress, 1048576);
    UPDATE tide.run r
       SET lease_expires_at = now() + r.lease_length,
           checkpoint = coalesce(heartbeat_run.progress, r.checkpoint),
           updated_at = now()
     WHERE r.run_id = heartbeat_run.run_id AND r.lease_token = heartbeat_run.lease_token AND r.state = 'running'
       AND r.control IS NULL AND tide._may_work(r.owner, r.queue)
    RETURNING r.lease_expires_at, r.lock_key INTO expires, held_lock;
    IF NOT FOUND THEN
        PERFORM 1 FROM tide.run r
         WHERE r.run_id = heartbeat_run.run_id AND r.lease_token = heartbeat_run.lease_token AND r.state = 'running'
           AND tide._may_work(r.owner, r.queue);
        IF FOUND THEN
            -- tide.pause_run / tide.cancel_run asked it to stop: it stops here, keeping progress.
            PERFORM tide._stop_run(heartbeat_run.run_id, heartbeat_run.progress);
            RETURN NULL;
        END IF;
        PERFORM tide._refuse_stale(heartbeat_run.run_id, heartbeat_run.lease_token, 'tide.heartbeat_run');
    END IF;
    IF held_lock IS NOT NULL THEN
        UPDATE tide.lock l SET expires_at = expires WHERE l.run_id = heartbeat_run.run_id AND l.lease_token = heartbeat_run.lease_token;
    END IF;
    RETURN expires;
END
$$;
COMMENT ON FUNCTION tide.heartbeat_run(bigint, bigint, jsonb) IS
    'heartbeat_run(run_id, lease_token, progress => NULL): extends the lease (and the run''s lock) by its length and stores progress as the checkpoint; returns the new expiry. Returns NULL when tide.pause_run or tide.cancel_run stopped the run: stop working (progress is kept). A stale lease token is refused.';

-- pg_tide execution: claiming, leases and fencing, completion, failure and retry, the SQL
-- command executor's per-run wrapper, readiness, replay and rerun, rule-version confirmation.
-- Every state change below is an UPDATE of tide.run, checked and recorded by tide._run_changed.
--
-- The public functions here run as the extension's owner (src/security/caller.rs): each acts only on
-- runs the caller may act on (tide._may_act: its own, a role it is a member of, or any for a
-- superuser), and reports another role's run exactly as a run that does not exist.

-- Run context, for a task's command and readiness check: tide.run_id() (src/security/sealed.rs) is set
-- by pg_tide's executor while the run's code runs. These read the run as their caller, under
-- row-level security.

CREATE FUNCTION tide.biz_date() RETURNS date
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT r.biz_date FROM tide.run r WHERE r.run_id = tide.run_id() $$;
COMMENT ON FUNCTION tide.biz_date() IS
    'Inside a task''s command or readiness check: the business date of the run (never "today minus one").';

CREATE FUNCTION tide.window_start() RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT r.window_start FROM tide.run r WHERE r.run_id = tide.run_id() $$;
COMMENT ON FUNCTION tide.window_start() IS
    'Inside a task''s command or readiness check: start of the run''s business window (inclusive).';

CREATE FUNCTION tide.window_end() RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT r.window_end FROM tide.run r WHERE r.run_id = tide.run_id() $$;
COMMENT ON FUNCTION tide.window_end() IS
    'Inside a task''s command or readiness check: end of the run''s business window (exclusive).';

CREATE FUNCTION tide.args() RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT r.args FROM tide.run r WHERE r.run_id = tide.run_id() $$;
COMMENT ON FUNCTION tide.args() IS
    'Inside a task''s command or readiness check: the run''s args (a JSON object).';

-- The error helpers of commands: each raises its SQLSTATE, which decides the run's path.
CREATE FUNCTION tide._signal(p_sqlstate text, p_message text, p_hint text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = p_sqlstate, MESSAGE = tide._clip(p_message, 1000), HINT = p_hint;
END
$$;
COMMENT ON FUNCTION tide._signal(text, text, text) IS
    'Internal: raises the error of one of the command helpers (tide.not_ready, tide.business_error, tide.transient_error).';

CREATE FUNCTION tide.not_ready(message text DEFAULT 'input not ready') RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT tide._signal('TDNR0', coalesce(message, 'input not ready'),
                        'pg_tide re-checks this run at its next window; it is not retried at once')
$$;
COMMENT ON FUNCTION tide.not_ready(text) IS
    'not_ready(message): inside a task''s command, stop: the input is not there yet (SQLSTATE TDNR0). The run waits for the next window instead of retrying.';

CREATE FUNCTION tide.business_error(message text) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT tide._signal('TDBE0', coalesce(message, 'business error'),
                        'retrying cannot fix this: the run goes to the dead letters (tide.dead_letter) for a human')
$$;
COMMENT ON FUNCTION tide.business_error(text) IS
    'business_error(message): inside a task''s command, fail for good (SQLSTATE TDBE0): the run goes to the dead letters without retries.';

CREATE FUNCTION tide.transient_error(message text) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT tide._signal('TDTE0', coalesce(message, 'transient error'),
                        'pg_tide retries this run with backoff, up to the task''s max_attempts')
$$;
COMMENT ON FUNCTION tide.transient_error(text) IS
    'transient_error(message): inside a task''s command, fail this attempt (SQLSTATE TDTE0): the run is retried with backoff, up to max_attempts, then goes to the dead letters.';

-- A stale lease token: explain who has the run now, change nothing.
CREATE FUNCTION tide._refuse_stale(p_run_id bigint, p_token bigint, p_function text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
BEGIN
    IF p_run_id IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION '%: % must not be NULL', p_function, CASE WHEN p_run_id IS NULL THEN 'run_id' ELSE 'lease_token' END
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'pass the run_id and lease_token that tide.claim_runs returned';
    END IF;
    SELECT * INTO r FROM tide.run x WHERE x.run_id = p_run_id AND tide._may_work(x.owner, x.queue);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % does not exist', p_run_id
            USING ERRCODE = 'undefined_object',
                  HINT = 'pass the run_id that tide.claim_runs returned; runs of other roles'' tasks are not visible';
    END IF;
    RAISE EXCEPTION 'lease token % of run % is stale: the run is now % (%)', p_token, p_run_id, r.state,
        CASE WHEN r.state = 'running' THEN format('held by %s with token %s', coalesce(r.lease_owner, 'another worker'), r.lease_token)
             ELSE r.reason END
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'this worker lost the run (its lease expired or it was never its claim): roll back its work; the run''s current holder finishes it';
END
$$;
COMMENT ON FUNCTION tide._refuse_stale(bigint, bigint, text) IS
    'Internal: raises the fencing error for a call with a stale lease token.';

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
        -- Whose runs, in turn (src/security/share.sql): priority orders a role's own runs only. An executor
        -- takes from the role that occupies the fewest executors, ties at random, up to each role's
        -- limit. An external claim that may take several roles' runs takes them from the roles in
        -- an order drawn at random at each claim.
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
    -- creation) of each run's first start.
    INSERT INTO tide.run_event (run_id, from_state, to_state, reason, owner)
    SELECT u.id, 'ready', 'running', why, u.who FROM unnest(ids, owners) AS u(id, who) ORDER BY u.id;
    WITH e AS MATERIALIZED (
        SELECT r.task_id, r.owner, r.attempts, r.started_at, r.fire_at, r.created_at
          FROM tide.run r WHERE r.run_id = ANY (ids)
    ), touched AS (
        INSERT INTO tide.task_touch (task_id, owner) SELECT DISTINCT e.task_id, e.owner FROM e
    )
    INSERT INTO tide.count_delta (task_id, metric, label, value, owner)
    SELECT e.task_id, m.metric, m.label, sum(m.value), min(e.owner)
      FROM e CROSS JOIN LATERAL tide._counts_of('running', e.attempts, NULL, NULL, e.started_at, e.fire_at, e.created_at) m
     GROUP BY 1, 2, 3;
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

CREATE FUNCTION tide.complete_run(run_id bigint, lease_token bigint, result jsonb DEFAULT NULL,
                              expected bigint DEFAULT NULL, actual bigint DEFAULT NULL)
RETURNS tide.run_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT, whatever the backlog (see tide._claim).
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    short boolean := complete_run.actual < complete_run.expected;
    done tide.run_state;
    attempt_no integer;
    why text;
    who name;
    worker text;
    claimed timestamptz;
    finished timestamptz;
    task bigint;
    gated boolean;
    in_owner name;
    in_queue text;
    was_counted boolean;
    ignored text;
    -- Who may complete the run: its owner (the common case, compared without a call), a member
    -- of the owner's role, a superuser.
    caller name := tide._caller();
    any_owner boolean := tide._caller_is_superuser();
BEGIN
    IF complete_run.expected < 0 OR complete_run.actual < 0 THEN
        RAISE EXCEPTION 'expected and actual must not be negative, got expected %, actual %',
            complete_run.expected, complete_run.actual
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass the number of records the run should have and did process';
    END IF;
    PERFORM tide._jsonb_arg('result', complete_run.result, 1048576);
    -- The hot path of every worker: plain statements (cheaper here than data-modifying CTEs),
    -- and the history row written here rather than by the trigger.
    ignored := set_config('tide.history', 'written', true);
    UPDATE tide.run r
       SET state = CASE WHEN short THEN 'need_check' ELSE 'succeeded' END::tide.run_state,
           result = complete_run.result,
           expected = complete_run.expected,
           actual = complete_run.actual,
           -- The clock, not the transaction's start: an executor completes in the transaction
           -- that ran the command, so now() would leave the command out of the run's duration.
           finished_at = clock_timestamp(),
           updated_at = now(),
           lease_expires_at = NULL,
           control = NULL,
           reason = CASE WHEN short
                         THEN format('completed short: expected %s, actual %s', complete_run.expected, complete_run.actual)
                         ELSE format('completed by %s', coalesce(r.lease_owner, 'a worker')) END
     WHERE r.run_id = complete_run.run_id AND r.lease_token = complete_run.lease_token AND r.state = 'running'
       AND (any_owner OR r.owner = caller OR tide._may_work(r.owner, r.queue))
    RETURNING r.state, r.attempts, r.reason, r.owner, r.lease_owner, r.claimed_at, r.finished_at, r.task_id
         INTO done, attempt_no, why, who, worker, claimed, finished, task;
    ignored := set_config('tide.history', '', true);
    IF NOT FOUND THEN
        PERFORM tide._refuse_stale(complete_run.run_id, complete_run.lease_token, 'tide.complete_run');
    END IF;
    IF short THEN
        -- (counted is left as it was: it means something only while running.)
        UPDATE tide.pending p SET state = 'need_check', due_at = NULL WHERE p.run_id = complete_run.run_id
        RETURNING p.gated, p.owner, p.queue, p.counted INTO gated, in_owner, in_queue, was_counted;
    ELSE
        DELETE FROM tide.pending p WHERE p.run_id = complete_run.run_id
        RETURNING p.gated, p.owner, p.queue, p.counted INTO gated, in_owner, in_queue, was_counted;
    END IF;
    IF gated THEN
        PERFORM tide._release(ARRAY[complete_run.run_id]);
    END IF;
    IF was_counted THEN
        -- A run its queue's max_concurrency counted gives the room back (tide.queue).
        PERFORM tide._queue_ended(in_owner, in_queue, 1);
    END IF;
    -- The history row, and what it counts: the task touched, the outcome, and a success's
    -- duration.
    INSERT INTO tide.run_event (run_id, from_state, to_state, reason, owner, attempt, worker, lease_token,
                                claimed_at, outcome)
    VALUES (complete_run.run_id, 'running', done, why, who, attempt_no, worker, complete_run.lease_token, claimed,
            CASE WHEN short THEN 'need_check' ELSE 'succeeded' END::tide.attempt_outcome);
    INSERT INTO tide.task_touch (task_id, owner) VALUES (task, who);
    INSERT INTO tide.count_delta (task_id, metric, label, value, owner)
    SELECT task, m.metric, m.label, m.value, who
      FROM tide._counts_of(done, attempt_no, claimed, finished, NULL, NULL, NULL) m;
    IF tide._log_on() THEN
        PERFORM tide._log_runs(CASE WHEN short THEN 'need_check' ELSE 'success' END, ARRAY[complete_run.run_id]);
    END IF;
    RETURN done;
END
$$;
COMMENT ON FUNCTION tide.complete_run(bigint, bigint, jsonb, bigint, bigint) IS
    'complete_run(run_id, lease_token, result => NULL, expected => NULL, actual => NULL): finishes a claimed run: succeeded, or need_check when actual < expected. A stale lease token is refused and nothing changes.';

CREATE FUNCTION tide.complete_runs(run_ids bigint[], lease_tokens bigint[], results jsonb[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT, whatever the backlog (see tide._claim).
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    done_ids bigint[];
    gated_ids bigint[];
    ended_owners name[];
    ended_queues text[];
    ended_n integer[];
    stale record;
    ignored text;
    caller name := tide._caller();
    any_owner boolean := tide._caller_is_superuser();
BEGIN
    IF coalesce(cardinality(complete_runs.run_ids), 0) = 0
       AND coalesce(cardinality(complete_runs.lease_tokens), 0) = 0 THEN
        RETURN 0;  -- an empty claim: nothing to complete
    END IF;
    IF complete_runs.run_ids IS NULL OR complete_runs.lease_tokens IS NULL
       OR cardinality(complete_runs.run_ids) <> cardinality(complete_runs.lease_tokens)
       OR cardinality(complete_runs.results) <> cardinality(complete_runs.run_ids) THEN
        RAISE EXCEPTION 'run_ids, lease_tokens and results must be arrays of the same length, got %, % and %',
            coalesce(cardinality(complete_runs.run_ids)::text, 'NULL'), coalesce(cardinality(complete_runs.lease_tokens)::text, 'NULL'),
            coalesce(cardinality(complete_runs.results)::text, 'no results')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass the run_id and lease_token columns of tide.claim_runs as arrays, in the same order';
    END IF;
    IF cardinality(complete_runs.run_ids) > 1000 THEN
        RAISE EXCEPTION 'complete at most 1000 runs at a time, got %', cardinality(complete_runs.run_ids)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'tide.claim_runs hands out at most 1000 runs at a time';
    END IF;
    -- All runs and their history (with the attempts they end) in one statement: the batch path
    -- of a busy worker.
    ignored := set_config('tide.history', 'written', true);
    WITH input AS (
        SELECT i.run_id, i.token, complete_runs.results[i.n] AS result
          FROM unnest(complete_runs.run_ids, complete_runs.lease_tokens) WITH ORDINALITY AS i(run_id, token, n)
    ), done_run AS (
        UPDATE tide.run r
           SET state = 'succeeded', result = i.result, finished_at = now(), updated_at = now(),
               lease_expires_at = NULL, control = NULL,
               reason = format('completed by %s', coalesce(r.lease_owner, 'a worker'))
          FROM input i
         WHERE r.run_id = i.run_id AND r.lease_token = i.token AND r.state = 'running'
           AND (any_owner OR r.owner = caller OR tide._may_work(r.owner, r.queue))
        RETURNING r.run_id, r.attempts, r.reason, r.owner, r.lease_owner, r.lease_token, r.claimed_at,
                  r.gated, r.task_id, r.finished_at
    ), done_pending AS (
        DELETE FROM tide.pending p USING done_run d WHERE p.run_id = d.run_id
        RETURNING p.owner, p.queue, p.counted
    ), ended AS (
        -- Runs their queues' max_concurrency counted, by queue.
        SELECT e.owner, e.queue, count(*)::integer AS n FROM done_pending e WHERE e.counted
         GROUP BY e.owner, e.queue
    ), history AS (
        INSERT INTO tide.run_event (run_id, from_state, to_state, reason, owner, attempt, worker, lease_token,
                                    claimed_at, outcome)
        SELECT d.run_id, 'running', 'succeeded', d.reason, d.owner, d.attempts, d.lease_owner, d.lease_token,
               d.claimed_at, 'succeeded'
          FROM done_run d ORDER BY d.run_id
    ), touched AS (
        -- What the history rows count: the tasks touched, the successes and their durations.
        INSERT INTO tide.task_touch (task_id, owner) SELECT DISTINCT d.task_id, d.owner FROM done_run d
    ), counted AS (
        INSERT INTO tide.count_delta (task_id, metric, label, value, owner)
        SELECT d.task_id, m.metric, m.label, sum(m.value), min(d.owner)
          FROM done_run d CROSS JOIN LATERAL tide._counts_of('succeeded', d.attempts, d.claimed_at, d.finished_at,
                                                             NULL, NULL, NULL) m
         GROUP BY 1, 2, 3
    )
    SELECT array_agg(d.run_id), array_agg(d.run_id) FILTER (WHERE d.gated),
           (SELECT array_agg(e.owner) FROM ended e), (SELECT array_agg(e.queue) FROM ended e),
           (SELECT array_agg(e.n) FROM ended e)
      INTO done_ids, gated_ids, ended_owners, ended_queues, ended_n FROM done_run d;
    ignored := set_config('tide.history', '', true);
    IF coalesce(cardinality(done_ids), 0) < cardinality(complete_runs.run_ids) THEN
        -- All or nothing: raising undoes the completions above.
        SELECT i.run_id, i.token INTO stale
          FROM unnest(complete_runs.run_ids, complete_runs.lease_tokens) AS i(run_id, token)
         WHERE i.run_id <> ALL (coalesce(done_ids, '{}')) LIMIT 1;
        IF FOUND THEN
            PERFORM tide._refuse_stale(stale.run_id, stale.token, 'tide.complete_runs');
        END IF;
        RAISE EXCEPTION 'run_ids must not repeat a run' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'complete each claimed run once';
    END IF;
    IF gated_ids IS NOT NULL THEN
        PERFORM tide._release(gated_ids);
    END IF;
    IF ended_owners IS NOT NULL THEN
        -- Room their queues counted goes back (tide.queue).
        PERFORM tide._queue_ended(u.owner, u.queue, u.n)
           FROM unnest(ended_owners, ended_queues, ended_n) AS u(owner, queue, n);
    END IF;
    IF tide._log_on() THEN
        PERFORM tide._log_runs('success', done_ids);
    END IF;
    RETURN cardinality(done_ids);
END
$$;
COMMENT ON FUNCTION tide.complete_runs(bigint[], bigint[], jsonb[]) IS
    'complete_runs(run_ids, lease_tokens, results => NULL): completes a batch of claimed runs as succeeded in one call, all or nothing: one stale lease token refuses the whole batch. Returns how many (0 for empty arrays, as an empty claim aggregates to).';

-- The one failure path: a worker's tide.fail_run, an SQL command's error, a lost lease.
CREATE FUNCTION tide._fail(p_run_id bigint, p_error text, p_kind tide.error_kind, p_sqlstate text,
                           p_outcome tide.attempt_outcome, p_now timestamptz)
RETURNS tide.run_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
    changed tide.run;
    rules jsonb;
    next_fire timestamptz;
    max_attempts integer;
    new_state tide.run_state;
    wait_until timestamptz;
    budget_hold timestamptz;
    why text;
    error_text text;
BEGIN
    SELECT * INTO r FROM tide.run WHERE run_id = p_run_id FOR UPDATE;
    SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = r.task_id AND v.version = r.version;
    max_attempts := (rules->>'max_attempts')::integer;
    -- Errors come from workers and commands: kept bounded.
    error_text := tide._clip(p_error, 10000);
    IF p_kind = 'business' THEN
        new_state := 'dead';
        why := format('business error: %s', error_text);
    ELSIF r.tries >= max_attempts THEN
        new_state := 'dead';
        why := format('gave up after %s of %s attempts: %s', r.tries, max_attempts, error_text);
    ELSIF p_kind = 'transient' THEN
        new_state := 'retry';
        wait_until := p_now + tide.backoff_delay(r.tries, (rules->>'backoff_base')::interval,
                                                 (rules->>'backoff_factor')::float8,
                                                 (rules->>'backoff_cap')::interval,
                                                 rules->>'jitter', random());
        -- The queue's retry budget (tide.queue): when it is spent, the retry waits for it.
        budget_hold := tide._spend_retry(r.owner, r.queue, p_now);
        IF budget_hold > wait_until THEN
            wait_until := budget_hold;
        END IF;
        why := format('attempt %s of %s failed, retry after %s%s: %s', r.tries, max_attempts,
                      to_char(wait_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS" UTC"'),
                      CASE WHEN budget_hold IS NOT NULL
                           THEN format(' (the retry budget of queue %s is spent)', r.queue) ELSE '' END,
                      error_text);
    ELSE
        -- Not ready: wait for the next window, never a tight loop.
        SELECT t.next_fire_at INTO next_fire FROM tide.task t WHERE t.task_id = r.task_id;
        wait_until := CASE WHEN next_fire > p_now THEN next_fire
                           ELSE p_now + (rules->>'recheck_interval')::interval END;
        new_state := 'waiting';
        why := format('not ready (attempt %s of %s), waits until %s: %s', r.tries, max_attempts,
                      to_char(wait_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS" UTC"'), error_text);
    END IF;
    -- Running to retry, dead or waiting: legal by construction; the history row, written here,
    -- carries the attempt this ends.
    PERFORM set_config('tide.history', 'written', true);
    UPDATE tide.run
       SET state = new_state,
           run_after = wait_until,
           ready_deadline = NULL,
           last_error = error_text,
           last_error_kind = p_kind,
           lease_expires_at = NULL,
           finished_at = CASE WHEN new_state = 'dead' THEN p_now END,
           updated_at = now(),
           reason = why
     WHERE run_id = p_run_id AND state = 'running'
    RETURNING * INTO changed;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % is %, not running: no attempt to end', p_run_id, r.state
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'only a claimed run can fail';
    END IF;
    PERFORM set_config('tide.history', '', true);
    PERFORM tide._sync_pending(changed, true);
    INSERT INTO tide.run_event (run_id, from_state, to_state, reason, owner, at, attempt, worker, lease_token,
                                claimed_at, outcome, error_kind, sqlstate, error)
    VALUES (p_run_id, 'running', new_state, why, r.owner, p_now, r.attempts, r.lease_owner, r.lease_token,
            coalesce(r.claimed_at, p_now), p_outcome, p_kind, p_sqlstate, error_text);
    -- What it counts, here as on every path that writes history: the task touched, and a dead
    -- letter among the outcomes of tide.metrics().
    INSERT INTO tide.task_touch (task_id, owner) VALUES (r.task_id, r.owner);
    -- (A retry has no finished_at: its failed attempt ended at p_now, the hour it counts in.)
    INSERT INTO tide.count_delta (task_id, metric, label, value, owner)
    SELECT r.task_id, m.metric, m.label, m.value, r.owner
      FROM tide._counts_of(new_state, changed.attempts, changed.claimed_at, coalesce(changed.finished_at, p_now),
                           changed.started_at, changed.fire_at, changed.created_at) m;
    IF new_state = 'retry' THEN
        PERFORM tide._wake(true);  -- the scheduler sleeps until the retry is due, not its next poll
    END IF;
    IF tide._log_on() THEN
        PERFORM tide._log_runs('failure', ARRAY[p_run_id], error_text);
    END IF;
    RETURN new_state;
END
$$;
COMMENT ON FUNCTION tide._fail(bigint, text, tide.error_kind, text, tide.attempt_outcome, timestamptz) IS
    'Internal: records a failed attempt and decides retry (with backoff), wait (not ready) or dead letter.';

CREATE FUNCTION tide.fail_run(run_id bigint, lease_token bigint, error text, kind text DEFAULT 'transient')
RETURNS tide.run_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    k tide.error_kind;
BEGIN
    IF fail_run.run_id IS NULL OR fail_run.lease_token IS NULL OR fail_run.error IS NULL OR fail_run.kind IS NULL THEN
        RAISE EXCEPTION '% must not be NULL',
            CASE WHEN fail_run.run_id IS NULL THEN 'run_id' WHEN fail_run.lease_token IS NULL THEN 'lease_token'
                 WHEN fail_run.error IS NULL THEN 'error' ELSE 'kind' END
            USING ERRCODE = 'null_value_not_allowed', HINT = 'say what went wrong: tide.fail_run(run_id, lease_token, ''timeout calling the bank'')';
    END IF;
    k := tide._error_kind_from(tide._text_arg('kind', fail_run.kind, 20, 'use ''transient'', ''business'' or ''not_ready'''))::tide.error_kind;
    PERFORM 1 FROM tide.run r
     WHERE r.run_id = fail_run.run_id AND r.lease_token = fail_run.lease_token AND r.state = 'running'
       AND tide._may_work(r.owner, r.queue)
       FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM tide._refuse_stale(fail_run.run_id, fail_run.lease_token, 'tide.fail_run');
    END IF;
    RETURN tide._fail(fail_run.run_id, fail_run.error, k, NULL, 'failed', now());
END
$$;
COMMENT ON FUNCTION tide.fail_run(bigint, bigint, text, text) IS
    'fail_run(run_id, lease_token, error, kind => ''transient''): records a failed attempt. transient = retry with backoff up to max_attempts; business = dead letter at once; not_ready = wait for the next window. Returns the run''s new state.';

-- The SQL executor's body for one claimed run, called by a pg_tide executor (a superuser).
-- The command runs sealed as the task's owner (between tide._seal_begin and tide._seal_end,
-- src/security/sealed.rs), in a subtransaction together with its completion: a run whose completion is
-- refused (its lease was lost meanwhile) leaves no effects, and an error is recorded as a
-- failed attempt.
--
-- A long task's command does one batch: it returns the next checkpoint (jsonb), committed with
-- the batch's work, or NULL when done. Each call is one batch in its own transaction; the
-- result 'more <ms>' asks the executor to call again after that many milliseconds (rate or
-- pause); a wait of 2 seconds or more puts the run back in line instead (waiting until then),
-- so that no executor is held for it. A pause or cancel asked for is taken up before the next
-- batch.
CREATE FUNCTION tide._execute(p_run_id bigint, p_token bigint) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- Generic plans for the run's bookkeeping, as tide._claim and tide.complete_run have: the
-- executors' sessions plan every statement for each execution otherwise (src/workers/mod.rs), and
-- these look runs and rule versions up by key, for which a plan made again is the same plan
-- (measured: this function's own time down by a tenth). The task's command is not affected:
-- it runs under the seal's RESET ALL, with the session's defaults.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    cmd text;
    rules jsonb;
    long boolean;
    r tide.run;
    seal bigint;
    n bigint;
    reported record;
    next_checkpoint jsonb;
    scan boolean;
    scan_rows jsonb;
    st text;
    msg text;
    final tide.run_state;
    wait_ms bigint;
    recon jsonb;
    compared jsonb;
    side text;
    wrote boolean;
BEGIN
    SELECT * INTO r FROM tide.run x WHERE x.run_id = p_run_id AND x.lease_token = p_token AND x.state = 'running';
    IF NOT FOUND THEN
        RETURN 'fenced';
    END IF;
    IF r.control IS NOT NULL THEN
        RETURN tide._stop_run(p_run_id, NULL)::text;
    END IF;
    SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = r.task_id AND v.version = r.version;
    cmd := rules->>'command';
    long := coalesce((rules->>'long')::boolean, false);
    -- A window run of an event task with a fallback is its scan for events never emitted.
    scan := rules->>'fallback' IS NOT NULL AND r.window_start IS NOT NULL;
    -- A reconciliation's run compares its two sides (src/recon/recon.sql) instead of running a command.
    recon := CASE WHEN jsonb_typeof(rules->'reconcile') = 'object' THEN rules->'reconcile' END;
    IF coalesce((rules->>'top_level')::boolean, false) OR rules->>'database' IS NOT NULL THEN
        -- Run by a worker of its own: outside any transaction block, or in another database
        -- (src/workers/command.rs).
        RETURN 'top_level';
    END IF;
    BEGIN
        IF cmd IS NULL AND NOT scan THEN
            PERFORM tide.business_error('the task has no command in this rule version');
        END IF;
        seal := tide._seal_begin(p_run_id, r.owner, tide._timeout_ms(rules->>'timeout'));
        IF recon IS NOT NULL THEN
            -- Read-only, in the seal's GUC level (undone with it), with the comparison's memory.
            PERFORM set_config('transaction_read_only', 'on', true);
            PERFORM set_config('jit', 'off', true);
            IF recon->>'work_mem' IS NOT NULL THEN
                PERFORM set_config('work_mem', recon->>'work_mem', true);
            END IF;
            compared := jsonb_build_object('started_at', clock_timestamp())
                        || tide._recon_compare(recon, current_setting('search_path'));
        ELSIF scan THEN
            EXECUTE format('SELECT coalesce(jsonb_agg(to_jsonb(s)), ''[]'') FROM (%s) s', rules->>'fallback') INTO scan_rows;
        ELSIF long THEN
            EXECUTE cmd INTO next_checkpoint;
        ELSE
            EXECUTE cmd;
            GET DIAGNOSTICS n = ROW_COUNT;
        END IF;
        SELECT * INTO reported FROM tide._seal_end(seal);
        -- Back to pg_tide's bookkeeping: a row a role's open transaction holds may delay it a
        -- little, never stall the executor (the setting ends with this transaction).
        PERFORM set_config('lock_timeout', '5s', true);
        IF scan THEN
            RETURN tide.complete_run(p_run_id, p_token, tide._fallback_emit(r, scan_rows))::text;
        END IF;
        IF recon IS NOT NULL THEN
            RETURN tide.complete_run(p_run_id, p_token, tide._recon_record(r, recon, compared))::text;
        END IF;
        IF long THEN
            UPDATE tide.run x SET batches = x.batches + 1 WHERE x.run_id = p_run_id;
            IF next_checkpoint IS NOT NULL THEN
                -- One batch done: a heartbeat commits its checkpoint with its work and renews
                -- the lease and lock; a pause or cancel asked for meanwhile stops the run here.
                IF tide.heartbeat_run(p_run_id, p_token, next_checkpoint) IS NULL THEN
                    RETURN (SELECT x.state::text FROM tide.run x WHERE x.run_id = p_run_id);
                END IF;
                wait_ms := coalesce(round(1000 / (rules->>'batch_rate')::float8)::bigint,
                                    (extract(epoch FROM (rules->>'batch_pause')::interval) * 1000)::bigint, 0);
                IF wait_ms >= 2000 AND r.lock_key IS NULL THEN
                    -- A wait of 2 seconds or more does not pin the executor: the run waits in line
                    -- (its checkpoint kept) and the next batch is claimed again when it is due,
                    -- without counting as another try. A run holding a lock keeps it, and its
                    -- executor, for the wait.
                    UPDATE tide.run x
                       SET state = 'waiting', run_after = now() + make_interval(secs => wait_ms / 1000.0),
                           ready_deadline = NULL, tries = greatest(x.tries - 1, 0), lease_expires_at = NULL,
                           updated_at = now(),
                           reason = format('between batches: %s done, the next at %s (no executor held meanwhile)',
                                           x.batches, now() + make_interval(secs => wait_ms / 1000.0))
                     WHERE x.run_id = p_run_id;
                    RETURN 'waiting';
                END IF;
                RETURN 'more ' || wait_ms;
            END IF;
        END IF;
        final := tide.complete_run(p_run_id, p_token,
                               CASE WHEN long THEN jsonb_build_object('batches', r.batches + 1)
                                    ELSE jsonb_build_object('row_count', n) END,
                               reported.expected, reported.actual);
        RETURN final::text;
    EXCEPTION WHEN query_canceled OR others THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
        PERFORM tide._seal_abort(seal);
    END;
    PERFORM set_config('lock_timeout', '5s', true);
    PERFORM 1 FROM tide.run x
     WHERE x.run_id = p_run_id AND x.lease_token = p_token AND x.state = 'running' FOR UPDATE;
    IF NOT FOUND THEN
        -- Fenced: the lease was lost and the run taken back; the command's effects are undone.
        RETURN 'fenced';
    END IF;
    IF (SELECT x.control FROM tide.run x WHERE x.run_id = p_run_id) IS NOT NULL THEN
        -- tide.cancel_run or tide.pause_run interrupted the command (or asked while it failed):
        -- the run stops as asked; its work was rolled back with the subtransaction.
        RETURN tide._stop_run(p_run_id, NULL, true)::text;
    END IF;
    IF recon IS NOT NULL THEN
        -- A side that fails or writes fails the run as a business error naming the side (its
        -- errors of transient classes, such as a lost connection of a foreign table, retry).
        wrote := st = '25006' OR (st = '0A000' AND msg LIKE '%non-volatile function%');
        IF st NOT IN ('TDBE0', '57014') THEN
            side := tide._recon_blame(recon, p_run_id, r.owner, tide._timeout_ms(rules->>'timeout'));
            msg := CASE WHEN wrote THEN format('the %s side tried to write (it must only read): %s', coalesce(side, 'left or right'), msg)
                        WHEN side IS NOT NULL THEN format('the %s side failed (%s): %s', side, st, msg)
                        ELSE format('the comparison failed (%s): %s', st, msg) END;
        END IF;
        final := tide._fail(p_run_id, msg,
                            CASE WHEN NOT wrote AND tide._error_kind(st, rules->'error_kinds') = 'transient'
                                 THEN 'transient' ELSE 'business' END::tide.error_kind, st, 'failed', clock_timestamp());
        RETURN final::text;
    END IF;
    final := tide._fail(p_run_id, msg, tide._error_kind(st, rules->'error_kinds')::tide.error_kind, st, 'failed', clock_timestamp());
    RETURN final::text;
END
$$;
COMMENT ON FUNCTION tide._execute(bigint, bigint) IS
    'Internal: runs a claimed run''s command sealed as the task''s owner (one batch of a long task) and completes or fails it in the same transaction (called by pg_tide executors). Returns the run''s state, fenced, or ''more <ms>'' when a long task has more batches.';

-- The fallback scan's rows (R10.2: no event is lost even when its emit was): each key becomes
-- an event run of the task with the key as event key and dedupe key, unless the task has a run
-- of that dedupe key already. Returns what the scan found, for the scan run's result; the
-- events_lost alert reads it.
CREATE FUNCTION tide._fallback_emit(r tide.run, p_rows jsonb) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t tide.task;
    topic text;
    keys text[];
    ids bigint[];
    bad integer;
BEGIN
    -- KEY SHARE: the task cannot be deleted under its new runs (tide.run has no foreign key).
    SELECT * INTO t FROM tide.task x WHERE x.task_id = r.task_id FOR KEY SHARE;
    IF NOT FOUND THEN
        PERFORM tide.business_error(format('task %s was deleted', r.task_id));
    END IF;
    topic := t.topics[1];
    SELECT count(*) FILTER (WHERE jsonb_typeof(e.item) <> 'object' OR coalesce(e.item->>'key', '') = ''
                                  OR length(e.item->>'key') > 1000 OR e.item->>'key' LIKE '#%'
                                  OR (e.item ? 'payload' AND jsonb_typeof(e.item->'payload') NOT IN ('object', 'null')))
      INTO bad FROM jsonb_array_elements(p_rows) AS e(item);
    IF bad > 0 THEN
        PERFORM tide.business_error(format('the fallback query returned %s rows without a usable key (a non-empty text of at most 1000 characters, not starting with #: those are pg_tide''s own) or with a payload that is not a JSON object', bad));
    END IF;
    WITH found AS (
        SELECT DISTINCT ON (e.item->>'key') e.item->>'key' AS key, coalesce(nullif(e.item->'payload', 'null'), '{}') AS payload, e.n
          FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS e(item, n)
         ORDER BY e.item->>'key', e.n
    ), created AS (
        INSERT INTO tide.run (task_id, trigger, dedupe_key, version, state, reason, executor, queue, priority,
                              args, owner, topic, event_key, payload, gate, lock_key, gated)
        SELECT t.task_id, 'event', f.key, t.version,
               tide._open_state(tide._task_rules(t)),
               format('event on %s (key %s) found by the fallback scan of run %s: it was never emitted', topic, f.key, r.run_id),
               tide._executor_of(t.command), t.queue, t.priority, t.args, t.owner,
               topic, f.key, f.payload, g.gate, g.lock_key, g.gated
          FROM found f
         CROSS JOIN LATERAL tide._gating_of(t.task_id, t.version, t.args, f.payload, f.key, NULL, NULL) g
         ORDER BY f.n
        ON CONFLICT (task_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING run_id, event_key
    )
    SELECT array_agg(c.run_id ORDER BY c.run_id), array_agg(c.event_key ORDER BY c.run_id) INTO ids, keys FROM created c;
    IF ids IS NOT NULL THEN
        -- Their first history rows and tide.pending rows (a scan is not a hot path).
        PERFORM tide._record_created(ids);
    END IF;
    RETURN jsonb_build_object('scanned', jsonb_array_length(p_rows), 'missing', coalesce(cardinality(keys), 0),
                              'missing_keys', to_jsonb(coalesce(keys[1:100], '{}')));
END
$$;
COMMENT ON FUNCTION tide._fallback_emit(tide.run, jsonb) IS
    'Internal: turns the rows of a fallback scan into the event runs that were never emitted (key as event and dedupe key); returns scanned, missing and the missing keys (the first 100).';

-- A command run by a worker of its own (src/workers/command.rs: top-level commands, and commands of
-- tasks that run in another database) starts: the command, as whom, where, how and for how
-- long, if the claim still holds the run. A database the owner cannot reach fails the run here,
-- with the error the server would give, and answers nothing.
CREATE FUNCTION tide._command_start(p_run_id bigint, p_token bigint)
RETURNS TABLE (command text, owner name, database text, top_level boolean, timeout_ms integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
DECLARE
    r record;
    problem record;
BEGIN
    SELECT v.rules, x.owner INTO r
      FROM tide.run x JOIN tide.task_version v ON v.task_id = x.task_id AND v.version = x.version
     WHERE x.run_id = p_run_id AND x.lease_token = p_token AND x.state = 'running';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF r.rules->>'database' IS NOT NULL THEN
        SELECT * INTO problem FROM tide._database_problem(r.rules->>'database', r.owner);
        IF FOUND THEN
            PERFORM 1 FROM tide.run x WHERE x.run_id = p_run_id FOR UPDATE;
            PERFORM tide._fail(p_run_id, problem.message,
                               tide._error_kind(problem.sqlstate, r.rules->'error_kinds')::tide.error_kind,
                               problem.sqlstate, 'failed', clock_timestamp());
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT r.rules->>'command', r.owner, r.rules->>'database',
                        coalesce((r.rules->>'top_level')::boolean, false), tide._timeout_ms(r.rules->>'timeout');
END
$$;
COMMENT ON FUNCTION tide._command_start(bigint, bigint) IS
    'Internal: what a command worker runs (command, owner, database, top_level, timeout), if the claim still holds the run; fails the run when its database cannot be reached.';

-- Why a task's owner cannot run commands in a database (one row), or nothing: checked when a
-- task names the database (tide.schedule, tide.alter) and again at every run. The messages are
-- the server's own where it has one.
CREATE FUNCTION tide._database_problem(p_database text, p_owner name)
RETURNS TABLE (sqlstate text, message text, hint text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d record;
BEGIN
    IF octet_length(p_database) > 63 THEN
        RETURN QUERY SELECT '22023', format('database name %s is too long (%s bytes, at most 63)',
                                            quote_literal(left(p_database, 80) || CASE WHEN length(p_database) > 80 THEN '...' ELSE '' END),
                                            octet_length(p_database)),
                            'name a database of this cluster: SELECT datname FROM pg_database';
        RETURN;
    END IF;
    SELECT x.oid, x.datistemplate, x.datallowconn INTO d FROM pg_database x WHERE x.datname = p_database;
    IF NOT FOUND THEN
        RETURN QUERY SELECT '3D000', format('database "%s" does not exist', p_database),
                            'name a database of this cluster: SELECT datname FROM pg_database';
    ELSIF d.datistemplate THEN
        RETURN QUERY SELECT '22023', format('database "%s" is a template', p_database),
                            'a template is copied by CREATE DATABASE, not worked in: name the database that holds your data';
    ELSIF NOT d.datallowconn THEN
        RETURN QUERY SELECT '55000', format('database "%s" is not currently accepting connections', p_database),
                            format('ALTER DATABASE %I ALLOW_CONNECTIONS true, or name another database', p_database);
    ELSIF NOT has_database_privilege(p_owner, d.oid, 'CONNECT') THEN
        RETURN QUERY SELECT '42501', format('permission denied for database "%s" (role "%s" does not have CONNECT privilege)', p_database, p_owner),
                            format('GRANT CONNECT ON DATABASE %I TO %I', p_database, p_owner);
    END IF;
END
$$;
COMMENT ON FUNCTION tide._database_problem(text, name) IS
    'Internal: why a role cannot run commands in a database (too long a name, none such, a template, not accepting connections, no CONNECT privilege), as SQLSTATE, message and hint; no row when it can.';

-- A command worker's outcome, recorded by whoever collects it: completed (with its statement
-- count and last command tag), stopped as asked (a cancel or pause interrupted it), or failed by
-- the error's SQLSTATE (transient: retried; business: dead letter), unless the run was taken back
-- meanwhile.
CREATE FUNCTION tide._command_finish(p_run_id bigint, p_token bigint, p_sqlstate text, p_error text,
                                     p_statements integer, p_expected bigint, p_actual bigint, p_tag text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
BEGIN
    IF NOT tide._still_held(p_run_id, p_token) THEN
        RETURN 'fenced';
    END IF;
    IF p_sqlstate IS NULL THEN
        RETURN tide.complete_run(p_run_id, p_token,
                                 jsonb_strip_nulls(jsonb_build_object('statements', p_statements, 'tag', p_tag)),
                                 p_expected, p_actual)::text;
    END IF;
    IF (SELECT x.control FROM tide.run x WHERE x.run_id = p_run_id) IS NOT NULL THEN
        -- tide.cancel_run or tide.pause_run interrupted the command (tide._ask_to_stop): the run
        -- stops as asked. A top-level command's statements before the interruption stay.
        RETURN tide._stop_run(p_run_id, NULL, true,
                              CASE WHEN p_statements > 0
                                   THEN format('while running, its command interrupted after %s statements, which stay committed', p_statements)
                                   ELSE 'while running, its command interrupted and its work rolled back' END)::text;
    END IF;
    RETURN tide._fail(p_run_id, p_error,
                      tide._error_kind(p_sqlstate,
                                       (SELECT v.rules->'error_kinds' FROM tide.run r
                                          JOIN tide.task_version v ON v.task_id = r.task_id AND v.version = r.version
                                         WHERE r.run_id = p_run_id))::tide.error_kind,
                      p_sqlstate, 'failed', now())::text;
END
$$;
COMMENT ON FUNCTION tide._command_finish(bigint, bigint, text, text, integer, bigint, bigint, text) IS
    'Internal: records the outcome of a command worker (completed with its statement count and last command tag, stopped as a cancel or pause asked, or failed by its SQLSTATE) if the claim still holds the run.';

-- No command worker was free for a claimed run (the limits, or max_worker_processes): it goes
-- back in line for two seconds, without counting as a try, and its locks go back meanwhile.
CREATE FUNCTION tide._command_wait(p_run_id bigint, p_token bigint, p_why text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
BEGIN
    IF NOT tide._still_held(p_run_id, p_token) THEN
        RETURN;
    END IF;
    UPDATE tide.run x
       SET state = 'waiting', run_after = now() + interval '2 seconds', ready_deadline = NULL,
           tries = greatest(x.tries - 1, 0), lease_expires_at = NULL, updated_at = now(),
           reason = tide._clip(p_why, 500)
     WHERE x.run_id = p_run_id;
    PERFORM tide._release(ARRAY[p_run_id]);
END
$$;
COMMENT ON FUNCTION tide._command_wait(bigint, bigint, text) IS
    'Internal: puts a claimed run back in line for two seconds (no try counted) when no command worker is free for it.';

-- Whether a claim still holds its run (running, under its lease token), locking the run.
CREATE FUNCTION tide._still_held(p_run_id bigint, p_token bigint) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM 1 FROM tide.run x
     WHERE x.run_id = p_run_id AND x.lease_token = p_token AND x.state = 'running' FOR UPDATE;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION tide._still_held(bigint, bigint) IS 'Internal: whether a claim still holds its run (locked for the caller''s change).';

-- A task's timeout as the milliseconds of a statement timeout (at most 7 days: the bound
-- tide.schedule enforces keeps it inside an int). No timeout ('0') is the largest int, which
-- tide._seal_begin and the command workers read as "the owner's own statement_timeout"
-- (src/security/sealed.rs), and which least(..., cap) bounds like any long timeout.
CREATE FUNCTION tide._timeout_ms(p_timeout text) RETURNS integer
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_timeout::interval = interval '0' THEN
        RETURN 2147483647;
    END IF;
    RETURN least(extract(epoch FROM p_timeout::interval) * 1000, 2147483647)::integer;
END
$$;
COMMENT ON FUNCTION tide._timeout_ms(text) IS 'Internal: a timeout from a rule snapshot, in milliseconds (2147483647: none, the owner''s statement_timeout applies).';

-- The executor could not finish a run's transaction (its bookkeeping failed): the attempt ends
-- now, as lost, instead of when its lease expires.
CREATE FUNCTION tide._abandon(p_run_id bigint, p_token bigint, p_error text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
BEGIN
    IF tide._still_held(p_run_id, p_token) THEN
        IF (SELECT x.control FROM tide.run x WHERE x.run_id = p_run_id) IS NOT NULL THEN
            -- Interrupted by tide.cancel_run or tide.pause_run outside the command itself.
            PERFORM tide._stop_run(p_run_id, NULL, true);
            RETURN;
        END IF;
        PERFORM tide._fail(p_run_id, format('the executor could not finish the run: %s', p_error),
                           'transient', NULL, 'lost', now());
    END IF;
END
$$;
COMMENT ON FUNCTION tide._abandon(bigint, bigint, text) IS
    'Internal: ends an attempt whose executor could not finish its transaction, as lost.';

-- Readiness of one waiting run whose task declares a check, called by an executor (a
-- superuser); the check runs sealed as the task's owner.
CREATE FUNCTION tide._check_ready(p_run_id bigint) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
    rules jsonb;
    ok boolean;
    seal bigint;
    st text;
    msg text;
    -- Readiness by watermark: the value now, since when it has not moved, the run's record.
    evaluated boolean := false;
    wm text;
    since timestamptz;
    stable_for interval;
    recorded jsonb;
    next_check timestamptz;
BEGIN
    SELECT * INTO r FROM tide.run WHERE run_id = p_run_id AND state = 'waiting' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = r.task_id AND v.version = r.version;
    BEGIN
        IF rules->>'ready_dataset' IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM tide.ready_marker m
                WHERE m.owner = r.owner AND m.dataset = rules->>'ready_dataset' AND m.biz_date = r.biz_date) THEN
            ok := false;
            msg := format('dataset %s is not marked ready for %s', rules->>'ready_dataset', r.biz_date);
        ELSE
            seal := tide._seal_begin(p_run_id, r.owner, least(tide._timeout_ms(rules->>'timeout'), 60000));
            ok := true;
            IF rules->>'ready_check' IS NOT NULL THEN
                EXECUTE format('SELECT (%s)::boolean', rules->>'ready_check') INTO ok;
                msg := 'readiness check returned ' || coalesce(ok::text, 'NULL');
            END IF;
            IF ok AND rules->>'ready_watermark' IS NOT NULL THEN
                EXECUTE format('SELECT (%s)::text', rules->>'ready_watermark') INTO wm;
                evaluated := true;
            END IF;
            PERFORM tide._seal_end(seal);
        END IF;
    EXCEPTION WHEN query_canceled OR others THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
        PERFORM tide._seal_abort(seal);
        ok := false;
        evaluated := false;
        msg := format('readiness check failed (%s): %s', st, tide._clip(msg, 2000));
    END;
    IF evaluated THEN
        -- Ready once the watermark has kept one non-NULL value for watermark_stable_for; every
        -- evaluation is recorded on the run (the latest 20), each change in its history.
        wm := tide._clip(wm, 200);
        stable_for := (rules->>'watermark_stable_for')::interval;
        since := CASE WHEN wm IS NOT NULL AND r.watermark->>'value' = wm THEN (r.watermark->>'since')::timestamptz
                      ELSE now() END;
        SELECT jsonb_build_object('value', wm, 'since', since,
                                  'checks', coalesce(jsonb_agg(c.ev ORDER BY c.n), '[]'))
          INTO recorded
          FROM (SELECT x.ev, x.n, count(*) OVER () AS total
                  FROM jsonb_array_elements(coalesce(r.watermark->'checks', '[]')
                                            || jsonb_build_array(jsonb_build_object('at', now(), 'value', wm)))
                       WITH ORDINALITY AS x(ev, n)) c
         WHERE c.n > c.total - 20;
        IF wm IS NULL THEN
            ok := false;
            msg := 'the watermark is NULL';
        ELSIF now() - since >= stable_for THEN
            ok := true;
            msg := format('watermark %s unchanged since %s (%s)', wm, since, stable_for);
        ELSE
            ok := false;
            msg := format('watermark %s unchanged since %s; ready once unchanged for %s', wm, since, stable_for);
            next_check := since + stable_for;
        END IF;
    END IF;
    PERFORM set_config('lock_timeout', '5s', true);
    IF ok THEN
        UPDATE tide.run SET state = 'ready', run_after = NULL, updated_at = now(),
                            watermark = coalesce(recorded, watermark),
                            reason = CASE WHEN evaluated THEN 'ready: ' || msg ELSE 'ready: readiness check passed' END
         WHERE run_id = p_run_id;
    ELSE
        UPDATE tide.run SET run_after = least(now() + (rules->>'recheck_interval')::interval, next_check),
                            updated_at = now(),
                            watermark = coalesce(recorded, watermark),
                            last_error = CASE WHEN st IS NOT NULL THEN msg ELSE last_error END,
                            reason = 'waiting: ' || msg
         WHERE run_id = p_run_id;
    END IF;
    RETURN coalesce(ok, false);
END
$$;
COMMENT ON FUNCTION tide._check_ready(bigint) IS
    'Internal: evaluates a waiting run''s readiness check and watermark, sealed as the task owner (called by pg_tide executors).';

-- The next waiting run whose readiness check is due; locked until the caller's transaction ends.
-- PL/pgSQL, so that its plan is kept: the executors ask before every run they claim, and an SQL
-- function was planned again each time (a sixth of an executor's time per no-op run).
CREATE FUNCTION tide._claim_check()
RETURNS TABLE (run_id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT r.run_id
      FROM tide.run r
     WHERE r.run_id IN (SELECT p.run_id FROM tide.pending p
                         WHERE p.state = 'waiting' AND (p.due_at IS NULL OR p.due_at <= now()))
       AND r.state = 'waiting'
       -- The rules of each waiting run, looked up by key (a subquery per run, never joined):
       -- joined, the planner could merge the few waiting runs with every task's rule versions,
       -- reading all of them (10,000 tasks: 11-20 ms per probe, before every run's pickup).
       AND (SELECT v.rules->>'ready_check' IS NOT NULL OR v.rules->>'ready_watermark' IS NOT NULL
              FROM tide.task_version v WHERE v.task_id = r.task_id AND v.version = r.version)
       -- Due, on the run itself too: two executors woken at the same instant both find the run
       -- due in tide.pending; when the first has checked it and committed before the second
       -- locks it, the lock re-reads the run (not tide.pending) and must see it is no longer due,
       -- or the second evaluates it again at once.
       AND (r.run_after IS NULL OR r.run_after <= now())
     ORDER BY r.run_after NULLS FIRST, r.run_id
     LIMIT 1
       FOR UPDATE OF r SKIP LOCKED;
END
$$;
COMMENT ON FUNCTION tide._claim_check() IS
    'Internal: the next waiting run whose readiness check is due (for pg_tide executors).';

-- tide.pending's statistics, made again when it holds far more runs than the catalog says (a
-- bulk enqueue after a quiet spell). Sessions keep the plans of their claims, probes and
-- completions, made from the catalog's figures: made while the table was vacuumed empty, they
-- scan it whole for each run. ANALYZE changes the figures, and every session plans again.
-- Autovacuum would too, but only at its next round (autovacuum_naptime, a minute by default).
-- The tick asks at each of its rounds (at most pg_tide.tick_interval apart). The live count is the
-- statistics system's, as of the last commits it has been told of (within about a second).
CREATE FUNCTION tide._pending_stats() RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    known real;
BEGIN
    SELECT c.reltuples INTO known FROM pg_class c WHERE c.oid = 'tide.pending'::regclass;
    IF pg_stat_get_live_tuples('tide.pending'::regclass) <= 4 * greatest(known, 0) + 1000 THEN
        RETURN false;
    END IF;
    -- Never waits: while autovacuum (or another caller) works on the table, the next round asks
    -- again. (SKIP_LOCKED alone would log a warning each time it skips.)
    IF EXISTS (SELECT 1 FROM pg_locks l
                WHERE l.locktype = 'relation' AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
                  AND l.relation = 'tide.pending'::regclass AND l.mode = 'ShareUpdateExclusiveLock') THEN
        RETURN false;
    END IF;
    ANALYZE (SKIP_LOCKED) tide.pending;
    RETURN true;
END
$$;
COMMENT ON FUNCTION tide._pending_stats() IS
    'Internal: analyzes tide.pending when it holds over four times the runs (and 1,000 more) the catalog says, so that kept plans are made again (called by the tick). True when it asked.';

CREATE FUNCTION tide.mark_ready(dataset text, biz_date date, details jsonb DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    released integer;
    caller name := tide._caller();
BEGIN
    PERFORM tide._text_arg('dataset', mark_ready.dataset, 200,
                           'for example: SELECT tide.mark_ready(''orders'', DATE ''2026-11-28'')');
    PERFORM tide._date_arg('biz_date', mark_ready.biz_date);
    PERFORM tide._jsonb_arg('details', mark_ready.details, 65536);
    INSERT INTO tide.ready_marker AS m (owner, dataset, biz_date, details, marked_by)
    VALUES (caller, mark_ready.dataset, mark_ready.biz_date, mark_ready.details, caller)
    ON CONFLICT ON CONSTRAINT ready_marker_pkey DO UPDATE
       SET marked_at = now(), marked_by = EXCLUDED.marked_by, details = coalesce(EXCLUDED.details, m.details);
    -- Runs that only wait for this marker are ready now; runs with a check are re-checked now.
    WITH waiting AS (
        SELECT r.run_id, v.rules->>'ready_check' IS NULL AND v.rules->>'ready_watermark' IS NULL AS marker_only
          FROM tide.run r JOIN tide.task_version v ON v.task_id = r.task_id AND v.version = r.version
         WHERE r.run_id IN (SELECT p.run_id FROM tide.pending p WHERE p.state = 'waiting' AND p.owner = caller)
           AND r.state = 'waiting' AND r.biz_date = mark_ready.biz_date AND r.owner = caller
           AND v.rules->>'ready_dataset' = mark_ready.dataset
           FOR UPDATE OF r
    )
    UPDATE tide.run r
       SET state = CASE WHEN w.marker_only THEN 'ready' ELSE 'waiting' END::tide.run_state,
           run_after = NULL, updated_at = now(),
           reason = CASE WHEN w.marker_only THEN format('ready: %s marked ready for %s', mark_ready.dataset, mark_ready.biz_date)
                         ELSE r.reason END
      FROM waiting w WHERE r.run_id = w.run_id;
    GET DIAGNOSTICS released = ROW_COUNT;
    IF released > 0 THEN
        -- Ready runs wake the executors through the run trigger; the re-checks are theirs too.
        PERFORM tide._wake(false);
    END IF;
    RETURN released;
END
$$;
COMMENT ON FUNCTION tide.mark_ready(text, date, jsonb) IS
    'mark_ready(dataset, biz_date, details => NULL): records that one of the caller''s datasets is complete for a business date; runs of the caller''s tasks waiting for it become ready. Returns how many runs it released.';

-- Who runs a run of a task with this command: pg_tide's SQL executors, or external workers.
-- (STABLE, as the enum cast in it is: so it is inlined where runs are created.)
-- Inlined into its callers (on the hot paths of claims, emits and the tick), so it has no SET
-- clause, which would forbid inlining: its body names everything with its schema instead, so it
-- is safe under any search_path (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._executor_of(command text) RETURNS tide.executor
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN command IS NULL THEN 'external' ELSE 'sql' END::tide.executor $$;
COMMENT ON FUNCTION tide._executor_of(text) IS 'Internal: sql when the rules have a command, else external.';

-- Who runs a run under its rules: a window run of an event task with a fallback is its scan,
-- run by pg_tide's executors even when the task's event runs go to external workers.
-- Inlined into its callers, so it has no SET clause, which would forbid inlining: its body
-- names everything with its schema instead, so it is safe under any search_path
-- (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._run_executor(p_rules jsonb, p_window boolean) RETURNS tide.executor
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT tide._executor_of(CASE WHEN p_window
                                  THEN coalesce(p_rules OPERATOR(pg_catalog.->>) 'command',
                                                p_rules OPERATOR(pg_catalog.->>) 'fallback')
                                  ELSE p_rules OPERATOR(pg_catalog.->>) 'command' END)
$$;
COMMENT ON FUNCTION tide._run_executor(jsonb, boolean) IS
    'Internal: who runs a run under its rules (a window run of a task with a fallback is its scan, run by the executors).';

-- The state a (re)opened run starts in: waiting when its rules declare readiness.
-- Inlined into its callers (on the hot paths of claims, emits and the tick), so it has no SET
-- clause, which would forbid inlining: its body names everything with its schema instead, so it
-- is safe under any search_path (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._open_state(rules jsonb) RETURNS tide.run_state
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN rules OPERATOR(pg_catalog.->>) 'ready_dataset' IS NOT NULL
                  OR rules OPERATOR(pg_catalog.->>) 'ready_check' IS NOT NULL
                  OR rules OPERATOR(pg_catalog.->>) 'ready_watermark' IS NOT NULL
                THEN 'waiting' ELSE 'ready' END::tide.run_state
$$;
COMMENT ON FUNCTION tide._open_state(jsonb) IS 'Internal: waiting if the rules declare readiness, else ready.';

-- Reopens a finished run: the shared path of tide.replay_run, tide.rerun and tide.resolve_run.
CREATE FUNCTION tide._reopen(p_run_id bigint, p_trigger tide.run_trigger, p_version text, p_force boolean,
                             p_function text, p_queue text DEFAULT NULL, p_why text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
    t tide.task;
    use_version integer;
    rules jsonb;
BEGIN
    SELECT * INTO r FROM tide.run x WHERE x.run_id = p_run_id AND tide._may_act(x.owner) FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % does not exist', p_run_id USING ERRCODE = 'undefined_object',
            HINT = 'find runs with: SELECT run_id, state, biz_date FROM tide.run WHERE task_id = ...';
    END IF;
    SELECT * INTO t FROM tide.task WHERE task_id = r.task_id;
    IF r.state IN ('waiting', 'ready', 'running', 'retry', 'held', 'paused') THEN
        RAISE NOTICE 'run % is already % (%); nothing to reopen', r.run_id, r.state, r.reason;
        RETURN r.run_id;
    END IF;
    IF r.state = 'succeeded' AND NOT coalesce(p_force, false) THEN
        RAISE EXCEPTION 'run % of task % (business date %) already succeeded', r.run_id, t.name, coalesce(r.biz_date::text, r.dedupe_key)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('running it again could write its data twice; if that is intended, call %s(..., force => true)', p_function);
    END IF;
    IF p_version IS NULL THEN
        IF r.version <> t.version THEN
            RAISE EXCEPTION 'the rules of task % changed since run % was created (version % then, % now)', t.name, r.run_id, r.version, t.version
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = format('choose explicitly: %s(..., version => ''original'') or version => ''current''', p_function);
        END IF;
        use_version := r.version;
    ELSIF length(p_version) > 20 THEN
        RAISE EXCEPTION 'unknown version "%"', left(p_version, 20) USING ERRCODE = 'invalid_parameter_value',
            HINT = 'use version => ''original'' (the rules the run was created under) or ''current''';
    ELSIF lower(p_version) = 'original' THEN
        use_version := r.version;
    ELSIF lower(p_version) = 'current' THEN
        use_version := t.version;
    ELSE
        RAISE EXCEPTION 'unknown version "%"', p_version USING ERRCODE = 'invalid_parameter_value',
            HINT = 'use version => ''original'' (the rules the run was created under) or ''current''';
    END IF;
    IF t.source_retention IS NOT NULL AND r.window_start < now() - t.source_retention THEN
        RAISE EXCEPTION 'the window of run % starts at %, beyond the task''s source_retention of %', r.run_id, r.window_start, t.source_retention
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'the source no longer has this data; if it was restored, raise source_retention with tide.alter first';
    END IF;
    SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = r.task_id AND v.version = use_version;
    UPDATE tide.run
       SET state = tide._open_state(rules),
           trigger = p_trigger,
           version = use_version,
           args = CASE WHEN use_version = r.version THEN r.args ELSE rules->'args' END,
           queue = coalesce(p_queue, rules->>'queue'),
           priority = (rules->>'priority')::integer - CASE WHEN p_trigger = 'backfill' THEN 10000 ELSE 0 END,
           executor = tide._run_executor(rules, r.window_start IS NOT NULL),
           skip_reason = NULL, covered_by = NULL, tries = 0, deferrals = 0,
           run_after = NULL, ready_deadline = NULL, finished_at = NULL, lease_expires_at = NULL,
           control = NULL, watermark = NULL, updated_at = now(),
           reason = coalesce(p_why,
                             format('%s by %s (from %s%s, version %s)', p_trigger, current_user, r.state,
                                    CASE WHEN r.state = 'succeeded' THEN ', forced' ELSE '' END, use_version))
     WHERE run_id = r.run_id;
    PERFORM tide._regate(ARRAY[r.run_id]);
    RETURN r.run_id;
END
$$;
COMMENT ON FUNCTION tide._reopen(bigint, tide.run_trigger, text, boolean, text, text, text) IS
    'Internal: reopens a finished run (the shared path of replay, rerun, resolve and backfill; a backfill''s run goes to its queue, below every online run).';

CREATE FUNCTION tide.replay_run(run_id bigint, version text DEFAULT NULL, force boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF replay_run.run_id IS NULL THEN
        RAISE EXCEPTION 'run_id must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'pick one from tide.dead_letter';
    END IF;
    RETURN tide._reopen(replay_run.run_id, 'replay', replay_run.version, replay_run.force, 'tide.replay_run');
END
$$;
COMMENT ON FUNCTION tide.replay_run(bigint, text, boolean) IS
    'replay_run(run_id, version => ''original''|''current'', force => false): puts a dead, need_check, cancelled or skipped run back in line through the normal path. A succeeded run needs force => true. When the task''s rules changed since the run, version must be chosen.';

CREATE FUNCTION tide._rerun(p_task_id bigint, p_fire timestamptz, p_start timestamptz, p_end timestamptz,
                            p_biz_date date, p_version text, p_force boolean, p_function text,
                            p_trigger tide.run_trigger DEFAULT 'manual', p_queue text DEFAULT NULL,
                            p_why text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t tide.task;
    id bigint;
BEGIN
    -- KEY SHARE: the task cannot be deleted under its new run (tide.run has no foreign key).
    SELECT * INTO t FROM tide.task x WHERE x.task_id = p_task_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task % does not exist', p_task_id USING ERRCODE = 'undefined_object',
            HINT = 'it was deleted meanwhile; list your tasks with: SELECT name FROM tide.task';
    END IF;
    IF t.source_retention IS NOT NULL AND p_start < now() - t.source_retention THEN
        RAISE EXCEPTION 'business date % of task % is beyond its source_retention of %', p_biz_date, t.name, t.source_retention
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'the source no longer has this data; if it was restored, raise source_retention with tide.alter first';
    END IF;
    SELECT r.run_id INTO id FROM tide.run r WHERE r.task_id = p_task_id AND r.window_start = p_start;
    IF id IS NULL AND NOT coalesce(p_force, false) AND tide._succeeded_before(p_task_id, p_start) THEN
        -- R4.6: its run was pruned, its success is remembered.
        RAISE EXCEPTION 'the window of task % on business date % already succeeded (its run was pruned by history_retention)', t.name, p_biz_date
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('running it again could write its data twice; if that is intended, call %s(..., force => true)', p_function);
    END IF;
    INSERT INTO tide.run (task_id, trigger, fire_at, window_start, window_end, biz_date, version, state, reason,
                          executor, queue, priority, args, owner)
    SELECT t.task_id, p_trigger, p_fire, p_start, p_end, p_biz_date, t.version, tide._open_state(tide._task_rules(t)),
           coalesce(p_why, format('%s by %s', CASE WHEN p_trigger = 'manual' THEN 'manual rerun' ELSE p_trigger::text END, tide._caller())),
           tide._run_executor(tide._task_rules(t), true),
           coalesce(p_queue, t.queue), t.priority - CASE WHEN p_trigger = 'backfill' THEN 10000 ELSE 0 END, t.args, t.owner
    ON CONFLICT (task_id, window_start) WHERE window_start IS NOT NULL DO NOTHING
    RETURNING run_id INTO id;
    IF id IS NOT NULL THEN
        PERFORM tide._record_created(ARRAY[id]);
        RETURN id;
    END IF;
    SELECT r.run_id INTO id FROM tide.run r WHERE r.task_id = p_task_id AND r.window_start = p_start;
    RETURN tide._reopen(id, p_trigger, p_version, p_force, p_function, p_queue, p_why);
END
$$;
COMMENT ON FUNCTION tide._rerun(bigint, timestamptz, timestamptz, timestamptz, date, text, boolean, text, tide.run_trigger, text, text) IS
    'Internal: creates or reopens the run of one window (tide.rerun, tide.run_now and backfills after the window is computed; p_function names the caller in errors; a backfill''s run goes to its queue, below every online run).';

-- Deferred window scan (R11.2), at a fire of a task with rescan_previous (the tick calls it for
-- those only): the run of the window before p_start is reopened if it ended dead because it was
-- not ready or ran out of transient retries, once per run (a second death stays dead). Returns
-- the run reopened, or NULL.
CREATE FUNCTION tide._rescan_previous(p_task_id bigint, p_start timestamptz, p_fire timestamptz) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    prev tide.run;
BEGIN
    SELECT * INTO prev FROM tide.run r
     WHERE r.task_id = p_task_id AND r.window_start < p_start
     ORDER BY r.window_start DESC LIMIT 1;
    IF NOT FOUND OR prev.state <> 'dead' OR prev.last_error_kind NOT IN ('not_ready', 'transient')
       OR EXISTS (SELECT 1 FROM tide.run_event e WHERE e.run_id = prev.run_id AND e.reason LIKE 'deferred window scan:%') THEN
        RETURN NULL;
    END IF;
    RETURN tide._reopen(prev.run_id, 'catch_up', 'original', false, 'tide.tick', NULL,
                        format('deferred window scan: reopened by the fire at %s (it ended dead, %s: %s)', p_fire,
                               prev.last_error_kind, tide._clip(prev.last_error, 200)));
END
$$;
COMMENT ON FUNCTION tide._rescan_previous(bigint, timestamptz, timestamptz) IS
    'Internal: the deferred window scan of a task with rescan_previous: reopens the previous window''s run once if it ended dead not ready or out of transient retries.';

CREATE FUNCTION tide.resolve_run(run_id bigint, decision text) RETURNS tide.run_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
BEGIN
    SELECT * INTO r FROM tide.run x WHERE x.run_id = resolve_run.run_id AND tide._may_act(x.owner) FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % does not exist', resolve_run.run_id USING ERRCODE = 'undefined_object',
            HINT = 'runs waiting for a decision: SELECT run_id FROM tide.run WHERE state = ''need_check''';
    END IF;
    IF r.state <> 'need_check' THEN
        RAISE EXCEPTION 'run % is %, not need_check', r.run_id, r.state USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'tide.resolve_run settles runs that completed short (actual < expected); use tide.replay_run for other runs';
    END IF;
    CASE lower(coalesce(resolve_run.decision, ''))
    WHEN 'accept' THEN
        UPDATE tide.run x SET state = 'succeeded', updated_at = now(),
               reason = format('accepted by %s: expected %s, actual %s', tide._caller(), x.expected, x.actual)
         WHERE x.run_id = r.run_id;
    WHEN 'replay' THEN
        PERFORM tide._reopen(r.run_id, 'replay', 'original', false, 'tide.resolve_run');
    ELSE
        RAISE EXCEPTION 'unknown decision "%"', left(resolve_run.decision, 20) USING ERRCODE = 'invalid_parameter_value',
            HINT = 'use ''accept'' (the short count is right) or ''replay'' (run it again)';
    END CASE;
    RETURN (SELECT x.state FROM tide.run x WHERE x.run_id = r.run_id);
END
$$;
COMMENT ON FUNCTION tide.resolve_run(bigint, text) IS
    'resolve_run(run_id, ''accept''|''replay''): settles a need_check run: accept its short count as succeeded, or replay it.';

-- Unstarted runs of a task whose rules just changed (called by tide.alter).
CREATE FUNCTION tide._apply_pending(p_task_id bigint, p_version integer, p_mode text) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
    ids bigint[];
    rules jsonb;
BEGIN
    SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = p_task_id AND v.version = p_version;
    IF p_mode = 'keep' THEN
        RETURN 0;
    ELSIF p_mode = 'adopt' THEN
        WITH adopted AS (
            UPDATE tide.run r
               SET version = p_version, args = rules->'args', queue = rules->>'queue',
                   priority = (rules->>'priority')::integer,
                   executor = tide._run_executor(rules, r.window_start IS NOT NULL),
                   updated_at = now(),
                   reason = format('%s; adopted rule version %s', r.reason, p_version)
             WHERE r.run_id IN (SELECT p.run_id FROM tide.pending p
                                 WHERE p.task_id = p_task_id AND p.state IN ('waiting', 'ready', 'retry', 'held', 'paused'))
               AND r.version <> p_version
            RETURNING r.run_id)
        SELECT array_agg(a.run_id) INTO ids FROM adopted a;
        PERFORM tide._regate(ids);
        RETURN coalesce(cardinality(ids), 0);
    ELSE
        UPDATE tide.run r
           SET state = 'held', updated_at = now(),
               reason = format('held: rules changed to version %s; confirm with tide.confirm', p_version)
         WHERE r.run_id IN (SELECT p.run_id FROM tide.pending p
                             WHERE p.task_id = p_task_id AND p.state IN ('waiting', 'ready', 'retry', 'paused'))
           AND r.version <> p_version;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._apply_pending(bigint, integer, text) IS
    'Internal: applies tide.alter''s pending => adopt | keep | hold to a task''s unstarted runs.';

CREATE FUNCTION tide.confirm(task text, version integer) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t tide.task;
    rules jsonb;
    ids bigint[];
BEGIN
    PERFORM tide._text_arg('task', confirm.task, 200, 'pass the name of one of your tasks');
    SELECT * INTO t FROM tide.task x WHERE x.name = confirm.task AND x.owner = tide._caller();
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task "%" does not exist', confirm.task USING ERRCODE = 'undefined_object',
            HINT = 'list your tasks with: SELECT name FROM tide.task';
    END IF;
    SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = t.task_id AND v.version = confirm.version;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task % has no rule version %', confirm.task, coalesce(confirm.version::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = format('versions are 1 to %s; see tide.task_version', t.version);
    END IF;
    WITH confirmed AS (
        UPDATE tide.run r
           SET state = tide._open_state(rules), version = confirm.version,
               args = CASE WHEN r.version = confirm.version THEN r.args ELSE rules->'args' END,
               queue = rules->>'queue', priority = (rules->>'priority')::integer,
               executor = tide._run_executor(rules, r.window_start IS NOT NULL),
               run_after = NULL, updated_at = now(),
               reason = format('confirmed by %s under rule version %s', tide._caller(), confirm.version)
         WHERE r.run_id IN (SELECT p.run_id FROM tide.pending p WHERE p.task_id = t.task_id AND p.state = 'held')
        RETURNING r.run_id)
    SELECT array_agg(c.run_id) INTO ids FROM confirmed c;
    PERFORM tide._regate(ids);
    RETURN coalesce(cardinality(ids), 0);
END
$$;
COMMENT ON FUNCTION tide.confirm(text, integer) IS
    'confirm(task, version): releases the task''s held runs to run under the given rule version; returns how many.';

CREATE FUNCTION tide._cancel_waiting(p_run_id bigint, p_reason text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_reason IS NOT NULL THEN
        PERFORM tide._text_arg('reason', p_reason, 1000, 'say in a sentence why the run is cancelled');
    END IF;
    UPDATE tide.run r
       SET state = 'cancelled', finished_at = now(), updated_at = now(), lease_expires_at = NULL,
           reason = format('cancelled by %s%s', tide._caller(), coalesce(': ' || p_reason, ''))
     WHERE r.run_id = p_run_id AND r.state IN ('waiting', 'ready', 'retry', 'held', 'paused')
       AND tide._may_act(r.owner);
    IF FOUND THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM tide.run r WHERE r.run_id = p_run_id AND tide._may_act(r.owner)) THEN
        RAISE EXCEPTION 'run % does not exist', p_run_id USING ERRCODE = 'undefined_object',
            HINT = 'see SELECT run_id, state FROM tide.run';
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION tide._cancel_waiting(bigint, text) IS
    'Internal (tide.cancel_run): cancels a run that has not started (waiting, ready, retry, held, paused); false if it is running or finished.';

-- The tick's work on existing runs, all at the instant p_now. Each step works on the rows it
-- can lock at once (SKIP LOCKED: a run held by a role's open transaction waits for the next
-- tick) and runs in its own subtransaction, so a step that fails is logged and the others go
-- on.
CREATE FUNCTION tide._tick_runs(p_now timestamptz) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    counts jsonb := '{}';
    step text;
    n integer;
BEGIN
    FOREACH step IN ARRAY ARRAY['unparked', 'retried', 'executor_gone', 'taken_back', 'released',
                                'not_ready_deadline', 'effects_taken_back', 'backfills',
                                'analyzed'] LOOP
        BEGIN
            n := tide._tick_step(step, p_now);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'pg_tide: tick step % failed: %', step, SQLERRM;
            n := 0;
        END;
        counts := counts || jsonb_build_object(step, n);
    END LOOP;
    RETURN counts - 'unparked' - 'analyzed';
END
$$;
COMMENT ON FUNCTION tide._tick_runs(timestamptz) IS
    'Internal: the tick''s work on existing runs: due retries, runs whose executor is gone, expired leases, readiness releases and deadlines, backfills; each step isolated from the others.';

-- One step of tide._tick_runs; returns how many runs it moved.
CREATE FUNCTION tide._tick_step(p_step text, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer := 0;
    rec record;
    rules jsonb;
    next_deadline timestamptz;
BEGIN
    CASE p_step
    WHEN 'unparked' THEN
        -- Parked runs whose wait is over are looked at by claims again (a wake-up may have been
        -- lost: the run they waited for was deleted, say).
        UPDATE tide.pending p SET parked = false, due_at = NULL
         WHERE p.run_id IN (SELECT q.run_id FROM tide.pending q WHERE q.parked AND q.due_at <= p_now
                               FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS n = ROW_COUNT;
    WHEN 'retried' THEN
        -- Backoff passed: retries are ready again.
        UPDATE tide.run r SET state = 'ready', run_after = NULL, updated_at = now(),
                              reason = format('retry due (attempt %s next)', r.tries + 1)
         WHERE r.run_id IN (SELECT x.run_id FROM tide.run x
                             WHERE x.run_id IN (SELECT p.run_id FROM tide.pending p
                                                 WHERE p.state = 'retry' AND p.due_at <= p_now)
                               AND x.state = 'retry'
                               FOR UPDATE SKIP LOCKED);
        GET DIAGNOSTICS n = ROW_COUNT;
    WHEN 'executor_gone' THEN
        -- SQL runs whose executor process is gone (killed, terminated, or the server restarted):
        -- the server knows which backends live, so the attempt is lost now, not at its lease's
        -- end. (A backend's pid and start time name it; pids are reused.) The status of the
        -- backends is read after the runs' snapshot is taken, so a run claimed by an executor
        -- that started since cannot look orphaned.
        PERFORM pg_stat_clear_snapshot();
        FOR rec IN SELECT x.run_id, x.lease_owner, x.executor_pid FROM tide.run x
                  WHERE x.run_id IN (SELECT p.run_id FROM tide.pending p WHERE p.state = 'running')
                    AND x.state = 'running' AND x.executor_pid IS NOT NULL
                    -- A run whose command a worker of its own runs outlives its executor.
                    AND x.run_id <> ALL (tide._command_runs())
                    AND (x.claimed_at < pg_postmaster_start_time()
                         OR NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(x.executor_pid) a
                                         WHERE a.backend_start = x.executor_start))
                  ORDER BY x.run_id FOR UPDATE OF x SKIP LOCKED LOOP
            PERFORM tide._fail(rec.run_id,
                               format('%s (pid %s) is gone: it was terminated, crashed or the server restarted',
                                      coalesce(rec.lease_owner, 'its executor'), rec.executor_pid),
                               'transient', NULL, 'lost', p_now);
            n := n + 1;
        END LOOP;
    WHEN 'taken_back' THEN
        -- Leases that expired: the attempt is lost and counts; the run retries or goes dead.
        FOR rec IN SELECT x.run_id, x.lease_owner, x.lease_token FROM tide.run x
                  WHERE x.run_id IN (SELECT p.run_id FROM tide.pending p WHERE p.state = 'running')
                    AND x.state = 'running' AND x.lease_expires_at < p_now
                    AND x.run_id <> ALL (tide._command_runs())
                  ORDER BY x.lease_expires_at FOR UPDATE OF x SKIP LOCKED LOOP
            PERFORM tide._fail(rec.run_id, format('lease of %s (token %s) expired', coalesce(rec.lease_owner, 'a worker'), rec.lease_token),
                               'transient', NULL, 'lost', p_now);
            n := n + 1;
        END LOOP;
    WHEN 'released' THEN
        -- Waiting runs without an SQL check: released by their marker, or by time when they
        -- only waited for the next window. Runs with a check are released by the executors.
        UPDATE tide.run r
           SET state = 'ready', run_after = NULL, updated_at = now(),
               reason = CASE WHEN v.rules->>'ready_dataset' IS NOT NULL
                             THEN format('ready: %s marked ready for %s', v.rules->>'ready_dataset', r.biz_date)
                             ELSE 'ready: next window reached' END
          FROM tide.task_version v
         WHERE r.run_id IN (SELECT x.run_id FROM tide.run x
                              JOIN tide.task_version w ON w.task_id = x.task_id AND w.version = x.version
                             WHERE x.run_id IN (SELECT p.run_id FROM tide.pending p WHERE p.state = 'waiting')
                               AND x.state = 'waiting'
                               -- A run a worker reported not ready waits for its next window
                               -- even if its marker is set.
                               AND (x.run_after IS NULL OR x.run_after <= p_now)
                               -- Only these are locked: a run with a check locked here was
                               -- skipped by an executor woken to check it, which then slept.
                               AND w.rules->>'ready_check' IS NULL AND w.rules->>'ready_watermark' IS NULL
                               FOR UPDATE OF x SKIP LOCKED)
           AND v.task_id = r.task_id AND v.version = r.version
           AND v.rules->>'ready_check' IS NULL AND v.rules->>'ready_watermark' IS NULL
           AND (v.rules->>'ready_dataset' IS NULL
                OR EXISTS (SELECT 1 FROM tide.ready_marker m
                            WHERE m.owner = r.owner AND m.dataset = v.rules->>'ready_dataset'
                              AND m.biz_date = r.biz_date));
        GET DIAGNOSTICS n = ROW_COUNT;
    WHEN 'not_ready_deadline' THEN
        -- Still not ready at the deadline: the task's not_ready_policy decides.
        FOR rec IN SELECT x.run_id, x.task_id, x.version, x.deferrals, x.ready_deadline FROM tide.run x
                  WHERE x.run_id IN (SELECT p.run_id FROM tide.pending p WHERE p.state = 'waiting')
                    AND x.state = 'waiting' AND x.ready_deadline <= p_now
                  FOR UPDATE OF x SKIP LOCKED LOOP
            SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = rec.task_id AND v.version = rec.version;
            n := n + 1;
            IF rules->>'not_ready_policy' = 'skip' THEN
                UPDATE tide.run SET state = 'skipped', skip_reason = 'not_ready', finished_at = p_now, updated_at = now(),
                                    reason = format('skipped: not ready by %s', rec.ready_deadline)
                 WHERE run_id = rec.run_id;
            ELSIF rules->>'not_ready_policy' = 'fail' OR rec.deferrals + 1 >= (rules->>'max_attempts')::integer THEN
                UPDATE tide.run SET state = 'dead', finished_at = p_now, updated_at = now(), last_error_kind = 'not_ready',
                                    last_error = format('not ready by %s', rec.ready_deadline),
                                    reason = format('dead: not ready by %s (deferred %s times)', rec.ready_deadline, rec.deferrals)
                 WHERE run_id = rec.run_id;
            ELSE
                SELECT t.next_fire_at INTO next_deadline FROM tide.task t WHERE t.task_id = rec.task_id;
                next_deadline := greatest(coalesce(rec.ready_deadline + (rules->>'ready_timeout')::interval, next_deadline),
                                          p_now + (rules->>'recheck_interval')::interval);
                UPDATE tide.run SET deferrals = deferrals + 1, ready_deadline = next_deadline, updated_at = now(),
                                    reason = format('not ready by %s: deferred to the next window (until %s)', rec.ready_deadline, next_deadline)
                 WHERE run_id = rec.run_id;
            END IF;
        END LOOP;
    WHEN 'effects_taken_back' THEN
        n := tide._tick_effects(p_now);
    WHEN 'analyzed' THEN
        -- Fresh statistics for kept plans after a bulk enqueue (tide._pending_stats).
        n := tide._pending_stats()::integer;
    WHEN 'backfills' THEN
        -- Backfills move on: how their runs ended, the canary, the next batch (src/backfill/backfill.sql).
        n := tide._tick_backfills(p_now);
    END CASE;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._tick_step(text, timestamptz) IS
    'Internal: one step of the tick''s work on existing runs (see tide._tick_runs).';

-- The dead runs are found in tide.pending, which keeps every run that is dead until it is
-- replayed or resolved: tide.run has no index by state (its hot updates would no longer be
-- HOT), and reading it for its dead runs walked the whole history.
CREATE VIEW tide.dead_letter WITH (security_invoker = true) AS
SELECT r.run_id, t.name AS task, r.version, r.trigger, r.biz_date, r.window_start, r.window_end, r.dedupe_key,
       r.args, r.attempts, r.last_error_kind, r.last_error, r.finished_at AS died_at, r.reason,
       (SELECT jsonb_agg(jsonb_build_object('attempt', a.attempt, 'worker', a.worker, 'claimed_at', a.claimed_at,
                                            'finished_at', a.finished_at, 'outcome', a.outcome,
                                            'error_kind', a.error_kind, 'sqlstate', a.sqlstate, 'error', a.error)
                         ORDER BY a.attempt)
          FROM tide.attempt a WHERE a.run_id = r.run_id) AS attempt_errors,
       v.rules
  FROM tide.pending p
  JOIN tide.run r ON r.run_id = p.run_id
  JOIN tide.task t ON t.task_id = r.task_id
  JOIN tide.task_version v ON v.task_id = r.task_id AND v.version = r.version
 WHERE p.state = 'dead' AND r.state = 'dead';
COMMENT ON VIEW tide.dead_letter IS
    'Dead runs with their full context: task, rule version and rules, window, args, and every attempt''s error. Replay one with tide.replay_run(run_id).';
GRANT SELECT ON tide.dead_letter TO PUBLIC;

-- Milliseconds from now until an instant, for a worker's sleep: at most p_cap_ms; NULL (nothing
-- due) gives p_cap_ms. An instant already past (a task skipped by this tick: its row was locked)
-- gives 100 ms, not a busy loop; one a few ms past (reached while the caller worked), 1 ms.
CREATE FUNCTION tide._sleep_ms(p_at timestamptz, p_cap_ms integer) RETURNS integer
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    -- (Compared as numbers before the cast: a yearly task's next fire is billions of ms away.)
    SELECT CASE WHEN l.ms IS NULL THEN p_cap_ms
                WHEN l.ms > 0 THEN least(p_cap_ms::numeric, ceil(l.ms) + 1)::integer
                WHEN l.ms > -50 THEN 1
                ELSE least(p_cap_ms, 100) END
      FROM (SELECT extract(epoch FROM (p_at - clock_timestamp())) * 1000 AS ms) l
$$;
COMMENT ON FUNCTION tide._sleep_ms(timestamptz, integer) IS
    'Internal: milliseconds a worker may sleep until an instant, at most p_cap_ms (100 ms for an instant long past).';

-- How long the scheduler may sleep after a tick (ms, at most p_cap_ms): until the next fire of a
-- task or the next retry that comes due, so that it ticks on time rather than at its next poll.
CREATE FUNCTION tide._next_wake(p_cap_ms integer) RETURNS integer
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT tide._sleep_ms(
        least((SELECT min(greatest(f.next_fire_at, f.tick_retry_at))
                 FROM (SELECT t.next_fire_at, t.tick_retry_at FROM tide.task t
                        WHERE NOT t.paused AND t.next_fire_at IS NOT NULL
                        ORDER BY t.next_fire_at LIMIT 20) f),
              (SELECT min(p.due_at) FROM tide.pending p WHERE p.state = 'retry')),
        p_cap_ms)
$$;
COMMENT ON FUNCTION tide._next_wake(integer) IS
    'Internal: milliseconds the scheduler may sleep after a tick: until the next fire or due retry, at most p_cap_ms.';

-- How long an idle SQL executor may sleep (ms, at most p_cap_ms): until the next SQL run
-- enqueued for later comes due, or the next readiness re-check of a waiting run, so that both
-- start on time rather than at the executor's next poll. (Runs made ready now wake it at once,
-- src/scheduler/wake.rs.)
CREATE FUNCTION tide._executor_wake(p_cap_ms integer) RETURNS integer
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT tide._sleep_ms(
        least((SELECT min(p.due_at) FROM tide.pending p
                WHERE p.state = 'ready' AND p.due_at > now() AND NOT p.parked AND p.executor = 'sql'),
              (SELECT min(p.due_at) FROM tide.pending p WHERE p.state = 'waiting' AND p.due_at > now())),
        p_cap_ms)
$$;
COMMENT ON FUNCTION tide._executor_wake(integer) IS
    'Internal: milliseconds an idle SQL executor may sleep: until the next delayed SQL run or readiness re-check comes due, at most p_cap_ms.';

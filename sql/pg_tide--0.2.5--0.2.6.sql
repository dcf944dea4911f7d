-- pg_tide 0.2.5 to 0.2.6: one way to create a run and one way to record a change of one
-- (src/runs/record.sql). tide._create_runs creates the runs of every creator (the tick, emit,
-- enqueue, reruns and backfills, fallback scans, reconciliations' compensations) with their
-- first history rows, their lines in tide.pending and what they count; tide._write_history
-- writes every later history row with what it counts (claims, completions, failures, the trigger
-- run_changed). tide._record_created, which they replace, is dropped. A claim also reads its
-- queues' limits again with its candidates (a queue made or paused in the transaction that made
-- a candidate could be missed). The tick's steps on existing runs are a function each, called
-- from one list (tide._tick_runs).
-- Run by ALTER EXTENSION pg_tide UPDATE; the upgrade tier (pg_test/tests/upgrade.rs) checks that
-- the schema it leaves is the one a fresh CREATE EXTENSION makes. Changed functions are dropped
-- and created again (pgspot's PS002), but the trigger function tide._run_changed, which the
-- trigger run_changed on tide.run depends on: it is replaced in place, so that the update locks
-- no table while pg_tide's workers run.
\echo Use "ALTER EXTENSION pg_tide UPDATE TO '0.2.6'" to load this file. \quit
SET LOCAL search_path = pg_catalog, pg_temp;

-- The run to create and the change to record, as their callers hand them over.
CREATE TYPE tide.new_run AS (
    task_id        bigint,
    trigger        tide.run_trigger,
    version        integer,
    state          tide.run_state,
    reason         text,
    executor       tide.executor,
    queue          text,
    priority       integer,
    args           jsonb,
    owner          name,
    -- A window's run (the tick, a rerun, a backfill): its fire and window.
    fire_at        timestamptz,
    window_start   timestamptz,
    window_end     timestamptz,
    biz_date       date,
    -- Any other run: its idempotency key.
    dedupe_key     text,
    skip_reason    tide.skip_reason,
    run_after      timestamptz,
    ready_deadline timestamptz,
    -- An event run.
    topic          text,
    event_key      text,
    payload        jsonb,
    -- The gating (tide._gating_by), when the creator computed it; NULL: the insert trigger
    -- run_gating_insert computes it from the run's rule version.
    gate           text,
    lock_key       text,
    gated          boolean
);
COMMENT ON TYPE tide.new_run IS
    'Internal: a run to create, as a creator hands it to tide._create_runs.';

CREATE TYPE tide.run_change AS (
    run_id      bigint,
    task_id     bigint,
    owner       name,
    from_state  tide.run_state,
    to_state    tide.run_state,
    reason      text,
    -- NULL: now (clock_timestamp()).
    at          timestamptz,
    -- A change that ends an attempt: the attempt (NULL otherwise).
    attempt     integer,
    worker      text,
    lease_token bigint,
    -- When the run was claimed (recorded with an attempt's end; counted for a success).
    claimed_at  timestamptz,
    outcome     tide.attempt_outcome,
    error_kind  tide.error_kind,
    sqlstate    text,
    error       text,
    -- The run after the change, as the counters read it.
    attempts    integer,
    finished_at timestamptz,
    started_at  timestamptz,
    fire_at     timestamptz,
    created_at  timestamptz
);
COMMENT ON TYPE tide.run_change IS
    'Internal: a history row to write, as a path that changes runs hands it to tide._write_history.';

-- The two writers.
CREATE FUNCTION tide._write_history(p_changes tide.run_change[], p_touch boolean) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- A generic plan always, as tide.emit's: a custom plan of this statement costs more to make
-- than to run (measured: one emit twice as long), and no JIT, whatever the batch.
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    WITH c AS MATERIALIZED (
        SELECT * FROM unnest(p_changes)
    ), history AS (
        INSERT INTO tide.run_event (run_id, from_state, to_state, reason, owner, at, attempt, worker, lease_token,
                                    claimed_at, outcome, error_kind, sqlstate, error)
        SELECT c.run_id, c.from_state, c.to_state, c.reason, c.owner, coalesce(c.at, clock_timestamp()), c.attempt,
               c.worker, c.lease_token, CASE WHEN c.outcome IS NOT NULL THEN c.claimed_at END, c.outcome,
               c.error_kind, c.sqlstate, c.error
          FROM c ORDER BY c.run_id
    ), touched AS (
        INSERT INTO tide.task_touch (task_id, owner) SELECT DISTINCT c.task_id, c.owner FROM c WHERE p_touch
    )
    INSERT INTO tide.count_delta (task_id, metric, label, value, owner)
    SELECT c.task_id, m.metric, m.label, sum(m.value), min(c.owner)
      FROM c
     CROSS JOIN LATERAL tide._counts_of(c.to_state, c.attempts, c.claimed_at, c.finished_at, c.started_at, c.fire_at,
                                        c.created_at) m
     -- Only the states that count (tide._counts_of): a run created waiting or ready, the bulk of
     -- what tide.emit and tide.enqueue write, is not looked at.
     WHERE c.from_state IS DISTINCT FROM c.to_state
       AND c.to_state IN ('running', 'retry', 'succeeded', 'need_check', 'dead', 'skipped', 'cancelled')
     GROUP BY 1, 2, 3;
END
$$;
COMMENT ON FUNCTION tide._write_history(tide.run_change[], boolean) IS
    'Internal: the one writer of run changes: writes their history rows (tide.run_event), what they count (tide.count_delta) and, with p_touch, their tasks for task health (tide.task_touch).';

CREATE FUNCTION tide._create_runs(p_runs tide.new_run[], p_fresh boolean) RETURNS bigint[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- A generic plan always, as tide.emit's: a custom plan of this statement costs more to make
-- than to run (measured: one emit twice as long), and no JIT, whatever the batch.
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    ids bigint[];
    queues text[];
    wake boolean;
    skipped bigint[];
BEGIN
    -- Only one of the two inserts has rows: ON CONFLICT costs a probe of the key's index and a
    -- speculative insertion per row (measured: 13% of a bulk enqueue of 20,000 runs).
    WITH input AS NOT MATERIALIZED (
        -- Written out once, inlined into the one of the two inserts that has rows.
        SELECT n.task_id, n.trigger, n.version, n.state, n.reason, n.executor, n.queue, coalesce(n.priority, 0),
               coalesce(n.args, '{}'), n.owner, n.fire_at, n.window_start, n.window_end, n.biz_date, n.dedupe_key,
               n.skip_reason, n.run_after, n.ready_deadline, CASE WHEN n.state = 'skipped' THEN now() END,
               n.topic, n.event_key, n.payload, n.gate, n.lock_key, n.gated
          FROM unnest(p_runs) n
    ), own AS (
        INSERT INTO tide.run (task_id, trigger, version, state, reason, executor, queue, priority, args, owner,
                              fire_at, window_start, window_end, biz_date, dedupe_key, skip_reason, run_after,
                              ready_deadline, finished_at, topic, event_key, payload, gate, lock_key, gated)
        SELECT * FROM input WHERE p_fresh
        RETURNING run_id, task_id, state, reason, owner, executor, queue, priority, run_after, gate, lock_key, gated,
                  finished_at, fire_at, created_at
    ), given AS (
        INSERT INTO tide.run (task_id, trigger, version, state, reason, executor, queue, priority, args, owner,
                              fire_at, window_start, window_end, biz_date, dedupe_key, skip_reason, run_after,
                              ready_deadline, finished_at, topic, event_key, payload, gate, lock_key, gated)
        SELECT * FROM input WHERE NOT p_fresh
        ON CONFLICT DO NOTHING
        RETURNING run_id, task_id, state, reason, owner, executor, queue, priority, run_after, gate, lock_key, gated,
                  finished_at, fire_at, created_at
    ), created AS MATERIALIZED (
        SELECT * FROM own UNION ALL SELECT * FROM given
    ), history AS (
        -- Each run's first history row, with the run: handed to tide._write_history, it cost a
        -- statement of its own (measured: a tenth of one tide.emit).
        INSERT INTO tide.run_event (run_id, from_state, to_state, reason, owner)
        SELECT c.run_id, NULL, c.state, c.reason, c.owner FROM created c ORDER BY c.run_id
    ), touched AS (
        INSERT INTO tide.task_touch (task_id, owner) SELECT DISTINCT c.task_id, c.owner FROM created c
    ), line AS (
        INSERT INTO tide.pending (run_id, task_id, state, executor, queue, priority, due_at, owner, gate, lock_key, gated)
        SELECT c.run_id, c.task_id, c.state, c.executor, c.queue, c.priority, c.run_after, c.owner, c.gate, c.lock_key,
               coalesce(c.gated, false)
          FROM created c
         WHERE c.state IN ('waiting', 'ready', 'running', 'retry', 'held', 'paused', 'dead', 'need_check')
    )
    SELECT array_agg(c.run_id ORDER BY c.run_id),
           array_agg(DISTINCT c.queue) FILTER (WHERE c.state = 'ready' AND c.run_after IS NULL),
           coalesce(bool_or((c.state = 'ready' AND c.executor = 'sql') OR c.state = 'waiting'), false),
           array_agg(c.run_id ORDER BY c.run_id) FILTER (WHERE c.state = 'skipped')
      INTO ids, queues, wake, skipped
      FROM created c;
    IF ids IS NULL THEN
        RETURN '{}';
    END IF;
    PERFORM tide._ready(queues);  -- waiting workers are notified after the commit (src/scheduler/wake.rs)
    IF wake THEN
        PERFORM tide._wake(false);  -- an idle executor claims at this commit, or sleeps until the run is due
    END IF;
    IF skipped IS NOT NULL THEN
        -- What runs created finished count (windows skipped at their fire, the tick's alone):
        -- tide._counts_of, as tide._write_history counts a change.
        INSERT INTO tide.count_delta (task_id, metric, label, value, owner)
        SELECT r.task_id, m.metric, m.label, sum(m.value), min(r.owner)
          FROM tide.run r
         CROSS JOIN LATERAL tide._counts_of(r.state, 0, NULL, r.finished_at, NULL, r.fire_at, r.created_at) m
         WHERE r.run_id = ANY (skipped)
         GROUP BY 1, 2, 3;
        PERFORM tide._log_runs('skip', skipped);
    END IF;
    RETURN ids;
END
$$;
COMMENT ON FUNCTION tide._create_runs(tide.new_run[], boolean) IS
    'Internal: the one way a run is created: inserts new runs (p_fresh: keys known to be new; otherwise a taken window or dedupe key creates nothing), writes their history, tide.pending lines and counts, and wakes their claimers; returns the ids created.';

-- The trigger of every other change of a run, replaced in place.
CREATE OR REPLACE FUNCTION tide._run_changed() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT tide._transition_allowed(OLD.state, NEW.state) THEN
        RAISE EXCEPTION 'run % cannot go from % to %', NEW.run_id, OLD.state, NEW.state
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'allowed changes are listed in tide.run_transition; see the README''s run lifecycle';
    END IF;
    IF OLD.state <> NEW.state OR OLD.reason IS DISTINCT FROM NEW.reason THEN
        -- By tide._write_history, with what it counts (an outcome reached, not a new reason in
        -- the same state). The task is noted by the statement trigger run_touched_update, except
        -- in a statement of the hot paths (tide.history = 'written').
        PERFORM tide._write_history(ARRAY[ROW(NEW.run_id, NEW.task_id, NEW.owner, OLD.state, NEW.state, NEW.reason,
                                              NULL, NULL, NULL, NULL, NEW.claimed_at, NULL, NULL, NULL, NULL,
                                              NEW.attempts, NEW.finished_at, NEW.started_at, NEW.fire_at,
                                              NEW.created_at)::tide.run_change],
                                    NOT tide._history_unwritten());
    END IF;
    PERFORM tide._sync_pending(NEW, OLD.state = 'running');
    IF NEW.state = 'skipped' AND OLD.state <> 'skipped' THEN
        PERFORM tide._log_runs('skip', ARRAY[NEW.run_id]);
    END IF;
    IF NEW.state = 'ready' AND OLD.state <> 'ready' THEN
        PERFORM tide._ready(ARRAY[NEW.queue]);
        IF NEW.executor = 'sql' THEN
            PERFORM tide._wake(false);  -- a retry, readiness, a replay: an executor claims at commit
        END IF;
    ELSIF NEW.state = 'waiting' AND OLD.state <> 'waiting' THEN
        PERFORM tide._wake(false);  -- an executor evaluates its readiness check when it is due
    ELSIF NEW.state = 'retry' AND OLD.state <> 'retry' THEN
        PERFORM tide._wake(true);  -- the scheduler sleeps until the retry is due, not its next poll
    END IF;
    RETURN NULL;
END
$$;

-- Their callers.
DROP FUNCTION tide._claim(tide.executor, text, text, integer, interval, boolean, bigint);
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

DROP FUNCTION tide.complete_run(bigint, bigint, jsonb, bigint, bigint);
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
    -- duration (tide._write_history).
    PERFORM tide._write_history(ARRAY[ROW(complete_run.run_id, task, who, 'running', done, why, NULL, attempt_no, worker,
                                          complete_run.lease_token, claimed,
                                          CASE WHEN short THEN 'need_check' ELSE 'succeeded' END,
                                          NULL, NULL, NULL, attempt_no, finished, NULL, NULL, NULL)::tide.run_change],
                                true);
    IF tide._log_on() THEN
        PERFORM tide._log_runs(CASE WHEN short THEN 'need_check' ELSE 'success' END, ARRAY[complete_run.run_id]);
    END IF;
    RETURN done;
END
$$;
COMMENT ON FUNCTION tide.complete_run(bigint, bigint, jsonb, bigint, bigint) IS
    'complete_run(run_id, lease_token, result => NULL, expected => NULL, actual => NULL): finishes a claimed run: succeeded, or need_check when actual < expected. A stale lease token is refused and nothing changes.';

DROP FUNCTION tide.complete_runs(bigint[], bigint[], jsonb[]);
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
    changes tide.run_change[];
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
    )
    SELECT array_agg(d.run_id), array_agg(d.run_id) FILTER (WHERE d.gated),
           (SELECT array_agg(e.owner) FROM ended e), (SELECT array_agg(e.queue) FROM ended e),
           (SELECT array_agg(e.n) FROM ended e),
           array_agg(ROW(d.run_id, d.task_id, d.owner, 'running', 'succeeded', d.reason, NULL, d.attempts, d.lease_owner,
                         d.lease_token, d.claimed_at, 'succeeded', NULL, NULL, NULL, d.attempts, d.finished_at, NULL, NULL,
                         NULL)::tide.run_change)
      INTO done_ids, gated_ids, ended_owners, ended_queues, ended_n, changes FROM done_run d;
    -- The history rows, and what they count: the tasks touched, the successes and their
    -- durations (tide._write_history).
    IF changes IS NOT NULL THEN
        PERFORM tide._write_history(changes, true);
    END IF;
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

DROP FUNCTION tide._fail(bigint, text, tide.error_kind, text, tide.attempt_outcome, timestamptz);
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
    -- The history row with the attempt it ends, and what it counts: the task touched, and a
    -- dead letter among the outcomes of tide.metrics() (tide._write_history). A retry has no
    -- finished_at: its failed attempt ended at p_now, the hour it counts in.
    PERFORM tide._write_history(ARRAY[ROW(p_run_id, r.task_id, r.owner, 'running', new_state, why, p_now, r.attempts,
                                          r.lease_owner, r.lease_token, coalesce(r.claimed_at, p_now), p_outcome, p_kind,
                                          p_sqlstate, error_text, changed.attempts,
                                          coalesce(changed.finished_at, p_now), changed.started_at, changed.fire_at,
                                          changed.created_at)::tide.run_change],
                                true);
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

DROP FUNCTION tide._emit(text, jsonb[], text[], text[], text);
CREATE FUNCTION tide._emit(p_topic text, p_payloads jsonb[], p_event_keys text[], p_dedupe_keys text[], p_function text)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT, whatever the backlog (see tide._claim).
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    n integer := coalesce(cardinality(p_payloads), 0);
    bad record;
    what text;
    made integer;
    -- A role's emit reaches the tasks of the roles it acts for (its own, its teams') and those
    -- whose owners granted it the topic (tide.grant('emit', ...)); a superuser's or
    -- tide_admin's, every role's.
    owners_ok name[] := tide._acts_for();
    g_owners name[];
    -- Whether any event has a dedupe key of the caller's (else every key is pg_tide's own).
    keyed boolean;
    checked boolean;
BEGIN
    checked := tide._check_topic(p_topic, p_function);  -- an assignment, not a PERFORM: see there
    IF array_ndims(p_payloads) > 1 OR array_ndims(p_event_keys) > 1 OR array_ndims(p_dedupe_keys) > 1 THEN
        what := CASE WHEN array_ndims(p_payloads) > 1 THEN 'payloads'
                     WHEN array_ndims(p_event_keys) > 1 THEN 'event_keys' ELSE 'dedupe_keys' END;
        RAISE EXCEPTION '%: % must be a one-dimensional array, got % dimensions', p_function, what,
            CASE what WHEN 'payloads' THEN array_ndims(p_payloads)
                      WHEN 'event_keys' THEN array_ndims(p_event_keys) ELSE array_ndims(p_dedupe_keys) END
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass one element per event, such as ARRAY[''k1'', ''k2'']';
    END IF;
    keyed := coalesce(cardinality(array_remove(p_dedupe_keys, NULL)) > 0, false);
    IF n > 100000 THEN
        RAISE EXCEPTION '%: % events in one call, at most 100000', p_function, n USING ERRCODE = 'invalid_parameter_value',
            HINT = 'emit in several calls of up to 100000 events';
    END IF;
    IF n > 1 THEN
        PERFORM tide._check_bulk(n, p_function);
    END IF;
    IF cardinality(p_event_keys) <> n OR cardinality(p_dedupe_keys) <> n THEN
        RAISE EXCEPTION '%: % has % elements and payloads %', p_function,
            CASE WHEN cardinality(p_event_keys) <> n THEN 'event_keys' ELSE 'dedupe_keys' END,
            CASE WHEN cardinality(p_event_keys) <> n THEN cardinality(p_event_keys) ELSE cardinality(p_dedupe_keys) END, n
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'give one key per payload (NULL for none), or leave the keys out';
    END IF;
    IF n = 0 THEN
        RETURN 0;
    END IF;
    -- The first bad element, if any, in one pass (for one event, only when it may be bad: its
    -- test is a plain expression, the scan a statement of its own, a tenth of one tide.emit).
    IF n > 1 OR length(p_event_keys[1]) > 1000 OR length(p_dedupe_keys[1]) > 1000 OR p_event_keys[1] = ''
       OR p_dedupe_keys[1] = '' OR p_dedupe_keys[1] LIKE '#%' OR pg_column_size(p_payloads[1]) > 1048576 THEN
        SELECT e.i, e.p, e.ek, e.dk INTO bad
          FROM unnest(p_payloads, p_event_keys, p_dedupe_keys) WITH ORDINALITY AS e(p, ek, dk, i)
         WHERE length(e.ek) > 1000 OR length(e.dk) > 1000 OR e.ek = '' OR e.dk = '' OR e.dk LIKE '#%'
            OR pg_column_size(e.p) > 1048576
         ORDER BY e.i LIMIT 1;
        IF FOUND THEN
            -- tide.emit_many names the element; tide.emit has one.
            what := p_function || ': ' || CASE WHEN n > 1 THEN format('element %s: ', bad.i) ELSE '' END;
            IF length(bad.ek) > 1000 OR length(bad.dk) > 1000 THEN
                RAISE EXCEPTION '%', format('%s%s is too long (%s characters, at most 1000)', what,
                    CASE WHEN length(bad.ek) > 1000 THEN 'event_key' ELSE 'dedupe_key' END,
                    greatest(length(bad.ek), length(bad.dk)))
                    USING ERRCODE = 'invalid_parameter_value', HINT = 'derive keys from ids, such as ''customer:'' || id';
            ELSIF pg_column_size(bad.p) > 1048576 THEN
                RAISE EXCEPTION '%', format('%spayload is too large (%s bytes, at most 1048576)', what, pg_column_size(bad.p))
                    USING ERRCODE = 'invalid_parameter_value', HINT = 'keep large data in your own tables and pass its key';
            ELSE
                RAISE EXCEPTION '%', format('%s%s %s is not valid', what,
                    CASE WHEN bad.ek = '' THEN 'event_key' ELSE 'dedupe_key' END,
                    quote_literal(left(CASE WHEN bad.ek = '' THEN bad.ek ELSE bad.dk END, 100)))
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'pass NULL or a non-empty text; dedupe keys starting with # are pg_tide''s own';
            END IF;
        END IF;
    END IF;
    IF owners_ok IS NOT NULL THEN
        SELECT array_agg(g.owner) INTO g_owners FROM tide._granted('emit') g WHERE g.object = p_topic;
    END IF;
    -- The runs, with their gating (so the insert trigger has nothing to look up), made by the one
    -- creator (tide._create_runs). Each event gets its id (its dedupe key when none is given: #id).
    WITH events AS (
        SELECT e.i, coalesce(e.p, '{}') AS payload, e.ek AS event_key, e.dk AS dedupe_key,
               nextval('tide.event_seq') AS ev
          FROM unnest(p_payloads, p_event_keys, p_dedupe_keys) WITH ORDINALITY AS e(p, ek, dk, i)
    ), tasks AS MATERIALIZED (
        -- With what the runs' gating reads of the task's rules (tide._gating_by), read once.
        SELECT t.task_id, t.version, t.owner, t.queue, t.priority, t.args, t.command, t.name,
               tide._open_state(jsonb_build_object('ready_dataset', t.ready_dataset, 'ready_check', t.ready_check,
                                                 'ready_watermark', t.ready_watermark)) AS state,
               v.rules->>'lock_key' AS lock_rule, v.rules->>'overlap' AS overlap, (v.rules->>'long')::boolean AS long,
               (v.rules->>'max_concurrency')::integer AS max_concurrency
          FROM tide.task t
          JOIN tide.task_version v ON v.task_id = t.task_id AND v.version = t.version
         WHERE t.topics @> ARRAY[p_topic] AND (owners_ok IS NULL OR t.owner = ANY (owners_ok) OR t.owner = ANY (g_owners))
        -- The tasks cannot be deleted under their new runs (tide.run has no foreign key): a task
        -- deleted meanwhile is left out, and one being deleted is waited for.
           FOR KEY SHARE OF t
    ), made AS (
        -- In the order of the events (run ids follow it), with the fields of tide.new_run.
        SELECT t.task_id, 'event'::tide.run_trigger AS trigger, t.version, t.state,
               format('event %s on %s%s', e.ev, p_topic, coalesce(' (key ' || e.event_key || ')', '')) AS reason,
               tide._executor_of(t.command) AS executor, t.queue, t.priority, t.args, t.owner,
               NULL::timestamptz AS fire_at, NULL::timestamptz AS window_start, NULL::timestamptz AS window_end,
               NULL::date AS biz_date, coalesce(e.dedupe_key, '#' || e.ev) AS dedupe_key,
               NULL::tide.skip_reason AS skip_reason, NULL::timestamptz AS run_after,
               NULL::timestamptz AS ready_deadline, p_topic AS topic, e.event_key, e.payload, g.gate, g.lock_key, g.gated
          FROM events e
         CROSS JOIN tasks t
         CROSS JOIN LATERAL tide._gating_by(t.lock_rule, t.overlap, t.long, t.max_concurrency, t.task_id, t.name,
                                            t.args, e.payload, e.event_key, NULL, NULL) g
         ORDER BY e.i, t.task_id
    )
    -- Without dedupe keys, every run's key is pg_tide's own (#id, new): fresh.
    SELECT cardinality(tide._create_runs(array_agg(m::tide.new_run), NOT keyed)) INTO made FROM made m;
    IF made = 0 THEN
        -- Never a silent 0: say so when no task this role may reach subscribes to the topic (a
        -- dedupe key seen before is a quiet 0).
        IF NOT EXISTS (SELECT 1 FROM tide.task t
                        WHERE t.topics @> ARRAY[p_topic]
                          AND (owners_ok IS NULL OR t.owner = ANY (owners_ok) OR t.owner = ANY (g_owners))) THEN
            RAISE WARNING '%: no task you may reach subscribes to topic %: nothing was created', p_function, quote_literal(left(p_topic, 200))
                USING HINT = 'subscribe a task with tide.schedule(..., topics => ARRAY[...]), or have the owner of the task run tide.grant(''emit'', topic, your role)';
        END IF;
        RETURN 0;
    END IF;
    RETURN made;
END
$$;
COMMENT ON FUNCTION tide._emit(text, jsonb[], text[], text[], text) IS
    'Internal: the work of tide.emit and tide.emit_many: checks, creates a run of every reachable subscribed task per event, wakes claimers.';

DROP FUNCTION tide.enqueue(text, jsonb, timestamptz, integer, text);
CREATE FUNCTION tide.enqueue(task text, args jsonb DEFAULT '{}', run_at timestamptz DEFAULT NULL,
                             priority integer DEFAULT NULL, dedupe_key text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT, whatever the backlog (see tide._claim).
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    t tide.task;
    items jsonb;
    n integer;
    key_of text;
    one_key boolean;
    open_state tide.run_state;
    why text;
    exec_kind tide.executor;
    ids bigint[];
    prio integer;
    due timestamptz;
    rule record;
BEGIN
    PERFORM tide._text_arg('task', enqueue.task, 200, 'pass the name of one of your tasks');
    -- KEY SHARE: the task cannot be deleted under the new runs; changes of it may go on.
    -- The caller's task, a team's, or one granted to it (tide.grant('enqueue', ...)): the runs
    -- are its owner's.
    SELECT * INTO t FROM tide.task x WHERE x.task_id = tide._named_task(enqueue.task, 'enqueue') FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task "%" does not exist', left(enqueue.task, 200) USING ERRCODE = 'undefined_object',
            HINT = 'list your tasks with: SELECT name FROM tide.task';
    END IF;
    IF enqueue.args IS NULL THEN
        RAISE EXCEPTION 'args must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'pass args => ''{}'' for none, an object for one run, or an array of objects for one run each';
    END IF;
    CASE jsonb_typeof(enqueue.args)
        WHEN 'object' THEN items := jsonb_build_array(enqueue.args);
        WHEN 'array' THEN items := enqueue.args;
        ELSE
            RAISE EXCEPTION 'args must be a JSON object or an array of objects, got %', left(enqueue.args::text, 100)
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'pass args => ''{"invoice_id": 7}'' for one run, or ''[{"invoice_id": 7}, {"invoice_id": 8}]'' for one run each';
    END CASE;
    n := jsonb_array_length(items);
    IF n > 100000 THEN
        RAISE EXCEPTION 'args has % elements, at most 100000 in one call', n USING ERRCODE = 'invalid_parameter_value',
            HINT = 'enqueue in several calls of up to 100000 runs';
    END IF;
    IF n > 1 THEN
        PERFORM tide._check_bulk(n, 'tide.enqueue');
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM jsonb_array_elements(items) WITH ORDINALITY AS e(v, i)
     WHERE CASE WHEN jsonb_typeof(e.v) <> 'object'
                THEN tide._refuse_element(e.i, e.v)
                ELSE NOT tide._args_ok(e.v) END;
    IF enqueue.priority IS NOT NULL AND enqueue.priority NOT BETWEEN -1000 AND 1000 THEN
        RAISE EXCEPTION 'priority must be between -1000 and 1000, got %', enqueue.priority
            USING ERRCODE = 'invalid_parameter_value', HINT = 'higher runs first; the task''s own priority is the default';
    END IF;
    prio := coalesce(enqueue.priority, t.priority);
    IF enqueue.run_at IS NOT NULL AND NOT isfinite(enqueue.run_at) THEN
        RAISE EXCEPTION 'run_at must be a finite instant, got %', enqueue.run_at USING ERRCODE = 'invalid_parameter_value',
            HINT = 'pass now() + interval ''1 hour'', or NULL to run at once';
    END IF;
    IF enqueue.run_at > now() + interval '3660 days' THEN
        RAISE EXCEPTION 'run_at % is more than 3660 days ahead', enqueue.run_at USING ERRCODE = 'invalid_parameter_value',
            HINT = 'schedule work that far ahead as a task with a schedule';
    END IF;
    due := CASE WHEN enqueue.run_at > now() THEN enqueue.run_at END;
    IF enqueue.dedupe_key IS NOT NULL THEN
        PERFORM tide._text_arg('dedupe_key', enqueue.dedupe_key, 1000,
                               'derive it from what the job is about, such as ''invoice:'' || invoice_id');
        IF enqueue.dedupe_key LIKE '#%' THEN
            RAISE EXCEPTION 'dedupe_key % is not valid', quote_literal(left(enqueue.dedupe_key, 100))
                USING ERRCODE = 'invalid_parameter_value', HINT = 'dedupe keys starting with # are pg_tide''s own';
        END IF;
        -- One run: the key itself. Several: the key and the element's position, so the same
        -- batch enqueued again creates nothing.
        one_key := jsonb_typeof(enqueue.args) = 'object';
        key_of := enqueue.dedupe_key || CASE WHEN one_key THEN '' ELSE ':' END;
    ELSE
        -- Keys of pg_tide's own, new to this call: no conflict is possible.
        one_key := false;
        key_of := '#q' || nextval('tide.job_seq') || ':';
    END IF;
    -- The same for every run of the call: worked out once.
    open_state := tide._open_state(jsonb_build_object('ready_dataset', t.ready_dataset, 'ready_check', t.ready_check,
                                                      'ready_watermark', t.ready_watermark));
    exec_kind := tide._executor_of(t.command);
    -- What the runs' gating reads of the task's rules, read once (tide._gating_by).
    SELECT v.rules->>'lock_key' AS lock_rule, v.rules->>'overlap' AS overlap, (v.rules->>'long')::boolean AS long,
           (v.rules->>'max_concurrency')::integer AS max_concurrency
      INTO STRICT rule
      FROM tide.task_version v WHERE v.task_id = t.task_id AND v.version = t.version;
    why := format('enqueued by %s%s', tide._caller(),
                  CASE WHEN due IS NOT NULL
                       THEN ' to run at ' || to_char(due AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS" UTC"') ELSE '' END);
    -- The runs, with their gating, made by the one creator (tide._create_runs): runs with keys of
    -- pg_tide's own are fresh; those with the caller's skip the keys seen before.
    WITH input AS (
        SELECT e.i, t.args || e.v AS args,
               CASE WHEN one_key THEN key_of ELSE key_of || e.i END AS dedupe_key
          FROM jsonb_array_elements(items) WITH ORDINALITY AS e(v, i)
    ), made AS (
        -- In the order of the elements (run ids follow it), with the fields of tide.new_run.
        SELECT t.task_id, 'enqueued'::tide.run_trigger AS trigger, t.version, open_state AS state, why AS reason,
               exec_kind AS executor, t.queue, prio AS priority, i.args, t.owner, NULL::timestamptz AS fire_at,
               NULL::timestamptz AS window_start, NULL::timestamptz AS window_end, NULL::date AS biz_date,
               i.dedupe_key, NULL::tide.skip_reason AS skip_reason, due AS run_after,
               NULL::timestamptz AS ready_deadline, NULL::text AS topic, NULL::text AS event_key,
               NULL::jsonb AS payload, g.gate, g.lock_key, g.gated
          FROM input i
         CROSS JOIN LATERAL tide._gating_by(rule.lock_rule, rule.overlap, rule.long, rule.max_concurrency, t.task_id,
                                            t.name, i.args, NULL, NULL, NULL, NULL) g
         ORDER BY i.i
    )
    SELECT tide._create_runs(array_agg(m::tide.new_run), enqueue.dedupe_key IS NULL) INTO ids FROM made m;
    -- The run of each element: with keys of pg_tide's own, all of them new, in the order of the
    -- elements (run ids are given in insertion order); with the caller's, created now or
    -- earlier with the same key.
    IF enqueue.dedupe_key IS NULL THEN
        RETURN QUERY SELECT unnest(ids);
    ELSE
        RETURN QUERY
            SELECT r.run_id FROM generate_series(1, n) k(i)
              JOIN tide.run r ON r.task_id = t.task_id
                             AND r.dedupe_key = CASE WHEN one_key THEN key_of ELSE key_of || k.i END
             ORDER BY k.i;
    END IF;
END
$$;
COMMENT ON FUNCTION tide.enqueue(text, jsonb, timestamptz, integer, text) IS
    'enqueue(task, args => ''{}'', run_at => NULL, priority => NULL, dedupe_key => NULL): creates one run of the caller''s task (args an object, merged over the task''s args) or one run per element (args an array of objects, up to 100000), now or at run_at, with its own priority (default: the task''s). A dedupe_key makes it idempotent: a second enqueue with the same key creates nothing and returns the existing run (with an array, element n uses dedupe_key:n). Returns the run ids, in the order of the elements.';

DROP FUNCTION tide._rerun(bigint, timestamptz, timestamptz, timestamptz, date, text, boolean, text, tide.run_trigger, text, text);
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
    -- The window's run, by the one creator (its gating from the insert trigger); a window that
    -- has one already is reopened below.
    SELECT (tide._create_runs(ARRAY[ROW(
               t.task_id, p_trigger, t.version, tide._open_state(tide._task_rules(t)),
               coalesce(p_why, format('%s by %s', CASE WHEN p_trigger = 'manual' THEN 'manual rerun' ELSE p_trigger::text END,
                                      tide._caller())),
               tide._run_executor(tide._task_rules(t), true), coalesce(p_queue, t.queue),
               t.priority - CASE WHEN p_trigger = 'backfill' THEN 10000 ELSE 0 END, t.args, t.owner,
               p_fire, p_start, p_end, p_biz_date, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
           )::tide.new_run], false))[1]
      INTO id;
    IF id IS NOT NULL THEN
        RETURN id;
    END IF;
    SELECT r.run_id INTO id FROM tide.run r WHERE r.task_id = p_task_id AND r.window_start = p_start;
    RETURN tide._reopen(id, p_trigger, p_version, p_force, p_function, p_queue, p_why);
END
$$;
COMMENT ON FUNCTION tide._rerun(bigint, timestamptz, timestamptz, timestamptz, date, text, boolean, text, tide.run_trigger, text, text) IS
    'Internal: creates or reopens the run of one window (tide.rerun, tide.run_now and backfills after the window is computed; p_function names the caller in errors; a backfill''s run goes to its queue, below every online run).';

DROP FUNCTION tide._fallback_emit(tide.run, jsonb);
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
    ), made AS (
        -- The event runs that were never emitted, with the fields of tide.new_run, made by the
        -- one creator (tide._create_runs): a key with a run already creates nothing.
        SELECT t.task_id, 'event'::tide.run_trigger AS trigger, t.version, tide._open_state(tide._task_rules(t)) AS state,
               format('event on %s (key %s) found by the fallback scan of run %s: it was never emitted', topic, f.key, r.run_id) AS reason,
               tide._executor_of(t.command) AS executor, t.queue, t.priority, t.args, t.owner,
               NULL::timestamptz AS fire_at, NULL::timestamptz AS window_start, NULL::timestamptz AS window_end,
               NULL::date AS biz_date, f.key AS dedupe_key, NULL::tide.skip_reason AS skip_reason,
               NULL::timestamptz AS run_after, NULL::timestamptz AS ready_deadline, topic, f.key AS event_key,
               f.payload, g.gate, g.lock_key, g.gated
          FROM found f
         CROSS JOIN LATERAL tide._gating_of(t.task_id, t.version, t.args, f.payload, f.key, NULL, NULL) g
         ORDER BY f.n
    )
    SELECT tide._create_runs(array_agg(m::tide.new_run), false) INTO ids FROM made m;
    SELECT array_agg(x.event_key ORDER BY x.run_id) INTO keys FROM tide.run x WHERE x.run_id = ANY (ids);
    RETURN jsonb_build_object('scanned', jsonb_array_length(p_rows), 'missing', coalesce(cardinality(keys), 0),
                              'missing_keys', to_jsonb(coalesce(keys[1:100], '{}')));
END
$$;
COMMENT ON FUNCTION tide._fallback_emit(tide.run, jsonb) IS
    'Internal: turns the rows of a fallback scan into the event runs that were never emitted (key as event and dedupe key); returns scanned, missing and the missing keys (the first 100).';

DROP FUNCTION tide._recon_record(tide.run, jsonb, jsonb);
CREATE FUNCTION tide._recon_record(r tide.run, def jsonb, p_found jsonb) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t tide.task;
    res_id bigint;
    d record;
    v_rule jsonb;
    cls text;
    prior tide.recon_diff;
    st text;
    action bigint;
    esc boolean;
    why text;
    ft tide.task;
    w record;
    dk text;
    truncated boolean := (p_found->>'truncated')::boolean;
    v_status text;
    v_by_class jsonb;
    counts record;
BEGIN
    SELECT * INTO t FROM tide.task x WHERE x.task_id = r.task_id;
    INSERT INTO tide.recon_result (reconciliation, biz_date, run_id, status, left_count, right_count, left_sums, right_sums,
                                   differences, by_kind, by_class, truncated, started_at, task_id, version, owner)
    VALUES (t.name, r.biz_date, r.run_id, 'balanced', (p_found->>'left_count')::bigint, (p_found->>'right_count')::bigint,
            p_found->'left_sums', p_found->'right_sums', (p_found->>'differences')::integer, p_found->'by_kind', '{}',
            truncated, (p_found->>'started_at')::timestamptz, r.task_id, r.version, r.owner)
    RETURNING result_id INTO res_id;
    -- Earlier open differences of this date that this run no longer sees are fixed (when this
    -- run saw every difference).
    IF NOT truncated THEN
        WITH seen AS MATERIALIZED (
            SELECT e->>'key' AS key, e->>'kind' AS kind FROM jsonb_array_elements(p_found->'diffs') e
        )
        UPDATE tide.recon_diff x
           SET status = 'fixed', fixed_by_run = r.run_id, resolved_at = now(),
               reason = concat_ws('; ', x.reason, format('no longer seen by run %s', r.run_id))
         WHERE x.task_id = r.task_id AND x.biz_date IS NOT DISTINCT FROM r.biz_date AND x.status = 'open'
           AND NOT EXISTS (SELECT 1 FROM seen WHERE seen.key = x.key AND seen.kind = x.kind);
    END IF;
    FOR d IN SELECT e->>'kind' AS kind, e->>'key' AS key, nullif(e->'l', 'null') AS l, nullif(e->'r', 'null') AS r,
                    ARRAY(SELECT jsonb_array_elements_text(nullif(e->'columns', 'null'))) AS cols, (e->>'rule')::integer AS rule_no
               FROM jsonb_array_elements(p_found->'diffs') e LOOP
        v_rule := CASE WHEN d.rule_no IS NOT NULL THEN def->'rules'->(d.rule_no - 1) END;
        cls := coalesce(v_rule->>'class', 'human');
        SELECT * INTO prior FROM tide.recon_diff x
         WHERE x.task_id = r.task_id AND x.biz_date IS NOT DISTINCT FROM r.biz_date AND x.key = d.key AND x.kind = d.kind
         ORDER BY x.diff_id DESC LIMIT 1;
        st := 'open';
        action := NULL;
        esc := false;
        why := NULL;
        IF prior.status = 'accepted' AND prior."left" IS NOT DISTINCT FROM d.l AND prior."right" IS NOT DISTINCT FROM d.r THEN
            -- A person accepted this very difference: it stays accepted.
            st := 'accepted';
            why := format('accepted by %s (difference %s)', prior.resolved_by, prior.diff_id);
        ELSIF truncated THEN
            why := format('not compensated: the run found %s differences, more than max_diffs %s', p_found->>'differences', def->>'max_diffs');
            esc := cls <> 'human';
        ELSIF cls = 'auto_fix' THEN
            -- KEY SHARE: the task cannot be deleted under its new run (tide.run has no foreign key).
            SELECT * INTO ft FROM tide.task x WHERE x.name = v_rule->>'fix_task' AND x.owner = r.owner FOR KEY SHARE;
            IF NOT FOUND THEN
                esc := true;
                why := format('fix_task %s does not exist', quote_literal(v_rule->>'fix_task'));
            ELSE
                dk := format('#recon:%s:%s:%s:%s', t.name, coalesce(r.biz_date::text, '-'), d.kind,
                             CASE WHEN length(d.key) > 400 THEN 'md5:' || md5(d.key) ELSE d.key END);
                SELECT x.run_id INTO action FROM tide.run x WHERE x.task_id = ft.task_id AND x.dedupe_key = dk;
                IF action IS NULL THEN
                    -- The compensating run, by the one creator (tide._create_runs); a run of the
                    -- same key made meanwhile is taken instead.
                    SELECT (tide._create_runs(ARRAY[ROW(
                               ft.task_id, 'reconcile', ft.version, tide._open_state(tide._task_rules(ft)),
                               format('compensation of a %s difference (key %s) found by reconciliation %s, run %s', d.kind, d.key, t.name, r.run_id),
                               tide._executor_of(ft.command), ft.queue, ft.priority, ft.args || p.payload, ft.owner,
                               NULL, NULL, NULL, NULL, dk, NULL, NULL, NULL, NULL, NULL, p.payload, g.gate, g.lock_key, g.gated
                           )::tide.new_run], false))[1]
                      INTO action
                      FROM (SELECT jsonb_build_object('reconciliation', t.name, 'biz_date', r.biz_date, 'key', d.key, 'kind', d.kind,
                                                      'left', d.l, 'right', d.r, 'columns', to_jsonb(d.cols)) AS payload) p
                     CROSS JOIN LATERAL tide._gating_of(ft.task_id, ft.version, ft.args || p.payload, p.payload, NULL, NULL, NULL) g;
                    IF action IS NULL THEN
                        SELECT x.run_id INTO action FROM tide.run x WHERE x.task_id = ft.task_id AND x.dedupe_key = dk;
                    END IF;
                ELSIF EXISTS (SELECT 1 FROM tide.run x WHERE x.run_id = action AND x.finished_at IS NOT NULL
                                                         AND x.finished_at < r.claimed_at) THEN
                    -- The fix ran before this comparison began, and the difference is still there.
                    esc := true;
                    why := format('fix run %s ended (%s) before this run and the difference remains', action,
                                  (SELECT x.state FROM tide.run x WHERE x.run_id = action));
                END IF;
            END IF;
        ELSIF cls = 'replay' THEN
            SELECT * INTO ft FROM tide.task x WHERE x.name = v_rule->>'replay_task' AND x.owner = r.owner;
            IF FOUND THEN
                -- One rerun per reconciliation, date and replay task: the one asked for earlier, if any.
                SELECT x.action_run_id INTO action FROM tide.recon_diff x JOIN tide.run y ON y.run_id = x.action_run_id
                 WHERE x.task_id = r.task_id AND x.biz_date IS NOT DISTINCT FROM r.biz_date AND x.class = 'replay'
                   AND y.task_id = ft.task_id
                 ORDER BY x.diff_id LIMIT 1;
            END IF;
            IF action IS NOT NULL THEN
                IF EXISTS (SELECT 1 FROM tide.run x WHERE x.run_id = action AND x.finished_at IS NOT NULL
                                                     AND x.finished_at < r.claimed_at
                                                     AND x.finished_at > (SELECT min(y.found_at) FROM tide.recon_diff y
                                                                           WHERE y.task_id = r.task_id AND y.action_run_id = action)) THEN
                    esc := true;
                    why := format('replay run %s of %s ended (%s) before this run and the difference remains', action,
                                  ft.name, (SELECT x.state FROM tide.run x WHERE x.run_id = action));
                END IF;
            ELSIF ft.task_id IS NULL THEN
                esc := true;
                why := format('replay_task %s does not exist', quote_literal(v_rule->>'replay_task'));
            ELSIF r.biz_date IS NULL THEN
                esc := true;
                why := 'this run has no business date to replay';
            ELSE
                BEGIN
                    SELECT * INTO w FROM tide._window_of_date(ft.task_id, r.biz_date);
                    IF w.window_end > now() THEN
                        esc := true;
                        why := format('the window of %s on %s has not ended yet', ft.name, r.biz_date);
                    ELSE
                        action := tide._rerun(ft.task_id, w.fire_at, w.window_start, w.window_end, r.biz_date, 'current', true,
                                              'tide.reconcile', 'reconcile', NULL,
                                              format('replay asked by reconciliation %s (run %s): %s difference of key %s',
                                                     t.name, r.run_id, d.kind, d.key));
                    END IF;
                EXCEPTION WHEN others THEN
                    esc := true;
                    GET STACKED DIAGNOSTICS why = MESSAGE_TEXT;
                    why := 'the replay could not be asked for: ' || tide._clip(why, 300);
                END;
            END IF;
        END IF;
        INSERT INTO tide.recon_diff (reconciliation, biz_date, key, kind, class, "left", "right", status, action_run_id,
                                     escalated, reason, columns, severity, rule, run_id, result_id, task_id, owner,
                                     resolved_by, resolved_at, note)
        VALUES (t.name, r.biz_date, d.key, d.kind, cls, d.l, d.r, st, action, esc, why,
                CASE WHEN d.kind = 'mismatch' THEN d.cols END,
                CASE WHEN cls = 'human' OR esc THEN coalesce((v_rule->>'severity')::tide.severity, t.severity) END,
                d.rule_no, r.run_id, res_id, r.task_id, r.owner,
                CASE WHEN st = 'accepted' THEN prior.resolved_by END, CASE WHEN st = 'accepted' THEN now() END,
                CASE WHEN st = 'accepted' THEN prior.note END);
    END LOOP;
    SELECT count(*) FILTER (WHERE x.status = 'open' AND (x.class = 'human' OR x.escalated)) AS human,
           count(*) FILTER (WHERE x.status = 'open' AND x.class = 'replay' AND NOT x.escalated) AS replay,
           count(*) FILTER (WHERE x.status = 'open' AND x.class = 'auto_fix' AND NOT x.escalated) AS auto_fix
      INTO counts FROM tide.recon_diff x WHERE x.result_id = res_id;
    SELECT coalesce(jsonb_object_agg(c.class, c.n), '{}') INTO v_by_class
      FROM (SELECT CASE WHEN x.status = 'accepted' THEN 'accepted' ELSE x.class END AS class, count(*) AS n
              FROM tide.recon_diff x WHERE x.result_id = res_id GROUP BY 1) c;
    v_status := CASE WHEN counts.human > 0 OR truncated THEN 'needs_human'
                   WHEN counts.replay > 0 THEN 'needs_replay'
                   WHEN counts.auto_fix > 0 THEN 'auto_fixed'
                   ELSE 'balanced' END;
    UPDATE tide.recon_result x SET status = v_status, by_class = v_by_class, checked_at = clock_timestamp()
     WHERE x.result_id = res_id;
    RETURN jsonb_build_object('status', v_status, 'left_count', (p_found->>'left_count')::bigint,
                              'right_count', (p_found->>'right_count')::bigint, 'differences', (p_found->>'differences')::integer,
                              'by_kind', p_found->'by_kind', 'by_class', v_by_class, 'result_id', res_id);
END
$$;
COMMENT ON FUNCTION tide._recon_record(tide.run, jsonb, jsonb) IS
    'Internal: records a reconciliation run''s result and differences, marks earlier ones it no longer sees fixed, and compensates by class (a fix run per difference, a replay per date, an alert); returns the run''s result.';

DROP FUNCTION tide._record_created(bigint[]);

-- The tick's steps on existing runs: a function each, and one list of them (tide._tick_runs)
-- in place of the CASE of tide._tick_step.
CREATE FUNCTION tide._tick_unparked(p_now timestamptz) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    UPDATE tide.pending p SET parked = false, due_at = NULL
     WHERE p.run_id IN (SELECT q.run_id FROM tide.pending q WHERE q.parked AND q.due_at <= p_now
                           FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._tick_unparked(timestamptz) IS
    'Internal: a step of the tick (tide._tick_runs): parked runs whose wait is over are looked at by claims again; returns how many.';

CREATE FUNCTION tide._tick_retried(p_now timestamptz) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    UPDATE tide.run r SET state = 'ready', run_after = NULL, updated_at = now(),
                          reason = format('retry due (attempt %s next)', r.tries + 1)
     WHERE r.run_id IN (SELECT x.run_id FROM tide.run x
                         WHERE x.run_id IN (SELECT p.run_id FROM tide.pending p
                                             WHERE p.state = 'retry' AND p.due_at <= p_now)
                           AND x.state = 'retry'
                           FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._tick_retried(timestamptz) IS
    'Internal: a step of the tick (tide._tick_runs): due retries are ready again; returns how many.';

CREATE FUNCTION tide._tick_executor_gone(p_now timestamptz) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer := 0;
    rec record;
BEGIN
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
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._tick_executor_gone(timestamptz) IS
    'Internal: a step of the tick (tide._tick_runs): SQL runs whose executor process is gone lose their attempt; returns how many.';

CREATE FUNCTION tide._tick_taken_back(p_now timestamptz) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer := 0;
    rec record;
BEGIN
    FOR rec IN SELECT x.run_id, x.lease_owner, x.lease_token FROM tide.run x
              WHERE x.run_id IN (SELECT p.run_id FROM tide.pending p WHERE p.state = 'running')
                AND x.state = 'running' AND x.lease_expires_at < p_now
                AND x.run_id <> ALL (tide._command_runs())
              ORDER BY x.lease_expires_at FOR UPDATE OF x SKIP LOCKED LOOP
        PERFORM tide._fail(rec.run_id, format('lease of %s (token %s) expired', coalesce(rec.lease_owner, 'a worker'), rec.lease_token),
                           'transient', NULL, 'lost', p_now);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._tick_taken_back(timestamptz) IS
    'Internal: a step of the tick (tide._tick_runs): runs whose lease expired lose their attempt; returns how many.';

CREATE FUNCTION tide._tick_released(p_now timestamptz) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
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
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._tick_released(timestamptz) IS
    'Internal: a step of the tick (tide._tick_runs): waiting runs without an SQL check whose data is marked ready (or whose next window came) are ready; returns how many.';

CREATE FUNCTION tide._tick_not_ready_deadline(p_now timestamptz) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer := 0;
    rec record;
    rules jsonb;
    next_deadline timestamptz;
BEGIN
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
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._tick_not_ready_deadline(timestamptz) IS
    'Internal: a step of the tick (tide._tick_runs): waiting runs still not ready at their deadline follow their task''s not_ready_policy; returns how many.';

DROP FUNCTION tide._tick_runs(timestamptz);
CREATE FUNCTION tide._tick_runs(p_now timestamptz) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    counts jsonb := '{}';
    step text;
    n integer;
BEGIN
    FOR i IN 1 .. 100 LOOP
        BEGIN
            CASE i
            WHEN 1 THEN step := 'unparked';           n := tide._tick_unparked(p_now);
            WHEN 2 THEN step := 'retried';            n := tide._tick_retried(p_now);
            WHEN 3 THEN step := 'executor_gone';      n := tide._tick_executor_gone(p_now);
            WHEN 4 THEN step := 'taken_back';         n := tide._tick_taken_back(p_now);
            WHEN 5 THEN step := 'released';           n := tide._tick_released(p_now);
            WHEN 6 THEN step := 'not_ready_deadline'; n := tide._tick_not_ready_deadline(p_now);
            -- Side effects whose lease expired go back in line (src/effects/effects.sql).
            WHEN 7 THEN step := 'effects_taken_back'; n := tide._tick_effects(p_now);
            -- Backfills move on: how their runs ended, the canary, the next batch
            -- (src/backfill/progress.sql).
            WHEN 8 THEN step := 'backfills';          n := tide._tick_backfills(p_now);
            -- Fresh statistics for kept plans after a bulk enqueue (tide._pending_stats).
            WHEN 9 THEN step := 'analyzed';           n := tide._pending_stats()::integer;
            ELSE EXIT;
            END CASE;
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
    'Internal: the tick''s work on existing runs, the list of its steps: due retries, runs whose executor is gone, expired leases, readiness releases and deadlines, side effects, backfills; each step isolated from the others.';

DROP FUNCTION tide._tick_step(text, timestamptz);

-- Privileges, as a fresh install leaves them: the internal functions that change anything are
-- pg_tide's own (src/comments.sql).
REVOKE EXECUTE ON FUNCTION tide._claim(tide.executor, text, text, integer, interval, boolean, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._fail(bigint, text, tide.error_kind, text, tide.attempt_outcome, timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._emit(text, jsonb[], text[], text[], text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._rerun(bigint, timestamptz, timestamptz, timestamptz, date, text, boolean, text, tide.run_trigger, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._fallback_emit(tide.run, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._recon_record(tide.run, jsonb, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._write_history(tide.run_change[], boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._create_runs(tide.new_run[], boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._tick_unparked(timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._tick_retried(timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._tick_executor_gone(timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._tick_taken_back(timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._tick_released(timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._tick_not_ready_deadline(timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._tick_runs(timestamptz) FROM PUBLIC;

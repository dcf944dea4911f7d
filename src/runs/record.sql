-- The two writers of the ledger (docs/architecture.md): tide._create_runs, the one way a run is
-- created (with its first history row, its line in tide.pending and what it counts), and
-- tide._write_history, the one way a change of a run is recorded (its history row with what it
-- counts). Every creator (the tick's fires, tide.emit, tide.enqueue, a rerun or backfill
-- window, an event task's fallback scan, a reconciliation's compensation) hands its new runs to
-- the first, as one array for the whole batch; every path that changes a run's state (the
-- trigger run_changed, claims, completions, failures) hands its history rows to the second.
-- Neither is called per row by a bulk path: one call per statement, set-based inside.

-- A run to create: what a creator decides. Everything else of tide.run starts at its default
-- (no attempt, no lease, created now; finished now when it is created skipped).
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

-- A history row to write, with what tide._counts_of reads of the run it records.
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

-- The one writer of a run's changes (every history row after its first, which its creator
-- writes with it): the rows of tide.run_event, what they count for tide.metrics() and the hourly
-- charts (tide.count_delta, a change of state only, not a new reason), and, with
-- p_touch, their tasks noted for task health (tide.task_touch; the statement trigger
-- run_touched_update notes them otherwise). One statement for the whole batch, its rows in the
-- order given: no sort, which costs more to set up at every call than it saves.
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
          FROM c
    ), touched AS (
        INSERT INTO tide.task_touch (task_id, owner) SELECT DISTINCT c.task_id, c.owner FROM c WHERE p_touch
    )
    INSERT INTO tide.count_delta (task_id, metric, label, value, owner)
    SELECT c.task_id, m.metric, m.label, sum(m.value), min(c.owner)
      FROM c
     CROSS JOIN LATERAL tide._counts_of(c.to_state::text, c.attempts, c.claimed_at, c.finished_at, c.started_at, c.fire_at,
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

-- The one way a run is created: inserts the runs (p_fresh: their keys are new, pg_tide's own,
-- so no conflict is looked for; otherwise a run whose window or dedupe key is taken is not
-- created), and for those created writes, in the same statement, their first history rows,
-- their tasks' touch rows and their lines in tide.pending, then what those created finished
-- count, and wakes their claimers: one NOTIFY per queue with runs ready now
-- (after the commit, tide._ready), an executor at commit for SQL runs ready (or due later: it
-- sleeps until then) and for runs waiting (it evaluates their readiness checks). Returns the
-- ids of the runs created, in the order of p_runs (run ids follow it).
-- Creation is recorded here, not by an INSERT trigger: pg_dump restores tide.run with COPY, and
-- a trigger would record every restored run as created again.
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
    ready_queue text;
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
        SELECT c.run_id, NULL, c.state, c.reason, c.owner FROM created c
    ), touched AS (
        INSERT INTO tide.task_touch (task_id, owner) SELECT DISTINCT c.task_id, c.owner FROM created c
    ), line AS (
        INSERT INTO tide.pending (run_id, task_id, state, executor, queue, priority, due_at, owner, gate, lock_key, gated)
        SELECT c.run_id, c.task_id, c.state, c.executor, c.queue, c.priority, c.run_after, c.owner, c.gate, c.lock_key,
               coalesce(c.gated, false)
          FROM created c
         WHERE c.state IN ('waiting', 'ready', 'running', 'retry', 'held', 'paused', 'dead', 'need_check')
    )
    -- Plain aggregates (no ORDER BY, no DISTINCT: each is a sort to set up at every call): the
    -- runs come back in the order they were inserted, and any one queue with runs ready now
    -- wakes the waiting workers (tide._ready does not send the queues' names).
    SELECT array_agg(c.run_id),
           min(c.queue) FILTER (WHERE c.state = 'ready' AND c.run_after IS NULL),
           coalesce(bool_or((c.state = 'ready' AND c.executor = 'sql') OR c.state = 'waiting'), false),
           array_agg(c.run_id) FILTER (WHERE c.state = 'skipped')
      INTO ids, ready_queue, wake, skipped
      FROM created c;
    IF ids IS NULL THEN
        RETURN '{}';
    END IF;
    PERFORM tide._ready(ARRAY[ready_queue]);  -- waiting workers are notified after the commit (src/scheduler/wake.rs)
    IF wake THEN
        PERFORM tide._wake(false);  -- an idle executor claims at this commit, or sleeps until the run is due
    END IF;
    IF skipped IS NOT NULL THEN
        -- What runs created finished count (windows skipped at their fire, the tick's alone):
        -- tide._counts_of, as tide._write_history counts a change.
        INSERT INTO tide.count_delta (task_id, metric, label, value, owner)
        SELECT r.task_id, m.metric, m.label, sum(m.value), min(r.owner)
          FROM tide.run r
         CROSS JOIN LATERAL tide._counts_of(r.state::text, 0, NULL, r.finished_at, NULL, r.fire_at, r.created_at) m
         WHERE r.run_id = ANY (skipped)
         GROUP BY 1, 2, 3;
        PERFORM tide._log_runs('skip', skipped);
    END IF;
    RETURN ids;
END
$$;
COMMENT ON FUNCTION tide._create_runs(tide.new_run[], boolean) IS
    'Internal: the one way a run is created: inserts new runs (p_fresh: keys known to be new; otherwise a taken window or dedupe key creates nothing), writes their history, tide.pending lines and counts, and wakes their claimers; returns the ids created.';

-- pg_tide 0.2.6 to 0.2.7: what a history row counts is worked out by a C function
-- (tide._counts_of, with tide._le), not by an SQL expression compiled at every statement that
-- wrote history, and the run creator's closing aggregates set up no sort (tide._create_runs):
-- 0.2.6 had made claims, completions and per-transaction emit/enqueue slower than 0.2.5.
-- Nothing a user calls changes.
-- Run by ALTER EXTENSION pg_tide UPDATE; the upgrade tier (pg_test/tests/upgrade.rs) checks that
-- the schema it leaves is the one a fresh CREATE EXTENSION makes. Changed functions are dropped
-- and created again (pgspot's PS002): no table depends on them.
\echo Use "ALTER EXTENSION pg_tide UPDATE TO '0.2.7'" to load this file. \quit
SET LOCAL search_path = pg_catalog, pg_temp;

-- What a history row counts, a C function (src/monitor/counting.rs): inlined SQL, it was
-- an expression compiled at every statement that wrote history, and again for every run.
DROP FUNCTION tide._counts_of(tide.run_state, integer, timestamptz, timestamptz, timestamptz, timestamptz, timestamptz);
DROP FUNCTION tide._duration_bucket(interval);
DROP FUNCTION tide._le(double precision);
CREATE  FUNCTION tide."_le"(
	"seconds" double precision /* f64 */
) RETURNS TEXT /* Option < & '_ str > */
IMMUTABLE STRICT PARALLEL SAFE  
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'le_wrapper';
COMMENT ON FUNCTION tide._le(double precision) IS
    'Internal: the histogram bucket (its upper bound, the le label) of a duration or wait in seconds; NULL above 21600 (+Inf only).';

CREATE  FUNCTION tide."_counts_of"(
	"p_to" TEXT, /* Option < & str > */
	"p_attempts" INT, /* Option < i32 > */
	"p_claimed" timestamp with time zone, /* Option < TimestampWithTimeZone > */
	"p_finished" timestamp with time zone, /* Option < TimestampWithTimeZone > */
	"p_started" timestamp with time zone, /* Option < TimestampWithTimeZone > */
	"p_fire" timestamp with time zone, /* Option < TimestampWithTimeZone > */
	"p_created" timestamp with time zone /* Option < TimestampWithTimeZone > */
) RETURNS TABLE (
	"metric" TEXT,  /* String */
	"label" TEXT,  /* String */
	"value" double precision  /* f64 */
)
STABLE PARALLEL SAFE  
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'counts_of_wrapper';
COMMENT ON FUNCTION tide._counts_of(text, integer, timestamptz, timestamptz, timestamptz, timestamptz, timestamptz) IS
    'Internal: what a history row that brings a run to a state adds to the counters of tide.metrics() and to the hourly counters of tide.run_hours (metric, label, value).';

-- The writers that call it.
DROP FUNCTION tide._write_history(tide.run_change[], boolean);
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

DROP FUNCTION tide._create_runs(tide.new_run[], boolean);
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

REVOKE EXECUTE ON FUNCTION tide._write_history(tide.run_change[], boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._create_runs(tide.new_run[], boolean) FROM PUBLIC;

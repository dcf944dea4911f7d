-- The tick's work on existing runs (tide._tick_runs): one list of steps, in order, each a
-- function of its own run in a subtransaction of its own.

-- Parked runs whose wait is over are looked at by claims again (a wake-up may have been
-- lost: the run they waited for was deleted, say).
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

-- Backoff passed: retries are ready again.
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

-- SQL runs whose executor process is gone (killed, terminated, or the server restarted):
-- the server knows which backends live, so the attempt is lost now, not at its lease's
-- end. (A backend's pid and start time name it; pids are reused.) The status of the
-- backends is read after the runs' snapshot is taken, so a run claimed by an executor
-- that started since cannot look orphaned.
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

-- Leases that expired: the attempt is lost and counts; the run retries or goes dead.
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

-- Waiting runs without an SQL check: released by their marker, or by time when they
-- only waited for the next window. Runs with a check are released by the executors.
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

-- Still not ready at the deadline: the task's not_ready_policy decides.
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

-- The tick's work on existing runs, all at the instant p_now: the one list of its steps, in
-- order. Each step works on the rows it can lock at once (SKIP LOCKED: a run held by a role's
-- open transaction waits for the next tick) and runs in its own subtransaction, so a step that
-- fails is logged and the others go on. What a step returns is tide.tick's count of the same
-- name (but unparked and analyzed, which are bookkeeping).
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

-- The tick's work on existing runs (tide._tick_runs): one list of steps, each its own
-- subtransaction (tide._tick_step).

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
        -- Backfills move on: how their runs ended, the canary, the next batch (sql/backfill.sql).
        n := tide._tick_backfills(p_now);
    END CASE;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._tick_step(text, timestamptz) IS
    'Internal: one step of the tick''s work on existing runs (see tide._tick_runs).';

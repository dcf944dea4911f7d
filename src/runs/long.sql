-- pg_tide long runs: the checkpoint in a command, and pause_run / resume_run / cancel_run, taken
-- up between the batches of a long task or at an external worker's heartbeat, and at once by a
-- running SQL command, which is interrupted (tide._ask_to_stop). (The batches themselves are run
-- by tide._execute, src/workers/execute.sql, and the executor loop, src/workers/mod.rs.)

CREATE FUNCTION tide.checkpoint() RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT r.checkpoint FROM tide.run r WHERE r.run_id = tide.run_id() $$;
COMMENT ON FUNCTION tide.checkpoint() IS 'Inside a task''s command: the run''s last committed checkpoint (NULL at the start); a long task''s batch continues from it.';

-- Ends a running run that was asked to pause or cancel (between batches, at a heartbeat, or
-- with its command interrupted: p_interrupted, the command's or batch's work rolled back). The
-- reason keeps who asked, and why (recorded when they asked).
CREATE FUNCTION tide._stop_run(p_run_id bigint, p_progress jsonb, p_interrupted boolean DEFAULT false,
                               p_note text DEFAULT NULL)
RETURNS tide.run_state
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE tide.run x
       SET state = CASE WHEN x.control = 'cancel' THEN 'cancelled' ELSE 'paused' END::tide.run_state,
           checkpoint = coalesce(p_progress, x.checkpoint), control = NULL, lease_expires_at = NULL,
           finished_at = CASE WHEN x.control = 'cancel' THEN now() END, updated_at = now(),
           reason = format('%s %s (%s)',
                           CASE WHEN x.control = 'cancel' THEN 'cancelled' ELSE 'paused' END,
                           CASE WHEN p_note IS NOT NULL THEN p_note
                                WHEN p_interrupted AND x.batches > 0
                                THEN format('after %s batches, its running batch interrupted and rolled back', x.batches)
                                WHEN p_interrupted THEN 'while running, its command interrupted and its work rolled back'
                                ELSE format('after %s batches', x.batches) END,
                           CASE WHEN x.reason LIKE x.control || ' asked by %' THEN x.reason
                                ELSE format('asked by tide.%s_run', x.control) END)
     WHERE x.run_id = p_run_id AND x.state = 'running' AND x.control IS NOT NULL
    RETURNING x.state
$$;
COMMENT ON FUNCTION tide._stop_run(bigint, jsonb, boolean, text) IS
    'Internal: pauses or cancels a running run whose pause or cancel was asked for, keeping its checkpoint (interrupted: its running command or batch was rolled back; a note says otherwise what became of it).';

-- Asks a running run to pause or cancel, recording who asked and why. A run of pg_tide's SQL
-- executors has its command interrupted at once (a cancel always; a pause unless the task is
-- long, which pauses between batches without losing work): the executor's backend gets a
-- query cancel, and its error handler, waiting for this transaction's row lock, finds the
-- request and stops the run. (The executor cannot finish the run meanwhile: this transaction
-- holds its row.) A run whose command a command worker runs (top-level, or in another
-- database: src/workers/command.rs) has that worker's statement cancelled, for a pause as for a cancel;
-- the outcome, recorded by whoever collects it, finds the request and stops the run (a paused
-- one runs again from its first statement when resumed).
CREATE FUNCTION tide._ask_to_stop(r tide.run, p_control text, p_why text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    rules jsonb;
BEGIN
    UPDATE tide.run x SET control = p_control, updated_at = now(),
           reason = format('%s asked by %s%s', p_control, tide._caller(), coalesce(': ' || tide._clip(p_why, 500), ''))
     WHERE x.run_id = r.run_id;
    IF r.executor <> 'sql' OR r.executor_pid IS NULL THEN
        RETURN;  -- an external worker: it stops at its next heartbeat
    END IF;
    SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = r.task_id AND v.version = r.version;
    IF coalesce((rules->>'top_level')::boolean, false) OR rules->>'database' IS NOT NULL THEN
        PERFORM pg_cancel_backend(w.pid) FROM tide._command_workers() w
         WHERE w.run_id = r.run_id AND w.state = 'running' AND w.pid IS NOT NULL;
        RETURN;
    END IF;
    IF p_control = 'pause' AND coalesce((rules->>'long')::boolean, false) THEN
        RETURN;  -- between batches
    END IF;
    PERFORM pg_cancel_backend(a.pid) FROM pg_stat_activity a
     WHERE a.pid = r.executor_pid AND a.backend_start = r.executor_start;
END
$$;
COMMENT ON FUNCTION tide._ask_to_stop(tide.run, text, text) IS
    'Internal: records a pause or cancel asked of a running run (who and why) and interrupts the command of an SQL run.';

CREATE FUNCTION tide._control_target(p_run_id bigint, p_function text) RETURNS tide.run
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
    taking_line boolean;
BEGIN
    IF p_run_id IS NULL THEN
        RAISE EXCEPTION '%: run_id must not be NULL', p_function USING ERRCODE = 'null_value_not_allowed',
            HINT = 'find the run with: SELECT run_id, state FROM tide.run WHERE task_id = ...';
    END IF;
    -- The run, then its line in tide.pending, which a change of the run writes. A claim locks the
    -- line first and the run second: waiting for the line while holding the run could deadlock
    -- with it. So the line is taken without waiting; while it is busy, the run is let go (with
    -- the subtransaction) and both are tried again shortly.
    FOR attempt IN 1..500 LOOP
        BEGIN
            taking_line := false;
            SELECT * INTO r FROM tide.run x WHERE x.run_id = p_run_id AND tide._may_act(x.owner) FOR UPDATE;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'run % does not exist', p_run_id USING ERRCODE = 'undefined_object',
                    HINT = 'find the run with: SELECT run_id, state FROM tide.run WHERE task_id = ...; runs of other roles'' tasks are not visible';
            END IF;
            taking_line := true;
            PERFORM 1 FROM tide.pending p WHERE p.run_id = p_run_id FOR UPDATE NOWAIT;
            RETURN r;
        EXCEPTION WHEN lock_not_available THEN
            -- Only the line's busy lock is tried again: the caller's lock_timeout, expired while
            -- waiting for the run itself, is its error.
            IF NOT taking_line THEN
                RAISE;
            END IF;
            PERFORM pg_sleep(0.01);
        END;
    END LOOP;
    RAISE EXCEPTION '%: run % is being claimed or changed right now', p_function, p_run_id
        USING ERRCODE = 'lock_not_available', HINT = 'try again in a moment';
END
$$;
COMMENT ON FUNCTION tide._control_target(bigint, text) IS
    'Internal: the run a pause/resume/cancel works on, locked with its line in tide.pending (taken without waiting, in the order no claim deadlocks with; tried again for about 5 s while the line is busy).';

CREATE FUNCTION tide.pause_run(run_id bigint) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
BEGIN
    r := tide._control_target(pause_run.run_id, 'tide.pause_run');
    IF r.state = 'running' THEN
        PERFORM tide._ask_to_stop(r, 'pause', NULL);
        RETURN 'pausing';
    ELSIF r.state IN ('waiting', 'ready', 'retry') THEN
        UPDATE tide.run x SET state = 'paused', updated_at = now(),
               reason = format('paused by %s (was %s)', tide._caller(), r.state)
         WHERE x.run_id = r.run_id;
        RETURN 'paused';
    ELSIF r.state = 'paused' THEN
        RETURN 'paused';
    END IF;
    RAISE EXCEPTION 'run % is %, so there is nothing to pause', r.run_id, r.state
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'only a waiting, ready, retrying or running run can be paused';
END
$$;
COMMENT ON FUNCTION tide.pause_run(bigint) IS
    'pause_run(run_id): pauses a run. One not started is paused at once (returns paused); a running one stops at its next batch (long task) or heartbeat, keeping its checkpoint, and the command of a running SQL run that is not long is interrupted and its work rolled back (returns pausing). tide.resume_run puts it back in line.';

CREATE FUNCTION tide.resume_run(run_id bigint) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
    rules jsonb;
BEGIN
    r := tide._control_target(resume_run.run_id, 'tide.resume_run');
    IF r.state = 'running' AND r.control = 'pause' THEN
        UPDATE tide.run x SET control = NULL, updated_at = now() WHERE x.run_id = r.run_id;
        RETURN 'running';
    ELSIF r.state = 'paused' THEN
        SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = r.task_id AND v.version = r.version;
        UPDATE tide.run x
           SET state = CASE WHEN r.attempts > 0 THEN 'ready' ELSE tide._open_state(rules) END::tide.run_state,
               run_after = NULL, updated_at = now(),
               reason = format('resumed by %s%s', tide._caller(),
                               CASE WHEN r.checkpoint IS NOT NULL THEN ' (continues from its checkpoint)' ELSE '' END)
         WHERE x.run_id = r.run_id;
        RETURN (SELECT x.state::text FROM tide.run x WHERE x.run_id = r.run_id);
    END IF;
    RAISE EXCEPTION 'run % is %, not paused', r.run_id, r.state
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'tide.resume_run continues a run paused with tide.pause_run';
END
$$;
COMMENT ON FUNCTION tide.resume_run(bigint) IS
    'resume_run(run_id): puts a paused run back in line (it continues from its checkpoint), or withdraws a pause not yet taken up. Returns the run''s state.';

CREATE FUNCTION tide.cancel_run(run_id bigint, reason text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
BEGIN
    r := tide._control_target(cancel_run.run_id, 'tide.cancel_run');
    IF r.state = 'running' THEN
        PERFORM tide._ask_to_stop(r, 'cancel', cancel_run.reason);
        RETURN 'cancelling';
    ELSIF r.state = 'cancelled' OR tide._cancel_waiting(r.run_id, cancel_run.reason) THEN
        RETURN 'cancelled';
    END IF;
    RAISE EXCEPTION 'run % already ended (%)', r.run_id, r.state
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'only an unfinished run can be cancelled';
END
$$;
COMMENT ON FUNCTION tide.cancel_run(bigint, text) IS
    'cancel_run(run_id, reason => NULL): cancels a run. One not running is cancelled at once (returns cancelled); the command of a running SQL run is interrupted and its work rolled back, and an external worker''s run stops at its next heartbeat (returns cancelling); committed batches stay. Who asked and why are recorded.';

-- A backfill going on (see backfill.sql): its queue, releasing windows in batches, how its runs
-- ended, the canary, the failure budget and the sample check (moved on by the tick and the
-- executors), and pause, resume, cancel; tide.backfill_status.

-- The backfill's own queue, backfill.<id>: its concurrency and rate (made again by a resume
-- after its end dropped it).
CREATE FUNCTION tide._backfill_queue(p_id bigint) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    b tide.backfill;
BEGIN
    SELECT * INTO b FROM tide.backfill x WHERE x.backfill_id = p_id;
    INSERT INTO tide.queue (owner, name, max_concurrency, rate, tokens)
    VALUES (b.owner, b.queue, b.concurrency, b.rate, greatest(1, coalesce(b.rate, 1)))
    ON CONFLICT ON CONSTRAINT queue_pkey DO NOTHING;
    IF FOUND THEN
        PERFORM tide._queue_recount(b.owner, b.queue);
    END IF;
END
$$;
COMMENT ON FUNCTION tide._backfill_queue(bigint) IS 'Internal: creates a backfill''s own queue (its concurrency and rate).';

-- Creates or reopens the run of one planned window, through the one idempotency key of a
-- window (tide._rerun); NULL, with why, when it is not needed any more.
CREATE FUNCTION tide._backfill_open(b tide.backfill, w tide.backfill_window, OUT run_id bigint, OUT why text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    existing bigint;
    was tide.run_state;
BEGIN
    SELECT x.run_id, x.state INTO existing, was
      FROM tide.run x WHERE x.task_id = b.task_id AND x.window_start = w.window_start FOR UPDATE;
    IF was IN ('waiting', 'ready', 'running', 'retry', 'held', 'paused') THEN
        why := format('run %s of the window was already in line (%s)', existing, was);
        RETURN;
    END IF;
    IF NOT tide._backfill_wants(b.mode, was, existing IS NULL AND tide._succeeded_before(b.task_id, w.window_start)) THEN
        why := CASE WHEN existing IS NULL OR was = 'succeeded' THEN 'the window succeeded meanwhile' ELSE 'not failed' END;
        RETURN;
    END IF;
    run_id := tide._rerun(b.task_id, w.fire_at, w.window_start, w.window_end, w.biz_date, b.version, b.force,
                          'tide.backfill', 'backfill', b.queue);
END
$$;
COMMENT ON FUNCTION tide._backfill_open(tide.backfill, tide.backfill_window) IS
    'Internal: creates or reopens the run of a backfill''s window (trigger backfill, in the backfill''s queue); NULL and why when it is not needed any more.';

-- Releases up to p_n planned windows of a backfill (p_canary: only canary windows); returns how
-- many runs it put in line. A window whose run cannot be made (its window is now beyond the
-- source's retention, say) is recorded failed with the reason; the others go on. A window whose
-- run a transaction holds right now (the owner's open transaction around a replay, say) stops
-- the round after a short wait and stays planned for the next one: the tick and the executors
-- that call this never wait long on a role's locks.
CREATE FUNCTION tide._backfill_release(b tide.backfill, p_n integer, p_canary boolean) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $$
DECLARE
    w tide.backfill_window;
    opened record;
    released integer := 0;
    skipped integer := 0;
    failed integer := 0;
    st text;
    msg text;
BEGIN
    FOR w IN SELECT * FROM tide.backfill_window x
              WHERE x.backfill_id = b.backfill_id AND x.state = 'planned' AND (NOT p_canary OR x.canary)
              ORDER BY x.seq LIMIT p_n LOOP
        BEGIN
            opened := tide._backfill_open(b, w);
            IF opened.run_id IS NULL THEN
                UPDATE tide.backfill_window x SET state = 'skipped', note = opened.why, finished_at = now()
                 WHERE x.backfill_id = w.backfill_id AND x.seq = w.seq;
                skipped := skipped + 1;
            ELSE
                UPDATE tide.backfill_window x SET state = 'released', run_id = opened.run_id, released_at = now()
                 WHERE x.backfill_id = w.backfill_id AND x.seq = w.seq;
                released := released + 1;
            END IF;
        EXCEPTION WHEN lock_not_available THEN
            EXIT;
        WHEN others THEN
            GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
            UPDATE tide.backfill_window x SET state = 'failed', finished_at = now(),
                                              note = format('could not be run (%s): %s', st, tide._clip(msg, 1000))
             WHERE x.backfill_id = w.backfill_id AND x.seq = w.seq;
            failed := failed + 1;
        END;
    END LOOP;
    UPDATE tide.backfill x
       SET windows_skipped = x.windows_skipped + skipped,
           windows_failed = x.windows_failed + failed, updated_at = now()
     WHERE x.backfill_id = b.backfill_id;
    RETURN released;
END
$$;
COMMENT ON FUNCTION tide._backfill_release(tide.backfill, integer, boolean) IS
    'Internal: puts the next planned windows of a backfill in line (creates or reopens their runs).';

-- Cancels the runs of an ended backfill that are in line and not started. Rows a claim (or the
-- tick) holds right now are skipped, in the claim's lock order (tide.pending, then tide.run), so
-- nothing waits: a run being claimed runs and finishes; one skipped otherwise is cancelled by a
-- later tick. Returns how many it cancelled.
CREATE FUNCTION tide._backfill_cancel_runs(p_id bigint) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
    why text;
    ids bigint[];
BEGIN
    SELECT format('cancelled with backfill %s: %s', b.backfill_id, tide._clip(b.reason, 500)) INTO why
      FROM tide.backfill b WHERE b.backfill_id = p_id;
    -- Arrays of ids, so that every step is an index lookup however large the history.
    SELECT array_agg(w.run_id) INTO ids FROM tide.backfill_window w WHERE w.backfill_id = p_id AND w.state = 'released';
    SELECT array_agg(p.run_id) INTO ids FROM (
        SELECT p.run_id FROM tide.pending p
         WHERE p.run_id = ANY (ids) AND p.state IN ('waiting', 'ready', 'retry', 'held', 'paused')
           FOR UPDATE SKIP LOCKED) p;
    SELECT array_agg(x.run_id) INTO ids FROM (
        SELECT x.run_id FROM tide.run x
         WHERE x.run_id = ANY (ids) AND x.state IN ('waiting', 'ready', 'retry', 'held', 'paused')
           FOR UPDATE SKIP LOCKED) x;
    UPDATE tide.run r
       SET state = 'cancelled', finished_at = now(), updated_at = now(), lease_expires_at = NULL, reason = why
     WHERE r.run_id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._backfill_cancel_runs(bigint) IS
    'Internal: cancels the not-started runs of an ended backfill, skipping rows held right now (a later tick cancels those).';

-- Moves a backfill to another state with a reason; an end also ends what is left of it.
CREATE FUNCTION tide._backfill_to(p_id bigint, p_state text, p_reason text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    b tide.backfill;
BEGIN
    UPDATE tide.backfill x
       SET state = p_state, reason = p_reason, updated_at = now(), verify_at = NULL, next_batch_at = NULL,
           failure_pause = false,
           resume_to = CASE WHEN p_state = 'paused' THEN coalesce(x.resume_to, x.state) END,
           finished_at = CASE WHEN p_state IN ('done', 'precheck_failed', 'verify_failed', 'needs_review', 'cancelled')
                              THEN now() END
     WHERE x.backfill_id = p_id
    RETURNING * INTO b;
    IF p_state IN ('verify_failed', 'cancelled') THEN
        -- The rest will not run: planned windows are cancelled, and so are released runs that
        -- have not started (running ones finish).
        WITH gone AS (
            UPDATE tide.backfill_window w SET state = 'cancelled', finished_at = now(), note = p_reason
             WHERE w.backfill_id = p_id AND w.state = 'planned'
            RETURNING 1)
        UPDATE tide.backfill x SET windows_cancelled = x.windows_cancelled + (SELECT count(*) FROM gone)
         WHERE x.backfill_id = p_id;
        PERFORM tide._backfill_cancel_runs(p_id);
    END IF;
    IF b.finished_at IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM tide.backfill_window w WHERE w.backfill_id = p_id AND w.state = 'released') THEN
        -- Ended with nothing of it in line: its queue goes (else when its last run ends).
        DELETE FROM tide.queue q WHERE q.owner = b.owner AND q.name = b.queue;
        IF FOUND THEN
            PERFORM tide._queue_forget(b.owner, b.queue);
        END IF;
    ELSIF p_state = 'paused' THEN
        UPDATE tide.queue q SET paused = true, paused_at = now(), updated_at = now()
         WHERE q.owner = b.owner AND q.name = b.queue;
    ELSIF p_state IN ('canary', 'running', 'sampling') THEN
        UPDATE tide.queue q SET paused = false, paused_at = NULL, updated_at = now()
         WHERE q.owner = b.owner AND q.name = b.queue AND q.paused;
        IF FOUND THEN
            PERFORM tide._wake_queue(b.owner, b.queue);
        END IF;
    END IF;
END
$$;
COMMENT ON FUNCTION tide._backfill_to(bigint, text, text) IS
    'Internal: changes a backfill''s state with its reason (recorded in tide.backfill_event); a pause pauses its queue, an end cancels what has not started.';

-- Moves one backfill on: records how its released windows ended, pauses it after too many
-- failures, releases the canary and then the batches, and starts the sample check at the end.
CREATE FUNCTION tide._advance_backfill(p_id bigint, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    b tide.backfill;
    n_done integer;
    n_failed integer;
    n_cancelled integer;
    in_line integer;
    released integer := 0;
    bad record;
BEGIN
    UPDATE tide.backfill x SET advanced_at = p_now WHERE x.backfill_id = p_id RETURNING * INTO b;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    -- How the released windows' runs ended.
    WITH ended AS (
        UPDATE tide.backfill_window w
           SET state = CASE r.state WHEN 'succeeded' THEN 'succeeded' WHEN 'cancelled' THEN 'cancelled' ELSE 'failed' END,
               finished_at = coalesce(r.finished_at, now()),
               note = CASE WHEN r.state <> 'succeeded' THEN tide._clip(r.reason, 1000) END
          FROM (SELECT x.seq, y.state, y.finished_at, y.reason
                  FROM tide.backfill_window x
                  -- One index lookup per released window, however large the history.
                  CROSS JOIN LATERAL (SELECT z.state, z.finished_at, z.reason FROM tide.run z
                                       WHERE z.run_id = x.run_id LIMIT 1) y
                 WHERE x.backfill_id = p_id AND x.state = 'released'
                   AND y.state IN ('succeeded', 'need_check', 'dead', 'skipped', 'cancelled')) r
         WHERE w.backfill_id = p_id AND w.seq = r.seq
        RETURNING w.state)
    SELECT count(*) FILTER (WHERE e.state = 'succeeded'), count(*) FILTER (WHERE e.state = 'failed'),
           count(*) FILTER (WHERE e.state = 'cancelled')
      INTO n_done, n_failed, n_cancelled FROM ended e;
    IF n_done + n_failed + n_cancelled > 0 THEN
        UPDATE tide.backfill x
           SET windows_done = x.windows_done + n_done, windows_failed = x.windows_failed + n_failed,
               windows_cancelled = x.windows_cancelled + n_cancelled, updated_at = now()
         WHERE x.backfill_id = p_id
        RETURNING * INTO b;
    END IF;
    SELECT count(*) INTO in_line FROM tide.backfill_window w WHERE w.backfill_id = p_id AND w.state = 'released';
    IF b.state IN ('cancelled', 'verify_failed') AND in_line > 0 THEN
        -- Runs a claim held when it ended.
        PERFORM tide._backfill_cancel_runs(p_id);
    END IF;
    IF b.state NOT IN ('canary', 'running', 'sampling') THEN
        IF b.finished_at IS NOT NULL AND in_line = 0 THEN
            -- Ended, nothing of it left in line: its queue goes.
            DELETE FROM tide.queue q WHERE q.owner = b.owner AND q.name = b.queue;
            IF FOUND THEN
                PERFORM tide._queue_forget(b.owner, b.queue);
            END IF;
        END IF;
        RETURN 0;
    END IF;
    -- R14.1: a broken downstream is not hammered.
    IF b.windows_failed - b.failures_from > b.max_failures THEN
        PERFORM tide._backfill_to(p_id, 'paused',
            format('paused: %s windows failed, more than max_failures (%s); see tide.dead_letter, then tide.resume_backfill(%s)',
                   b.windows_failed - b.failures_from, b.max_failures, p_id));
        UPDATE tide.backfill x SET failure_pause = true WHERE x.backfill_id = p_id;
        RETURN 0;
    END IF;
    IF b.state = 'canary' THEN
        IF EXISTS (SELECT 1 FROM tide.backfill_window w WHERE w.backfill_id = p_id AND w.canary AND w.state = 'planned') THEN
            released := tide._backfill_release(b, b.canary, true);
            SELECT count(*) INTO in_line FROM tide.backfill_window w WHERE w.backfill_id = p_id AND w.state = 'released';
        END IF;
        IF in_line > 0 OR b.verify_at IS NOT NULL THEN
            RETURN released;
        END IF;
        -- Every canary window ended.
        SELECT w.biz_date, w.state, w.note, w.run_id INTO bad FROM tide.backfill_window w
         WHERE w.backfill_id = p_id AND w.canary AND w.state IN ('failed', 'cancelled') ORDER BY w.seq LIMIT 1;
        IF FOUND THEN
            PERFORM tide._backfill_to(p_id, 'verify_failed',
                format('canary window %s %s (run %s): %s', bad.biz_date, bad.state, coalesce(bad.run_id::text, '-'), coalesce(bad.note, '')));
            RETURN released;
        END IF;
        IF b.verify IS NOT NULL AND EXISTS (SELECT 1 FROM tide.backfill_window w
                                             WHERE w.backfill_id = p_id AND w.canary AND w.state = 'succeeded') THEN
            -- The executors evaluate verify (user code) for each canary window.
            UPDATE tide.backfill x SET verify_at = p_now, reason = 'canary ran; verifying it', updated_at = now()
             WHERE x.backfill_id = p_id;
            RETURN released;
        END IF;
        PERFORM tide._backfill_to(p_id, 'running', format('canary succeeded (%s windows); releasing the rest in batches of %s',
                                                         (SELECT count(*) FROM tide.backfill_window w WHERE w.backfill_id = p_id AND w.canary), b.batch));
        SELECT * INTO b FROM tide.backfill x WHERE x.backfill_id = p_id;
    END IF;
    IF b.state = 'running' AND in_line = 0 THEN
        IF NOT EXISTS (SELECT 1 FROM tide.backfill_window w WHERE w.backfill_id = p_id AND w.state = 'planned') THEN
            -- The last window ended.
            IF b.windows_failed > 0 THEN
                PERFORM tide._backfill_to(p_id, 'needs_review',
                    format('%s of %s windows failed (see tide.backfill_window and tide.dead_letter)', b.windows_failed, b.windows_total));
            ELSIF b.verify IS NULL OR b.sample = 0 OR b.windows_done = 0 THEN
                PERFORM tide._backfill_to(p_id, 'done',
                    format('%s windows succeeded, %s skipped (not needed any more), %s cancelled', b.windows_done, b.windows_skipped, b.windows_cancelled));
            ELSE
                UPDATE tide.backfill_window w SET sampled = true
                 WHERE (w.backfill_id, w.seq) IN (SELECT x.backfill_id, x.seq FROM tide.backfill_window x
                                                   WHERE x.backfill_id = p_id AND x.state = 'succeeded'
                                                   ORDER BY x.canary, random() LIMIT b.sample);
                PERFORM tide._backfill_to(p_id, 'sampling',
                    format('%s windows succeeded; verifying a random sample of %s', b.windows_done, least(b.sample, b.windows_done)));
                UPDATE tide.backfill x SET verify_at = p_now WHERE x.backfill_id = p_id;
            END IF;
            RETURN released;
        END IF;
        IF b.batches > 0 AND b.pause IS NOT NULL AND b.next_batch_at IS NULL THEN
            UPDATE tide.backfill x SET next_batch_at = p_now + b.pause, updated_at = now(),
                                       reason = format('batch %s done; next batch at %s', b.batches, p_now + b.pause)
             WHERE x.backfill_id = p_id;
            RETURN released;
        END IF;
        IF b.next_batch_at IS NULL OR b.next_batch_at <= p_now THEN
            released := released + tide._backfill_release(b, b.batch, false);
            UPDATE tide.backfill x SET batches = x.batches + 1, next_batch_at = NULL, updated_at = now(),
                                       reason = format('batch %s: %s windows released', x.batches + 1, released)
             WHERE x.backfill_id = p_id;
        END IF;
    END IF;
    RETURN released;
END
$$;
COMMENT ON FUNCTION tide._advance_backfill(bigint, timestamptz) IS
    'Internal: moves one backfill on (how its runs ended, max_failures, canary, batches, sample); returns the windows it released.';

-- The tick's step: every backfill that is going on, or has runs left in line, each isolated.
CREATE FUNCTION tide._tick_backfills(p_now timestamptz) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id bigint;
    n integer := 0;
BEGIN
    -- The queues of backfills that are gone (their task was unscheduled) go too.
    WITH gone AS (
        DELETE FROM tide.queue q
         WHERE (q.owner, q.name) IN (
                   SELECT x.owner, x.name FROM tide.queue x
                    WHERE x.name LIKE 'backfill.%'
                      AND NOT EXISTS (SELECT 1 FROM tide.backfill b WHERE b.owner = x.owner AND b.queue = x.name)
                      FOR UPDATE SKIP LOCKED)
        RETURNING q.owner, q.name)
    SELECT count(tide._queue_forget(g.owner, g.name)) INTO n FROM gone g;
    n := 0;
    FOR id IN SELECT b.backfill_id FROM tide.backfill b
               WHERE b.state IN ('canary', 'running', 'sampling')
                  OR EXISTS (SELECT 1 FROM tide.backfill_window w WHERE w.backfill_id = b.backfill_id AND w.state = 'released')
                  OR (b.finished_at IS NOT NULL AND EXISTS (SELECT 1 FROM tide.queue q WHERE q.owner = b.owner AND q.name = b.queue))
               ORDER BY b.backfill_id
                 FOR UPDATE SKIP LOCKED LOOP
        BEGIN
            n := n + tide._advance_backfill(id, p_now);
        EXCEPTION WHEN others THEN
            RAISE WARNING 'pg_tide: backfill % could not move on: %', id, SQLERRM;
        END;
    END LOOP;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._tick_backfills(timestamptz) IS
    'Internal: the tick''s step that moves every backfill on; returns the windows released.';

-- The executors' part: verifies the canary or the sample of one backfill that is due (verify is
-- user code, run sealed as the owner, read-only, with each window's run context); else moves
-- on one backfill not moved on for a second, so that batches follow each other even while the
-- tick is slow (its monitoring step over a large history, say). True if it verified or
-- released windows.
CREATE FUNCTION tide._backfill_work() RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    b tide.backfill;
    w tide.backfill_window;
    why text;
    checked integer := 0;
    failures integer := 0;
    first_failure text;
    timeout_ms integer;
    moved bigint;
BEGIN
    SELECT * INTO b FROM tide.backfill x
     WHERE x.state IN ('canary', 'sampling') AND x.verify_at <= now()
     ORDER BY x.verify_at LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        SELECT x.backfill_id INTO moved FROM tide.backfill x
         WHERE x.state IN ('canary', 'running', 'sampling')
           AND (x.advanced_at IS NULL OR x.advanced_at < now() - interval '1 second')
         ORDER BY x.advanced_at NULLS FIRST LIMIT 1 FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        RETURN tide._advance_backfill(moved, now()) > 0;
    END IF;
    SELECT least(tide._timeout_ms(t.timeout::text), 60000) INTO timeout_ms FROM tide.task t WHERE t.task_id = b.task_id;
    FOR w IN SELECT * FROM tide.backfill_window x
              WHERE x.backfill_id = b.backfill_id AND x.state = 'succeeded'
                AND CASE WHEN b.state = 'canary' THEN x.canary ELSE x.sampled END
              ORDER BY x.seq LOOP
        why := tide._judge('verify', b.verify, b.owner, w.run_id, timeout_ms, false);
        checked := checked + 1;
        UPDATE tide.backfill_window x SET verified = why IS NULL, verify_note = coalesce(why, 'verified')
         WHERE x.backfill_id = w.backfill_id AND x.seq = w.seq;
        IF why IS NOT NULL THEN
            failures := failures + 1;
            first_failure := coalesce(first_failure, format('%s (run %s): %s', w.biz_date, w.run_id, why));
        END IF;
    END LOOP;
    IF b.state = 'canary' THEN
        IF failures > 0 THEN
            PERFORM tide._backfill_to(b.backfill_id, 'verify_failed',
                format('verify failed for %s of %s canary windows: %s', failures, checked, first_failure));
        ELSE
            PERFORM tide._backfill_to(b.backfill_id, 'running',
                format('canary verified (%s windows); releasing the rest in batches of %s', checked, b.batch));
            PERFORM tide._advance_backfill(b.backfill_id, now());
        END IF;
    ELSIF failures > 0 THEN
        PERFORM tide._backfill_to(b.backfill_id, 'needs_review',
            format('sample check failed for %s of %s windows: %s', failures, checked, first_failure));
    ELSE
        PERFORM tide._backfill_to(b.backfill_id, 'done',
            format('%s windows succeeded; a random sample of %s verified', b.windows_done, checked));
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION tide._backfill_work() IS
    'Internal: verifies the canary or the sample of one due backfill, sealed as its owner and read-only, else moves one backfill on (called by pg_tide executors).';

-- The caller's backfill, locked; a clear error when there is none.
CREATE FUNCTION tide._own_backfill(p_id bigint, p_function text) RETURNS tide.backfill
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    b tide.backfill;
BEGIN
    IF p_id IS NULL THEN
        RAISE EXCEPTION 'backfill_id must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'find it with: SELECT backfill_id, task, state FROM tide.backfill_status';
    END IF;
    SELECT * INTO b FROM tide.backfill x WHERE x.backfill_id = p_id AND tide._may_act(x.owner) FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'backfill % does not exist', p_id USING ERRCODE = 'undefined_object',
            HINT = format('find yours with: SELECT backfill_id, task, state FROM tide.backfill_status (then %s(id))', p_function);
    END IF;
    RETURN b;
END
$$;
COMMENT ON FUNCTION tide._own_backfill(bigint, text) IS 'Internal: the caller''s backfill of this id, locked, or a clear error.';

CREATE FUNCTION tide.pause_backfill(backfill_id bigint) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    b tide.backfill := tide._own_backfill(pause_backfill.backfill_id, 'tide.pause_backfill');
BEGIN
    IF b.state = 'paused' THEN
        RETURN 'paused';
    END IF;
    IF b.state NOT IN ('canary', 'running', 'sampling') THEN
        RAISE EXCEPTION 'backfill % already ended (%)', b.backfill_id, b.state
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'only a backfill going on can be paused';
    END IF;
    PERFORM tide._backfill_to(b.backfill_id, 'paused',
        format('paused by %s: running windows finish, no other starts until tide.resume_backfill(%s)', tide._caller(), b.backfill_id));
    RETURN 'paused';
END
$$;
COMMENT ON FUNCTION tide.pause_backfill(bigint) IS
    'pause_backfill(backfill_id): no window of the backfill starts until tide.resume_backfill (running ones finish). Returns paused.';

CREATE FUNCTION tide.resume_backfill(backfill_id bigint) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    b tide.backfill := tide._own_backfill(resume_backfill.backfill_id, 'tide.resume_backfill');
    who name := tide._caller();
BEGIN
    CASE b.state
    WHEN 'paused' THEN
        -- max_failures counts the failures from here on.
        UPDATE tide.backfill x SET failures_from = x.windows_failed WHERE x.backfill_id = b.backfill_id;
        PERFORM tide._backfill_to(b.backfill_id, b.resume_to, format('resumed by %s', who));
    WHEN 'verify_failed' THEN
        -- A person looked at the canary and lets the rest run.
        IF NOT EXISTS (SELECT 1 FROM tide.backfill_window w WHERE w.backfill_id = b.backfill_id AND w.state = 'cancelled'
                          AND w.run_id IS NULL) THEN
            RAISE EXCEPTION 'backfill % has no windows left to run', b.backfill_id
                USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'start a new one with tide.backfill(...)';
        END IF;
        WITH back AS (
            UPDATE tide.backfill_window w SET state = 'planned', finished_at = NULL, note = NULL
             WHERE w.backfill_id = b.backfill_id AND w.state = 'cancelled' AND w.run_id IS NULL
            RETURNING 1)
        UPDATE tide.backfill x SET windows_cancelled = x.windows_cancelled - (SELECT count(*) FROM back),
                                   failures_from = x.windows_failed
         WHERE x.backfill_id = b.backfill_id;
        PERFORM tide._backfill_queue(b.backfill_id);
        PERFORM tide._backfill_to(b.backfill_id, 'running', format('resumed by %s after the canary: the rest runs', who));
    WHEN 'needs_review' THEN
        PERFORM tide._backfill_to(b.backfill_id, 'done', format('accepted by %s after review: %s', who, b.reason));
        RETURN 'done';
    WHEN 'canary', 'running', 'sampling' THEN
        RETURN b.state;
    ELSE
        RAISE EXCEPTION 'backfill % already ended (%)', b.backfill_id, b.state
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'a paused backfill resumes; verify_failed runs the rest; needs_review is accepted as done';
    END CASE;
    PERFORM tide._advance_backfill(b.backfill_id, now());
    RETURN (SELECT x.state FROM tide.backfill x WHERE x.backfill_id = b.backfill_id);
END
$$;
COMMENT ON FUNCTION tide.resume_backfill(bigint) IS
    'resume_backfill(backfill_id): a paused backfill goes on (max_failures counts anew); after verify_failed, a person who checked the canary lets the rest run; needs_review is accepted as done. Returns the new state.';

CREATE FUNCTION tide.cancel_backfill(backfill_id bigint) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    b tide.backfill := tide._own_backfill(cancel_backfill.backfill_id, 'tide.cancel_backfill');
BEGIN
    IF b.state = 'cancelled' THEN
        RETURN 'cancelled';
    END IF;
    IF b.finished_at IS NOT NULL THEN
        RAISE EXCEPTION 'backfill % already ended (%)', b.backfill_id, b.state
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'only a backfill going on (or paused) can be cancelled';
    END IF;
    PERFORM tide._backfill_to(b.backfill_id, 'cancelled',
        format('cancelled by %s: running windows finish, the rest is cancelled', tide._caller()));
    PERFORM tide._advance_backfill(b.backfill_id, now());
    RETURN 'cancelled';
END
$$;
COMMENT ON FUNCTION tide.cancel_backfill(bigint) IS
    'cancel_backfill(backfill_id): ends a backfill: running windows finish, the others (planned, or in line and not started) are cancelled and recorded. Returns cancelled.';

-- Readable in 80 columns: compact progress, rate and ETA.
-- The current rate is that of the last minute while the backfill goes on (windows ended in it),
-- else of its whole run; the ETA divides what is left by it.
CREATE VIEW tide.backfill_status WITH (security_invoker = true) AS
SELECT s.backfill_id, s.task, s.from_date, s.to_date, s.state,
       s.windows_total, s.windows_done, s.windows_failed, s.windows_running, s.windows_in_line,
       s.windows_skipped, s.windows_cancelled, s.rate,
       CASE WHEN s.finished IS NULL AND s.state <> 'paused' AND s.rate > 0
            THEN make_interval(secs => round(s.windows_left / s.rate)::float8) END AS eta,
       s.started, s.finished, s.reason, s.mode, s.concurrency, s.batch, s.queue, s.owner
  FROM (SELECT b.backfill_id, t.name AS task, b.from_date, b.to_date, b.state,
               b.windows_total, b.windows_done, b.windows_failed,
               (SELECT count(*) FROM tide.backfill_window w
                 CROSS JOIN LATERAL (SELECT r.state FROM tide.run r WHERE r.run_id = w.run_id LIMIT 1) r
                 WHERE w.backfill_id = b.backfill_id AND w.state = 'released' AND r.state = 'running')::integer AS windows_running,
               (SELECT count(*) FROM tide.backfill_window w
                 WHERE w.backfill_id = b.backfill_id AND w.state = 'released')::integer AS windows_in_line,
               b.windows_skipped, b.windows_cancelled,
               b.windows_total - b.windows_done - b.windows_failed - b.windows_skipped - b.windows_cancelled AS windows_left,
               round(CASE WHEN b.finished_at IS NULL AND now() - b.started_at > interval '1 minute'
                          THEN (SELECT count(*) FROM tide.backfill_window w
                                 WHERE w.backfill_id = b.backfill_id AND w.finished_at > now() - interval '1 minute') / 60.0
                          ELSE (b.windows_done + b.windows_failed)
                               / greatest(extract(epoch FROM coalesce(b.finished_at, now()) - b.started_at), 1)::numeric END,
                     2) AS rate,
               b.started_at AS started, b.finished_at AS finished, b.reason,
               b.mode, b.concurrency, b.batch, b.queue, b.owner
          FROM tide.backfill b JOIN tide.task t ON t.task_id = b.task_id) s;
COMMENT ON VIEW tide.backfill_status IS
    'One row per backfill: range, state, windows total/done/failed/running (their runs running now)/in_line (released, not ended)/skipped/cancelled, rate (windows per second over the last minute while it goes on, else over its run), ETA, started, finished and the last reason.';
GRANT SELECT ON tide.backfill_status TO PUBLIC;

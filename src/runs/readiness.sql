-- Readiness: a run waiting for its readiness check (tide._check_ready, evaluated by the
-- executors), the probe for the next check due, and tide.mark_ready.

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

-- Monitoring (this folder, with src/alerts/alerts.sql): task health, heartbeat checks, alerts,
-- metrics, run log lines, explain, retention. This file: the settings monitoring reads, the
-- gaps between a task's fires, severities, tide.monitor, late starts and silence.
--
-- Everything here reads what the engine already keeps (tide.task, tide.run, tide.pending,
-- tide.attempt, tide.run_event) and is driven by the tick (tide._monitor), so it works at
-- explicit instants in tests like the rest of the scheduler. Nothing here runs on the hot paths
-- except the run log lines, which are off with pg_tide.log_runs = off.

-- ---------------------------------------------------------------------------------------------
-- Settings read from SQL (defined in src/settings.rs; the fallbacks apply only where the
-- library is not loaded). Inlined into its callers (an SQL function with a SET clause is parsed
-- and planned at every call), so it has no SET clause: its body names everything with its schema
-- instead, so it is safe under any search_path (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._setting(name text, fallback text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN pg_catalog.current_setting('pg_tide.' OPERATOR(pg_catalog.||) name, true) OPERATOR(pg_catalog.=) ''
                THEN fallback
                ELSE COALESCE(pg_catalog.current_setting('pg_tide.' OPERATOR(pg_catalog.||) name, true), fallback) END
$$;
COMMENT ON FUNCTION tide._setting(text, text) IS 'Internal: a pg_tide.* setting as text.';

-- A compact duration for narrow displays, at most 5 characters: 45s, 12m, 3h12m, 2d4h, 12d.
-- Inlined into its callers (tide.dashboard calls it three times per task), so it has no SET
-- clause, which would forbid inlining: its body names everything with its schema instead, so it
-- is safe under any search_path (scripts/pgspot.sh lists it). (Whole seconds: s below.)
CREATE FUNCTION tide._short(d interval) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN d IS NULL THEN NULL
        WHEN d OPERATOR(pg_catalog.<) '0'::pg_catalog.interval
            THEN '-' OPERATOR(pg_catalog.||) tide._short(OPERATOR(pg_catalog.-) d)
        WHEN d OPERATOR(pg_catalog.<) '1 minute'::pg_catalog.interval
            THEN pg_catalog.floor(pg_catalog.date_part('epoch', d))::pg_catalog.int8::pg_catalog.text OPERATOR(pg_catalog.||) 's'
        WHEN d OPERATOR(pg_catalog.<) '1 hour'::pg_catalog.interval
            THEN pg_catalog.floor(pg_catalog.date_part('epoch', d) OPERATOR(pg_catalog./) 60)::pg_catalog.int8::pg_catalog.text OPERATOR(pg_catalog.||) 'm'
        WHEN d OPERATOR(pg_catalog.<) '1 day'::pg_catalog.interval
            THEN pg_catalog.floor(pg_catalog.date_part('epoch', d) OPERATOR(pg_catalog./) 3600)::pg_catalog.int8::pg_catalog.text
                 OPERATOR(pg_catalog.||) 'h'
                 OPERATOR(pg_catalog.||) pg_catalog.lpad((pg_catalog.floor(pg_catalog.date_part('epoch', d) OPERATOR(pg_catalog./) 60)::pg_catalog.int8
                                                          OPERATOR(pg_catalog.%) 60)::pg_catalog.text, 2, '0')
                 OPERATOR(pg_catalog.||) 'm'
        WHEN d OPERATOR(pg_catalog.<) '10 days'::pg_catalog.interval
            THEN pg_catalog.floor(pg_catalog.date_part('epoch', d) OPERATOR(pg_catalog./) 86400)::pg_catalog.int8::pg_catalog.text
                 OPERATOR(pg_catalog.||) 'd'
                 OPERATOR(pg_catalog.||) (pg_catalog.floor(pg_catalog.date_part('epoch', d) OPERATOR(pg_catalog./) 3600)::pg_catalog.int8
                                          OPERATOR(pg_catalog.%) 24)::pg_catalog.text
                 OPERATOR(pg_catalog.||) 'h'
        ELSE pg_catalog.floor(pg_catalog.date_part('epoch', d) OPERATOR(pg_catalog./) 86400)::pg_catalog.int8::pg_catalog.text
             OPERATOR(pg_catalog.||) 'd' END
$$;
COMMENT ON FUNCTION tide._short(interval) IS 'A duration in at most 5 characters (45s, 12m, 3h12m, 2d4h, 12d).';

-- ---------------------------------------------------------------------------------------------
-- Task monitoring settings. The longest gap between fires is kept up to date with the schedule.
CREATE FUNCTION tide._task_fire_gap() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    NEW.fire_gap := tide._fire_gap(NEW.schedule, NEW.tz, NEW.dst_gap::text, NEW.dst_overlap::text);
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION tide._task_fire_gap() IS
    'Trigger: keeps tide.task.fire_gap (the longest gap between fires) in step with the schedule.';
CREATE TRIGGER task_fire_gap BEFORE INSERT OR UPDATE OF schedule, tz, dst_gap, dst_overlap ON tide.task
    FOR EACH ROW EXECUTE FUNCTION tide._task_fire_gap();

CREATE FUNCTION tide._severity(value text, param text) RETURNS tide.severity
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF lower(btrim(value)) NOT IN ('info', 'warning', 'critical') THEN
        RAISE EXCEPTION 'unknown severity "%"', left(value, 20) USING ERRCODE = 'invalid_parameter_value',
            HINT = format('pass %s => ''info'', ''warning'' or ''critical''', param);
    END IF;
    RETURN lower(btrim(value))::tide.severity;
END
$$;
COMMENT ON FUNCTION tide._severity(text, text) IS 'Internal: a severity given as text, or a clear error.';

CREATE FUNCTION tide.monitor(task text, max_silence interval DEFAULT NULL, severity text DEFAULT NULL,
                             start_deadline interval DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t tide.task;
BEGIN
    IF monitor.task IS NULL THEN
        RAISE EXCEPTION 'task must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'pass the name of one of your tasks';
    END IF;
    IF monitor.max_silence < interval '0' THEN
        RAISE EXCEPTION 'max_silence must not be negative, got %', monitor.max_silence
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass max_silence => ''2 hours'', or ''0'' to derive it from the schedule again';
    END IF;
    PERFORM tide._bounded('max_silence', monitor.max_silence, true);
    PERFORM tide._bounded('start_deadline', monitor.start_deadline, true);
    PERFORM tide._text_arg('task', monitor.task, 200, 'pass the name of one of your tasks');
    SELECT * INTO t FROM tide.task x WHERE x.name = monitor.task AND x.owner = tide._caller() FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no task named "%"', monitor.task USING ERRCODE = 'undefined_object',
            HINT = 'list your tasks with: SELECT name FROM tide.task';
    END IF;
    UPDATE tide.task x
       SET max_silence = CASE WHEN monitor.max_silence IS NULL THEN x.max_silence
                              WHEN monitor.max_silence = interval '0' THEN NULL
                              ELSE monitor.max_silence END,
           severity = coalesce(tide._severity(monitor.severity, 'severity'), x.severity),
           start_deadline = CASE WHEN monitor.start_deadline IS NULL THEN x.start_deadline
                                 WHEN monitor.start_deadline = interval '0' THEN NULL
                                 ELSE monitor.start_deadline END
     WHERE x.task_id = t.task_id
    RETURNING * INTO t;
    RETURN jsonb_build_object('task', t.name, 'max_silence', tide._max_silence(t.max_silence, t.fire_gap, t.timeout),
                              'derived', t.max_silence IS NULL, 'severity', t.severity,
                              'start_deadline', tide._start_deadline(t.start_deadline, t.fire_gap, true),
                              'start_deadline_derived', t.start_deadline IS NULL);
END
$$;
COMMENT ON FUNCTION tide.monitor(text, interval, text, interval) IS
    'monitor(task, max_silence => NULL, severity => NULL, start_deadline => NULL): sets how long the task may go without a success before it is late (''0'' = derived from the schedule), the severity of its alerts, and how long a ready run may wait to start before a late_start alert opens (''0'' = derived). NULL leaves a setting as it is. Not a rule change: makes no new version.';

-- How long a ready run may wait to start before it is late (a late_start alert): the task's
-- start_deadline, else for a window run a quarter of the gap between its fires, between a
-- minute and 15 minutes (a daily run: 15 minutes; a run every minute: a minute), else (a one-off
-- or event run, or a schedule without gaps) pg_tide.start_deadline.
CREATE FUNCTION tide._start_deadline(p_start_deadline interval, p_fire_gap interval, p_window boolean)
RETURNS interval
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(p_start_deadline,
                    CASE WHEN p_window AND p_fire_gap IS NOT NULL
                         THEN least(greatest(p_fire_gap / 4, interval '1 minute'), interval '15 minutes') END,
                    tide._setting('start_deadline', '300')::interval)
$$;
COMMENT ON FUNCTION tide._start_deadline(interval, interval, boolean) IS
    'Internal: how long a ready run may wait to start: the task''s start_deadline, else a quarter of its fire gap (1 to 15 minutes) for a window run, else pg_tide.start_deadline.';

-- Why a ready run has not started, in words, as far as pg_tide can tell: its queue paused or at
-- its limit, a lock another run holds, an earlier run of its serial group, no executor free or
-- no command worker, or (external workers) no claim from its queue lately.
CREATE FUNCTION tide._late_cause(p_run_id bigint) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
    q tide.queue;
    holder bigint;
    running bigint;
    mine bigint;
    executors integer := tide._setting('executors', '2')::integer;
    seen timestamptz;
BEGIN
    SELECT * INTO r FROM tide.run x WHERE x.run_id = p_run_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT * INTO q FROM tide.queue x WHERE x.owner = r.owner AND x.name = r.queue;
    IF FOUND AND q.paused THEN
        RETURN format('queue %s is paused (tide.resume_queue)', r.queue);
    END IF;
    IF q.max_concurrency IS NOT NULL THEN
        SELECT count(*) INTO running FROM tide.pending p
         WHERE p.owner = r.owner AND p.queue = r.queue AND p.state = 'running';
        IF running >= q.max_concurrency THEN
            RETURN format('queue %s is at its limit: %s running of max_concurrency %s', r.queue, running, q.max_concurrency);
        END IF;
    END IF;
    IF r.lock_key IS NOT NULL THEN
        SELECT l.run_id INTO holder FROM tide.lock l
         WHERE l.owner = r.owner AND l.key = r.lock_key AND l.run_id <> r.run_id LIMIT 1;
        IF FOUND THEN
            RETURN format('lock %s is held by run %s', r.lock_key, holder);
        END IF;
    END IF;
    IF r.gate IS NOT NULL THEN
        SELECT x.run_id INTO holder FROM tide.run x
         WHERE x.run_id IN (SELECT p.run_id FROM tide.pending p WHERE p.task_id = r.task_id AND p.state = 'running')
           AND x.gate = r.gate AND x.run_id <> r.run_id
         ORDER BY x.run_id LIMIT 1;
        IF FOUND THEN
            RETURN format('behind run %s of its serial group (runs of %s go one at a time)', holder, r.gate);
        END IF;
    END IF;
    IF r.reason LIKE 'waits for a command worker%' THEN
        RETURN r.reason;
    END IF;
    IF r.executor = 'sql' THEN
        IF NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.backend_type = 'pg_tide executor' AND a.datname = current_database()) THEN
            RETURN format('no executor is running (pg_tide.executors = %s)', executors);
        END IF;
        SELECT count(*) INTO running FROM tide.run x
         WHERE x.run_id IN (SELECT p.run_id FROM tide.pending p WHERE p.state = 'running' AND p.executor = 'sql')
           AND x.run_id <> ALL (tide._command_runs());
        IF running >= executors THEN
            RETURN format('no executor free: all %s run other runs (raise pg_tide.executors)', executors);
        END IF;
        -- Its role at its share of the executors (sql/share.sql).
        SELECT coalesce(sum(b.n), 0) INTO mine FROM tide._executors_held() b WHERE b.owner = r.owner;
        IF mine >= 1 AND mine >= tide._executor_cap(r.owner, running > mine) THEN
            RETURN format('role %s occupies %s executors, its share (its limit executors, or all but one while another role has work)',
                          r.owner, mine);
        END IF;
        RETURN 'not claimed yet by an executor';
    END IF;
    seen := tide._queue_claimed_at(r.queue);
    IF seen IS NULL OR seen < now() - interval '1 minute' THEN
        RETURN format('no worker claimed from queue %s in the last minute%s', r.queue,
                      CASE WHEN seen IS NULL THEN ' (none since the server started)'
                           ELSE format(' (the last claim at %s)', seen) END);
    END IF;
    SELECT count(*) INTO running FROM tide.pending p
     WHERE p.owner = r.owner AND p.queue = r.queue AND p.state = 'running';
    RETURN format('queue %s''s workers are busy: %s of its runs running', r.queue, running);
END
$$;
COMMENT ON FUNCTION tide._late_cause(bigint) IS
    'Internal: why a ready run has not started, in words (a late_start alert''s cause).';

-- The silence a task may reach: set, or the longest gap between its fires plus the time one
-- run may take (its timeout, at most that gap). NULL when the schedule fires less than twice
-- in the next 400 days and none is set: such a task is never late.
-- Inlined into task health (one call per task), so it has no SET
-- clause, which would forbid inlining: its body names everything with its schema instead, so it
-- is safe under any search_path (scripts/pgspot.sh lists it).
-- (Of the task's columns, not of its row: a whole-row argument has every row formed again,
-- which cost task health a tenth of its time over 10,000 tasks.)
CREATE FUNCTION tide._max_silence(max_silence interval, fire_gap interval, timeout interval) RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(max_silence, fire_gap OPERATOR(pg_catalog.+) least(timeout, fire_gap))
$$;
COMMENT ON FUNCTION tide._max_silence(interval, interval, interval) IS
    'A task''s max_silence: set with tide.monitor, or derived: the longest gap between its fires plus its timeout (at most that gap).';

-- The one rule of silence, for task health, tasks as heartbeats and alerts: late past
-- max_silence, down past twice that. 0 = within, 1 = late, 2 = down; never late without a
-- max_silence.
-- Inlined into its callers (on the hot paths of claims, emits and the tick), so it has no SET
-- clause, which would forbid inlining: its body names everything with its schema instead, so it
-- is safe under any search_path (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._silence_level(silence interval, max_silence interval) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN max_silence IS NULL OR silence OPERATOR(pg_catalog.<=) max_silence THEN 0
                WHEN silence OPERATOR(pg_catalog.<=) (2 OPERATOR(pg_catalog.*) max_silence) THEN 1
                ELSE 2 END
$$;
COMMENT ON FUNCTION tide._silence_level(interval, interval) IS
    'Internal: 0 within max_silence, 1 late (past it), 2 down (past twice it).';

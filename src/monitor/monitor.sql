-- Monitoring: task health, heartbeat checks, alerts, metrics, run log lines, explain, retention.
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
        -- Its role at its share of the executors (src/security/share.sql).
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
-- a year ahead and none is set: such a task is never late.
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

-- ---------------------------------------------------------------------------------------------
-- Health of every task at an instant.
--
-- What health reads from a task's history (its latest success, the last state, failures and
-- skips in a row, the last 24 hours) is kept per task in tide.task_stat, so that health, the
-- dashboard, the tick's alert evaluation and tide.metrics() do not grow with history or with the
-- number of tasks. It stays exact:
--   - every statement that changes runs adds a row per task it changed to tide.task_touch
--     (statement triggers on updates and deletions of tide.run; the creators of runs, and the
--     hot paths, whose run updates the trigger skips, write theirs with their history rows),
--     in the same transaction as the change;
--   - every tick folds (tide._fold): it deletes the touch rows it sees, then, with a later
--     snapshot, recomputes those tasks' figures from their runs; every change whose touch row
--     it deleted is in that snapshot, and one committed after the deletion keeps its row for the
--     next fold;
--   - health takes a task's kept figures only when no touch row of the task is visible and the
--     figures are still true at the instant asked (the 24-hour ones change when a counted run
--     leaves the day: valid_until); otherwise it computes them from the runs, as the fold does;
--   - every task has kept figures or a touch row: a new task is noted (tide._task_touched), and
--     the fold deletes a touch row only in the transaction that writes its task's figures. Health
--     relies on it: it looks for figures that do not hold among the kept rows alone.
--     (tide._monitor notes again, every monitor_interval, any task that lacks both.)
-- Appending touch rows, rather than updating a row per task, keeps runs of one task finishing
-- side by side from waiting on each other.
-- (No foreign key to tide.task, here or in tide.run_count: the fold's upsert checked it, locking
-- the task row after the row it upserts, while a task's deletion locks them the other way round,
-- and the two deadlocked. Rows of a deleted task are dropped by retention, tide._prune.)
CREATE TABLE tide.task_stat (
    task_id          bigint PRIMARY KEY,
    owner            name NOT NULL,
    computed_at      timestamptz NOT NULL,
    valid_until      timestamptz,
    last_success     timestamptz,
    last_state       tide.run_state,
    skips            integer,
    failures         integer,
    retries          integer,
    catch_up_limited integer,
    not_ready        integer,
    p50              interval,
    p95              interval,
    wait95           interval,
    -- When the task goes late if no success comes: its latest success (or its creation) plus its
    -- max_silence (tide._max_silence, counted in seconds as interval comparison counts them);
    -- NULL: never. The alert evaluation's candidates read it (tide._alert_causes) instead of
    -- every task's rules; a change of those rules notes the task (tide._task_touched).
    quiet_at         timestamptz
);
COMMENT ON TABLE tide.task_stat IS
    'What task health reads from each task''s history, as of the last fold (each tick): latest success, last state, failures and skips in a row, the last 24 hours (true until valid_until). Maintained by pg_tide; read tide.health.';
CREATE INDEX task_stat_valid_idx ON tide.task_stat (valid_until) WHERE valid_until IS NOT NULL;

CREATE TABLE tide.task_touch (
    task_id bigint NOT NULL,
    owner   name NOT NULL
);
COMMENT ON TABLE tide.task_touch IS
    'Tasks whose runs changed since the last fold, one row per changing statement (appended by the functions that create runs or write their history, and by triggers on tide.run, deleted by the fold). Maintained by pg_tide.';
CREATE INDEX task_touch_task_idx ON tide.task_touch (task_id);

CREATE FUNCTION tide._runs_touched() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO tide.task_touch (task_id, owner) SELECT DISTINCT c.task_id, c.owner FROM changed c;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION tide._runs_touched() IS
    'Trigger: notes in tide.task_touch the tasks whose runs a statement changed, so that task health recomputes them.';
-- New runs are noted by their creators (tide.enqueue, tide._emit, tide._record_created), not by
-- an INSERT trigger: its transition table copied every new run (measured: a 20,000-run
-- tide.enqueue 741 ms against 847 on average, eight alternating calls).
-- The hot paths (claims, completions, failures: tide.history = 'written' while they update)
-- note their tasks themselves with the history rows they write right after, and this trigger
-- is not called for them (measured: a fifth of claim + complete at batch 1 for two trigger
-- calls per statement).
-- (The clause is a C function, src/runs/change.rs: PostgreSQL reads a WHEN clause again from its
-- text at every statement, and the call is the shortest text.)
CREATE TRIGGER run_touched_update AFTER UPDATE ON tide.run
    REFERENCING NEW TABLE AS changed FOR EACH STATEMENT
    WHEN (tide._history_unwritten())
    EXECUTE FUNCTION tide._runs_touched();
CREATE TRIGGER run_touched_delete AFTER DELETE ON tide.run
    REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION tide._runs_touched();

-- A new task, or one whose schedule changed (an event task's latest success is looked for
-- differently) or whose silence rules changed (its kept quiet_at), is noted too.
CREATE FUNCTION tide._task_touched() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO tide.task_touch (task_id, owner) VALUES (NEW.task_id, NEW.owner);
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION tide._task_touched() IS
    'Trigger: notes a new task, or a task whose schedule or silence rules changed, in tide.task_touch.';
CREATE TRIGGER task_touched AFTER INSERT OR UPDATE OF schedule, tz, dst_gap, dst_overlap, max_silence, timeout ON tide.task
    FOR EACH ROW EXECUTE FUNCTION tide._task_touched();

-- What health reads from the history of some tasks, at an instant: computed from their runs.
CREATE FUNCTION tide._task_history(p_now timestamptz, p_task_ids bigint[])
RETURNS TABLE (task_id bigint, owner name, valid_until timestamptz, last_success timestamptz,
               last_state tide.run_state, skips integer, failures integer, retries integer,
               catch_up_limited integer, not_ready integer, p50 interval, p95 interval, wait95 interval)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
-- Its cost estimate is high (a lateral join per task), but each part is a short index scan:
-- compiling it with JIT would cost far more than running it.
SET jit = off
-- A custom plan each time, with the statistics of the moment: a generic one kept by a
-- long-lived session (a pool's connection) from when tide.run was small would walk it whole
-- once it has grown. (It is only planned when some task's figures are to be computed.)
SET plan_cache_mode = force_custom_plan
-- Every part reads one task's runs, newest first, through an index that gives that order, and
-- stops early. The planner estimates a task's runs as the average over the rows, which one busy
-- task makes huge: it then took a whole-table scan (sequential, or a bitmap sorted afterwards)
-- as cheaper for a quiet task, once per task and lateral (11,000 blocks per task over 50,000
-- runs of another task). Those scans are never right here.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT t.task_id, t.owner, day.valid_until, ls.finished_at,
           CASE WHEN ev.last_run_id > coalesce(recent.last_run_id, 0) THEN ev.last_state ELSE recent.last_state END,
           (coalesce(recent.skips, 0) + coalesce(ev.skips, 0))::integer,
           (fails.failures + coalesce(ev.failures, 0))::integer,
           day.retries::integer, day.catch_up_limited::integer, day.not_ready::integer, day.p50, day.p95, day.wait95
      FROM tide.task t
      -- The latest successful run, walking back from the newest window (an event task without a
      -- schedule: from its newest event run).
      LEFT JOIN LATERAL (
          SELECT s.window_start, s.finished_at FROM (
              (SELECT r.window_start, r.finished_at FROM tide.run r
                WHERE r.task_id = t.task_id AND r.window_start IS NOT NULL AND r.state = 'succeeded'
                ORDER BY r.window_start DESC LIMIT 1)
              UNION ALL
              (SELECT NULL::timestamptz, r.finished_at FROM tide.run r
                WHERE t.schedule IS NULL AND r.task_id = t.task_id AND r.window_start IS NULL
                  AND r.state = 'succeeded'
                ORDER BY -r.run_id LIMIT 1)) s
           LIMIT 1) ls ON true
      -- Runs without a window (event runs, enqueued runs) are a second sequence, in run_id
      -- order: its latest success, and its latest 100 runs. Newest first is ORDER BY -run_id,
      -- the order of run_event_task_idx alone: ORDER BY run_id DESC let the planner walk the
      -- primary key back through every run of every task instead, expecting the task's runs
      -- soon (when one task holds most of the history, a task with few runs looks as if it had
      -- half of them): 2 seconds per task with 1,000,000 runs, which stalled the tick.
      LEFT JOIN LATERAL (
          SELECT r.run_id FROM tide.run r
           WHERE r.task_id = t.task_id AND r.window_start IS NULL AND r.state = 'succeeded'
           ORDER BY -r.run_id LIMIT 1) ls2 ON true
      LEFT JOIN LATERAL (
          SELECT (array_agg(x.state ORDER BY x.n))[1] AS last_state, max(x.run_id) AS last_run_id,
                 count(*) FILTER (WHERE x.state = 'skipped' AND x.others = 0)
                   + coalesce(max(x.deferrals) FILTER (WHERE x.others = 0), 0) AS skips,
                 coalesce(sum(x.attempts - CASE WHEN x.state IN ('running', 'need_check') THEN 1 ELSE 0 END)
                          FILTER (WHERE x.run_id > coalesce(ls2.run_id, 0) AND x.state <> 'succeeded'), 0) AS failures
            FROM (SELECT y.*, count(*) FILTER (WHERE y.state IN ('succeeded', 'dead', 'need_check', 'cancelled'))
                                  OVER (ORDER BY y.n ROWS UNBOUNDED PRECEDING) AS others
                    FROM (SELECT r.run_id, r.state, r.attempts, r.deferrals, row_number() OVER (ORDER BY -r.run_id) AS n
                            FROM tide.run r
                           WHERE r.task_id = t.task_id AND r.window_start IS NULL
                           ORDER BY -r.run_id LIMIT 100) y) x) ev ON true
      -- The latest 100 runs: the last state, and skips in a row among the finished ones.
      -- A readiness deferral counts as a skip (a window that did not run when due): the most
      -- deferred run of the streak tells how many windows in a row found the data not ready.
      LEFT JOIN LATERAL (
          SELECT (array_agg(x.state ORDER BY x.n))[1] AS last_state, (array_agg(x.run_id ORDER BY x.n))[1] AS last_run_id,
                 count(*) FILTER (WHERE x.state = 'skipped' AND x.others = 0)
                   + coalesce(max(x.deferrals) FILTER (WHERE x.others = 0), 0) AS skips
            FROM (SELECT y.state, y.n, y.run_id, y.deferrals,
                         count(*) FILTER (WHERE y.state IN ('succeeded', 'dead', 'need_check', 'cancelled'))
                             OVER (ORDER BY y.n ROWS UNBOUNDED PRECEDING) AS others
                    FROM (SELECT z.state, z.run_id, z.deferrals, row_number() OVER (ORDER BY z.window_start DESC) AS n
                            FROM (SELECT r.state, r.window_start, r.run_id, r.deferrals FROM tide.run r
                                   WHERE r.task_id = t.task_id AND r.window_start IS NOT NULL
                                   ORDER BY r.window_start DESC LIMIT 100) z) y) x) recent ON true
      -- Failed and lost attempts since the latest success: the windows after it, walked in
      -- order from it (at most 10,000 of them). The ordered walk keeps this an index scan: with
      -- most of the history in one task, the planner took the plain condition for a sequential
      -- scan of tide.run, once per task (with 10,000 tasks and 700,000 runs one evaluation
      -- stalled the tick for more than 13 minutes).
      LEFT JOIN LATERAL (
          SELECT coalesce(sum(f.attempts - CASE WHEN f.state IN ('running', 'need_check') THEN 1 ELSE 0 END), 0) AS failures
            FROM (SELECT r.attempts, r.state FROM tide.run r
                   WHERE r.task_id = t.task_id AND r.window_start > coalesce(ls.window_start, '-infinity')
                   ORDER BY r.window_start LIMIT 10000) f
           WHERE f.state <> 'succeeded') fails ON true
      -- The last 24 hours, over at most the latest 1000 runs; true until the first of the runs
      -- counted leaves the day.
      LEFT JOIN LATERAL (
          SELECT coalesce(sum(greatest(r.attempts - 1, 0)), 0) AS retries,
                 count(*) FILTER (WHERE r.skip_reason = 'catch_up_limit') AS catch_up_limited,
                 count(*) FILTER (WHERE r.skip_reason = 'not_ready' OR (r.state = 'dead' AND r.last_error_kind = 'not_ready')) AS not_ready,
                 percentile_cont(0.5) WITHIN GROUP (ORDER BY r.finished_at - r.claimed_at) FILTER (WHERE r.state = 'succeeded') AS p50,
                 percentile_cont(0.95) WITHIN GROUP (ORDER BY r.finished_at - r.claimed_at) FILTER (WHERE r.state = 'succeeded') AS p95,
                 percentile_cont(0.95) WITHIN GROUP (ORDER BY greatest(r.started_at - coalesce(r.fire_at, r.created_at), interval '0')) FILTER (WHERE r.started_at IS NOT NULL) AS wait95,
                 min(coalesce(r.finished_at, r.updated_at)) + interval '1 day' AS valid_until
            FROM ((SELECT * FROM tide.run r WHERE r.task_id = t.task_id AND r.window_start IS NOT NULL
                    ORDER BY r.window_start DESC LIMIT 1000)
                  UNION ALL
                  (SELECT * FROM tide.run r WHERE r.task_id = t.task_id AND r.window_start IS NULL
                    ORDER BY -r.run_id LIMIT 1000)) r
           WHERE coalesce(r.finished_at, r.updated_at) > p_now - interval '1 day') day ON true
     WHERE t.task_id = ANY (p_task_ids);
END
$$;
COMMENT ON FUNCTION tide._task_history(timestamptz, bigint[]) IS
    'Internal: what task health reads from the history of some tasks at an instant, computed from their runs (tide.task_stat keeps it between changes).';

-- The fold, every tick: the tasks whose runs changed (at most p_limit of them) and those whose
-- 24-hour figures expired get their figures recomputed; the counters of tide.metrics() take in
-- what was added to them. One fold at a time (a second caller finds the lock taken and leaves
-- the work to the first).
CREATE FUNCTION tide._fold(p_now timestamptz, p_limit integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    n integer;
    todo bigint[];
    touched bigint[];
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('pg_tide fold')) THEN
        RETURN 0;
    END IF;
    -- Each statement below reads with a snapshot taken after the lock: it sees what an earlier
    -- fold wrote.
    -- The hourly counters (metric 'hour', label 'hour since the epoch|state|duration bucket')
    -- go to tide.run_hourly and tide.owner_hourly (src/monitor/charts.sql), the rest to tide.run_count.
    WITH d AS (DELETE FROM tide.count_delta RETURNING task_id, metric, label, value, owner
    ), counters AS (
        INSERT INTO tide.run_count AS c (task_id, metric, label, value, owner)
        SELECT d.task_id, d.metric, d.label, sum(d.value), min(d.owner) FROM d
         WHERE d.metric <> 'hour' AND EXISTS (SELECT 1 FROM tide.task t WHERE t.task_id = d.task_id)
         GROUP BY 1, 2, 3
        ON CONFLICT (task_id, metric, label) DO UPDATE SET value = c.value + EXCLUDED.value
    ), h AS (
        SELECT d.task_id, d.owner, to_timestamp(split_part(d.label, '|', 1)::bigint * 3600) AS hour,
               split_part(d.label, '|', 2) AS state, nullif(split_part(d.label, '|', 3), '') AS bucket,
               sum(d.value)::integer AS n
          FROM d WHERE d.metric = 'hour'
         GROUP BY 1, 2, 3, 4, 5
    ), task_hours AS (
        INSERT INTO tide.run_hourly AS x (task_id, hour, succeeded, failed, dead, skipped, need_check, cancelled,
                                          durations, owner)
        SELECT h.task_id, h.hour, coalesce(sum(h.n) FILTER (WHERE h.state = 'succeeded'), 0),
               coalesce(sum(h.n) FILTER (WHERE h.state = 'retry'), 0), coalesce(sum(h.n) FILTER (WHERE h.state = 'dead'), 0),
               coalesce(sum(h.n) FILTER (WHERE h.state = 'skipped'), 0),
               coalesce(sum(h.n) FILTER (WHERE h.state = 'need_check'), 0),
               coalesce(sum(h.n) FILTER (WHERE h.state = 'cancelled'), 0),
               coalesce(jsonb_object_agg(h.bucket, h.n) FILTER (WHERE h.bucket IS NOT NULL), '{}'), min(h.owner)
          FROM h WHERE EXISTS (SELECT 1 FROM tide.task t WHERE t.task_id = h.task_id)
         GROUP BY h.task_id, h.hour
        ON CONFLICT (task_id, hour) DO UPDATE
           SET succeeded = x.succeeded + EXCLUDED.succeeded, failed = x.failed + EXCLUDED.failed,
               dead = x.dead + EXCLUDED.dead, skipped = x.skipped + EXCLUDED.skipped,
               need_check = x.need_check + EXCLUDED.need_check, cancelled = x.cancelled + EXCLUDED.cancelled,
               durations = tide._hist_add(x.durations, EXCLUDED.durations)
    ), o AS (
        SELECT h.owner, h.hour, h.state, h.bucket, sum(h.n) AS n FROM h GROUP BY 1, 2, 3, 4
    )
    INSERT INTO tide.owner_hourly AS x (owner, hour, succeeded, failed, dead, skipped, need_check, cancelled, durations)
    SELECT o.owner, o.hour, coalesce(sum(o.n) FILTER (WHERE o.state = 'succeeded'), 0),
           coalesce(sum(o.n) FILTER (WHERE o.state = 'retry'), 0), coalesce(sum(o.n) FILTER (WHERE o.state = 'dead'), 0),
           coalesce(sum(o.n) FILTER (WHERE o.state = 'skipped'), 0),
           coalesce(sum(o.n) FILTER (WHERE o.state = 'need_check'), 0),
           coalesce(sum(o.n) FILTER (WHERE o.state = 'cancelled'), 0),
           coalesce(jsonb_object_agg(o.bucket, o.n) FILTER (WHERE o.bucket IS NOT NULL), '{}')
      FROM o
     GROUP BY o.owner, o.hour
    ON CONFLICT (owner, hour) DO UPDATE
       SET succeeded = x.succeeded + EXCLUDED.succeeded, failed = x.failed + EXCLUDED.failed,
           dead = x.dead + EXCLUDED.dead, skipped = x.skipped + EXCLUDED.skipped,
           need_check = x.need_check + EXCLUDED.need_check, cancelled = x.cancelled + EXCLUDED.cancelled,
           durations = tide._hist_add(x.durations, EXCLUDED.durations);
    -- The tasks to recompute: those touched (their touch rows deleted now) and those whose
    -- 24-hour figures expired. They are computed with a later snapshot than the deletion's:
    -- every change whose touch row goes is in it (one committed later keeps its row).
    WITH picked AS (
        SELECT DISTINCT x.task_id FROM (SELECT y.task_id FROM tide.task_touch y LIMIT p_limit * 10) x
         LIMIT p_limit
    ), gone AS (
        DELETE FROM tide.task_touch x WHERE x.task_id IN (SELECT p.task_id FROM picked p) RETURNING x.task_id
    )
    SELECT array_agg(DISTINCT g.task_id) INTO touched FROM gone g;
    SELECT array_agg(DISTINCT y.task_id) INTO todo
      FROM (SELECT t.task_id FROM unnest(touched) t(task_id)
            UNION ALL
            (SELECT s.task_id FROM tide.task_stat s WHERE s.valid_until <= p_now LIMIT p_limit)) y;
    -- Live pages (the console) LISTEN on pg_tide_changed: one NOTIFY per fold that saw changes,
    -- never one per run (a NOTIFY takes a global lock at commit). The payload lists the tasks
    -- whose runs changed, or is empty when they would not fit (then anything may have changed).
    IF touched IS NOT NULL THEN
        PERFORM tide._notify('pg_tide_changed',
                          CASE WHEN cardinality(touched) <= 500 THEN array_to_string(touched, ',') ELSE '' END);
    END IF;
    IF todo IS NULL THEN
        RETURN 0;  -- (the computation is not even planned)
    END IF;
    INSERT INTO tide.task_stat AS s (task_id, owner, computed_at, valid_until, last_success,
                                     last_state, skips, failures, retries, catch_up_limited, not_ready, p50, p95, wait95,
                                     quiet_at)
    SELECT h.task_id, h.owner, p_now, h.valid_until, h.last_success, h.last_state, h.skips,
           h.failures, h.retries, h.catch_up_limited, h.not_ready, h.p50, h.p95, h.wait95,
           coalesce(h.last_success, t.created_at)
             + make_interval(secs => extract(epoch FROM tide._max_silence(t.max_silence, t.fire_gap, t.timeout))::float8)
      FROM tide._task_history(p_now, todo) h
      JOIN tide.task t ON t.task_id = h.task_id
    ON CONFLICT (task_id) DO UPDATE
       SET owner = EXCLUDED.owner, computed_at = EXCLUDED.computed_at, valid_until = EXCLUDED.valid_until,
           last_success = EXCLUDED.last_success,
           last_state = EXCLUDED.last_state, skips = EXCLUDED.skips, failures = EXCLUDED.failures,
           retries = EXCLUDED.retries, catch_up_limited = EXCLUDED.catch_up_limited,
           not_ready = EXCLUDED.not_ready, p50 = EXCLUDED.p50, p95 = EXCLUDED.p95, wait95 = EXCLUDED.wait95,
           quiet_at = EXCLUDED.quiet_at;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._fold(timestamptz, integer) IS
    'Internal: recomputes the kept health figures (tide.task_stat) of tasks whose runs changed or whose 24-hour figures expired, and adds new counts to the counters of tide.metrics() (every tick); notifies pg_tide_changed with the ids of the tasks whose runs changed.';

CREATE FUNCTION tide._health(p_now timestamptz, p_task_ids bigint[] DEFAULT NULL, p_exact boolean DEFAULT false)
RETURNS TABLE (task text, status text, severity tide.severity, last_success timestamptz, silence interval,
               max_silence interval, last_state tide.run_state, consecutive_failures integer,
               consecutive_skips integer, retries_24h integer, backlog integer, oldest_ready interval,
               dead integer, need_check integer, catch_up_limited_24h integer, not_ready_24h integer,
               p50_duration interval, p95_duration interval, p95_queue_wait interval,
               next_fire_at timestamptz, paused boolean, task_id bigint, owner name,
               tick_error text, tick_error_at timestamptz, tick_retry_at timestamptz,
               open_differences integer, differences_for_a_person integer, held integer, held_since timestamptz,
               oldest_ready_id bigint)
-- PL/pgSQL, one RETURN QUERY, rather than SQL: a set-returning SQL function with SET clauses
-- runs them around every row it returns (10,000 times per call over 10,000 tasks), and plans its
-- query at every call; this one sets them once and its session keeps the plan (measured over
-- 10,000 tasks: 13% less per call, alternating rounds). p_task_ids: these tasks and every task
-- with runs in tide.pending (whose counts health makes in any case, in one pass over the table)
-- only: the tick's alert evaluation asks for those that may have something to report. With
-- p_exact, the tasks given alone, and only their runs in tide.pending are counted
-- (tide.task_health).
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH open_runs AS (
    -- Unfinished and unresolved runs: tide.pending is small, one pass for all tasks; since
    -- when the oldest ready run waits, and the oldest held one (after a rule change, R12.3,
    -- for tide.confirm), from those runs alone.
    SELECT o.*,
           (SELECT greatest(r.updated_at, r.run_after) FROM tide.run r WHERE r.run_id = o.oldest_ready_id) AS ready_since,
           (SELECT r.updated_at FROM tide.run r WHERE r.run_id = o.oldest_held_id) AS held_since
      FROM (
    SELECT p.task_id,
           -- A ready run enqueued for later (due_at ahead, not parked) is not backlog yet.
           count(*) FILTER (WHERE p.state = 'waiting'
                               OR (p.state = 'ready' AND (p.parked OR p.due_at IS NULL OR p.due_at <= p_now))) AS backlog,
           count(*) FILTER (WHERE p.state = 'dead') AS dead,
           count(*) FILTER (WHERE p.state = 'need_check') AS need_check,
           min(p.run_id) FILTER (WHERE p.state = 'ready' AND (p.parked OR p.due_at IS NULL OR p.due_at <= p_now)) AS oldest_ready_id,
           min(p.run_id) FILTER (WHERE p.state = 'held') AS oldest_held_id,
           count(*) FILTER (WHERE p.state = 'held') AS held
      FROM tide.pending p
     WHERE NOT p_exact OR p.task_id = ANY (p_task_ids)
     GROUP BY p.task_id) o
), diffs AS (
    -- A reconciliation's open differences (each counted once, however many runs saw it).
    SELECT x.task_id, count(DISTINCT (x.biz_date, x.key, x.kind)) AS open,
           count(DISTINCT (x.biz_date, x.key, x.kind)) FILTER (WHERE x.class = 'human' OR x.escalated) AS for_a_person
      FROM tide.recon_diff x
     WHERE x.status = 'open'
     GROUP BY x.task_id
), touched AS MATERIALIZED (
    SELECT DISTINCT x.task_id FROM tide.task_touch x
), shown AS MATERIALIZED (
    -- With p_task_ids, the tasks shown: those given and every task with runs in tide.pending
    -- (counted above in any case). Both the kept figures and the stale tasks below keep to them.
    SELECT unnest(p_task_ids) AS task_id
    UNION SELECT o.task_id FROM open_runs o WHERE p_task_ids IS NOT NULL AND NOT p_exact
), stale AS MATERIALIZED (
    -- The tasks whose kept figures do not hold at p_now (a visible touch row, computed after
    -- p_now, or out of date; see above): computed from their runs below. A task without kept
    -- figures has a touch row: its creation notes it, and the fold deletes a touch row only
    -- with the kept figures of its task written in the same transaction (tide._monitor notes
    -- again any task that lacks both). So only the kept rows are read here, not every task
    -- against its kept row (measured over 10,000 tasks: 9% of health, four alternating rounds).
    -- With p_task_ids, only the kept rows of the tasks shown are read (by key): each of the
    -- two ways is planned, and the one that does not apply is skipped when it runs (so a plan
    -- the session keeps serves both; tide.task_health reads one task's row, not 10,000).
    SELECT ARRAY(SELECT y.task_id
                   FROM (SELECT s.task_id FROM tide.task_stat s
                          WHERE p_task_ids IS NULL AND (s.computed_at > p_now OR s.valid_until <= p_now)
                         UNION
                         SELECT s.task_id FROM shown x JOIN tide.task_stat s ON s.task_id = x.task_id
                          WHERE p_task_ids IS NOT NULL AND (s.computed_at > p_now OR s.valid_until <= p_now)
                         UNION SELECT u.task_id FROM touched u) y
                  WHERE p_task_ids IS NULL OR y.task_id IN (SELECT x.task_id FROM shown x)) AS ids
), f AS (
    -- Each task with what health reads from its history: its kept figures, joined to it
    -- directly; for the stale tasks, computed from their runs (not even planned when there are
    -- none). Measured over 10,000 tasks: a fifth faster than the kept figures gathered first
    -- and then joined to the tasks.
    SELECT t.name, t.paused, t.severity, t.next_fire_at, t.task_id, t.owner, t.tick_error, t.tick_error_at,
           t.tick_retry_at, t.reconcile, t.max_silence, t.fire_gap, t.timeout, t.created_at,
           s.last_success, s.last_state, s.skips, s.failures, s.retries, s.catch_up_limited, s.not_ready,
           s.p50, s.p95, s.wait95
      FROM tide.task t JOIN tide.task_stat s ON s.task_id = t.task_id
     WHERE p_task_ids IS NULL
       AND s.computed_at <= p_now AND (s.valid_until IS NULL OR s.valid_until > p_now)
       AND s.task_id NOT IN (SELECT u.task_id FROM touched u)
    UNION ALL
    SELECT t.name, t.paused, t.severity, t.next_fire_at, t.task_id, t.owner, t.tick_error, t.tick_error_at,
           t.tick_retry_at, t.reconcile, t.max_silence, t.fire_gap, t.timeout, t.created_at,
           s.last_success, s.last_state, s.skips, s.failures, s.retries, s.catch_up_limited, s.not_ready,
           s.p50, s.p95, s.wait95
      FROM shown x JOIN tide.task t ON t.task_id = x.task_id JOIN tide.task_stat s ON s.task_id = x.task_id
     WHERE p_task_ids IS NOT NULL
       AND s.computed_at <= p_now AND (s.valid_until IS NULL OR s.valid_until > p_now)
       AND s.task_id NOT IN (SELECT u.task_id FROM touched u)
    UNION ALL
    SELECT t.name, t.paused, t.severity, t.next_fire_at, t.task_id, t.owner, t.tick_error, t.tick_error_at,
           t.tick_retry_at, t.reconcile, t.max_silence, t.fire_gap, t.timeout, t.created_at,
           s.last_success, s.last_state, s.skips, s.failures, s.retries, s.catch_up_limited, s.not_ready,
           s.p50, s.p95, s.wait95
      FROM stale CROSS JOIN LATERAL tide._task_history(p_now, stale.ids) s
      JOIN tide.task t ON t.task_id = s.task_id
     WHERE cardinality(stale.ids) > 0
), h AS (
    SELECT f.*, o.backlog, o.dead, o.need_check, o.held, o.held_since, o.oldest_ready_id,
           p_now - o.ready_since AS oldest_ready, tide._max_silence(f.max_silence, f.fire_gap, f.timeout) AS max_silence_eff,
           p_now - coalesce(f.last_success, f.created_at) AS silence, diff.open, diff.for_a_person
      FROM f
      LEFT JOIN open_runs o ON o.task_id = f.task_id
      LEFT JOIN diffs diff ON diff.task_id = f.task_id
)
SELECT h.name,
       CASE WHEN h.paused THEN 'paused'
            WHEN tide._silence_level(h.silence, h.max_silence_eff) = 2 THEN 'down'
            WHEN h.failures > 0 OR h.dead > 0 OR h.need_check > 0 OR h.tick_error IS NOT NULL THEN 'failing'
            WHEN h.for_a_person > 0 THEN 'unbalanced'
            WHEN tide._silence_level(h.silence, h.max_silence_eff) = 1 THEN 'late'
            WHEN h.last_success IS NULL THEN 'never_ran'
            ELSE 'ok' END,
       h.severity, h.last_success, h.silence, h.max_silence_eff,
       h.last_state, h.failures::integer, coalesce(h.skips, 0)::integer, coalesce(h.retries, 0)::integer,
       coalesce(h.backlog, 0)::integer, h.oldest_ready, coalesce(h.dead, 0)::integer,
       coalesce(h.need_check, 0)::integer, coalesce(h.catch_up_limited, 0)::integer,
       coalesce(h.not_ready, 0)::integer, h.p50, h.p95, h.wait95,
       CASE WHEN h.paused THEN NULL ELSE h.next_fire_at END, h.paused, h.task_id, h.owner,
       h.tick_error, h.tick_error_at, h.tick_retry_at,
       CASE WHEN h.reconcile IS NOT NULL THEN coalesce(h.open, 0)::integer END,
       CASE WHEN h.reconcile IS NOT NULL THEN coalesce(h.for_a_person, 0)::integer END,
       coalesce(h.held, 0)::integer, h.held_since, h.oldest_ready_id
  FROM h;
END
$$;
COMMENT ON FUNCTION tide._health(timestamptz, bigint[], boolean) IS 'Internal: tide.health at an instant, of every task, or of the tasks given and those with unfinished or unresolved runs (the tick evaluates alerts with it), or (p_exact) of the tasks given alone (tide.task_health).';

-- ---------------------------------------------------------------------------------------------
-- pg_tide itself: the scheduler's ticks (noted in shared memory, src/alerts/delivery.rs), its workers,
-- the oldest ready run, deliveries. Shown in the database pg_tide serves, to superusers and
-- members of tide_admin.
CREATE FUNCTION tide._self(p_now timestamptz)
RETURNS TABLE (status text, last_tick timestamptz, since_last_tick interval, stalled_after interval, tick_errors bigint,
               last_tick_error text, last_tick_error_at timestamptz, scheduler_alive boolean, executors_alive integer,
               executors_expected integer, delivery_alive boolean, notifier_alive boolean, ready_runs integer, oldest_ready interval,
               deliveries_pending integer, deliveries_dead_24h integer, ping_configured boolean,
               last_ping_at timestamptz, last_ping_status integer, owner name, alerts_untaken integer,
               notify_queue_usage double precision)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    w jsonb;
    ok_at timestamptz;
    alive_at timestamptz;
    err_at timestamptz;
    idle_at timestamptz;
    procs record;
    ready record;
    dl record;
BEGIN
    IF NOT (tide._caller_is_superuser() OR tide._can_set_role(CURRENT_USER, 'tide_admin')) THEN
        RETURN;
    END IF;
    w := tide._watch();
    IF w->>'database' IS DISTINCT FROM current_database() THEN
        RETURN;
    END IF;
    ok_at := to_timestamp((w->>'tick_ok')::float8 / 1000);
    err_at := to_timestamp((w->>'tick_error_at')::float8 / 1000);
    idle_at := to_timestamp((w->>'idle')::float8 / 1000);
    -- Alive: a tick succeeded, or the scheduler chose to idle, or the server started, lately
    -- (src/alerts/delivery.rs decides it, for the ping too).
    alive_at := to_timestamp((w->>'alive_at')::float8 / 1000);
    executors_expected := tide._setting('executors', '2')::integer;
    SELECT count(*) FILTER (WHERE a.backend_type = 'pg_tide scheduler') AS scheduler,
           count(*) FILTER (WHERE a.backend_type = 'pg_tide executor') AS executors,
           count(*) FILTER (WHERE a.backend_type = 'pg_tide delivery') AS delivery,
           count(*) FILTER (WHERE a.backend_type = 'pg_tide notifier') AS notifier
      INTO procs
      FROM pg_stat_activity a WHERE a.datname = current_database() AND a.backend_type LIKE 'pg\_tide %';
    -- The ready runs (from tide.pending alone) and the wait of the oldest (by id, as task
    -- health takes it): one run read, not every ready run (with a backlog of 166,000 runs the
    -- join took most of a second).
    SELECT q.n, p_now - (SELECT greatest(r.updated_at, r.run_after) FROM tide.run r WHERE r.run_id = q.oldest_id) AS oldest
      INTO ready
      FROM (SELECT count(*) AS n, min(p.run_id) AS oldest_id FROM tide.pending p
             WHERE p.state = 'ready' AND (p.due_at IS NULL OR p.due_at <= p_now)) q;
    SELECT count(*) FILTER (WHERE e.state IN ('pending', 'sending')) AS pending,
           count(*) FILTER (WHERE e.state = 'dead' AND e.created_at > p_now - interval '1 day') AS dead
      INTO dl
      FROM tide.effect e JOIN tide.alert_channel c ON c.owner = e.owner AND c.name = e.channel
     WHERE e.state IN ('pending', 'sending', 'dead');
    alerts_untaken := tide._alerts_untaken();
    -- Half full or more, pg_tide sends no notifications (src/scheduler/wake.rs): workers poll.
    notify_queue_usage := pg_notification_queue_usage();
    stalled_after := tide._setting('alert_stalled_after', '60s')::interval;
    status := CASE WHEN idle_at > coalesce(ok_at, '-infinity') AND idle_at > p_now - stalled_after THEN 'paused'
                   -- No scheduler process: down once it has been gone a little while (10 s, or
                   -- stalled_after if shorter) since its last sign of life; not while it starts
                   -- with the server or restarts after a crash (pg_tide's own false alarm).
                   WHEN (procs.scheduler = 0 AND alive_at < p_now - least(stalled_after, interval '10 seconds'))
                        OR alive_at < p_now - stalled_after THEN 'down'
                   WHEN procs.scheduler = 0 THEN 'late'
                   WHEN (w->>'failing')::boolean THEN 'failing'
                   WHEN procs.executors < executors_expected OR procs.delivery = 0 OR procs.notifier = 0 OR dl.dead > 0
                        OR alerts_untaken > 0 OR notify_queue_usage >= 0.5 THEN 'late'
                   ELSE 'ok' END;
    last_tick := ok_at;
    since_last_tick := p_now - alive_at;
    tick_errors := (w->>'tick_errors')::bigint;
    last_tick_error := w->>'tick_error';
    last_tick_error_at := err_at;
    scheduler_alive := procs.scheduler > 0;
    executors_alive := procs.executors;
    delivery_alive := procs.delivery > 0;
    notifier_alive := procs.notifier > 0;
    ready_runs := ready.n;
    oldest_ready := ready.oldest;
    deliveries_pending := dl.pending;
    deliveries_dead_24h := dl.dead;
    ping_configured := (w->>'ping_configured')::boolean;
    last_ping_at := to_timestamp((w->>'ping_at')::float8 / 1000);
    last_ping_status := (w->>'ping_status')::integer;
    owner := (SELECT r.rolname FROM pg_extension x JOIN pg_roles r ON r.oid = x.extowner WHERE x.extname = 'pg_tide');
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION tide._self(timestamptz) IS
    'Internal: pg_tide''s own health at an instant (tide.self_health), in the database it serves, for superusers and tide_admin.';


CREATE VIEW tide.self_health WITH (security_invoker = true) AS SELECT * FROM tide._self(now());
COMMENT ON VIEW tide.self_health IS
    'pg_tide itself: status (ok, late, failing, down, paused), the last successful tick and the time since, tick errors since the server started and the last one, whether the scheduler, executors, delivery worker and notifier run, ready runs and the oldest one''s wait, alert deliveries pending and dead in 24 h, the ping, alerts_untaken: open alerts no channel or route takes (late while there are any), and notify_queue_usage: the share of PostgreSQL''s notification queue in use (late from 0.5: pg_tide then sends no notifications and workers poll; a session that LISTENs in a transaction it keeps open holds the queue). Shown in the database pg_tide serves, to superusers and members of tide_admin.';
GRANT SELECT ON tide.self_health TO PUBLIC;

CREATE VIEW tide.health WITH (security_invoker = true) AS
SELECT task, status, severity, last_success, silence, max_silence, last_state, consecutive_failures,
       consecutive_skips, retries_24h, backlog, oldest_ready, dead, need_check, p50_duration, p95_duration,
       p95_queue_wait, next_fire_at, owner, open_differences, differences_for_a_person
  FROM tide._health(now())
UNION ALL
-- pg_tide itself, as one more row (see tide.self_health).
SELECT 'pg_tide', x.status, 'critical', x.last_tick, x.since_last_tick, x.stalled_after, NULL, 
       CASE WHEN x.last_tick_error_at > coalesce(x.last_tick, '-infinity') THEN 1 ELSE 0 END, 0, 0,
       x.ready_runs, x.oldest_ready, x.deliveries_dead_24h, 0, NULL, NULL, NULL, NULL, x.owner, NULL, NULL
  FROM tide._self(now()) x;
COMMENT ON VIEW tide.health IS
    'One row per task, and one named pg_tide for pg_tide itself (in the database it serves, for superusers and tide_admin: its last tick, tick errors, ready runs and dead alert deliveries; see tide.self_health): status (ok, late, failing, unbalanced, down, paused, never_ran), last success, silence so far against max_silence, last run state, failures and skips in a row, retries in 24 h, backlog (ready + waiting), age of the oldest ready run, dead and need_check runs, p50/p95 duration and p95 queue wait over 24 h, next fire, owner. A role sees its own tasks (a superuser every role''s).';
GRANT SELECT ON tide.health TO PUBLIC;

-- Inlined into tide.dashboard's ORDER BY: no SET clause, every name qualified (scripts/pgspot.sh
-- lists it).
CREATE FUNCTION tide._status_rank(status text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT pg_catalog.array_position(ARRAY['down', 'failing', 'unbalanced', 'late', 'never_ran', 'ok', 'paused']::pg_catalog.text[], status) $$;
COMMENT ON FUNCTION tide._status_rank(text) IS 'Internal: sort order of statuses, worst first.';

-- Sorted in a subquery whose first columns are the sort keys: the sort compares rows stored
-- with the columns of the select list first and its keys after, and every key read past the
-- varying-length columns walked them again, at each comparison (over 10,000 tasks alike but
-- for their names, that was a quarter of the view's time). The outer ORDER BY is the
-- subquery's: no second sort.
CREATE VIEW tide.dashboard WITH (security_invoker = true) AS
SELECT left(s.task, 16) AS task, s.status, left(s.severity::text, 4) AS sev, tide._short(s.silence) AS quiet,
       tide._short(s.max_silence) AS max, s.consecutive_failures AS fail, s.backlog AS todo,
       tide._short(s.oldest_ready) AS wait, tide._short(s.next_fire_at - now()) AS next
  FROM (SELECT tide._status_rank(h.status) AS rank, h.severity, h.silence, h.task, h.status, h.max_silence,
               h.consecutive_failures, h.backlog, h.oldest_ready, h.next_fire_at
          FROM tide.health h
         ORDER BY 1, 2 DESC, 3 DESC NULLS LAST, 4) s
 ORDER BY s.rank, s.severity DESC, s.silence DESC NULLS LAST, s.task;
COMMENT ON VIEW tide.dashboard IS
    'tide.health in 80 columns, worst first: status, severity, silence (quiet) against max_silence, failed attempts in a row, backlog (todo), the oldest ready run''s wait (wait), time to the next fire.';
GRANT SELECT ON tide.dashboard TO PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- Heartbeat checks: work outside pg_tide reports that it ran (a dead-man's switch).
CREATE TABLE tide.check (
    check_id     bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    name         text NOT NULL CHECK (btrim(name) <> ''),
    period       interval CHECK (period > interval '0'),
    schedule     text,
    tz           text NOT NULL DEFAULT 'UTC',
    grace        interval NOT NULL DEFAULT '1 hour' CHECK (grace >= interval '0'),
    severity     tide.severity NOT NULL DEFAULT 'warning',
    paused       boolean NOT NULL DEFAULT false,
    last_beat_at timestamptz,
    last_beat_ok boolean,
    last_message text,
    beats        bigint NOT NULL DEFAULT 0,
    owner        name NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CHECK ((period IS NULL) <> (schedule IS NULL)),
    -- Names belong to their owner, as task names do.
    CONSTRAINT check_owner_name_key UNIQUE (owner, name)
);
COMMENT ON TABLE tide.check IS
    'Heartbeat checks (tide.check): each expects a beat (tide.heartbeat_check) every period, or at each fire of a cron schedule, within a grace time.';

CREATE FUNCTION tide.create_check(name text, schedule text, grace interval DEFAULT '1 hour', tz text DEFAULT 'UTC',
                           severity text DEFAULT 'warning')
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- CHECK is a reserved word: the parameters are used by position.
    c_name ALIAS FOR $1;
    c_schedule ALIAS FOR $2;
    c_grace ALIAS FOR $3;
    c_tz ALIAS FOR $4;
    c_severity ALIAS FOR $5;
    p interval;
    cron text;
    id bigint;
BEGIN
    IF c_name IS NULL OR c_name ~ '^[[:space:]]*$' THEN
        RAISE EXCEPTION 'check name must not be empty, got %', coalesce(quote_literal(left(c_name, 20)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'name the job the beats come from, such as ''nightly-backup''';
    END IF;
    PERFORM tide._text_arg('check name', c_name, 200, 'name the job the beats come from, such as ''nightly-backup''');
    IF c_schedule IS NULL OR c_grace IS NULL OR c_tz IS NULL OR c_severity IS NULL THEN
        RAISE EXCEPTION 'schedule, grace, tz and severity must not be NULL'
            USING ERRCODE = 'null_value_not_allowed', HINT = 'pass a period such as ''1 day'' or a cron schedule such as ''0 3 * * *''';
    END IF;
    IF c_grace < interval '0' THEN
        RAISE EXCEPTION 'grace must not be negative, got %', c_grace
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass grace => ''30 minutes''';
    END IF;
    PERFORM tide._bounded('grace', c_grace, true);
    PERFORM tide._text_arg('schedule', c_schedule, 500, 'pass a period such as ''1 day'' or a cron schedule such as ''0 3 * * *''');
    -- A period ('1 day', '6 hours') or else a cron schedule, checked like tide.schedule checks it.
    BEGIN
        p := c_schedule::interval;
    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
        p := NULL;
    END;
    IF p IS NOT NULL AND p <= interval '0' THEN
        RAISE EXCEPTION 'period must be a positive interval, got %', c_schedule
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass a period such as ''1 day'' or a cron schedule such as ''0 3 * * *''';
    END IF;
    PERFORM tide._bounded('period', p, false);
    IF p IS NULL THEN
        cron := btrim(c_schedule);
        PERFORM tide._next_fire(cron, c_tz, now());
    ELSE
        PERFORM tide._next_fire('* * * * *', c_tz, now());  -- checks the time zone
    END IF;
    INSERT INTO tide.check AS c (name, period, schedule, tz, grace, severity, owner)
    VALUES (btrim(c_name), p, cron, c_tz, c_grace, tide._severity(c_severity, 'severity'), tide._caller())
    ON CONFLICT ON CONSTRAINT check_owner_name_key DO UPDATE
       SET period = EXCLUDED.period, schedule = EXCLUDED.schedule, tz = EXCLUDED.tz,
           grace = EXCLUDED.grace, severity = EXCLUDED.severity
    RETURNING c.check_id INTO id;
    RETURN id;
END
$$;
COMMENT ON FUNCTION tide.create_check(text, text, interval, text, text) IS
    'create_check(name, schedule, grace => ''1 hour'', tz => ''UTC'', severity => ''warning''): declares (or changes) one of the caller''s heartbeat checks (names are per role): a beat is expected every period (schedule = ''1 day'') or at each fire of a cron schedule (''0 3 * * *'' in tz), within grace. Returns its check_id.';

CREATE FUNCTION tide.heartbeat_check(name text, ok boolean DEFAULT true, message text DEFAULT NULL) RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c tide.check;
BEGIN
    PERFORM tide._text_arg('name', heartbeat_check.name, 200, 'pass the name of one of your checks');
    UPDATE tide.check x
       SET last_beat_at = now(), last_beat_ok = coalesce(heartbeat_check.ok, true),
           last_message = tide._clip(heartbeat_check.message, 10000), beats = x.beats + 1
     WHERE x.name = heartbeat_check.name AND x.owner = tide._caller()
    RETURNING * INTO c;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no check named "%"', heartbeat_check.name USING ERRCODE = 'undefined_object',
            HINT = 'declare it first: SELECT tide.create_check(''name'', ''1 day'')';
    END IF;
    RETURN tide._expected_beat(c);
END
$$;
COMMENT ON FUNCTION tide.heartbeat_check(text, boolean, text) IS
    'heartbeat_check(name, ok => true, message => NULL): records a beat of a check (ok => false reports a failure: the check is down at once). Returns when the next beat is expected.';

CREATE FUNCTION tide._expected_beat(c tide.check) RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN c.last_beat_at IS NULL THEN NULL
                WHEN c.period IS NOT NULL THEN c.last_beat_at + c.period
                ELSE tide._next_fire(c.schedule, c.tz, c.last_beat_at) END
$$;
COMMENT ON FUNCTION tide._expected_beat(tide.check) IS 'Internal: when a check expects its next beat.';

CREATE FUNCTION tide._set_check_paused(p_name text, p_paused boolean) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._text_arg('name', p_name, 200, 'pass the name of one of your checks');
    -- Resuming starts the wait afresh: time spent paused is not silence.
    UPDATE tide.check x SET paused = p_paused,
                            last_beat_at = CASE WHEN p_paused OR x.last_beat_at IS NULL THEN x.last_beat_at ELSE now() END,
                            last_beat_ok = CASE WHEN p_paused OR x.last_beat_at IS NULL THEN x.last_beat_ok ELSE true END
     WHERE x.name = p_name AND x.owner = tide._caller() AND x.paused IS DISTINCT FROM p_paused;
    IF FOUND THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM tide.check x WHERE x.name = p_name AND x.owner = tide._caller()) THEN
        RAISE EXCEPTION 'no check named "%"', p_name USING ERRCODE = 'undefined_object',
            HINT = 'list your checks with: SELECT name FROM tide.check';
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION tide._set_check_paused(text, boolean) IS 'Internal: pauses or resumes a check; false if it already was.';

CREATE FUNCTION tide.pause_check(name text) RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT tide._set_check_paused(name, true) $$;
COMMENT ON FUNCTION tide.pause_check(text) IS 'pause_check(name): the check is paused: no alerts until tide.resume_check. False if it already was.';
CREATE FUNCTION tide.resume_check(name text) RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT tide._set_check_paused(name, false) $$;
COMMENT ON FUNCTION tide.resume_check(text) IS 'resume_check(name): resumes a paused check; the next heartbeat is expected one period (or fire) from now. False if it was not paused.';

CREATE FUNCTION tide.drop_check(name text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._text_arg('name', drop_check.name, 200, 'pass the name of one of your checks');
    DELETE FROM tide.check x WHERE x.name = drop_check.name AND x.owner = tide._caller();
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION tide.drop_check(text) IS 'drop_check(name): deletes a check (its open alerts resolve at the next evaluation); false if there was none by that name.';

-- The status of every check at an instant.
CREATE FUNCTION tide._checks(p_now timestamptz)
RETURNS TABLE (name text, status text, severity tide.severity, last_beat timestamptz,
               expected_at timestamptz, grace interval, message text, owner name)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.name,
           CASE WHEN c.paused THEN 'paused'
                WHEN c.last_beat_at IS NULL THEN 'new'
                WHEN NOT c.last_beat_ok THEN 'down'
                WHEN p_now <= e.at THEN 'up'
                WHEN p_now <= e.at + c.grace THEN 'late'
                ELSE 'down' END,
           c.severity, c.last_beat_at, e.at, c.grace, c.last_message, c.owner
      FROM tide.check c, LATERAL (SELECT tide._expected_beat(c) AS at) e
$$;
COMMENT ON FUNCTION tide._checks(timestamptz) IS 'Internal: the status of every heartbeat check at an instant.';

-- The status of every check, and of every task seen as a heartbeat (each success is a beat).
CREATE FUNCTION tide._check_status(p_now timestamptz)
RETURNS TABLE (kind text, name text, status text, severity tide.severity, last_beat timestamptz,
               expected_at timestamptz, grace interval, message text, owner name)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'check', c.* FROM tide._checks(p_now) c
    UNION ALL
    SELECT 'task', h.task,
           CASE WHEN h.status = 'paused' THEN 'paused'
                WHEN h.last_success IS NULL AND h.status IN ('never_ran', 'failing') THEN 'new'
                ELSE (ARRAY['up', 'late', 'down'])[tide._silence_level(h.silence, h.max_silence) + 1] END,
           h.severity, h.last_success, h.last_success + h.max_silence, h.max_silence, NULL, h.owner
      FROM tide._health(p_now) h
$$;
COMMENT ON FUNCTION tide._check_status(timestamptz) IS 'Internal: tide.check_status at an instant.';

CREATE VIEW tide.check_status WITH (security_invoker = true) AS
SELECT kind, name, status, severity, last_beat, expected_at, grace, message, owner FROM tide._check_status(now());
COMMENT ON VIEW tide.check_status IS
    'Every heartbeat check (kind check) and every task (kind task: each successful run is a beat): new, up, late (in grace), down, paused.';
GRANT SELECT ON tide.check_status TO PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- Alerts.
CREATE TYPE tide.alert_kind AS ENUM (
    'silence', 'down', 'consecutive_failures', 'dead_letter', 'need_check', 'repeated_skips', 'retries',
    'backlog', 'catch_up_limit', 'not_ready', 'schedule_error', 'retry_budget', 'events_lost', 'backfill',
    'reconciliation', 'held', 'delivery_failed', 'scheduler_down', 'undelivered', 'late_start', 'owner_gone'
);
COMMENT ON TYPE tide.alert_kind IS 'What an alert is about; see docs/operations.md, Alerts.';

-- pg_tide's own alert: no successful tick for pg_tide.alert_stalled_after (the scheduler is
-- gone, stuck, or every tick fails). Evaluated by the tick like the others and, since a
-- scheduler that is down cannot report itself, by the delivery worker (tide._evaluate_alerts(now, true)).
CREATE FUNCTION tide._self_causes(p_now timestamptz)
RETURNS TABLE (subject_type text, subject text, kind tide.alert_kind, severity tide.severity, details jsonb, owner name)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- pg_tide's health read once, for both conditions. The kinds are cast from text at run
    -- time: undelivered came in the same version as this function.
    SELECT 'pg_tide', 'pg_tide', c.kind::tide.alert_kind, c.severity::tide.severity, c.details, x.owner
      FROM tide._self(p_now) x
     CROSS JOIN LATERAL (VALUES
        ('scheduler_down', 'critical', x.status = 'down',
         jsonb_build_object('last_tick', x.last_tick, 'since_last_tick', x.since_last_tick, 'scheduler_alive', x.scheduler_alive,
                            'last_tick_error', x.last_tick_error, 'last_tick_error_at', x.last_tick_error_at)),
        -- Alerts that reach no person (no channel takes them): said once, as pg_tide's own
        -- warning, which a channel of a superuser or of tide_admin takes.
        ('undelivered', 'warning', x.alerts_untaken > 0,
         jsonb_build_object('alerts', x.alerts_untaken,
                            'message', format('%s open alerts reach no one: no channel takes them', x.alerts_untaken),
                            'hint', 'SELECT tide.create_channel(''ops'', ''webhook'', ''{"url": "https://..."}''); then SELECT * FROM tide.test_channel(''ops'');'))
     ) AS c(kind, severity, hit, details)
     WHERE c.hit
$$;
COMMENT ON FUNCTION tide._self_causes(timestamptz) IS 'Internal: pg_tide''s own alert conditions at an instant (scheduler_down, undelivered).';

CREATE TABLE tide.alert (
    alert_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject_type text NOT NULL CHECK (subject_type IN ('task', 'check', 'queue', 'backfill', 'channel', 'pg_tide')),
    subject      text NOT NULL,
    kind         tide.alert_kind NOT NULL,
    severity     tide.severity NOT NULL,
    opened_at    timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    resolved_at  timestamptz,
    count        integer NOT NULL DEFAULT 1,
    details      jsonb NOT NULL DEFAULT '{}',
    owner        name NOT NULL,
    -- Acknowledged (tide.ack): no more reminders or escalation; its resolution is still sent.
    acked_at     timestamptz,
    acked_by     name,
    ack_note     text,
    -- Raised one severity by escalation (pg_tide.alert_escalate_after) from the cause's.
    escalated_at timestamptz,
    -- The latest notification sent (opening, escalation or reminder) and how many reminders.
    notified_at  timestamptz,
    reminders    integer NOT NULL DEFAULT 0
);
COMMENT ON TABLE tide.alert IS
    'Alerts opened and resolved by the tick: at most one open alert per owner, subject (task or check) and kind. count = evaluations that found the cause while open.';
-- One open alert per owner, subject and kind (names are per owner): the tick's upsert relies on it.
CREATE UNIQUE INDEX alert_open_key ON tide.alert (owner, subject_type, subject, kind) WHERE resolved_at IS NULL;
CREATE INDEX alert_resolved_idx ON tide.alert (resolved_at) WHERE resolved_at IS NOT NULL;

-- Open alerts that nobody takes: no channel of pg_tide's and no route of your own workers
-- receives them (tide._alert_takers), so they reach no person. pg_tide's own alert of them is
-- not one of them.
CREATE FUNCTION tide._untaken()
RETURNS TABLE (alert_id bigint, subject_type text, subject text, kind text, severity tide.severity,
               opened_at timestamptz, last_seen_at timestamptz, owner name)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT a.alert_id, a.subject_type, a.subject, a.kind::text, a.severity, a.opened_at, a.last_seen_at, a.owner
      FROM tide.alert a
     WHERE a.resolved_at IS NULL AND NOT (a.subject_type = 'pg_tide' AND a.kind::text = 'undelivered')
       AND NOT EXISTS (SELECT 1 FROM tide._alert_takers(a.owner, a.severity::text, a.kind::text, a.subject_type,
                                                         a.subject, false))
$$;
COMMENT ON FUNCTION tide._untaken() IS
    'Internal: the open alerts no channel or route takes (pg_tide''s undelivered alert aside).';

-- How many, for pg_tide's own health: only those seen by more than one evaluation (one opened
-- and resolved by the next would otherwise raise undelivered for a moment: the evaluation
-- counts the alerts open before it).
CREATE FUNCTION tide._alerts_untaken() RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*)::integer FROM tide._untaken() u WHERE u.last_seen_at > u.opened_at
$$;
COMMENT ON FUNCTION tide._alerts_untaken() IS
    'Internal: how many open alerts, seen by more than one evaluation, no channel or route takes (pg_tide''s undelivered alert aside).';

-- The caller's own (its teams', every role's for tide_admin). Runs as the extension's owner
-- (volatile and public: see src/security/caller.rs), as the channels of pg_tide's owner that take every
-- role's alerts are not the caller's to read; tide._may_act keeps to the caller's alerts.
CREATE FUNCTION tide.untaken_alerts()
RETURNS TABLE (alert_id bigint, subject_type text, subject text, kind text, severity text, opened_at timestamptz, owner name)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT u.alert_id, u.subject_type, u.subject, u.kind, u.severity::text, u.opened_at, u.owner
      FROM tide._untaken() u
     WHERE tide._may_act(u.owner)
     ORDER BY u.severity DESC, u.opened_at
$$;
COMMENT ON FUNCTION tide.untaken_alerts() IS
    'Your open alerts (your own, your teams'', every role''s for tide_admin) that no channel or route takes, so they reach no person: alert_id, subject_type, subject, kind, severity, opened_at, owner. Create a channel (tide.create_channel) or a route (tide.create_alert_route) that takes them.';

-- Every condition that holds at an instant, as (subject, kind, details).
CREATE FUNCTION tide._alert_causes(p_now timestamptz)
RETURNS TABLE (subject_type text, subject text, kind tide.alert_kind, severity tide.severity, details jsonb, owner name)
-- PL/pgSQL, one RETURN QUERY, rather than SQL: an SQL function with SET clauses is never inlined
-- and plans its whole query at every call (about 4 ms of the tick's evaluation over 10,000
-- tasks); the session keeps this one's plan (measured over 10,000 idle tasks, three alternating
-- rounds: 7.0-10.7 ms per evaluation against 9.0-14.3).
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
RETURN QUERY
    WITH cfg AS MATERIALIZED (
        SELECT tide._setting('alert_failures', '3')::integer AS failures,
               tide._setting('alert_skips', '3')::integer AS skips,
               tide._setting('alert_retries', '10')::integer AS retries,
               tide._setting('alert_backlog', '1000')::integer AS backlog,
               tide._setting('alert_held_after', '1h')::interval AS held_after
    ), cand AS MATERIALIZED (
        -- The tasks that may have something to report, found from their kept figures and
        -- their schedule errors alone (each condition below, or a superset of it; the kept
        -- rows are narrow, the tasks' are not), and (by tide._health itself, from its one pass
        -- over tide.pending) every task with unfinished or unresolved runs (dead, need_check,
        -- held, backlog): health rows are made for those only, not for every task. A task whose kept figures do not hold (computed after
        -- p_now, expired, or a touch row: every task without kept figures has one) is always a
        -- candidate, as health computes it from its runs.
        SELECT ARRAY(
            SELECT s.task_id FROM cfg, tide.task_stat s
             WHERE s.computed_at > p_now OR s.valid_until <= p_now OR s.quiet_at <= p_now
                OR s.failures >= cfg.failures OR coalesce(s.skips, 0) > cfg.skips
                OR coalesce(s.retries, 0) >= cfg.retries OR s.catch_up_limited > 0 OR s.not_ready > 0
            UNION SELECT t.task_id FROM tide.task t WHERE t.tick_error IS NOT NULL
            UNION SELECT x.task_id FROM tide.task_touch x) AS ids
    ), h AS MATERIALIZED (
        -- Only the tasks with something to report (the details are built for those alone).
        SELECT h.*, CASE WHEN h.paused THEN 0 ELSE tide._silence_level(h.silence, h.max_silence) END AS level
          FROM cand, tide._health(p_now, cand.ids) h, cfg
         WHERE (NOT h.paused AND tide._silence_level(h.silence, h.max_silence) > 0)
            OR h.consecutive_failures >= cfg.failures OR h.dead > 0 OR h.need_check > 0
            OR h.consecutive_skips > cfg.skips OR h.retries_24h >= cfg.retries OR h.backlog >= cfg.backlog
            OR h.catch_up_limited_24h > 0 OR h.not_ready_24h > 0 OR h.tick_error IS NOT NULL
            OR h.held_since <= p_now - cfg.held_after
            -- A ready run waiting long enough to be late (each task's deadline is checked below).
            OR h.oldest_ready > interval '1 second'
    )
    SELECT 'task', h.task, c.kind, h.severity, c.details, h.owner
      FROM h CROSS JOIN cfg CROSS JOIN LATERAL (VALUES
        ('silence'::tide.alert_kind, h.level >= 1,
         jsonb_build_object('silence', h.silence, 'max_silence', h.max_silence, 'last_success', h.last_success)),
        ('down', h.level = 2,
         jsonb_build_object('silence', h.silence, 'max_silence', h.max_silence, 'last_success', h.last_success)),
        ('consecutive_failures', h.consecutive_failures >= cfg.failures,
         jsonb_build_object('consecutive_failures', h.consecutive_failures, 'last_state', h.last_state)),
        ('dead_letter', h.dead > 0, jsonb_build_object('dead', h.dead)),
        ('need_check', h.need_check > 0, jsonb_build_object('need_check', h.need_check)),
        ('repeated_skips', h.consecutive_skips > cfg.skips, jsonb_build_object('consecutive_skips', h.consecutive_skips)),
        ('retries', h.retries_24h >= cfg.retries, jsonb_build_object('retries_24h', h.retries_24h)),
        ('backlog', h.backlog >= cfg.backlog, jsonb_build_object('backlog', h.backlog, 'oldest_ready', h.oldest_ready)),
        ('catch_up_limit', h.catch_up_limited_24h > 0,
         jsonb_build_object('windows_skipped_24h', h.catch_up_limited_24h)),
        ('not_ready', h.not_ready_24h > 0, jsonb_build_object('not_ready_24h', h.not_ready_24h)),
        ('schedule_error', h.tick_error IS NOT NULL,
         jsonb_build_object('error', h.tick_error, 'since', h.tick_error_at, 'retry_at', h.tick_retry_at)),
        ('held', h.held_since <= p_now - cfg.held_after,
         jsonb_build_object('held', h.held, 'since', h.held_since,
                            'confirm', format('SELECT tide.confirm(%L, version)', h.task)))
      ) AS c(kind, hit, details)
     WHERE c.hit
    UNION ALL
    -- A ready run not started by its deadline (tide._start_deadline): its wait and, as far as
    -- pg_tide can tell, why. Resolves when it starts.
    SELECT 'task', h.task, 'late_start'::text::tide.alert_kind, h.severity,
           jsonb_build_object('run_id', l.run_id, 'waited', h.oldest_ready, 'start_deadline', l.deadline,
                              'cause', tide._late_cause(l.run_id)),
           h.owner
      FROM h JOIN tide.task t ON t.task_id = h.task_id
     CROSS JOIN LATERAL (SELECT r.run_id, tide._start_deadline(t.start_deadline, t.fire_gap, r.window_start IS NOT NULL) AS deadline
                           FROM tide.run r WHERE r.run_id = h.oldest_ready_id) l
     WHERE h.oldest_ready > l.deadline
    UNION ALL
    SELECT 'check', s.name, k.kind, s.severity,
           jsonb_build_object('status', s.status, 'last_beat', s.last_beat, 'expected_at', s.expected_at, 'message', s.message),
           s.owner
      FROM tide._checks(p_now) s
      CROSS JOIN LATERAL (VALUES ('silence'::tide.alert_kind, s.status IN ('late', 'down')),
                                 ('down'::tide.alert_kind, s.status = 'down')) AS k(kind, hit)
     WHERE k.hit
    UNION ALL
    -- A queue whose retry budget is spent: its downstream is probably down, and its retries
    -- wait for the budget to refill.
    SELECT 'queue', q.name, 'retry_budget', 'warning',
           jsonb_build_object('retry_budget', q.retry_budget, 'retry_window', q.retry_window,
                              'budget_left', round(b.left_now::numeric, 2),
                              'refilled_at', p_now + make_interval(secs => (1 - b.left_now) * extract(epoch FROM q.retry_window)::float8 / q.retry_budget)),
           q.owner
      FROM tide.queue q, LATERAL (SELECT tide._queue_budget(q, p_now) AS left_now) b
     WHERE q.retry_budget IS NOT NULL AND b.left_now < 1
    UNION ALL
    -- An event task whose latest fallback scan found events that were never emitted: events
    -- are being lost upstream (an emit forgotten on some path, a trigger dropped).
    SELECT 'task', t.name, 'events_lost', 'warning',
           jsonb_build_object('missing', (s.result->>'missing')::integer, 'scanned', (s.result->>'scanned')::integer,
                              'keys', s.result->'missing_keys', 'scan_run', s.run_id, 'scanned_at', s.finished_at),
           t.owner
      FROM tide.task t
     CROSS JOIN LATERAL (SELECT x.run_id, x.result, x.finished_at FROM tide.run x
                          WHERE x.task_id = t.task_id AND x.window_start IS NOT NULL AND x.state = 'succeeded'
                          ORDER BY x.window_start DESC LIMIT 1) s
     WHERE t.fallback IS NOT NULL AND (s.result->>'missing')::integer > 0
    UNION ALL
    -- A backfill that waits for a person: its canary or sample failed verification, windows of
    -- it failed, or it paused itself after more than max_failures failures (R9.5, R14.1).
    SELECT 'backfill', b.backfill_id::text, 'backfill', t.severity,
           jsonb_build_object('task', t.name, 'state', b.state, 'reason', b.reason, 'from_date', b.from_date,
                              'to_date', b.to_date, 'windows_failed', b.windows_failed),
           b.owner
      FROM tide.backfill b JOIN tide.task t ON t.task_id = b.task_id
     WHERE b.state IN ('verify_failed', 'needs_review') OR (b.state = 'paused' AND b.failure_pause)
    UNION ALL
    -- A reconciliation with differences for a person (R7.2): classed human, or escalated (a
    -- compensation that could not be made, or ran and the difference remains). The severity is
    -- the highest of their rules'; it resolves once none is open (fixed by a later run or
    -- resolved with tide.resolve_diff).
    SELECT 'task', t.name, 'reconciliation', max(x.severity),
           jsonb_build_object('open', count(DISTINCT (x.biz_date, x.key, x.kind)),
                              'biz_dates', to_jsonb(array_agg(DISTINCT x.biz_date)),
                              'diff_ids', to_jsonb((array_agg(x.diff_id ORDER BY x.diff_id DESC))[1:10])),
           t.owner
      FROM tide.recon_diff x JOIN tide.task t ON t.task_id = x.task_id
     WHERE x.status = 'open' AND (x.class = 'human' OR x.escalated)
     GROUP BY t.task_id, t.name, t.owner
    UNION ALL
    -- A channel of tide.create_channel that gave up on deliveries in the last 24 hours (they
    -- are dead: replay them with tide.replay_effect once the receiver is fixed).
    SELECT 'channel', c.name, 'delivery_failed', 'warning',
           jsonb_build_object('dead', d.n, 'last_error', c.last_error, 'last_error_at', c.last_error_at,
                              'effect_ids', to_jsonb(d.ids)),
           c.owner
      FROM tide.alert_channel c
     CROSS JOIN LATERAL (SELECT count(*) AS n, (array_agg(e.effect_id ORDER BY e.effect_id DESC))[1:10] AS ids
                           FROM tide.effect e
                          WHERE e.owner = c.owner AND e.channel = c.name AND e.state = 'dead'
                            AND e.created_at > p_now - interval '1 day') d
     WHERE d.n > 0
    UNION ALL
    -- A task whose owner no longer exists (paused by tide._pause_orphans): open until it is
    -- given to another role (tide.reassign_owned) or removed (tide.unschedule with owner,
    -- tide.drop_owned).
    SELECT 'task', t.name, 'owner_gone', 'critical',
           jsonb_build_object('owner', t.owner, 'paused_at', t.paused_at,
                              'message', format('the owner of task %s, role %s, no longer exists: the task is paused', t.name, t.owner),
                              'hint', format('give it to another role: SELECT tide.reassign_owned(%L, ''<role>''); or remove it: SELECT tide.unschedule(%L, owner => %L)',
                                             t.owner, t.name, t.owner)),
           t.owner
      FROM tide.task t
     WHERE t.paused AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = t.owner)
    UNION ALL
    SELECT * FROM tide._self_causes(p_now);
END
$$;
COMMENT ON FUNCTION tide._alert_causes(timestamptz) IS 'Internal: every alert condition that holds at an instant.';

-- Delivery: alerts routed to a side-effect channel (src/effects/effects.sql) are recorded there once per
-- opening (and resolution), with the dedupe key alert:<id>:<event>:<channel>, for a delivery
-- worker that posts to chat or sends mail.
CREATE TABLE tide.alert_route (
    channel      tide.channel NOT NULL,
    min_severity tide.severity NOT NULL DEFAULT 'warning',
    kinds        tide.alert_kind[],
    resolved     boolean NOT NULL DEFAULT true,
    owner        name NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT alert_route_pkey PRIMARY KEY (owner, channel)
);
COMMENT ON TABLE tide.alert_route IS
    'Where alerts are delivered: each opening (and, with resolved, each resolution) of an alert of at least min_severity (and of one of kinds, when set) becomes one side effect on the channel. A route receives its owner''s alerts (a superuser''s route receives all).';

CREATE FUNCTION tide.create_alert_route(channel text, min_severity text DEFAULT 'warning', kinds text[] DEFAULT NULL,
                                  resolved boolean DEFAULT true)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bad text;
BEGIN
    PERFORM tide._channel(create_alert_route.channel);
    IF cardinality(create_alert_route.kinds) > 100 THEN
        RAISE EXCEPTION 'kinds has % entries, at most 100', cardinality(create_alert_route.kinds)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'kinds are ' || array_to_string(enum_range(NULL::tide.alert_kind), ', ');
    END IF;
    SELECT string_agg(coalesce(quote_literal(left(x, 40)), 'NULL'), ', ') INTO bad FROM unnest(create_alert_route.kinds) x
     WHERE x IS NULL OR x NOT IN (SELECT e::text FROM unnest(enum_range(NULL::tide.alert_kind)) e);
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'unknown alert kind %', bad USING ERRCODE = 'invalid_parameter_value',
            HINT = 'kinds are ' || array_to_string(enum_range(NULL::tide.alert_kind), ', ');
    END IF;
    INSERT INTO tide.alert_route AS r (channel, min_severity, kinds, resolved, owner)
    VALUES (create_alert_route.channel, tide._severity(coalesce(create_alert_route.min_severity, 'warning'), 'min_severity'),
            create_alert_route.kinds::tide.alert_kind[], coalesce(create_alert_route.resolved, true), tide._caller())
    ON CONFLICT ON CONSTRAINT alert_route_pkey DO UPDATE
       SET min_severity = EXCLUDED.min_severity, kinds = EXCLUDED.kinds, resolved = EXCLUDED.resolved;
    RETURN create_alert_route.channel;
END
$$;
COMMENT ON FUNCTION tide.create_alert_route(text, text, text[], boolean) IS
    'create_alert_route(channel, min_severity => ''warning'', kinds => NULL (all), resolved => true): delivers alerts to a side-effect channel, once per opening (and resolution): a delivery worker takes them with tide.claim_effects(channel).';

CREATE FUNCTION tide.drop_alert_route(channel text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._channel(drop_alert_route.channel);
    DELETE FROM tide.alert_route r WHERE r.channel = drop_alert_route.channel AND r.owner = tide._caller();
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION tide.drop_alert_route(text) IS 'drop_alert_route(channel): stops delivering alerts to a channel; false if there was no route to it.';

-- Opens the alerts whose cause holds and resolves those whose cause is gone; escalates and
-- reminds of the open ones nobody acknowledged. NOTIFYs pg_tide_alert, writes a log line and
-- records the deliveries (tide._alert_deliver) of each opening, escalation, reminder and
-- resolution. p_only_self: pg_tide's own alert only (the delivery worker's watchdog). Returns
-- the counts.
CREATE FUNCTION tide._evaluate_alerts(p_now timestamptz, p_only_self boolean DEFAULT false) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    changes jsonb;
    c jsonb;
    opened integer := 0;
    resolved integer := 0;
    escalate_after interval := tide._setting('alert_escalate_after', '1h')::interval;
    renotify interval := tide._setting('alert_renotify_interval', '4h')::interval;
BEGIN
    WITH cause AS MATERIALIZED (
        SELECT * FROM tide._alert_causes(p_now) WHERE NOT p_only_self
        UNION ALL
        SELECT * FROM tide._self_causes(p_now) WHERE p_only_self
    ), upsert AS (
        INSERT INTO tide.alert AS a (subject_type, subject, kind, severity, opened_at, last_seen_at, details, owner, notified_at)
        SELECT c.subject_type, c.subject, c.kind, c.severity, p_now, p_now, c.details, c.owner, p_now FROM cause c
        ON CONFLICT (owner, subject_type, subject, kind) WHERE resolved_at IS NULL
        DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at, count = a.count + 1, details = EXCLUDED.details,
                      -- An escalated alert keeps its raised severity while its cause lasts.
                      severity = CASE WHEN a.escalated_at IS NULL THEN EXCLUDED.severity
                                      ELSE greatest(EXCLUDED.severity, a.severity) END
        RETURNING a.*, (a.xmax = 0) AS is_new
    ), gone AS (
        UPDATE tide.alert a SET resolved_at = p_now
         WHERE a.resolved_at IS NULL AND (NOT p_only_self OR a.subject_type = 'pg_tide')
           AND NOT EXISTS (SELECT 1 FROM cause c
                            WHERE c.owner = a.owner AND c.subject_type = a.subject_type AND c.subject = a.subject
                              AND c.kind = a.kind)
        RETURNING a.*
    )
    SELECT coalesce(jsonb_agg(x.payload ORDER BY x.alert_id), '[]') INTO changes
      FROM (SELECT u.alert_id, jsonb_build_object('event', 'opened', 'alert_id', u.alert_id, 'subject_type', u.subject_type,
                                     'subject', u.subject, 'kind', u.kind, 'severity', u.severity,
                                     'opened_at', u.opened_at, 'details', u.details) AS payload
              FROM upsert u WHERE u.is_new
            UNION ALL
            SELECT g.alert_id, jsonb_build_object('event', 'resolved', 'alert_id', g.alert_id, 'subject_type', g.subject_type,
                                     'subject', g.subject, 'kind', g.kind, 'severity', g.severity,
                                     'opened_at', g.opened_at, 'resolved_at', g.resolved_at, 'count', g.count,
                                     'acked_by', g.acked_by)
              FROM gone g) x;
    -- Open alerts nobody acknowledged: raised one severity once, after escalate_after; and a
    -- reminder every renotify interval after the latest notification.
    WITH esc AS (
        UPDATE tide.alert a
           SET severity = CASE a.severity WHEN 'info' THEN 'warning'::tide.severity ELSE 'critical' END,
               escalated_at = p_now, notified_at = p_now
         WHERE a.resolved_at IS NULL AND a.acked_at IS NULL AND a.escalated_at IS NULL AND a.severity < 'critical'
           AND escalate_after > interval '0' AND a.opened_at <= p_now - escalate_after
           AND (NOT p_only_self OR a.subject_type = 'pg_tide')
        RETURNING a.*
    ), remind AS (
        UPDATE tide.alert a SET reminders = a.reminders + 1, notified_at = p_now
         WHERE a.resolved_at IS NULL AND a.acked_at IS NULL AND renotify > interval '0'
           AND coalesce(a.notified_at, a.opened_at) <= p_now - renotify
           AND NOT EXISTS (SELECT 1 FROM esc WHERE esc.alert_id = a.alert_id)
           AND (NOT p_only_self OR a.subject_type = 'pg_tide')
        RETURNING a.*
    )
    SELECT changes || coalesce(jsonb_agg(x.payload ORDER BY x.alert_id), '[]') INTO changes
      FROM (SELECT e.alert_id, jsonb_build_object('event', 'escalated', 'alert_id', e.alert_id, 'subject_type', e.subject_type,
                                     'subject', e.subject, 'kind', e.kind, 'severity', e.severity,
                                     'opened_at', e.opened_at, 'details', e.details) AS payload
              FROM esc e
            UNION ALL
            SELECT m.alert_id, jsonb_build_object('event', 'renotify', 'reminder', m.reminders, 'alert_id', m.alert_id,
                                     'subject_type', m.subject_type, 'subject', m.subject, 'kind', m.kind,
                                     'severity', m.severity, 'opened_at', m.opened_at, 'details', m.details)
              FROM remind m) x;
    FOR c IN SELECT * FROM jsonb_array_elements(changes) LOOP
        -- Any role may LISTEN on any channel: the notification says what happened to which
        -- alert, and each role reads the alerts it may see from tide.alert (row security).
        PERFORM tide._notify('pg_tide_alert', jsonb_build_object('event', c->'event', 'alert_id', c->'alert_id')::text);
        PERFORM tide._alert_deliver(c);
        IF c->>'event' = 'opened' THEN
            opened := opened + 1;
        ELSIF c->>'event' = 'resolved' THEN
            resolved := resolved + 1;
        END IF;
        RAISE LOG 'pg_tide: alert=% alert_id=% subject_type=% subject=% kind=% severity=%', c->>'event',
            c->>'alert_id', c->>'subject_type', tide._logfmt(c->>'subject'), c->>'kind', c->>'severity';
    END LOOP;
    RETURN jsonb_build_object('alerts_opened', opened, 'alerts_resolved', resolved);
END
$$;
COMMENT ON FUNCTION tide._evaluate_alerts(timestamptz, boolean) IS
    'Internal: opens and resolves alerts at an instant (one open alert per subject and kind), escalates and reminds of unacknowledged ones, NOTIFYs pg_tide_alert with the event and the alert''s id (nothing of any role''s data: any role may LISTEN) and records the deliveries of each change.';

-- ---------------------------------------------------------------------------------------------
-- Run log lines: one per run start, skip, success and failure, key=value.
-- Inlined into its callers (on the hot paths of claims, emits and the tick), so it has no SET
-- clause, which would forbid inlining: its body names everything with its schema instead, so it
-- is safe under any search_path (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._logfmt(v text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    -- Runs for every run start and end: strpos rather than a regular expression, and STABLE
    -- like to_json, so that it is inlined into the caller's query (an IMMUTABLE function
    -- calling a STABLE one is not).
    SELECT CASE WHEN v IS NULL THEN '-'
                WHEN v OPERATOR(pg_catalog.<>) '' AND pg_catalog.strpos(v, ' ') OPERATOR(pg_catalog.=) 0
                     AND pg_catalog.strpos(v, '"') OPERATOR(pg_catalog.=) 0
                     AND pg_catalog.strpos(v, '=') OPERATOR(pg_catalog.=) 0
                     AND pg_catalog.strpos(v, E'\n') OPERATOR(pg_catalog.=) 0
                     AND pg_catalog.strpos(v, E'\t') OPERATOR(pg_catalog.=) 0
                     AND pg_catalog.strpos(v, '\') OPERATOR(pg_catalog.=) 0 THEN v
                ELSE pg_catalog.to_json(v)::pg_catalog.text END
$$;
COMMENT ON FUNCTION tide._logfmt(text) IS 'Internal: a value for a key=value log line (quoted when needed).';

-- Whether run log lines are on: the hot paths (claims, completions, failures) ask this before
-- calling tide._log_runs, whose call alone cost a claim + complete at batch 1 a twentieth with
-- pg_tide.log_runs = off. Inlined into its callers, so it has no SET clause, which would forbid
-- inlining: its body names everything with its schema instead, so it is safe under any
-- search_path (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._log_on() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT tide._setting('log_runs', 'log') OPERATOR(pg_catalog.<>) 'off'
$$;
COMMENT ON FUNCTION tide._log_on() IS 'Internal: whether pg_tide.log_runs writes run log lines (it is not off).';

CREATE FUNCTION tide._log_runs(p_event text, p_run_ids bigint[], p_error text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lvl text := tide._setting('log_runs', 'log');
    line text;
BEGIN
    IF lvl = 'off' THEN
        RETURN;
    END IF;
    FOR line IN
        SELECT 'pg_tide: event=' || p_event || ' task=' || tide._logfmt(t.name) || ' run_id=' || r.run_id
               || ' biz_date=' || coalesce(r.biz_date::text, '-')
               || ' trigger=' || CASE WHEN r.state = 'skipped' THEN 'skip:' || r.skip_reason ELSE r.trigger::text END
               || ' version=' || r.version || ' attempt=' || r.attempts || ' state=' || r.state
               || ' duration=' || CASE WHEN p_event IN ('success', 'need_check', 'failure') AND r.claimed_at IS NOT NULL
                                       THEN round(extract(epoch FROM clock_timestamp() - r.claimed_at)::numeric, 3) || 's'
                                       ELSE '-' END
               || ' error=' || tide._logfmt(coalesce(p_error, CASE WHEN p_event = 'failure' THEN r.last_error END))
          FROM tide.run r JOIN tide.task t ON t.task_id = r.task_id
         WHERE r.run_id = ANY (p_run_ids) ORDER BY r.run_id
    LOOP
        IF lvl = 'log' THEN
            RAISE LOG '%', line;
        ELSIF lvl = 'info' THEN
            RAISE INFO '%', line;
        ELSE
            RAISE DEBUG '%', line;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION tide._log_runs(text, bigint[], text) IS
    'Internal: writes one key=value server log line per run (event start, skip, success, need_check, failure) at pg_tide.log_runs.';

-- ---------------------------------------------------------------------------------------------
-- The whole story of one run, for psql.
CREATE FUNCTION tide.explain(run_id bigint) RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The lines, returned at the end (pgspot cannot parse RETURN NEXT of an expression).
    story text[] := '{}';
    r tide.run;
    t tide.task;
    e record;
    a record;
    n integer;
    first_cover timestamptz;
    last_cover timestamptz;
BEGIN
    SELECT * INTO r FROM tide.run x WHERE x.run_id = $1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run %', coalesce($1::text, 'NULL') USING ERRCODE = 'undefined_object',
            HINT = 'find runs with: SELECT run_id, biz_date, state FROM tide.run ORDER BY run_id DESC LIMIT 20';
    END IF;
    SELECT * INTO t FROM tide.task x WHERE x.task_id = r.task_id;
    story := story || format('run %s of task %s, rule version %s (task now at version %s)', r.run_id, t.name, r.version, t.version);
    IF r.window_start IS NOT NULL THEN
        story := story || format('window: %s to %s (%s), business date %s', r.window_start, r.window_end, t.tz, r.biz_date);
    ELSE
        story := story || format('event run on %s, dedupe key %s%s, payload %s', r.topic, r.dedupe_key,
                           coalesce(', key ' || r.event_key || ' (runs of this key go one at a time, in emit order)', ''),
                           r.payload);
    END IF;
    FOR e IN SELECT b.backfill_id, b.from_date, b.to_date, b.state, b.mode, b.queue, w.seq, b.windows_total, w.canary, w.sampled,
                    w.verify_note
               FROM tide.backfill_window w JOIN tide.backfill b ON b.backfill_id = w.backfill_id
              WHERE w.run_id = r.run_id ORDER BY b.backfill_id LOOP
        story := story || format('backfill %s (%s to %s, mode %s, now %s): window %s of %s%s, in queue %s%s',
                                 e.backfill_id, e.from_date, e.to_date, e.mode, e.state, e.seq, e.windows_total,
                                 CASE WHEN e.canary THEN ' (canary)' WHEN e.sampled THEN ' (sampled)' ELSE '' END, e.queue,
                                 coalesce('; verify: ' || e.verify_note, ''));
    END LOOP;
    -- A reconciliation's run: what each comparison found (R7.4); a compensation: what for.
    FOR e IN SELECT x.* FROM tide.recon_result x WHERE x.run_id = r.run_id ORDER BY x.result_id DESC LIMIT 5 LOOP
        story := story || format('reconciliation at %s: %s; left %s rows %s, right %s rows %s; %s differences %s, by class %s%s',
                                 e.checked_at, e.status, e.left_count, e.left_sums, e.right_count, e.right_sums,
                                 e.differences, e.by_kind, e.by_class,
                                 CASE WHEN e.truncated THEN ' (more than max_diffs: recorded the first, compensated none)' ELSE '' END);
        FOR a IN SELECT x.diff_id, x.kind, x.key, x.class, x.status, x.action_run_id, x.reason FROM tide.recon_diff x
                  WHERE x.result_id = e.result_id ORDER BY x.diff_id LIMIT 10 LOOP
            story := story || format('  difference %s: %s of key %s, %s, %s%s%s', a.diff_id, a.kind, a.key, a.class, a.status,
                                     coalesce(', compensated by run ' || a.action_run_id, ''), coalesce(' (' || a.reason || ')', ''));
        END LOOP;
    END LOOP;
    FOR e IN SELECT x.diff_id, x.reconciliation, x.biz_date, x.kind, x.key, x.status FROM tide.recon_diff x
              WHERE x.action_run_id = r.run_id ORDER BY x.diff_id LIMIT 5 LOOP
        story := story || format('compensates difference %s of reconciliation %s on %s: %s of key %s (%s)',
                                 e.diff_id, e.reconciliation, e.biz_date, e.kind, e.key, e.status);
    END LOOP;
    IF r.lock_key IS NOT NULL THEN
        story := story || format('lock key: %s%s', r.lock_key,
                           coalesce((SELECT format(' (held by run %s until %s)', l.run_id, l.expires_at)
                                       FROM tide.lock l WHERE l.owner = r.owner AND l.key = r.lock_key), ''));
    END IF;
    IF r.batches > 0 OR r.control IS NOT NULL THEN
        story := story || format('long run: %s batches done%s', r.batches,
                           coalesce(format(', %s asked (taken up before the next batch)', r.control), ''));
    END IF;
    IF r.watermark IS NOT NULL THEN
        story := story || format('watermark: %s, unchanged since %s (ready once unchanged for %s); its latest evaluations: %s',
                           coalesce(r.watermark->>'value', 'NULL'), r.watermark->>'since',
                           (SELECT v.rules->>'watermark_stable_for' FROM tide.task_version v
                             WHERE v.task_id = r.task_id AND v.version = r.version),
                           (SELECT string_agg(format('%s = %s', x.ev->>'at', coalesce(x.ev->>'value', 'NULL')), ', ' ORDER BY x.pos)
                              FROM jsonb_array_elements(r.watermark->'checks') WITH ORDINALITY AS x(ev, pos)
                             WHERE x.pos > jsonb_array_length(r.watermark->'checks') - 5));
    END IF;
    story := story || format('trigger: %s%s', r.trigger, CASE WHEN r.fire_at IS NOT NULL THEN format(', scheduled fire at %s', r.fire_at) ELSE '' END);
    story := story || format('state: %s%s: %s', r.state, CASE WHEN r.skip_reason IS NOT NULL THEN format(' (%s)', r.skip_reason) ELSE '' END, r.reason);
    IF r.covered_by IS NOT NULL THEN
        story := story || format('covered by run %s, which ran this window together with others', r.covered_by);
    END IF;
    SELECT count(*), min(x.window_start), max(x.window_end) INTO n, first_cover, last_cover
      FROM tide.run x WHERE x.covered_by = r.run_id;
    IF n > 0 THEN
        story := story || format('covers %s missed windows, %s to %s (misfire policy coalesce)', n, first_cover, last_cover);
    END IF;
    story := story || text 'history:';
    FOR e IN SELECT * FROM tide.run_event x WHERE x.run_id = r.run_id ORDER BY x.event_id LOOP
        story := story || format('  %s  %s -> %s  %s  (by %s)', to_char(e.at, 'YYYY-MM-DD HH24:MI:SS.MS TZ'),
                           coalesce(e.from_state::text, 'created'), e.to_state, e.reason, e.actor);
    END LOOP;
    SELECT count(*) INTO n FROM tide.attempt x WHERE x.run_id = r.run_id;
    story := story || format('attempts: %s%s', n, CASE WHEN r.state = 'running' THEN ' finished, one running' ELSE '' END);
    FOR a IN SELECT * FROM tide.attempt x WHERE x.run_id = r.run_id ORDER BY x.attempt LOOP
        story := story || format('  #%s by %s, claimed %s, %s after %s (lease token %s)%s', a.attempt, coalesce(a.worker, 'a worker'),
                           to_char(a.claimed_at, 'YYYY-MM-DD HH24:MI:SS TZ'), a.outcome, tide._short(a.finished_at - a.claimed_at),
                           a.lease_token,
                           CASE WHEN a.error IS NOT NULL
                                THEN format(': %s error%s: %s', a.error_kind, coalesce(' ' || a.sqlstate, ''), a.error) ELSE '' END);
    END LOOP;
    IF r.state = 'running' THEN
        story := story || format('  #%s by %s, claimed %s, running; lease token %s expires %s', r.attempts, coalesce(r.lease_owner, 'a worker'),
                           to_char(r.claimed_at, 'YYYY-MM-DD HH24:MI:SS TZ'), r.lease_token, r.lease_expires_at);
    END IF;
    FOR e IN SELECT * FROM tide.step x WHERE x.run_id = r.run_id ORDER BY x.started_at, x.name LOOP
        story := story || format('  step %s %s by attempt %s%s', e.name, CASE WHEN e.done THEN 'done' ELSE 'started' END,
                           e.attempt, coalesce(', output ' || e.output::text, ''));
    END LOOP;
    IF r.result IS NOT NULL OR r.expected IS NOT NULL OR r.actual IS NOT NULL THEN
        story := story || format('result: %s, expected %s, actual %s', coalesce(r.result::text, '-'),
                           coalesce(r.expected::text, '-'), coalesce(r.actual::text, '-'));
    END IF;
    IF r.checkpoint IS NOT NULL THEN
        story := story || format('checkpoint: %s', r.checkpoint);
    END IF;
    story := story || CASE r.state
        WHEN 'dead' THEN format('next: fix the cause, then SELECT tide.replay_run(%s)', r.run_id)
        WHEN 'need_check' THEN format('next: check the data, then SELECT tide.resolve_run(%s, ''accept'') or tide.resolve_run(%s, ''replay'')', r.run_id, r.run_id)
        WHEN 'retry' THEN format('next: retried after %s', r.run_after)
        WHEN 'waiting' THEN format('next: waits for readiness (deadline %s)', coalesce(r.ready_deadline::text, 'none'))
        WHEN 'held' THEN format('next: held until SELECT tide.confirm(%s, version)', quote_literal(t.name))
        WHEN 'paused' THEN format('next: paused until SELECT tide.resume_run(%s)', r.run_id)
        WHEN 'ready' THEN format('next: claimable%s', coalesce(' after ' || r.run_after, ''))
        WHEN 'running' THEN 'next: completes or fails; taken back when the lease expires'
        ELSE format('finished %s', coalesce(r.finished_at::text, '')) END;
    RETURN QUERY SELECT u.line FROM unnest(story) WITH ORDINALITY AS u(line, n) ORDER BY u.n;
END
$$;
COMMENT ON FUNCTION tide.explain(bigint) IS
    'explain(run_id): the story of one run, one line per row: why it was created (trigger, fire, misfire decision), its window and rule version, every state change with its reason, each attempt (worker, times, outcome, error), its result, and what comes next.';

-- ---------------------------------------------------------------------------------------------
-- Prometheus metrics.
-- The counters, kept up to date as runs change rather than counted from history (which pruning
-- shortens and which grows without bound): every statement that adds history rows appends what
-- they count to tide.count_delta (the functions that write them, below), and the fold (every
-- tick) moves those into tide.run_count. tide.metrics() reads both.
CREATE TABLE tide.run_count (
    task_id bigint NOT NULL,
    metric  text NOT NULL,
    label   text NOT NULL DEFAULT '',
    value   double precision NOT NULL DEFAULT 0,
    owner   name NOT NULL,
    PRIMARY KEY (task_id, metric, label)
);
COMMENT ON TABLE tide.run_count IS
    'The counters of tide.metrics() per task (runs by outcome, duration and queue-wait sums and counts), as of the last fold; they never go down, pruning included. Maintained by pg_tide.';
CREATE TABLE tide.count_delta (
    task_id bigint NOT NULL,
    metric  text NOT NULL,
    label   text NOT NULL DEFAULT '',
    value   double precision NOT NULL,
    owner   name NOT NULL
);
COMMENT ON TABLE tide.count_delta IS
    'Counts added since the last fold (appended by the functions that write history rows, moved into tide.run_count each tick). Maintained by pg_tide.';

-- The upper bounds (in seconds) of the histogram buckets of run durations and queue waits, as
-- their `le` labels: the smallest bound a value is at most, NULL above the largest (those count
-- only in the +Inf bucket, which is the count). src/monitor/prometheus.rs has the same list (BUCKETS).
-- Inlined into tide._counts_of (no SET clause; names qualified, scripts/pgspot.sh lists it).
CREATE FUNCTION tide._le(seconds double precision)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN seconds OPERATOR(pg_catalog.<=) 0.01 THEN '0.01'
                WHEN seconds OPERATOR(pg_catalog.<=) 0.05 THEN '0.05'
                WHEN seconds OPERATOR(pg_catalog.<=) 0.1 THEN '0.1'
                WHEN seconds OPERATOR(pg_catalog.<=) 0.5 THEN '0.5'
                WHEN seconds OPERATOR(pg_catalog.<=) 1 THEN '1'
                WHEN seconds OPERATOR(pg_catalog.<=) 5 THEN '5'
                WHEN seconds OPERATOR(pg_catalog.<=) 10 THEN '10'
                WHEN seconds OPERATOR(pg_catalog.<=) 30 THEN '30'
                WHEN seconds OPERATOR(pg_catalog.<=) 60 THEN '60'
                WHEN seconds OPERATOR(pg_catalog.<=) 300 THEN '300'
                WHEN seconds OPERATOR(pg_catalog.<=) 900 THEN '900'
                WHEN seconds OPERATOR(pg_catalog.<=) 3600 THEN '3600'
                WHEN seconds OPERATOR(pg_catalog.<=) 21600 THEN '21600'
           END
$$;
COMMENT ON FUNCTION tide._le(double precision) IS
    'Internal: the histogram bucket (its upper bound, the le label) of a duration or wait in seconds; NULL above 21600 (+Inf only).';

-- A duration as the index of its bucket in the hourly counters: bucket k holds durations of at
-- most 2^(k/4) milliseconds (each bucket 19% wider than the one before; 0: 1 ms or less, 120:
-- 12 days or more). tide._bucket_bound gives a bucket's bound back. Inlined into
-- tide._counts_of (no SET clause; names qualified, scripts/pgspot.sh lists it).
CREATE FUNCTION tide._duration_bucket(d interval) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN extract(epoch FROM d) OPERATOR(pg_catalog.<=) 0.001 THEN 0
                ELSE LEAST(120::numeric, pg_catalog.ceil(4 OPERATOR(pg_catalog.*)
                         pg_catalog.log(2.0, (extract(epoch FROM d) OPERATOR(pg_catalog.*) 1000)::numeric)))::integer END
$$;
COMMENT ON FUNCTION tide._duration_bucket(interval) IS
    'Internal: the bucket of a duration in the hourly counters (durations of at most 2^(k/4) ms in bucket k).';

-- What one history row adds to the counters of tide.metrics(), from the run it ends in: an
-- outcome reached (a replayed run counts again), with the duration of a success (its last
-- attempt) and its histogram bucket; a run's first start, with its wait from fire (or creation)
-- and its bucket. Buckets are counted once each (not cumulative): tide.metrics() adds them up.
-- The one definition every writer of history rows counts them with (below). Inlined into
-- its callers, so it has no SET clause, which would forbid inlining: its body names everything
-- with its schema instead, so it is safe under any search_path (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._counts_of(p_to tide.run_state, p_attempts integer, p_claimed timestamptz,
                                p_finished timestamptz, p_started timestamptz, p_fire timestamptz,
                                p_created timestamptz)
RETURNS TABLE (metric text, label text, value double precision)
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT m.metric, m.label, m.value
      FROM (VALUES
          ('runs', p_to::pg_catalog.text, 1::double precision,
           p_to OPERATOR(pg_catalog.=) ANY ('{succeeded,need_check,dead,skipped,cancelled}'::tide.run_state[])),
          ('duration_sum', '', extract(epoch FROM p_finished OPERATOR(pg_catalog.-) p_claimed)::double precision,
           p_to OPERATOR(pg_catalog.=) 'succeeded'::tide.run_state AND p_claimed IS NOT NULL),
          ('duration_count', '', 1, p_to OPERATOR(pg_catalog.=) 'succeeded'::tide.run_state AND p_claimed IS NOT NULL),
          ('duration_bucket', tide._le(extract(epoch FROM p_finished OPERATOR(pg_catalog.-) p_claimed)::double precision), 1,
           p_to OPERATOR(pg_catalog.=) 'succeeded'::tide.run_state AND p_claimed IS NOT NULL),
          ('wait_sum', '', extract(epoch FROM greatest(p_started OPERATOR(pg_catalog.-) COALESCE(p_fire, p_created),
                                                                  '0'::pg_catalog.interval))::double precision,
           p_to OPERATOR(pg_catalog.=) 'running'::tide.run_state AND p_attempts OPERATOR(pg_catalog.=) 1),
          ('wait_count', '', 1, p_to OPERATOR(pg_catalog.=) 'running'::tide.run_state AND p_attempts OPERATOR(pg_catalog.=) 1),
          ('wait_bucket', tide._le(extract(epoch FROM greatest(p_started OPERATOR(pg_catalog.-) COALESCE(p_fire, p_created),
                                                                   '0'::pg_catalog.interval))::double precision), 1,
           p_to OPERATOR(pg_catalog.=) 'running'::tide.run_state AND p_attempts OPERATOR(pg_catalog.=) 1),
          -- The hour's counters of the console's charts (tide.run_hourly, folded by tide._fold):
          -- the hour an attempt ended, its outcome (retry: a failed attempt to be tried again),
          -- and a success's duration as the index of its bucket (tide._duration_bucket).
          ('hour', pg_catalog.concat_ws('|',
                     pg_catalog.floor(extract(epoch FROM COALESCE(p_finished, pg_catalog.now())) OPERATOR(pg_catalog./) 3600)::bigint,
                     p_to,
                     CASE WHEN p_to OPERATOR(pg_catalog.=) 'succeeded'::tide.run_state AND p_claimed IS NOT NULL
                          THEN tide._duration_bucket(p_finished OPERATOR(pg_catalog.-) p_claimed) END), 1,
           p_to OPERATOR(pg_catalog.=) ANY ('{succeeded,need_check,dead,skipped,cancelled,retry}'::tide.run_state[])))
          AS m(metric, label, value, counts)
     WHERE m.counts AND m.label IS NOT NULL
$$;
COMMENT ON FUNCTION tide._counts_of(tide.run_state, integer, timestamptz, timestamptz, timestamptz, timestamptz, timestamptz) IS
    'Internal: what a history row that brings a run to a state adds to the counters of tide.metrics() and to the hourly counters of tide.run_hours (metric, label, value).';

-- There is no trigger on tide.run_event: every path that writes history rows writes what they
-- count itself, in the same transaction (tide.claim_runs, tide.complete_run(s), tide._fail,
-- tide._run_changed, tide._record_created; tide.enqueue and tide._emit create runs that count
-- nothing). A statement trigger's transition table copied every history row, even those the
-- hot paths counted themselves (measured by hand: 17% of one tide.emit per transaction from one
-- client with asynchronous commit; bulk enqueue within the noise). A restore's COPY into tide.run_event counts nothing again: the
-- counters are restored with it (tide.run_count and tide.count_delta are dumped).

-- tide.metrics() reads tide.run_count and tide.count_delta with task health and writes the
-- Prometheus text in Rust (src/monitor/metrics.rs, src/monitor/prometheus.rs).

-- ---------------------------------------------------------------------------------------------
-- Retention: the tick prunes finished history older than pg_tide.history_retention, a bounded
-- batch at a time (every pg_tide.monitor_interval), walking tide.run by id. Kept always: the latest 10 runs of each task, runs
-- that are not finished or wait for a person (dead, need_check), the coalesced run of windows
-- still kept, and open alerts.
CREATE TABLE tide.monitor_state (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    evaluated_at timestamptz,
    prune_cursor bigint NOT NULL DEFAULT 0
);
COMMENT ON TABLE tide.monitor_state IS 'Internal: when alerts were last evaluated, and where pruning goes on.';
INSERT INTO tide.monitor_state DEFAULT VALUES;

CREATE FUNCTION tide._prune(p_now timestamptz, p_limit integer) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    cursor_at bigint;
    last_id bigint;
    scanned integer;
    victims bigint[];
    -- Settings with units read as '30d', '10s': valid interval input.
    cutoff timestamptz := p_now - tide._setting('history_retention', '30d')::interval;
    alerts integer;
    effects integer;
BEGIN
    SELECT m.prune_cursor INTO cursor_at FROM tide.monitor_state m FOR UPDATE;
    SELECT max(s.run_id), count(*),
           array_agg(s.run_id) FILTER (
               WHERE s.state IN ('succeeded', 'skipped', 'cancelled')
                 AND coalesce(s.finished_at, s.updated_at) < cutoff
                 AND NOT EXISTS (SELECT 1 FROM tide.run c WHERE c.covered_by = s.run_id)
                 AND s.run_id NOT IN (SELECT k.run_id FROM tide.run k
                                       WHERE k.task_id = s.task_id AND k.window_start IS NOT NULL
                                       ORDER BY k.window_start DESC LIMIT 10))
      INTO last_id, scanned, victims
      FROM (SELECT r.run_id, r.task_id, r.state, r.finished_at, r.updated_at FROM tide.run r
             WHERE r.run_id > cursor_at ORDER BY r.run_id LIMIT p_limit) s;
    IF victims IS NOT NULL THEN
        -- Runs a transaction holds right now are left for the next round.
        SELECT array_agg(v.run_id) INTO victims
          FROM (SELECT x.run_id FROM tide.run x WHERE x.run_id = ANY (victims) FOR UPDATE SKIP LOCKED) v;
    END IF;
    IF victims IS NOT NULL THEN
        -- R4.6: the windows that succeeded are remembered, merged into ranges, after their runs
        -- go (a rerun or backfill of them needs force).
        INSERT INTO tide.succeeded_window AS w (task_id, windows, owner)
        SELECT r.task_id, range_agg(tstzrange(r.window_start, r.window_end)), min(r.owner)
          FROM tide.run r
         WHERE r.run_id = ANY (victims) AND r.state = 'succeeded' AND r.window_start IS NOT NULL
         GROUP BY r.task_id
        ON CONFLICT (task_id) DO UPDATE SET windows = w.windows + EXCLUDED.windows;
        DELETE FROM tide.run r WHERE r.run_id = ANY (victims);
    END IF;
    -- What the fold kept for tasks deleted since (bounded, like the rest).
    DELETE FROM tide.task_stat s
     WHERE s.task_id IN (SELECT x.task_id FROM tide.task_stat x
                          WHERE NOT EXISTS (SELECT 1 FROM tide.task t WHERE t.task_id = x.task_id) LIMIT p_limit);
    DELETE FROM tide.run_count c
     WHERE c.task_id IN (SELECT x.task_id FROM tide.run_count x
                          WHERE NOT EXISTS (SELECT 1 FROM tide.task t WHERE t.task_id = x.task_id) LIMIT p_limit);
    -- The hourly counters of the charts, kept eight days (tide.run_hours reads at most 192 hours).
    DELETE FROM tide.run_hourly x
     WHERE (x.task_id, x.hour) IN (SELECT y.task_id, y.hour FROM tide.run_hourly y
                                    WHERE y.hour < date_trunc('hour', p_now) - interval '192 hours' LIMIT p_limit);
    DELETE FROM tide.owner_hourly x
     WHERE (x.owner, x.hour) IN (SELECT y.owner, y.hour FROM tide.owner_hourly y
                                  WHERE y.hour < date_trunc('hour', p_now) - interval '192 hours' LIMIT p_limit);
    -- At the end of the table, start over (runs kept then may be prunable later).
    UPDATE tide.monitor_state SET prune_cursor = CASE WHEN scanned < p_limit THEN 0 ELSE last_id END;
    DELETE FROM tide.alert a
     WHERE a.alert_id IN (SELECT x.alert_id FROM tide.alert x WHERE x.resolved_at < cutoff ORDER BY x.resolved_at LIMIT p_limit);
    GET DIAGNOSTICS alerts = ROW_COUNT;
    -- Side effects delivered before the cutoff (their dedupe keys are forgotten with them);
    -- pending, sending and dead ones stay. One held right now waits for the next round.
    DELETE FROM tide.effect e
     WHERE e.effect_id IN (SELECT x.effect_id FROM tide.effect x
                            WHERE x.state = 'delivered' AND x.delivered_at < cutoff
                            ORDER BY x.delivered_at LIMIT p_limit
                              FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS effects = ROW_COUNT;
    -- Backfills that ended before the cutoff, with their plan and history.
    DELETE FROM tide.backfill b
     WHERE b.backfill_id IN (SELECT x.backfill_id FROM tide.backfill x
                              WHERE x.finished_at < cutoff
                                AND NOT EXISTS (SELECT 1 FROM tide.backfill_window w
                                                 WHERE w.backfill_id = x.backfill_id AND w.state = 'released')
                              ORDER BY x.finished_at LIMIT 100
                                FOR UPDATE SKIP LOCKED);
    -- Reconciliation results checked before the cutoff, with their differences, once none of
    -- those is open (an open one keeps its result until it is fixed or resolved).
    DELETE FROM tide.recon_result x
     WHERE x.result_id IN (SELECT y.result_id FROM tide.recon_result y
                            WHERE y.checked_at < cutoff
                              AND NOT EXISTS (SELECT 1 FROM tide.recon_diff d WHERE d.result_id = y.result_id AND d.status = 'open')
                            ORDER BY y.checked_at LIMIT p_limit
                              FOR UPDATE SKIP LOCKED);
    RETURN jsonb_build_object('pruned_runs', coalesce(cardinality(victims), 0), 'pruned_alerts', alerts,
                              'pruned_effects', effects);
END
$$;
COMMENT ON FUNCTION tide._prune(timestamptz, integer) IS
    'Internal: prunes a bounded batch of finished history older than pg_tide.history_retention (with attempts and events), keeping the latest 10 runs of each task, unfinished and unresolved runs, and open alerts (succeeded windows are remembered in tide.succeeded_window); side effects delivered before the cutoff; backfills that ended before it; reconciliation results checked before it without an open difference.';

-- The tick's monitoring step, every pg_tide.monitor_interval: alerts, then a batch of pruning
-- (up to 5000 runs: a tick that has nothing to evaluate costs nothing here).
CREATE FUNCTION tide._monitor(p_now timestamptz) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    step interval := tide._setting('monitor_interval', '10s')::interval;
BEGIN
    -- Every tick: the kept health figures and counters take in what changed.
    PERFORM tide._fold(p_now);
    -- Claims the evaluation only when it is due: an idle tick reads one row and writes nothing,
    -- and a concurrent tick waits on the row lock, then finds it no longer due. Tests drive time
    -- backwards too: any move of at least the interval evaluates.
    UPDATE tide.monitor_state m SET evaluated_at = p_now
     WHERE m.evaluated_at IS NULL OR p_now >= m.evaluated_at + step OR p_now < m.evaluated_at;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM tide.monitor_state) THEN
            RETURN jsonb_build_object('alerts_opened', 0, 'alerts_resolved', 0, 'pruned_runs', 0, 'pruned_alerts', 0,
                                      'pruned_effects', 0);
        END IF;
        INSERT INTO tide.monitor_state (evaluated_at) VALUES (p_now);  -- the row was deleted
    END IF;
    -- Task health reads kept figures only for tasks that have them or a touch row (see
    -- tide._health). Both are pg_tide's own rows, but should a task lack both (its kept row
    -- deleted by hand), it is noted again here, before the alerts are evaluated.
    INSERT INTO tide.task_touch (task_id, owner)
    SELECT t.task_id, t.owner FROM tide.task t
     WHERE NOT EXISTS (SELECT 1 FROM tide.task_stat s WHERE s.task_id = t.task_id)
       AND NOT EXISTS (SELECT 1 FROM tide.task_touch u WHERE u.task_id = t.task_id);
    -- Runs left of deleted tasks (see tide.task_gone).
    PERFORM tide._sweep_gone();
    -- Tasks whose owner was dropped (from another database: src/security/roles.sql), event tasks among
    -- them, stop; the alert owner_gone says why.
    PERFORM tide._pause_orphans(p_now);
    RETURN tide._evaluate_alerts(p_now) || tide._prune(p_now, 5000);
END
$$;
COMMENT ON FUNCTION tide._monitor(timestamptz) IS
    'Internal: the tick''s monitoring: every pg_tide.monitor_interval, notes again any task without kept health figures or a touch row, deletes runs left of deleted tasks, evaluates alerts and prunes a batch of old history.';

-- ---------------------------------------------------------------------------------------------
-- Row-level security and grants, as for the other tables: every role reads its own, and
-- changes them only through the functions above; tide.monitor_state is pg_tide's own.
ALTER TABLE tide.check ENABLE ROW LEVEL SECURITY;
ALTER TABLE tide.alert_route ENABLE ROW LEVEL SECURITY;
CREATE POLICY alert_route_owner ON tide.alert_route FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.alert_route TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.alert_route', '');
ALTER TABLE tide.alert ENABLE ROW LEVEL SECURITY;
CREATE POLICY check_owner ON tide.check FOR SELECT USING (tide._visible(owner));
CREATE POLICY alert_owner ON tide.alert FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.check TO PUBLIC;
GRANT SELECT ON tide.alert TO PUBLIC;
-- Counters and kept health figures belong to whoever sees the task.
ALTER TABLE tide.run_count ENABLE ROW LEVEL SECURITY;
CREATE POLICY run_count_owner ON tide.run_count FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.run_count TO PUBLIC;
ALTER TABLE tide.count_delta ENABLE ROW LEVEL SECURITY;
CREATE POLICY count_delta_owner ON tide.count_delta FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.count_delta TO PUBLIC;
ALTER TABLE tide.task_stat ENABLE ROW LEVEL SECURITY;
CREATE POLICY task_stat_owner ON tide.task_stat FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.task_stat TO PUBLIC;
ALTER TABLE tide.task_touch ENABLE ROW LEVEL SECURITY;
CREATE POLICY task_touch_owner ON tide.task_touch FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.task_touch TO PUBLIC;

SELECT pg_catalog.pg_extension_config_dump('tide.check', '');
SELECT pg_catalog.pg_extension_config_dump('tide.check_check_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('tide.alert', '');
SELECT pg_catalog.pg_extension_config_dump('tide.alert_alert_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('tide.run_count', '');
SELECT pg_catalog.pg_extension_config_dump('tide.count_delta', '');

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
-- New runs are noted by the one creator (tide._create_runs, src/runs/record.sql), not by
-- an INSERT trigger: its transition table copied every new run (measured: a 20,000-run
-- tide.enqueue 741 ms against 847 on average, eight alternating calls).
-- The hot paths (claims, completions, failures: tide.history = 'written' while they update)
-- note their tasks with the history rows they write right after (tide._write_history), and this trigger
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
    -- go to tide.run_hourly and tide.owner_hourly (sql/charts.sql), the rest to tide.run_count.
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
    -- (src/delivery.rs decides it, for the ping too).
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
    -- Half full or more, pg_tide sends no notifications (src/wake.rs): workers poll.
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

-- Row-level security and grants, as for the other tables: every role reads its own rows and
-- changes them only through the functions above.
ALTER TABLE tide.task_stat ENABLE ROW LEVEL SECURITY;
CREATE POLICY task_stat_owner ON tide.task_stat FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.task_stat TO PUBLIC;
ALTER TABLE tide.task_touch ENABLE ROW LEVEL SECURITY;
CREATE POLICY task_touch_owner ON tide.task_touch FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.task_touch TO PUBLIC;

-- Queuing a run again by hand and settling one: replay of a dead run, rerun of a window,
-- resolve_run, confirm of a rule version; and the dead letters (tide.dead_letter).

-- Who runs a run of a task with this command: pg_tide's SQL executors, or external workers.
-- (STABLE, as the enum cast in it is: so it is inlined where runs are created.)
-- Inlined into its callers (on the hot paths of claims, emits and the tick), so it has no SET
-- clause, which would forbid inlining: its body names everything with its schema instead, so it
-- is safe under any search_path (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._executor_of(command text) RETURNS tide.executor
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN command IS NULL THEN 'external' ELSE 'sql' END::tide.executor $$;
COMMENT ON FUNCTION tide._executor_of(text) IS 'Internal: sql when the rules have a command, else external.';

-- Who runs a run under its rules: a window run of an event task with a fallback is its scan,
-- run by pg_tide's executors even when the task's event runs go to external workers.
-- Inlined into its callers, so it has no SET clause, which would forbid inlining: its body
-- names everything with its schema instead, so it is safe under any search_path
-- (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._run_executor(p_rules jsonb, p_window boolean) RETURNS tide.executor
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT tide._executor_of(CASE WHEN p_window
                                  THEN coalesce(p_rules OPERATOR(pg_catalog.->>) 'command',
                                                p_rules OPERATOR(pg_catalog.->>) 'fallback')
                                  ELSE p_rules OPERATOR(pg_catalog.->>) 'command' END)
$$;
COMMENT ON FUNCTION tide._run_executor(jsonb, boolean) IS
    'Internal: who runs a run under its rules (a window run of a task with a fallback is its scan, run by the executors).';

-- The state a (re)opened run starts in: waiting when its rules declare readiness.
-- Inlined into its callers (on the hot paths of claims, emits and the tick), so it has no SET
-- clause, which would forbid inlining: its body names everything with its schema instead, so it
-- is safe under any search_path (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._open_state(rules jsonb) RETURNS tide.run_state
LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN rules OPERATOR(pg_catalog.->>) 'ready_dataset' IS NOT NULL
                  OR rules OPERATOR(pg_catalog.->>) 'ready_check' IS NOT NULL
                  OR rules OPERATOR(pg_catalog.->>) 'ready_watermark' IS NOT NULL
                THEN 'waiting' ELSE 'ready' END::tide.run_state
$$;
COMMENT ON FUNCTION tide._open_state(jsonb) IS 'Internal: waiting if the rules declare readiness, else ready.';

-- Reopens a finished run: the shared path of tide.replay_run, tide.rerun and tide.resolve_run.
CREATE FUNCTION tide._reopen(p_run_id bigint, p_trigger tide.run_trigger, p_version text, p_force boolean,
                             p_function text, p_queue text DEFAULT NULL, p_why text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
    t tide.task;
    use_version integer;
    rules jsonb;
BEGIN
    SELECT * INTO r FROM tide.run x WHERE x.run_id = p_run_id AND tide._may_act(x.owner) FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % does not exist', p_run_id USING ERRCODE = 'undefined_object',
            HINT = 'find runs with: SELECT run_id, state, biz_date FROM tide.run WHERE task_id = ...';
    END IF;
    SELECT * INTO t FROM tide.task WHERE task_id = r.task_id;
    IF r.state IN ('waiting', 'ready', 'running', 'retry', 'held', 'paused') THEN
        RAISE NOTICE 'run % is already % (%); nothing to reopen', r.run_id, r.state, r.reason;
        RETURN r.run_id;
    END IF;
    IF r.state = 'succeeded' AND NOT coalesce(p_force, false) THEN
        RAISE EXCEPTION 'run % of task % (business date %) already succeeded', r.run_id, t.name, coalesce(r.biz_date::text, r.dedupe_key)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('running it again could write its data twice; if that is intended, call %s(..., force => true)', p_function);
    END IF;
    IF p_version IS NULL THEN
        IF r.version <> t.version THEN
            RAISE EXCEPTION 'the rules of task % changed since run % was created (version % then, % now)', t.name, r.run_id, r.version, t.version
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = format('choose explicitly: %s(..., version => ''original'') or version => ''current''', p_function);
        END IF;
        use_version := r.version;
    ELSIF length(p_version) > 20 THEN
        RAISE EXCEPTION 'unknown version "%"', left(p_version, 20) USING ERRCODE = 'invalid_parameter_value',
            HINT = 'use version => ''original'' (the rules the run was created under) or ''current''';
    ELSIF lower(p_version) = 'original' THEN
        use_version := r.version;
    ELSIF lower(p_version) = 'current' THEN
        use_version := t.version;
    ELSE
        RAISE EXCEPTION 'unknown version "%"', p_version USING ERRCODE = 'invalid_parameter_value',
            HINT = 'use version => ''original'' (the rules the run was created under) or ''current''';
    END IF;
    IF t.source_retention IS NOT NULL AND r.window_start < now() - t.source_retention THEN
        RAISE EXCEPTION 'the window of run % starts at %, beyond the task''s source_retention of %', r.run_id, r.window_start, t.source_retention
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'the source no longer has this data; if it was restored, raise source_retention with tide.alter first';
    END IF;
    SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = r.task_id AND v.version = use_version;
    UPDATE tide.run
       SET state = tide._open_state(rules),
           trigger = p_trigger,
           version = use_version,
           args = CASE WHEN use_version = r.version THEN r.args ELSE rules->'args' END,
           queue = coalesce(p_queue, rules->>'queue'),
           priority = (rules->>'priority')::integer - CASE WHEN p_trigger = 'backfill' THEN 10000 ELSE 0 END,
           executor = tide._run_executor(rules, r.window_start IS NOT NULL),
           skip_reason = NULL, covered_by = NULL, tries = 0, deferrals = 0,
           run_after = NULL, ready_deadline = NULL, finished_at = NULL, lease_expires_at = NULL,
           control = NULL, watermark = NULL, updated_at = now(),
           reason = coalesce(p_why,
                             format('%s by %s (from %s%s, version %s)', p_trigger, current_user, r.state,
                                    CASE WHEN r.state = 'succeeded' THEN ', forced' ELSE '' END, use_version))
     WHERE run_id = r.run_id;
    PERFORM tide._regate(ARRAY[r.run_id]);
    RETURN r.run_id;
END
$$;
COMMENT ON FUNCTION tide._reopen(bigint, tide.run_trigger, text, boolean, text, text, text) IS
    'Internal: reopens a finished run (the shared path of replay, rerun, resolve and backfill; a backfill''s run goes to its queue, below every online run).';

CREATE FUNCTION tide.replay_run(run_id bigint, version text DEFAULT NULL, force boolean DEFAULT false) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF replay_run.run_id IS NULL THEN
        RAISE EXCEPTION 'run_id must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'pick one from tide.dead_letter';
    END IF;
    RETURN tide._reopen(replay_run.run_id, 'replay', replay_run.version, replay_run.force, 'tide.replay_run');
END
$$;
COMMENT ON FUNCTION tide.replay_run(bigint, text, boolean) IS
    'replay_run(run_id, version => ''original''|''current'', force => false): puts a dead, need_check, cancelled or skipped run back in line through the normal path. A succeeded run needs force => true. When the task''s rules changed since the run, version must be chosen.';

CREATE FUNCTION tide._rerun(p_task_id bigint, p_fire timestamptz, p_start timestamptz, p_end timestamptz,
                            p_biz_date date, p_version text, p_force boolean, p_function text,
                            p_trigger tide.run_trigger DEFAULT 'manual', p_queue text DEFAULT NULL,
                            p_why text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t tide.task;
    id bigint;
BEGIN
    -- KEY SHARE: the task cannot be deleted under its new run (tide.run has no foreign key).
    SELECT * INTO t FROM tide.task x WHERE x.task_id = p_task_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task % does not exist', p_task_id USING ERRCODE = 'undefined_object',
            HINT = 'it was deleted meanwhile; list your tasks with: SELECT name FROM tide.task';
    END IF;
    IF t.source_retention IS NOT NULL AND p_start < now() - t.source_retention THEN
        RAISE EXCEPTION 'business date % of task % is beyond its source_retention of %', p_biz_date, t.name, t.source_retention
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'the source no longer has this data; if it was restored, raise source_retention with tide.alter first';
    END IF;
    SELECT r.run_id INTO id FROM tide.run r WHERE r.task_id = p_task_id AND r.window_start = p_start;
    IF id IS NULL AND NOT coalesce(p_force, false) AND tide._succeeded_before(p_task_id, p_start) THEN
        -- R4.6: its run was pruned, its success is remembered.
        RAISE EXCEPTION 'the window of task % on business date % already succeeded (its run was pruned by history_retention)', t.name, p_biz_date
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('running it again could write its data twice; if that is intended, call %s(..., force => true)', p_function);
    END IF;
    -- The window's run, by the one creator (its gating from the insert trigger); a window that
    -- has one already is reopened below.
    SELECT (tide._create_runs(ARRAY[ROW(
               t.task_id, p_trigger, t.version, tide._open_state(tide._task_rules(t)),
               coalesce(p_why, format('%s by %s', CASE WHEN p_trigger = 'manual' THEN 'manual rerun' ELSE p_trigger::text END,
                                      tide._caller())),
               tide._run_executor(tide._task_rules(t), true), coalesce(p_queue, t.queue),
               t.priority - CASE WHEN p_trigger = 'backfill' THEN 10000 ELSE 0 END, t.args, t.owner,
               p_fire, p_start, p_end, p_biz_date, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
           )::tide.new_run], false))[1]
      INTO id;
    IF id IS NOT NULL THEN
        RETURN id;
    END IF;
    SELECT r.run_id INTO id FROM tide.run r WHERE r.task_id = p_task_id AND r.window_start = p_start;
    RETURN tide._reopen(id, p_trigger, p_version, p_force, p_function, p_queue, p_why);
END
$$;
COMMENT ON FUNCTION tide._rerun(bigint, timestamptz, timestamptz, timestamptz, date, text, boolean, text, tide.run_trigger, text, text) IS
    'Internal: creates or reopens the run of one window (tide.rerun and backfills after the window is computed; p_function names the caller in errors; a backfill''s run goes to its queue, below every online run).';

-- Deferred window scan (R11.2), at a fire of a task with rescan_previous (the tick calls it for
-- those only): the run of the window before p_start is reopened if it ended dead because it was
-- not ready or ran out of transient retries, once per run (a second death stays dead). Returns
-- the run reopened, or NULL.
CREATE FUNCTION tide._rescan_previous(p_task_id bigint, p_start timestamptz, p_fire timestamptz) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    prev tide.run;
BEGIN
    SELECT * INTO prev FROM tide.run r
     WHERE r.task_id = p_task_id AND r.window_start < p_start
     ORDER BY r.window_start DESC LIMIT 1;
    IF NOT FOUND OR prev.state <> 'dead' OR prev.last_error_kind NOT IN ('not_ready', 'transient')
       OR EXISTS (SELECT 1 FROM tide.run_event e WHERE e.run_id = prev.run_id AND e.reason LIKE 'deferred window scan:%') THEN
        RETURN NULL;
    END IF;
    RETURN tide._reopen(prev.run_id, 'catch_up', 'original', false, 'tide.tick', NULL,
                        format('deferred window scan: reopened by the fire at %s (it ended dead, %s: %s)', p_fire,
                               prev.last_error_kind, tide._clip(prev.last_error, 200)));
END
$$;
COMMENT ON FUNCTION tide._rescan_previous(bigint, timestamptz, timestamptz) IS
    'Internal: the deferred window scan of a task with rescan_previous: reopens the previous window''s run once if it ended dead not ready or out of transient retries.';

CREATE FUNCTION tide.resolve_run(run_id bigint, decision text) RETURNS tide.run_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
BEGIN
    SELECT * INTO r FROM tide.run x WHERE x.run_id = resolve_run.run_id AND tide._may_act(x.owner) FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % does not exist', resolve_run.run_id USING ERRCODE = 'undefined_object',
            HINT = 'runs waiting for a decision: SELECT run_id FROM tide.run WHERE state = ''need_check''';
    END IF;
    IF r.state <> 'need_check' THEN
        RAISE EXCEPTION 'run % is %, not need_check', r.run_id, r.state USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'tide.resolve_run settles runs that completed short (actual < expected); use tide.replay_run for other runs';
    END IF;
    CASE lower(coalesce(resolve_run.decision, ''))
    WHEN 'accept' THEN
        UPDATE tide.run x SET state = 'succeeded', updated_at = now(),
               reason = format('accepted by %s: expected %s, actual %s', tide._caller(), x.expected, x.actual)
         WHERE x.run_id = r.run_id;
    WHEN 'replay' THEN
        PERFORM tide._reopen(r.run_id, 'replay', 'original', false, 'tide.resolve_run');
    ELSE
        RAISE EXCEPTION 'unknown decision "%"', left(resolve_run.decision, 20) USING ERRCODE = 'invalid_parameter_value',
            HINT = 'use ''accept'' (the short count is right) or ''replay'' (run it again)';
    END CASE;
    RETURN (SELECT x.state FROM tide.run x WHERE x.run_id = r.run_id);
END
$$;
COMMENT ON FUNCTION tide.resolve_run(bigint, text) IS
    'resolve_run(run_id, ''accept''|''replay''): settles a need_check run: accept its short count as succeeded, or replay it.';

-- Unstarted runs of a task whose rules just changed (called by tide.alter).
CREATE FUNCTION tide._apply_pending(p_task_id bigint, p_version integer, p_mode text) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
    ids bigint[];
    rules jsonb;
BEGIN
    SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = p_task_id AND v.version = p_version;
    IF p_mode = 'keep' THEN
        RETURN 0;
    ELSIF p_mode = 'adopt' THEN
        WITH adopted AS (
            UPDATE tide.run r
               SET version = p_version, args = rules->'args', queue = rules->>'queue',
                   priority = (rules->>'priority')::integer,
                   executor = tide._run_executor(rules, r.window_start IS NOT NULL),
                   updated_at = now(),
                   reason = format('%s; adopted rule version %s', r.reason, p_version)
             WHERE r.run_id IN (SELECT p.run_id FROM tide.pending p
                                 WHERE p.task_id = p_task_id AND p.state IN ('waiting', 'ready', 'retry', 'held', 'paused'))
               AND r.version <> p_version
            RETURNING r.run_id)
        SELECT array_agg(a.run_id) INTO ids FROM adopted a;
        PERFORM tide._regate(ids);
        RETURN coalesce(cardinality(ids), 0);
    ELSE
        UPDATE tide.run r
           SET state = 'held', updated_at = now(),
               reason = format('held: rules changed to version %s; confirm with tide.confirm', p_version)
         WHERE r.run_id IN (SELECT p.run_id FROM tide.pending p
                             WHERE p.task_id = p_task_id AND p.state IN ('waiting', 'ready', 'retry', 'paused'))
           AND r.version <> p_version;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._apply_pending(bigint, integer, text) IS
    'Internal: applies tide.alter''s pending => adopt | keep | hold to a task''s unstarted runs.';

CREATE FUNCTION tide.confirm(task text, version integer) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t tide.task;
    rules jsonb;
    ids bigint[];
BEGIN
    PERFORM tide._text_arg('task', confirm.task, 200, 'pass the name of one of your tasks');
    SELECT * INTO t FROM tide.task x WHERE x.name = confirm.task AND x.owner = tide._caller();
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task "%" does not exist', confirm.task USING ERRCODE = 'undefined_object',
            HINT = 'list your tasks with: SELECT name FROM tide.task';
    END IF;
    SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = t.task_id AND v.version = confirm.version;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task % has no rule version %', confirm.task, coalesce(confirm.version::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = format('versions are 1 to %s; see tide.task_version', t.version);
    END IF;
    WITH confirmed AS (
        UPDATE tide.run r
           SET state = tide._open_state(rules), version = confirm.version,
               args = CASE WHEN r.version = confirm.version THEN r.args ELSE rules->'args' END,
               queue = rules->>'queue', priority = (rules->>'priority')::integer,
               executor = tide._run_executor(rules, r.window_start IS NOT NULL),
               run_after = NULL, updated_at = now(),
               reason = format('confirmed by %s under rule version %s', tide._caller(), confirm.version)
         WHERE r.run_id IN (SELECT p.run_id FROM tide.pending p WHERE p.task_id = t.task_id AND p.state = 'held')
        RETURNING r.run_id)
    SELECT array_agg(c.run_id) INTO ids FROM confirmed c;
    PERFORM tide._regate(ids);
    RETURN coalesce(cardinality(ids), 0);
END
$$;
COMMENT ON FUNCTION tide.confirm(text, integer) IS
    'confirm(task, version): releases the task''s held runs to run under the given rule version; returns how many.';

CREATE FUNCTION tide._cancel_waiting(p_run_id bigint, p_reason text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_reason IS NOT NULL THEN
        PERFORM tide._text_arg('reason', p_reason, 1000, 'say in a sentence why the run is cancelled');
    END IF;
    UPDATE tide.run r
       SET state = 'cancelled', finished_at = now(), updated_at = now(), lease_expires_at = NULL,
           reason = format('cancelled by %s%s', tide._caller(), coalesce(': ' || p_reason, ''))
     WHERE r.run_id = p_run_id AND r.state IN ('waiting', 'ready', 'retry', 'held', 'paused')
       AND tide._may_act(r.owner);
    IF FOUND THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM tide.run r WHERE r.run_id = p_run_id AND tide._may_act(r.owner)) THEN
        RAISE EXCEPTION 'run % does not exist', p_run_id USING ERRCODE = 'undefined_object',
            HINT = 'see SELECT run_id, state FROM tide.run';
    END IF;
    RETURN false;
END
$$;
COMMENT ON FUNCTION tide._cancel_waiting(bigint, text) IS
    'Internal (tide.cancel_run): cancels a run that has not started (waiting, ready, retry, held, paused); false if it is running or finished.';

-- The dead runs are found in tide.pending, which keeps every run that is dead until it is
-- replayed or resolved: tide.run has no index by state (its hot updates would no longer be
-- HOT), and reading it for its dead runs walked the whole history.
CREATE VIEW tide.dead_letter WITH (security_invoker = true) AS
SELECT r.run_id, t.name AS task, r.version, r.trigger, r.biz_date, r.window_start, r.window_end, r.dedupe_key,
       r.args, r.attempts, r.last_error_kind, r.last_error, r.finished_at AS died_at, r.reason,
       (SELECT jsonb_agg(jsonb_build_object('attempt', a.attempt, 'worker', a.worker, 'claimed_at', a.claimed_at,
                                            'finished_at', a.finished_at, 'outcome', a.outcome,
                                            'error_kind', a.error_kind, 'sqlstate', a.sqlstate, 'error', a.error)
                         ORDER BY a.attempt)
          FROM tide.attempt a WHERE a.run_id = r.run_id) AS attempt_errors,
       v.rules
  FROM tide.pending p
  JOIN tide.run r ON r.run_id = p.run_id
  JOIN tide.task t ON t.task_id = r.task_id
  JOIN tide.task_version v ON v.task_id = r.task_id AND v.version = r.version
 WHERE p.state = 'dead' AND r.state = 'dead';
COMMENT ON VIEW tide.dead_letter IS
    'Dead runs with their full context: task, rule version and rules, window, args, and every attempt''s error. Replay one with tide.replay_run(run_id).';
GRANT SELECT ON tide.dead_letter TO PUBLIC;

-- Moving over from pg_cron: tide.import_pg_cron reports what every pg_cron job of the caller
-- (a superuser: of every role) becomes, and with apply => true creates those tasks and
-- unschedules those jobs, in the caller's transaction.
--
-- An imported job keeps pg_cron's meaning unless the caller asks for more: one attempt (pg_cron
-- retries nothing), missed fires recorded as skipped (pg_cron runs nothing it missed), no
-- timeout of pg_tide's (the owner's statement_timeout applies, as under pg_cron), several
-- statements run as one transaction (pg_cron's one simple query), the top-level mode only for a
-- command that refuses a transaction block (or is one CALL), and a job of another database run
-- in that database. The report says, in words, every way the job will behave differently.

-- The ways an imported job behaves differently from the pg_cron job it was, in words.
CREATE FUNCTION tide._import_differences(p_command text, p_top_level boolean, p_database text,
                                         p_max_attempts integer, p_misfire text, p_threshold interval,
                                         p_timeout interval)
RETURNS text[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    out text[] := '{}';
    several boolean := tide._statement_count(p_command) > 1;
BEGIN
    out := out || 'recorded: every run is a row of tide.run with its history (tide.run_event), kept pg_tide.history_retention; tide.job_run_details shows them as cron.job_run_details did'::text;
    out := out || format('alerted: a run that fails goes to the dead letters (tide.dead_letter) and opens an alert; so do %s failures in a row, a job that stops succeeding for longer than the gap between its fires, and more than %s skipped fires in a row',
                         current_setting('pg_tide.alert_failures', true), current_setting('pg_tide.alert_skips', true));
    IF p_top_level AND several THEN
        out := out || 'committed statement by statement: it runs at top level (a statement in it refuses a transaction block), each statement in its own transaction, where pg_cron ran the string as one implicit transaction, in which that statement failed at every run'::text;
    ELSIF p_top_level THEN
        out := out || 'run at top level by a worker of its own, as pg_cron ran it (outside a transaction block)'::text;
    ELSIF p_database IS NULL THEN
        out := out || 'committed with its run''s record: the command and its run''s success commit in one transaction, so a run is never recorded done without its work, nor its work done twice'::text;
    END IF;
    IF p_database IS NOT NULL THEN
        out := out || format('run in database %s by a pg_tide worker connected there (as its owner), its record kept in database %s: the command''s commit and its record are two transactions (a server stop between them leaves the run failed as lost)',
                             p_database, current_database());
    END IF;
    out := out || format('serialized: at most pg_tide.%s of these commands run at once (pg_cron: cron.max_running_jobs); runs of one job go one at a time, in order, as in pg_cron',
                         CASE WHEN p_top_level OR p_database IS NOT NULL
                              THEN format('command_workers (%s; %s per database)', current_setting('pg_tide.command_workers', true),
                                          current_setting('pg_tide.command_workers_per_database', true))
                              ELSE format('executors (%s)', current_setting('pg_tide.executors', true)) END);
    IF p_max_attempts > 1 THEN
        out := out || format('retried: a failed run is tried up to %s times, with backoff (pg_cron never retries)', p_max_attempts);
    END IF;
    IF p_misfire = 'skip' THEN
        out := out || format('recorded as skipped: fires missed while the server was down (the scheduler came to them more than %s seconds late) are not run, as in pg_cron, and each is a skipped run; a fire late by less runs late',
                             extract(epoch FROM p_threshold)::bigint);
    ELSE
        out := out || format('missed fires are handled by misfire %s after downtime (pg_cron runs none of them)', p_misfire);
    END IF;
    IF p_timeout > interval '0' THEN
        out := out || format('bounded: a run longer than %s is cancelled (pg_cron has no timeout of its own)', p_timeout);
    END IF;
    out := out || 'settings: the command runs with the database''s settings, not the owner''s ALTER ROLE ... SET settings (its statement_timeout excepted)'::text;
    RETURN out;
END
$$;
COMMENT ON FUNCTION tide._import_differences(text, boolean, text, integer, text, interval, interval) IS
    'Internal: how an imported pg_cron job will behave differently in pg_tide, in words (the report of tide.import_pg_cron).';

-- When an imported job's fire counts as missed (its misfire_threshold): a minute, or for a job of
-- pg_cron's 'N seconds' syntax its period, so that after a stop at most the latest fire runs,
-- late (pg_cron starts such a job once when it comes back).
CREATE FUNCTION tide._import_threshold(p_schedule text) RETURNS interval
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN btrim(p_schedule) ~* '^[0-9]+\s*seconds?$'
                THEN least(interval '60 seconds',
                           make_interval(secs => greatest(least(substring(btrim(p_schedule) FROM '^[0-9]+')::numeric, 60), 1)::float8))
                ELSE interval '60 seconds' END
$$;
COMMENT ON FUNCTION tide._import_threshold(text) IS
    'Internal: the misfire_threshold of an imported pg_cron job: a minute, or the period of an ''N seconds'' job.';

CREATE FUNCTION tide.import_pg_cron(apply boolean DEFAULT false, max_attempts integer DEFAULT 1,
                                    misfire text DEFAULT 'skip', timeout interval DEFAULT '0')
RETURNS TABLE (jobid bigint, jobname text, task text, schedule text, tz text, command text, owner name,
               database text, top_level boolean, paused boolean, settings jsonb, action text, problem text,
               differences text[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    j record;
    zone text;
    is_super boolean := tide._caller_is_superuser();
    me name := tide._caller();
    done bigint[] := '{}';
    existing bigint;
    policy text;
    threshold interval;
BEGIN
    IF import_pg_cron.apply IS NULL OR import_pg_cron.max_attempts IS NULL OR import_pg_cron.misfire IS NULL
       OR import_pg_cron.timeout IS NULL THEN
        RAISE EXCEPTION '% must not be NULL',
            CASE WHEN import_pg_cron.apply IS NULL THEN 'apply' WHEN import_pg_cron.max_attempts IS NULL THEN 'max_attempts'
                 WHEN import_pg_cron.misfire IS NULL THEN 'misfire' ELSE 'timeout' END
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'call tide.import_pg_cron() for the report, tide.import_pg_cron(apply => true) to import; max_attempts => 1, misfire => ''skip'' and timeout => ''0'' (none) keep pg_cron''s meaning';
    END IF;
    IF import_pg_cron.max_attempts NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'max_attempts must be between 1 and 100, got %', import_pg_cron.max_attempts
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = '1 keeps pg_cron''s meaning (no retry); 3 retries twice with backoff';
    END IF;
    policy := lower(btrim(import_pg_cron.misfire));
    IF policy NOT IN ('catch_up', 'latest', 'coalesce', 'skip') THEN
        RAISE EXCEPTION 'unknown misfire policy %', quote_literal(left(import_pg_cron.misfire, 40))
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'use ''skip'' (pg_cron''s meaning: missed fires are not run), ''catch_up'', ''latest'' or ''coalesce''';
    END IF;
    PERFORM tide._bounded('timeout', import_pg_cron.timeout, true);
    IF NOT EXISTS (SELECT 1 FROM pg_extension e WHERE e.extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in database %', current_database()
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'run tide.import_pg_cron() in the database where CREATE EXTENSION pg_cron was run (its cron.database_name)';
    END IF;
    -- pg_cron reads its schedules in cron.timezone (GMT when the setting does not exist).
    zone := coalesce(nullif(current_setting('cron.timezone', true), ''), 'GMT');
    FOR j IN EXECUTE
        'SELECT jobid, jobname, schedule, command, nodename, nodeport, database, username, active
           FROM cron.job WHERE $1 OR username = $2 ORDER BY jobid'
        USING is_super, me::text
    LOOP
        jobid := j.jobid;
        jobname := j.jobname;
        task := coalesce(nullif(btrim(j.jobname), ''), 'pg_cron_' || j.jobid);
        schedule := btrim(j.schedule);
        tz := zone;
        command := j.command;
        owner := j.username;
        -- A job of this database runs here; a job of another database runs there (the
        -- task's database option).
        database := nullif(j.database, current_database());
        paused := NOT j.active;
        top_level := tide._needs_top_level(j.command);
        threshold := tide._import_threshold(schedule);
        -- What the task gets beyond the columns above (the rest is tide.schedule's defaults:
        -- overlap queue, as pg_cron runs one instance of a job at a time).
        settings := jsonb_build_object('max_attempts', import_pg_cron.max_attempts, 'misfire', policy,
                                       'misfire_threshold', threshold, 'timeout', import_pg_cron.timeout,
                                       'overlap', 'queue');
        problem := NULL;
        action := NULL;
        differences := NULL;
        IF j.nodename IS NOT NULL AND j.nodename NOT IN ('', 'localhost', '127.0.0.1', '::1') AND j.nodename NOT LIKE '/%' THEN
            problem := format('it runs on host %s: pg_tide runs commands in this server only', j.nodename);
        ELSIF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = j.username) THEN
            problem := format('its role %s does not exist', j.username);
        END IF;
        IF problem IS NULL THEN
            -- Through tide.schedule as the job's role, so every rule applies; without apply,
            -- undone at once (only its verdict is kept).
            BEGIN
                existing := (SELECT t.task_id FROM tide.task t WHERE t.owner = j.username AND t.name = task);
                PERFORM tide._import_task(j.username, task, schedule, j.command, zone, top_level, paused,
                                          database, import_pg_cron.max_attempts, policy, threshold,
                                          import_pg_cron.timeout);
                action := CASE WHEN existing IS NOT NULL THEN 'already a task'
                               WHEN import_pg_cron.apply THEN 'imported' ELSE 'to import' END;
                IF NOT import_pg_cron.apply THEN
                    RAISE EXCEPTION USING ERRCODE = 'TDIM0';
                END IF;
            EXCEPTION
                WHEN SQLSTATE 'TDIM0' THEN
                    NULL;
                WHEN unique_violation THEN
                    problem := format('%s already has a task named %s with another definition: rename the job or change the task with tide.alter',
                                      j.username, task);
                WHEN others THEN
                    problem := SQLERRM;
            END;
        END IF;
        IF problem IS NOT NULL THEN
            action := 'kept in pg_cron';
        ELSE
            differences := tide._import_differences(j.command, top_level, database, import_pg_cron.max_attempts,
                                                    policy, threshold, import_pg_cron.timeout);
            IF import_pg_cron.apply THEN
                done := done || j.jobid;
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
    -- The imported jobs leave pg_cron in the same transaction: never both, never neither.
    IF cardinality(done) > 0 THEN
        EXECUTE 'SELECT count(cron.unschedule(x)) FROM unnest($1) x' USING done;
    END IF;
END
$$;
COMMENT ON FUNCTION tide.import_pg_cron(boolean, integer, text, interval) IS
    'import_pg_cron(apply => false, max_attempts => 1, misfire => ''skip'', timeout => ''0''): what each pg_cron job of the caller (a superuser: of every role) becomes in pg_tide: task name (the job''s name, or pg_cron_<jobid>), schedule, time zone (cron.timezone), command, owner, database (a job of another database runs there), top_level (for commands that refuse a transaction block, or one CALL), paused (inactive jobs), the settings it gets (max_attempts, misfire, misfire_threshold, timeout, overlap), what cannot be carried over and why, and in words every way it will behave differently. The defaults keep pg_cron''s meaning (one attempt, missed fires skipped, no timeout of pg_tide''s); each argument opts into more. With apply => true it creates those tasks (as the job''s role) and unschedules those jobs in the caller''s transaction; the others stay in pg_cron.';

-- pg_cron's tables as views over pg_tide's, with pg_cron's column names and types, so that the
-- queries and dashboards pg_cron users have keep working after the move (with tide. for
-- cron.). Each role sees its own rows (row-level security of the tables below), as in pg_cron.

CREATE VIEW tide.job WITH (security_invoker = true) AS
SELECT t.task_id AS jobid, coalesce(t.schedule, '') AS schedule, coalesce(t.command, '') AS command,
       'localhost'::text AS nodename, pg_catalog.current_setting('port')::integer AS nodeport,
       coalesce(t.database, pg_catalog.current_database())::text AS database, t.owner::text AS username,
       NOT t.paused AS active, t.name::name AS jobname
  FROM tide.task t;
COMMENT ON VIEW tide.job IS
    'pg_cron''s cron.job over tide.task: jobid (the task_id), schedule, command, nodename, nodeport, database, username (the owner), active (not paused), jobname (the task''s name).';
GRANT SELECT ON tide.job TO PUBLIC;

-- One row per attempt, as pg_cron has one per execution: the attempts that ended (the history
-- row that ended each) and those running. runid is the history row of the attempt's claim, so it
-- stays the same from start to end.
CREATE VIEW tide.job_run_details WITH (security_invoker = true) AS
SELECT r.task_id AS jobid,
       coalesce((SELECT max(s.event_id) FROM tide.run_event s
                  WHERE s.run_id = e.run_id AND s.event_id < e.event_id AND s.to_state = 'running'),
                e.event_id) AS runid,
       NULL::integer AS job_pid,
       coalesce(v.rules->>'database', pg_catalog.current_database()) AS database,
       r.owner::text AS username,
       v.rules->>'command' AS command,
       CASE WHEN e.outcome = 'succeeded' THEN 'succeeded' ELSE 'failed' END AS status,
       CASE WHEN e.outcome = 'succeeded' AND e.attempt = r.attempts
            THEN coalesce(r.result->>'tag',
                          (r.result->>'row_count') || CASE WHEN r.result->>'row_count' = '1' THEN ' row' ELSE ' rows' END,
                          r.result::text)
            WHEN e.outcome = 'need_check' THEN e.reason
            ELSE e.error END AS return_message,
       e.claimed_at AS start_time,
       e.at AS end_time,
       r.run_id, e.attempt, t.name AS jobname
  FROM tide.run_event e
  JOIN tide.run r ON r.run_id = e.run_id
  JOIN tide.task t ON t.task_id = r.task_id
  JOIN tide.task_version v ON v.task_id = r.task_id AND v.version = r.version
 WHERE e.outcome IS NOT NULL
UNION ALL
SELECT r.task_id,
       (SELECT max(s.event_id) FROM tide.run_event s WHERE s.run_id = r.run_id AND s.to_state = 'running'),
       r.executor_pid,
       coalesce(v.rules->>'database', pg_catalog.current_database()),
       r.owner::text,
       v.rules->>'command',
       'running',
       NULL,
       r.claimed_at,
       NULL,
       r.run_id, r.attempts, t.name
  FROM tide.pending p
  JOIN tide.run r ON r.run_id = p.run_id
  JOIN tide.task t ON t.task_id = r.task_id
  JOIN tide.task_version v ON v.task_id = r.task_id AND v.version = r.version
 WHERE p.state = 'running' AND r.state = 'running';
COMMENT ON VIEW tide.job_run_details IS
    'pg_cron''s cron.job_run_details over pg_tide''s runs, one row per attempt: jobid (the task_id), runid, job_pid (of a running one), database, username (the owner), command, status (running, succeeded, failed), return_message (the last statement''s command tag or row count, or the error), start_time, end_time; then run_id, attempt and jobname. Rows are kept pg_tide.history_retention (no need to delete them).';
GRANT SELECT ON tide.job_run_details TO PUBLIC;

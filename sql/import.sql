-- Moving over from pg_cron: tide.import_pg_cron reports what every pg_cron job of the caller
-- (a superuser: of every role) becomes, and with apply => true creates those tasks and
-- unschedules those jobs, in the caller's transaction.

CREATE FUNCTION tide.import_pg_cron(apply boolean DEFAULT false)
RETURNS TABLE (jobid bigint, jobname text, task text, schedule text, tz text, command text, owner name,
               top_level boolean, paused boolean, action text, problem text)
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
BEGIN
    IF import_pg_cron.apply IS NULL THEN
        RAISE EXCEPTION 'apply must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'call tide.import_pg_cron() for the report, tide.import_pg_cron(apply => true) to import';
    END IF;
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
        paused := NOT j.active;
        top_level := tide._needs_top_level(j.command);
        problem := NULL;
        action := NULL;
        IF j.database IS DISTINCT FROM current_database() THEN
            problem := format('it runs in database %s: import it there', j.database);
        ELSIF j.nodename IS NOT NULL AND j.nodename NOT IN ('', 'localhost', '127.0.0.1', '::1') AND j.nodename NOT LIKE '/%' THEN
            problem := format('it runs on host %s: pg_tide runs commands in this server only', j.nodename);
        ELSIF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = j.username) THEN
            problem := format('its role %s does not exist', j.username);
        END IF;
        IF problem IS NULL THEN
            -- Through tide.schedule as the job's role, so every rule applies; without apply,
            -- undone at once (only its verdict is kept).
            BEGIN
                existing := (SELECT t.task_id FROM tide.task t WHERE t.owner = j.username AND t.name = task);
                PERFORM tide._import_job(j.username, task, schedule, j.command, zone, top_level, paused);
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
        ELSIF import_pg_cron.apply THEN
            done := done || j.jobid;
        END IF;
        RETURN NEXT;
    END LOOP;
    -- The imported jobs leave pg_cron in the same transaction: never both, never neither.
    IF cardinality(done) > 0 THEN
        EXECUTE 'SELECT count(cron.unschedule(x)) FROM unnest($1) x' USING done;
    END IF;
END
$$;
COMMENT ON FUNCTION tide.import_pg_cron(boolean) IS
    'import_pg_cron(apply => false): what each pg_cron job of the caller (a superuser: of every role) becomes in pg_tide: task name (the job''s name, or pg_cron_<jobid>), schedule, time zone (cron.timezone), command, owner, top_level (for commands that cannot run in a transaction), paused (inactive jobs), and what cannot be carried over and why. With apply => true it creates those tasks (as the job''s role) and unschedules those jobs in the caller''s transaction; the others stay in pg_cron.';

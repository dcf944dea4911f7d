-- pg_tide 0.2.1 to 0.2.2: pg_cron users keep their jobs' meaning, in every database of the
-- cluster. Commands of another database (the task option database) and top-level commands run
-- by command workers of their own; a command that cannot run where it is scheduled is refused
-- when it is made; timeout => '0' is no timeout of pg_tide's; tide.import_pg_cron keeps
-- pg_cron's meaning and says how a job will differ; tide.job and tide.job_run_details are
-- pg_cron's tables as views.
-- Run by ALTER EXTENSION pg_tide UPDATE; the upgrade tier (pg_test/tests/upgrade.rs) checks that
-- the schema it leaves is the one a fresh CREATE EXTENSION makes. Functions whose body changed are
-- dropped and created again rather than replaced (pgspot's PS002); nothing depends on them but
-- the plans of their callers.
\echo Use "ALTER EXTENSION pg_tide UPDATE TO '0.2.2'" to load this file. \quit
SET LOCAL search_path = pg_catalog, pg_temp;

-- Where a task's command runs: another database of the cluster (NULL: pg_tide's).
ALTER TABLE tide.task ADD COLUMN database text;
COMMENT ON COLUMN tide.task.database IS 'Database of the cluster the command runs in, as the owner, by a worker of pg_tide''s connected there (pg_cron''s schedule_in_database); NULL = the database pg_tide serves. The run, its retries, alerts and history stay in pg_tide''s database.';

-- The checks of a task: its command parses and can run where it is scheduled; a database it
-- names can be reached by its owner.
DROP FUNCTION tide._check_task(bigint);
CREATE FUNCTION tide._check_task(p_task_id bigint) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t tide.task;
BEGIN
    SELECT * INTO t FROM tide.task WHERE task_id = p_task_id;
    IF (t.ready_watermark IS NULL) <> (t.watermark_stable_for IS NULL) THEN
        RAISE EXCEPTION 'task "%": ready_watermark and watermark_stable_for go together (got %, %)', t.name,
            coalesce(quote_literal(left(t.ready_watermark, 100)), 'NULL'), coalesce(t.watermark_stable_for::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass both, such as ready_watermark => ''(SELECT max(updated_at) FROM orders WHERE order_date = tide.biz_date())'', watermark_stable_for => ''10 minutes''; tide.alter removes both with ready_watermark => '''', watermark_stable_for => ''0''';
    END IF;
    IF t.fallback IS NOT NULL AND (t.schedule IS NULL OR cardinality(t.topics) = 0 OR t.long OR t.top_level) THEN
        RAISE EXCEPTION 'task "%": a fallback scan needs an event task (topics) with a schedule, not long or top_level', t.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'the schedule is when the scan runs: tide.schedule(''orders'', ''0 * * * *'', topics => ARRAY[''order.created''], fallback => ''SELECT id::text AS key FROM orders WHERE created_at > now() - interval ''''1 day'''''')';
    END IF;
    IF t.schedule IS NULL AND cardinality(t.topics) = 0 THEN
        RAISE EXCEPTION 'task "%": schedule must not be NULL for a task without topics', t.name
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'give a cron schedule such as ''0 1 * * *'', or topics => ARRAY[''order.created''] to run it on tide.emit';
    END IF;
    IF t.max_concurrency IS NOT NULL AND t.overlap <> 'allow' THEN
        RAISE EXCEPTION 'task "%": max_concurrency % needs overlap => ''allow'', got overlap %', t.name, t.max_concurrency, t.overlap
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'overlap queue runs one at a time and skip never overlaps; pass overlap => ''allow'' with max_concurrency';
    END IF;
    IF t.long AND t.command IS NULL THEN
        RAISE EXCEPTION 'task "%": long => true needs an SQL command', t.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'the command does one batch and returns the next checkpoint; external workers of long runs send progress with tide.heartbeat_run instead';
    END IF;
    IF t.database IS NOT NULL THEN
        PERFORM tide._check_database_task(t);
    END IF;
    IF t.top_level AND t.command IS NULL THEN
        RAISE EXCEPTION 'task "%": top_level => true needs an SQL command', t.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'top_level runs the command outside a transaction block, as pg_cron does; give the task a command';
    END IF;
    IF t.top_level AND t.long THEN
        RAISE EXCEPTION 'task "%": long and top_level cannot be combined', t.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'a long task commits each batch with its checkpoint in one transaction; a top-level command manages its own transactions';
    END IF;
    IF (t.batch_rate IS NOT NULL OR t.batch_pause IS NOT NULL) AND NOT t.long THEN
        RAISE EXCEPTION 'task "%": batch_rate and batch_pause apply to long tasks only', t.name
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass long => true with them, or leave them out';
    END IF;
    IF t.reconcile IS NOT NULL OR t.command = tide._recon_command() THEN
        PERFORM tide._recon_check_task(t);
    ELSIF t.command IS NOT NULL THEN
        -- It parses, and (unless top-level) holds no statement that refuses a transaction
        -- block: either could only fail at every run (src/import.rs).
        PERFORM tide._check_command(t.name, t.command, t.top_level);
    END IF;
    IF t.batch_rate IS NOT NULL AND t.batch_pause IS NOT NULL THEN
        RAISE EXCEPTION 'task "%": pass batch_rate or batch_pause, not both (got batch_rate %, batch_pause %)', t.name, t.batch_rate, t.batch_pause
            USING ERRCODE = 'invalid_parameter_value', HINT = 'batch_rate => 2 means at most 2 batches a second; batch_pause => ''1 second'' waits between batches';
    END IF;
END
$$;
COMMENT ON FUNCTION tide._check_task(bigint) IS
    'Internal: checks the rules of a task that involve several options (called by tide.schedule and tide.alter).';
REVOKE EXECUTE ON FUNCTION tide._check_task(bigint) FROM PUBLIC;

CREATE FUNCTION tide._check_database_task(t tide.task) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    problem record;
    what text;
BEGIN
    IF t.command IS NULL THEN
        RAISE EXCEPTION 'task "%": database => % needs an SQL command', t.name, quote_literal(left(t.database, 80))
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'the database is where pg_tide''s workers run the command; external workers connect to the database they work in themselves';
    END IF;
    what := CASE WHEN t.long THEN 'a long task (each batch commits with its checkpoint in pg_tide''s database)'
                 WHEN t.reconcile IS NOT NULL OR t.command = tide._recon_command() THEN 'a reconciliation (its sides are read in pg_tide''s database)'
                 WHEN t.ready_check IS NOT NULL THEN 'a readiness check (ready_check runs in pg_tide''s database, where its run waits)'
                 WHEN t.ready_watermark IS NOT NULL THEN 'a watermark (ready_watermark runs in pg_tide''s database, where its run waits)'
                 WHEN t.fallback IS NOT NULL THEN 'a fallback scan (it creates runs in pg_tide''s database)' END;
    IF what IS NOT NULL THEN
        RAISE EXCEPTION 'task "%": a command in database % cannot be %', t.name, quote_literal(left(t.database, 80)), what
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'leave out the database option, or wait for data with ready_dataset (tide.mark_ready) and read another database through postgres_fdw';
    END IF;
    SELECT * INTO problem FROM tide._database_problem(t.database, t.owner);
    IF FOUND THEN
        RAISE EXCEPTION 'task "%": %', t.name, problem.message
            USING ERRCODE = problem.sqlstate, HINT = problem.hint;
    END IF;
END
$$;
COMMENT ON FUNCTION tide._check_database_task(tide.task) IS
    'Internal: checks a task that names another database: an SQL command, not long, no reconciliation, readiness check, watermark or fallback scan (they work in pg_tide''s database), and a database its owner may connect to.';
REVOKE EXECUTE ON FUNCTION tide._check_database_task(tide.task) FROM PUBLIC;

-- No timeout (timeout => '0'): no lease that expires for its SQL runs; the largest int as its
-- milliseconds (the owner's statement_timeout applies).
DROP FUNCTION tide._lease_length(tide.executor, jsonb, interval);
CREATE FUNCTION tide._lease_length(p_executor tide.executor, rules jsonb, p_lease interval) RETURNS interval
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    -- An SQL run without a timeout (0) has no lease that expires: its executor is watched
    -- instead (the tick's executor_gone step), as its command may run as long as it needs.
    SELECT coalesce(p_lease, CASE WHEN p_executor OPERATOR(pg_catalog.=) 'sql'::tide.executor
        THEN CASE WHEN (rules OPERATOR(pg_catalog.->>) 'timeout')::pg_catalog.interval
                       OPERATOR(pg_catalog.>) '0'::pg_catalog.interval
                  THEN (rules OPERATOR(pg_catalog.->>) 'timeout')::pg_catalog.interval END
             OPERATOR(pg_catalog.+) least((rules OPERATOR(pg_catalog.->>) 'timeout')::pg_catalog.interval,
                                          '1 minute'::pg_catalog.interval)
        ELSE (rules OPERATOR(pg_catalog.->>) 'lease')::pg_catalog.interval END)
$$;
COMMENT ON FUNCTION tide._lease_length(tide.executor, jsonb, interval) IS
    'Internal: the lease length of a claim (the given one, the task''s lease, or an SQL run''s timeout plus a margin; none for an SQL run without a timeout).';
DROP FUNCTION tide._timeout_ms(text);
CREATE FUNCTION tide._timeout_ms(p_timeout text) RETURNS integer
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_timeout::interval = interval '0' THEN
        RETURN 2147483647;
    END IF;
    RETURN least(extract(epoch FROM p_timeout::interval) * 1000, 2147483647)::integer;
END
$$;
COMMENT ON FUNCTION tide._timeout_ms(text) IS 'Internal: a timeout from a rule snapshot, in milliseconds (2147483647: none, the owner''s statement_timeout applies).';

-- Command workers (src/command.rs) replace the top-level worker that held its executor.
DROP FUNCTION tide._top_level_start(bigint, bigint);
DROP FUNCTION tide._top_level_finish(bigint, bigint, text, text, integer, bigint, bigint);
CREATE FUNCTION tide._command_start(p_run_id bigint, p_token bigint)
RETURNS TABLE (command text, owner name, database text, top_level boolean, timeout_ms integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
DECLARE
    r record;
    problem record;
BEGIN
    SELECT v.rules, x.owner INTO r
      FROM tide.run x JOIN tide.task_version v ON v.task_id = x.task_id AND v.version = x.version
     WHERE x.run_id = p_run_id AND x.lease_token = p_token AND x.state = 'running';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF r.rules->>'database' IS NOT NULL THEN
        SELECT * INTO problem FROM tide._database_problem(r.rules->>'database', r.owner);
        IF FOUND THEN
            PERFORM 1 FROM tide.run x WHERE x.run_id = p_run_id FOR UPDATE;
            PERFORM tide._fail(p_run_id, problem.message,
                               tide._error_kind(problem.sqlstate, r.rules->'error_kinds')::tide.error_kind,
                               problem.sqlstate, 'failed', clock_timestamp());
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT r.rules->>'command', r.owner, r.rules->>'database',
                        coalesce((r.rules->>'top_level')::boolean, false), tide._timeout_ms(r.rules->>'timeout');
END
$$;
COMMENT ON FUNCTION tide._command_start(bigint, bigint) IS
    'Internal: what a command worker runs (command, owner, database, top_level, timeout), if the claim still holds the run; fails the run when its database cannot be reached.';
REVOKE EXECUTE ON FUNCTION tide._command_start(bigint, bigint) FROM PUBLIC;

CREATE FUNCTION tide._database_problem(p_database text, p_owner name)
RETURNS TABLE (sqlstate text, message text, hint text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d record;
BEGIN
    IF octet_length(p_database) > 63 THEN
        RETURN QUERY SELECT '22023', format('database name %s is too long (%s bytes, at most 63)',
                                            quote_literal(left(p_database, 80) || CASE WHEN length(p_database) > 80 THEN '...' ELSE '' END),
                                            octet_length(p_database)),
                            'name a database of this cluster: SELECT datname FROM pg_database';
        RETURN;
    END IF;
    SELECT x.oid, x.datistemplate, x.datallowconn INTO d FROM pg_database x WHERE x.datname = p_database;
    IF NOT FOUND THEN
        RETURN QUERY SELECT '3D000', format('database "%s" does not exist', p_database),
                            'name a database of this cluster: SELECT datname FROM pg_database';
    ELSIF d.datistemplate THEN
        RETURN QUERY SELECT '22023', format('database "%s" is a template', p_database),
                            'a template is copied by CREATE DATABASE, not worked in: name the database that holds your data';
    ELSIF NOT d.datallowconn THEN
        RETURN QUERY SELECT '55000', format('database "%s" is not currently accepting connections', p_database),
                            format('ALTER DATABASE %I ALLOW_CONNECTIONS true, or name another database', p_database);
    ELSIF NOT has_database_privilege(p_owner, d.oid, 'CONNECT') THEN
        RETURN QUERY SELECT '42501', format('permission denied for database "%s" (role "%s" does not have CONNECT privilege)', p_database, p_owner),
                            format('GRANT CONNECT ON DATABASE %I TO %I', p_database, p_owner);
    END IF;
END
$$;
COMMENT ON FUNCTION tide._database_problem(text, name) IS
    'Internal: why a role cannot run commands in a database (too long a name, none such, a template, not accepting connections, no CONNECT privilege), as SQLSTATE, message and hint; no row when it can.';

CREATE FUNCTION tide._command_finish(p_run_id bigint, p_token bigint, p_sqlstate text, p_error text,
                                     p_statements integer, p_expected bigint, p_actual bigint, p_tag text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
BEGIN
    IF NOT tide._still_held(p_run_id, p_token) THEN
        RETURN 'fenced';
    END IF;
    IF p_sqlstate IS NULL THEN
        RETURN tide.complete_run(p_run_id, p_token,
                                 jsonb_strip_nulls(jsonb_build_object('statements', p_statements, 'tag', p_tag)),
                                 p_expected, p_actual)::text;
    END IF;
    RETURN tide._fail(p_run_id, p_error,
                      tide._error_kind(p_sqlstate,
                                       (SELECT v.rules->'error_kinds' FROM tide.run r
                                          JOIN tide.task_version v ON v.task_id = r.task_id AND v.version = r.version
                                         WHERE r.run_id = p_run_id))::tide.error_kind,
                      p_sqlstate, 'failed', now())::text;
END
$$;
COMMENT ON FUNCTION tide._command_finish(bigint, bigint, text, text, integer, bigint, bigint, text) IS
    'Internal: records the outcome of a command worker (completed with its statement count and last command tag, or failed by its SQLSTATE) if the claim still holds the run.';
REVOKE EXECUTE ON FUNCTION tide._command_finish(bigint, bigint, text, text, integer, bigint, bigint, text) FROM PUBLIC;

CREATE FUNCTION tide._command_wait(p_run_id bigint, p_token bigint, p_why text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
BEGIN
    IF NOT tide._still_held(p_run_id, p_token) THEN
        RETURN;
    END IF;
    UPDATE tide.run x
       SET state = 'waiting', run_after = now() + interval '2 seconds', ready_deadline = NULL,
           tries = greatest(x.tries - 1, 0), lease_expires_at = NULL, updated_at = now(),
           reason = tide._clip(p_why, 500)
     WHERE x.run_id = p_run_id;
    PERFORM tide._release(ARRAY[p_run_id]);
END
$$;
COMMENT ON FUNCTION tide._command_wait(bigint, bigint, text) IS
    'Internal: puts a claimed run back in line for two seconds (no try counted) when no command worker is free for it.';
REVOKE EXECUTE ON FUNCTION tide._command_wait(bigint, bigint, text) FROM PUBLIC;

DROP FUNCTION tide._execute(bigint, bigint);
CREATE FUNCTION tide._execute(p_run_id bigint, p_token bigint) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- Generic plans for the run's bookkeeping, as tide._claim and tide.complete_run have: the
-- executors' sessions plan every statement for each execution otherwise (src/worker.rs), and
-- these look runs and rule versions up by key, for which a plan made again is the same plan
-- (measured: this function's own time down by a tenth). The task's command is not affected:
-- it runs under the seal's RESET ALL, with the session's defaults.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    cmd text;
    rules jsonb;
    long boolean;
    r tide.run;
    seal bigint;
    n bigint;
    reported record;
    next_checkpoint jsonb;
    scan boolean;
    scan_rows jsonb;
    st text;
    msg text;
    final tide.run_state;
    wait_ms bigint;
    recon jsonb;
    compared jsonb;
    side text;
    wrote boolean;
BEGIN
    SELECT * INTO r FROM tide.run x WHERE x.run_id = p_run_id AND x.lease_token = p_token AND x.state = 'running';
    IF NOT FOUND THEN
        RETURN 'fenced';
    END IF;
    IF r.control IS NOT NULL THEN
        RETURN tide._stop_run(p_run_id, NULL)::text;
    END IF;
    SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = r.task_id AND v.version = r.version;
    cmd := rules->>'command';
    long := coalesce((rules->>'long')::boolean, false);
    -- A window run of an event task with a fallback is its scan for events never emitted.
    scan := rules->>'fallback' IS NOT NULL AND r.window_start IS NOT NULL;
    -- A reconciliation's run compares its two sides (sql/recon.sql) instead of running a command.
    recon := CASE WHEN jsonb_typeof(rules->'reconcile') = 'object' THEN rules->'reconcile' END;
    IF coalesce((rules->>'top_level')::boolean, false) OR rules->>'database' IS NOT NULL THEN
        -- Run by a worker of its own: outside any transaction block, or in another database
        -- (src/command.rs).
        RETURN 'top_level';
    END IF;
    BEGIN
        IF cmd IS NULL AND NOT scan THEN
            PERFORM tide.business_error('the task has no command in this rule version');
        END IF;
        seal := tide._seal_begin(p_run_id, r.owner, tide._timeout_ms(rules->>'timeout'));
        IF recon IS NOT NULL THEN
            -- Read-only, in the seal's GUC level (undone with it), with the comparison's memory.
            PERFORM set_config('transaction_read_only', 'on', true);
            PERFORM set_config('jit', 'off', true);
            IF recon->>'work_mem' IS NOT NULL THEN
                PERFORM set_config('work_mem', recon->>'work_mem', true);
            END IF;
            compared := jsonb_build_object('started_at', clock_timestamp())
                        || tide._recon_compare(recon, current_setting('search_path'));
        ELSIF scan THEN
            EXECUTE format('SELECT coalesce(jsonb_agg(to_jsonb(s)), ''[]'') FROM (%s) s', rules->>'fallback') INTO scan_rows;
        ELSIF long THEN
            EXECUTE cmd INTO next_checkpoint;
        ELSE
            EXECUTE cmd;
            GET DIAGNOSTICS n = ROW_COUNT;
        END IF;
        SELECT * INTO reported FROM tide._seal_end(seal);
        -- Back to pg_tide's bookkeeping: a row a role's open transaction holds may delay it a
        -- little, never stall the executor (the setting ends with this transaction).
        PERFORM set_config('lock_timeout', '5s', true);
        IF scan THEN
            RETURN tide.complete_run(p_run_id, p_token, tide._fallback_emit(r, scan_rows))::text;
        END IF;
        IF recon IS NOT NULL THEN
            RETURN tide.complete_run(p_run_id, p_token, tide._recon_record(r, recon, compared))::text;
        END IF;
        IF long THEN
            UPDATE tide.run x SET batches = x.batches + 1 WHERE x.run_id = p_run_id;
            IF next_checkpoint IS NOT NULL THEN
                -- One batch done: a heartbeat commits its checkpoint with its work and renews
                -- the lease and lock; a pause or cancel asked for meanwhile stops the run here.
                IF tide.heartbeat_run(p_run_id, p_token, next_checkpoint) IS NULL THEN
                    RETURN (SELECT x.state::text FROM tide.run x WHERE x.run_id = p_run_id);
                END IF;
                wait_ms := coalesce(round(1000 / (rules->>'batch_rate')::float8)::bigint,
                                    (extract(epoch FROM (rules->>'batch_pause')::interval) * 1000)::bigint, 0);
                IF wait_ms >= 2000 AND r.lock_key IS NULL THEN
                    -- A wait of 2 seconds or more does not pin the executor: the run waits in line
                    -- (its checkpoint kept) and the next batch is claimed again when it is due,
                    -- without counting as another try. A run holding a lock keeps it, and its
                    -- executor, for the wait.
                    UPDATE tide.run x
                       SET state = 'waiting', run_after = now() + make_interval(secs => wait_ms / 1000.0),
                           ready_deadline = NULL, tries = greatest(x.tries - 1, 0), lease_expires_at = NULL,
                           updated_at = now(),
                           reason = format('between batches: %s done, the next at %s (no executor held meanwhile)',
                                           x.batches, now() + make_interval(secs => wait_ms / 1000.0))
                     WHERE x.run_id = p_run_id;
                    RETURN 'waiting';
                END IF;
                RETURN 'more ' || wait_ms;
            END IF;
        END IF;
        final := tide.complete_run(p_run_id, p_token,
                               CASE WHEN long THEN jsonb_build_object('batches', r.batches + 1)
                                    ELSE jsonb_build_object('row_count', n) END,
                               reported.expected, reported.actual);
        RETURN final::text;
    EXCEPTION WHEN query_canceled OR others THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
        PERFORM tide._seal_abort(seal);
    END;
    PERFORM set_config('lock_timeout', '5s', true);
    PERFORM 1 FROM tide.run x
     WHERE x.run_id = p_run_id AND x.lease_token = p_token AND x.state = 'running' FOR UPDATE;
    IF NOT FOUND THEN
        -- Fenced: the lease was lost and the run taken back; the command's effects are undone.
        RETURN 'fenced';
    END IF;
    IF (SELECT x.control FROM tide.run x WHERE x.run_id = p_run_id) IS NOT NULL THEN
        -- tide.cancel_run or tide.pause_run interrupted the command (or asked while it failed):
        -- the run stops as asked; its work was rolled back with the subtransaction.
        RETURN tide._stop_run(p_run_id, NULL, true)::text;
    END IF;
    IF recon IS NOT NULL THEN
        -- A side that fails or writes fails the run as a business error naming the side (its
        -- errors of transient classes, such as a lost connection of a foreign table, retry).
        wrote := st = '25006' OR (st = '0A000' AND msg LIKE '%non-volatile function%');
        IF st NOT IN ('TDBE0', '57014') THEN
            side := tide._recon_blame(recon, p_run_id, r.owner, tide._timeout_ms(rules->>'timeout'));
            msg := CASE WHEN wrote THEN format('the %s side tried to write (it must only read): %s', coalesce(side, 'left or right'), msg)
                        WHEN side IS NOT NULL THEN format('the %s side failed (%s): %s', side, st, msg)
                        ELSE format('the comparison failed (%s): %s', st, msg) END;
        END IF;
        final := tide._fail(p_run_id, msg,
                            CASE WHEN NOT wrote AND tide._error_kind(st, rules->'error_kinds') = 'transient'
                                 THEN 'transient' ELSE 'business' END::tide.error_kind, st, 'failed', clock_timestamp());
        RETURN final::text;
    END IF;
    final := tide._fail(p_run_id, msg, tide._error_kind(st, rules->'error_kinds')::tide.error_kind, st, 'failed', clock_timestamp());
    RETURN final::text;
END
$$;
COMMENT ON FUNCTION tide._execute(bigint, bigint) IS
    'Internal: runs a claimed run''s command sealed as the task''s owner (one batch of a long task) and completes or fails it in the same transaction (called by pg_tide executors). Returns the run''s state, fenced, or ''more <ms>'' when a long task has more batches.';
REVOKE EXECUTE ON FUNCTION tide._execute(bigint, bigint) FROM PUBLIC;

DROP FUNCTION tide._tick_step(text, timestamptz);
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
REVOKE EXECUTE ON FUNCTION tide._tick_step(text, timestamptz) FROM PUBLIC;

DROP FUNCTION tide._ask_to_stop(tide.run, text, text);
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
    IF coalesce((rules->>'top_level')::boolean, false) OR rules->>'database' IS NOT NULL
       OR (p_control = 'pause' AND coalesce((rules->>'long')::boolean, false)) THEN
        RETURN;  -- between batches, or when the command run by a worker of its own ends
    END IF;
    PERFORM pg_cancel_backend(a.pid) FROM pg_stat_activity a
     WHERE a.pid = r.executor_pid AND a.backend_start = r.executor_start;
END
$$;
COMMENT ON FUNCTION tide._ask_to_stop(tide.run, text, text) IS
    'Internal: records a pause or cancel asked of a running run (who and why) and interrupts the command of an SQL run.';
REVOKE EXECUTE ON FUNCTION tide._ask_to_stop(tide.run, text, text) FROM PUBLIC;

-- schedule and alter take database; the import creates tasks with pg_cron's meaning.
DROP FUNCTION tide.schedule(text, text, text, text, text, text, jsonb, text, text, interval, interval, integer, integer, interval, double precision, interval, text, text, interval, integer, interval, text, text, interval, interval, text, text, integer, text, text[], boolean, boolean, double precision, interval, jsonb, text, interval, text, boolean, jsonb, boolean, text);
DROP FUNCTION tide.alter(text, text, text, text, text, text, jsonb, text, text, interval, interval, integer, integer, interval, double precision, interval, text, text, interval, integer, interval, text, text, interval, interval, text, text, text, integer, text, text[], boolean, boolean, double precision, interval, jsonb, text, interval, text, boolean, jsonb);
DROP FUNCTION tide.import_pg_cron(boolean);
DROP FUNCTION tide._import_job(text, text, text, text, text, boolean, boolean);
CREATE  FUNCTION tide."schedule"(
	"task" TEXT, /* Option < & str > */
	"schedule" TEXT, /* Option < & str > */
	"command" TEXT DEFAULT NULL, /* Option < & str > */
	"tz" TEXT DEFAULT 'UTC', /* Option < & str > */
	"biz_window" TEXT DEFAULT 'fire', /* Option < & str > */
	"queue" TEXT DEFAULT 'default', /* Option < & str > */
	"args" jsonb DEFAULT '{}', /* Option < JsonbText > */
	"dst_gap" TEXT DEFAULT 'shift', /* Option < & str > */
	"dst_overlap" TEXT DEFAULT 'once', /* Option < & str > */
	"timeout" interval DEFAULT '1 hour', /* Option < Interval > */
	"lease" interval DEFAULT '5 minutes', /* Option < Interval > */
	"priority" INT DEFAULT 0, /* Option < i32 > */
	"max_attempts" INT DEFAULT 5, /* Option < i32 > */
	"backoff_base" interval DEFAULT '10 seconds', /* Option < Interval > */
	"backoff_factor" double precision DEFAULT 2.0, /* Option < f64 > */
	"backoff_cap" interval DEFAULT '1 hour', /* Option < Interval > */
	"jitter" TEXT DEFAULT 'full', /* Option < & str > */
	"misfire" TEXT DEFAULT 'catch_up', /* Option < & str > */
	"misfire_threshold" interval DEFAULT '60 seconds', /* Option < Interval > */
	"catch_up_max" INT DEFAULT 100, /* Option < i32 > */
	"source_retention" interval DEFAULT NULL, /* Option < Interval > */
	"ready_dataset" TEXT DEFAULT NULL, /* Option < & str > */
	"ready_check" TEXT DEFAULT NULL, /* Option < & str > */
	"ready_timeout" interval DEFAULT NULL, /* Option < Interval > */
	"recheck_interval" interval DEFAULT '1 minute', /* Option < Interval > */
	"not_ready_policy" TEXT DEFAULT 'next_window', /* Option < & str > */
	"overlap" TEXT DEFAULT 'queue', /* Option < & str > */
	"max_concurrency" INT DEFAULT NULL, /* Option < i32 > */
	"lock_key" TEXT DEFAULT NULL, /* Option < & str > */
	"topics" TEXT[] DEFAULT '{}', /* :: std :: option :: Option < Vec < Option < String > > > */
	"long" bool DEFAULT false, /* Option < bool > */
	"top_level" bool DEFAULT false, /* Option < bool > */
	"batch_rate" double precision DEFAULT NULL, /* Option < f64 > */
	"batch_pause" interval DEFAULT NULL, /* Option < Interval > */
	"error_kinds" jsonb DEFAULT NULL, /* Option < JsonbText > */
	"ready_watermark" TEXT DEFAULT NULL, /* Option < & str > */
	"watermark_stable_for" interval DEFAULT NULL, /* Option < Interval > */
	"fallback" TEXT DEFAULT NULL, /* Option < & str > */
	"rescan_previous" bool DEFAULT false, /* Option < bool > */
	"reconcile" jsonb DEFAULT NULL, /* Option < JsonbText > */
	"replace" bool DEFAULT false, /* Option < bool > */
	"pending" TEXT DEFAULT 'hold', /* Option < & str > */
	"database" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS bigint /* i64 */
VOLATILE  
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'schedule_task_wrapper';
COMMENT ON FUNCTION tide.schedule(text, text, text, text, text, text, jsonb, text, text, interval, interval, integer, integer, interval, double precision, interval, text, text, interval, integer, interval, text, text, interval, interval, text, text, integer, text, text[], boolean, boolean, double precision, interval, jsonb, text, interval, text, boolean, jsonb, boolean, text, text) IS
    'schedule(task, schedule, command => NULL, tz => ''UTC'', biz_window => ''fire'', queue => ''default'', args => ''{}'', dst_gap => ''shift'', dst_overlap => ''once'', timeout => ''1 hour'' (''0'': none, the owner''s statement_timeout applies), lease => ''5 minutes'', priority => 0, max_attempts => 5, backoff_base => ''10 seconds'', backoff_factor => 2, backoff_cap => ''1 hour'', jitter => ''full'', misfire => ''catch_up'', misfire_threshold => ''60 seconds'', catch_up_max => 100, source_retention => NULL, ready_dataset => NULL, ready_check => NULL, ready_timeout => NULL, recheck_interval => ''1 minute'', not_ready_policy => ''next_window'', overlap => ''queue'', max_concurrency => NULL, lock_key => NULL, topics => ''{}'', long => false, top_level => false, batch_rate => NULL, batch_pause => NULL, error_kinds => NULL, ready_watermark => NULL, watermark_stable_for => NULL, fallback => NULL, rescan_previous => false, reconcile => NULL (a reconciliation''s definition, written by tide.reconcile), replace => false, pending => ''hold'', database => NULL (another database of the cluster the command runs in, as pg_cron''s schedule_in_database; NULL: this one)): creates a task (schedule NULL: an event task that runs only on tide.emit of its topics); returns its task_id. A command that does not parse, or (without top_level) holds a statement that refuses a transaction block, such as VACUUM, is refused. On a name the caller already has: the same definition is a no-op returning the same task_id; a different one is refused (23505) unless replace => true, which makes it the task''s next rule version (unstarted runs follow pending, as in tide.alter).';

CREATE  FUNCTION tide."alter"(
	"task" TEXT, /* Option < & str > */
	"schedule" TEXT DEFAULT NULL, /* Option < & str > */
	"command" TEXT DEFAULT NULL, /* Option < & str > */
	"tz" TEXT DEFAULT NULL, /* Option < & str > */
	"biz_window" TEXT DEFAULT NULL, /* Option < & str > */
	"queue" TEXT DEFAULT NULL, /* Option < & str > */
	"args" jsonb DEFAULT NULL, /* Option < JsonbText > */
	"dst_gap" TEXT DEFAULT NULL, /* Option < & str > */
	"dst_overlap" TEXT DEFAULT NULL, /* Option < & str > */
	"timeout" interval DEFAULT NULL, /* Option < Interval > */
	"lease" interval DEFAULT NULL, /* Option < Interval > */
	"priority" INT DEFAULT NULL, /* Option < i32 > */
	"max_attempts" INT DEFAULT NULL, /* Option < i32 > */
	"backoff_base" interval DEFAULT NULL, /* Option < Interval > */
	"backoff_factor" double precision DEFAULT NULL, /* Option < f64 > */
	"backoff_cap" interval DEFAULT NULL, /* Option < Interval > */
	"jitter" TEXT DEFAULT NULL, /* Option < & str > */
	"misfire" TEXT DEFAULT NULL, /* Option < & str > */
	"misfire_threshold" interval DEFAULT NULL, /* Option < Interval > */
	"catch_up_max" INT DEFAULT NULL, /* Option < i32 > */
	"source_retention" interval DEFAULT NULL, /* Option < Interval > */
	"ready_dataset" TEXT DEFAULT NULL, /* Option < & str > */
	"ready_check" TEXT DEFAULT NULL, /* Option < & str > */
	"ready_timeout" interval DEFAULT NULL, /* Option < Interval > */
	"recheck_interval" interval DEFAULT NULL, /* Option < Interval > */
	"not_ready_policy" TEXT DEFAULT NULL, /* Option < & str > */
	"pending" TEXT DEFAULT 'hold', /* Option < & str > */
	"overlap" TEXT DEFAULT NULL, /* Option < & str > */
	"max_concurrency" INT DEFAULT NULL, /* Option < i32 > */
	"lock_key" TEXT DEFAULT NULL, /* Option < & str > */
	"topics" TEXT[] DEFAULT NULL, /* :: std :: option :: Option < Vec < Option < String > > > */
	"long" bool DEFAULT NULL, /* Option < bool > */
	"top_level" bool DEFAULT NULL, /* Option < bool > */
	"batch_rate" double precision DEFAULT NULL, /* Option < f64 > */
	"batch_pause" interval DEFAULT NULL, /* Option < Interval > */
	"error_kinds" jsonb DEFAULT NULL, /* Option < JsonbText > */
	"ready_watermark" TEXT DEFAULT NULL, /* Option < & str > */
	"watermark_stable_for" interval DEFAULT NULL, /* Option < Interval > */
	"fallback" TEXT DEFAULT NULL, /* Option < & str > */
	"rescan_previous" bool DEFAULT NULL, /* Option < bool > */
	"reconcile" jsonb DEFAULT NULL, /* Option < JsonbText > */
	"database" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS INT /* i32 */
VOLATILE  
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'alter_task_wrapper';
COMMENT ON FUNCTION tide.alter(text, text, text, text, text, text, jsonb, text, text, interval, interval, integer, integer, interval, double precision, interval, text, text, interval, integer, interval, text, text, interval, interval, text, text, text, integer, text, text[], boolean, boolean, double precision, interval, jsonb, text, interval, text, boolean, jsonb, text) IS
    'alter(task, ..., pending => ''hold''): changes only the options given (schedule, command, ready_dataset, ready_check or lock_key => '''' removes it; max_concurrency, batch_rate => 0 and batch_pause => ''0'' remove the limit; error_kinds => ''{}'' removes the mapping; ready_watermark => '''' with watermark_stable_for => ''0'' removes the watermark; fallback => '''' removes the scan; database => '''' runs the command in pg_tide''s database again; timeout => ''0'' leaves runs without a timeout of pg_tide''s); returns the rule version, one higher if any rule changed. Unstarted runs of older versions are held for tide.confirm (pending => ''hold''), take the new rules (''adopt'') or keep theirs (''keep'').';

CREATE  FUNCTION tide."_check_command"(
	"task" TEXT, /* & str */
	"command" TEXT, /* & str */
	"top_level" bool /* bool */
) RETURNS void
STRICT VOLATILE  
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'check_command_wrapper';
COMMENT ON FUNCTION tide._check_command(text, text, boolean) IS
    'Internal (tide._check_task): refuses a command that does not parse (42601) or, unless top-level, holds a statement PostgreSQL refuses inside a transaction block, naming it (22023, hint top_level => true).';
REVOKE EXECUTE ON FUNCTION tide._check_command(text, text, boolean) FROM PUBLIC;

CREATE  FUNCTION tide."_statement_count"(
	"command" TEXT /* & str */
) RETURNS INT /* i32 */
IMMUTABLE STRICT PARALLEL SAFE  
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'statement_count_wrapper';
COMMENT ON FUNCTION tide._statement_count(text) IS
    'Internal: how many statements a command holds, as PostgreSQL''s parser reads it.';

CREATE  FUNCTION tide."_import_task"(
	"owner" TEXT, /* & str */
	"task" TEXT, /* & str */
	"schedule" TEXT, /* & str */
	"command" TEXT, /* & str */
	"tz" TEXT, /* & str */
	"top_level" bool, /* bool */
	"paused" bool, /* bool */
	"database" TEXT, /* Option < & str > */
	"max_attempts" INT, /* i32 */
	"misfire" TEXT, /* & str */
	"misfire_threshold" interval, /* Option < pgrx :: datum :: Interval > */
	"timeout" interval /* Option < pgrx :: datum :: Interval > */
) RETURNS bigint /* i64 */
VOLATILE  
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'import_task_wrapper';
COMMENT ON FUNCTION tide._import_task(text, text, text, text, text, boolean, boolean, text, integer, text, interval, interval) IS
    'Internal (tide.import_pg_cron): creates one imported task through tide.schedule, called as the pg_cron job''s role, with the import''s settings, paused when the job was inactive.';
REVOKE EXECUTE ON FUNCTION tide._import_task(text, text, text, text, text, boolean, boolean, text, integer, text, interval, interval) FROM PUBLIC;

CREATE  FUNCTION tide."_command_runs"() RETURNS bigint[] /* Vec < i64 > */
STRICT VOLATILE PARALLEL RESTRICTED  
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'command_runs_wrapper';
COMMENT ON FUNCTION tide._command_runs() IS
    'Internal: the runs whose commands a command worker runs or has run and whose outcome is not recorded yet (the tick leaves them to it).';
REVOKE EXECUTE ON FUNCTION tide._command_runs() FROM PUBLIC;

CREATE  FUNCTION tide."_command_workers"() RETURNS TABLE (
	"run_id" bigint,  /* i64 */
	"database" TEXT,  /* String */
	"state" TEXT,  /* String */
	"pid" INT,  /* Option < i32 > */
	"since" timestamp with time zone  /* Option < pgrx :: datum :: TimestampWithTimeZone > */
)
STRICT VOLATILE PARALLEL RESTRICTED  
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'command_workers_wrapper';
COMMENT ON FUNCTION tide._command_workers() IS
    'Internal (superusers and tide_admin): the busy command workers (top-level commands, commands in other databases) at this instant: run_id, database, state (launching, running, done, collecting), the worker''s pid, since when.';
REVOKE EXECUTE ON FUNCTION tide._command_workers() FROM PUBLIC;

GRANT EXECUTE ON FUNCTION tide._command_workers() TO tide_admin;
COMMENT ON FUNCTION tide._needs_top_level(text) IS
    'Internal (tide.import_pg_cron): whether an imported pg_cron job must run at top level: a statement PostgreSQL refuses in a transaction block or a function, or one CALL (several ordinary statements run as one transaction, as in pg_cron).';

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

-- pg_cron's tables as views.
CREATE VIEW tide.job WITH (security_invoker = true) AS
SELECT t.task_id AS jobid, coalesce(t.schedule, '') AS schedule, coalesce(t.command, '') AS command,
       'localhost'::text AS nodename, pg_catalog.current_setting('port')::integer AS nodeport,
       coalesce(t.database, pg_catalog.current_database())::text AS database, t.owner::text AS username,
       NOT t.paused AS active, t.name::name AS jobname
  FROM tide.task t;
COMMENT ON VIEW tide.job IS
    'pg_cron''s cron.job over tide.task: jobid (the task_id), schedule, command, nodename, nodeport, database, username (the owner), active (not paused), jobname (the task''s name).';
GRANT SELECT ON tide.job TO PUBLIC;

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

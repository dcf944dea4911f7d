-- pg_tide 0.2.1 to 0.2.2: pg_cron users keep their jobs' meaning, in every database of the
-- cluster. Commands of another database (the task option database) and top-level commands run
-- by command workers of their own; a command that cannot run where it is scheduled is refused
-- when it is made; timeout => '0' is no timeout of pg_tide's; tide.import_pg_cron keeps
-- pg_cron's meaning and says how a job will differ; tide.job and tide.job_run_details are
-- pg_cron's tables as views. Failures are noticed with nothing set up wrong: late starts alert
-- (late_start, the task option start_deadline), alerts that no channel takes are flagged
-- (undelivered, tide.untaken_alerts), channels take warnings by default and can be tested
-- (tide.test_channel), a cancel or pause of a running top-level command or command of another
-- database interrupts it, and the role tide_monitor reads every owner's metrics.
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
    IF (SELECT x.control FROM tide.run x WHERE x.run_id = p_run_id) IS NOT NULL THEN
        -- tide.cancel_run or tide.pause_run interrupted the command (tide._ask_to_stop): the run
        -- stops as asked. A top-level command's statements before the interruption stay.
        RETURN tide._stop_run(p_run_id, NULL, true,
                              CASE WHEN p_statements > 0
                                   THEN format('while running, its command interrupted after %s statements, which stay committed', p_statements)
                                   ELSE 'while running, its command interrupted and its work rolled back' END)::text;
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
    'Internal: records the outcome of a command worker (completed with its statement count and last command tag, stopped as a cancel or pause asked, or failed by its SQLSTATE) if the claim still holds the run.';
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

-- Alerts of 0.2.2: a ready run not started by its deadline, and open alerts no channel takes.
-- (Added here, used only from the next transaction on: functions below cast from text.)
ALTER TYPE tide.alert_kind ADD VALUE 'undelivered';
ALTER TYPE tide.alert_kind ADD VALUE 'late_start';

-- How long a ready run may wait to start (tide.monitor; NULL: derived).
ALTER TABLE tide.task ADD COLUMN start_deadline interval CHECK (start_deadline > interval '0');
COMMENT ON COLUMN tide.task.start_deadline IS 'Longest a ready run may wait to start before a late_start alert opens (set with tide.monitor, not a rule); NULL = derived: a quarter of the gap between fires, 1 to 15 minutes, for window runs, pg_tide.start_deadline for one-off and event runs.';
DROP FUNCTION tide._task_rules(tide.task);
CREATE FUNCTION tide._task_rules(t tide.task) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT pg_catalog.to_jsonb(t) OPERATOR(pg_catalog.-)
           ARRAY['task_id', 'version', 'owner', 'paused', 'paused_at', 'skip_until', 'next_fire_at',
                 'created_at', 'updated_at', 'max_silence', 'severity', 'fire_gap', 'tick_error',
                 'tick_error_at', 'tick_retry_at', 'start_deadline']::pg_catalog.text[]
$$;
COMMENT ON FUNCTION tide._task_rules(tide.task) IS
    'The rule snapshot of a task row, as stored in tide.task_version.rules.';

-- A role that reads every owner's metrics, and nothing else (pg_tide-console --metrics-only).
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'tide_monitor') THEN
        CREATE ROLE tide_monitor NOLOGIN;
    END IF;
END
$roles$;

-- Alert deliveries counted per channel and outcome (pg_tide_deliveries_total).
CREATE TABLE tide.delivery_count (
    owner   name NOT NULL,
    channel text NOT NULL,
    outcome text NOT NULL CHECK (outcome IN ('sent', 'failed', 'dead')),
    value   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, channel, outcome)
);
COMMENT ON TABLE tide.delivery_count IS
    'Alert deliveries of pg_tide''s channels by outcome: sent, failed attempts, dead (given up). Counters that never go down (tide.metrics(): pg_tide_deliveries_total).';
ALTER TABLE tide.delivery_count ENABLE ROW LEVEL SECURITY;
CREATE POLICY delivery_count_owner ON tide.delivery_count FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.delivery_count TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.delivery_count', '');

-- Health, self health and the dashboard: the oldest ready run (its id, and its wait since it
-- became ready), open alerts no channel takes, the wait column.
DROP VIEW tide.dashboard;
DROP VIEW tide.health;
DROP VIEW tide.self_health;
DROP FUNCTION tide._health(timestamptz, bigint[]);
DROP FUNCTION tide._self(timestamptz);
DROP FUNCTION tide._alert_causes(timestamptz);
DROP FUNCTION tide._self_causes(timestamptz);
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

CREATE FUNCTION tide._late_cause(p_run_id bigint) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
    q tide.queue;
    holder bigint;
    running bigint;
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

CREATE FUNCTION tide._health(p_now timestamptz, p_task_ids bigint[] DEFAULT NULL)
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
-- only: the tick's alert evaluation asks for those that may have something to report.
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
    UNION SELECT o.task_id FROM open_runs o WHERE p_task_ids IS NOT NULL
), stale AS MATERIALIZED (
    -- The tasks whose kept figures do not hold at p_now (a visible touch row, computed after
    -- p_now, or out of date; see above): computed from their runs below. A task without kept
    -- figures has a touch row: its creation notes it, and the fold deletes a touch row only
    -- with the kept figures of its task written in the same transaction (tide._monitor notes
    -- again any task that lacks both). So only the kept rows are read here, not every task
    -- against its kept row (measured over 10,000 tasks: 9% of health, four alternating rounds).
    SELECT ARRAY(SELECT y.task_id
                   FROM (SELECT s.task_id FROM tide.task_stat s WHERE s.computed_at > p_now OR s.valid_until <= p_now
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
     WHERE s.computed_at <= p_now AND (s.valid_until IS NULL OR s.valid_until > p_now)
       AND s.task_id NOT IN (SELECT u.task_id FROM touched u)
       AND (p_task_ids IS NULL OR t.task_id IN (SELECT x.task_id FROM shown x))
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
COMMENT ON FUNCTION tide._health(timestamptz, bigint[]) IS 'Internal: tide.health at an instant, of every task, or of the tasks given and those with unfinished or unresolved runs (the tick evaluates alerts with it).';

CREATE FUNCTION tide._self(p_now timestamptz)
RETURNS TABLE (status text, last_tick timestamptz, since_last_tick interval, stalled_after interval, tick_errors bigint,
               last_tick_error text, last_tick_error_at timestamptz, scheduler_alive boolean, executors_alive integer,
               executors_expected integer, delivery_alive boolean, notifier_alive boolean, ready_runs integer, oldest_ready interval,
               deliveries_pending integer, deliveries_dead_24h integer, ping_configured boolean,
               last_ping_at timestamptz, last_ping_status integer, owner name, alerts_untaken integer)
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
    IF NOT (tide._caller_is_superuser() OR pg_has_role('tide_admin', 'MEMBER')) THEN
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
                        OR alerts_untaken > 0 THEN 'late'
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

CREATE  FUNCTION tide."_queue_claimed"(
	"queue" TEXT /* & str */
) RETURNS void
STRICT VOLATILE PARALLEL UNSAFE  
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'queue_claimed_wrapper';
COMMENT ON FUNCTION tide._queue_claimed(text) IS
    'Internal (tide._claim): notes in shared memory that an external worker claimed from a queue now, for the cause of a late start.';
REVOKE EXECUTE ON FUNCTION tide._queue_claimed(text) FROM PUBLIC;

CREATE  FUNCTION tide."_queue_claimed_at"(
	"queue" TEXT /* & str */
) RETURNS timestamp with time zone /* Option < TimestampWithTimeZone > */
STRICT VOLATILE PARALLEL RESTRICTED  
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'queue_claimed_at_wrapper';
COMMENT ON FUNCTION tide._queue_claimed_at(text) IS
    'Internal: when an external worker last claimed from a queue of this database since the server started (NULL: not since, or forgotten).';
REVOKE EXECUTE ON FUNCTION tide._queue_claimed_at(text) FROM PUBLIC;

CREATE VIEW tide.self_health WITH (security_invoker = true) AS SELECT * FROM tide._self(now());
COMMENT ON VIEW tide.self_health IS
    'pg_tide itself: status (ok, late, failing, down, paused), the last successful tick and the time since, tick errors since the server started and the last one, whether the scheduler, executors, delivery worker and notifier run, ready runs and the oldest one''s wait, alert deliveries pending and dead in 24 h, the ping, and alerts_untaken: open alerts no channel or route takes (late while there are any). Shown in the database pg_tide serves, to superusers and members of tide_admin.';
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

-- Who takes an alert (channels and routes), and the open alerts nobody takes.
CREATE FUNCTION tide._alert_takers(p_owner name, p_severity text, p_kind text, p_subject_type text, p_subject text,
                                   p_resolved boolean)
RETURNS TABLE (channel text, owner name)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        SELECT r.channel::text, r.owner FROM tide.alert_route r
         WHERE tide._routed(r.owner, p_owner) AND p_severity::tide.severity >= r.min_severity
           AND (r.kinds IS NULL OR p_kind = ANY (r.kinds::text[]))
           AND (NOT p_resolved OR r.resolved)
        UNION
        SELECT c.name::text, c.owner FROM tide.alert_channel c
         WHERE c.alerts IS NOT NULL AND p_severity::tide.severity >= c.alerts AND tide._routed(c.owner, p_owner)
           -- A channel is not told that it is failing (it would fail again).
           AND NOT (p_kind = 'delivery_failed' AND p_subject_type = 'channel' AND p_subject = c.name
                    AND p_owner = c.owner);
END
$$;
COMMENT ON FUNCTION tide._alert_takers(name, text, text, text, text, boolean) IS
    'Internal: the routes and channels that take an alert of an owner, severity, kind and subject (of its resolution when p_resolved).';

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

CREATE FUNCTION tide._alerts_untaken() RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*)::integer FROM tide._untaken() u WHERE u.last_seen_at > u.opened_at
$$;
COMMENT ON FUNCTION tide._alerts_untaken() IS
    'Internal: how many open alerts, seen by more than one evaluation, no channel or route takes (pg_tide''s undelivered alert aside).';

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
    SELECT * FROM tide._self_causes(p_now);
END
$$;
COMMENT ON FUNCTION tide._alert_causes(timestamptz) IS 'Internal: every alert condition that holds at an instant.';

DROP FUNCTION tide._alert_deliver(jsonb);
CREATE FUNCTION tide._alert_deliver(p_event jsonb) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tag text := CASE p_event->>'event' WHEN 'renotify' THEN 'renotify' || (p_event->>'reminder') ELSE p_event->>'event' END;
    n integer;
BEGIN
    WITH delivery AS (
        INSERT INTO tide.effect (channel, dedupe_key, payload, owner)
        SELECT x.channel, format('alert:%s:%s:%s', a.alert_id, tag, x.channel), p_event, x.owner
          FROM tide.alert a
         CROSS JOIN LATERAL tide._alert_takers(a.owner, a.severity::text, a.kind::text, a.subject_type, a.subject,
                                               p_event->>'event' = 'resolved') x
         WHERE a.alert_id = (p_event->>'alert_id')::bigint
        ON CONFLICT ON CONSTRAINT effect_owner_dedupe_key_key DO NOTHING
        RETURNING channel
    )
    -- One NOTIFY per channel (external delivery workers LISTEN for their channel).
    SELECT count(pg_notify('pg_tide_effect', d.channel)) INTO n FROM delivery d;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._alert_deliver(jsonb) IS
    'Internal: records the deliveries of one alert event, once per route and channel that receives it (dedupe key alert:<id>:<event>:<channel>).';
REVOKE EXECUTE ON FUNCTION tide._alert_deliver(jsonb) FROM PUBLIC;

-- Deliveries counted; a channel made without alerts takes warning and above; a test message.
DROP FUNCTION tide._delivery_done(bigint, bigint, text, boolean);
CREATE FUNCTION tide._delivery_done(p_effect_id bigint, p_token bigint, p_error text, p_permanent boolean) RETURNS tide.effect_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    e tide.effect;
    next_state tide.effect_state;
BEGIN
    SELECT * INTO e FROM tide.effect x WHERE x.effect_id = p_effect_id AND x.state = 'sending' AND x.lease_token = p_token FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF p_error IS NULL THEN
        next_state := tide.complete_effect(p_effect_id, p_token);
        UPDATE tide.alert_channel c SET last_sent_at = now() WHERE c.owner = e.owner AND c.name = e.channel;
    ELSE
        next_state := tide.fail_effect(p_effect_id, p_token, p_error, p_permanent);
        UPDATE tide.alert_channel c SET last_error = tide._clip(p_error, 1000), last_error_at = now()
         WHERE c.owner = e.owner AND c.name = e.channel;
        RAISE LOG 'pg_tide: delivery=% effect_id=% channel=% attempt=% error=%', next_state, p_effect_id,
            tide._logfmt(e.channel), e.attempts, tide._logfmt(p_error);
    END IF;
    INSERT INTO tide.delivery_count AS d (owner, channel, outcome, value)
    SELECT e.owner, e.channel, o.outcome, 1
      FROM unnest(CASE WHEN p_error IS NULL THEN ARRAY['sent']
                       WHEN next_state = 'dead' THEN ARRAY['failed', 'dead']
                       ELSE ARRAY['failed'] END) AS o(outcome)
    ON CONFLICT (owner, channel, outcome) DO UPDATE SET value = d.value + 1;
    RETURN next_state;
END
$$;
COMMENT ON FUNCTION tide._delivery_done(bigint, bigint, text, boolean) IS
    'Internal: records the outcome of one send by the delivery worker: delivered, or failed (retried after a backoff, dead after max_attempts or when permanent).';
REVOKE EXECUTE ON FUNCTION tide._delivery_done(bigint, bigint, text, boolean) FROM PUBLIC;

DROP FUNCTION tide.create_channel(text, text, jsonb, text);
CREATE FUNCTION tide.create_channel(name text, kind text, config jsonb, alerts text DEFAULT 'warning') RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._channel(create_channel.name);
    IF create_channel.kind IS NULL OR create_channel.kind NOT IN ('webhook', 'email') THEN
        RAISE EXCEPTION 'unknown channel kind %', coalesce(quote_literal(left(create_channel.kind, 40)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'kind is webhook (an HTTP POST of JSON: Slack, Mattermost, Discord or your own) or email (SMTP)';
    END IF;
    PERFORM tide._channel_config(create_channel.kind, create_channel.config);
    INSERT INTO tide.alert_channel AS c (name, kind, config, alerts, owner)
    VALUES (create_channel.name, create_channel.kind, create_channel.config,
            CASE WHEN create_channel.alerts IS NOT NULL THEN tide._severity(create_channel.alerts, 'alerts') END, tide._caller())
    ON CONFLICT ON CONSTRAINT alert_channel_pkey DO UPDATE
       SET kind = EXCLUDED.kind, config = EXCLUDED.config, alerts = EXCLUDED.alerts, last_error = NULL, last_error_at = NULL;
    RETURN create_channel.name;
END
$$;
COMMENT ON FUNCTION tide.create_channel(text, text, jsonb, text) IS
    'create_channel(name, kind, config, alerts => ''warning''): a channel pg_tide''s delivery worker sends alerts to: kind webhook (config url, secret for an HMAC-SHA256 X-Tide-Signature, format chat or json) or email (config host, port, tls, username, password, from, to, ca_cert). alerts is the lowest severity routed to it (info, warning, critical; by default warning), NULL for none. Creating an existing name changes it.';

CREATE  FUNCTION tide."test_channel"(
	"name" TEXT /* Option < & str > */
) RETURNS TABLE (
	"channel" TEXT,  /* String */
	"status" TEXT,  /* String */
	"took" interval,  /* Option < pgrx :: datum :: Interval > */
	"error" TEXT  /* Option < String > */
)
VOLATILE  
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'test_channel_wrapper';
COMMENT ON FUNCTION tide.test_channel(text) IS
    'test_channel(name): sends a test message to one of your channels through pg_tide''s delivery worker, as an alert would go, and returns what the receiver answered: status (delivered, failed, refused, no answer), took, error (without secrets). Nothing is recorded. In the database pg_tide serves.';

-- tide.monitor takes start_deadline.
DROP FUNCTION tide.monitor(text, interval, text);
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

-- A claim notes its queue (a late start's cause: no worker claimed lately).
DROP FUNCTION tide._claim(tide.executor, text, text, integer, interval, boolean, bigint);
CREATE FUNCTION tide._claim(p_executor tide.executor, p_queue text, p_worker text, p_n integer, p_lease interval,
                            p_online_only boolean DEFAULT false, p_after bigint DEFAULT NULL)
RETURNS TABLE (run_id bigint, lease_token bigint, lease_expires_at timestamptz, task text, args jsonb,
               window_start timestamptz, window_end timestamptz, biz_date date, attempt integer,
               version integer, checkpoint jsonb, trigger tide.run_trigger, dedupe_key text,
               priority integer, owner name, timeout interval, topic text, event_key text, payload jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- Generic plans always: re-planning the claim statements for each call cost more than running
-- them (measured: batch 1 went from 43% to 62% of the baseline).
SET plan_cache_mode = force_generic_plan
-- A kept plan made while tide.pending was vacuumed empty scanned and sorted the whole table at
-- every claim once a backlog arrived (an SQL executor's pickup went from 2 ms to 600 ms with
-- 160,000 runs of an external queue waiting, until autovacuum analyzed the table; 18 ms with
-- this setting). The claim indexes serve every candidate query in order; a sequential scan
-- never does much better than them, on a table that can grow at any moment.
SET enable_seqscan = off
-- Candidates are taken with SKIP LOCKED; this bounds any other wait (on a row a role's open
-- transaction holds), so that one role's lock never stalls everyone's claims.
SET lock_timeout = '1s'
AS $$
DECLARE
    ids bigint[];
    owners name[];
    queues text[];
    gated boolean;
    candidates bigint[];
    -- The admitted runs whose queues counted them (tide._queue_admit).
    counted_ids bigint[] := '{}';
    token bigint;
    ignored text;
    why text;
    -- A role claims the runs of the roles it acts for (its own, its teams'), and of the queues
    -- granted to it (tide.grant('claim', ...)); a superuser, tide_admin (and pg_tide's
    -- executors) any role's.
    owners_ok name[] := tide._acts_for();
    g_owners name[];
    g_queues text[];
    is_sql boolean := p_executor = 'sql';
    -- Whether a queue this claim may take from has limits (tide.queue): then its candidates
    -- go through tide._queue_admit.
    limited boolean;
    -- Whether this claim woke runs parked for room already (tide._wake_parked).
    rechecked boolean := false;
    n_claimed bigint;
BEGIN
    IF p_queue IS NULL AND p_executor = 'external' THEN
        RAISE EXCEPTION 'queue must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'pass the queue your tasks use, such as ''default''';
    END IF;
    IF p_queue IS NOT NULL THEN
        PERFORM tide._text_arg('queue', p_queue, 63, 'pass the queue your tasks use, such as ''default''');
    END IF;
    IF p_worker IS NOT NULL THEN
        PERFORM tide._text_arg('worker', p_worker, 200, 'name the worker, such as its host and pid');
    END IF;
    why := 'claimed by ' || coalesce(p_worker, 'a worker')
           || CASE WHEN p_after IS NOT NULL THEN ', committed with the end of run ' || p_after ELSE '' END;
    IF p_n IS NULL OR p_n < 1 OR p_n > 1000 THEN
        RAISE EXCEPTION 'n must be between 1 and 1000, got %', coalesce(p_n::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'claim at most 1000 runs at a time; batches of 10 to 100 work well';
    END IF;
    PERFORM tide._bounded('lease', p_lease, false);
    IF NOT is_sql THEN
        -- Noted whatever it finds: a late run of this queue then is not for want of workers.
        PERFORM tide._queue_claimed(p_queue);
    END IF;
    IF owners_ok IS NOT NULL THEN
        SELECT array_agg(g.owner), array_agg(g.object) INTO g_owners, g_queues FROM tide._granted('claim') g;
    END IF;
    limited := EXISTS (SELECT 1 FROM tide.queue q
                        WHERE (p_queue IS NULL OR q.name = p_queue)
                          AND (owners_ok IS NULL OR q.owner = ANY (owners_ok) OR q.owner = ANY (g_owners)));
    -- An executor's claim committed with the end of its previous run (p_after) is made before
    -- that run's queue room is given back (at the commit): when that run's own queue has limits,
    -- the run it would take could be parked for want of the very room being freed. The executor
    -- claims again after the commit instead. Other queues' limits do not matter here: their
    -- room is not waiting for this commit (their candidates are admitted as in any claim).
    IF p_after IS NOT NULL AND limited
       AND EXISTS (SELECT 1 FROM tide.run r JOIN tide.queue q ON q.owner = r.owner AND q.name = r.queue
                    WHERE r.run_id = p_after) THEN
        RETURN;
    END IF;
    -- The candidates are fixed in an array first: a LIMIT subquery under FOR UPDATE SKIP LOCKED
    -- may be re-evaluated and claim more rows than asked. Each candidate's run is locked with
    -- its line, and one whose run is locked is skipped: a change of a run in progress (run
    -- control, a rule change holding it, R12.3) holds the run and then writes its line, so a
    -- claim that held the line and waited for the run would deadlock with it. When every candidate has to wait (it
    -- is parked, out of the candidates, by tide._admit) the next ones are looked at, a few
    -- rounds at most: a claimer must not come back empty while other runs are claimable.
    FOR round IN 1..10 LOOP
        IF p_queue IS NULL THEN
            SELECT array_agg(c.run_id), array_agg(c.owner), array_agg(c.queue), bool_or(c.gated)
              INTO ids, owners, queues, gated FROM (
                SELECT p.run_id, p.owner, p.queue, p.gated FROM tide.pending p JOIN tide.run r ON r.run_id = p.run_id
                 -- Without a queue, the claimer is an SQL executor (external workers must name
                 -- one, above): written out, so that the plan kept for any executor uses the
                 -- index of SQL runs, pending_claim_any_idx.
                 WHERE p.state = 'ready' AND NOT p.parked AND p.executor = 'sql'
                   AND (p.due_at IS NULL OR p.due_at <= statement_timestamp())
                   AND (owners_ok IS NULL OR p.owner = ANY (owners_ok)
                        OR (g_owners IS NOT NULL AND (p.owner, p.queue) IN (SELECT u.o, u.q FROM unnest(g_owners, g_queues) u(o, q))))
                   -- Backfill runs claim at priority - 10000, after every online run; one
                   -- executor keeps to online runs.
                   AND (NOT p_online_only OR p.priority > -5000)
                 ORDER BY p.priority DESC, p.run_id
                 LIMIT p_n FOR UPDATE OF p, r SKIP LOCKED) c;
        ELSE
            SELECT array_agg(c.run_id), array_agg(c.owner), array_agg(c.queue), bool_or(c.gated)
              INTO ids, owners, queues, gated FROM (
                SELECT p.run_id, p.owner, p.queue, p.gated FROM tide.pending p JOIN tide.run r ON r.run_id = p.run_id
                 WHERE p.state = 'ready' AND NOT p.parked AND p.executor = p_executor AND p.queue = p_queue
                   AND (p.due_at IS NULL OR p.due_at <= statement_timestamp())
                   AND (owners_ok IS NULL OR p.owner = ANY (owners_ok)
                        OR (g_owners IS NOT NULL AND (p.owner, p.queue) IN (SELECT u.o, u.q FROM unnest(g_owners, g_queues) u(o, q))))
                 ORDER BY p.priority DESC, p.run_id
                 LIMIT p_n FOR UPDATE OF p, r SKIP LOCKED) c;
        END IF;
        IF ids IS NULL THEN
            -- Nothing claimable: runs parked for room in a queue that has room now missed their
            -- wake-up (tide._wake_parked); they are woken and looked at once more.
            IF limited AND NOT rechecked AND tide._wake_parked(p_executor, p_queue, owners_ok, g_owners, g_queues) > 0 THEN
                rechecked := true;
                CONTINUE;
            END IF;
            RETURN;
        END IF;
        IF limited THEN
            -- Queue limits first (paused, max_concurrency, rate): the candidates they hold back
            -- are parked, and the next ones are looked at.
            SELECT a.admitted, a.counted INTO candidates, counted_ids FROM tide._queue_admit(ids, owners, queues) a;
            IF cardinality(candidates) = 0 THEN
                -- All parked: nothing of this round is claimed (if it was the last round, the
                -- claim returns nothing).
                ids := '{}';
                CONTINUE;
            END IF;
            IF cardinality(candidates) < cardinality(ids) THEN
                ids := candidates;
                SELECT array_agg(p.owner ORDER BY u.n), bool_or(p.gated) INTO owners, gated
                  FROM unnest(ids) WITH ORDINALITY AS u(id, n) JOIN tide.pending p ON p.run_id = u.id;
            END IF;
        END IF;
        -- One fencing token per claim: larger than any earlier claim's, so a run claimed again is
        -- never completed with an older one.
        token := coalesce(token, nextval('tide.lease_token_seq'));
        EXIT WHEN NOT gated;
        -- Serial groups, overlap, concurrency and locks decide which may go (sql/locks.sql).
        candidates := ids;
        ids := tide._admit(candidates, token, p_executor, p_lease);
        IF cardinality(counted_ids) > 0 AND cardinality(ids) < cardinality(candidates) THEN
            -- The room reserved for the candidates that must wait after all goes back at once.
            PERFORM tide._queue_unreserve(g.owner, g.queue, g.n::integer)
               FROM (SELECT p.owner, p.queue, count(*) AS n FROM tide.pending p
                      WHERE p.run_id = ANY (counted_ids) AND p.run_id <> ALL (ids)
                      GROUP BY p.owner, p.queue) g;
            counted_ids := ARRAY(SELECT c FROM unnest(counted_ids) c WHERE c = ANY (ids));
        END IF;
        IF ids = candidates THEN
            EXIT;  -- all admitted, in the same order: the owners are the candidates'
        END IF;
        IF cardinality(ids) > 0 THEN
            SELECT array_agg(p.owner ORDER BY u.n) INTO owners
              FROM unnest(ids) WITH ORDINALITY AS u(id, n) JOIN tide.pending p ON p.run_id = u.id;
            EXIT;
        END IF;
        -- A candidate another claim is deciding about right now stays a candidate: looking again
        -- would only find it again.
        EXIT WHEN EXISTS (SELECT 1 FROM tide.pending p
                           WHERE p.run_id = ANY (candidates) AND p.state = 'ready' AND NOT p.parked);
    END LOOP;
    IF cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    UPDATE tide.pending p SET state = 'running', due_at = NULL, counted = p.run_id = ANY (counted_ids)
     WHERE p.run_id = ANY (ids);
    -- This path writes its own history rows below, one statement for the batch.
    ignored := set_config('tide.history', 'written', true);
    RETURN QUERY
        UPDATE tide.run r
           SET state = 'running',
               attempts = r.attempts + 1,
               tries = r.tries + 1,
               lease_owner = p_worker,
               lease_token = token,
               lease_length = l.length,
               lease_expires_at = statement_timestamp() + l.length,
               executor_pid = CASE WHEN is_sql THEN pg_backend_pid() END,
               executor_start = CASE WHEN is_sql THEN tide._backend_start() END,
               started_at = coalesce(r.started_at, statement_timestamp()),
               claimed_at = statement_timestamp(),
               run_after = NULL,
               finished_at = NULL,
               updated_at = statement_timestamp(),
               reason = why
          FROM tide.task_version v
          JOIN tide.task t ON t.task_id = v.task_id,
               LATERAL (SELECT tide._lease_length(p_executor, v.rules, p_lease) AS length) l
         WHERE r.run_id = ANY (ids) AND v.task_id = r.task_id AND v.version = r.version
        RETURNING r.run_id, r.lease_token, r.lease_expires_at, t.name, r.args, r.window_start, r.window_end,
                  r.biz_date, r.attempts, r.version, r.checkpoint, r.trigger, r.dedupe_key, r.priority, r.owner,
                  (v.rules->>'timeout')::interval, r.topic, r.event_key, r.payload;
    GET DIAGNOSTICS n_claimed = ROW_COUNT;
    ignored := set_config('tide.history', '', true);
    IF n_claimed < cardinality(ids) THEN
        -- Runs the update left: their task was deleted (with its versions) by a REPEATABLE
        -- READ transaction that could not see them (tide._sweep_gone would delete them at the
        -- next monitoring step). They are deleted now, with their lines, their locks and the
        -- room their queues counted (the trigger run_deleted), and nothing is recorded of them.
        candidates := ids;
        SELECT coalesce(array_agg(r.run_id ORDER BY u.n), '{}'), array_agg(r.owner ORDER BY u.n) INTO ids, owners
          FROM unnest(candidates) WITH ORDINALITY AS u(id, n) JOIN tide.run r ON r.run_id = u.id
         WHERE r.lease_token = token AND r.state = 'running';
        DELETE FROM tide.run r WHERE r.run_id = ANY (candidates) AND r.run_id <> ALL (ids);
        IF cardinality(ids) = 0 THEN
            RETURN;
        END IF;
    END IF;
    -- The history rows, and what they count: the tasks touched, and the wait from fire (or
    -- creation) of each run's first start.
    INSERT INTO tide.run_event (run_id, from_state, to_state, reason, owner)
    SELECT u.id, 'ready', 'running', why, u.who FROM unnest(ids, owners) AS u(id, who) ORDER BY u.id;
    WITH e AS MATERIALIZED (
        SELECT r.task_id, r.owner, r.attempts, r.started_at, r.fire_at, r.created_at
          FROM tide.run r WHERE r.run_id = ANY (ids)
    ), touched AS (
        INSERT INTO tide.task_touch (task_id, owner) SELECT DISTINCT e.task_id, e.owner FROM e
    )
    INSERT INTO tide.count_delta (task_id, metric, label, value, owner)
    SELECT e.task_id, m.metric, m.label, sum(m.value), min(e.owner)
      FROM e CROSS JOIN LATERAL tide._counts_of('running', e.attempts, NULL, NULL, e.started_at, e.fire_at, e.created_at) m
     GROUP BY 1, 2, 3;
    IF tide._log_on() THEN
        PERFORM tide._log_runs('start', ids);
    END IF;
END
$$;
COMMENT ON FUNCTION tide._claim(tide.executor, text, text, integer, interval, boolean, bigint) IS
    'Internal: the one claim path of external workers and pg_tide''s SQL executors (p_online_only: no backfill runs; p_after: the run whose end an executor commits this claim with, named in the history); returns the claim context with the run''s priority, owner and timeout. Its instants are the claim statement''s start.';
REVOKE EXECUTE ON FUNCTION tide._claim(tide.executor, text, text, integer, interval, boolean, bigint) FROM PUBLIC;

-- Stop means stop: a cancel or pause of a command a command worker runs interrupts it.
DROP FUNCTION tide._stop_run(bigint, jsonb, boolean);
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
REVOKE EXECUTE ON FUNCTION tide._stop_run(bigint, jsonb, boolean, text) FROM PUBLIC;

-- tide.schedule's warning waits for a scheduler that is starting.
DROP FUNCTION tide._scheduler_warning();
CREATE FUNCTION tide._scheduler_warning() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF tide._setting('allow_unscheduled', 'off') = 'on' THEN
        RETURN;
    END IF;
    -- This database's scheduler may be starting: the server started, or the scheduler last
    -- ticked, in the last 10 s (it was terminated or crashed: its restart time is one second). It
    -- connects within a second or two: only one still absent after three is worth a warning.
    -- One gone for longer is warned of at once (an import of many jobs does not wait for each).
    IF current_database() = tide._setting('database', 'postgres')
       AND (tide._watch()->>'alive_at')::float8 / 1000 > extract(epoch FROM clock_timestamp()) - 10 THEN
        FOR i IN 1..30 LOOP
            PERFORM pg_stat_clear_snapshot();
            EXIT WHEN EXISTS (SELECT 1 FROM pg_stat_activity a
                               WHERE a.backend_type = 'pg_tide scheduler' AND a.datname = current_database());
            PERFORM pg_sleep(0.1);
        END LOOP;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                    WHERE a.backend_type = 'pg_tide scheduler' AND a.datname = current_database()) THEN
        RAISE WARNING 'no pg_tide scheduler is running for database "%": the task will not fire', current_database()
            USING HINT = format('pg_tide serves the database pg_tide.database names (now "%s"); check that pg_tide is in shared_preload_libraries and see the server log',
                                tide._setting('database', 'postgres'));
    ELSIF tide._setting('enabled', 'on') = 'off' THEN
        RAISE WARNING 'pg_tide.enabled is off: the task will not fire until it is turned on'
            USING HINT = 'ALTER SYSTEM SET pg_tide.enabled = on; SELECT pg_reload_conf();';
    END IF;
END
$$;
COMMENT ON FUNCTION tide._scheduler_warning() IS
    'Internal: the WARNING tide.schedule and tide.alter give when no scheduler runs for this database (one that is starting, with the server or after a crash, is waited for, up to 3 s) or pg_tide.enabled is off.';
REVOKE EXECUTE ON FUNCTION tide._scheduler_warning() FROM PUBLIC;

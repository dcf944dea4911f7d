-- The SQL executor's run (tide._execute: the task's command, sealed as its owner, in the run's
-- transaction), the fallback when an event task's command cannot run here, and the command
-- workers' side of a run (top-level commands, commands in other databases:
-- src/workers/command.rs).

-- The SQL executor's body for one claimed run, called by a pg_tide executor (a superuser).
-- The command runs sealed as the task's owner (between tide._seal_begin and tide._seal_end,
-- src/security/sealed.rs), in a subtransaction together with its completion: a run whose completion is
-- refused (its lease was lost meanwhile) leaves no effects, and an error is recorded as a
-- failed attempt.
--
-- A long task's command does one batch: it returns the next checkpoint (jsonb), committed with
-- the batch's work, or NULL when done. Each call is one batch in its own transaction; the
-- result 'more <ms>' asks the executor to call again after that many milliseconds (rate or
-- pause); a wait of 2 seconds or more puts the run back in line instead (waiting until then),
-- so that no executor is held for it. A pause or cancel asked for is taken up before the next
-- batch.
CREATE FUNCTION tide._execute(p_run_id bigint, p_token bigint) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- Generic plans for the run's bookkeeping, as tide._claim and tide.complete_run have: the
-- executors' sessions plan every statement for each execution otherwise (src/workers/mod.rs), and
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

-- The fallback scan's rows (R10.2: no event is lost even when its emit was): each key becomes
-- an event run of the task with the key as event key and dedupe key, unless the task has a run
-- of that dedupe key already. Returns what the scan found, for the scan run's result; the
-- events_lost alert reads it.
CREATE FUNCTION tide._fallback_emit(r tide.run, p_rows jsonb) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t tide.task;
    topic text;
    keys text[];
    ids bigint[];
    bad integer;
BEGIN
    -- KEY SHARE: the task cannot be deleted under its new runs (tide.run has no foreign key).
    SELECT * INTO t FROM tide.task x WHERE x.task_id = r.task_id FOR KEY SHARE;
    IF NOT FOUND THEN
        PERFORM tide.business_error(format('task %s was deleted', r.task_id));
    END IF;
    topic := t.topics[1];
    SELECT count(*) FILTER (WHERE jsonb_typeof(e.item) <> 'object' OR coalesce(e.item->>'key', '') = ''
                                  OR length(e.item->>'key') > 1000 OR e.item->>'key' LIKE '#%'
                                  OR (e.item ? 'payload' AND jsonb_typeof(e.item->'payload') NOT IN ('object', 'null')))
      INTO bad FROM jsonb_array_elements(p_rows) AS e(item);
    IF bad > 0 THEN
        PERFORM tide.business_error(format('the fallback query returned %s rows without a usable key (a non-empty text of at most 1000 characters, not starting with #: those are pg_tide''s own) or with a payload that is not a JSON object', bad));
    END IF;
    WITH found AS (
        SELECT DISTINCT ON (e.item->>'key') e.item->>'key' AS key, coalesce(nullif(e.item->'payload', 'null'), '{}') AS payload, e.n
          FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS e(item, n)
         ORDER BY e.item->>'key', e.n
    ), made AS (
        -- The event runs that were never emitted, with the fields of tide.new_run, made by the
        -- one creator (tide._create_runs): a key with a run already creates nothing.
        SELECT t.task_id, 'event'::tide.run_trigger AS trigger, t.version, tide._open_state(tide._task_rules(t)) AS state,
               format('event on %s (key %s) found by the fallback scan of run %s: it was never emitted', topic, f.key, r.run_id) AS reason,
               tide._executor_of(t.command) AS executor, t.queue, t.priority, t.args, t.owner,
               NULL::timestamptz AS fire_at, NULL::timestamptz AS window_start, NULL::timestamptz AS window_end,
               NULL::date AS biz_date, f.key AS dedupe_key, NULL::tide.skip_reason AS skip_reason,
               NULL::timestamptz AS run_after, NULL::timestamptz AS ready_deadline, topic, f.key AS event_key,
               f.payload, g.gate, g.lock_key, g.gated
          FROM found f
         CROSS JOIN LATERAL tide._gating_of(t.task_id, t.version, t.args, f.payload, f.key, NULL, NULL) g
         ORDER BY f.n
    )
    SELECT tide._create_runs(array_agg(m::tide.new_run), false) INTO ids FROM made m;
    SELECT array_agg(x.event_key ORDER BY x.run_id) INTO keys FROM tide.run x WHERE x.run_id = ANY (ids);
    RETURN jsonb_build_object('scanned', jsonb_array_length(p_rows), 'missing', coalesce(cardinality(keys), 0),
                              'missing_keys', to_jsonb(coalesce(keys[1:100], '{}')));
END
$$;
COMMENT ON FUNCTION tide._fallback_emit(tide.run, jsonb) IS
    'Internal: turns the rows of a fallback scan into the event runs that were never emitted (key as event and dedupe key); returns scanned, missing and the missing keys (the first 100).';

-- A command run by a worker of its own (src/workers/command.rs: top-level commands, and commands of
-- tasks that run in another database) starts: the command, as whom, where, how and for how
-- long, if the claim still holds the run. A database the owner cannot reach fails the run here,
-- with the error the server would give, and answers nothing.
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

-- Why a task's owner cannot run commands in a database (one row), or nothing: checked when a
-- task names the database (tide.schedule, tide.alter) and again at every run. The messages are
-- the server's own where it has one.
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

-- A command worker's outcome, recorded by whoever collects it: completed (with its statement
-- count and last command tag), stopped as asked (a cancel or pause interrupted it), or failed by
-- the error's SQLSTATE (transient: retried; business: dead letter), unless the run was taken back
-- meanwhile.
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

-- No command worker was free for a claimed run (the limits, or max_worker_processes): it goes
-- back in line for two seconds, without counting as a try, and its locks go back meanwhile.
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

-- Whether a claim still holds its run (running, under its lease token), locking the run.
CREATE FUNCTION tide._still_held(p_run_id bigint, p_token bigint) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM 1 FROM tide.run x
     WHERE x.run_id = p_run_id AND x.lease_token = p_token AND x.state = 'running' FOR UPDATE;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION tide._still_held(bigint, bigint) IS 'Internal: whether a claim still holds its run (locked for the caller''s change).';

-- A task's timeout as the milliseconds of a statement timeout (at most 7 days: the bound
-- tide.schedule enforces keeps it inside an int). No timeout ('0') is the largest int, which
-- tide._seal_begin and the command workers read as "the owner's own statement_timeout"
-- (src/security/sealed.rs), and which least(..., cap) bounds like any long timeout.
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

-- The executor could not finish a run's transaction (its bookkeeping failed): the attempt ends
-- now, as lost, instead of when its lease expires.
CREATE FUNCTION tide._abandon(p_run_id bigint, p_token bigint, p_error text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5s'
AS $$
BEGIN
    IF tide._still_held(p_run_id, p_token) THEN
        IF (SELECT x.control FROM tide.run x WHERE x.run_id = p_run_id) IS NOT NULL THEN
            -- Interrupted by tide.cancel_run or tide.pause_run outside the command itself.
            PERFORM tide._stop_run(p_run_id, NULL, true);
            RETURN;
        END IF;
        PERFORM tide._fail(p_run_id, format('the executor could not finish the run: %s', p_error),
                           'transient', NULL, 'lost', now());
    END IF;
END
$$;
COMMENT ON FUNCTION tide._abandon(bigint, bigint, text) IS
    'Internal: ends an attempt whose executor could not finish its transaction, as lost.';

-- pg_tide 0.2.2 to 0.2.3: fair share between roles. The executors serve roles fairly (fewest
-- busy first; priority orders a role's own runs), each role has limits (tide.role_limit,
-- tide.set_role_limits: executors, tasks, fastest_schedule, bulk), NOTIFY is a hint that never
-- makes a commit fail and names no role's objects, claims never pay for JIT, and pg_tide follows
-- a role's end (DROP ROLE refused while it owns pg_tide rows, REASSIGN OWNED and DROP OWNED
-- applied to them, tide.owned_by / tide.reassign_owned / tide.drop_owned, unschedule with
-- owner, the alert owner_gone). Small input defects are refused with 22023.
-- Run by ALTER EXTENSION pg_tide UPDATE; the upgrade tier (pg_test/tests/upgrade.rs) checks that
-- the schema it leaves is the one a fresh CREATE EXTENSION makes. Functions whose body changed are
-- dropped and created again rather than replaced (pgspot's PS002); trigger functions with their
-- triggers.
\echo Use "ALTER EXTENSION pg_tide UPDATE TO '0.2.3'" to load this file. \quit
SET LOCAL search_path = pg_catalog, pg_temp;

-- A task whose owner no longer exists.
ALTER TYPE tide.alert_kind ADD VALUE 'owner_gone';

-- Claims take one owner's runs at a time (priority orders an owner's runs only); the executors
-- count what each owner occupies.
DROP INDEX tide.pending_claim_idx;
DROP INDEX tide.pending_claim_any_idx;
CREATE INDEX pending_claim_idx ON tide.pending (executor, queue, owner, priority DESC, run_id) WHERE state = 'ready' AND NOT parked;
CREATE INDEX pending_claim_any_idx ON tide.pending (owner, priority DESC, run_id) WHERE state = 'ready' AND NOT parked AND executor = 'sql';
CREATE INDEX pending_busy_idx ON tide.pending (owner) WHERE state = 'running' AND executor = 'sql';

-- Each role's limits.
CREATE TABLE tide.role_limit (
    role             name PRIMARY KEY,
    executors        integer CHECK (executors BETWEEN 1 AND 64),
    tasks            integer CHECK (tasks BETWEEN 0 AND 1000000),
    fastest_schedule interval CHECK (fastest_schedule >= interval '1 second' AND fastest_schedule <= interval '31 days'),
    bulk             integer CHECK (bulk BETWEEN 1 AND 100000),
    set_by           name NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE tide.role_limit IS
    'Limits of one role (tide.set_role_limits): the most executors its runs occupy at once, the most tasks it owns, the shortest time between two fires of its tasks, the most runs or events one bulk call makes. NULL: the server''s default (see docs/security.md).';
ALTER TABLE tide.role_limit ENABLE ROW LEVEL SECURITY;
CREATE POLICY role_limit_read ON tide.role_limit FOR SELECT USING (tide._visible(role));
GRANT SELECT ON tide.role_limit TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.role_limit', '');

CREATE INDEX task_executor_owner_idx ON tide.task (owner) WHERE NOT paused AND command IS NOT NULL;

-- New functions.
CREATE  FUNCTION tide."_share_lock"(
	"wait" bool /* bool */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE  
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'share_lock_wrapper';
COMMENT ON FUNCTION tide._share_lock(boolean) IS
    'Internal: the executors'' choice lock, until the end of the transaction (without wait, only if free at once): whose run an executor takes next is chosen and claimed under it (sql/share.sql). No SQL advisory lock function can take it.';

CREATE  FUNCTION tide."_shortest_gap"(
	"schedule" TEXT, /* Option < & str > */
	"tz" TEXT, /* Option < & str > */
	"dst_gap" TEXT, /* Option < & str > */
	"dst_overlap" TEXT /* Option < & str > */
) RETURNS interval /* Option < Interval > */
STABLE PARALLEL SAFE  
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'fire_shortest_gap_wrapper';
COMMENT ON FUNCTION tide._shortest_gap(text, text, text, text) IS
    'Internal: the shortest gap between two consecutive fires of a schedule (a role''s limit fastest_schedule is checked against it).';

CREATE  FUNCTION tide."_notify"(
	"channel" TEXT, /* & str */
	"payload" TEXT /* & str */
) RETURNS bool /* bool */
STRICT VOLATILE PARALLEL UNSAFE  
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'notify_hint_wrapper';
COMMENT ON FUNCTION tide._notify(text, text) IS
    'Internal: pg_notify(channel, payload) unless PostgreSQL''s notification queue is half full or more (then nothing: a notification of pg_tide''s is a hint, never a dependency); true if it notified.';

CREATE FUNCTION tide.set_role_limits(role name, executors integer DEFAULT NULL, tasks integer DEFAULT NULL,
                                     fastest_schedule interval DEFAULT NULL, bulk integer DEFAULT NULL)
RETURNS tide.role_limit
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    out tide.role_limit;
BEGIN
    IF tide._acts_for() IS NOT NULL THEN
        RAISE EXCEPTION 'permission denied to set the limits of role %', coalesce(quote_ident(set_role_limits.role), 'NULL')
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'a superuser or a member of tide_admin sets a role''s limits';
    END IF;
    IF set_role_limits.role IS NULL THEN
        RAISE EXCEPTION 'role must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'name the role whose limits to set, such as tide.set_role_limits(''alice'', tasks => 200)';
    END IF;
    IF to_regrole(quote_ident(set_role_limits.role)) IS NULL THEN
        RAISE EXCEPTION 'role "%" does not exist', set_role_limits.role USING ERRCODE = 'undefined_object',
            HINT = 'name an existing role (SELECT rolname FROM pg_roles)';
    END IF;
    IF set_role_limits.executors IS NOT NULL AND set_role_limits.executors NOT BETWEEN 1 AND 64 THEN
        RAISE EXCEPTION 'executors must be between 1 and 64, got %', set_role_limits.executors
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'the most executors the role''s runs occupy at once; NULL for the default (all but one while another role has work)';
    END IF;
    IF set_role_limits.tasks IS NOT NULL AND set_role_limits.tasks NOT BETWEEN 0 AND 1000000 THEN
        RAISE EXCEPTION 'tasks must be between 0 and 1000000, got %', set_role_limits.tasks
            USING ERRCODE = 'invalid_parameter_value', HINT = 'the most tasks the role owns; NULL for pg_tide.role_max_tasks';
    END IF;
    -- One sign, 1 second to 31 days (22023 otherwise).
    PERFORM tide._bounded('fastest_schedule', set_role_limits.fastest_schedule, false);
    IF set_role_limits.bulk IS NOT NULL AND set_role_limits.bulk NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'bulk must be between 1 and 100000, got %', set_role_limits.bulk
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'the most runs one tide.enqueue or events one tide.emit_many makes; NULL for pg_tide.role_max_bulk';
    END IF;
    IF num_nulls(set_role_limits.executors, set_role_limits.tasks, set_role_limits.fastest_schedule, set_role_limits.bulk) = 4 THEN
        DELETE FROM tide.role_limit l WHERE l.role = set_role_limits.role;
        RETURN ROW(set_role_limits.role, NULL, NULL, NULL, NULL, tide._caller(), now())::tide.role_limit;
    END IF;
    INSERT INTO tide.role_limit AS l (role, executors, tasks, fastest_schedule, bulk, set_by)
    VALUES (set_role_limits.role, set_role_limits.executors, set_role_limits.tasks,
            set_role_limits.fastest_schedule, set_role_limits.bulk, tide._caller())
    ON CONFLICT ON CONSTRAINT role_limit_pkey DO UPDATE
       SET executors = EXCLUDED.executors, tasks = EXCLUDED.tasks, fastest_schedule = EXCLUDED.fastest_schedule,
           bulk = EXCLUDED.bulk, set_by = EXCLUDED.set_by, updated_at = now()
    RETURNING l.* INTO out;
    -- Runs held back by a lower limit than this one may go now.
    PERFORM tide._wake(false);
    RETURN out;
END
$$;
COMMENT ON FUNCTION tide.set_role_limits(name, integer, integer, interval, integer) IS
    'set_role_limits(role, executors => NULL, tasks => NULL, fastest_schedule => NULL, bulk => NULL): sets every limit of a role (superuser or tide_admin): the most executors its runs occupy at once, the most tasks it owns, the shortest time between two fires of its tasks, the most runs or events one bulk call makes. NULL: the server''s default; all NULL removes the role''s row. Returns the row.';

CREATE FUNCTION tide._role_limits(p_role name, OUT tasks integer, OUT fastest_schedule interval, OUT bulk integer)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(l.tasks, tide._setting('role_max_tasks', '1000')::integer),
           coalesce(l.fastest_schedule, tide._setting('role_fastest_schedule', '1s')::interval),
           coalesce(l.bulk, tide._setting('role_max_bulk', '100000')::integer)
      FROM pg_catalog.pg_roles r LEFT JOIN tide.role_limit l ON l.role = r.rolname
     WHERE r.rolname = p_role AND NOT r.rolsuper
$$;
COMMENT ON FUNCTION tide._role_limits(name) IS
    'Internal: a role''s limits on what it makes (tasks, fastest_schedule, bulk): its tide.role_limit row, else the server''s settings; no row for a superuser.';

CREATE FUNCTION tide._check_role_limits(t tide.task) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lim record;
    owned bigint;
    gap interval;
BEGIN
    SELECT * INTO lim FROM tide._role_limits(t.owner);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF t.created_at = now() THEN
        SELECT count(*) INTO owned FROM tide.task x WHERE x.owner = t.owner;
        IF owned > lim.tasks THEN
            RAISE EXCEPTION 'task "%": role % owns % task(s) already, its limit tasks is %', t.name, quote_ident(t.owner), owned - 1, lim.tasks
                USING ERRCODE = 'program_limit_exceeded',
                      HINT = format('unschedule tasks it no longer needs, or ask a superuser to raise the limit: SELECT tide.set_role_limits(%L, tasks => %s) (default: pg_tide.role_max_tasks)',
                                    t.owner, greatest(lim.tasks * 2, 10));
        END IF;
    END IF;
    gap := tide._shortest_gap(t.schedule, t.tz, t.dst_gap::text, t.dst_overlap::text);
    IF gap < lim.fastest_schedule THEN
        RAISE EXCEPTION 'task "%": schedule % fires % apart at its fastest, more often than role %''s limit fastest_schedule (%)',
            t.name, quote_literal(t.schedule), gap, quote_ident(t.owner), lim.fastest_schedule
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = format('schedule it at most every %s, or ask a superuser to allow it: SELECT tide.set_role_limits(%L, fastest_schedule => %L) (default: pg_tide.role_fastest_schedule)',
                                lim.fastest_schedule, t.owner, gap::text);
    END IF;
END
$$;
COMMENT ON FUNCTION tide._check_role_limits(tide.task) IS
    'Internal: refuses a task past its owner''s limits tasks and fastest_schedule (54000, naming the limit and how to raise it).';

CREATE FUNCTION tide._check_bulk(p_n bigint, p_function text) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    most integer;
BEGIN
    IF p_n <= 1 THEN
        RETURN;
    END IF;
    SELECT l.bulk INTO most FROM tide._role_limits(tide._caller()) l;
    IF p_n > most THEN
        RAISE EXCEPTION '%: % in one call, more than role %''s limit bulk (%)', p_function, p_n, quote_ident(tide._caller()), most
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = format('make it in calls of up to %s, or ask a superuser to raise the limit: SELECT tide.set_role_limits(%L, bulk => %s) (default: pg_tide.role_max_bulk)',
                                most, tide._caller(), least(100000, most * 2));
    END IF;
END
$$;
COMMENT ON FUNCTION tide._check_bulk(bigint, text) IS
    'Internal: refuses a bulk enqueue or emit larger than the caller''s limit bulk (54000, naming the limit and how to raise it).';

CREATE FUNCTION tide._executor_cap(p_owner name, p_others boolean) RETURNS integer
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer := tide._setting('executors', '2')::integer;
    explicit integer;
BEGIN
    SELECT l.executors INTO explicit FROM tide.role_limit l WHERE l.role = p_owner;
    IF explicit IS NOT NULL THEN
        RETURN explicit;
    END IF;
    IF n <= 1 THEN
        RETURN greatest(n, 1);
    END IF;
    -- Another owner of an active task the executors run: the lowest and the highest owner of
    -- one (two probes of task_executor_owner_idx) tell.
    IF p_others
       OR (SELECT t.owner FROM tide.task t WHERE NOT t.paused AND t.command IS NOT NULL
            ORDER BY t.owner LIMIT 1) <> p_owner
       OR (SELECT t.owner FROM tide.task t WHERE NOT t.paused AND t.command IS NOT NULL
            ORDER BY t.owner DESC LIMIT 1) <> p_owner THEN
        RETURN n - 1;
    END IF;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._executor_cap(name, boolean) IS
    'Internal: the most executors a role''s runs may occupy at once: its limit executors, else all but one while another role has work for them (p_others: a ready or running run of another role), else all.';

CREATE FUNCTION tide._executors_held() RETURNS TABLE (owner name, n bigint)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p.owner, count(*) FROM tide.pending p
      JOIN tide.run r ON r.run_id = p.run_id
      JOIN tide.task_version v ON v.task_id = r.task_id AND v.version = r.version
     WHERE p.state = 'running' AND p.executor = 'sql'
       AND NOT coalesce((v.rules->>'top_level')::boolean, false) AND v.rules->>'database' IS NULL
     GROUP BY p.owner
$$;
COMMENT ON FUNCTION tide._executors_held() IS
    'Internal: the executors each role''s runs occupy now (running runs of the executors, but for those a command worker runs).';

CREATE FUNCTION tide._executor_turn(p_owners_ok name[], p_g_owners name[]) RETURNS name[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    ready name[];
    busy_owners name[];
    busy_n bigint[];
    out name[] := '{}';
    rec record;
BEGIN
    -- The roles with ready runs for the executors: a loose scan of pending_claim_any_idx, one
    -- probe per role, whatever their backlogs (ORDER BY ... LIMIT 1: min() of a name is min()
    -- of text, which no index serves).
    WITH RECURSIVE o(owner) AS (
        (SELECT p.owner FROM tide.pending p WHERE p.state = 'ready' AND NOT p.parked AND p.executor = 'sql'
          ORDER BY p.owner LIMIT 1)
        UNION ALL
        SELECT (SELECT p.owner FROM tide.pending p
                 WHERE p.state = 'ready' AND NOT p.parked AND p.executor = 'sql' AND p.owner > o.owner
                 ORDER BY p.owner LIMIT 1)
          FROM o WHERE o.owner IS NOT NULL
    )
    SELECT coalesce(array_agg(o.owner), '{}') INTO ready FROM o
     WHERE o.owner IS NOT NULL
       AND (p_owners_ok IS NULL OR o.owner = ANY (p_owners_ok) OR o.owner = ANY (p_g_owners));
    IF cardinality(ready) = 0 THEN
        RETURN ready;
    END IF;
    SELECT coalesce(array_agg(b.owner), '{}'), coalesce(array_agg(b.n), '{}') INTO busy_owners, busy_n
      FROM tide._executors_held() b;
    FOR rec IN SELECT u.o AS owner, coalesce(b.n, 0) AS n
                 FROM unnest(ready) u(o) LEFT JOIN unnest(busy_owners, busy_n) b(o, n) ON b.o = u.o
                ORDER BY 2, random() LOOP
        -- Every role may occupy one executor; past it, its limit decides. Another role has work
        -- when it has a ready or running run (the rest, an active task, tide._executor_cap asks).
        IF rec.n >= 1 AND rec.n >= tide._executor_cap(
               rec.owner, cardinality(ready) > 1 OR EXISTS (SELECT 1 FROM unnest(busy_owners) x(o) WHERE x.o <> rec.owner)) THEN
            CONTINUE;
        END IF;
        out := out || rec.owner;
    END LOOP;
    RETURN out;
END
$$;
COMMENT ON FUNCTION tide._executor_turn(name[], name[]) IS
    'Internal: the roles whose ready runs a free executor looks at, in turn: fewest occupied executors first, ties at random, none at its limit executors (sql/share.sql).';

CREATE FUNCTION tide._owner_tables() RETURNS SETOF regclass
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.oid::regclass FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
     WHERE c.relnamespace = 'tide'::regnamespace AND c.relkind = 'r' AND a.attname = 'owner' AND NOT a.attisdropped
     ORDER BY c.relname
$$;
COMMENT ON FUNCTION tide._owner_tables() IS 'Internal: pg_tide''s tables with an owner column.';

CREATE FUNCTION tide.owned_by(role name)
RETURNS TABLE (kind text, name text, detail text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF owned_by.role IS NULL THEN
        RAISE EXCEPTION 'role must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'name the role, such as tide.owned_by(''alice''); it may be a role that no longer exists';
    END IF;
    IF NOT (tide._acts_for() IS NULL OR owned_by.role = ANY (tide._acts_for())) THEN
        RAISE EXCEPTION 'permission denied to list what role % owns', quote_ident(owned_by.role)
            USING ERRCODE = 'insufficient_privilege', HINT = 'a superuser or a member of tide_admin lists any role''s objects; a role, its own';
    END IF;
    RETURN QUERY
    SELECT 'task'::text, t.name,
           concat_ws(', ', coalesce('schedule ' || quote_literal(t.schedule), 'event task'),
                     CASE WHEN t.paused THEN 'paused' END,
                     (SELECT count(*) || ' unfinished runs' FROM tide.pending p WHERE p.task_id = t.task_id HAVING count(*) > 0))
      FROM tide.task t WHERE t.owner = owned_by.role
    UNION ALL
    SELECT 'queue', q.name, NULL FROM tide.queue q WHERE q.owner = owned_by.role
    UNION ALL
    SELECT 'channel', c.name, c.kind FROM tide.alert_channel c WHERE c.owner = owned_by.role
    UNION ALL
    SELECT 'check', k.name, NULL FROM tide.check k WHERE k.owner = owned_by.role
    UNION ALL
    SELECT 'grant', g.privilege || ' ' || g.object, 'to ' || quote_ident(g.grantee) FROM tide.grant g WHERE g.owner = owned_by.role
    UNION ALL
    SELECT 'granted', g.privilege || ' ' || g.object, 'by ' || quote_ident(g.owner) FROM tide.grant g WHERE g.grantee = owned_by.role
    UNION ALL
    SELECT 'limits', l.role, concat_ws(', ', 'executors ' || l.executors, 'tasks ' || l.tasks,
                                       'fastest_schedule ' || l.fastest_schedule, 'bulk ' || l.bulk)
      FROM tide.role_limit l WHERE l.role = owned_by.role
    ORDER BY 1, 2;
END
$$;
COMMENT ON FUNCTION tide.owned_by(name) IS
    'owned_by(role): what a role owns in pg_tide (tasks with their unfinished runs, queues, channels, heartbeat checks, grants it gave and was given, its limits), one row per object; for a superuser or tide_admin any role, a role that no longer exists included.';

CREATE FUNCTION tide._reassign_owned(p_old name, p_new name) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clash record;
    tbl regclass;
    moved bigint;
    kept record;
BEGIN
    IF p_old = p_new THEN
        RETURN 0;
    END IF;
    SELECT x.kind, x.name INTO clash FROM (
        SELECT 'task' AS kind, t.name FROM tide.task t WHERE t.owner = p_old
           AND EXISTS (SELECT 1 FROM tide.task u WHERE u.owner = p_new AND u.name = t.name)
        UNION ALL
        SELECT 'queue', q.name FROM tide.queue q WHERE q.owner = p_old
           AND EXISTS (SELECT 1 FROM tide.queue u WHERE u.owner = p_new AND u.name = q.name)
        UNION ALL
        SELECT 'channel', c.name FROM tide.alert_channel c WHERE c.owner = p_old
           AND EXISTS (SELECT 1 FROM tide.alert_channel u WHERE u.owner = p_new AND u.name = c.name)
        UNION ALL
        SELECT 'check', k.name FROM tide.check k WHERE k.owner = p_old
           AND EXISTS (SELECT 1 FROM tide.check u WHERE u.owner = p_new AND u.name = k.name)) x
     ORDER BY 1, 2 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'role % already has a % named "%", as role % does', quote_ident(p_new), clash.kind, clash.name, quote_ident(p_old)
            USING ERRCODE = 'unique_violation',
                  HINT = 'rename or remove one of them first (tide.unschedule(task, owner => ...) removes a task), then reassign again';
    END IF;
    SELECT count(*) INTO moved FROM tide.task t WHERE t.owner = p_old;
    BEGIN
        FOR tbl IN SELECT * FROM tide._owner_tables() LOOP
            EXECUTE format('UPDATE %s SET owner = $2 WHERE owner = $1', tbl) USING p_old, p_new;
        END LOOP;
        UPDATE tide.grant g SET grantee = p_new WHERE g.grantee = p_old;
        -- A grant to oneself means nothing: the grants p_new gave p_old are gone with p_old.
        DELETE FROM tide.grant g WHERE g.owner = p_new AND g.grantee = p_new;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'cannot give role %''s pg_tide rows to role %: %', quote_ident(p_old), quote_ident(p_new), SQLERRM
            USING ERRCODE = 'unique_violation',
                  HINT = 'both roles have a row with the same key (a lock, a ready marker, a side effect''s dedupe key): remove one, then reassign again';
    END;
    -- The queues' running counts are kept by owner and name (src/queue_count.rs): counted
    -- again at their next claim.
    FOR kept IN SELECT x.name FROM tide.queue x WHERE x.owner = p_new LOOP
        PERFORM tide._queue_recount(p_new, kept.name);
    END LOOP;
    PERFORM tide._wake(true);
    RETURN moved;
END
$$;
COMMENT ON FUNCTION tide._reassign_owned(name, name) IS
    'Internal: REASSIGN OWNED for pg_tide''s rows (tide.reassign_owned, and REASSIGN OWNED BY in this database); returns the tasks moved.';

CREATE FUNCTION tide.reassign_owned(old_role name, new_role name) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF tide._acts_for() IS NOT NULL THEN
        RAISE EXCEPTION 'permission denied to reassign what role % owns', coalesce(quote_ident(old_role), 'NULL')
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'a superuser or a member of tide_admin reassigns; REASSIGN OWNED BY in this database does it too, for who may run it';
    END IF;
    IF old_role IS NULL OR new_role IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', CASE WHEN old_role IS NULL THEN 'old_role' ELSE 'new_role' END
            USING ERRCODE = 'null_value_not_allowed', HINT = 'such as tide.reassign_owned(''alice'', ''bob'')';
    END IF;
    IF to_regrole(quote_ident(new_role)) IS NULL THEN
        RAISE EXCEPTION 'role "%" does not exist', new_role USING ERRCODE = 'undefined_object',
            HINT = 'give the rows to an existing role (SELECT rolname FROM pg_roles)';
    END IF;
    RETURN tide._reassign_owned(old_role, new_role);
END
$$;
COMMENT ON FUNCTION tide.reassign_owned(name, name) IS
    'reassign_owned(old_role, new_role): gives every pg_tide row of old_role (a role that no longer exists included) to new_role, as REASSIGN OWNED does for catalog objects: tasks (run as new_role from their next run), runs and history, queues, channels, checks, grants. Superuser or tide_admin. Refused, writing nothing, when new_role has a task, queue, channel or check of the same name. Returns the tasks moved.';

CREATE FUNCTION tide._drop_owned(p_role name) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tbl regclass;
    dropped bigint;
BEGIN
    -- Tasks first: their runs, versions, backfills and results go with them.
    WITH gone AS (DELETE FROM tide.task t WHERE t.owner = p_role RETURNING 1)
    SELECT count(*) INTO dropped FROM gone;
    FOR tbl IN SELECT * FROM tide._owner_tables() LOOP
        EXECUTE format('DELETE FROM %s WHERE owner = $1', tbl) USING p_role;
    END LOOP;
    DELETE FROM tide.grant g WHERE g.grantee = p_role;
    DELETE FROM tide.role_limit l WHERE l.role = p_role;
    RETURN dropped;
END
$$;
COMMENT ON FUNCTION tide._drop_owned(name) IS
    'Internal: DROP OWNED for pg_tide''s rows (tide.drop_owned, and DROP OWNED BY in this database); returns the tasks removed.';

CREATE FUNCTION tide.drop_owned(role name) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF tide._acts_for() IS NOT NULL THEN
        RAISE EXCEPTION 'permission denied to remove what role % owns', coalesce(quote_ident(drop_owned.role), 'NULL')
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'a superuser or a member of tide_admin removes them; DROP OWNED BY in this database does it too, for who may run it';
    END IF;
    IF drop_owned.role IS NULL THEN
        RAISE EXCEPTION 'role must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'name the role, such as tide.drop_owned(''alice''); list its rows first with tide.owned_by(''alice'')';
    END IF;
    RETURN tide._drop_owned(drop_owned.role);
END
$$;
COMMENT ON FUNCTION tide.drop_owned(name) IS
    'drop_owned(role): removes every pg_tide row of a role (a role that no longer exists included), as DROP OWNED does for catalog objects: its tasks with their runs and history, queues, channels, checks, side effects, alerts, the grants it gave and was given, its limits. Superuser or tide_admin. Returns the tasks removed.';

CREATE FUNCTION tide._pause_orphans(p_now timestamptz) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    UPDATE tide.task t SET paused = true, paused_at = p_now
     WHERE NOT t.paused
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = t.owner);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._pause_orphans(timestamptz) IS
    'Internal: pauses every task whose owner no longer exists; the alert owner_gone says why.';

CREATE FUNCTION tide._owned_summary(p_roles name[]) RETURNS TABLE (role name, summary text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.role,
           concat_ws(', ', nullif(c.tasks, 0) || ' task(s)', nullif(c.queues, 0) || ' queue(s)',
                     nullif(c.channels, 0) || ' channel(s)', nullif(c.checks, 0) || ' heartbeat check(s)',
                     nullif(c.grants, 0) || ' grant(s)')
      FROM unnest(p_roles) AS r(role)
     CROSS JOIN LATERAL (
        SELECT (SELECT count(*) FROM tide.task x WHERE x.owner = r.role) AS tasks,
               (SELECT count(*) FROM tide.queue x WHERE x.owner = r.role) AS queues,
               (SELECT count(*) FROM tide.alert_channel x WHERE x.owner = r.role) AS channels,
               (SELECT count(*) FROM tide.check x WHERE x.owner = r.role) AS checks,
               (SELECT count(*) FROM tide.grant x WHERE x.owner = r.role OR x.grantee = r.role) AS grants) c
     WHERE c.tasks + c.queues + c.channels + c.checks + c.grants > 0
$$;
COMMENT ON FUNCTION tide._owned_summary(name[]) IS
    'Internal: what each of some roles owns in pg_tide, in words, for the roles that own anything (why DROP ROLE of them is refused).';

-- History and versions follow their task to another owner (tide.reassign_owned).
DROP TRIGGER task_version_immutable ON tide.task_version;
DROP FUNCTION tide._task_version_immutable();
CREATE FUNCTION tide._task_version_immutable() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- What a version was stays; who owns it changes with its task (tide.reassign_owned).
    IF (to_jsonb(NEW) - 'owner') = (to_jsonb(OLD) - 'owner') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'task versions are immutable'
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'change the task with tide.alter(...); that records a new version';
END
$$;
COMMENT ON FUNCTION tide._task_version_immutable() IS
    'Trigger: refuses updates of tide.task_version, but for a change of owner alone (tide.reassign_owned).';
CREATE TRIGGER task_version_immutable BEFORE UPDATE ON tide.task_version
    FOR EACH ROW EXECUTE FUNCTION tide._task_version_immutable();

DROP TRIGGER run_event_immutable ON tide.run_event;
DROP FUNCTION tide._run_event_immutable();
CREATE FUNCTION tide._run_event_immutable() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- What happened stays; whose it is changes with its task (tide.reassign_owned).
    IF (to_jsonb(NEW) - 'owner') = (to_jsonb(OLD) - 'owner') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'the run history is append-only'
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'run events are written by pg_tide; history is pruned by retention, not edited';
END
$$;
COMMENT ON FUNCTION tide._run_event_immutable() IS 'Trigger: refuses updates of tide.run_event, but for a change of owner alone (tide.reassign_owned).';
CREATE TRIGGER run_event_immutable BEFORE UPDATE ON tide.run_event
    FOR EACH ROW EXECUTE FUNCTION tide._run_event_immutable();

-- Changed functions.
DROP FUNCTION tide.unschedule(text);
CREATE  FUNCTION tide."unschedule"(
	"task" TEXT, /* Option < & str > */
	"owner" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS bool /* bool */
VOLATILE 
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'unschedule_wrapper';
COMMENT ON FUNCTION tide.unschedule(text, text) IS
    'unschedule(task, owner => caller): deletes a task and its rule versions; false if there is no task of that name. owner names another role''s task: a team''s the caller is a member of, or, for a superuser or tide_admin, any role''s (one that no longer exists included).';

DROP FUNCTION tide._alert_causes(timestamptz);
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
    SELECT count(*) INTO n FROM delivery d;
    -- A hint for external delivery workers, as tide.create_effect gives.
    IF n > 0 THEN
        PERFORM tide._notify('pg_tide_effect', '');
    END IF;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._alert_deliver(jsonb) IS
    'Internal: records the deliveries of one alert event, once per route and channel that receives it (dedupe key alert:<id>:<event>:<channel>).';

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
    -- Its owner's limits: how many tasks, how often they fire (sql/share.sql).
    PERFORM tide._check_role_limits(t);
END
$$;
COMMENT ON FUNCTION tide._check_task(bigint) IS
    'Internal: checks the rules of a task that involve several options (called by tide.schedule and tide.alter).';

DROP FUNCTION tide._claim(tide.executor, text, text, integer, interval, boolean, bigint);
CREATE FUNCTION tide._claim(p_executor tide.executor, p_queue text, p_worker text, p_n integer, p_lease interval,
                            p_online_only boolean DEFAULT false, p_after bigint DEFAULT NULL)
RETURNS TABLE (run_id bigint, lease_token bigint, lease_expires_at timestamptz, task text, args jsonb,
               window_start timestamptz, window_end timestamptz, biz_date date, attempt integer,
               version integer, checkpoint jsonb, trigger tide.run_trigger, dedupe_key text,
               priority integer, owner name, timeout interval, topic text, event_key text, payload jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT: with a backlog the generic plan's cost estimate passes jit_above_cost, and
-- compiling it cost ten times the claim itself (13.7 ms against 1.2 ms with 484,000 ready
-- runs). Nothing here scans enough to gain from it.
SET jit = off
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
    -- The roles whose runs this claim looks at, in turn, and one role's candidates.
    turn name[];
    who name;
    w_ids bigint[];
    w_owners name[];
    w_queues text[];
    w_gated boolean;
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
    -- The executors choose under a lock of their own, held until the claim commits, so that the
    -- next executor's choice counts this claim (src/share.rs).
    IF is_sql AND NOT tide._share_lock(p_after IS NULL) THEN
        RETURN;  -- (a claim made with the end of a run does not wait: see src/share.rs)
    END IF;
    -- The candidates are fixed in an array first: a LIMIT subquery under FOR UPDATE SKIP LOCKED
    -- may be re-evaluated and claim more rows than asked. Each candidate's run is locked with
    -- its line, and one whose run is locked is skipped: a change of a run in progress (run
    -- control, a rule change holding it, R12.3) holds the run and then writes its line, so a
    -- claim that held the line and waited for the run would deadlock with it. When every candidate has to wait (it
    -- is parked, out of the candidates, by tide._admit) the next ones are looked at, a few
    -- rounds at most: a claimer must not come back empty while other runs are claimable.
    FOR round IN 1..10 LOOP
        -- Whose runs, in turn (sql/share.sql): priority orders a role's own runs only. An executor
        -- takes from the role that occupies the fewest executors, ties at random, up to each role's
        -- limit. An external claim that may take several roles' runs takes them from the roles in
        -- an order drawn at random at each claim.
        -- (Again after parked runs were woken: their owners may have had no other ready run.)
        IF turn IS NULL AND is_sql THEN
            turn := tide._executor_turn(owners_ok, g_owners);
        ELSIF turn IS NULL AND owners_ok IS NULL THEN
            -- Every role with ready runs in the queue: a loose scan of pending_claim_idx, one
            -- probe per role (ORDER BY ... LIMIT 1, not min(): min of a name is min of text,
            -- which no index serves, and read every ready run of the queue).
            WITH RECURSIVE o(owner) AS (
                (SELECT p.owner FROM tide.pending p
                  WHERE p.state = 'ready' AND NOT p.parked AND p.executor = p_executor AND p.queue = p_queue
                  ORDER BY p.owner LIMIT 1)
                UNION ALL
                SELECT (SELECT p.owner FROM tide.pending p
                         WHERE p.state = 'ready' AND NOT p.parked AND p.executor = p_executor AND p.queue = p_queue
                           AND p.owner > o.owner
                         ORDER BY p.owner LIMIT 1)
                  FROM o WHERE o.owner IS NOT NULL
            )
            SELECT coalesce(array_agg(o.owner ORDER BY random()), '{}') INTO turn FROM o WHERE o.owner IS NOT NULL;
        ELSIF turn IS NULL THEN
            SELECT coalesce(array_agg(DISTINCT u.o), '{}') INTO turn
              FROM unnest(owners_ok || coalesce(ARRAY(SELECT g.o FROM unnest(g_owners, g_queues) g(o, q) WHERE g.q = p_queue), '{}')) u(o);
            IF cardinality(turn) > 1 THEN
                turn := ARRAY(SELECT u.o FROM unnest(turn) u(o) ORDER BY random());
            END IF;
        END IF;
        ids := '{}';
        owners := '{}';
        queues := '{}';
        gated := false;
        FOREACH who IN ARRAY turn LOOP
            EXIT WHEN cardinality(ids) >= p_n;
            IF p_queue IS NULL THEN
                SELECT array_agg(c.run_id), array_agg(c.owner), array_agg(c.queue), bool_or(c.gated)
                  INTO w_ids, w_owners, w_queues, w_gated FROM (
                    SELECT p.run_id, p.owner, p.queue, p.gated FROM tide.pending p JOIN tide.run r ON r.run_id = p.run_id
                     -- Without a queue, the claimer is an SQL executor (external workers must name
                     -- one, above): written out, so that the plan kept for any executor uses the
                     -- index of SQL runs, pending_claim_any_idx.
                     WHERE p.state = 'ready' AND NOT p.parked AND p.executor = 'sql' AND p.owner = who
                       AND (p.due_at IS NULL OR p.due_at <= statement_timestamp())
                       AND (owners_ok IS NULL OR p.owner = ANY (owners_ok)
                            OR (g_owners IS NOT NULL AND (p.owner, p.queue) IN (SELECT u.o, u.q FROM unnest(g_owners, g_queues) u(o, q))))
                       -- Backfill runs claim at priority - 10000, after every online run; one
                       -- executor keeps to online runs.
                       AND (NOT p_online_only OR p.priority > -5000)
                     ORDER BY p.priority DESC, p.run_id
                     LIMIT p_n - cardinality(ids) FOR UPDATE OF p, r SKIP LOCKED) c;
            ELSE
                SELECT array_agg(c.run_id), array_agg(c.owner), array_agg(c.queue), bool_or(c.gated)
                  INTO w_ids, w_owners, w_queues, w_gated FROM (
                    SELECT p.run_id, p.owner, p.queue, p.gated FROM tide.pending p JOIN tide.run r ON r.run_id = p.run_id
                     WHERE p.state = 'ready' AND NOT p.parked AND p.executor = p_executor AND p.queue = p_queue
                       AND p.owner = who
                       AND (p.due_at IS NULL OR p.due_at <= statement_timestamp())
                       AND (owners_ok IS NULL OR p.owner = ANY (owners_ok)
                            OR (g_owners IS NOT NULL AND (p.owner, p.queue) IN (SELECT u.o, u.q FROM unnest(g_owners, g_queues) u(o, q))))
                     ORDER BY p.priority DESC, p.run_id
                     LIMIT p_n - cardinality(ids) FOR UPDATE OF p, r SKIP LOCKED) c;
            END IF;
            IF w_ids IS NOT NULL THEN
                ids := ids || w_ids;
                owners := owners || w_owners;
                queues := queues || w_queues;
                gated := gated OR w_gated;
            END IF;
        END LOOP;
        IF cardinality(ids) = 0 THEN
            ids := NULL;
        END IF;
        IF ids IS NULL THEN
            -- Nothing claimable: runs parked for room in a queue that has room now missed their
            -- wake-up (tide._wake_parked); they are woken and looked at once more.
            IF limited AND NOT rechecked AND tide._wake_parked(p_executor, p_queue, owners_ok, g_owners, g_queues) > 0 THEN
                rechecked := true;
                turn := NULL;
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

DROP FUNCTION tide._emit(text, jsonb[], text[], text[], text);
CREATE FUNCTION tide._emit(p_topic text, p_payloads jsonb[], p_event_keys text[], p_dedupe_keys text[], p_function text)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT, whatever the backlog (see tide._claim).
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    n integer := coalesce(cardinality(p_payloads), 0);
    bad record;
    what text;
    made integer;
    queues text[];
    sql_ready boolean;
    -- A role's emit reaches the tasks of the roles it acts for (its own, its teams') and those
    -- whose owners granted it the topic (tide.grant('emit', ...)); a superuser's or
    -- tide_admin's, every role's.
    owners_ok name[] := tide._acts_for();
    g_owners name[];
    -- Whether any event has a dedupe key of the caller's (else every key is pg_tide's own).
    keyed boolean;
    checked boolean;
BEGIN
    checked := tide._check_topic(p_topic, p_function);  -- an assignment, not a PERFORM: see there
    IF array_ndims(p_payloads) > 1 OR array_ndims(p_event_keys) > 1 OR array_ndims(p_dedupe_keys) > 1 THEN
        what := CASE WHEN array_ndims(p_payloads) > 1 THEN 'payloads'
                     WHEN array_ndims(p_event_keys) > 1 THEN 'event_keys' ELSE 'dedupe_keys' END;
        RAISE EXCEPTION '%: % must be a one-dimensional array, got % dimensions', p_function, what,
            CASE what WHEN 'payloads' THEN array_ndims(p_payloads)
                      WHEN 'event_keys' THEN array_ndims(p_event_keys) ELSE array_ndims(p_dedupe_keys) END
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass one element per event, such as ARRAY[''k1'', ''k2'']';
    END IF;
    keyed := coalesce(cardinality(array_remove(p_dedupe_keys, NULL)) > 0, false);
    IF n > 100000 THEN
        RAISE EXCEPTION '%: % events in one call, at most 100000', p_function, n USING ERRCODE = 'invalid_parameter_value',
            HINT = 'emit in several calls of up to 100000 events';
    END IF;
    IF n > 1 THEN
        PERFORM tide._check_bulk(n, p_function);
    END IF;
    IF cardinality(p_event_keys) <> n OR cardinality(p_dedupe_keys) <> n THEN
        RAISE EXCEPTION '%: % has % elements and payloads %', p_function,
            CASE WHEN cardinality(p_event_keys) <> n THEN 'event_keys' ELSE 'dedupe_keys' END,
            CASE WHEN cardinality(p_event_keys) <> n THEN cardinality(p_event_keys) ELSE cardinality(p_dedupe_keys) END, n
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'give one key per payload (NULL for none), or leave the keys out';
    END IF;
    IF n = 0 THEN
        RETURN 0;
    END IF;
    -- The first bad element, if any, in one pass.
    SELECT e.i, e.p, e.ek, e.dk INTO bad
      FROM unnest(p_payloads, p_event_keys, p_dedupe_keys) WITH ORDINALITY AS e(p, ek, dk, i)
     WHERE length(e.ek) > 1000 OR length(e.dk) > 1000 OR e.ek = '' OR e.dk = '' OR e.dk LIKE '#%'
        OR pg_column_size(e.p) > 1048576
     ORDER BY e.i LIMIT 1;
    IF FOUND THEN
        -- tide.emit_many names the element; tide.emit has one.
        what := p_function || ': ' || CASE WHEN n > 1 THEN format('element %s: ', bad.i) ELSE '' END;
        IF length(bad.ek) > 1000 OR length(bad.dk) > 1000 THEN
            RAISE EXCEPTION '%', format('%s%s is too long (%s characters, at most 1000)', what,
                CASE WHEN length(bad.ek) > 1000 THEN 'event_key' ELSE 'dedupe_key' END,
                greatest(length(bad.ek), length(bad.dk)))
                USING ERRCODE = 'invalid_parameter_value', HINT = 'derive keys from ids, such as ''customer:'' || id';
        ELSIF pg_column_size(bad.p) > 1048576 THEN
            RAISE EXCEPTION '%', format('%spayload is too large (%s bytes, at most 1048576)', what, pg_column_size(bad.p))
                USING ERRCODE = 'invalid_parameter_value', HINT = 'keep large data in your own tables and pass its key';
        ELSE
            RAISE EXCEPTION '%', format('%s%s %s is not valid', what,
                CASE WHEN bad.ek = '' THEN 'event_key' ELSE 'dedupe_key' END,
                quote_literal(left(CASE WHEN bad.ek = '' THEN bad.ek ELSE bad.dk END, 100)))
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'pass NULL or a non-empty text; dedupe keys starting with # are pg_tide''s own';
        END IF;
    END IF;
    IF owners_ok IS NOT NULL THEN
        SELECT array_agg(g.owner) INTO g_owners FROM tide._granted('emit') g WHERE g.object = p_topic;
    END IF;
    -- One statement: the runs (with their gating, so the insert trigger has nothing to look up),
    -- their first history rows, their tide.pending rows and their tasks' touch rows, as
    -- tide._record_created would write them (measured: about half the cost of creating and then
    -- re-reading them). Each event gets its id (its dedupe key when none is given: #id).
    WITH events AS (
        SELECT e.i, coalesce(e.p, '{}') AS payload, e.ek AS event_key, e.dk AS dedupe_key,
               nextval('tide.event_seq') AS ev
          FROM unnest(p_payloads, p_event_keys, p_dedupe_keys) WITH ORDINALITY AS e(p, ek, dk, i)
    ), tasks AS MATERIALIZED (
        -- With what the runs' gating reads of the task's rules (tide._gating_by), read once.
        SELECT t.task_id, t.version, t.owner, t.queue, t.priority, t.args, t.command, t.name,
               tide._open_state(jsonb_build_object('ready_dataset', t.ready_dataset, 'ready_check', t.ready_check,
                                                 'ready_watermark', t.ready_watermark)) AS state,
               v.rules->>'lock_key' AS lock_rule, v.rules->>'overlap' AS overlap, (v.rules->>'long')::boolean AS long,
               (v.rules->>'max_concurrency')::integer AS max_concurrency
          FROM tide.task t
          JOIN tide.task_version v ON v.task_id = t.task_id AND v.version = t.version
         WHERE t.topics @> ARRAY[p_topic] AND (owners_ok IS NULL OR t.owner = ANY (owners_ok) OR t.owner = ANY (g_owners))
        -- The tasks cannot be deleted under their new runs (tide.run has no foreign key): a task
        -- deleted meanwhile is left out, and one being deleted is waited for.
           FOR KEY SHARE OF t
    ), made AS NOT MATERIALIZED (
        -- The runs, in the order of the events (run ids follow it), written out once and
        -- inserted by one of the two statements below (inlined into it, not stored).
        SELECT t.task_id, 'event'::tide.run_trigger AS trigger, coalesce(e.dedupe_key, '#' || e.ev) AS dedupe_key,
               t.version, t.state,
               format('event %s on %s%s', e.ev, p_topic, coalesce(' (key ' || e.event_key || ')', '')) AS reason,
               tide._executor_of(t.command) AS executor, t.queue, t.priority, t.args, t.owner,
               p_topic AS topic, e.event_key, e.payload, g.gate, g.lock_key, g.gated
          FROM events e
         CROSS JOIN tasks t
         CROSS JOIN LATERAL tide._gating_by(t.lock_rule, t.overlap, t.long, t.max_concurrency, t.task_id, t.name,
                                            t.args, e.payload, e.event_key, NULL, NULL) g
         ORDER BY e.i, t.task_id
    ), own AS (
        -- Without dedupe keys, every run's key is pg_tide's own (#id, new): inserted plainly.
        -- With some, keys seen before are skipped (given). Only one of the two has rows; ON
        -- CONFLICT costs a probe of the key's index and a speculative insertion per row
        -- (measured: 13% of a bulk enqueue).
        INSERT INTO tide.run (task_id, trigger, dedupe_key, version, state, reason, executor, queue, priority,
                              args, owner, topic, event_key, payload, gate, lock_key, gated)
        SELECT * FROM made WHERE NOT keyed
        RETURNING run_id, task_id, state, reason, owner, executor, queue, priority, gate, lock_key, gated
    ), given AS (
        INSERT INTO tide.run (task_id, trigger, dedupe_key, version, state, reason, executor, queue, priority,
                              args, owner, topic, event_key, payload, gate, lock_key, gated)
        SELECT * FROM made WHERE keyed
        ON CONFLICT (task_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING run_id, task_id, state, reason, owner, executor, queue, priority, gate, lock_key, gated
    ), created AS (
        SELECT * FROM own UNION ALL SELECT * FROM given
    ), history AS (
        INSERT INTO tide.run_event (run_id, from_state, to_state, reason, owner)
        SELECT c.run_id, NULL, c.state, c.reason, c.owner FROM created c ORDER BY c.run_id
    ), line AS (
        INSERT INTO tide.pending (run_id, task_id, state, executor, queue, priority, owner, gate, lock_key, gated)
        SELECT c.run_id, c.task_id, c.state, c.executor, c.queue, c.priority, c.owner, c.gate, c.lock_key, c.gated
          FROM created c
    ), touched AS (
        -- Task health recomputes the subscribed tasks (one row each, whether or not a key seen
        -- before left one without a new run).
        INSERT INTO tide.task_touch (task_id, owner) SELECT t.task_id, t.owner FROM tasks t
    )
    SELECT count(*), array_agg(DISTINCT c.queue) FILTER (WHERE c.state = 'ready'),
           bool_or(c.state = 'ready' AND c.executor = 'sql')
      INTO made, queues, sql_ready FROM created c;
    IF made = 0 THEN
        -- Never a silent 0: say so when no task this role may reach subscribes to the topic (a
        -- dedupe key seen before is a quiet 0).
        IF NOT EXISTS (SELECT 1 FROM tide.task t
                        WHERE t.topics @> ARRAY[p_topic]
                          AND (owners_ok IS NULL OR t.owner = ANY (owners_ok) OR t.owner = ANY (g_owners))) THEN
            RAISE WARNING '%: no task you may reach subscribes to topic %: nothing was created', p_function, quote_literal(left(p_topic, 200))
                USING HINT = 'subscribe a task with tide.schedule(..., topics => ARRAY[...]), or have the owner of the task run tide.grant(''emit'', topic, your role)';
        END IF;
        RETURN 0;
    END IF;
    PERFORM tide._ready(queues);  -- waiting workers are notified after the commit (src/wake.rs)
    IF sql_ready THEN
        PERFORM tide._wake(false);  -- an idle executor claims at this commit (src/wake.rs)
    END IF;
    RETURN made;
END
$$;
COMMENT ON FUNCTION tide._emit(text, jsonb[], text[], text[], text) IS
    'Internal: the work of tide.emit and tide.emit_many: checks, creates a run of every reachable subscribed task per event, wakes claimers.';

DROP FUNCTION tide._evaluate_alerts(timestamptz, boolean);
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

DROP FUNCTION tide._fold(timestamptz, integer);
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
    WITH d AS (DELETE FROM tide.count_delta RETURNING task_id, metric, label, value, owner)
    INSERT INTO tide.run_count AS c (task_id, metric, label, value, owner)
    SELECT d.task_id, d.metric, d.label, sum(d.value), min(d.owner) FROM d
     WHERE EXISTS (SELECT 1 FROM tide.task t WHERE t.task_id = d.task_id)
     GROUP BY 1, 2, 3
    ON CONFLICT (task_id, metric, label) DO UPDATE SET value = c.value + EXCLUDED.value;
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

DROP FUNCTION tide._monitor(timestamptz);
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
    -- Tasks whose owner was dropped (from another database: sql/roles.sql), event tasks among
    -- them, stop; the alert owner_gone says why.
    PERFORM tide._pause_orphans(p_now);
    RETURN tide._evaluate_alerts(p_now) || tide._prune(p_now, 5000);
END
$$;
COMMENT ON FUNCTION tide._monitor(timestamptz) IS
    'Internal: the tick''s monitoring: every pg_tide.monitor_interval, notes again any task without kept health figures or a touch row, deletes runs left of deleted tasks, evaluates alerts and prunes a batch of old history.';

DROP FUNCTION tide.claim_effects(text, text, integer, interval);
CREATE FUNCTION tide.claim_effects(channel text, worker text DEFAULT NULL, n integer DEFAULT 10,
                                   lease interval DEFAULT '1 minute')
RETURNS TABLE (effect_id bigint, dedupe_key text, payload jsonb, attempt integer, lease_token bigint,
               lease_expires_at timestamptz, run_id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT, whatever the backlog (see tide._claim).
SET jit = off
AS $$
DECLARE
    ids bigint[];
    token bigint;
    only_owner name := CASE WHEN tide._caller_is_superuser() THEN NULL ELSE tide._caller() END;
BEGIN
    PERFORM tide._channel(claim_effects.channel);
    IF claim_effects.worker IS NOT NULL THEN
        PERFORM tide._text_arg('worker', claim_effects.worker, 200, 'name the worker, such as its host and pid');
    END IF;
    IF claim_effects.n IS NULL OR claim_effects.n NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'n must be between 1 and 1000, got %', coalesce(claim_effects.n::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'claim_effects(''sms'', worker => ''sender-1'', n => 10)';
    END IF;
    IF claim_effects.lease IS NULL THEN
        RAISE EXCEPTION 'lease must not be NULL' USING ERRCODE = 'null_value_not_allowed', HINT = 'pass lease => ''1 minute''';
    END IF;
    PERFORM tide._bounded('lease', claim_effects.lease, false);
    -- Candidates fixed first (a LIMIT subquery under SKIP LOCKED may be re-evaluated).
    SELECT array_agg(c.effect_id) INTO ids FROM (
        SELECT e.effect_id FROM tide.effect e
         WHERE e.state = 'pending' AND e.channel = claim_effects.channel AND e.available_at <= now()
           AND (only_owner IS NULL OR e.owner = only_owner)
           -- A channel of tide.create_channel is pg_tide's delivery worker's to send.
           AND NOT EXISTS (SELECT 1 FROM tide.alert_channel c WHERE c.owner = e.owner AND c.name = e.channel)
         ORDER BY e.available_at, e.effect_id
         LIMIT claim_effects.n FOR UPDATE SKIP LOCKED) c;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    token := nextval('tide.lease_token_seq');
    RETURN QUERY
        UPDATE tide.effect e
           SET state = 'sending', attempts = e.attempts + 1, worker = claim_effects.worker,
               lease_token = token, lease_expires_at = now() + claim_effects.lease
         WHERE e.effect_id = ANY (ids)
        RETURNING e.effect_id, e.dedupe_key, e.payload, e.attempts, e.lease_token, e.lease_expires_at, e.run_id;
END
$$;
COMMENT ON FUNCTION tide.claim_effects(text, text, integer, interval) IS
    'claim_effects(channel, worker => NULL, n => 10, lease => ''1 minute''): hands up to n pending side effects of a channel (the caller''s; a superuser''s: any role''s) to a delivery worker (FOR UPDATE SKIP LOCKED, oldest first) with a fencing lease_token. Pass dedupe_key to the provider as its idempotency key.';

DROP FUNCTION tide.complete_run(bigint, bigint, jsonb, bigint, bigint);
CREATE FUNCTION tide.complete_run(run_id bigint, lease_token bigint, result jsonb DEFAULT NULL,
                              expected bigint DEFAULT NULL, actual bigint DEFAULT NULL)
RETURNS tide.run_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT, whatever the backlog (see tide._claim).
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    short boolean := complete_run.actual < complete_run.expected;
    done tide.run_state;
    attempt_no integer;
    why text;
    who name;
    worker text;
    claimed timestamptz;
    finished timestamptz;
    task bigint;
    gated boolean;
    in_owner name;
    in_queue text;
    was_counted boolean;
    ignored text;
    -- Who may complete the run: its owner (the common case, compared without a call), a member
    -- of the owner's role, a superuser.
    caller name := tide._caller();
    any_owner boolean := tide._caller_is_superuser();
BEGIN
    IF complete_run.expected < 0 OR complete_run.actual < 0 THEN
        RAISE EXCEPTION 'expected and actual must not be negative, got expected %, actual %',
            complete_run.expected, complete_run.actual
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass the number of records the run should have and did process';
    END IF;
    PERFORM tide._jsonb_arg('result', complete_run.result, 1048576);
    -- The hot path of every worker: plain statements (cheaper here than data-modifying CTEs),
    -- and the history row written here rather than by the trigger.
    ignored := set_config('tide.history', 'written', true);
    UPDATE tide.run r
       SET state = CASE WHEN short THEN 'need_check' ELSE 'succeeded' END::tide.run_state,
           result = complete_run.result,
           expected = complete_run.expected,
           actual = complete_run.actual,
           -- The clock, not the transaction's start: an executor completes in the transaction
           -- that ran the command, so now() would leave the command out of the run's duration.
           finished_at = clock_timestamp(),
           updated_at = now(),
           lease_expires_at = NULL,
           control = NULL,
           reason = CASE WHEN short
                         THEN format('completed short: expected %s, actual %s', complete_run.expected, complete_run.actual)
                         ELSE format('completed by %s', coalesce(r.lease_owner, 'a worker')) END
     WHERE r.run_id = complete_run.run_id AND r.lease_token = complete_run.lease_token AND r.state = 'running'
       AND (any_owner OR r.owner = caller OR tide._may_work(r.owner, r.queue))
    RETURNING r.state, r.attempts, r.reason, r.owner, r.lease_owner, r.claimed_at, r.finished_at, r.task_id
         INTO done, attempt_no, why, who, worker, claimed, finished, task;
    ignored := set_config('tide.history', '', true);
    IF NOT FOUND THEN
        PERFORM tide._refuse_stale(complete_run.run_id, complete_run.lease_token, 'tide.complete_run');
    END IF;
    IF short THEN
        -- (counted is left as it was: it means something only while running.)
        UPDATE tide.pending p SET state = 'need_check', due_at = NULL WHERE p.run_id = complete_run.run_id
        RETURNING p.gated, p.owner, p.queue, p.counted INTO gated, in_owner, in_queue, was_counted;
    ELSE
        DELETE FROM tide.pending p WHERE p.run_id = complete_run.run_id
        RETURNING p.gated, p.owner, p.queue, p.counted INTO gated, in_owner, in_queue, was_counted;
    END IF;
    IF gated THEN
        PERFORM tide._release(ARRAY[complete_run.run_id]);
    END IF;
    IF was_counted THEN
        -- A run its queue's max_concurrency counted gives the room back (tide.queue).
        PERFORM tide._queue_ended(in_owner, in_queue, 1);
    END IF;
    -- The history row, and what it counts: the task touched, the outcome, and a success's
    -- duration.
    INSERT INTO tide.run_event (run_id, from_state, to_state, reason, owner, attempt, worker, lease_token,
                                claimed_at, outcome)
    VALUES (complete_run.run_id, 'running', done, why, who, attempt_no, worker, complete_run.lease_token, claimed,
            CASE WHEN short THEN 'need_check' ELSE 'succeeded' END::tide.attempt_outcome);
    INSERT INTO tide.task_touch (task_id, owner) VALUES (task, who);
    INSERT INTO tide.count_delta (task_id, metric, label, value, owner)
    SELECT task, m.metric, m.label, m.value, who
      FROM tide._counts_of(done, attempt_no, claimed, finished, NULL, NULL, NULL) m;
    IF tide._log_on() THEN
        PERFORM tide._log_runs(CASE WHEN short THEN 'need_check' ELSE 'success' END, ARRAY[complete_run.run_id]);
    END IF;
    RETURN done;
END
$$;
COMMENT ON FUNCTION tide.complete_run(bigint, bigint, jsonb, bigint, bigint) IS
    'complete_run(run_id, lease_token, result => NULL, expected => NULL, actual => NULL): finishes a claimed run: succeeded, or need_check when actual < expected. A stale lease token is refused and nothing changes.';

DROP FUNCTION tide.complete_runs(bigint[], bigint[], jsonb[]);
CREATE FUNCTION tide.complete_runs(run_ids bigint[], lease_tokens bigint[], results jsonb[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT, whatever the backlog (see tide._claim).
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    done_ids bigint[];
    gated_ids bigint[];
    ended_owners name[];
    ended_queues text[];
    ended_n integer[];
    stale record;
    ignored text;
    caller name := tide._caller();
    any_owner boolean := tide._caller_is_superuser();
BEGIN
    IF coalesce(cardinality(complete_runs.run_ids), 0) = 0
       AND coalesce(cardinality(complete_runs.lease_tokens), 0) = 0 THEN
        RETURN 0;  -- an empty claim: nothing to complete
    END IF;
    IF complete_runs.run_ids IS NULL OR complete_runs.lease_tokens IS NULL
       OR cardinality(complete_runs.run_ids) <> cardinality(complete_runs.lease_tokens)
       OR cardinality(complete_runs.results) <> cardinality(complete_runs.run_ids) THEN
        RAISE EXCEPTION 'run_ids, lease_tokens and results must be arrays of the same length, got %, % and %',
            coalesce(cardinality(complete_runs.run_ids)::text, 'NULL'), coalesce(cardinality(complete_runs.lease_tokens)::text, 'NULL'),
            coalesce(cardinality(complete_runs.results)::text, 'no results')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass the run_id and lease_token columns of tide.claim_runs as arrays, in the same order';
    END IF;
    IF cardinality(complete_runs.run_ids) > 1000 THEN
        RAISE EXCEPTION 'complete at most 1000 runs at a time, got %', cardinality(complete_runs.run_ids)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'tide.claim_runs hands out at most 1000 runs at a time';
    END IF;
    -- All runs and their history (with the attempts they end) in one statement: the batch path
    -- of a busy worker.
    ignored := set_config('tide.history', 'written', true);
    WITH input AS (
        SELECT i.run_id, i.token, complete_runs.results[i.n] AS result
          FROM unnest(complete_runs.run_ids, complete_runs.lease_tokens) WITH ORDINALITY AS i(run_id, token, n)
    ), done_run AS (
        UPDATE tide.run r
           SET state = 'succeeded', result = i.result, finished_at = now(), updated_at = now(),
               lease_expires_at = NULL, control = NULL,
               reason = format('completed by %s', coalesce(r.lease_owner, 'a worker'))
          FROM input i
         WHERE r.run_id = i.run_id AND r.lease_token = i.token AND r.state = 'running'
           AND (any_owner OR r.owner = caller OR tide._may_work(r.owner, r.queue))
        RETURNING r.run_id, r.attempts, r.reason, r.owner, r.lease_owner, r.lease_token, r.claimed_at,
                  r.gated, r.task_id, r.finished_at
    ), done_pending AS (
        DELETE FROM tide.pending p USING done_run d WHERE p.run_id = d.run_id
        RETURNING p.owner, p.queue, p.counted
    ), ended AS (
        -- Runs their queues' max_concurrency counted, by queue.
        SELECT e.owner, e.queue, count(*)::integer AS n FROM done_pending e WHERE e.counted
         GROUP BY e.owner, e.queue
    ), history AS (
        INSERT INTO tide.run_event (run_id, from_state, to_state, reason, owner, attempt, worker, lease_token,
                                    claimed_at, outcome)
        SELECT d.run_id, 'running', 'succeeded', d.reason, d.owner, d.attempts, d.lease_owner, d.lease_token,
               d.claimed_at, 'succeeded'
          FROM done_run d ORDER BY d.run_id
    ), touched AS (
        -- What the history rows count: the tasks touched, the successes and their durations.
        INSERT INTO tide.task_touch (task_id, owner) SELECT DISTINCT d.task_id, d.owner FROM done_run d
    ), counted AS (
        INSERT INTO tide.count_delta (task_id, metric, label, value, owner)
        SELECT d.task_id, m.metric, m.label, sum(m.value), min(d.owner)
          FROM done_run d CROSS JOIN LATERAL tide._counts_of('succeeded', d.attempts, d.claimed_at, d.finished_at,
                                                             NULL, NULL, NULL) m
         GROUP BY 1, 2, 3
    )
    SELECT array_agg(d.run_id), array_agg(d.run_id) FILTER (WHERE d.gated),
           (SELECT array_agg(e.owner) FROM ended e), (SELECT array_agg(e.queue) FROM ended e),
           (SELECT array_agg(e.n) FROM ended e)
      INTO done_ids, gated_ids, ended_owners, ended_queues, ended_n FROM done_run d;
    ignored := set_config('tide.history', '', true);
    IF coalesce(cardinality(done_ids), 0) < cardinality(complete_runs.run_ids) THEN
        -- All or nothing: raising undoes the completions above.
        SELECT i.run_id, i.token INTO stale
          FROM unnest(complete_runs.run_ids, complete_runs.lease_tokens) AS i(run_id, token)
         WHERE i.run_id <> ALL (coalesce(done_ids, '{}')) LIMIT 1;
        IF FOUND THEN
            PERFORM tide._refuse_stale(stale.run_id, stale.token, 'tide.complete_runs');
        END IF;
        RAISE EXCEPTION 'run_ids must not repeat a run' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'complete each claimed run once';
    END IF;
    IF gated_ids IS NOT NULL THEN
        PERFORM tide._release(gated_ids);
    END IF;
    IF ended_owners IS NOT NULL THEN
        -- Room their queues counted goes back (tide.queue).
        PERFORM tide._queue_ended(u.owner, u.queue, u.n)
           FROM unnest(ended_owners, ended_queues, ended_n) AS u(owner, queue, n);
    END IF;
    IF tide._log_on() THEN
        PERFORM tide._log_runs('success', done_ids);
    END IF;
    RETURN cardinality(done_ids);
END
$$;
COMMENT ON FUNCTION tide.complete_runs(bigint[], bigint[], jsonb[]) IS
    'complete_runs(run_ids, lease_tokens, results => NULL): completes a batch of claimed runs as succeeded in one call, all or nothing: one stale lease token refuses the whole batch. Returns how many (0 for empty arrays, as an empty claim aggregates to).';

DROP FUNCTION tide.create_effect(text, text, jsonb, integer);
CREATE FUNCTION tide.create_effect(channel text, dedupe_key text, payload jsonb DEFAULT '{}', max_attempts integer DEFAULT 10)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id bigint;
BEGIN
    PERFORM tide._channel(create_effect.channel);
    IF create_effect.dedupe_key IS NULL OR btrim(create_effect.dedupe_key) = '' THEN
        RAISE EXCEPTION 'dedupe_key must not be empty, got %', coalesce(quote_literal(left(create_effect.dedupe_key, 20)), 'NULL')
            USING ERRCODE = CASE WHEN create_effect.dedupe_key IS NULL THEN 'null_value_not_allowed' ELSE 'invalid_parameter_value' END,
                  HINT = 'derive it from what the message is about, such as ''invoice:'' || invoice_id || '':reminder''';
    END IF;
    PERFORM tide._text_arg('dedupe_key', create_effect.dedupe_key, 1000,
                           'derive it from what the message is about, such as ''invoice:'' || invoice_id || '':reminder''');
    PERFORM tide._jsonb_arg('payload', create_effect.payload, 1048576);
    IF create_effect.payload IS NULL OR create_effect.max_attempts IS NULL OR create_effect.max_attempts NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'payload must not be NULL and max_attempts must be between 1 and 100, got %',
            coalesce(create_effect.max_attempts::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass payload => ''{}'' and max_attempts => 10';
    END IF;
    INSERT INTO tide.effect (channel, dedupe_key, payload, run_id, max_attempts, owner)
    VALUES (create_effect.channel, create_effect.dedupe_key, create_effect.payload, tide.run_id(), create_effect.max_attempts, tide._caller())
    ON CONFLICT ON CONSTRAINT effect_owner_dedupe_key_key DO NOTHING
    RETURNING effect_id INTO id;
    IF id IS NOT NULL THEN
        -- A hint for waiting delivery workers, with no name in it (any role may LISTEN): one per
        -- transaction (PostgreSQL folds identical ones), none while the notification queue is
        -- half full (src/wake.rs).
        PERFORM tide._notify('pg_tide_effect', '');
        RETURN id;
    END IF;
    SELECT e.effect_id INTO id FROM tide.effect e
     WHERE e.owner = tide._caller() AND e.dedupe_key = create_effect.dedupe_key;
    RETURN id;
END
$$;
COMMENT ON FUNCTION tide.create_effect(text, text, jsonb, integer) IS
    'create_effect(channel, dedupe_key, payload => ''{}'', max_attempts => 10): records a side effect in the caller''s transaction, once per dedupe key (per role), and returns its effect_id; a key already recorded (a rerun) records nothing and returns the existing effect_id. Delivery workers take it with tide.claim_effects.';

DROP FUNCTION tide.create_queue(text, integer, double precision, integer, interval);
CREATE FUNCTION tide.create_queue(name text, max_concurrency integer DEFAULT NULL, rate double precision DEFAULT NULL,
                                  retry_budget integer DEFAULT NULL, retry_window interval DEFAULT '10 minutes')
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._queue_name(create_queue.name);
    IF create_queue.max_concurrency IS NOT NULL AND create_queue.max_concurrency NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'max_concurrency must be between 1 and 10000, got %', create_queue.max_concurrency
            USING ERRCODE = 'invalid_parameter_value', HINT = 'NULL for no limit';
    END IF;
    IF create_queue.rate IS NOT NULL AND NOT (create_queue.rate > 0 AND create_queue.rate <= 10000) THEN
        RAISE EXCEPTION 'rate must be between 0 and 10000 starts per second, got %', create_queue.rate
            USING ERRCODE = 'invalid_parameter_value', HINT = 'rate => 0.5 starts a run every 2 seconds at most; NULL for no limit';
    END IF;
    IF create_queue.retry_budget IS NOT NULL AND create_queue.retry_budget NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'retry_budget must be between 1 and 100000, got %', create_queue.retry_budget
            USING ERRCODE = 'invalid_parameter_value', HINT = 'the transient failures allowed per retry_window; NULL for no budget';
    END IF;
    IF create_queue.retry_window IS NULL OR create_queue.retry_window < interval '1 minute'
       OR create_queue.retry_window > interval '1 day'
       -- One sign for its months, days and time, as every interval of pg_tide's
       -- ('1 day -1 hour' is refused, not read as 23 hours).
       OR extract(month FROM create_queue.retry_window) < 0 OR extract(day FROM create_queue.retry_window) < 0
       OR extract(epoch FROM create_queue.retry_window - date_trunc('day', create_queue.retry_window)) < 0 THEN
        RAISE EXCEPTION 'retry_window must be an interval of 1 minute to 1 day whose days and time have one sign, got %', coalesce(create_queue.retry_window::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass retry_window => ''10 minutes''';
    END IF;
    INSERT INTO tide.queue AS q (owner, name, max_concurrency, rate, retry_budget, retry_window, tokens, budget)
    VALUES (tide._caller(), create_queue.name, create_queue.max_concurrency, create_queue.rate,
            create_queue.retry_budget, create_queue.retry_window,
            greatest(1, coalesce(create_queue.rate, 1)), coalesce(create_queue.retry_budget, 0))
    ON CONFLICT ON CONSTRAINT queue_pkey DO UPDATE
       SET max_concurrency = EXCLUDED.max_concurrency, rate = EXCLUDED.rate,
           retry_budget = EXCLUDED.retry_budget, retry_window = EXCLUDED.retry_window,
           tokens = least(q.tokens, EXCLUDED.tokens),
           budget = CASE WHEN q.retry_budget IS NULL THEN EXCLUDED.budget ELSE least(q.budget, EXCLUDED.budget) END,
           updated_at = now();
    PERFORM tide._queue_recount(tide._caller(), create_queue.name);
    -- Runs waiting for a limit that is now higher (or gone) may go.
    PERFORM tide._wake_queue(tide._caller(), create_queue.name);
    RETURN create_queue.name;
END
$$;
COMMENT ON FUNCTION tide.create_queue(text, integer, double precision, integer, interval) IS
    'create_queue(name, max_concurrency => NULL, rate => NULL, retry_budget => NULL, retry_window => ''10 minutes''): declares (or changes) the limits of one of the caller''s queues: at most max_concurrency of its runs running at once, at most rate starts per second, and at most retry_budget transient failures per retry_window before its retries wait. NULL: no such limit. Returns the name.';

DROP FUNCTION tide.enqueue(text, jsonb, timestamptz, integer, text);
CREATE FUNCTION tide.enqueue(task text, args jsonb DEFAULT '{}', run_at timestamptz DEFAULT NULL,
                             priority integer DEFAULT NULL, dedupe_key text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT, whatever the backlog (see tide._claim).
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    t tide.task;
    items jsonb;
    n integer;
    key_of text;
    one_key boolean;
    open_state tide.run_state;
    why text;
    exec_kind tide.executor;
    ids bigint[];
    prio integer;
    due timestamptz;
    queues text[];
    sql_ready boolean;
    rule record;
BEGIN
    PERFORM tide._text_arg('task', enqueue.task, 200, 'pass the name of one of your tasks');
    -- KEY SHARE: the task cannot be deleted under the new runs; changes of it may go on.
    -- The caller's task, a team's, or one granted to it (tide.grant('enqueue', ...)): the runs
    -- are its owner's.
    SELECT * INTO t FROM tide.task x WHERE x.task_id = tide._named_task(enqueue.task, 'enqueue') FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task "%" does not exist', left(enqueue.task, 200) USING ERRCODE = 'undefined_object',
            HINT = 'list your tasks with: SELECT name FROM tide.task';
    END IF;
    IF enqueue.args IS NULL THEN
        RAISE EXCEPTION 'args must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'pass args => ''{}'' for none, an object for one run, or an array of objects for one run each';
    END IF;
    CASE jsonb_typeof(enqueue.args)
        WHEN 'object' THEN items := jsonb_build_array(enqueue.args);
        WHEN 'array' THEN items := enqueue.args;
        ELSE
            RAISE EXCEPTION 'args must be a JSON object or an array of objects, got %', left(enqueue.args::text, 100)
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'pass args => ''{"invoice_id": 7}'' for one run, or ''[{"invoice_id": 7}, {"invoice_id": 8}]'' for one run each';
    END CASE;
    n := jsonb_array_length(items);
    IF n > 100000 THEN
        RAISE EXCEPTION 'args has % elements, at most 100000 in one call', n USING ERRCODE = 'invalid_parameter_value',
            HINT = 'enqueue in several calls of up to 100000 runs';
    END IF;
    IF n > 1 THEN
        PERFORM tide._check_bulk(n, 'tide.enqueue');
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM jsonb_array_elements(items) WITH ORDINALITY AS e(v, i)
     WHERE CASE WHEN jsonb_typeof(e.v) <> 'object'
                THEN tide._refuse_element(e.i, e.v)
                ELSE NOT tide._args_ok(e.v) END;
    IF enqueue.priority IS NOT NULL AND enqueue.priority NOT BETWEEN -1000 AND 1000 THEN
        RAISE EXCEPTION 'priority must be between -1000 and 1000, got %', enqueue.priority
            USING ERRCODE = 'invalid_parameter_value', HINT = 'higher runs first; the task''s own priority is the default';
    END IF;
    prio := coalesce(enqueue.priority, t.priority);
    IF enqueue.run_at IS NOT NULL AND NOT isfinite(enqueue.run_at) THEN
        RAISE EXCEPTION 'run_at must be a finite instant, got %', enqueue.run_at USING ERRCODE = 'invalid_parameter_value',
            HINT = 'pass now() + interval ''1 hour'', or NULL to run at once';
    END IF;
    IF enqueue.run_at > now() + interval '3660 days' THEN
        RAISE EXCEPTION 'run_at % is more than 3660 days ahead', enqueue.run_at USING ERRCODE = 'invalid_parameter_value',
            HINT = 'schedule work that far ahead as a task with a schedule';
    END IF;
    due := CASE WHEN enqueue.run_at > now() THEN enqueue.run_at END;
    IF enqueue.dedupe_key IS NOT NULL THEN
        PERFORM tide._text_arg('dedupe_key', enqueue.dedupe_key, 1000,
                               'derive it from what the job is about, such as ''invoice:'' || invoice_id');
        IF enqueue.dedupe_key LIKE '#%' THEN
            RAISE EXCEPTION 'dedupe_key % is not valid', quote_literal(left(enqueue.dedupe_key, 100))
                USING ERRCODE = 'invalid_parameter_value', HINT = 'dedupe keys starting with # are pg_tide''s own';
        END IF;
        -- One run: the key itself. Several: the key and the element's position, so the same
        -- batch enqueued again creates nothing.
        one_key := jsonb_typeof(enqueue.args) = 'object';
        key_of := enqueue.dedupe_key || CASE WHEN one_key THEN '' ELSE ':' END;
    ELSE
        -- Keys of pg_tide's own, new to this call: no conflict is possible.
        one_key := false;
        key_of := '#q' || nextval('tide.job_seq') || ':';
    END IF;
    -- The same for every run of the call: worked out once.
    open_state := tide._open_state(jsonb_build_object('ready_dataset', t.ready_dataset, 'ready_check', t.ready_check,
                                                      'ready_watermark', t.ready_watermark));
    exec_kind := tide._executor_of(t.command);
    -- What the runs' gating reads of the task's rules, read once (tide._gating_by).
    SELECT v.rules->>'lock_key' AS lock_rule, v.rules->>'overlap' AS overlap, (v.rules->>'long')::boolean AS long,
           (v.rules->>'max_concurrency')::integer AS max_concurrency
      INTO STRICT rule
      FROM tide.task_version v WHERE v.task_id = t.task_id AND v.version = t.version;
    why := format('enqueued by %s%s', tide._caller(),
                  CASE WHEN due IS NOT NULL
                       THEN ' to run at ' || to_char(due AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS" UTC"') ELSE '' END);
    -- One statement: the runs with their gating, their first history rows, their tide.pending
    -- rows and the task's touch row, as tide.emit writes them. Runs with keys of pg_tide's own
    -- are inserted plainly (own), those with the caller's keys skip the keys seen before (given):
    -- only one of the two inserts has rows. ON CONFLICT costs a probe of the key's index before
    -- each row and a speculative insertion (measured: 13% of a bulk enqueue of 20,000 runs).
    WITH input AS (
        SELECT e.i, t.args || e.v AS args,
               CASE WHEN one_key THEN key_of ELSE key_of || e.i END AS dedupe_key
          FROM jsonb_array_elements(items) WITH ORDINALITY AS e(v, i)
    ), made AS NOT MATERIALIZED (
        -- The runs, in the order of the elements (run ids follow it), written out once and
        -- inserted by one of the two statements below (inlined into it, not stored).
        SELECT t.task_id, 'enqueued'::tide.run_trigger AS trigger, i.dedupe_key, t.version, open_state AS state,
               why AS reason, exec_kind AS executor, t.queue, prio AS priority, i.args, due AS run_after,
               t.owner, g.gate, g.lock_key, g.gated
          FROM input i
         CROSS JOIN LATERAL tide._gating_by(rule.lock_rule, rule.overlap, rule.long, rule.max_concurrency, t.task_id,
                                            t.name, i.args, NULL, NULL, NULL, NULL) g
         ORDER BY i.i
    ), own AS (
        INSERT INTO tide.run (task_id, trigger, dedupe_key, version, state, reason, executor, queue, priority,
                              args, run_after, owner, gate, lock_key, gated)
        SELECT * FROM made WHERE enqueue.dedupe_key IS NULL
        RETURNING run_id, task_id, state, reason, owner, executor, queue, priority, run_after, gate, lock_key, gated
    ), given AS (
        INSERT INTO tide.run (task_id, trigger, dedupe_key, version, state, reason, executor, queue, priority,
                              args, run_after, owner, gate, lock_key, gated)
        SELECT * FROM made WHERE enqueue.dedupe_key IS NOT NULL
        ON CONFLICT (task_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING run_id, task_id, state, reason, owner, executor, queue, priority, run_after, gate, lock_key, gated
    ), created AS (
        SELECT * FROM own UNION ALL SELECT * FROM given
    ), history AS (
        INSERT INTO tide.run_event (run_id, from_state, to_state, reason, owner)
        SELECT c.run_id, NULL, c.state, c.reason, c.owner FROM created c ORDER BY c.run_id
    ), line AS (
        INSERT INTO tide.pending (run_id, task_id, state, executor, queue, priority, due_at, owner, gate, lock_key, gated)
        SELECT c.run_id, c.task_id, c.state, c.executor, c.queue, c.priority, c.run_after, c.owner, c.gate, c.lock_key,
               coalesce(c.gated, false)
          FROM created c
    ), touched AS (
        -- Task health recomputes the task.
        INSERT INTO tide.task_touch (task_id, owner) VALUES (t.task_id, t.owner)
    )
    SELECT array_agg(DISTINCT c.queue) FILTER (WHERE c.state = 'ready' AND c.run_after IS NULL),
           bool_or(c.state = 'ready' AND c.executor = 'sql'), array_agg(c.run_id ORDER BY c.run_id)
      INTO queues, sql_ready, ids FROM created c;
    PERFORM tide._ready(queues);  -- waiting workers are notified after the commit (src/wake.rs)
    IF sql_ready THEN
        -- An idle executor claims at this commit, or (run_at ahead) sleeps until the run is due
        -- rather than until its next poll (src/wake.rs, tide._executor_wake).
        PERFORM tide._wake(false);
    END IF;
    -- The run of each element: with keys of pg_tide's own, all of them new, in the order of the
    -- elements (run ids are given in insertion order); with the caller's, created now or
    -- earlier with the same key.
    IF enqueue.dedupe_key IS NULL THEN
        RETURN QUERY SELECT unnest(ids);
    ELSE
        RETURN QUERY
            SELECT r.run_id FROM generate_series(1, n) k(i)
              JOIN tide.run r ON r.task_id = t.task_id
                             AND r.dedupe_key = CASE WHEN one_key THEN key_of ELSE key_of || k.i END
             ORDER BY k.i;
    END IF;
END
$$;
COMMENT ON FUNCTION tide.enqueue(text, jsonb, timestamptz, integer, text) IS
    'enqueue(task, args => ''{}'', run_at => NULL, priority => NULL, dedupe_key => NULL): creates one run of the caller''s task (args an object, merged over the task''s args) or one run per element (args an array of objects, up to 100000), now or at run_at, with its own priority (default: the task''s). A dedupe_key makes it idempotent: a second enqueue with the same key creates nothing and returns the existing run (with an array, element n uses dedupe_key:n). Returns the run ids, in the order of the elements.';

DROP FUNCTION tide._late_cause(bigint);
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

-- pg_tide's own health shows the notification queue's use: the views over it are made again.
DROP VIEW tide.dashboard;
DROP VIEW tide.health;
DROP VIEW tide.self_health;
DROP FUNCTION tide._self(timestamptz);
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

-- Internal functions that change anything are pg_tide's own (as sql/comments.sql leaves them).
REVOKE EXECUTE ON FUNCTION tide._check_task(bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._claim(tide.executor, text, text, integer, interval, boolean, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._alert_deliver(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._emit(text, jsonb[], text[], text[], text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._fold(timestamptz, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._evaluate_alerts(timestamptz, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._monitor(timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._check_role_limits(tide.task) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._executor_turn(name[], name[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._reassign_owned(name, name) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._drop_owned(name) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._pause_orphans(timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._share_lock(boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._notify(text, text) FROM PUBLIC;

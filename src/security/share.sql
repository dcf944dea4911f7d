-- Roles sharing one database: what one role's work may take of what every role shares (fair
-- share, limits), and what becomes of a role's work when the role goes (at the end).
--
-- pg_tide's executors serve every role of the database. How they choose (tide._claim, the
-- executors' path), the rule "fewest busy first":
--   - a run's priority orders its owner's runs only, never another role's;
--   - a free executor takes the next run of the role that occupies the fewest executors right
--     now, among the roles with a ready run; between roles that occupy as many, one chosen at
--     random (lottery, equal tickets);
--   - a role occupies at most its limit `executors` at once: by default every executor but one
--     while another role has work for the executors (a ready or running run, or an active task
--     that they run), all of them otherwise.
-- A role's backlog of any size, its priorities and its slow commands then hold back another
-- role's next ready run by at most the end of one run, with one executor or more free for it.
--
-- A role's limits (tide.role_limit, set by a superuser or tide_admin with
-- tide.set_role_limits; NULL: the server's default):
--   executors         the most executors its runs occupy at once (default: above);
--   tasks             the most tasks it owns (pg_tide.role_max_tasks, 1000);
--   fastest_schedule  the shortest time between two fires of its tasks
--                     (pg_tide.role_fastest_schedule, 1 second: what pg_cron allows);
--   bulk              the most runs one tide.enqueue or events one tide.emit_many makes
--                     (pg_tide.role_max_bulk, 100000).
-- Superusers' own tasks and calls are not limited by tasks, fastest_schedule and bulk (they may
-- change the limits anyway); their runs share the executors as every role's do.

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

-- A role's limits on what it makes, its row's or the server's defaults: NULL for a superuser
-- (not limited). PL/pgSQL, which keeps its plan: an SQL function with SET clauses is planned
-- at every call (most of a tide.schedule call's checks).
CREATE FUNCTION tide._role_limits(p_role name, OUT tasks integer, OUT fastest_schedule interval, OUT bulk integer)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    SELECT coalesce(l.tasks, tide._setting('role_max_tasks', '1000')::integer),
           coalesce(l.fastest_schedule, tide._setting('role_fastest_schedule', '1s')::interval),
           coalesce(l.bulk, tide._setting('role_max_bulk', '100000')::integer)
      INTO tasks, fastest_schedule, bulk
      FROM pg_catalog.pg_roles r LEFT JOIN tide.role_limit l ON l.role = r.rolname
     WHERE r.rolname = p_role AND NOT r.rolsuper;
END
$$;
COMMENT ON FUNCTION tide._role_limits(name) IS
    'Internal: a role''s limits on what it makes (tasks, fastest_schedule, bulk): its tide.role_limit row, else the server''s settings; all NULL for a superuser (not limited).';

-- The checks of a task against its owner's limits (tide._check_task): the number of tasks it
-- owns, once the task is new; how often it fires at its fastest.
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
    -- tide._role_limits returns one row always (it is no set function): a superuser's, not
    -- limited, is all NULL. Nothing to count then (counting cost a scan of every task it owns:
    -- 10,000 tide.schedule calls took twice as long).
    IF lim.tasks IS NULL THEN
        RETURN;
    END IF;
    IF t.created_at = now() THEN
        -- Counted up to one past the limit: the scan stays within what the role may own.
        SELECT count(*) INTO owned FROM (SELECT FROM tide.task x WHERE x.owner = t.owner LIMIT lim.tasks::bigint + 1) x;
        IF owned > lim.tasks THEN
            SELECT count(*) INTO owned FROM tide.task x WHERE x.owner = t.owner;
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

-- One bulk call's size against the caller's limit bulk (tide.enqueue, tide.emit_many).
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

-- The most executors a role's runs may occupy at once, for tide._claim (executors' path): its
-- limit executors, else every executor but one while another role has work for them (a ready
-- or running run — p_others — or an active task they run), else all of them.
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

-- Whether a role other than the given one owns an active task the executors run
-- (tide._executor_cap): two probes, its lowest and highest owner.
CREATE INDEX task_executor_owner_idx ON tide.task (owner) WHERE NOT paused AND command IS NOT NULL;

-- The executors each role's runs occupy now: its running runs of the executors, but for those a
-- command worker runs (top-level commands, commands in another database). The one count of the
-- executors' share (tide._executor_turn, a late start's cause).
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

-- The roles whose runs a free executor looks at, in turn (the rule above): the roles with ready
-- runs for the executors, fewest occupied executors first, ties in an order drawn at random,
-- without the roles at their limit executors. Called by tide._claim under the choice lock.
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

-- ---------------------------------------------------------------------------------------------
-- Roles come and go. pg_tide's objects (tasks with their runs and history, queues, channels,
-- heartbeat checks, grants) are rows owned by a role's name, not catalog objects PostgreSQL
-- knows of, so pg_tide follows a role's end itself:
--   - in the database pg_tide is installed in, DROP ROLE of a role that owns any of them is
--     refused with a hint (2BP01), REASSIGN OWNED BY moves them with the role's catalog
--     objects, and DROP OWNED BY removes them (src/security/roles.rs);
--   - a role dropped from another database (where pg_tide cannot look) leaves its tasks behind:
--     the tick pauses each one that comes due and an owner_gone alert says why; a superuser or
--     tide_admin lists them (tide.owned_by), gives them to another role (tide.reassign_owned) or
--     removes them (tide.drop_owned, tide.unschedule with owner).

-- The tables of pg_tide with an owner column: what REASSIGN OWNED and DROP OWNED go over.
CREATE FUNCTION tide._owner_tables() RETURNS SETOF regclass
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT c.oid::regclass FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
     WHERE c.relnamespace = 'tide'::regnamespace AND c.relkind = 'r' AND a.attname = 'owner' AND NOT a.attisdropped
     ORDER BY c.relname
$$;
COMMENT ON FUNCTION tide._owner_tables() IS 'Internal: pg_tide''s tables with an owner column.';

-- What a role owns in pg_tide (or was granted), one row per object.
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

-- REASSIGN OWNED for pg_tide: every row of p_old becomes p_new's (its tasks run as p_new from
-- their next run). Refused, writing nothing, when p_new already has a task, queue, channel or
-- heartbeat check of the same name.
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
    -- The hourly counters summed by owner: p_old's hours are added to p_new's.
    WITH gone AS (DELETE FROM tide.owner_hourly x WHERE x.owner = p_old RETURNING x.*)
    INSERT INTO tide.owner_hourly AS x (owner, hour, succeeded, failed, dead, skipped, need_check, cancelled, durations)
    SELECT p_new, g.hour, g.succeeded, g.failed, g.dead, g.skipped, g.need_check, g.cancelled, g.durations FROM gone g
    ON CONFLICT (owner, hour) DO UPDATE
       SET succeeded = x.succeeded + EXCLUDED.succeeded, failed = x.failed + EXCLUDED.failed,
           dead = x.dead + EXCLUDED.dead, skipped = x.skipped + EXCLUDED.skipped,
           need_check = x.need_check + EXCLUDED.need_check, cancelled = x.cancelled + EXCLUDED.cancelled,
           durations = tide._hist_add(x.durations, EXCLUDED.durations);
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

-- DROP OWNED for pg_tide: every row of p_role removed (its tasks with their runs and history,
-- queues, channels, checks, side effects, alerts, grants it gave and was given, its limits).
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

-- A task whose owner no longer exists never fires: the tick pauses a due one as it picks it
-- (src/scheduler/tick.rs), and this every such task (event tasks among them) at each evaluation of
-- alerts; the alert owner_gone says why.
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

-- What each of some roles owns in pg_tide, in words ("3 tasks, 1 queue"), for the roles that
-- own anything: why DROP ROLE of them is refused (src/security/roles.rs).
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

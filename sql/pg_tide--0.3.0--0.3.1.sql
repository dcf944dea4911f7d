-- pg_tide 0.3.0 to 0.3.1: tide.schedule faster with many tasks. A role's limits are read by a
-- PL/pgSQL function, which keeps its plan (an SQL function with SET clauses was planned at every
-- call), and a superuser's, all NULL (not limited), end the check before it counts the tasks the
-- superuser owns; a role's count stops one past its limit. Function bodies only: no table, type
-- or row changes. Run by ALTER EXTENSION pg_tide UPDATE; the upgrade tier
-- (pg_test/tests/upgrade.rs) checks that the result is a fresh 0.3.1.

-- Dropped and made again (pgspot refuses CREATE OR REPLACE in an extension script); both are
-- called by name at run time only (nothing depends on them in the catalog).
DROP FUNCTION tide._role_limits(name);
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

DROP FUNCTION tide._check_role_limits(tide.task);
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

-- Privileges, as a fresh install leaves them (src/comments.sql): internal functions that
-- change anything are pg_tide's own.
REVOKE EXECUTE ON FUNCTION tide._check_role_limits(tide.task) FROM PUBLIC;

-- What the gaps between fires look at, said as the code does it.
COMMENT ON FUNCTION tide._shortest_gap(text, text, text, text) IS
    'Internal: the shortest gap between two consecutive fires of a schedule, over the next 1000 fires or 400 days, whichever ends first (a role''s limit fastest_schedule is checked against it).';
COMMENT ON FUNCTION tide._fire_gap(text, text, text, text) IS
    'Internal: the longest gap between two consecutive fires of a schedule, over the next 1000 fires or 400 days, whichever ends first (the base of a task''s derived max_silence).';
COMMENT ON COLUMN tide.task.fire_gap IS 'Longest gap between two consecutive fires of the schedule (over the next 1000 fires or 400 days, whichever ends first); maintained by pg_tide.';

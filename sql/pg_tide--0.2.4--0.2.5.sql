-- pg_tide 0.2.4 to 0.2.5: membership as PostgreSQL 16 and later define it. A role acts for
-- another (sees and changes its tasks, runs, alerts and grants, receives its alerts) only if it
-- may SET ROLE to it: tide._can_set_role, which every membership test now asks instead of
-- pg_has_role(..., 'MEMBER') (on 16 and later a membership granted WITH SET FALSE is still a
-- MEMBER). On PostgreSQL 15 nothing changes: every membership may SET ROLE there.
-- Run by ALTER EXTENSION pg_tide UPDATE; the upgrade tier (pg_test/tests/upgrade.rs) checks that
-- the schema it leaves is the one a fresh CREATE EXTENSION makes. Functions whose body changed are
-- dropped and created again (pgspot's PS002), but the two that views and row-level security
-- policies depend on, which are replaced in place so that the update locks no table.
\echo Use "ALTER EXTENSION pg_tide UPDATE TO '0.2.5'" to load this file. \quit
SET LOCAL search_path = pg_catalog, pg_temp;

CREATE FUNCTION tide._can_set_role(p_member text, p_role text) RETURNS boolean
LANGUAGE c STABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'can_set_role_sql_wrapper';
COMMENT ON FUNCTION tide._can_set_role(text, text) IS
    'Internal: whether a role may act as another (SET ROLE to it): every membership test of pg_tide.';

-- The row-level security policies' test, replaced in place: 28 policies use it, and dropping
-- it means ALTER POLICY on 28 tables, an ACCESS EXCLUSIVE lock on each, taken one by one while
-- pg_tide's workers run (the upgrade tier saw that deadlock with a worker). Replacing a
-- function locks no table. (CREATE OR REPLACE in an extension script cannot take over a
-- function that is not the extension's: PostgreSQL refuses it. scripts/pgspot.sh allows
-- PS002 for this script alone.)
CREATE OR REPLACE FUNCTION tide._visible(p_owner name) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT p_owner OPERATOR(pg_catalog.=) CURRENT_USER
        OR tide._can_set_role(CURRENT_USER, 'tide_admin')
        OR tide._can_set_role(CURRENT_USER, p_owner)
$$;
COMMENT ON FUNCTION tide._visible(name) IS
    'Internal: whether the current role sees what a role owns: its own, a role it is a member of (a team), or everything for tide_admin.';

-- Changed functions.
-- pg_tide's own health (tide._self), replaced in place too: the views tide.self_health,
-- tide.health and tide.dashboard read it, and stay as they are.
CREATE OR REPLACE FUNCTION tide._self(p_now timestamptz)
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

DROP FUNCTION tide._acts_for();
CREATE FUNCTION tide._acts_for() RETURNS name[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The common cases first, cheaply: a superuser; a role that is a member of no other role.
    IF tide._caller_is_superuser() THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_auth_members m WHERE m.member = to_regrole(quote_ident(tide._caller()))) THEN
        RETURN ARRAY[tide._caller()]::name[];
    END IF;
    IF tide._can_set_role(tide._caller(), 'tide_admin') THEN
        RETURN NULL;
    END IF;
    RETURN ARRAY(SELECT r.rolname FROM pg_roles r WHERE tide._can_set_role(tide._caller(), r.rolname));
END
$$;
COMMENT ON FUNCTION tide._acts_for() IS
    'Internal: the roles the caller acts for (itself and the roles it is a member of), NULL for a superuser or tide_admin.';

DROP FUNCTION tide._granted(text);
CREATE FUNCTION tide._granted(p_privilege text) RETURNS TABLE (owner name, object text)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT g.owner, g.object FROM tide.grant g
     WHERE g.privilege = p_privilege
       AND tide._can_set_role(tide._caller(), g.grantee);
END
$$;
COMMENT ON FUNCTION tide._granted(text) IS 'Internal: the (owner, object) pairs a privilege was granted to the caller for.';

DROP FUNCTION tide._routed(name, name);
CREATE FUNCTION tide._routed(p_channel_owner name, p_alert_owner name) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p_channel_owner = p_alert_owner
        OR EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = p_channel_owner
                      AND (r.rolsuper OR tide._can_set_role(p_channel_owner, 'tide_admin')
                           OR tide._can_set_role(p_channel_owner, p_alert_owner)))
$$;
COMMENT ON FUNCTION tide._routed(name, name) IS
    'Internal: whether a role''s channels and routes receive another role''s alerts (its own, a role it is a member of, or all for a superuser or tide_admin).';

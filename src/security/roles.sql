-- Roles that fit a company: the predefined roles (created in src/tasks/schema.sql) and the grants a
-- task's owner gives other roles.
--
--   tide_admin     sees and manages every role's tasks, runs, alerts (not channels' secrets).
--   tide_worker    a group for worker roles: claims and completes the runs of the queues granted
--                  to it (or to its member) with tide.grant('claim', queue, role).
--   tide_producer  a group for application roles: emits to the topics and enqueues into the
--                  tasks granted with tide.grant('emit', topic, role) / tide.grant('enqueue', task, role).
--
-- A role also acts for the roles it is a member of: a team role can own tasks (SET ROLE team
-- before tide.schedule), and its members see them and run them. Whatever runs, runs as the
-- task's owner: a grant lets a role create or finish runs, never run its own code as another.

CREATE TABLE tide.grant (
    owner      name NOT NULL,
    privilege  text NOT NULL CHECK (privilege IN ('claim', 'emit', 'enqueue')),
    object     text NOT NULL,
    grantee    name NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT grant_pkey PRIMARY KEY (owner, privilege, object, grantee)
);
COMMENT ON TABLE tide.grant IS
    'What a task owner lets other roles do with its work (tide.grant / tide.revoke): claim runs of a queue, emit to a topic, enqueue into a task. A grant to a role holds for its members.';
ALTER TABLE tide.grant ENABLE ROW LEVEL SECURITY;
CREATE POLICY grant_owner ON tide.grant FOR SELECT USING (tide._visible(owner) OR tide._visible(grantee));
GRANT SELECT ON tide.grant TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.grant', '');

-- The roles the caller acts for (itself and the roles it is a member of); NULL: every role (a
-- superuser, a member of tide_admin).
-- This and the two below are PL/pgSQL rather than SQL: they are called once per claim,
-- completion or emit, and an SQL function with a SET clause is parsed and planned again at every
-- call (measured: a tenth of a claim + complete at batch 1), where PL/pgSQL keeps its plans.
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

-- The (owner, object) pairs a privilege was granted to the caller for (directly or through a
-- role it is a member of).
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

-- Whether the caller may work a run (heartbeat, complete, fail, steps): it may act for its
-- owner, or was granted its queue.
CREATE FUNCTION tide._may_work(p_owner name, p_queue text) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN tide._may_act(p_owner)
        OR EXISTS (SELECT 1 FROM tide._granted('claim') g WHERE g.owner = p_owner AND g.object = p_queue);
END
$$;
COMMENT ON FUNCTION tide._may_work(name, text) IS
    'Internal: whether the caller may work a run: it may act for the run''s owner, or was granted claim on its queue.';

-- Granting also needs the role to exist (and, for enqueue, the task); a revoke of a role
-- dropped since still goes through.
-- The task a name means to the caller: its own of that name; else the one task of that name of
-- a role it acts for (a team it is a member of, any role for tide_admin) or, with p_granted,
-- whose owner granted it that privilege on the task. Two such tasks of other roles are
-- ambiguous (42P08). NULL: none. tide.alter, pause, resume ... (src/tasks/catalog.rs) and
-- tide.enqueue find tasks through it.
CREATE FUNCTION tide._named_task(p_name text, p_granted text DEFAULT NULL, p_owner name DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ids bigint[];
BEGIN
    -- With an owner: that role's task of the name, as row-level security lets the caller see it.
    IF p_owner IS NOT NULL THEN
        RETURN (SELECT t.task_id FROM tide.task t WHERE t.name = p_name AND t.owner = p_owner);
    END IF;
    SELECT array_agg(t.task_id) INTO ids FROM tide.task t WHERE t.name = p_name AND t.owner = tide._caller();
    IF ids IS NOT NULL THEN
        RETURN ids[1];
    END IF;
    SELECT array_agg(x.task_id) INTO ids FROM (
        SELECT t.task_id FROM tide.task t
         WHERE t.name = p_name
           AND (tide._may_act(t.owner)
                OR (p_granted IS NOT NULL
                    AND EXISTS (SELECT 1 FROM tide._granted(p_granted) g WHERE g.owner = t.owner AND g.object = t.name)))
         ORDER BY t.task_id LIMIT 2) x;
    IF cardinality(ids) > 1 THEN
        RAISE EXCEPTION 'task name "%" belongs to several roles you act for', left(p_name, 200)
            USING ERRCODE = 'ambiguous_parameter',
                  HINT = 'SET ROLE to the task''s owner first (see SELECT name, owner FROM tide.task)';
    END IF;
    RETURN ids[1];
END
$$;
COMMENT ON FUNCTION tide._named_task(text, text, name) IS
    'Internal: the task a name means to the caller: its own, else the one of a role it acts for (or, with p_granted, that was granted to it); 42P08 when two roles have it. With p_owner: that role''s task of the name, if the caller sees it.';

CREATE FUNCTION tide._grant_args(p_privilege text, p_object text, p_grantee text, p_function text, p_granting boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_privilege IS NULL OR p_privilege NOT IN ('claim', 'emit', 'enqueue') THEN
        RAISE EXCEPTION '%: unknown privilege %', p_function, coalesce(quote_literal(left(p_privilege, 40)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'claim (a queue''s runs, for workers), emit (a topic, for producers) or enqueue (a task, for producers)';
    END IF;
    PERFORM tide._text_arg('object', p_object, 200, 'name the queue, topic or task');
    PERFORM tide._text_arg('role', p_grantee, 63, 'name a role, such as tide_worker or app');
    IF NOT p_granting THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = p_grantee) THEN
        RAISE EXCEPTION '%: role % does not exist', p_function, quote_ident(p_grantee)
            USING ERRCODE = 'undefined_object', HINT = 'create it first (CREATE ROLE), or grant to tide_worker or tide_producer';
    END IF;
    IF p_privilege = 'enqueue' AND NOT EXISTS (SELECT 1 FROM tide.task t WHERE t.name = p_object AND t.owner = tide._caller()) THEN
        RAISE EXCEPTION '%: task "%" does not exist', p_function, left(p_object, 200)
            USING ERRCODE = 'undefined_object', HINT = 'grant enqueue on one of your tasks: SELECT name FROM tide.task';
    END IF;
END
$$;
COMMENT ON FUNCTION tide._grant_args(text, text, text, text, boolean) IS 'Internal: the arguments of tide.grant and tide.revoke, checked.';

CREATE FUNCTION tide.grant(privilege text, object text, role text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._grant_args($1, $2, $3, 'tide.grant', true);
    INSERT INTO tide.grant (owner, privilege, object, grantee) VALUES (tide._caller(), $1, $2, $3)
    ON CONFLICT ON CONSTRAINT grant_pkey DO NOTHING;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION tide.grant(text, text, text) IS
    'grant(privilege, object, role): lets a role (and its members) claim and finish the runs of one of your queues (claim), emit to a topic your tasks subscribe to (emit), or enqueue into one of your tasks (enqueue). Runs stay yours and run as you. False if it was granted already.';

CREATE FUNCTION tide.revoke(privilege text, object text, role text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._grant_args($1, $2, $3, 'tide.revoke', false);
    DELETE FROM tide.grant g WHERE g.owner = tide._caller() AND g.privilege = $1 AND g.object = $2 AND g.grantee = $3;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION tide.revoke(text, text, text) IS
    'revoke(privilege, object, role): takes back a grant of tide.grant (runs already claimed finish); false if there was none.';

-- pg_tide locks: per-object locks with fencing, overlap control (queue, skip, allow with
-- max_concurrency) and the one-at-a-time order of serial groups (an overlap-queue task's windows,
-- an event task's runs of one key).
--
-- How a claim decides (tide._claim calls tide._admit for gated runs only; a plain run pays
-- nothing): a run in a serial group (overlap queue: its task; an event run: its task and key)
-- goes only when nothing of its group runs and no earlier run of the group waits; a run of a
-- task with overlap skip is skipped while another runs; max_concurrency counts the task's
-- running runs; a run with a lock key takes its row in tide.lock. A run that cannot go is
-- parked (out of the claim indexes) until the run it waits for ends and wakes it (tide._wake),
-- or after pg_tide's park time in any case.
--
-- No advisory locks: any role can take any advisory lock, so one held in a psql session could
-- freeze a task's runs (and every claim behind them). Two claims never both say yes because
-- each decision is made under a row lock no role can take (roles cannot UPDATE pg_tide's
-- tables, so they cannot lock their rows): the candidate's own tide.pending row (a serial
-- group's head goes only when it is the group's earliest run, and no other claim holds it),
-- the task's row (overlap skip, max_concurrency), the key's row in tide.lock. Every such wait
-- is bounded by lock_timeout; a candidate that cannot decide in time waits for a later claim.

CREATE TABLE tide.lock (
    owner       name NOT NULL,
    key         text NOT NULL,
    run_id      bigint NOT NULL,
    task_id     bigint NOT NULL,
    lease_token bigint NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (owner, key)
);
CREATE INDEX lock_run_idx ON tide.lock (run_id);
COMMENT ON TABLE tide.lock IS
    'Per-object locks: one row per business object (key) held by a running run, with the run''s fencing token and an expiry that tide.heartbeat_run renews. Taken when a run is claimed, released when it ends; an expired lock is taken over and its old holder fenced out. Keys are shared by all tasks of one role.';
COMMENT ON COLUMN tide.lock.key IS 'The business object, from the task''s lock_key template (such as account:42).';
COMMENT ON COLUMN tide.lock.lease_token IS 'Fencing token of the holding claim (tide.run.lease_token).';
COMMENT ON COLUMN tide.lock.expires_at IS 'The holder''s lease expiry; renewed by tide.heartbeat_run (and each batch of a long task).';
ALTER TABLE tide.lock ENABLE ROW LEVEL SECURITY;
CREATE POLICY lock_owner ON tide.lock FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.lock TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.lock', '');

-- The lease of a claim: given, or the task's lease (external workers), or its timeout plus a
-- margin (pg_tide's executors).
-- (STABLE, as the text-to-interval casts in it are: so it is inlined into the claim.)
-- Inlined into its callers (on the hot paths of claims, emits and the tick), so it has no SET
-- clause, which would forbid inlining: its body names everything with its schema instead, so it
-- is safe under any search_path (scripts/pgspot.sh lists it).
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

-- How long a parked run waits at most before a claim looks at it again, in case the run it
-- waits for never wakes it (it was deleted, say).
CREATE FUNCTION tide._park_time() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT interval '1 minute' $$;
COMMENT ON FUNCTION tide._park_time() IS 'Internal: the longest a parked run waits before a claim looks at it again.';

-- A run's serial group: the task for a window run of an overlap-queue task and for every run
-- of a long task (R1.3: a long task never runs twice at once, unless its overlap says
-- otherwise), the task and key for an event run with a key; NULL otherwise.
-- Inlined into its callers (on the hot paths of claims, emits and the tick), so it has no SET
-- clause, which would forbid inlining: its body names everything with its schema instead, so it
-- is safe under any search_path (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._gate(p_task_id bigint, p_overlap text, p_window_start timestamptz, p_event_key text,
                           p_long boolean)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_long AND coalesce(p_overlap, 'queue') OPERATOR(pg_catalog.=) 'queue'
                THEN p_task_id::pg_catalog.text
                WHEN p_window_start IS NULL
                THEN p_task_id::pg_catalog.text OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) p_event_key
                WHEN coalesce(p_overlap, 'queue') OPERATOR(pg_catalog.=) 'queue' THEN p_task_id::pg_catalog.text END
$$;
COMMENT ON FUNCTION tide._gate(bigint, text, timestamptz, text, boolean) IS
    'Internal: a run''s serial group (overlap queue: the task, and every run of a long task; an event run with a key: the task and key).';

-- Whether a claim must check a run at all; a plain run (no group, no lock, overlap allow
-- without a limit) goes by the fast path.
-- Inlined into its callers (on the hot paths of claims, emits and the tick), so it has no SET
-- clause, which would forbid inlining: its body names everything with its schema instead, so it
-- is safe under any search_path (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._gated(p_gate text, p_lock_key text, p_overlap text, p_window_start timestamptz,
                            p_max_concurrency integer)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_gate IS NOT NULL OR p_lock_key IS NOT NULL
           OR (p_window_start IS NOT NULL AND p_overlap OPERATOR(pg_catalog.=) 'skip')
           OR p_max_concurrency IS NOT NULL
$$;
COMMENT ON FUNCTION tide._gated(text, text, text, timestamptz, integer) IS
    'Internal: whether a claim must check a run (serial group, lock key, overlap skip or max_concurrency).';

-- A run's serial group, lock key and whether a claim must check it, from its rule version's
-- lock_key template, overlap, long and max_concurrency (read once per task by the bulk paths,
-- rather than a rule version and a task looked up for every run: 6% of a bulk enqueue of
-- 20,000 runs).
-- Inlined into its callers (on the hot paths of claims, emits and the tick), so it has no SET
-- clause, which would forbid inlining: its body names everything with its schema instead, so it
-- is safe under any search_path (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._gating_by(p_lock_rule text, p_overlap text, p_long boolean, p_max_concurrency integer,
                                p_task_id bigint, p_task_name text, p_args jsonb, p_payload jsonb,
                                p_event_key text, p_biz_date date, p_window_start timestamptz)
RETURNS TABLE (gate text, lock_key text, gated boolean)
LANGUAGE sql STABLE
AS $$
    SELECT g.gate, k.lock_key, tide._gated(g.gate, k.lock_key, p_overlap, p_window_start, p_max_concurrency)
      FROM (SELECT CASE WHEN p_lock_rule IS NOT NULL
                        THEN tide._lock_key(p_lock_rule, p_task_name, p_args, p_payload, p_event_key,
                                            p_biz_date::pg_catalog.text)
                   END AS lock_key) k
     CROSS JOIN (SELECT tide._gate(p_task_id, p_overlap, p_window_start, p_event_key, coalesce(p_long, false))
                        AS gate) g
$$;
COMMENT ON FUNCTION tide._gating_by(text, text, boolean, integer, bigint, text, jsonb, jsonb, text, date, timestamptz) IS
    'Internal: a run''s serial group, lock key and gated flag from its rule version''s lock_key, overlap, long and max_concurrency.';

-- The same, under a rule version looked up by task and version.
CREATE FUNCTION tide._gating_of(p_task_id bigint, p_version integer, p_args jsonb, p_payload jsonb,
                                p_event_key text, p_biz_date date, p_window_start timestamptz)
RETURNS TABLE (gate text, lock_key text, gated boolean)
LANGUAGE sql STABLE
AS $$
    SELECT b.gate, b.lock_key, b.gated
      FROM tide.task_version v
      JOIN tide.task t ON t.task_id OPERATOR(pg_catalog.=) v.task_id
     CROSS JOIN LATERAL tide._gating_by(v.rules OPERATOR(pg_catalog.->>) 'lock_key',
                                        v.rules OPERATOR(pg_catalog.->>) 'overlap',
                                        (v.rules OPERATOR(pg_catalog.->>) 'long')::pg_catalog.bool,
                                        (v.rules OPERATOR(pg_catalog.->>) 'max_concurrency')::pg_catalog.int4,
                                        p_task_id, t.name, p_args, p_payload, p_event_key, p_biz_date,
                                        p_window_start) b
     WHERE v.task_id OPERATOR(pg_catalog.=) p_task_id AND v.version OPERATOR(pg_catalog.=) p_version
$$;
COMMENT ON FUNCTION tide._gating_of(bigint, integer, jsonb, jsonb, text, date, timestamptz) IS
    'Internal: a run''s serial group, lock key and gated flag under a rule version.';

-- A new run's gating. Not when it is already set: tide.emit sets it itself, and pg_dump
-- restores runs with COPY. (No UPDATE trigger: a BEFORE UPDATE row trigger makes every update
-- of a run fetch and lock the old row first, claims and completions included; the few paths
-- that change a run's version or args call tide._regate.)
CREATE FUNCTION tide._run_gating() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.gated IS NULL THEN
        SELECT g.gate, g.lock_key, g.gated INTO NEW.gate, NEW.lock_key, NEW.gated
          FROM tide._gating_of(NEW.task_id, NEW.version, NEW.args, NEW.payload, NEW.event_key, NEW.biz_date,
                               NEW.window_start) g;
    END IF;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION tide._run_gating() IS
    'Trigger: computes a new run''s serial group (gate), lock key and gated flag from its rule version, args and event.';
-- (The WHEN clause is evaluated without calling the function: a bulk emit or enqueue, which
-- sets the gating itself, pays nothing per run.)
CREATE TRIGGER run_gating_insert BEFORE INSERT ON tide.run
    FOR EACH ROW WHEN (NEW.gated IS NULL) EXECUTE FUNCTION tide._run_gating();

-- Runs whose rule version or args changed (reopened, adopted, confirmed) take the gating of
-- their new rules.
CREATE FUNCTION tide._regate(p_run_ids bigint[]) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE tide.run r SET gate = g.gate, lock_key = g.lock_key, gated = g.gated
      FROM tide.run x
     CROSS JOIN LATERAL tide._gating_of(x.task_id, x.version, x.args, x.payload, x.event_key, x.biz_date,
                                        x.window_start) g
     WHERE x.run_id = ANY (p_run_ids) AND r.run_id = x.run_id;
    UPDATE tide.pending p SET gate = r.gate, lock_key = r.lock_key, gated = coalesce(r.gated, false)
      FROM tide.run r WHERE r.run_id = ANY (p_run_ids) AND p.run_id = r.run_id;
END
$$;
COMMENT ON FUNCTION tide._regate(bigint[]) IS
    'Internal: recomputes the gating of runs whose rule version or args changed (in tide.run and tide.pending).';

-- Parks a ready run that cannot go yet.
CREATE FUNCTION tide._park(p_run_id bigint, p_until timestamptz) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE tide.pending p SET parked = true, due_at = least(p_until, statement_timestamp() + tide._park_time())
     WHERE p.run_id = p_run_id AND p.state = 'ready'
$$;
COMMENT ON FUNCTION tide._park(bigint, timestamptz) IS 'Internal: takes a ready run out of the claim indexes until woken or until the time given.';

-- The runs that may go now that these runs moved (ended, failed, paused, ...): the next of
-- each serial group, the oldest waiting run of each lock key nobody holds, as many of a task's
-- waiting runs as it has free slots.
--
-- The targets are chosen without looking at `parked`: a claim that is parking one of them right
-- now has not committed yet, so its park is not visible here. Updating the run instead waits
-- for that claim's row lock and then sees its park (READ COMMITTED re-checks the updated row),
-- so no wake-up is lost. Unparking a run that was not parked changes nothing; a run enqueued
-- for later (run_at, due_at ahead) and not yet due is never a target: it keeps its wait.
CREATE FUNCTION tide._wake(p_run_ids bigint[]) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- The rows it waits for are held by claims (committed at once) or by an owner's own open
-- transaction: wait a little, never long (tide._release then leaves the wake-up to the park
-- time).
SET lock_timeout = '2s'
AS $$
DECLARE
    rec record;
    woken bigint[] := '{}';
    more bigint[];
BEGIN
    FOR rec IN SELECT DISTINCT r.gate FROM tide.run r WHERE r.run_id = ANY (p_run_ids) AND r.gate IS NOT NULL LOOP
        WITH w AS (
            UPDATE tide.pending p SET parked = false, due_at = NULL
             WHERE p.run_id = (SELECT q.run_id FROM tide.pending q
                                WHERE q.gate = rec.gate AND q.state IN ('ready', 'retry', 'running', 'paused')
                                ORDER BY q.run_id LIMIT 1)
               AND p.state = 'ready' AND (p.parked OR p.due_at IS NULL OR p.due_at <= statement_timestamp())
               AND NOT EXISTS (SELECT 1 FROM tide.pending q WHERE q.gate = rec.gate AND q.state = 'running')
            RETURNING p.run_id)
        SELECT array_agg(w.run_id) INTO more FROM w;
        woken := woken || coalesce(more, '{}');
    END LOOP;
    FOR rec IN SELECT DISTINCT r.owner, r.lock_key FROM tide.run r WHERE r.run_id = ANY (p_run_ids) AND r.lock_key IS NOT NULL LOOP
        WITH w AS (
            UPDATE tide.pending p SET parked = false, due_at = NULL
             WHERE p.run_id = (SELECT q.run_id FROM tide.pending q
                                WHERE q.lock_key = rec.lock_key AND q.owner = rec.owner AND q.state = 'ready'
                                  AND (q.parked OR q.due_at IS NULL OR q.due_at <= statement_timestamp())
                                ORDER BY q.run_id LIMIT 1)
               AND p.state = 'ready' AND (p.parked OR p.due_at IS NULL OR p.due_at <= statement_timestamp())
               AND NOT EXISTS (SELECT 1 FROM tide.lock l
                                WHERE l.owner = rec.owner AND l.key = rec.lock_key AND l.expires_at > now())
            RETURNING p.run_id)
        SELECT array_agg(w.run_id) INTO more FROM w;
        woken := woken || coalesce(more, '{}');
    END LOOP;
    FOR rec IN SELECT t.task_id, t.max_concurrency FROM tide.task t
                WHERE t.task_id IN (SELECT r.task_id FROM tide.run r WHERE r.run_id = ANY (p_run_ids))
                  AND t.max_concurrency IS NOT NULL LOOP
        -- Several rows: locked in run order, so two runs of the task ending at once wait for
        -- each other instead of deadlocking.
        WITH target AS (
            SELECT q.run_id FROM tide.pending q
             WHERE q.task_id = rec.task_id AND q.gated AND q.state = 'ready'
               AND (q.parked OR q.due_at IS NULL OR q.due_at <= statement_timestamp())
             ORDER BY q.run_id
             LIMIT greatest(0, rec.max_concurrency
                               - (SELECT count(*) FROM tide.pending x
                                   WHERE x.task_id = rec.task_id AND x.gated AND x.state = 'running'))
               FOR UPDATE
        ), w AS (
            UPDATE tide.pending p SET parked = false, due_at = NULL
              FROM target t
             WHERE p.run_id = t.run_id AND p.state = 'ready' AND (p.parked OR p.due_at IS NULL OR p.due_at <= statement_timestamp())
            RETURNING p.run_id)
        SELECT array_agg(w.run_id) INTO more FROM w;
        woken := woken || coalesce(more, '{}');
    END LOOP;
    IF cardinality(woken) > 0 THEN
        PERFORM tide._ready(ARRAY[q.queue]), CASE WHEN q.sql THEN tide._wake(false) END
           FROM (SELECT p.queue, bool_or(p.executor = 'sql') AS sql FROM tide.pending p
                  WHERE p.run_id = ANY (woken) GROUP BY p.queue) q;
    END IF;
    RETURN cardinality(woken);
END
$$;
COMMENT ON FUNCTION tide._wake(bigint[]) IS
    'Internal: unparks the runs that may go now that these runs moved: the next of their serial groups, the oldest waiter of their freed lock keys, waiters for free slots of their tasks.';

-- A run that stopped running gives back its lock and wakes who waits. (Called for runs that no
-- longer run: completed, failed, or moved by tide._run_changed to a state other than running.)
CREATE FUNCTION tide._release(p_run_ids bigint[]) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM tide.lock l WHERE l.run_id = ANY (p_run_ids);
    -- Who can wait for these runs: runs of their lock keys (any task's), or a ready run of their
    -- own tasks (a serial group, max_concurrency). With none, as for a scheduled task's run with
    -- nothing of its task in line (the common case), there is nothing to wake, and no
    -- subtransaction to open. (A run another claim is parking right now still reads as ready.)
    IF NOT EXISTS (SELECT 1 FROM tide.run r
                    WHERE r.run_id = ANY (p_run_ids)
                      AND (r.lock_key IS NOT NULL
                           OR EXISTS (SELECT 1 FROM tide.pending q
                                       WHERE q.task_id = r.task_id AND q.gated AND q.state = 'ready'))) THEN
        RETURN;
    END IF;
    BEGIN
        PERFORM tide._wake(p_run_ids);
    EXCEPTION WHEN lock_not_available THEN
        -- A run to wake is held by a long transaction: it wakes at its park time instead.
        NULL;
    END;
END
$$;
COMMENT ON FUNCTION tide._release(bigint[]) IS
    'Internal: frees the locks of runs that no longer run and wakes the runs waiting for them.';

-- Which of the claimed candidates may go; the others are parked, deferred or skipped. Called by
-- tide._claim only when a candidate is gated. Each candidate is decided in its own
-- subtransaction: a lock it cannot get within lock_timeout parks it for a second, and the
-- claim goes on with the others.
CREATE FUNCTION tide._admit(p_ids bigint[], p_token bigint, p_executor tide.executor, p_lease interval)
RETURNS bigint[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $$
DECLARE
    c record;
    running bigint;
    blocker bigint;
    l tide.lock;
    admitted bigint[] := '{}';
    taken bigint;
    -- Later candidates of this claim see the earlier ones admitted as running: only a claim of
    -- several needs to mark them so before its final update.
    several boolean := cardinality(p_ids) > 1;
BEGIN
    FOR c IN SELECT p.run_id, p.task_id, p.gate, p.lock_key, p.gated, p.owner, r.window_start, v.rules
               FROM tide.pending p
               JOIN tide.run r ON r.run_id = p.run_id
               JOIN tide.task_version v ON v.task_id = r.task_id AND v.version = r.version
              WHERE p.run_id = ANY (p_ids)
              ORDER BY p.priority DESC, p.run_id LOOP
        IF NOT c.gated THEN
            admitted := admitted || c.run_id;
            CONTINUE;
        END IF;
        -- One at a time per serial group, in run order: only the group's earliest unfinished run
        -- goes, and only when nothing of the group runs. This claim holds the candidate's row, so
        -- no other claim decides about it; a later run of the group sees it and waits. (A read
        -- and, at most, an update of the candidate's own row, which this claim holds: no wait.)
        IF c.gate IS NOT NULL THEN
            SELECT q.run_id INTO blocker FROM tide.pending q
             WHERE q.gate = c.gate AND q.run_id <> c.run_id
               AND (q.state = 'running' OR (q.state IN ('ready', 'retry', 'paused') AND q.run_id < c.run_id))
             ORDER BY q.state = 'running' DESC, q.run_id LIMIT 1;
            IF FOUND THEN
                PERFORM tide._park(c.run_id, statement_timestamp() + tide._park_time());
                CONTINUE;
            END IF;
            -- Nothing else to decide (the common case, every scheduled task's serial group):
            -- no lock to wait for, so no subtransaction either.
            IF c.lock_key IS NULL AND c.rules->>'max_concurrency' IS NULL
               AND NOT (c.window_start IS NOT NULL AND c.rules->>'overlap' = 'skip') THEN
                IF several THEN
                    UPDATE tide.pending SET state = 'running' WHERE run_id = c.run_id;
                END IF;
                admitted := admitted || c.run_id;
                CONTINUE;
            END IF;
        END IF;
        BEGIN
            -- Overlap skip and max_concurrency count the task's running runs, under the task's
            -- row lock (another claim of the task waits for this one to commit).
            IF (c.window_start IS NOT NULL AND c.rules->>'overlap' = 'skip') OR c.rules->>'max_concurrency' IS NOT NULL THEN
                PERFORM 1 FROM tide.task t WHERE t.task_id = c.task_id FOR NO KEY UPDATE;
                SELECT count(*) INTO running FROM tide.pending q
                 WHERE q.task_id = c.task_id AND q.gated AND q.state = 'running';
                IF c.window_start IS NOT NULL AND c.rules->>'overlap' = 'skip' AND running > 0 THEN
                    UPDATE tide.run SET state = 'skipped', skip_reason = 'overlap', finished_at = statement_timestamp(), updated_at = statement_timestamp(),
                                        reason = 'skipped: another run of the task was still running (overlap skip)'
                     WHERE run_id = c.run_id;
                    CONTINUE;
                END IF;
                IF running >= (c.rules->>'max_concurrency')::integer THEN
                    PERFORM tide._park(c.run_id, statement_timestamp() + tide._park_time());
                    CONTINUE;
                END IF;
            END IF;
            -- The business object's lock: free, expired (its holder is fenced out), or busy (the
            -- run is deferred: recorded, not an attempt). Claims of one key wait for each other
            -- on the key's row (or on its insertion).
            IF c.lock_key IS NOT NULL THEN
                SELECT * INTO l FROM tide.lock x WHERE x.owner = c.owner AND x.key = c.lock_key FOR UPDATE;
                IF FOUND AND l.run_id <> c.run_id THEN
                    IF l.expires_at > statement_timestamp() THEN
                        PERFORM tide._defer(c.run_id, c.lock_key, l.run_id, l.expires_at);
                        CONTINUE;
                    END IF;
                    PERFORM 1 FROM tide.run x WHERE x.run_id = l.run_id AND x.state = 'running' AND x.lease_token = l.lease_token
                        FOR UPDATE;
                    IF FOUND THEN
                        PERFORM tide._fail(l.run_id, format('lock %s expired (token %s) and was taken over by run %s',
                                                            c.lock_key, l.lease_token, c.run_id),
                                           'transient', NULL, 'lost', statement_timestamp());
                    END IF;
                END IF;
                INSERT INTO tide.lock AS x (owner, key, run_id, task_id, lease_token, acquired_at, expires_at)
                VALUES (c.owner, c.lock_key, c.run_id, c.task_id, p_token, statement_timestamp(), statement_timestamp() + tide._lease_length(p_executor, c.rules, p_lease))
                ON CONFLICT ON CONSTRAINT lock_pkey DO UPDATE
                   SET run_id = EXCLUDED.run_id, task_id = EXCLUDED.task_id, lease_token = EXCLUDED.lease_token,
                       acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at
                 WHERE x.run_id = EXCLUDED.run_id OR x.expires_at <= statement_timestamp()
                RETURNING x.run_id INTO taken;
                IF taken IS NULL THEN
                    -- Another claim took the key meanwhile.
                    SELECT * INTO l FROM tide.lock x WHERE x.owner = c.owner AND x.key = c.lock_key;
                    PERFORM tide._defer(c.run_id, c.lock_key, l.run_id, l.expires_at);
                    CONTINUE;
                END IF;
            END IF;
            -- Running already for the checks of later candidates of this claim.
            IF several THEN
                UPDATE tide.pending SET state = 'running' WHERE run_id = c.run_id;
            END IF;
            admitted := admitted || c.run_id;
        EXCEPTION WHEN lock_not_available THEN
            -- Held by a transaction that does not end soon: this run waits a second for a later
            -- claim, the others go on.
            PERFORM tide._park(c.run_id, statement_timestamp() + interval '1 second');
        END;
    END LOOP;
    RETURN admitted;
END
$$;
-- A run whose lock key is busy waits for the holder to end (it wakes it) or for the lock to
-- expire.
CREATE FUNCTION tide._defer(p_run_id bigint, p_key text, p_holder bigint, p_until timestamptz) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE tide.run SET updated_at = statement_timestamp(),
           reason = format('deferred: lock %s is held by run %s until %s', p_key, p_holder,
                           to_char(p_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS" UTC"'))
     WHERE run_id = p_run_id;
    PERFORM tide._park(p_run_id, p_until);
END
$$;
COMMENT ON FUNCTION tide._defer(bigint, text, bigint, timestamptz) IS
    'Internal: records that a run waits for a busy lock key and parks it until the lock expires (or its holder wakes it).';
COMMENT ON FUNCTION tide._admit(bigint[], bigint, tide.executor, interval) IS
    'Internal: decides which claimed candidates may run now (serial group, overlap, max_concurrency, lock key) and takes their locks; parks, defers or skips the rest.';

-- pg_tide guarantees: per-object locks with fencing, overlap control (queue, skip, allow with
-- max_concurrency), per-key order of event runs, event tasks (tide.emit, emit_on_change), and
-- the controls of long runs (pause_run, resume_run, cancel_run).
--
-- How a claim decides (tide._claim calls tide._admit for gated runs only; a plain run pays
-- nothing): a run in a serial group (overlap queue: its task; an event run: its task and key)
-- goes only when nothing of its group runs and no earlier run of the group waits; a run of a
-- task with overlap skip is skipped while another runs; max_concurrency counts the task's
-- running runs; a run with a lock key takes its row in tide.lock. Each decision holds a
-- transaction-level advisory lock on what it decides about, so two claimers never both say yes.
-- A run that cannot go is parked (out of the claim indexes) until the run it waits for ends and
-- wakes it (tide._wake), or after pg_tide's park time in any case.

-- Advisory lock class of pg_tide's decisions ('tide' in ASCII).
CREATE FUNCTION tide._lock_class() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1952064613 $$;
COMMENT ON FUNCTION tide._lock_class() IS 'Internal: the class id of pg_tide''s transaction-level advisory locks.';

CREATE TABLE tide.lock (
    owner       name NOT NULL,
    key         text NOT NULL,
    run_id      bigint NOT NULL,
    task_id     bigint NOT NULL,
    token       bigint NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (owner, key)
);
CREATE INDEX lock_run_idx ON tide.lock (run_id);
COMMENT ON TABLE tide.lock IS
    'Per-object locks: one row per business object (key) held by a running run, with the run''s fencing token and an expiry that tide.heartbeat renews. Taken when a run is claimed, released when it ends; an expired lock is taken over and its old holder fenced out. Keys are shared by all tasks of one role.';
COMMENT ON COLUMN tide.lock.key IS 'The business object, from the task''s lock_key template (such as account:42).';
COMMENT ON COLUMN tide.lock.token IS 'Fencing token of the holding claim (tide.run.lease_token).';
COMMENT ON COLUMN tide.lock.expires_at IS 'The holder''s lease expiry; renewed by tide.heartbeat (and each batch of a long task).';
ALTER TABLE tide.lock ENABLE ROW LEVEL SECURITY;
CREATE POLICY lock_owner ON tide.lock USING (owner = current_user) WITH CHECK (owner = current_user);
GRANT SELECT, INSERT, UPDATE, DELETE ON tide.lock TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.lock', '');

-- The lease of a claim: given, or the task's lease (external workers), or its timeout plus a
-- margin (pg_tide's executors).
-- (STABLE, as the text-to-interval casts in it are: so it is inlined into the claim.)
CREATE FUNCTION tide._lease_length(p_executor tide.executor, rules jsonb, p_lease interval) RETURNS interval
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT coalesce(p_lease, CASE WHEN p_executor = 'sql'
        THEN (rules->>'timeout')::interval + least((rules->>'timeout')::interval, interval '1 minute')
        ELSE (rules->>'lease')::interval END)
$$;
COMMENT ON FUNCTION tide._lease_length(tide.executor, jsonb, interval) IS
    'Internal: the lease length of a claim (the given one, the task''s lease, or an SQL run''s timeout plus a margin).';

-- How long a parked run waits at most before a claim looks at it again, in case the run it
-- waits for never wakes it (it was deleted, say).
CREATE FUNCTION tide._park_time() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '1 minute' $$;
COMMENT ON FUNCTION tide._park_time() IS 'Internal: the longest a parked run waits before a claim looks at it again.';

-- A run's serial group: the task for a window run of an overlap-queue task, the task and key
-- for an event run with a key; NULL otherwise.
CREATE FUNCTION tide._gate(p_task_id bigint, p_overlap text, p_window_start timestamptz, p_event_key text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_window_start IS NULL THEN p_task_id::text || ':' || p_event_key
                WHEN coalesce(p_overlap, 'queue') = 'queue' THEN p_task_id::text END
$$;
COMMENT ON FUNCTION tide._gate(bigint, text, timestamptz, text) IS
    'Internal: a run''s serial group (overlap queue: the task; an event run with a key: the task and key).';

-- Whether a claim must check a run at all; a plain run (no group, no lock, overlap allow
-- without a limit) goes by the fast path.
CREATE FUNCTION tide._gated(p_gate text, p_lock_key text, p_overlap text, p_window_start timestamptz,
                            p_max_concurrency integer)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_gate IS NOT NULL OR p_lock_key IS NOT NULL OR (p_window_start IS NOT NULL AND p_overlap = 'skip')
           OR p_max_concurrency IS NOT NULL
$$;
COMMENT ON FUNCTION tide._gated(text, text, text, timestamptz, integer) IS
    'Internal: whether a claim must check a run (serial group, lock key, overlap skip or max_concurrency).';

-- A new run's serial group, lock key and whether a claim must check it; again when its rule
-- version or args change. Not when they are already set: tide.emit sets them itself, and
-- pg_dump restores runs with COPY.
CREATE FUNCTION tide.run_gating() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    rules jsonb;
    task_name text;
BEGIN
    IF TG_OP = 'INSERT' AND NEW.gated IS NOT NULL THEN
        RETURN NEW;
    END IF;
    SELECT v.rules, t.name INTO rules, task_name
      FROM tide.task_version v JOIN tide.task t ON t.task_id = v.task_id
     WHERE v.task_id = NEW.task_id AND v.version = NEW.version;
    NEW.lock_key := CASE WHEN rules->>'lock_key' IS NOT NULL
                         THEN tide._lock_key(rules->>'lock_key', task_name, NEW.args, NEW.payload, NEW.event_key,
                                             NEW.biz_date::text) END;
    NEW.gate := tide._gate(NEW.task_id, rules->>'overlap', NEW.window_start, NEW.event_key);
    NEW.gated := tide._gated(NEW.gate, NEW.lock_key, rules->>'overlap', NEW.window_start,
                             (rules->>'max_concurrency')::integer);
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION tide.run_gating() IS
    'Trigger: computes a run''s serial group (gate), lock key and gated flag from its rule version, args and event.';
CREATE TRIGGER run_gating_insert BEFORE INSERT ON tide.run
    FOR EACH ROW EXECUTE FUNCTION tide.run_gating();
CREATE TRIGGER run_gating_update BEFORE UPDATE OF version, args ON tide.run
    FOR EACH ROW WHEN (OLD.version IS DISTINCT FROM NEW.version OR OLD.args IS DISTINCT FROM NEW.args)
    EXECUTE FUNCTION tide.run_gating();

-- Parks a ready run that cannot go yet.
CREATE FUNCTION tide._park(p_run_id bigint, p_until timestamptz) RETURNS void
LANGUAGE sql
AS $$
    UPDATE tide.pending p SET parked = true, due_at = least(p_until, now() + tide._park_time())
     WHERE p.run_id = p_run_id AND p.state = 'ready'
$$;
COMMENT ON FUNCTION tide._park(bigint, timestamptz) IS 'Internal: takes a ready run out of the claim indexes until woken or until the time given.';

-- The runs that may go now that these runs moved (ended, failed, paused, ...): the next of
-- each serial group, the oldest waiter of each lock key nobody holds, as many of a task's
-- waiters as it has free slots.
CREATE FUNCTION tide._wake(p_run_ids bigint[]) RETURNS integer
LANGUAGE plpgsql
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
               AND p.parked AND p.state = 'ready'
               AND NOT EXISTS (SELECT 1 FROM tide.pending q WHERE q.gate = rec.gate AND q.state = 'running')
            RETURNING p.run_id)
        SELECT array_agg(w.run_id) INTO more FROM w;
        woken := woken || coalesce(more, '{}');
    END LOOP;
    FOR rec IN SELECT DISTINCT r.owner, r.lock_key FROM tide.run r WHERE r.run_id = ANY (p_run_ids) AND r.lock_key IS NOT NULL LOOP
        WITH w AS (
            UPDATE tide.pending p SET parked = false, due_at = NULL
             WHERE p.run_id = (SELECT q.run_id FROM tide.pending q
                                WHERE q.lock_key = rec.lock_key AND q.owner = rec.owner AND q.state = 'ready' AND q.parked
                                ORDER BY q.run_id LIMIT 1)
               AND NOT EXISTS (SELECT 1 FROM tide.lock l
                                WHERE l.owner = rec.owner AND l.key = rec.lock_key AND l.expires_at > now())
            RETURNING p.run_id)
        SELECT array_agg(w.run_id) INTO more FROM w;
        woken := woken || coalesce(more, '{}');
    END LOOP;
    FOR rec IN SELECT t.task_id, t.max_concurrency FROM tide.task t
                WHERE t.task_id IN (SELECT r.task_id FROM tide.run r WHERE r.run_id = ANY (p_run_ids))
                  AND t.max_concurrency IS NOT NULL LOOP
        WITH w AS (
            UPDATE tide.pending p SET parked = false, due_at = NULL
             WHERE p.run_id IN (SELECT q.run_id FROM tide.pending q
                                 WHERE q.task_id = rec.task_id AND q.gated AND q.state = 'ready' AND q.parked
                                 ORDER BY q.run_id
                                 LIMIT greatest(0, rec.max_concurrency
                                                   - (SELECT count(*) FROM tide.pending x
                                                       WHERE x.task_id = rec.task_id AND x.gated AND x.state = 'running')))
            RETURNING p.run_id)
        SELECT array_agg(w.run_id) INTO more FROM w;
        woken := woken || coalesce(more, '{}');
    END LOOP;
    IF cardinality(woken) > 0 THEN
        PERFORM pg_notify('pg_tide_ready', q.queue)
           FROM (SELECT DISTINCT p.queue FROM tide.pending p WHERE p.run_id = ANY (woken)) q;
    END IF;
    RETURN cardinality(woken);
END
$$;
COMMENT ON FUNCTION tide._wake(bigint[]) IS
    'Internal: unparks the runs that may go now that these runs moved: the next of their serial groups, the oldest waiter of their freed lock keys, waiters for free slots of their tasks.';

-- A run that stopped running gives back its lock and wakes who waits.
CREATE FUNCTION tide._release(p_run_ids bigint[]) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM tide.lock l WHERE l.run_id = ANY (p_run_ids)
       AND NOT EXISTS (SELECT 1 FROM tide.run r WHERE r.run_id = l.run_id AND r.state = 'running'
                                                 AND r.lease_token = l.token);
    PERFORM tide._wake(p_run_ids);
END
$$;
COMMENT ON FUNCTION tide._release(bigint[]) IS
    'Internal: frees the locks of runs that no longer run and wakes the runs waiting for them.';

-- Which of the claimed candidates may go; the others are parked, deferred or skipped. Called by
-- tide._claim only when a candidate is gated.
CREATE FUNCTION tide._admit(p_ids bigint[], p_token bigint, p_executor tide.executor, p_lease interval)
RETURNS bigint[]
LANGUAGE plpgsql
AS $$
DECLARE
    c record;
    rules jsonb;
    running bigint;
    blocker bigint;
    l tide.lock;
    admitted bigint[] := '{}';
BEGIN
    FOR c IN SELECT p.run_id, p.task_id, p.gate, p.lock_key, p.gated, p.owner, r.window_start, r.version
               FROM tide.pending p JOIN tide.run r ON r.run_id = p.run_id
              WHERE p.run_id = ANY (p_ids)
              ORDER BY p.priority DESC, p.run_id LOOP
        IF NOT c.gated THEN
            admitted := admitted || c.run_id;
            CONTINUE;
        END IF;
        SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = c.task_id AND v.version = c.version;
        -- One at a time per serial group, in run order. Each check holds an advisory lock until
        -- this claim commits and then reads afresh, so a concurrent claim's decision is seen.
        IF c.gate IS NOT NULL THEN
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(tide._lock_class(), hashtext('gate:' || c.gate));
            SELECT q.run_id INTO blocker FROM tide.pending q
             WHERE q.gate = c.gate AND q.run_id <> c.run_id
               AND (q.state = 'running' OR (q.state IN ('ready', 'retry', 'paused') AND q.run_id < c.run_id))
             ORDER BY q.state = 'running' DESC, q.run_id LIMIT 1;
            IF FOUND THEN
                PERFORM tide._park(c.run_id, now() + tide._park_time());
                CONTINUE;
            END IF;
        END IF;
        -- Overlap skip and max_concurrency count the task's running runs.
        IF (c.window_start IS NOT NULL AND rules->>'overlap' = 'skip') OR rules->>'max_concurrency' IS NOT NULL THEN
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(tide._lock_class(), hashtext('task:' || c.task_id));
            SELECT count(*) INTO running FROM tide.pending q
             WHERE q.task_id = c.task_id AND q.gated AND q.state = 'running';
            IF c.window_start IS NOT NULL AND rules->>'overlap' = 'skip' AND running > 0 THEN
                UPDATE tide.run SET state = 'skipped', skip_reason = 'overlap', finished_at = now(), updated_at = now(),
                                    reason = 'skipped: another run of the task was still running (overlap skip)'
                 WHERE run_id = c.run_id;
                CONTINUE;
            END IF;
            IF running >= (rules->>'max_concurrency')::integer THEN
                PERFORM tide._park(c.run_id, now() + tide._park_time());
                CONTINUE;
            END IF;
        END IF;
        -- The business object's lock: free, expired (its holder is fenced out), or busy (the run
        -- is deferred: recorded, not an attempt).
        IF c.lock_key IS NOT NULL THEN
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(tide._lock_class(), hashtext('lock:' || c.owner || ':' || c.lock_key));
            SELECT * INTO l FROM tide.lock x WHERE x.owner = c.owner AND x.key = c.lock_key;
            IF FOUND AND l.run_id <> c.run_id THEN
                IF l.expires_at > now() THEN
                    UPDATE tide.run SET updated_at = now(),
                           reason = format('deferred: lock %s is held by run %s until %s', c.lock_key, l.run_id,
                                           to_char(l.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS" UTC"'))
                     WHERE run_id = c.run_id;
                    PERFORM tide._park(c.run_id, l.expires_at);
                    CONTINUE;
                END IF;
                PERFORM 1 FROM tide.run x WHERE x.run_id = l.run_id AND x.state = 'running' AND x.lease_token = l.token
                    FOR UPDATE;
                IF FOUND THEN
                    PERFORM tide._fail(l.run_id, format('lock %s expired (token %s) and was taken over by run %s',
                                                        c.lock_key, l.token, c.run_id),
                                       'transient', NULL, 'lost', now());
                END IF;
            END IF;
            INSERT INTO tide.lock AS x (owner, key, run_id, task_id, token, acquired_at, expires_at)
            VALUES (c.owner, c.lock_key, c.run_id, c.task_id, p_token, now(), now() + tide._lease_length(p_executor, rules, p_lease))
            ON CONFLICT ON CONSTRAINT lock_pkey DO UPDATE
               SET run_id = EXCLUDED.run_id, task_id = EXCLUDED.task_id, token = EXCLUDED.token,
                   acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at;
        END IF;
        -- Running already for the checks of later candidates of this claim.
        UPDATE tide.pending SET state = 'running' WHERE run_id = c.run_id;
        admitted := admitted || c.run_id;
    END LOOP;
    RETURN admitted;
END
$$;
COMMENT ON FUNCTION tide._admit(bigint[], bigint, tide.executor, interval) IS
    'Internal: decides which claimed candidates may run now (serial group, overlap, max_concurrency, lock key) and takes their locks; parks, defers or skips the rest.';

-- Ends a running run that was asked to pause or cancel (between batches, or at a heartbeat).
CREATE FUNCTION tide._stop_run(p_run_id bigint, p_progress jsonb) RETURNS tide.run_state
LANGUAGE plpgsql
AS $$
DECLARE
    r tide.run;
BEGIN
    SELECT * INTO r FROM tide.run WHERE run_id = p_run_id AND state = 'running' FOR UPDATE;
    UPDATE tide.run
       SET state = CASE WHEN r.control = 'cancel' THEN 'cancelled' ELSE 'paused' END::tide.run_state,
           checkpoint = coalesce(p_progress, checkpoint), control = NULL, lease_expires_at = NULL,
           finished_at = CASE WHEN r.control = 'cancel' THEN now() END, updated_at = now(),
           reason = format('%s after %s batches (asked by tide.%s_run)',
                           CASE WHEN r.control = 'cancel' THEN 'cancelled' ELSE 'paused' END, r.batches, r.control)
     WHERE run_id = p_run_id;
    RETURN (SELECT x.state FROM tide.run x WHERE x.run_id = p_run_id);
END
$$;
COMMENT ON FUNCTION tide._stop_run(bigint, jsonb) IS
    'Internal: pauses or cancels a running run whose pause or cancel was asked for, keeping its checkpoint.';

CREATE FUNCTION tide._control_target(p_run_id bigint, p_function text) RETURNS tide.run
LANGUAGE plpgsql
AS $$
DECLARE
    r tide.run;
BEGIN
    IF p_run_id IS NULL THEN
        RAISE EXCEPTION '%: run_id must not be NULL', p_function USING ERRCODE = 'null_value_not_allowed',
            HINT = 'find the run with: SELECT run_id, state FROM tide.run WHERE task_id = ...';
    END IF;
    SELECT * INTO r FROM tide.run x WHERE x.run_id = p_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % does not exist', p_run_id USING ERRCODE = 'undefined_object',
            HINT = 'find the run with: SELECT run_id, state FROM tide.run WHERE task_id = ...; runs of other roles'' tasks are not visible';
    END IF;
    RETURN r;
END
$$;
COMMENT ON FUNCTION tide._control_target(bigint, text) IS 'Internal: the run a pause/resume/cancel works on, locked.';

CREATE FUNCTION tide.pause_run(run_id bigint) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    r tide.run;
BEGIN
    r := tide._control_target(pause_run.run_id, 'tide.pause_run');
    IF r.state = 'running' THEN
        UPDATE tide.run x SET control = 'pause', updated_at = now() WHERE x.run_id = r.run_id;
        RETURN 'pausing';
    ELSIF r.state IN ('waiting', 'ready', 'retry') THEN
        UPDATE tide.run x SET state = 'paused', updated_at = now(),
               reason = format('paused by %s (was %s)', current_user, r.state)
         WHERE x.run_id = r.run_id;
        RETURN 'paused';
    ELSIF r.state = 'paused' THEN
        RETURN 'paused';
    END IF;
    RAISE EXCEPTION 'run % is %, so there is nothing to pause', r.run_id, r.state
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'only a waiting, ready, retrying or running run can be paused';
END
$$;
COMMENT ON FUNCTION tide.pause_run(bigint) IS
    'pause_run(run_id): pauses a run. One not started is paused at once (returns paused); a running one stops at its next batch (long task) or heartbeat, keeping its checkpoint (returns pausing). tide.resume_run continues it.';

CREATE FUNCTION tide.resume_run(run_id bigint) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    r tide.run;
    rules jsonb;
BEGIN
    r := tide._control_target(resume_run.run_id, 'tide.resume_run');
    IF r.state = 'running' AND r.control = 'pause' THEN
        UPDATE tide.run x SET control = NULL, updated_at = now() WHERE x.run_id = r.run_id;
        RETURN 'running';
    ELSIF r.state = 'paused' THEN
        SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = r.task_id AND v.version = r.version;
        UPDATE tide.run x
           SET state = CASE WHEN r.attempts > 0 THEN 'ready' ELSE tide._open_state(rules) END::tide.run_state,
               run_after = NULL, updated_at = now(),
               reason = format('resumed by %s%s', current_user,
                               CASE WHEN r.checkpoint IS NOT NULL THEN ' (continues from its checkpoint)' ELSE '' END)
         WHERE x.run_id = r.run_id;
        RETURN (SELECT x.state::text FROM tide.run x WHERE x.run_id = r.run_id);
    END IF;
    RAISE EXCEPTION 'run % is %, not paused', r.run_id, r.state
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'tide.resume_run continues a run paused with tide.pause_run';
END
$$;
COMMENT ON FUNCTION tide.resume_run(bigint) IS
    'resume_run(run_id): puts a paused run back in line (it continues from its checkpoint), or withdraws a pause not yet taken up. Returns the run''s state.';

CREATE FUNCTION tide.cancel_run(run_id bigint, reason text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    r tide.run;
BEGIN
    r := tide._control_target(cancel_run.run_id, 'tide.cancel_run');
    IF r.state = 'running' THEN
        UPDATE tide.run x SET control = 'cancel', updated_at = now() WHERE x.run_id = r.run_id;
        RETURN 'cancelling';
    ELSIF r.state IN ('waiting', 'ready', 'retry', 'held', 'paused') THEN
        UPDATE tide.run x SET state = 'cancelled', finished_at = now(), updated_at = now(), lease_expires_at = NULL,
               reason = format('cancelled by %s%s', current_user, coalesce(': ' || cancel_run.reason, ''))
         WHERE x.run_id = r.run_id;
        RETURN 'cancelled';
    ELSIF r.state = 'cancelled' THEN
        RETURN 'cancelled';
    END IF;
    RAISE EXCEPTION 'run % already ended (%)', r.run_id, r.state
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'only an unfinished run can be cancelled';
END
$$;
COMMENT ON FUNCTION tide.cancel_run(bigint, text) IS
    'cancel_run(run_id, reason => NULL): cancels a run. One not running is cancelled at once (returns cancelled); a running one stops at its next batch (long task) or heartbeat (returns cancelling); its committed batches stay.';

-- Event tasks ------------------------------------------------------------------------------

CREATE SEQUENCE tide.event_seq;
COMMENT ON SEQUENCE tide.event_seq IS 'Ids of emitted events (the idempotency key of an event run emitted without a dedupe key: #id).';
GRANT USAGE ON SEQUENCE tide.event_seq TO PUBLIC;
-- Restored with the runs: ids of a restored database must not start over (#1 would be taken).
SELECT pg_catalog.pg_extension_config_dump('tide.event_seq', '');

CREATE FUNCTION tide._check_topic(p_topic text, p_function text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_topic IS NULL OR p_topic !~ '^[A-Za-z0-9_.:-]{1,100}$' THEN
        RAISE EXCEPTION '%: topic % is not valid', p_function, coalesce(quote_literal(p_topic), 'NULL')
            USING ERRCODE = CASE WHEN p_topic IS NULL THEN 'null_value_not_allowed' ELSE 'invalid_parameter_value' END,
                  HINT = 'a topic is 1 to 100 characters: letters, digits, ''_'', ''-'', ''.'' or '':'', such as ''order.created''';
    END IF;
END
$$;
COMMENT ON FUNCTION tide._check_topic(text, text) IS 'Internal: refuses a malformed topic.';

-- A generic plan always: the custom plan the planner otherwise keeps choosing (its estimate for
-- the topic lookup is better with the value) costs more to make than to run (measured: 3x).
CREATE FUNCTION tide.emit(topic text, payload jsonb DEFAULT '{}', key text DEFAULT NULL, dedupe text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    ids bigint[];
    queues text[];
    ev bigint;
BEGIN
    PERFORM tide._check_topic(emit.topic, 'tide.emit');
    IF emit.key = '' OR emit.dedupe = '' OR emit.dedupe LIKE '#%' THEN
        RAISE EXCEPTION 'tide.emit: % % is not valid', CASE WHEN emit.key = '' THEN 'key' ELSE 'dedupe' END,
            quote_literal(CASE WHEN emit.key = '' THEN emit.key ELSE emit.dedupe END)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass NULL or a non-empty text; dedupe keys starting with # are pg_tide''s own';
    END IF;
    ev := nextval('tide.event_seq');
    IF emit.key IS NOT NULL THEN
        -- Emits of one key wait for each other, so their runs are created in commit order: the
        -- order the key's runs are claimed in.
        PERFORM pg_advisory_xact_lock(tide._lock_class(), hashtext('emit:' || emit.key));
    END IF;
    -- One statement: the runs (with their gating, so the insert trigger has nothing to look up),
    -- their first history rows and their tide.pending rows, as tide._record_created would
    -- write them (measured: about half the cost of creating and then re-reading them).
    WITH subscribed AS (
        SELECT t.*, tide._gate(t.task_id, t.overlap::text, NULL, emit.key) AS gate,
               CASE WHEN t.lock_key IS NOT NULL
                    THEN tide._lock_key(t.lock_key, t.name, t.args, coalesce(emit.payload, '{}'), emit.key, NULL) END
                   AS lock_key_of_run
          FROM tide.task t
         WHERE t.topics @> ARRAY[emit.topic]
    ), created AS (
        INSERT INTO tide.run (task_id, trigger, dedupe_key, version, state, reason, executor, queue, priority,
                              args, owner, topic, event_key, payload, gate, lock_key, gated)
        SELECT t.task_id, 'event', coalesce(emit.dedupe, '#' || ev), t.version,
               tide._open_state(jsonb_build_object('ready_dataset', t.ready_dataset, 'ready_check', t.ready_check)),
               format('event %s on %s%s', ev, emit.topic, coalesce(' (key ' || emit.key || ')', '')),
               tide._executor_of(t.command), t.queue, t.priority, t.args, t.owner,
               emit.topic, emit.key, coalesce(emit.payload, '{}'),
               t.gate, t.lock_key_of_run, tide._gated(t.gate, t.lock_key_of_run, t.overlap::text, NULL, t.max_concurrency)
          FROM subscribed t
         ORDER BY t.task_id
        ON CONFLICT (task_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING run_id, task_id, state, reason, owner, executor, queue, priority, gate, lock_key, gated
    ), history AS (
        INSERT INTO tide.run_event (run_id, from_state, to_state, reason, owner)
        SELECT c.run_id, NULL, c.state, c.reason, c.owner FROM created c ORDER BY c.run_id
    ), line AS (
        INSERT INTO tide.pending (run_id, task_id, state, executor, queue, priority, owner, gate, lock_key, gated)
        SELECT c.run_id, c.task_id, c.state, c.executor, c.queue, c.priority, c.owner, c.gate, c.lock_key, c.gated
          FROM created c
    )
    SELECT array_agg(c.run_id), array_agg(DISTINCT c.queue) FILTER (WHERE c.state = 'ready')
      INTO ids, queues FROM created c;
    IF ids IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM pg_notify('pg_tide_ready', q) FROM unnest(queues) q;
    RETURN cardinality(ids);
END
$$;
COMMENT ON FUNCTION tide.emit(text, jsonb, text, text) IS
    'emit(topic, payload => ''{}'', key => NULL, dedupe => NULL): in the caller''s transaction, creates one run of every task subscribed to the topic (that the caller may see). Runs of one task and key are claimed one at a time in emit order. A dedupe key already used by a task''s run makes the emit a no-op for that task. Returns how many runs it created.';

CREATE FUNCTION tide._emit_row() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    row_json jsonb := to_jsonb(NEW);
BEGIN
    IF TG_OP = 'UPDATE' AND to_jsonb(OLD) = row_json THEN
        RETURN NULL;  -- nothing changed
    END IF;
    PERFORM tide.emit(TG_ARGV[0],
                      jsonb_build_object('op', lower(TG_OP), 'table', format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME),
                                         'row', row_json),
                      CASE WHEN TG_ARGV[1] <> '' THEN row_json->>TG_ARGV[1] END);
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION tide._emit_row() IS
    'Trigger (installed by tide.emit_on_change): emits the changed row as {op, table, row} on the topic, keyed by the key column.';

CREATE FUNCTION tide._emit_trigger_name(p_topic text) RETURNS name
LANGUAGE sql IMMUTABLE
AS $$ SELECT ('tide_emit_' || regexp_replace(p_topic, '[^A-Za-z0-9_]', '_', 'g'))::name $$;
COMMENT ON FUNCTION tide._emit_trigger_name(text) IS 'Internal: the name of the trigger emit_on_change installs for a topic.';

CREATE FUNCTION tide.emit_on_change("table" regclass, topic text, key_column text DEFAULT NULL) RETURNS name
LANGUAGE plpgsql
AS $$
DECLARE
    trigger_name name;
BEGIN
    IF emit_on_change."table" IS NULL THEN
        RAISE EXCEPTION 'tide.emit_on_change: table must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'for example: SELECT tide.emit_on_change(''orders'', ''order.changed'', ''customer_id'')';
    END IF;
    PERFORM tide._check_topic(emit_on_change.topic, 'tide.emit_on_change');
    IF emit_on_change.key_column IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM pg_attribute a
            WHERE a.attrelid = emit_on_change."table" AND a.attname = emit_on_change.key_column
              AND a.attnum > 0 AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'table % has no column %', emit_on_change."table", quote_ident(emit_on_change.key_column)
            USING ERRCODE = 'undefined_column',
                  HINT = 'pass the column whose value orders the events (runs of one key go one at a time), or NULL';
    END IF;
    trigger_name := tide._emit_trigger_name(emit_on_change.topic);
    EXECUTE format('CREATE OR REPLACE TRIGGER %I AFTER INSERT OR UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION tide._emit_row(%L, %L)',
                   trigger_name, emit_on_change."table", emit_on_change.topic, coalesce(emit_on_change.key_column, ''));
    RETURN trigger_name;
END
$$;
COMMENT ON FUNCTION tide.emit_on_change(regclass, text, text) IS
    'emit_on_change(table, topic, key_column => NULL): installs a trigger that emits each inserted or changed row ({op, table, row}) on the topic, keyed by key_column, in the writing transaction. Calling it again replaces it; tide.drop_emit_on_change removes it. Returns the trigger''s name.';

CREATE FUNCTION tide.drop_emit_on_change("table" regclass, topic text) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    trigger_name name;
BEGIN
    PERFORM tide._check_topic(drop_emit_on_change.topic, 'tide.drop_emit_on_change');
    trigger_name := tide._emit_trigger_name(drop_emit_on_change.topic);
    IF NOT EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = drop_emit_on_change."table" AND g.tgname = trigger_name) THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TRIGGER %I ON %s', trigger_name, drop_emit_on_change."table");
    RETURN true;
END
$$;
COMMENT ON FUNCTION tide.drop_emit_on_change(regclass, text) IS
    'drop_emit_on_change(table, topic): removes the trigger tide.emit_on_change installed; false if there was none.';

-- Run context of event runs and long tasks.
CREATE FUNCTION tide.payload() RETURNS jsonb
LANGUAGE sql STABLE
AS $$ SELECT r.payload FROM tide.run r WHERE r.run_id = tide.run_id() $$;
COMMENT ON FUNCTION tide.payload() IS 'Inside a task''s command: the payload of the event the run was emitted for; NULL for a scheduled run.';

CREATE FUNCTION tide.event_key() RETURNS text
LANGUAGE sql STABLE
AS $$ SELECT r.event_key FROM tide.run r WHERE r.run_id = tide.run_id() $$;
COMMENT ON FUNCTION tide.event_key() IS 'Inside a task''s command: the key of the event the run was emitted for.';

CREATE FUNCTION tide.checkpoint() RETURNS jsonb
LANGUAGE sql STABLE
AS $$ SELECT r.checkpoint FROM tide.run r WHERE r.run_id = tide.run_id() $$;
COMMENT ON FUNCTION tide.checkpoint() IS 'Inside a task''s command: the run''s last committed checkpoint (NULL at the start); a long task''s batch continues from it.';

-- Rules that involve several options, checked after tide.schedule / tide.alter wrote them (an
-- error undoes the write).
CREATE FUNCTION tide._check_task(p_task_id bigint) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    t tide.task;
BEGIN
    SELECT * INTO t FROM tide.task WHERE task_id = p_task_id;
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
                  HINT = 'the command does one batch and returns the next checkpoint; external workers of long runs send progress with tide.heartbeat instead';
    END IF;
    IF (t.rate IS NOT NULL OR t.pause IS NOT NULL) AND NOT t.long THEN
        RAISE EXCEPTION 'task "%": rate and pause apply to long tasks only', t.name
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass long => true with them, or leave them out';
    END IF;
    IF t.rate IS NOT NULL AND t.pause IS NOT NULL THEN
        RAISE EXCEPTION 'task "%": pass rate or pause, not both (got rate %, pause %)', t.name, t.rate, t.pause
            USING ERRCODE = 'invalid_parameter_value', HINT = 'rate => 2 means at most 2 batches a second; pause => ''1 second'' waits between batches';
    END IF;
END
$$;
COMMENT ON FUNCTION tide._check_task(bigint) IS
    'Internal: checks the rules of a task that involve several options (called by tide.schedule and tide.alter).';

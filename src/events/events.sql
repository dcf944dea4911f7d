-- pg_tide event tasks: tide.emit creates runs in the caller's transaction, once per dedupe key;
-- tide.create_emit_trigger emits table changes. Their per-key order is kept by the serial groups of
-- src/locks/locks.sql.

CREATE SEQUENCE tide.event_seq;
COMMENT ON SEQUENCE tide.event_seq IS 'Ids of emitted events (the idempotency key of an event run emitted without a dedupe key: #id).';
-- Restored with the runs: ids of a restored database must not start over (#1 would be taken).
SELECT pg_catalog.pg_extension_config_dump('tide.event_seq', '');

-- Returns true, so that tide._emit calls it in an assignment, evaluated without the executor
-- (2.5 µs a call, against 4.4 for a PERFORM). The length is checked apart from the pattern: a
-- bounded repetition ({1,100}) made each match cost about 5.6 µs, the unbounded one 0.6 (a
-- PERFORM of the old check took 10 µs, about 3% of one emit).
CREATE FUNCTION tide._check_topic(p_topic text, p_function text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_topic IS NULL OR length(p_topic) > 100 OR p_topic !~ '^[A-Za-z0-9_.:-]+$' THEN
        RAISE EXCEPTION '%: topic % is not valid', p_function, coalesce(quote_literal(left(p_topic, 100)), 'NULL')
            USING ERRCODE = CASE WHEN p_topic IS NULL THEN 'null_value_not_allowed' ELSE 'invalid_parameter_value' END,
                  HINT = 'a topic is 1 to 100 characters: letters, digits, ''_'', ''-'', ''.'' or '':'', such as ''order.created''';
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION tide._check_topic(text, text) IS 'Internal: refuses a malformed topic; true otherwise.';

-- Emits events, one or many, in the caller's transaction: the work of tide.emit and
-- tide.emit_many. Element i is payloads[i] with event_keys[i] and dedupe_keys[i] (NULL arrays:
-- no keys). Each creates one run of every task subscribed to the topic that the caller may
-- reach.
-- A generic plan always: the custom plan the planner otherwise keeps choosing (its estimate for
-- the topic lookup is better with the value) costs more to make than to run (measured: 3x).
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
    -- The first bad element, if any, in one pass (for one event, only when it may be bad: its
    -- test is a plain expression, the scan a statement of its own, a tenth of one tide.emit).
    IF n > 1 OR length(p_event_keys[1]) > 1000 OR length(p_dedupe_keys[1]) > 1000 OR p_event_keys[1] = ''
       OR p_dedupe_keys[1] = '' OR p_dedupe_keys[1] LIKE '#%' OR pg_column_size(p_payloads[1]) > 1048576 THEN
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
    END IF;
    IF owners_ok IS NOT NULL THEN
        SELECT array_agg(g.owner) INTO g_owners FROM tide._granted('emit') g WHERE g.object = p_topic;
    END IF;
    -- The runs, with their gating (so the insert trigger has nothing to look up), made by the one
    -- creator (tide._create_runs). Each event gets its id (its dedupe key when none is given: #id).
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
    ), made AS (
        -- In the order of the events (run ids follow it), with the fields of tide.new_run.
        SELECT t.task_id, 'event'::tide.run_trigger AS trigger, t.version, t.state,
               format('event %s on %s%s', e.ev, p_topic, coalesce(' (key ' || e.event_key || ')', '')) AS reason,
               tide._executor_of(t.command) AS executor, t.queue, t.priority, t.args, t.owner,
               NULL::timestamptz AS fire_at, NULL::timestamptz AS window_start, NULL::timestamptz AS window_end,
               NULL::date AS biz_date, coalesce(e.dedupe_key, '#' || e.ev) AS dedupe_key,
               NULL::tide.skip_reason AS skip_reason, NULL::timestamptz AS run_after,
               NULL::timestamptz AS ready_deadline, p_topic AS topic, e.event_key, e.payload, g.gate, g.lock_key, g.gated
          FROM events e
         CROSS JOIN tasks t
         CROSS JOIN LATERAL tide._gating_by(t.lock_rule, t.overlap, t.long, t.max_concurrency, t.task_id, t.name,
                                            t.args, e.payload, e.event_key, NULL, NULL) g
         ORDER BY e.i, t.task_id
    )
    -- Without dedupe keys, every run's key is pg_tide's own (#id, new): fresh.
    SELECT cardinality(tide._create_runs(array_agg(m::tide.new_run), NOT keyed)) INTO made FROM made m;
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
    RETURN made;
END
$$;
COMMENT ON FUNCTION tide._emit(text, jsonb[], text[], text[], text) IS
    'Internal: the work of tide.emit and tide.emit_many: checks, creates a run of every reachable subscribed task per event, wakes claimers.';

CREATE FUNCTION tide.emit(topic text, payload jsonb DEFAULT '{}', event_key text DEFAULT NULL, dedupe_key text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$ BEGIN RETURN tide._emit(topic, ARRAY[payload], ARRAY[event_key], ARRAY[dedupe_key], 'tide.emit'); END $$;
COMMENT ON FUNCTION tide.emit(text, jsonb, text, text) IS
    'emit(topic, payload => ''{}'', event_key => NULL, dedupe_key => NULL): in the caller''s transaction, creates one run of every task subscribed to the topic that the caller may reach (its own, its teams'', those whose owner granted it the topic with tide.grant(''emit'', ...); a superuser''s or tide_admin''s emit: every role''s), owned by the task''s owner. A WARNING when no such task subscribes (never a silent 0). Runs of one task and key go one at a time, in the order of their runs. A dedupe key already used by a task''s run makes the emit a no-op for that task. Returns how many runs it created.';

CREATE FUNCTION tide.emit_many(topic text, payloads jsonb[], event_keys text[] DEFAULT NULL, dedupe_keys text[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$ BEGIN RETURN tide._emit(topic, payloads, event_keys, dedupe_keys, 'tide.emit_many'); END $$;
COMMENT ON FUNCTION tide.emit_many(text, jsonb[], text[], text[]) IS
    'emit_many(topic, payloads, event_keys => NULL, dedupe_keys => NULL): tide.emit of many events (up to 100000) in one call, in the caller''s transaction: event i is payloads[i] with event_keys[i] and dedupe_keys[i] (arrays of the same length; NULL elements or arrays for none). Checked whole before anything is written. Events of one key go in their order in the arrays. Returns how many runs it created.';

CREATE FUNCTION tide._emit_row() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
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
    'Trigger (installed by tide.create_emit_trigger): emits the changed row as {op, table, row} on the topic, keyed by the key column.';

-- create_emit_trigger runs as the extension's owner: it changes a table's triggers only for a
-- caller who may (the table's owner, a member of that role, or a superuser), as CREATE TRIGGER
-- would check for the caller.
CREATE FUNCTION tide._own_table(p_table regclass, p_function text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_class c
                    WHERE c.oid = p_table AND c.relkind IN ('r', 'p')
                      AND tide._may_act(pg_get_userbyid(c.relowner))) THEN
        RAISE EXCEPTION '%: must be the owner of table %', p_function, p_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'the table''s owner (or a member of its role) installs the trigger; pass an ordinary or partitioned table';
    END IF;
END
$$;
COMMENT ON FUNCTION tide._own_table(regclass, text) IS 'Internal: refuses a table the caller does not own (42501).';

CREATE FUNCTION tide._emit_trigger_name(p_topic text) RETURNS name
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT ('tide_emit_' || regexp_replace(p_topic, '[^A-Za-z0-9_]', '_', 'g'))::name $$;
COMMENT ON FUNCTION tide._emit_trigger_name(text) IS 'Internal: the name of the trigger create_emit_trigger installs for a topic.';

CREATE FUNCTION tide.create_emit_trigger("table" regclass, topic text, key_column text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    trigger_name name;
BEGIN
    IF create_emit_trigger."table" IS NULL THEN
        RAISE EXCEPTION 'tide.create_emit_trigger: table must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'for example: SELECT tide.create_emit_trigger(''orders'', ''order.changed'', ''customer_id'')';
    END IF;
    PERFORM tide._check_topic(create_emit_trigger.topic, 'tide.create_emit_trigger');
    PERFORM tide._own_table(create_emit_trigger."table", 'tide.create_emit_trigger');
    IF create_emit_trigger.key_column IS NOT NULL THEN
        PERFORM tide._text_arg('key_column', create_emit_trigger.key_column, 63,
                               'pass the column whose value orders the events (runs of one key go one at a time), or NULL');
    END IF;
    IF create_emit_trigger.key_column IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM pg_attribute a
            WHERE a.attrelid = create_emit_trigger."table" AND a.attname = create_emit_trigger.key_column
              AND a.attnum > 0 AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'table % has no column %', create_emit_trigger."table", quote_ident(create_emit_trigger.key_column)
            USING ERRCODE = 'undefined_column',
                  HINT = 'pass the column whose value orders the events (runs of one key go one at a time), or NULL';
    END IF;
    trigger_name := tide._emit_trigger_name(create_emit_trigger.topic);
    EXECUTE format('CREATE OR REPLACE TRIGGER %I AFTER INSERT OR UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION tide._emit_row(%L, %L)',
                   trigger_name, create_emit_trigger."table", create_emit_trigger.topic, coalesce(create_emit_trigger.key_column, ''));
    RETURN trigger_name::text;
END
$$;
COMMENT ON FUNCTION tide.create_emit_trigger(regclass, text, text) IS
    'create_emit_trigger(table, topic, key_column => NULL): installs a trigger that emits each inserted or changed row ({op, table, row}) on the topic, keyed by key_column, in the writing transaction. Calling it again replaces it; tide.drop_emit_trigger removes it. Returns the trigger''s name.';

CREATE FUNCTION tide.drop_emit_trigger("table" regclass, topic text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    trigger_name name;
BEGIN
    IF drop_emit_trigger."table" IS NULL THEN
        RAISE EXCEPTION 'tide.drop_emit_trigger: table must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'for example: SELECT tide.drop_emit_trigger(''orders'', ''order.changed'')';
    END IF;
    PERFORM tide._check_topic(drop_emit_trigger.topic, 'tide.drop_emit_trigger');
    PERFORM tide._own_table(drop_emit_trigger."table", 'tide.drop_emit_trigger');
    trigger_name := tide._emit_trigger_name(drop_emit_trigger.topic);
    IF NOT EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = drop_emit_trigger."table" AND g.tgname = trigger_name) THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TRIGGER %I ON %s', trigger_name, drop_emit_trigger."table");
    RETURN true;
END
$$;
COMMENT ON FUNCTION tide.drop_emit_trigger(regclass, text) IS
    'drop_emit_trigger(table, topic): removes the trigger tide.create_emit_trigger installed; false if there was none.';

-- Run context of event runs.
CREATE FUNCTION tide.payload() RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT r.payload FROM tide.run r WHERE r.run_id = tide.run_id() $$;
COMMENT ON FUNCTION tide.payload() IS 'Inside a task''s command: the payload of the event the run was emitted for; NULL for a scheduled run.';

CREATE FUNCTION tide.event_key() RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT r.event_key FROM tide.run r WHERE r.run_id = tide.run_id() $$;
COMMENT ON FUNCTION tide.event_key() IS 'Inside a task''s command: the key of the event the run was emitted for.';

-- One-off and delayed jobs: tide.enqueue creates runs of a task now or at a given instant, one
-- or thousands per call, each with its own args, priority and (optionally) dedupe key. An
-- enqueued run is like an event run: no business window, its idempotency key is its dedupe key
-- (given, or made from a sequence).

CREATE SEQUENCE tide.job_seq;
COMMENT ON SEQUENCE tide.job_seq IS 'Ids of tide.enqueue calls (the idempotency key of a run enqueued without a dedupe key: #q<id>:<n>).';
SELECT pg_catalog.pg_extension_config_dump('tide.job_seq', '');

-- A generic plan always, as tide.emit: planning the one insert costs more than running it.
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
    -- The runs, with their gating, made by the one creator (tide._create_runs): runs with keys of
    -- pg_tide's own are fresh; those with the caller's skip the keys seen before.
    WITH input AS (
        SELECT e.i, t.args || e.v AS args,
               CASE WHEN one_key THEN key_of ELSE key_of || e.i END AS dedupe_key
          FROM jsonb_array_elements(items) WITH ORDINALITY AS e(v, i)
    ), made AS (
        -- In the order of the elements (run ids follow it), with the fields of tide.new_run.
        SELECT t.task_id, 'enqueued'::tide.run_trigger AS trigger, t.version, open_state AS state, why AS reason,
               exec_kind AS executor, t.queue, prio AS priority, i.args, t.owner, NULL::timestamptz AS fire_at,
               NULL::timestamptz AS window_start, NULL::timestamptz AS window_end, NULL::date AS biz_date,
               i.dedupe_key, NULL::tide.skip_reason AS skip_reason, due AS run_after,
               NULL::timestamptz AS ready_deadline, NULL::text AS topic, NULL::text AS event_key,
               NULL::jsonb AS payload, g.gate, g.lock_key, g.gated
          FROM input i
         CROSS JOIN LATERAL tide._gating_by(rule.lock_rule, rule.overlap, rule.long, rule.max_concurrency, t.task_id,
                                            t.name, i.args, NULL, NULL, NULL, NULL) g
         ORDER BY i.i
    )
    SELECT tide._create_runs(array_agg(m::tide.new_run), enqueue.dedupe_key IS NULL) INTO ids FROM made m;
    -- The run of each element: with keys of pg_tide's own, all of them new, in the order of the
    -- elements (run ids are given in insertion order); with the caller's, created now or
    -- earlier with the same key: each looked up by its key (a lateral LIMIT 1 is never turned
    -- into a join, which a generic plan made a sort of all the task's runs: 60 ms at 60,000).
    IF enqueue.dedupe_key IS NULL THEN
        RETURN QUERY SELECT unnest(ids);
    ELSE
        RETURN QUERY
            SELECT r.run_id FROM generate_series(1, n) k(i)
             CROSS JOIN LATERAL (
                 SELECT x.run_id FROM tide.run x
                  WHERE x.task_id = t.task_id
                    AND x.dedupe_key = CASE WHEN one_key THEN key_of ELSE key_of || k.i END
                  LIMIT 1) r
             ORDER BY k.i;
    END IF;
END
$$;
COMMENT ON FUNCTION tide.enqueue(text, jsonb, timestamptz, integer, text) IS
    'enqueue(task, args => ''{}'', run_at => NULL, priority => NULL, dedupe_key => NULL): creates one run of the caller''s task (args an object, merged over the task''s args) or one run per element (args an array of objects, up to 100000), now or at run_at, with its own priority (default: the task''s). A dedupe_key makes it idempotent: a second enqueue with the same key creates nothing and returns the existing run (with an array, element n uses dedupe_key:n). Returns the run ids, in the order of the elements.';

CREATE FUNCTION tide._refuse_element(p_index bigint, p_value jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'args element % must be a JSON object, got %', p_index, left(p_value::text, 100)
        USING ERRCODE = 'invalid_parameter_value',
              HINT = 'pass an array of objects, such as ''[{"invoice_id": 7}, {"invoice_id": 8}]''';
END
$$;
COMMENT ON FUNCTION tide._refuse_element(bigint, jsonb) IS 'Internal: the error for an element of tide.enqueue''s args array that is not an object.';

-- Steps inside a run: a retry, replay or rerun of the run skips the steps already done and gets
-- their recorded output. An external worker names its run and lease token (fenced like
-- tide.complete_run); inside a task's SQL command the run is implicit.

CREATE TABLE tide.step (
    run_id     bigint NOT NULL,
    name       text NOT NULL CHECK (btrim(name) <> ''),
    done       boolean NOT NULL DEFAULT false,
    output     jsonb,
    attempt    integer NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    done_at    timestamptz,
    owner      name NOT NULL,
    PRIMARY KEY (run_id, name)
);
COMMENT ON TABLE tide.step IS
    'Steps of runs (tide.step / tide.complete_step): a step done is skipped, with its recorded output, by every later attempt or rerun of the run. attempt = the attempt that last started or finished it.';

-- The run, if the caller may work on it: running, under this token.
CREATE FUNCTION tide._held_run(p_run_id bigint, p_token bigint, p_name text, p_function text) RETURNS tide.run
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
BEGIN
    IF p_name IS NULL OR btrim(p_name) = '' THEN
        RAISE EXCEPTION '%: step name must not be empty, got %', p_function, coalesce(quote_literal(left(p_name, 20)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'name the step after what it does, such as ''charge_card''';
    END IF;
    PERFORM tide._text_arg('step name', p_name, 200, 'name the step after what it does, such as ''charge_card''');
    SELECT * INTO r FROM tide.run x
     WHERE x.run_id = p_run_id AND x.lease_token = p_token AND x.state = 'running' AND tide._may_work(x.owner, x.queue);
    IF NOT FOUND THEN
        PERFORM tide._refuse_stale(p_run_id, p_token, p_function);
    END IF;
    RETURN r;
END
$$;
COMMENT ON FUNCTION tide._held_run(bigint, bigint, text, text) IS
    'Internal: the run a step call works on, if its token still holds it; else the stale-token error of tide.complete_run.';

CREATE FUNCTION tide.start_step(run_id bigint, lease_token bigint, name text) RETURNS TABLE (done boolean, output jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
BEGIN
    r := tide._held_run(start_step.run_id, start_step.lease_token, start_step.name, 'tide.step');
    RETURN QUERY
        INSERT INTO tide.step AS s (run_id, name, attempt, owner)
        VALUES (r.run_id, start_step.name, r.attempts, r.owner)
        ON CONFLICT ON CONSTRAINT step_pkey DO UPDATE
           SET attempt = CASE WHEN s.done THEN s.attempt ELSE EXCLUDED.attempt END,
               started_at = CASE WHEN s.done THEN s.started_at ELSE now() END
        RETURNING s.done, s.output;
END
$$;
COMMENT ON FUNCTION tide.start_step(bigint, bigint, text) IS
    'start_step(run_id, lease_token, name): starts a step of a claimed run, or says it is done: returns done = true with the recorded output when an earlier attempt or run finished it (skip it), else done = false (do it, then tide.complete_step). A stale lease token is refused.';

CREATE FUNCTION tide.complete_step(run_id bigint, lease_token bigint, name text, output jsonb DEFAULT NULL) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
BEGIN
    r := tide._held_run(complete_step.run_id, complete_step.lease_token, complete_step.name, 'tide.complete_step');
    PERFORM tide._jsonb_arg('output', complete_step.output, 1048576);
    INSERT INTO tide.step AS s (run_id, name, done, output, attempt, done_at, owner)
    VALUES (r.run_id, complete_step.name, true, complete_step.output, r.attempts, now(), r.owner)
    ON CONFLICT ON CONSTRAINT step_pkey DO UPDATE
       SET done = true, output = EXCLUDED.output, attempt = EXCLUDED.attempt, done_at = now()
     WHERE NOT s.done;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'step "%" of run % is already done', complete_step.name, complete_step.run_id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'call tide.start_step first: it says whether a step is done, with its output';
    END IF;
END
$$;
COMMENT ON FUNCTION tide.complete_step(bigint, bigint, text, jsonb) IS
    'complete_step(run_id, lease_token, name, output => NULL): records a step of a claimed run as done, with its output, in the same transaction as its work. A stale lease token is refused; a step already done is refused.';

-- Inside a task's SQL command: the run being executed, held by this executor's transaction.
CREATE FUNCTION tide._command_run(p_function text) RETURNS tide.run
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
BEGIN
    SELECT * INTO r FROM tide.run x WHERE x.run_id = tide.run_id() AND x.state = 'running' AND tide._may_act(x.owner);
    IF NOT FOUND THEN
        RAISE EXCEPTION '%(name) works inside a task''s command only', p_function
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('an external worker passes its run: %s(run_id, lease_token, name)', p_function);
    END IF;
    RETURN r;
END
$$;
COMMENT ON FUNCTION tide._command_run(text) IS 'Internal: the run a task''s command is executing, or a clear error outside one.';

CREATE FUNCTION tide.start_step(name text) RETURNS TABLE (done boolean, output jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run := tide._command_run('tide.start_step');
BEGIN
    RETURN QUERY SELECT * FROM tide.start_step(r.run_id, r.lease_token, start_step.name);
END
$$;
COMMENT ON FUNCTION tide.start_step(text) IS
    'start_step(name), inside a task''s command: as start_step(run_id, lease_token, name) for the run being executed.';

CREATE FUNCTION tide.complete_step(name text, output jsonb DEFAULT NULL) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run := tide._command_run('tide.complete_step');
BEGIN
    PERFORM tide.complete_step(r.run_id, r.lease_token, complete_step.name, complete_step.output);
END
$$;
COMMENT ON FUNCTION tide.complete_step(text, jsonb) IS
    'complete_step(name, output => NULL), inside a task''s command: as complete_step(run_id, lease_token, name, output) for the run being executed.';

ALTER TABLE tide.step ENABLE ROW LEVEL SECURITY;
CREATE POLICY step_owner ON tide.step FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.step TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.step', '');

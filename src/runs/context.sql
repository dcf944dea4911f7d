-- Run context, for a task's command and readiness check: tide.run_id() (src/security/sealed.rs) is set
-- by pg_tide's executor while the run's code runs. These read the run as their caller, under
-- row-level security.

CREATE FUNCTION tide.biz_date() RETURNS date
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT r.biz_date FROM tide.run r WHERE r.run_id = tide.run_id() $$;
COMMENT ON FUNCTION tide.biz_date() IS
    'Inside a task''s command or readiness check: the business date of the run (never "today minus one").';

CREATE FUNCTION tide.window_start() RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT r.window_start FROM tide.run r WHERE r.run_id = tide.run_id() $$;
COMMENT ON FUNCTION tide.window_start() IS
    'Inside a task''s command or readiness check: start of the run''s business window (inclusive).';

CREATE FUNCTION tide.window_end() RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT r.window_end FROM tide.run r WHERE r.run_id = tide.run_id() $$;
COMMENT ON FUNCTION tide.window_end() IS
    'Inside a task''s command or readiness check: end of the run''s business window (exclusive).';

CREATE FUNCTION tide.args() RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT r.args FROM tide.run r WHERE r.run_id = tide.run_id() $$;
COMMENT ON FUNCTION tide.args() IS
    'Inside a task''s command or readiness check: the run''s args (a JSON object).';

-- The error helpers of commands: each raises its SQLSTATE, which decides the run's path.
CREATE FUNCTION tide._signal(p_sqlstate text, p_message text, p_hint text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = p_sqlstate, MESSAGE = tide._clip(p_message, 1000), HINT = p_hint;
END
$$;
COMMENT ON FUNCTION tide._signal(text, text, text) IS
    'Internal: raises the error of one of the command helpers (tide.not_ready, tide.business_error, tide.transient_error).';

CREATE FUNCTION tide.not_ready(message text DEFAULT 'input not ready') RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT tide._signal('TDNR0', coalesce(message, 'input not ready'),
                        'pg_tide re-checks this run at its next window; it is not retried at once')
$$;
COMMENT ON FUNCTION tide.not_ready(text) IS
    'not_ready(message): inside a task''s command, stop: the input is not there yet (SQLSTATE TDNR0). The run waits for the next window instead of retrying.';

CREATE FUNCTION tide.business_error(message text) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT tide._signal('TDBE0', coalesce(message, 'business error'),
                        'retrying cannot fix this: the run goes to the dead letters (tide.dead_letter) for a human')
$$;
COMMENT ON FUNCTION tide.business_error(text) IS
    'business_error(message): inside a task''s command, fail for good (SQLSTATE TDBE0): the run goes to the dead letters without retries.';

CREATE FUNCTION tide.transient_error(message text) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT tide._signal('TDTE0', coalesce(message, 'transient error'),
                        'pg_tide retries this run with backoff, up to the task''s max_attempts')
$$;
COMMENT ON FUNCTION tide.transient_error(text) IS
    'transient_error(message): inside a task''s command, fail this attempt (SQLSTATE TDTE0): the run is retried with backoff, up to max_attempts, then goes to the dead letters.';

-- A stale lease token: explain who has the run now, change nothing.
CREATE FUNCTION tide._refuse_stale(p_run_id bigint, p_token bigint, p_function text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
BEGIN
    IF p_run_id IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION '%: % must not be NULL', p_function, CASE WHEN p_run_id IS NULL THEN 'run_id' ELSE 'lease_token' END
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'pass the run_id and lease_token that tide.claim_runs returned';
    END IF;
    SELECT * INTO r FROM tide.run x WHERE x.run_id = p_run_id AND tide._may_work(x.owner, x.queue);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % does not exist', p_run_id
            USING ERRCODE = 'undefined_object',
                  HINT = 'pass the run_id that tide.claim_runs returned; runs of other roles'' tasks are not visible';
    END IF;
    RAISE EXCEPTION 'lease token % of run % is stale: the run is now % (%)', p_token, p_run_id, r.state,
        CASE WHEN r.state = 'running' THEN format('held by %s with token %s', coalesce(r.lease_owner, 'another worker'), r.lease_token)
             ELSE r.reason END
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'this worker lost the run (its lease expired or it was never its claim): roll back its work; the run''s current holder finishes it';
END
$$;
COMMENT ON FUNCTION tide._refuse_stale(bigint, bigint, text) IS
    'Internal: raises the fencing error for a call with a stale lease token.';

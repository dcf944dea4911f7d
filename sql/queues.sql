-- Queues with limits (R14.1: nothing can start a retry storm). A task names its queue; a role
-- may declare limits for a queue of its own: at most max_concurrency of its runs in the queue
-- running at once (SQL executors and external workers alike), at most rate starts per second
-- (a token bucket holding one second's worth), pause and resume of the whole queue, and a
-- retry budget: at most retry_budget transient failures per retry_window before new retries of
-- the queue wait (the budget refills with time) and an alert opens. A queue nobody declared
-- has no limits. Limits are per role: another role's runs in a queue of the same name are its
-- own.

CREATE TABLE tide.queue (
    owner           name NOT NULL,
    name            text NOT NULL CHECK (name ~ '^[A-Za-z0-9_.-]{1,63}$'),
    max_concurrency integer CHECK (max_concurrency BETWEEN 1 AND 10000),
    rate            double precision CHECK (rate > 0 AND rate <= 10000),
    retry_budget    integer CHECK (retry_budget BETWEEN 1 AND 100000),
    retry_window    interval NOT NULL DEFAULT '10 minutes'
                    CHECK (retry_window >= interval '1 minute' AND retry_window <= interval '1 day'),
    paused          boolean NOT NULL DEFAULT false,
    paused_at       timestamptz,
    -- The start rate's token bucket and the retry budget's, as of their last use.
    tokens          double precision NOT NULL DEFAULT 0,
    tokens_at       timestamptz NOT NULL DEFAULT now(),
    budget          double precision NOT NULL DEFAULT 0,
    budget_at       timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT queue_pkey PRIMARY KEY (owner, name)
);
COMMENT ON TABLE tide.queue IS
    'Limits of a role''s queue (tide.create_queue): max_concurrency running at once, rate starts per second, paused, retry_budget transient failures per retry_window. Runs of the owner''s tasks whose queue has this name obey them.';
COMMENT ON COLUMN tide.queue.tokens IS 'Start tokens left at tokens_at (refilled at rate per second, at most max(1, rate)).';
COMMENT ON COLUMN tide.queue.budget IS 'Retry budget left at budget_at (refilled at retry_budget per retry_window, at most retry_budget); below zero, retries wait.';

ALTER TABLE tide.queue ENABLE ROW LEVEL SECURITY;
CREATE POLICY queue_owner ON tide.queue FOR SELECT USING (owner = current_user);
GRANT SELECT ON tide.queue TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.queue', '');

-- The start tokens of a queue at an instant.
CREATE FUNCTION tide._queue_tokens(q tide.queue, p_at timestamptz) RETURNS double precision
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN q.rate IS NULL THEN NULL
                ELSE least(greatest(1, q.rate),
                           q.tokens + q.rate * greatest(0, extract(epoch FROM p_at - q.tokens_at)::float8)) END
$$;
COMMENT ON FUNCTION tide._queue_tokens(tide.queue, timestamptz) IS 'Internal: a queue''s start tokens at an instant (NULL: no rate limit).';

-- The retry budget of a queue at an instant.
CREATE FUNCTION tide._queue_budget(q tide.queue, p_at timestamptz) RETURNS double precision
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN q.retry_budget IS NULL THEN NULL
                ELSE least(q.retry_budget::float8,
                           q.budget + q.retry_budget * greatest(0, extract(epoch FROM p_at - q.budget_at)::float8)
                                      / extract(epoch FROM q.retry_window)::float8) END
$$;
COMMENT ON FUNCTION tide._queue_budget(tide.queue, timestamptz) IS 'Internal: a queue''s retry budget at an instant (NULL: no budget).';

CREATE FUNCTION tide._queue_name(p_value text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_value IS NULL THEN
        RAISE EXCEPTION 'name must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'name the queue your tasks use, such as ''default'' or ''partner_api''';
    END IF;
    IF p_value !~ '^[A-Za-z0-9_.-]{1,63}$' THEN
        RAISE EXCEPTION 'queue name % is not valid', quote_literal(left(p_value, 100)) USING ERRCODE = 'invalid_parameter_value',
            HINT = 'a queue name is 1 to 63 characters: letters, digits, ''_'', ''-'' or ''.''';
    END IF;
    RETURN p_value;
END
$$;
COMMENT ON FUNCTION tide._queue_name(text) IS 'Internal: a queue name, or a clear error naming the bad value.';

CREATE FUNCTION tide.create_queue(name text, max_concurrency integer DEFAULT NULL, rate double precision DEFAULT NULL,
                                  retry_budget integer DEFAULT NULL, retry_window interval DEFAULT '10 minutes')
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._queue_name(create_queue.name);
    IF create_queue.max_concurrency IS NOT NULL AND create_queue.max_concurrency NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'max_concurrency must be between 1 and 10000, got %', create_queue.max_concurrency
            USING ERRCODE = 'invalid_parameter_value', HINT = 'NULL for no limit';
    END IF;
    IF create_queue.rate IS NOT NULL AND NOT (create_queue.rate > 0 AND create_queue.rate <= 10000) THEN
        RAISE EXCEPTION 'rate must be between 0 and 10000 starts per second, got %', create_queue.rate
            USING ERRCODE = 'invalid_parameter_value', HINT = 'rate => 0.5 starts a run every 2 seconds at most; NULL for no limit';
    END IF;
    IF create_queue.retry_budget IS NOT NULL AND create_queue.retry_budget NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'retry_budget must be between 1 and 100000, got %', create_queue.retry_budget
            USING ERRCODE = 'invalid_parameter_value', HINT = 'the transient failures allowed per retry_window; NULL for no budget';
    END IF;
    IF create_queue.retry_window IS NULL OR create_queue.retry_window < interval '1 minute'
       OR create_queue.retry_window > interval '1 day' THEN
        RAISE EXCEPTION 'retry_window must be an interval of 1 minute to 1 day, got %', coalesce(create_queue.retry_window::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass retry_window => ''10 minutes''';
    END IF;
    INSERT INTO tide.queue AS q (owner, name, max_concurrency, rate, retry_budget, retry_window, tokens, budget)
    VALUES (tide._caller(), create_queue.name, create_queue.max_concurrency, create_queue.rate,
            create_queue.retry_budget, create_queue.retry_window,
            greatest(1, coalesce(create_queue.rate, 1)), coalesce(create_queue.retry_budget, 0))
    ON CONFLICT ON CONSTRAINT queue_pkey DO UPDATE
       SET max_concurrency = EXCLUDED.max_concurrency, rate = EXCLUDED.rate,
           retry_budget = EXCLUDED.retry_budget, retry_window = EXCLUDED.retry_window,
           tokens = least(q.tokens, EXCLUDED.tokens),
           budget = CASE WHEN q.retry_budget IS NULL THEN EXCLUDED.budget ELSE least(q.budget, EXCLUDED.budget) END,
           updated_at = now();
    -- Runs waiting for a limit that is now higher (or gone) may go.
    PERFORM tide._wake_queue(tide._caller(), create_queue.name);
    RETURN create_queue.name;
END
$$;
COMMENT ON FUNCTION tide.create_queue(text, integer, double precision, integer, interval) IS
    'create_queue(name, max_concurrency => NULL, rate => NULL, retry_budget => NULL, retry_window => ''10 minutes''): declares (or changes) the limits of one of the caller''s queues: at most max_concurrency of its runs running at once, at most rate starts per second, and at most retry_budget transient failures per retry_window before its retries wait. NULL: no such limit. Returns the name.';

CREATE FUNCTION tide.drop_queue(name text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._queue_name(drop_queue.name);
    DELETE FROM tide.queue q WHERE q.owner = tide._caller() AND q.name = drop_queue.name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM tide._wake_queue(tide._caller(), drop_queue.name);
    RETURN true;
END
$$;
COMMENT ON FUNCTION tide.drop_queue(text) IS
    'drop_queue(name): removes the limits of one of the caller''s queues (its runs go on without limits); false if it had none.';

CREATE FUNCTION tide._set_queue_paused(p_name text, p_paused boolean) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._queue_name(p_name);
    -- A queue never declared is declared by pausing it (with no other limit).
    INSERT INTO tide.queue (owner, name, tokens) VALUES (tide._caller(), p_name, 1)
    ON CONFLICT ON CONSTRAINT queue_pkey DO NOTHING;
    UPDATE tide.queue q SET paused = p_paused, paused_at = CASE WHEN p_paused THEN now() END, updated_at = now()
     WHERE q.owner = tide._caller() AND q.name = p_name AND q.paused <> p_paused;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT p_paused THEN
        PERFORM tide._wake_queue(tide._caller(), p_name);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION tide._set_queue_paused(text, boolean) IS 'Internal: pauses or resumes a queue; false if it already was.';

CREATE FUNCTION tide.pause_queue(name text) RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT tide._set_queue_paused(name, true) $$;
COMMENT ON FUNCTION tide.pause_queue(text) IS
    'pause_queue(name): no run of the caller''s queue starts until tide.resume_queue (running ones finish); false if it already was paused.';

CREATE FUNCTION tide.resume_queue(name text) RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT tide._set_queue_paused(name, false) $$;
COMMENT ON FUNCTION tide.resume_queue(text) IS
    'resume_queue(name): lets the runs of a paused queue start again; false if it was not paused.';

-- How many runs of a role's queue are running (its own claim's uncommitted ones included).
CREATE FUNCTION tide._queue_running(p_owner name, p_queue text) RETURNS bigint
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*) FROM tide.pending x WHERE x.queue = p_queue AND x.owner = p_owner AND x.state = 'running'
$$;
COMMENT ON FUNCTION tide._queue_running(name, text) IS 'Internal: the running runs of a queue.';

-- Locks the queues of some runs that have a rate (p_rate) or a max_concurrency (not p_rate),
-- in a fixed order, until the transaction ends.
CREATE FUNCTION tide._lock_queues(p_ids bigint[], p_rate boolean) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM 1 FROM tide.queue q
     WHERE (q.owner, q.name) IN (SELECT p.owner, p.queue FROM tide.pending p WHERE p.run_id = ANY (p_ids))
       AND CASE WHEN p_rate THEN q.rate IS NOT NULL ELSE q.max_concurrency IS NOT NULL END
     ORDER BY q.owner, q.name
       FOR NO KEY UPDATE;
END
$$;
COMMENT ON FUNCTION tide._lock_queues(bigint[], boolean) IS 'Internal: locks the rate-limited (or concurrency-limited) queues of some runs.';

-- Runs of a queue parked for its limits look again now (a limit was raised, a slot or the
-- queue freed): as many as could start.
CREATE FUNCTION tide._wake_queue(p_owner name, p_queue text) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q tide.queue;
    room bigint;
    n integer;
BEGIN
    SELECT * INTO q FROM tide.queue x WHERE x.owner = p_owner AND x.name = p_queue;
    IF FOUND AND q.paused THEN
        RETURN 0;
    END IF;
    room := CASE WHEN q.max_concurrency IS NULL THEN 1000000
                 ELSE greatest(0, q.max_concurrency - tide._queue_running(p_owner, p_queue)) END;
    WITH target AS (
        SELECT x.run_id FROM tide.pending x
         WHERE x.queue = p_queue AND x.owner = p_owner AND x.state = 'ready' AND x.parked
         ORDER BY x.priority DESC, x.run_id
         LIMIT room
           FOR UPDATE SKIP LOCKED
    )
    UPDATE tide.pending p SET parked = false, due_at = NULL FROM target t WHERE p.run_id = t.run_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM pg_notify('pg_tide_ready', p_queue);
    END IF;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._wake_queue(name, text) IS
    'Internal: unparks the runs of a queue that may start now (up to its free slots).';

-- Runs that stopped running free room in their queues: the runs parked there look again (only
-- queues with a max_concurrency, and only when some run is parked at all: most ends wake
-- nobody).
CREATE FUNCTION tide._wake_queues(p_run_ids bigint[]) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    rec record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM tide.pending p WHERE p.parked) THEN
        RETURN;
    END IF;
    FOR rec IN SELECT DISTINCT r.owner, r.queue FROM tide.run r
                WHERE r.run_id = ANY (p_run_ids) AND tide._queue_limited(r.owner, r.queue) LOOP
        PERFORM tide._wake_queue(rec.owner, rec.queue);
    END LOOP;
END
$$;
COMMENT ON FUNCTION tide._wake_queues(bigint[]) IS
    'Internal: wakes the runs parked in the queues (with a max_concurrency) of runs that stopped running.';

-- Whether a run's queue has a concurrency limit (its end must wake who waits for a slot).
-- Inlined into its callers: no SET clause; every name is qualified (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._queue_limited(p_owner name, p_queue text) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (SELECT 1 FROM tide.queue q
                    WHERE q.owner OPERATOR(pg_catalog.=) p_owner AND q.name OPERATOR(pg_catalog.=) p_queue
                      AND q.max_concurrency IS NOT NULL)
$$;
COMMENT ON FUNCTION tide._queue_limited(name, text) IS 'Internal: whether a queue has a concurrency limit.';

-- Which claimed candidates their queues let start now: not paused, within max_concurrency as
-- far as the committed running runs tell (tide._queue_over checks it again under the queue's
-- lock once the claim is made), a start token each. The others are parked: until woken by a
-- run of the queue that ends (a slot), until their token is due (rate), or until resume_queue.
-- One statement for the batch; only rate-limited queues are locked here (their token bucket),
-- in a fixed order, so claims of them take turns.
CREATE FUNCTION tide._queue_admit(p_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    admitted bigint[];
BEGIN
    PERFORM tide._lock_queues(p_ids, true);
    WITH cand AS (
        SELECT p.run_id, p.owner, p.queue,
               row_number() OVER (PARTITION BY p.owner, p.queue ORDER BY p.priority DESC, p.run_id) AS k
          FROM tide.pending p WHERE p.run_id = ANY (p_ids)
    ), lim AS (
        SELECT q.owner, q.name, q.paused, q.rate, tide._queue_tokens(q, now()) AS tokens,
               CASE WHEN q.max_concurrency IS NULL THEN NULL
                    ELSE q.max_concurrency - tide._queue_running(q.owner, q.name) END AS slots
          FROM tide.queue q
         WHERE (q.owner, q.name) IN (SELECT c.owner, c.queue FROM cand c)
    ), decided AS (
        SELECT c.run_id, c.owner, c.queue, c.k, l.rate, l.tokens,
               CASE WHEN l.owner IS NULL THEN 'go'
                    WHEN l.paused THEN 'paused'
                    WHEN c.k > l.slots THEN 'full'
                    WHEN c.k > floor(l.tokens) THEN 'rate'
                    ELSE 'go' END AS verdict
          FROM cand c LEFT JOIN lim l ON l.owner = c.owner AND l.name = c.queue
    ), parked AS (
        UPDATE tide.pending p
           SET parked = true,
               due_at = CASE WHEN d.verdict = 'rate'
                             THEN now() + make_interval(secs => (d.k - d.tokens) / d.rate)
                             ELSE now() + tide._park_time() END
          FROM decided d
         WHERE p.run_id = d.run_id AND d.verdict <> 'go' AND p.state = 'ready'
    ), spent AS (
        UPDATE tide.queue q
           SET tokens = l.tokens - s.started, tokens_at = now()
          FROM (SELECT d.owner, d.queue, count(*) AS started FROM decided d WHERE d.verdict = 'go'
                 GROUP BY d.owner, d.queue) s
          JOIN lim l ON l.owner = s.owner AND l.name = s.queue
         WHERE q.owner = s.owner AND q.name = s.queue AND q.rate IS NOT NULL
    )
    SELECT array_agg(d.run_id ORDER BY d.run_id) INTO admitted FROM decided d WHERE d.verdict = 'go';
    RETURN coalesce(admitted, '{}');
END
$$;
COMMENT ON FUNCTION tide._queue_admit(bigint[]) IS
    'Internal: the claimed candidates their queues let start (paused, max_concurrency, rate); parks the others.';

-- After a claim marked its runs running: under the lock of each of their queues with a
-- max_concurrency (taken in a fixed order, held to the claim's commit, so the next claim of the
-- queue counts this one's runs), the runs beyond the limit, the claim's lowest priority first.
-- Empty when the claim stays within every limit.
CREATE FUNCTION tide._queue_over(p_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    over bigint[];
BEGIN
    PERFORM tide._lock_queues(p_ids, false);
    WITH lim AS (
        SELECT q.owner, q.name,
               tide._queue_running(q.owner, q.name) - q.max_concurrency AS excess
          FROM tide.queue q
         WHERE (q.owner, q.name) IN (SELECT p.owner, p.queue FROM tide.pending p WHERE p.run_id = ANY (p_ids))
           AND q.max_concurrency IS NOT NULL
    ), mine AS (
        SELECT p.run_id, l.excess,
               row_number() OVER (PARTITION BY p.owner, p.queue ORDER BY p.priority, p.run_id DESC) AS k
          FROM tide.pending p JOIN lim l ON l.owner = p.owner AND l.name = p.queue
         WHERE p.run_id = ANY (p_ids) AND l.excess > 0
    )
    SELECT array_agg(m.run_id) INTO over FROM mine m WHERE m.k <= m.excess;
    RETURN coalesce(over, '{}');
END
$$;
COMMENT ON FUNCTION tide._queue_over(bigint[]) IS
    'Internal: the runs of a claim beyond their queues'' max_concurrency, counted under the queues'' locks.';

-- A transient failure spends one unit of its queue's retry budget. Returns the instant before
-- which the retry must not run (NULL: no budget, or budget left).
CREATE FUNCTION tide._spend_retry(p_owner name, p_queue text, p_now timestamptz) RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q tide.queue;
    left_after double precision;
BEGIN
    SELECT * INTO q FROM tide.queue x WHERE x.owner = p_owner AND x.name = p_queue AND x.retry_budget IS NOT NULL
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    left_after := tide._queue_budget(q, p_now) - 1;
    UPDATE tide.queue x SET budget = left_after, budget_at = p_now WHERE x.owner = p_owner AND x.name = p_queue;
    IF left_after >= 0 THEN
        RETURN NULL;
    END IF;
    -- Spent: this retry waits until the budget has refilled to what it owes.
    RETURN p_now + make_interval(secs => -left_after * extract(epoch FROM q.retry_window)::float8 / q.retry_budget);
END
$$;
COMMENT ON FUNCTION tide._spend_retry(name, text, timestamptz) IS
    'Internal: spends one unit of a queue''s retry budget for a transient failure; returns when the retry may run if the budget is spent.';

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

-- A queue's concurrency as shards: max_concurrency split over at most 8 rows (cap each), with
-- how many of the queue's running runs each holds (used). A claim takes room from one or two
-- shards it can lock at once (SKIP LOCKED), so claims of one queue go side by side, and notes
-- the shard on each run's tide.pending row; a run that stops running gives its unit back to
-- that shard. One row written per claim and per completion batch, not one per run. The tick
-- recounts the shards from tide.pending, so nothing a missed give-back leaves lasts.
CREATE TABLE tide.queue_shard (
    owner  name NOT NULL,
    queue  text NOT NULL,
    shard  integer NOT NULL,
    cap    integer NOT NULL,
    used   integer NOT NULL DEFAULT 0,
    CONSTRAINT queue_shard_pkey PRIMARY KEY (owner, queue, shard),
    CONSTRAINT queue_shard_queue_fkey FOREIGN KEY (owner, queue) REFERENCES tide.queue (owner, name) ON DELETE CASCADE
) WITH (fillfactor = 50);
COMMENT ON TABLE tide.queue_shard IS
    'A queue''s max_concurrency split over a few rows: cap each, used = its running runs (tide.pending.shard).';
ALTER TABLE tide.queue_shard ENABLE ROW LEVEL SECURITY;
CREATE POLICY queue_shard_owner ON tide.queue_shard FOR SELECT USING (owner = current_user);
GRANT SELECT ON tide.queue_shard TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.queue_shard', '');

-- The shards of a queue after its limit was set: none without a limit; else min(limit, 8)
-- shards sharing the limit, its running runs spread over them.
CREATE FUNCTION tide._sync_shards(p_owner name, p_queue text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lim integer;
    n integer;
BEGIN
    SELECT q.max_concurrency INTO lim FROM tide.queue q WHERE q.owner = p_owner AND q.name = p_queue;
    DELETE FROM tide.queue_shard s WHERE s.owner = p_owner AND s.queue = p_queue;
    UPDATE tide.pending p SET shard = NULL WHERE p.owner = p_owner AND p.queue = p_queue AND p.shard IS NOT NULL;
    IF lim IS NULL THEN
        RETURN;
    END IF;
    n := least(lim, 8);
    INSERT INTO tide.queue_shard (owner, queue, shard, cap)
    SELECT p_owner, p_queue, g, lim / n + CASE WHEN g <= lim % n THEN 1 ELSE 0 END FROM generate_series(1, n) g;
    WITH spread AS (
        SELECT p.run_id, (row_number() OVER (ORDER BY p.run_id) - 1) % n + 1 AS shard
          FROM tide.pending p WHERE p.owner = p_owner AND p.queue = p_queue AND p.state = 'running'
    ), noted AS (
        UPDATE tide.pending p SET shard = x.shard FROM spread x WHERE p.run_id = x.run_id RETURNING p.shard
    )
    UPDATE tide.queue_shard s SET used = c.n
      FROM (SELECT o.shard, count(*) AS n FROM noted o GROUP BY o.shard) c
     WHERE s.owner = p_owner AND s.queue = p_queue AND s.shard = c.shard;
END
$$;
COMMENT ON FUNCTION tide._sync_shards(name, text) IS
    'Internal: makes a queue''s shards match its max_concurrency and its running runs.';

-- Runs that stopped running give their units back to their queues' shards (one row per
-- owner, queue and shard in the arrays, one run each), and the runs parked in those queues
-- look again.
CREATE FUNCTION tide._give_back(p_owners name[], p_queues text[], p_shards integer[]) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    rec record;
BEGIN
    FOR rec IN WITH freed AS (
                   UPDATE tide.queue_shard s SET used = greatest(0, s.used - c.n)
                     FROM (SELECT u.o, u.q, u.sh, count(*) AS n
                             FROM unnest(p_owners, p_queues, p_shards) AS u(o, q, sh)
                            WHERE u.sh IS NOT NULL GROUP BY u.o, u.q, u.sh) c
                    WHERE s.owner = c.o AND s.queue = c.q AND s.shard = c.sh
                   RETURNING s.owner, s.queue)
               SELECT DISTINCT f.owner, f.queue FROM freed f LOOP
        IF EXISTS (SELECT 1 FROM tide.pending p WHERE p.parked AND p.queue = rec.queue AND p.owner = rec.owner) THEN
            PERFORM tide._wake_queue(rec.owner, rec.queue);
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION tide._give_back(name[], text[], integer[]) IS
    'Internal: gives the queue shard units of runs that stopped running back and wakes the runs parked in those queues.';

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
    PERFORM tide._sync_shards(tide._caller(), create_queue.name);
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
                 ELSE (SELECT coalesce(sum(greatest(s.cap - s.used, 0)), 0) FROM tide.queue_shard s
                        WHERE s.owner = p_owner AND s.queue = p_queue) END;
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
    'Internal: unparks the runs of a queue that may start now (up to its free room).';

-- Which claimed candidates their queues let start now: not paused, a start token each (rate),
-- room in the queue's shards (max_concurrency). Returns them with the shard each takes room
-- from (NULL outside a max_concurrency). The others are parked: until their token is due,
-- until a run of the queue gives room back (it wakes them), until resume_queue. Shards are
-- taken with SKIP LOCKED, so claims of one queue go side by side; only a rate-limited queue's
-- row is locked (its token bucket), and claims of it take turns.
CREATE FUNCTION tide._queue_admit(p_ids bigint[], p_owners name[], p_queues text[],
                                  OUT admitted bigint[], OUT shards integer[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q record;
    sh record;
    bucket tide.queue;
    have double precision;
    cap integer;
    m integer;
    n integer;
    wait interval;
BEGIN
    admitted := '{}';
    shards := '{}';
    FOR q IN
        -- The candidates come in claim order (priority, then oldest), with their owners and
        -- queues.
        SELECT c.owner, c.queue, array_agg(c.run_id ORDER BY c.n) AS runs,
               x.paused, x.max_concurrency, x.rate
          FROM unnest(p_ids, p_owners, p_queues) WITH ORDINALITY AS c(run_id, owner, queue, n)
          LEFT JOIN tide.queue x ON x.owner = c.owner AND x.name = c.queue
         GROUP BY c.owner, c.queue, x.paused, x.max_concurrency, x.rate
         ORDER BY c.owner, c.queue
    LOOP
        IF q.paused THEN
            UPDATE tide.pending p SET parked = true, due_at = now() + tide._park_time()
             WHERE p.run_id = ANY (q.runs) AND p.state = 'ready';
            CONTINUE;
        END IF;
        cap := cardinality(q.runs);
        IF q.rate IS NOT NULL THEN
            SELECT * INTO bucket FROM tide.queue x WHERE x.owner = q.owner AND x.name = q.queue FOR NO KEY UPDATE;
            have := tide._queue_tokens(bucket, now());
            cap := least(cap, floor(have)::integer);
        END IF;
        IF q.max_concurrency IS NULL THEN
            n := cap;
            shards := shards || array_fill(NULL::integer, ARRAY[n]);
        ELSE
            -- Room from the shards that no other claim holds now, those with most of it first;
            -- a row is locked as it is read, so the shards not needed stay free for others.
            n := 0;
            IF cap > 0 THEN
                FOR sh IN SELECT s.shard, s.cap - s.used AS room FROM tide.queue_shard s
                           WHERE s.owner = q.owner AND s.queue = q.queue AND s.used < s.cap
                           ORDER BY s.used - s.cap, s.shard
                             FOR UPDATE SKIP LOCKED LOOP
                    m := least(sh.room, cap - n);
                    UPDATE tide.queue_shard s SET used = s.used + m
                     WHERE s.owner = q.owner AND s.queue = q.queue AND s.shard = sh.shard;
                    shards := shards || array_fill(sh.shard, ARRAY[m]);
                    n := n + m;
                    EXIT WHEN n >= cap;
                END LOOP;
            END IF;
        END IF;
        IF q.rate IS NOT NULL THEN
            UPDATE tide.queue x SET tokens = have - n, tokens_at = now()
             WHERE x.owner = q.owner AND x.name = q.queue;
        END IF;
        admitted := admitted || q.runs[1:n];
        CONTINUE WHEN n >= cardinality(q.runs);
        -- The rest wait: for their token (the k-th run's is due after (k - have) / rate
        -- seconds), else for room. A run that ends wakes them; in case that wake-up misses
        -- them (a claim parking them has not committed yet), they look again in 5 seconds, or
        -- in 1 when the room is there but other claims hold it right now.
        wait := CASE WHEN q.max_concurrency IS NOT NULL
                      AND EXISTS (SELECT 1 FROM tide.queue_shard s
                                   WHERE s.owner = q.owner AND s.queue = q.queue AND s.used < s.cap)
                     THEN interval '1 second' ELSE interval '5 seconds' END;
        UPDATE tide.pending p
           SET parked = true,
               due_at = CASE WHEN q.rate IS NOT NULL AND u.k > floor(have)
                             THEN now() + make_interval(secs => (u.k - have) / q.rate)
                             ELSE now() + wait END
          FROM unnest(q.runs) WITH ORDINALITY AS u(run_id, k)
         WHERE u.k > n AND p.run_id = u.run_id AND p.state = 'ready';
    END LOOP;
END
$$;
COMMENT ON FUNCTION tide._queue_admit(bigint[], name[], text[]) IS
    'Internal: the claimed candidates their queues let start (paused, rate, room in max_concurrency), with the shard each takes room from; parks the others.';

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

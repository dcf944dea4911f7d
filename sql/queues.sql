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

-- A queue's concurrency slots: slots 1..max_concurrency, each free or held by one running run
-- of the queue. A claim takes free slots with SKIP LOCKED, so claims of one queue go side by
-- side (a count of running runs would have to be locked against every other claim up to its
-- commit); a run that stops running gives its slot back. No index on run_id: taking and giving
-- back a slot are HOT updates of a row found by its queue.
CREATE TABLE tide.queue_slot (
    owner  name NOT NULL,
    queue  text NOT NULL,
    slot   integer NOT NULL,
    run_id bigint,
    CONSTRAINT queue_slot_pkey PRIMARY KEY (owner, queue, slot),
    CONSTRAINT queue_slot_queue_fkey FOREIGN KEY (owner, queue) REFERENCES tide.queue (owner, name) ON DELETE CASCADE
) WITH (fillfactor = 50);
COMMENT ON TABLE tide.queue_slot IS
    'Concurrency slots of queues with a max_concurrency: free (run_id NULL) or held by a running run of the queue.';
ALTER TABLE tide.queue_slot ENABLE ROW LEVEL SECURITY;
CREATE POLICY queue_slot_owner ON tide.queue_slot FOR SELECT USING (owner = current_user);
GRANT SELECT ON tide.queue_slot TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.queue_slot', '');

-- Queue slots still held by runs that ended (or are gone) without giving them back are free
-- again: of one queue, or (NULLs) of every queue. Slots a claim is taking right now are
-- locked, and skipped. Returns how many.
CREATE FUNCTION tide._free_ended_slots(p_owner name, p_queue text) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    UPDATE tide.queue_slot s SET run_id = NULL
     WHERE (s.owner, s.queue, s.slot) IN (
           SELECT x.owner, x.queue, x.slot FROM tide.queue_slot x
            WHERE x.run_id IS NOT NULL
              AND (p_owner IS NULL OR (x.owner = p_owner AND x.queue = p_queue))
              AND NOT EXISTS (SELECT 1 FROM tide.run r
                               WHERE r.run_id = x.run_id
                                 AND r.state NOT IN ('succeeded', 'dead', 'cancelled', 'skipped', 'need_check'))
              FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._free_ended_slots(name, text) IS
    'Internal: frees the queue slots still held by runs that ended (of one queue, or of all), skipping slots being taken.';

-- The slots of a queue after its limit was set: none without a limit; else slots 1..limit
-- exist (slots above a lowered limit are never taken again), slots of runs that ended are
-- free, and running runs of the queue without a slot take one (free ones first, then new ones
-- above the limit), so that held slots count its running runs.
CREATE FUNCTION tide._sync_slots(p_owner name, p_queue text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lim integer;
    running record;
BEGIN
    SELECT q.max_concurrency INTO lim FROM tide.queue q WHERE q.owner = p_owner AND q.name = p_queue;
    IF lim IS NULL THEN
        DELETE FROM tide.queue_slot s WHERE s.owner = p_owner AND s.queue = p_queue;
        RETURN;
    END IF;
    INSERT INTO tide.queue_slot (owner, queue, slot)
    SELECT p_owner, p_queue, g FROM generate_series(1, lim) g
    ON CONFLICT ON CONSTRAINT queue_slot_pkey DO NOTHING;
    PERFORM tide._free_ended_slots(p_owner, p_queue);
    FOR running IN SELECT p.run_id FROM tide.pending p
                    WHERE p.owner = p_owner AND p.queue = p_queue AND p.state = 'running'
                      AND NOT EXISTS (SELECT 1 FROM tide.queue_slot s
                                       WHERE s.owner = p_owner AND s.queue = p_queue AND s.run_id = p.run_id)
                    ORDER BY p.run_id LOOP
        UPDATE tide.queue_slot s SET run_id = running.run_id
         WHERE (s.owner, s.queue, s.slot) = (SELECT x.owner, x.queue, x.slot FROM tide.queue_slot x
                                              WHERE x.owner = p_owner AND x.queue = p_queue AND x.run_id IS NULL
                                                AND x.slot <= lim
                                              ORDER BY x.slot LIMIT 1);
        IF NOT FOUND THEN
            INSERT INTO tide.queue_slot (owner, queue, slot, run_id)
            SELECT p_owner, p_queue, greatest(coalesce(max(x.slot), 0), lim) + 1, running.run_id FROM tide.queue_slot x
             WHERE x.owner = p_owner AND x.queue = p_queue;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION tide._sync_slots(name, text) IS
    'Internal: makes a queue''s slots match its max_concurrency and its running runs.';

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
    PERFORM tide._sync_slots(tide._caller(), create_queue.name);
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
                 ELSE (SELECT count(*) FROM tide.queue_slot s
                        WHERE s.owner = p_owner AND s.queue = p_queue AND s.run_id IS NULL
                          AND s.slot <= q.max_concurrency) END;
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

-- Runs that stopped running give their queues' slots back, and the runs parked there look
-- again (only queues with a max_concurrency).
CREATE FUNCTION tide._wake_queues(p_run_ids bigint[]) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    rec record;
BEGIN
    -- One statement for the batch: the slots of all queues are few (their max_concurrency).
    -- A slot row someone holds (its owner redefining the queue in an open transaction) is
    -- skipped, never waited for: the tick frees it later (tide._free_ended_slots).
    FOR rec IN WITH held AS (
                   SELECT s.owner, s.queue, s.slot FROM tide.queue_slot s
                     JOIN unnest(p_run_ids) AS u(id) ON s.run_id = u.id
                      FOR UPDATE OF s SKIP LOCKED
               ), freed AS (
                   UPDATE tide.queue_slot s SET run_id = NULL
                     FROM held h
                    WHERE s.owner = h.owner AND s.queue = h.queue AND s.slot = h.slot
                   RETURNING s.owner, s.queue)
               SELECT DISTINCT f.owner, f.queue FROM freed f LOOP
        IF EXISTS (SELECT 1 FROM tide.pending p WHERE p.parked AND p.queue = rec.queue AND p.owner = rec.owner) THEN
            PERFORM tide._wake_queue(rec.owner, rec.queue);
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION tide._wake_queues(bigint[]) IS
    'Internal: gives back the queue slots of runs that stopped running and wakes the runs parked in those queues.';

-- Which claimed candidates their queues let start now: not paused, a start token each (rate),
-- a free slot each (max_concurrency). The others are parked: until their token is due, until
-- a slot is given back (the run that ends wakes them), until resume_queue. Slots are taken with
-- SKIP LOCKED, so claims of one queue go side by side; only a rate-limited queue's row is
-- locked (its token bucket), and claims of it take turns.
CREATE FUNCTION tide._queue_admit(p_ids bigint[]) RETURNS bigint[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q record;
    bucket tide.queue;
    have double precision;
    cap integer;
    n integer;
    slots integer[];
    wait interval;
    admitted bigint[] := '{}';
BEGIN
    FOR q IN
        SELECT c.owner, c.queue, array_agg(c.run_id ORDER BY c.priority DESC, c.run_id) AS runs,
               x.name IS NOT NULL AS declared, x.paused, x.max_concurrency, x.rate
          FROM tide.pending c
          LEFT JOIN tide.queue x ON x.owner = c.owner AND x.name = c.queue
         WHERE c.run_id = ANY (p_ids)
         GROUP BY c.owner, c.queue, x.name, x.paused, x.max_concurrency, x.rate
         ORDER BY c.owner, c.queue
    LOOP
        IF NOT q.declared THEN
            admitted := admitted || q.runs;
            CONTINUE;
        END IF;
        IF q.paused THEN
            UPDATE tide.pending p SET parked = true, due_at = now() + tide._park_time()
             WHERE p.run_id = ANY (q.runs) AND p.state = 'ready';
            CONTINUE;
        END IF;
        cap := cardinality(q.runs);
        IF q.rate IS NOT NULL THEN
            -- SKIP LOCKED: a queue row held elsewhere (another claim of the queue, or its owner's
            -- open transaction) gives no tokens now, and never makes this claim wait; the
            -- candidates look again when their token would be due.
            SELECT * INTO bucket FROM tide.queue x WHERE x.owner = q.owner AND x.name = q.queue
               FOR NO KEY UPDATE SKIP LOCKED;
            have := CASE WHEN FOUND THEN tide._queue_tokens(bucket, now()) ELSE 0 END;
            cap := least(cap, floor(have)::integer);
        END IF;
        n := cap;
        IF q.max_concurrency IS NOT NULL AND cap > 0 THEN
            -- Fixed in an array first: a LIMIT under SKIP LOCKED may be re-evaluated.
            SELECT array_agg(f.slot ORDER BY f.slot) INTO slots FROM (
                SELECT s.slot FROM tide.queue_slot s
                 WHERE s.owner = q.owner AND s.queue = q.queue AND s.run_id IS NULL
                   AND s.slot <= q.max_concurrency
                 ORDER BY s.slot LIMIT cap
                   FOR UPDATE SKIP LOCKED) f;
            n := coalesce(cardinality(slots), 0);
            UPDATE tide.queue_slot s SET run_id = u.run_id
              FROM unnest(slots, q.runs[1:n]) AS u(slot, run_id)
             WHERE s.owner = q.owner AND s.queue = q.queue AND s.slot = u.slot;
        END IF;
        IF q.rate IS NOT NULL AND n > 0 THEN
            UPDATE tide.queue x SET tokens = have - n, tokens_at = now()
             WHERE x.owner = q.owner AND x.name = q.queue;
        END IF;
        admitted := admitted || q.runs[1:n];
        CONTINUE WHEN n >= cardinality(q.runs);
        -- The rest wait: for their token (the k-th run's is due after (k - have) / rate
        -- seconds), else for a slot. A run that ends wakes them; in case that wake-up misses
        -- them (this claim, parking them, has not committed yet), they look again in 5
        -- seconds, or in 1 when free slots are there but other claims hold them right now.
        wait := CASE WHEN q.max_concurrency IS NOT NULL
                      AND EXISTS (SELECT 1 FROM tide.queue_slot s
                                   WHERE s.owner = q.owner AND s.queue = q.queue AND s.run_id IS NULL
                                     AND s.slot <= q.max_concurrency)
                     THEN interval '1 second' ELSE interval '5 seconds' END;
        UPDATE tide.pending p
           SET parked = true,
               due_at = CASE WHEN q.rate IS NOT NULL AND u.k > floor(have)
                             THEN now() + make_interval(secs => (u.k - have) / q.rate)
                             ELSE now() + wait END
          FROM unnest(q.runs) WITH ORDINALITY AS u(run_id, k)
         WHERE u.k > n AND p.run_id = u.run_id AND p.state = 'ready';
    END LOOP;
    RETURN admitted;
END
$$;
COMMENT ON FUNCTION tide._queue_admit(bigint[]) IS
    'Internal: the claimed candidates their queues let start (paused, rate, a free slot of max_concurrency); parks the others.';

-- A transient failure spends one unit of its queue's retry budget. Returns the instant before
-- which the retry must not run (NULL: no budget, or budget left).
-- Failures of one queue take turns on its row; a row held longer (its owner's open
-- transaction) never stalls the executor failing a run: after 100 ms the budget is read as it
-- stands, and a spent one still holds the retry back, without spending.
CREATE FUNCTION tide._spend_retry(p_owner name, p_queue text, p_now timestamptz) RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $$
DECLARE
    q tide.queue;
    left_after double precision;
BEGIN
    BEGIN
        SELECT * INTO q FROM tide.queue x WHERE x.owner = p_owner AND x.name = p_queue AND x.retry_budget IS NOT NULL
           FOR NO KEY UPDATE;
    EXCEPTION WHEN lock_not_available THEN
        SELECT * INTO q FROM tide.queue x WHERE x.owner = p_owner AND x.name = p_queue;
        left_after := tide._queue_budget(q, p_now);
        RETURN CASE WHEN left_after < 1
                    THEN p_now + make_interval(secs => (1 - left_after) * extract(epoch FROM q.retry_window)::float8
                                                       / q.retry_budget) END;
    END;
    IF q.owner IS NULL THEN
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

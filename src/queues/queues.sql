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
CREATE POLICY queue_owner ON tide.queue FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.queue TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.queue', '');

-- A queue's max_concurrency is held with a count of its running runs kept in shared memory
-- (src/queues/count.rs): a claim reserves room there for the runs it admits (which it marks
-- counted in tide.pending), and a counted run that stops running gives its room back when its
-- transaction commits. Neither writes a row of the queue, so claims and completions of one queue
-- go side by side. After a restart, and after tide.create_queue, the count is counted again from
-- tide.pending by the next claim.

-- Counted runs of a queue stopped running (p_n of them): their room goes back when this
-- transaction commits, and the runs parked in the queue look again. Returns how many woke.
CREATE FUNCTION tide._queue_ended(p_owner name, p_queue text, p_n integer) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._queue_release(p_owner, p_queue, p_n);
    IF EXISTS (SELECT 1 FROM tide.pending p WHERE p.parked AND p.queue = p_queue AND p.owner = p_owner) THEN
        RETURN tide._wake_queue(p_owner, p_queue);
    END IF;
    RETURN 0;
END
$$;
COMMENT ON FUNCTION tide._queue_ended(name, text, integer) IS
    'Internal: counted runs of a queue stopped running: gives their room back at commit and wakes the runs parked in the queue.';

-- The queue's running runs are all counted from now on (runs that started before it had a
-- limit included), and its count is counted again by the next claim.
CREATE FUNCTION tide._queue_recount(p_owner name, p_queue text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._queue_forget(p_owner, p_queue);
    UPDATE tide.pending p SET counted = true
     WHERE p.owner = p_owner AND p.queue = p_queue AND p.state = 'running' AND NOT p.counted;
END
$$;
COMMENT ON FUNCTION tide._queue_recount(name, text) IS
    'Internal: counts every running run of a queue and makes its count be counted again (after its limits changed).';

-- Counts a queue's running runs again, waiting at most 200 ms for the claims and completions of
-- the queue in flight to end (a transaction left open with one of them would otherwise stall
-- every claim): false when it could not, and the candidates wait a second.
CREATE FUNCTION tide._queue_count_again_briefly(p_owner name, p_queue text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '200ms'
AS $$
BEGIN
    RETURN tide._queue_count_again(p_owner, p_queue);
EXCEPTION WHEN lock_not_available THEN
    RETURN false;
END
$$;
COMMENT ON FUNCTION tide._queue_count_again_briefly(name, text) IS
    'Internal: counts a queue''s running runs again (its count was stale), waiting at most 200 ms for its lock; false if it could not.';

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
    IF p_value ~* '^backfill\.' THEN
        RAISE EXCEPTION 'queue name % is reserved', quote_literal(p_value) USING ERRCODE = 'invalid_parameter_value',
            HINT = 'queues named backfill.<id> belong to backfills: use tide.pause_backfill, tide.resume_backfill, tide.cancel_backfill';
    END IF;
    RETURN p_value;
END
$$;
COMMENT ON FUNCTION tide._queue_name(text) IS 'Internal: a queue name, or a clear error naming the bad value.';

CREATE FUNCTION tide.create_queue(queue text, max_concurrency integer DEFAULT NULL, rate double precision DEFAULT NULL,
                                  retry_budget integer DEFAULT NULL, retry_window interval DEFAULT '10 minutes')
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._queue_name(create_queue.queue);
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
       OR create_queue.retry_window > interval '1 day'
       -- One sign for its months, days and time, as every interval of pg_tide's
       -- ('1 day -1 hour' is refused, not read as 23 hours).
       OR extract(month FROM create_queue.retry_window) < 0 OR extract(day FROM create_queue.retry_window) < 0
       OR extract(epoch FROM create_queue.retry_window - date_trunc('day', create_queue.retry_window)) < 0 THEN
        RAISE EXCEPTION 'retry_window must be an interval of 1 minute to 1 day whose days and time have one sign, got %', coalesce(create_queue.retry_window::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass retry_window => ''10 minutes''';
    END IF;
    INSERT INTO tide.queue AS q (owner, name, max_concurrency, rate, retry_budget, retry_window, tokens, budget)
    VALUES (tide._caller(), create_queue.queue, create_queue.max_concurrency, create_queue.rate,
            create_queue.retry_budget, create_queue.retry_window,
            greatest(1, coalesce(create_queue.rate, 1)), coalesce(create_queue.retry_budget, 0))
    ON CONFLICT ON CONSTRAINT queue_pkey DO UPDATE
       SET max_concurrency = EXCLUDED.max_concurrency, rate = EXCLUDED.rate,
           retry_budget = EXCLUDED.retry_budget, retry_window = EXCLUDED.retry_window,
           tokens = least(q.tokens, EXCLUDED.tokens),
           budget = CASE WHEN q.retry_budget IS NULL THEN EXCLUDED.budget ELSE least(q.budget, EXCLUDED.budget) END,
           updated_at = now();
    PERFORM tide._queue_recount(tide._caller(), create_queue.queue);
    -- Runs waiting for a limit that is now higher (or gone) may go.
    PERFORM tide._wake_queue(tide._caller(), create_queue.queue);
    RETURN create_queue.queue;
END
$$;
COMMENT ON FUNCTION tide.create_queue(text, integer, double precision, integer, interval) IS
    'create_queue(queue, max_concurrency => NULL, rate => NULL, retry_budget => NULL, retry_window => ''10 minutes''): declares (or changes) the limits of one of the caller''s queues: at most max_concurrency of its runs running at once, at most rate starts per second, and at most retry_budget transient failures per retry_window before its retries wait. NULL: no such limit. Returns the name.';

CREATE FUNCTION tide.drop_queue(queue text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._queue_name(drop_queue.queue);
    DELETE FROM tide.queue q WHERE q.owner = tide._caller() AND q.name = drop_queue.queue;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM tide._queue_forget(tide._caller(), drop_queue.queue);
    PERFORM tide._wake_queue(tide._caller(), drop_queue.queue);
    RETURN true;
END
$$;
COMMENT ON FUNCTION tide.drop_queue(text) IS
    'drop_queue(queue): removes the limits of one of the caller''s queues (its runs go on without limits); false if it had none.';

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

CREATE FUNCTION tide.pause_queue(queue text) RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT tide._set_queue_paused(queue, true) $$;
COMMENT ON FUNCTION tide.pause_queue(text) IS
    'pause_queue(queue): no run of the caller''s queue starts until tide.resume_queue (running ones finish); false if it already was paused.';

CREATE FUNCTION tide.resume_queue(queue text) RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT tide._set_queue_paused(queue, false) $$;
COMMENT ON FUNCTION tide.resume_queue(text) IS
    'resume_queue(queue): lets the runs of a paused queue start again; false if it was not paused.';

-- Runs of a queue parked for its limits look again now (a limit was raised, room or the queue
-- freed): as many as could start.
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
    -- (A count not known yet wakes up to the limit: the claims decide.)
    room := CASE WHEN q.max_concurrency IS NULL THEN 1000000
                 ELSE greatest(0, q.max_concurrency - coalesce(tide._queue_running(p_owner, p_queue), 0)) END;
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
        PERFORM tide._ready(ARRAY[p_queue]);
        PERFORM tide._wake(false);
    END IF;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._wake_queue(name, text) IS
    'Internal: unparks the runs of a queue that may start now (up to its free room).';

-- Runs parked for want of room wait for a run of their queue to end, which wakes them
-- (tide._queue_ended). A run that ended while the claim parking them had not committed yet did
-- not see them, and they would wait for their fallback (up to 5 seconds, tide._queue_admit). So a
-- claim that finds nothing to claim wakes the runs parked in those of its queues that have
-- room now (their parking committed by then, or still held by a claim in progress, and skipped).
-- The queues are those the claim may take from: the roles it acts for, and the queues granted
-- to it (owner and queue, as the claim's candidates).
CREATE FUNCTION tide._wake_parked(p_executor tide.executor, p_queue text, p_owners name[], p_g_owners name[],
                                  p_g_queues text[])
RETURNS integer
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(sum(tide._wake_queue(q.owner, q.name)), 0)::integer
      FROM tide.queue q
     WHERE (p_queue IS NULL OR q.name = p_queue)
       AND (p_owners IS NULL OR q.owner = ANY (p_owners)
            OR (q.owner, q.name) IN (SELECT u.o, u.q FROM unnest(p_g_owners, p_g_queues) u(o, q)))
       AND q.max_concurrency IS NOT NULL AND NOT q.paused
       -- A count not known (after a restart or new limits) is left to the claims, which count
       -- again: waking on it would let claims race to count again.
       AND tide._queue_running(q.owner, q.name) < q.max_concurrency
       AND EXISTS (SELECT 1 FROM tide.pending p
                    WHERE p.parked AND p.state = 'ready' AND p.queue = q.name AND p.owner = q.owner
                      AND p.executor = p_executor)
$$;
COMMENT ON FUNCTION tide._wake_parked(tide.executor, text, name[], name[], text[]) IS
    'Internal: for a claim that found nothing: unparks the runs parked for room in the queues it may take from (of the roles it acts for, or granted to it) that have room now (a wake-up missed while their parking was being committed).';

-- Which claimed candidates their queues let start now: not paused, a start token each (rate),
-- room each (max_concurrency). The others are parked: until their token is due, until room is
-- given back (the run that ends wakes them), until resume_queue. Room is reserved in the
-- queue's shared count (src/queues/count.rs), so claims of one queue go side by side; only a
-- rate-limited queue's row is locked (its token bucket), and claims of it take turns.
-- counted: the admitted runs the reservations were for (the claim marks them in tide.pending).
-- p_ids come in the claim's order (priority, then oldest), with their owners and queues.
CREATE FUNCTION tide._queue_admit(p_ids bigint[], p_owners name[], p_queues text[],
                                  OUT admitted bigint[], OUT counted bigint[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q record;
    bucket tide.queue;
    have double precision;
    cap integer;
    n integer;
    wait interval;
BEGIN
    admitted := '{}';
    counted := '{}';
    FOR q IN
        SELECT c.owner, c.queue, array_agg(c.run_id ORDER BY c.k) AS runs,
               x.name IS NOT NULL AS declared, x.paused, x.max_concurrency, x.rate
          FROM unnest(p_ids, p_owners, p_queues) WITH ORDINALITY AS c(run_id, owner, queue, k)
          LEFT JOIN tide.queue x ON x.owner = c.owner AND x.name = c.queue
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
            n := tide._queue_reserve(q.owner, q.queue, q.max_concurrency, cap);
            IF n < 0 THEN
                -- The count is stale (after a restart, or new limits): counted again first.
                n := CASE WHEN tide._queue_count_again_briefly(q.owner, q.queue)
                          THEN greatest(0, tide._queue_reserve(q.owner, q.queue, q.max_concurrency, cap))
                          ELSE 0 END;
            END IF;
            counted := counted || q.runs[1:n];
        END IF;
        IF q.rate IS NOT NULL AND n > 0 THEN
            UPDATE tide.queue x SET tokens = have - n, tokens_at = now()
             WHERE x.owner = q.owner AND x.name = q.queue;
        END IF;
        admitted := admitted || q.runs[1:n];
        CONTINUE WHEN n >= cardinality(q.runs);
        -- The rest wait: for their token (the k-th run's is due after (k - have) / rate
        -- seconds), else for room. A run that ends wakes them; in case that wake-up misses
        -- them (this claim, parking them, has not committed yet), they look again in 5
        -- seconds, or in 1 when the queue has room (held by claims still in progress, or its
        -- count is being counted again).
        wait := CASE WHEN q.max_concurrency IS NOT NULL
                      AND coalesce(tide._queue_running(q.owner, q.queue), 0) < q.max_concurrency
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
    'Internal: the claimed candidates their queues let start (paused, rate, room within max_concurrency) and those counted; parks the others.';

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

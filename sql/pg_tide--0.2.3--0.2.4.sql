-- pg_tide 0.2.3 to 0.2.4: what the console's charts and task pages read. Hourly counters of
-- each task's and each owner's runs by outcome, with a histogram of durations
-- (tide.run_hourly, tide.owner_hourly, read through tide.run_hours), counted by the paths that
-- count for tide.metrics() and folded every tick; one task's health read for that task alone
-- (tide.task_health); tide.preview takes the owner of the task it previews.
-- Run by ALTER EXTENSION pg_tide UPDATE; the upgrade tier (pg_test/tests/upgrade.rs) checks that
-- the schema it leaves is the one a fresh CREATE EXTENSION makes. Functions whose body changed are
-- dropped and created again rather than replaced (pgspot's PS002).
\echo Use "ALTER EXTENSION pg_tide UPDATE TO '0.2.4'" to load this file. \quit
SET LOCAL search_path = pg_catalog, pg_temp;

-- The hourly counters (the hours before the update stay empty).
CREATE TABLE tide.run_hourly (
    task_id    bigint NOT NULL,
    hour       timestamptz NOT NULL,
    succeeded  integer NOT NULL DEFAULT 0,
    failed     integer NOT NULL DEFAULT 0,
    dead       integer NOT NULL DEFAULT 0,
    skipped    integer NOT NULL DEFAULT 0,
    need_check integer NOT NULL DEFAULT 0,
    cancelled  integer NOT NULL DEFAULT 0,
    durations  jsonb NOT NULL DEFAULT '{}',
    owner      name NOT NULL,
    PRIMARY KEY (task_id, hour)
);
COMMENT ON TABLE tide.run_hourly IS
    'Per task and hour (the hour an attempt ended): succeeded, failed (an attempt that failed and is tried again), dead, skipped, need_check and cancelled runs, and the successes'' durations as a histogram (bucket k: at most 2^(k/4) ms, its count). Kept eight days; read through tide.run_hours. Maintained by pg_tide.';
CREATE INDEX run_hourly_hour_idx ON tide.run_hourly (hour);

CREATE TABLE tide.owner_hourly (
    owner      name NOT NULL,
    hour       timestamptz NOT NULL,
    succeeded  integer NOT NULL DEFAULT 0,
    failed     integer NOT NULL DEFAULT 0,
    dead       integer NOT NULL DEFAULT 0,
    skipped    integer NOT NULL DEFAULT 0,
    need_check integer NOT NULL DEFAULT 0,
    cancelled  integer NOT NULL DEFAULT 0,
    durations  jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (owner, hour)
);
COMMENT ON TABLE tide.owner_hourly IS
    'tide.run_hourly summed over each owner''s tasks (those deleted since included). Kept eight days; read through tide.run_hours. Maintained by pg_tide.';
CREATE INDEX owner_hourly_hour_idx ON tide.owner_hourly (hour);

ALTER TABLE tide.run_hourly ENABLE ROW LEVEL SECURITY;
CREATE POLICY run_hourly_owner ON tide.run_hourly FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.run_hourly TO PUBLIC;
ALTER TABLE tide.owner_hourly ENABLE ROW LEVEL SECURITY;
CREATE POLICY owner_hourly_owner ON tide.owner_hourly FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.owner_hourly TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.run_hourly', '');
SELECT pg_catalog.pg_extension_config_dump('tide.owner_hourly', '');

-- New functions.
CREATE FUNCTION tide._duration_bucket(d interval) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN extract(epoch FROM d) OPERATOR(pg_catalog.<=) 0.001 THEN 0
                ELSE LEAST(120::numeric, pg_catalog.ceil(4 OPERATOR(pg_catalog.*)
                         pg_catalog.log(2.0, (extract(epoch FROM d) OPERATOR(pg_catalog.*) 1000)::numeric)))::integer END
$$;
COMMENT ON FUNCTION tide._duration_bucket(interval) IS
    'Internal: the bucket of a duration in the hourly counters (durations of at most 2^(k/4) ms in bucket k).';

CREATE FUNCTION tide._hist_add(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(jsonb_object_agg(x.k, x.n), '{}')
      FROM (SELECT e.key AS k, sum(e.value::bigint) AS n
              FROM (SELECT * FROM jsonb_each_text(a) UNION ALL SELECT * FROM jsonb_each_text(b)) e
             GROUP BY e.key) x
$$;
COMMENT ON FUNCTION tide._hist_add(jsonb, jsonb) IS 'Internal: two histograms of durations of the hourly counters added.';

CREATE FUNCTION tide._hist_quantile(h jsonb, q double precision) RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT make_interval(secs => power(2::double precision, x.k / 4.0) / 1000)
      FROM (SELECT e.key::integer AS k,
                   sum(e.value::bigint) OVER (ORDER BY e.key::integer) AS running,
                   sum(e.value::bigint) OVER () AS total
              FROM jsonb_each_text(h) e) x
     WHERE x.running >= q * x.total
     ORDER BY x.k LIMIT 1
$$;
COMMENT ON FUNCTION tide._hist_quantile(jsonb, double precision) IS
    'Internal: the duration at a quantile of a histogram of the hourly counters (its bucket''s bound).';

CREATE FUNCTION tide._task_of(p_task text, p_owner name, p_function text) RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id bigint;
BEGIN
    IF p_task IS NULL THEN
        RAISE EXCEPTION '%: task must not be NULL', p_function USING ERRCODE = 'null_value_not_allowed',
            HINT = 'name a task: SELECT name, owner FROM tide.task';
    END IF;
    id := tide._named_task(p_task, NULL, p_owner);
    IF id IS NULL THEN
        RAISE EXCEPTION '%: task "%"% does not exist', p_function, left(p_task, 200),
                        coalesce(' of role ' || quote_ident(p_owner), '')
            USING ERRCODE = 'undefined_object',
                  HINT = 'SELECT name, owner FROM tide.task lists the tasks you can see (your own, your teams'', every role''s for tide_admin)';
    END IF;
    RETURN id;
END
$$;
COMMENT ON FUNCTION tide._task_of(text, name, text) IS
    'Internal: the task_id a name (and optionally its owner) means to the caller; 42704 when it sees none.';

CREATE FUNCTION tide.run_hours(task text DEFAULT NULL, owner name DEFAULT NULL, hours integer DEFAULT 24)
RETURNS TABLE (hour timestamptz, succeeded integer, failed integer, dead integer, skipped integer,
               need_check integer, cancelled integer, p50_duration interval, p95_duration interval)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    id bigint;
    last_hour timestamptz := date_trunc('hour', now());
BEGIN
    IF hours IS NULL OR hours < 1 OR hours > 192 THEN
        RAISE EXCEPTION 'tide.run_hours: hours % is out of range', coalesce(hours::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'from 1 to 192 (eight days, as long as the hourly counters are kept): 24 for a day, 168 for a week';
    END IF;
    IF run_hours.task IS NOT NULL THEN
        id := tide._task_of(run_hours.task, run_hours.owner, 'tide.run_hours');
    END IF;
    -- The task's hours, or those of every owner the caller sees (row-level security) or of the
    -- one named, summed by hour; every hour of the span, empty ones included.
    RETURN QUERY
    WITH x AS (
        SELECT y.hour, y.succeeded, y.failed, y.dead, y.skipped, y.need_check, y.cancelled, y.durations
          FROM tide.run_hourly y
         WHERE id IS NOT NULL AND y.task_id = id AND y.hour > last_hour - make_interval(hours => run_hours.hours)
        UNION ALL
        SELECT y.hour, y.succeeded, y.failed, y.dead, y.skipped, y.need_check, y.cancelled, y.durations
          FROM tide.owner_hourly y
         WHERE id IS NULL AND y.hour > last_hour - make_interval(hours => run_hours.hours)
           AND (run_hours.owner IS NULL OR y.owner = run_hours.owner)
    ), s AS (
        SELECT x.hour, sum(x.succeeded)::integer AS succeeded, sum(x.failed)::integer AS failed,
               sum(x.dead)::integer AS dead, sum(x.skipped)::integer AS skipped,
               sum(x.need_check)::integer AS need_check, sum(x.cancelled)::integer AS cancelled
          FROM x GROUP BY x.hour
    ), d AS (
        SELECT b.hour, jsonb_object_agg(b.k, b.n) AS durations
          FROM (SELECT x.hour, e.key AS k, sum(e.value::bigint) AS n
                  FROM x CROSS JOIN LATERAL jsonb_each_text(x.durations) e GROUP BY 1, 2) b
         GROUP BY b.hour
    )
    SELECT g.h, coalesce(s.succeeded, 0), coalesce(s.failed, 0), coalesce(s.dead, 0), coalesce(s.skipped, 0),
           coalesce(s.need_check, 0), coalesce(s.cancelled, 0),
           tide._hist_quantile(d.durations, 0.5), tide._hist_quantile(d.durations, 0.95)
      FROM generate_series(last_hour - make_interval(hours => run_hours.hours - 1), last_hour, '1 hour') g(h)
      LEFT JOIN s ON s.hour = g.h
      LEFT JOIN d ON d.hour = g.h
     ORDER BY g.h;
END
$$;
COMMENT ON FUNCTION tide.run_hours(text, name, integer) IS
    'run_hours(task => NULL, owner => NULL, hours => 24): one row per hour of the last hours (1 to 192, the current hour last): the attempts that ended in it by outcome (succeeded; failed: failed and tried again; dead; skipped; need_check; cancelled) and the p50 and p95 duration of its successes (the bound of a bucket 19% wide). With task: that task (owner names another role''s task of that name); without: all the tasks of the roles the caller sees (owner: one role''s). Reads the hourly counters, kept eight days, not history.';

-- Changed functions.
DROP FUNCTION tide._counts_of(tide.run_state, integer, timestamptz, timestamptz, timestamptz, timestamptz, timestamptz);
CREATE FUNCTION tide._counts_of(p_to tide.run_state, p_attempts integer, p_claimed timestamptz,
                                p_finished timestamptz, p_started timestamptz, p_fire timestamptz,
                                p_created timestamptz)
RETURNS TABLE (metric text, label text, value double precision)
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT m.metric, m.label, m.value
      FROM (VALUES
          ('runs', p_to::pg_catalog.text, 1::double precision,
           p_to OPERATOR(pg_catalog.=) ANY ('{succeeded,need_check,dead,skipped,cancelled}'::tide.run_state[])),
          ('duration_sum', '', extract(epoch FROM p_finished OPERATOR(pg_catalog.-) p_claimed)::double precision,
           p_to OPERATOR(pg_catalog.=) 'succeeded'::tide.run_state AND p_claimed IS NOT NULL),
          ('duration_count', '', 1, p_to OPERATOR(pg_catalog.=) 'succeeded'::tide.run_state AND p_claimed IS NOT NULL),
          ('duration_bucket', tide._le(extract(epoch FROM p_finished OPERATOR(pg_catalog.-) p_claimed)::double precision), 1,
           p_to OPERATOR(pg_catalog.=) 'succeeded'::tide.run_state AND p_claimed IS NOT NULL),
          ('wait_sum', '', extract(epoch FROM greatest(p_started OPERATOR(pg_catalog.-) COALESCE(p_fire, p_created),
                                                                  '0'::pg_catalog.interval))::double precision,
           p_to OPERATOR(pg_catalog.=) 'running'::tide.run_state AND p_attempts OPERATOR(pg_catalog.=) 1),
          ('wait_count', '', 1, p_to OPERATOR(pg_catalog.=) 'running'::tide.run_state AND p_attempts OPERATOR(pg_catalog.=) 1),
          ('wait_bucket', tide._le(extract(epoch FROM greatest(p_started OPERATOR(pg_catalog.-) COALESCE(p_fire, p_created),
                                                                   '0'::pg_catalog.interval))::double precision), 1,
           p_to OPERATOR(pg_catalog.=) 'running'::tide.run_state AND p_attempts OPERATOR(pg_catalog.=) 1),
          -- The hour's counters of the console's charts (tide.run_hourly, folded by tide._fold):
          -- the hour an attempt ended, its outcome (retry: a failed attempt to be tried again),
          -- and a success's duration as the index of its bucket (tide._duration_bucket).
          ('hour', pg_catalog.concat_ws('|',
                     pg_catalog.floor(extract(epoch FROM COALESCE(p_finished, pg_catalog.now())) OPERATOR(pg_catalog./) 3600)::bigint,
                     p_to,
                     CASE WHEN p_to OPERATOR(pg_catalog.=) 'succeeded'::tide.run_state AND p_claimed IS NOT NULL
                          THEN tide._duration_bucket(p_finished OPERATOR(pg_catalog.-) p_claimed) END), 1,
           p_to OPERATOR(pg_catalog.=) ANY ('{succeeded,need_check,dead,skipped,cancelled,retry}'::tide.run_state[])))
          AS m(metric, label, value, counts)
     WHERE m.counts AND m.label IS NOT NULL
$$;
COMMENT ON FUNCTION tide._counts_of(tide.run_state, integer, timestamptz, timestamptz, timestamptz, timestamptz, timestamptz) IS
    'Internal: what a history row that brings a run to a state adds to the counters of tide.metrics() and to the hourly counters of tide.run_hours (metric, label, value).';

DROP FUNCTION tide._fold(timestamptz, integer);
CREATE FUNCTION tide._fold(p_now timestamptz, p_limit integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    n integer;
    todo bigint[];
    touched bigint[];
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('pg_tide fold')) THEN
        RETURN 0;
    END IF;
    -- Each statement below reads with a snapshot taken after the lock: it sees what an earlier
    -- fold wrote.
    -- The hourly counters (metric 'hour', label 'hour since the epoch|state|duration bucket')
    -- go to tide.run_hourly and tide.owner_hourly (sql/charts.sql), the rest to tide.run_count.
    WITH d AS (DELETE FROM tide.count_delta RETURNING task_id, metric, label, value, owner
    ), counters AS (
        INSERT INTO tide.run_count AS c (task_id, metric, label, value, owner)
        SELECT d.task_id, d.metric, d.label, sum(d.value), min(d.owner) FROM d
         WHERE d.metric <> 'hour' AND EXISTS (SELECT 1 FROM tide.task t WHERE t.task_id = d.task_id)
         GROUP BY 1, 2, 3
        ON CONFLICT (task_id, metric, label) DO UPDATE SET value = c.value + EXCLUDED.value
    ), h AS (
        SELECT d.task_id, d.owner, to_timestamp(split_part(d.label, '|', 1)::bigint * 3600) AS hour,
               split_part(d.label, '|', 2) AS state, nullif(split_part(d.label, '|', 3), '') AS bucket,
               sum(d.value)::integer AS n
          FROM d WHERE d.metric = 'hour'
         GROUP BY 1, 2, 3, 4, 5
    ), task_hours AS (
        INSERT INTO tide.run_hourly AS x (task_id, hour, succeeded, failed, dead, skipped, need_check, cancelled,
                                          durations, owner)
        SELECT h.task_id, h.hour, coalesce(sum(h.n) FILTER (WHERE h.state = 'succeeded'), 0),
               coalesce(sum(h.n) FILTER (WHERE h.state = 'retry'), 0), coalesce(sum(h.n) FILTER (WHERE h.state = 'dead'), 0),
               coalesce(sum(h.n) FILTER (WHERE h.state = 'skipped'), 0),
               coalesce(sum(h.n) FILTER (WHERE h.state = 'need_check'), 0),
               coalesce(sum(h.n) FILTER (WHERE h.state = 'cancelled'), 0),
               coalesce(jsonb_object_agg(h.bucket, h.n) FILTER (WHERE h.bucket IS NOT NULL), '{}'), min(h.owner)
          FROM h WHERE EXISTS (SELECT 1 FROM tide.task t WHERE t.task_id = h.task_id)
         GROUP BY h.task_id, h.hour
        ON CONFLICT (task_id, hour) DO UPDATE
           SET succeeded = x.succeeded + EXCLUDED.succeeded, failed = x.failed + EXCLUDED.failed,
               dead = x.dead + EXCLUDED.dead, skipped = x.skipped + EXCLUDED.skipped,
               need_check = x.need_check + EXCLUDED.need_check, cancelled = x.cancelled + EXCLUDED.cancelled,
               durations = tide._hist_add(x.durations, EXCLUDED.durations)
    ), o AS (
        SELECT h.owner, h.hour, h.state, h.bucket, sum(h.n) AS n FROM h GROUP BY 1, 2, 3, 4
    )
    INSERT INTO tide.owner_hourly AS x (owner, hour, succeeded, failed, dead, skipped, need_check, cancelled, durations)
    SELECT o.owner, o.hour, coalesce(sum(o.n) FILTER (WHERE o.state = 'succeeded'), 0),
           coalesce(sum(o.n) FILTER (WHERE o.state = 'retry'), 0), coalesce(sum(o.n) FILTER (WHERE o.state = 'dead'), 0),
           coalesce(sum(o.n) FILTER (WHERE o.state = 'skipped'), 0),
           coalesce(sum(o.n) FILTER (WHERE o.state = 'need_check'), 0),
           coalesce(sum(o.n) FILTER (WHERE o.state = 'cancelled'), 0),
           coalesce(jsonb_object_agg(o.bucket, o.n) FILTER (WHERE o.bucket IS NOT NULL), '{}')
      FROM o
     GROUP BY o.owner, o.hour
    ON CONFLICT (owner, hour) DO UPDATE
       SET succeeded = x.succeeded + EXCLUDED.succeeded, failed = x.failed + EXCLUDED.failed,
           dead = x.dead + EXCLUDED.dead, skipped = x.skipped + EXCLUDED.skipped,
           need_check = x.need_check + EXCLUDED.need_check, cancelled = x.cancelled + EXCLUDED.cancelled,
           durations = tide._hist_add(x.durations, EXCLUDED.durations);
    -- The tasks to recompute: those touched (their touch rows deleted now) and those whose
    -- 24-hour figures expired. They are computed with a later snapshot than the deletion's:
    -- every change whose touch row goes is in it (one committed later keeps its row).
    WITH picked AS (
        SELECT DISTINCT x.task_id FROM (SELECT y.task_id FROM tide.task_touch y LIMIT p_limit * 10) x
         LIMIT p_limit
    ), gone AS (
        DELETE FROM tide.task_touch x WHERE x.task_id IN (SELECT p.task_id FROM picked p) RETURNING x.task_id
    )
    SELECT array_agg(DISTINCT g.task_id) INTO touched FROM gone g;
    SELECT array_agg(DISTINCT y.task_id) INTO todo
      FROM (SELECT t.task_id FROM unnest(touched) t(task_id)
            UNION ALL
            (SELECT s.task_id FROM tide.task_stat s WHERE s.valid_until <= p_now LIMIT p_limit)) y;
    -- Live pages (the console) LISTEN on pg_tide_changed: one NOTIFY per fold that saw changes,
    -- never one per run (a NOTIFY takes a global lock at commit). The payload lists the tasks
    -- whose runs changed, or is empty when they would not fit (then anything may have changed).
    IF touched IS NOT NULL THEN
        PERFORM tide._notify('pg_tide_changed',
                          CASE WHEN cardinality(touched) <= 500 THEN array_to_string(touched, ',') ELSE '' END);
    END IF;
    IF todo IS NULL THEN
        RETURN 0;  -- (the computation is not even planned)
    END IF;
    INSERT INTO tide.task_stat AS s (task_id, owner, computed_at, valid_until, last_success,
                                     last_state, skips, failures, retries, catch_up_limited, not_ready, p50, p95, wait95,
                                     quiet_at)
    SELECT h.task_id, h.owner, p_now, h.valid_until, h.last_success, h.last_state, h.skips,
           h.failures, h.retries, h.catch_up_limited, h.not_ready, h.p50, h.p95, h.wait95,
           coalesce(h.last_success, t.created_at)
             + make_interval(secs => extract(epoch FROM tide._max_silence(t.max_silence, t.fire_gap, t.timeout))::float8)
      FROM tide._task_history(p_now, todo) h
      JOIN tide.task t ON t.task_id = h.task_id
    ON CONFLICT (task_id) DO UPDATE
       SET owner = EXCLUDED.owner, computed_at = EXCLUDED.computed_at, valid_until = EXCLUDED.valid_until,
           last_success = EXCLUDED.last_success,
           last_state = EXCLUDED.last_state, skips = EXCLUDED.skips, failures = EXCLUDED.failures,
           retries = EXCLUDED.retries, catch_up_limited = EXCLUDED.catch_up_limited,
           not_ready = EXCLUDED.not_ready, p50 = EXCLUDED.p50, p95 = EXCLUDED.p95, wait95 = EXCLUDED.wait95,
           quiet_at = EXCLUDED.quiet_at;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._fold(timestamptz, integer) IS
    'Internal: recomputes the kept health figures (tide.task_stat) of tasks whose runs changed or whose 24-hour figures expired, and adds new counts to the counters of tide.metrics() (every tick); notifies pg_tide_changed with the ids of the tasks whose runs changed.';

DROP FUNCTION tide._fail(bigint, text, tide.error_kind, text, tide.attempt_outcome, timestamptz);
CREATE FUNCTION tide._fail(p_run_id bigint, p_error text, p_kind tide.error_kind, p_sqlstate text,
                           p_outcome tide.attempt_outcome, p_now timestamptz)
RETURNS tide.run_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
    changed tide.run;
    rules jsonb;
    next_fire timestamptz;
    max_attempts integer;
    new_state tide.run_state;
    wait_until timestamptz;
    budget_hold timestamptz;
    why text;
    error_text text;
BEGIN
    SELECT * INTO r FROM tide.run WHERE run_id = p_run_id FOR UPDATE;
    SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = r.task_id AND v.version = r.version;
    max_attempts := (rules->>'max_attempts')::integer;
    -- Errors come from workers and commands: kept bounded.
    error_text := tide._clip(p_error, 10000);
    IF p_kind = 'business' THEN
        new_state := 'dead';
        why := format('business error: %s', error_text);
    ELSIF r.tries >= max_attempts THEN
        new_state := 'dead';
        why := format('gave up after %s of %s attempts: %s', r.tries, max_attempts, error_text);
    ELSIF p_kind = 'transient' THEN
        new_state := 'retry';
        wait_until := p_now + tide.backoff_delay(r.tries, (rules->>'backoff_base')::interval,
                                                 (rules->>'backoff_factor')::float8,
                                                 (rules->>'backoff_cap')::interval,
                                                 rules->>'jitter', random());
        -- The queue's retry budget (tide.queue): when it is spent, the retry waits for it.
        budget_hold := tide._spend_retry(r.owner, r.queue, p_now);
        IF budget_hold > wait_until THEN
            wait_until := budget_hold;
        END IF;
        why := format('attempt %s of %s failed, retry after %s%s: %s', r.tries, max_attempts,
                      to_char(wait_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS" UTC"'),
                      CASE WHEN budget_hold IS NOT NULL
                           THEN format(' (the retry budget of queue %s is spent)', r.queue) ELSE '' END,
                      error_text);
    ELSE
        -- Not ready: wait for the next window, never a tight loop.
        SELECT t.next_fire_at INTO next_fire FROM tide.task t WHERE t.task_id = r.task_id;
        wait_until := CASE WHEN next_fire > p_now THEN next_fire
                           ELSE p_now + (rules->>'recheck_interval')::interval END;
        new_state := 'waiting';
        why := format('not ready (attempt %s of %s), waits until %s: %s', r.tries, max_attempts,
                      to_char(wait_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS" UTC"'), error_text);
    END IF;
    -- Running to retry, dead or waiting: legal by construction; the history row, written here,
    -- carries the attempt this ends.
    PERFORM set_config('tide.history', 'written', true);
    UPDATE tide.run
       SET state = new_state,
           run_after = wait_until,
           ready_deadline = NULL,
           last_error = error_text,
           last_error_kind = p_kind,
           lease_expires_at = NULL,
           finished_at = CASE WHEN new_state = 'dead' THEN p_now END,
           updated_at = now(),
           reason = why
     WHERE run_id = p_run_id AND state = 'running'
    RETURNING * INTO changed;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % is %, not running: no attempt to end', p_run_id, r.state
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'only a claimed run can fail';
    END IF;
    PERFORM set_config('tide.history', '', true);
    PERFORM tide._sync_pending(changed, true);
    INSERT INTO tide.run_event (run_id, from_state, to_state, reason, owner, at, attempt, worker, lease_token,
                                claimed_at, outcome, error_kind, sqlstate, error)
    VALUES (p_run_id, 'running', new_state, why, r.owner, p_now, r.attempts, r.lease_owner, r.lease_token,
            coalesce(r.claimed_at, p_now), p_outcome, p_kind, p_sqlstate, error_text);
    -- What it counts, here as on every path that writes history: the task touched, and a dead
    -- letter among the outcomes of tide.metrics().
    INSERT INTO tide.task_touch (task_id, owner) VALUES (r.task_id, r.owner);
    -- (A retry has no finished_at: its failed attempt ended at p_now, the hour it counts in.)
    INSERT INTO tide.count_delta (task_id, metric, label, value, owner)
    SELECT r.task_id, m.metric, m.label, m.value, r.owner
      FROM tide._counts_of(new_state, changed.attempts, changed.claimed_at, coalesce(changed.finished_at, p_now),
                           changed.started_at, changed.fire_at, changed.created_at) m;
    IF new_state = 'retry' THEN
        PERFORM tide._wake(true);  -- the scheduler sleeps until the retry is due, not its next poll
    END IF;
    IF tide._log_on() THEN
        PERFORM tide._log_runs('failure', ARRAY[p_run_id], error_text);
    END IF;
    RETURN new_state;
END
$$;
COMMENT ON FUNCTION tide._fail(bigint, text, tide.error_kind, text, tide.attempt_outcome, timestamptz) IS
    'Internal: records a failed attempt and decides retry (with backoff), wait (not ready) or dead letter.';

DROP FUNCTION tide._named_task(text, text);
CREATE FUNCTION tide._named_task(p_name text, p_granted text DEFAULT NULL, p_owner name DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ids bigint[];
BEGIN
    -- With an owner: that role's task of the name, as row-level security lets the caller see it.
    IF p_owner IS NOT NULL THEN
        RETURN (SELECT t.task_id FROM tide.task t WHERE t.name = p_name AND t.owner = p_owner);
    END IF;
    SELECT array_agg(t.task_id) INTO ids FROM tide.task t WHERE t.name = p_name AND t.owner = tide._caller();
    IF ids IS NOT NULL THEN
        RETURN ids[1];
    END IF;
    SELECT array_agg(x.task_id) INTO ids FROM (
        SELECT t.task_id FROM tide.task t
         WHERE t.name = p_name
           AND (tide._may_act(t.owner)
                OR (p_granted IS NOT NULL
                    AND EXISTS (SELECT 1 FROM tide._granted(p_granted) g WHERE g.owner = t.owner AND g.object = t.name)))
         ORDER BY t.task_id LIMIT 2) x;
    IF cardinality(ids) > 1 THEN
        RAISE EXCEPTION 'task name "%" belongs to several roles you act for', left(p_name, 200)
            USING ERRCODE = 'ambiguous_parameter',
                  HINT = 'SET ROLE to the task''s owner first (see SELECT name, owner FROM tide.task)';
    END IF;
    RETURN ids[1];
END
$$;
COMMENT ON FUNCTION tide._named_task(text, text, name) IS
    'Internal: the task a name means to the caller: its own, else the one of a role it acts for (or, with p_granted, that was granted to it); 42P08 when two roles have it. With p_owner: that role''s task of the name, if the caller sees it.';

DROP FUNCTION tide._prune(timestamptz, integer);
CREATE FUNCTION tide._prune(p_now timestamptz, p_limit integer) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    cursor_at bigint;
    last_id bigint;
    scanned integer;
    victims bigint[];
    -- Settings with units read as '30d', '10s': valid interval input.
    cutoff timestamptz := p_now - tide._setting('history_retention', '30d')::interval;
    alerts integer;
    effects integer;
BEGIN
    SELECT m.prune_cursor INTO cursor_at FROM tide.monitor_state m FOR UPDATE;
    SELECT max(s.run_id), count(*),
           array_agg(s.run_id) FILTER (
               WHERE s.state IN ('succeeded', 'skipped', 'cancelled')
                 AND coalesce(s.finished_at, s.updated_at) < cutoff
                 AND NOT EXISTS (SELECT 1 FROM tide.run c WHERE c.covered_by = s.run_id)
                 AND s.run_id NOT IN (SELECT k.run_id FROM tide.run k
                                       WHERE k.task_id = s.task_id AND k.window_start IS NOT NULL
                                       ORDER BY k.window_start DESC LIMIT 10))
      INTO last_id, scanned, victims
      FROM (SELECT r.run_id, r.task_id, r.state, r.finished_at, r.updated_at FROM tide.run r
             WHERE r.run_id > cursor_at ORDER BY r.run_id LIMIT p_limit) s;
    IF victims IS NOT NULL THEN
        -- Runs a transaction holds right now are left for the next round.
        SELECT array_agg(v.run_id) INTO victims
          FROM (SELECT x.run_id FROM tide.run x WHERE x.run_id = ANY (victims) FOR UPDATE SKIP LOCKED) v;
    END IF;
    IF victims IS NOT NULL THEN
        -- R4.6: the windows that succeeded are remembered, merged into ranges, after their runs
        -- go (a rerun or backfill of them needs force).
        INSERT INTO tide.succeeded_window AS w (task_id, windows, owner)
        SELECT r.task_id, range_agg(tstzrange(r.window_start, r.window_end)), min(r.owner)
          FROM tide.run r
         WHERE r.run_id = ANY (victims) AND r.state = 'succeeded' AND r.window_start IS NOT NULL
         GROUP BY r.task_id
        ON CONFLICT (task_id) DO UPDATE SET windows = w.windows + EXCLUDED.windows;
        DELETE FROM tide.run r WHERE r.run_id = ANY (victims);
    END IF;
    -- What the fold kept for tasks deleted since (bounded, like the rest).
    DELETE FROM tide.task_stat s
     WHERE s.task_id IN (SELECT x.task_id FROM tide.task_stat x
                          WHERE NOT EXISTS (SELECT 1 FROM tide.task t WHERE t.task_id = x.task_id) LIMIT p_limit);
    DELETE FROM tide.run_count c
     WHERE c.task_id IN (SELECT x.task_id FROM tide.run_count x
                          WHERE NOT EXISTS (SELECT 1 FROM tide.task t WHERE t.task_id = x.task_id) LIMIT p_limit);
    -- The hourly counters of the charts, kept eight days (tide.run_hours reads at most 192 hours).
    DELETE FROM tide.run_hourly x
     WHERE (x.task_id, x.hour) IN (SELECT y.task_id, y.hour FROM tide.run_hourly y
                                    WHERE y.hour < date_trunc('hour', p_now) - interval '192 hours' LIMIT p_limit);
    DELETE FROM tide.owner_hourly x
     WHERE (x.owner, x.hour) IN (SELECT y.owner, y.hour FROM tide.owner_hourly y
                                  WHERE y.hour < date_trunc('hour', p_now) - interval '192 hours' LIMIT p_limit);
    -- At the end of the table, start over (runs kept then may be prunable later).
    UPDATE tide.monitor_state SET prune_cursor = CASE WHEN scanned < p_limit THEN 0 ELSE last_id END;
    DELETE FROM tide.alert a
     WHERE a.alert_id IN (SELECT x.alert_id FROM tide.alert x WHERE x.resolved_at < cutoff ORDER BY x.resolved_at LIMIT p_limit);
    GET DIAGNOSTICS alerts = ROW_COUNT;
    -- Side effects delivered before the cutoff (their dedupe keys are forgotten with them);
    -- pending, sending and dead ones stay. One held right now waits for the next round.
    DELETE FROM tide.effect e
     WHERE e.effect_id IN (SELECT x.effect_id FROM tide.effect x
                            WHERE x.state = 'delivered' AND x.delivered_at < cutoff
                            ORDER BY x.delivered_at LIMIT p_limit
                              FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS effects = ROW_COUNT;
    -- Backfills that ended before the cutoff, with their plan and history.
    DELETE FROM tide.backfill b
     WHERE b.backfill_id IN (SELECT x.backfill_id FROM tide.backfill x
                              WHERE x.finished_at < cutoff
                                AND NOT EXISTS (SELECT 1 FROM tide.backfill_window w
                                                 WHERE w.backfill_id = x.backfill_id AND w.state = 'released')
                              ORDER BY x.finished_at LIMIT 100
                                FOR UPDATE SKIP LOCKED);
    -- Reconciliation results checked before the cutoff, with their differences, once none of
    -- those is open (an open one keeps its result until it is fixed or resolved).
    DELETE FROM tide.recon_result x
     WHERE x.result_id IN (SELECT y.result_id FROM tide.recon_result y
                            WHERE y.checked_at < cutoff
                              AND NOT EXISTS (SELECT 1 FROM tide.recon_diff d WHERE d.result_id = y.result_id AND d.status = 'open')
                            ORDER BY y.checked_at LIMIT p_limit
                              FOR UPDATE SKIP LOCKED);
    RETURN jsonb_build_object('pruned_runs', coalesce(cardinality(victims), 0), 'pruned_alerts', alerts,
                              'pruned_effects', effects);
END
$$;
COMMENT ON FUNCTION tide._prune(timestamptz, integer) IS
    'Internal: prunes a bounded batch of finished history older than pg_tide.history_retention (with attempts and events), keeping the latest 10 runs of each task, unfinished and unresolved runs, and open alerts (succeeded windows are remembered in tide.succeeded_window); side effects delivered before the cutoff; backfills that ended before it; reconciliation results checked before it without an open difference.';

DROP FUNCTION tide._reassign_owned(name, name);
CREATE FUNCTION tide._reassign_owned(p_old name, p_new name) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clash record;
    tbl regclass;
    moved bigint;
    kept record;
BEGIN
    IF p_old = p_new THEN
        RETURN 0;
    END IF;
    SELECT x.kind, x.name INTO clash FROM (
        SELECT 'task' AS kind, t.name FROM tide.task t WHERE t.owner = p_old
           AND EXISTS (SELECT 1 FROM tide.task u WHERE u.owner = p_new AND u.name = t.name)
        UNION ALL
        SELECT 'queue', q.name FROM tide.queue q WHERE q.owner = p_old
           AND EXISTS (SELECT 1 FROM tide.queue u WHERE u.owner = p_new AND u.name = q.name)
        UNION ALL
        SELECT 'channel', c.name FROM tide.alert_channel c WHERE c.owner = p_old
           AND EXISTS (SELECT 1 FROM tide.alert_channel u WHERE u.owner = p_new AND u.name = c.name)
        UNION ALL
        SELECT 'check', k.name FROM tide.check k WHERE k.owner = p_old
           AND EXISTS (SELECT 1 FROM tide.check u WHERE u.owner = p_new AND u.name = k.name)) x
     ORDER BY 1, 2 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'role % already has a % named "%", as role % does', quote_ident(p_new), clash.kind, clash.name, quote_ident(p_old)
            USING ERRCODE = 'unique_violation',
                  HINT = 'rename or remove one of them first (tide.unschedule(task, owner => ...) removes a task), then reassign again';
    END IF;
    SELECT count(*) INTO moved FROM tide.task t WHERE t.owner = p_old;
    -- The hourly counters summed by owner: p_old's hours are added to p_new's.
    WITH gone AS (DELETE FROM tide.owner_hourly x WHERE x.owner = p_old RETURNING x.*)
    INSERT INTO tide.owner_hourly AS x (owner, hour, succeeded, failed, dead, skipped, need_check, cancelled, durations)
    SELECT p_new, g.hour, g.succeeded, g.failed, g.dead, g.skipped, g.need_check, g.cancelled, g.durations FROM gone g
    ON CONFLICT (owner, hour) DO UPDATE
       SET succeeded = x.succeeded + EXCLUDED.succeeded, failed = x.failed + EXCLUDED.failed,
           dead = x.dead + EXCLUDED.dead, skipped = x.skipped + EXCLUDED.skipped,
           need_check = x.need_check + EXCLUDED.need_check, cancelled = x.cancelled + EXCLUDED.cancelled,
           durations = tide._hist_add(x.durations, EXCLUDED.durations);
    BEGIN
        FOR tbl IN SELECT * FROM tide._owner_tables() LOOP
            EXECUTE format('UPDATE %s SET owner = $2 WHERE owner = $1', tbl) USING p_old, p_new;
        END LOOP;
        UPDATE tide.grant g SET grantee = p_new WHERE g.grantee = p_old;
        -- A grant to oneself means nothing: the grants p_new gave p_old are gone with p_old.
        DELETE FROM tide.grant g WHERE g.owner = p_new AND g.grantee = p_new;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'cannot give role %''s pg_tide rows to role %: %', quote_ident(p_old), quote_ident(p_new), SQLERRM
            USING ERRCODE = 'unique_violation',
                  HINT = 'both roles have a row with the same key (a lock, a ready marker, a side effect''s dedupe key): remove one, then reassign again';
    END;
    -- The queues' running counts are kept by owner and name (src/queue_count.rs): counted
    -- again at their next claim.
    FOR kept IN SELECT x.name FROM tide.queue x WHERE x.owner = p_new LOOP
        PERFORM tide._queue_recount(p_new, kept.name);
    END LOOP;
    PERFORM tide._wake(true);
    RETURN moved;
END
$$;
COMMENT ON FUNCTION tide._reassign_owned(name, name) IS
    'Internal: REASSIGN OWNED for pg_tide''s rows (tide.reassign_owned, and REASSIGN OWNED BY in this database); returns the tasks moved.';

DROP FUNCTION tide.preview(text, integer, timestamptz);
CREATE  FUNCTION tide."preview"(
	"task" TEXT, /* Option < & str > */
	"n" INT DEFAULT 5, /* Option < i32 > */
	"after" timestamp with time zone DEFAULT NULL, /* Option < TimestampWithTimeZone > */
	"owner" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS TABLE (
	"fire_at" timestamp with time zone,  /* TimestampWithTimeZone */
	"fire_local" timestamp,  /* Timestamp */
	"window_start" timestamp with time zone,  /* TimestampWithTimeZone */
	"window_end" timestamp with time zone,  /* TimestampWithTimeZone */
	"window_start_local" timestamp,  /* Timestamp */
	"window_end_local" timestamp,  /* Timestamp */
	"window_length" interval,  /* Interval */
	"biz_date" date  /* Date */
)
STABLE  
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'preview_of_wrapper';
COMMENT ON FUNCTION tide.preview(text, integer, timestamptz, text) IS
    'preview(task, n => 5, after => now(), owner => NULL): the next n fires of a task with their local time, business window and biz_date. owner names another role''s task of that name (a team''s, or any role''s for tide_admin).';

-- Health of the tasks given alone (tide.task_health): the views over it are made again.
DROP VIEW tide.dashboard;
DROP VIEW tide.health;
DROP FUNCTION tide._health(timestamptz, bigint[]);
CREATE FUNCTION tide._health(p_now timestamptz, p_task_ids bigint[] DEFAULT NULL, p_exact boolean DEFAULT false)
RETURNS TABLE (task text, status text, severity tide.severity, last_success timestamptz, silence interval,
               max_silence interval, last_state tide.run_state, consecutive_failures integer,
               consecutive_skips integer, retries_24h integer, backlog integer, oldest_ready interval,
               dead integer, need_check integer, catch_up_limited_24h integer, not_ready_24h integer,
               p50_duration interval, p95_duration interval, p95_queue_wait interval,
               next_fire_at timestamptz, paused boolean, task_id bigint, owner name,
               tick_error text, tick_error_at timestamptz, tick_retry_at timestamptz,
               open_differences integer, differences_for_a_person integer, held integer, held_since timestamptz,
               oldest_ready_id bigint)
-- PL/pgSQL, one RETURN QUERY, rather than SQL: a set-returning SQL function with SET clauses
-- runs them around every row it returns (10,000 times per call over 10,000 tasks), and plans its
-- query at every call; this one sets them once and its session keeps the plan (measured over
-- 10,000 tasks: 13% less per call, alternating rounds). p_task_ids: these tasks and every task
-- with runs in tide.pending (whose counts health makes in any case, in one pass over the table)
-- only: the tick's alert evaluation asks for those that may have something to report. With
-- p_exact, the tasks given alone, and only their runs in tide.pending are counted
-- (tide.task_health).
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH open_runs AS (
    -- Unfinished and unresolved runs: tide.pending is small, one pass for all tasks; since
    -- when the oldest ready run waits, and the oldest held one (after a rule change, R12.3,
    -- for tide.confirm), from those runs alone.
    SELECT o.*,
           (SELECT greatest(r.updated_at, r.run_after) FROM tide.run r WHERE r.run_id = o.oldest_ready_id) AS ready_since,
           (SELECT r.updated_at FROM tide.run r WHERE r.run_id = o.oldest_held_id) AS held_since
      FROM (
    SELECT p.task_id,
           -- A ready run enqueued for later (due_at ahead, not parked) is not backlog yet.
           count(*) FILTER (WHERE p.state = 'waiting'
                               OR (p.state = 'ready' AND (p.parked OR p.due_at IS NULL OR p.due_at <= p_now))) AS backlog,
           count(*) FILTER (WHERE p.state = 'dead') AS dead,
           count(*) FILTER (WHERE p.state = 'need_check') AS need_check,
           min(p.run_id) FILTER (WHERE p.state = 'ready' AND (p.parked OR p.due_at IS NULL OR p.due_at <= p_now)) AS oldest_ready_id,
           min(p.run_id) FILTER (WHERE p.state = 'held') AS oldest_held_id,
           count(*) FILTER (WHERE p.state = 'held') AS held
      FROM tide.pending p
     WHERE NOT p_exact OR p.task_id = ANY (p_task_ids)
     GROUP BY p.task_id) o
), diffs AS (
    -- A reconciliation's open differences (each counted once, however many runs saw it).
    SELECT x.task_id, count(DISTINCT (x.biz_date, x.key, x.kind)) AS open,
           count(DISTINCT (x.biz_date, x.key, x.kind)) FILTER (WHERE x.class = 'human' OR x.escalated) AS for_a_person
      FROM tide.recon_diff x
     WHERE x.status = 'open'
     GROUP BY x.task_id
), touched AS MATERIALIZED (
    SELECT DISTINCT x.task_id FROM tide.task_touch x
), shown AS MATERIALIZED (
    -- With p_task_ids, the tasks shown: those given and every task with runs in tide.pending
    -- (counted above in any case). Both the kept figures and the stale tasks below keep to them.
    SELECT unnest(p_task_ids) AS task_id
    UNION SELECT o.task_id FROM open_runs o WHERE p_task_ids IS NOT NULL AND NOT p_exact
), stale AS MATERIALIZED (
    -- The tasks whose kept figures do not hold at p_now (a visible touch row, computed after
    -- p_now, or out of date; see above): computed from their runs below. A task without kept
    -- figures has a touch row: its creation notes it, and the fold deletes a touch row only
    -- with the kept figures of its task written in the same transaction (tide._monitor notes
    -- again any task that lacks both). So only the kept rows are read here, not every task
    -- against its kept row (measured over 10,000 tasks: 9% of health, four alternating rounds).
    -- With p_task_ids, only the kept rows of the tasks shown are read (by key): each of the
    -- two ways is planned, and the one that does not apply is skipped when it runs (so a plan
    -- the session keeps serves both; tide.task_health reads one task's row, not 10,000).
    SELECT ARRAY(SELECT y.task_id
                   FROM (SELECT s.task_id FROM tide.task_stat s
                          WHERE p_task_ids IS NULL AND (s.computed_at > p_now OR s.valid_until <= p_now)
                         UNION
                         SELECT s.task_id FROM shown x JOIN tide.task_stat s ON s.task_id = x.task_id
                          WHERE p_task_ids IS NOT NULL AND (s.computed_at > p_now OR s.valid_until <= p_now)
                         UNION SELECT u.task_id FROM touched u) y
                  WHERE p_task_ids IS NULL OR y.task_id IN (SELECT x.task_id FROM shown x)) AS ids
), f AS (
    -- Each task with what health reads from its history: its kept figures, joined to it
    -- directly; for the stale tasks, computed from their runs (not even planned when there are
    -- none). Measured over 10,000 tasks: a fifth faster than the kept figures gathered first
    -- and then joined to the tasks.
    SELECT t.name, t.paused, t.severity, t.next_fire_at, t.task_id, t.owner, t.tick_error, t.tick_error_at,
           t.tick_retry_at, t.reconcile, t.max_silence, t.fire_gap, t.timeout, t.created_at,
           s.last_success, s.last_state, s.skips, s.failures, s.retries, s.catch_up_limited, s.not_ready,
           s.p50, s.p95, s.wait95
      FROM tide.task t JOIN tide.task_stat s ON s.task_id = t.task_id
     WHERE p_task_ids IS NULL
       AND s.computed_at <= p_now AND (s.valid_until IS NULL OR s.valid_until > p_now)
       AND s.task_id NOT IN (SELECT u.task_id FROM touched u)
    UNION ALL
    SELECT t.name, t.paused, t.severity, t.next_fire_at, t.task_id, t.owner, t.tick_error, t.tick_error_at,
           t.tick_retry_at, t.reconcile, t.max_silence, t.fire_gap, t.timeout, t.created_at,
           s.last_success, s.last_state, s.skips, s.failures, s.retries, s.catch_up_limited, s.not_ready,
           s.p50, s.p95, s.wait95
      FROM shown x JOIN tide.task t ON t.task_id = x.task_id JOIN tide.task_stat s ON s.task_id = x.task_id
     WHERE p_task_ids IS NOT NULL
       AND s.computed_at <= p_now AND (s.valid_until IS NULL OR s.valid_until > p_now)
       AND s.task_id NOT IN (SELECT u.task_id FROM touched u)
    UNION ALL
    SELECT t.name, t.paused, t.severity, t.next_fire_at, t.task_id, t.owner, t.tick_error, t.tick_error_at,
           t.tick_retry_at, t.reconcile, t.max_silence, t.fire_gap, t.timeout, t.created_at,
           s.last_success, s.last_state, s.skips, s.failures, s.retries, s.catch_up_limited, s.not_ready,
           s.p50, s.p95, s.wait95
      FROM stale CROSS JOIN LATERAL tide._task_history(p_now, stale.ids) s
      JOIN tide.task t ON t.task_id = s.task_id
     WHERE cardinality(stale.ids) > 0
), h AS (
    SELECT f.*, o.backlog, o.dead, o.need_check, o.held, o.held_since, o.oldest_ready_id,
           p_now - o.ready_since AS oldest_ready, tide._max_silence(f.max_silence, f.fire_gap, f.timeout) AS max_silence_eff,
           p_now - coalesce(f.last_success, f.created_at) AS silence, diff.open, diff.for_a_person
      FROM f
      LEFT JOIN open_runs o ON o.task_id = f.task_id
      LEFT JOIN diffs diff ON diff.task_id = f.task_id
)
SELECT h.name,
       CASE WHEN h.paused THEN 'paused'
            WHEN tide._silence_level(h.silence, h.max_silence_eff) = 2 THEN 'down'
            WHEN h.failures > 0 OR h.dead > 0 OR h.need_check > 0 OR h.tick_error IS NOT NULL THEN 'failing'
            WHEN h.for_a_person > 0 THEN 'unbalanced'
            WHEN tide._silence_level(h.silence, h.max_silence_eff) = 1 THEN 'late'
            WHEN h.last_success IS NULL THEN 'never_ran'
            ELSE 'ok' END,
       h.severity, h.last_success, h.silence, h.max_silence_eff,
       h.last_state, h.failures::integer, coalesce(h.skips, 0)::integer, coalesce(h.retries, 0)::integer,
       coalesce(h.backlog, 0)::integer, h.oldest_ready, coalesce(h.dead, 0)::integer,
       coalesce(h.need_check, 0)::integer, coalesce(h.catch_up_limited, 0)::integer,
       coalesce(h.not_ready, 0)::integer, h.p50, h.p95, h.wait95,
       CASE WHEN h.paused THEN NULL ELSE h.next_fire_at END, h.paused, h.task_id, h.owner,
       h.tick_error, h.tick_error_at, h.tick_retry_at,
       CASE WHEN h.reconcile IS NOT NULL THEN coalesce(h.open, 0)::integer END,
       CASE WHEN h.reconcile IS NOT NULL THEN coalesce(h.for_a_person, 0)::integer END,
       coalesce(h.held, 0)::integer, h.held_since, h.oldest_ready_id
  FROM h;
END
$$;
COMMENT ON FUNCTION tide._health(timestamptz, bigint[], boolean) IS 'Internal: tide.health at an instant, of every task, or of the tasks given and those with unfinished or unresolved runs (the tick evaluates alerts with it), or (p_exact) of the tasks given alone (tide.task_health).';

CREATE VIEW tide.health WITH (security_invoker = true) AS
SELECT task, status, severity, last_success, silence, max_silence, last_state, consecutive_failures,
       consecutive_skips, retries_24h, backlog, oldest_ready, dead, need_check, p50_duration, p95_duration,
       p95_queue_wait, next_fire_at, owner, open_differences, differences_for_a_person
  FROM tide._health(now())
UNION ALL
-- pg_tide itself, as one more row (see tide.self_health).
SELECT 'pg_tide', x.status, 'critical', x.last_tick, x.since_last_tick, x.stalled_after, NULL, 
       CASE WHEN x.last_tick_error_at > coalesce(x.last_tick, '-infinity') THEN 1 ELSE 0 END, 0, 0,
       x.ready_runs, x.oldest_ready, x.deliveries_dead_24h, 0, NULL, NULL, NULL, NULL, x.owner, NULL, NULL
  FROM tide._self(now()) x;
COMMENT ON VIEW tide.health IS
    'One row per task, and one named pg_tide for pg_tide itself (in the database it serves, for superusers and tide_admin: its last tick, tick errors, ready runs and dead alert deliveries; see tide.self_health): status (ok, late, failing, unbalanced, down, paused, never_ran), last success, silence so far against max_silence, last run state, failures and skips in a row, retries in 24 h, backlog (ready + waiting), age of the oldest ready run, dead and need_check runs, p50/p95 duration and p95 queue wait over 24 h, next fire, owner. A role sees its own tasks (a superuser every role''s).';
GRANT SELECT ON tide.health TO PUBLIC;

CREATE VIEW tide.dashboard WITH (security_invoker = true) AS
SELECT left(s.task, 16) AS task, s.status, left(s.severity::text, 4) AS sev, tide._short(s.silence) AS quiet,
       tide._short(s.max_silence) AS max, s.consecutive_failures AS fail, s.backlog AS todo,
       tide._short(s.oldest_ready) AS wait, tide._short(s.next_fire_at - now()) AS next
  FROM (SELECT tide._status_rank(h.status) AS rank, h.severity, h.silence, h.task, h.status, h.max_silence,
               h.consecutive_failures, h.backlog, h.oldest_ready, h.next_fire_at
          FROM tide.health h
         ORDER BY 1, 2 DESC, 3 DESC NULLS LAST, 4) s
 ORDER BY s.rank, s.severity DESC, s.silence DESC NULLS LAST, s.task;
COMMENT ON VIEW tide.dashboard IS
    'tide.health in 80 columns, worst first: status, severity, silence (quiet) against max_silence, failed attempts in a row, backlog (todo), the oldest ready run''s wait (wait), time to the next fire.';
GRANT SELECT ON tide.dashboard TO PUBLIC;

CREATE FUNCTION tide.task_health(task text, owner name DEFAULT NULL)
RETURNS SETOF tide.health
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id bigint := tide._task_of(task_health.task, task_health.owner, 'tide.task_health');
BEGIN
    RETURN QUERY
    SELECT h.task, h.status, h.severity, h.last_success, h.silence, h.max_silence, h.last_state,
           h.consecutive_failures, h.consecutive_skips, h.retries_24h, h.backlog, h.oldest_ready, h.dead,
           h.need_check, h.p50_duration, h.p95_duration, h.p95_queue_wait, h.next_fire_at, h.owner,
           h.open_differences, h.differences_for_a_person
      FROM tide._health(now(), ARRAY[id], true) h
     WHERE h.task_id = id;
END
$$;
COMMENT ON FUNCTION tide.task_health(text, name) IS
    'task_health(task, owner => NULL): tide.health''s row of one task, read for that task alone (its kept figures and its unfinished runs) rather than computed for every task the caller sees. owner names another role''s task of that name (a team''s, or any role''s for tide_admin).';

-- Internal functions that change anything are pg_tide's own (as sql/comments.sql leaves them).
REVOKE EXECUTE ON FUNCTION tide._fold(timestamptz, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._prune(timestamptz, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._reassign_owned(name, name) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._fail(bigint, text, tide.error_kind, text, tide.attempt_outcome, timestamptz) FROM PUBLIC;

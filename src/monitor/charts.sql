-- ---------------------------------------------------------------------------------------------
-- Hourly counters: what the console's charts (and anyone in psql) read about how tasks behaved
-- over the last day and week, without reading history. Every path that counts for
-- tide.metrics() also counts the hour an attempt ended in (tide._counts_of, metric 'hour'); the
-- fold (every tick, tide._fold) adds those to one row per task and hour, and to one row per
-- owner and hour (the overview's figures for all of a role's tasks, read in as many rows as the
-- chart has hours, however many tasks the role has). Kept eight days (tide._prune).
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

-- Two histograms of durations added (bucket by bucket).
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

-- The duration at quantile q of a histogram: the bound of the bucket it falls in (at most 19%
-- above the true value); NULL for an empty histogram.
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

-- The task a name and an optional owner mean to the caller (row-level security shows it the
-- tasks it may see): with an owner, that role's task of that name; without, as every function
-- that takes a task's name (its own, else a team's, else, for tide_admin, anyone's).
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

-- One task's health, read for that task alone (tide.health computes every task the caller sees):
-- a row of tide.health.
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

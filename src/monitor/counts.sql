-- ---------------------------------------------------------------------------------------------
-- Prometheus metrics.
-- The counters, kept up to date as runs change rather than counted from history (which pruning
-- shortens and which grows without bound): every statement that adds history rows appends what
-- they count to tide.count_delta (the functions that write them, below), and the fold (every
-- tick) moves those into tide.run_count. tide.metrics() reads both.
CREATE TABLE tide.run_count (
    task_id bigint NOT NULL,
    metric  text NOT NULL,
    label   text NOT NULL DEFAULT '',
    value   double precision NOT NULL DEFAULT 0,
    owner   name NOT NULL,
    PRIMARY KEY (task_id, metric, label)
);
COMMENT ON TABLE tide.run_count IS
    'The counters of tide.metrics() per task (runs by outcome, duration and queue-wait sums and counts), as of the last fold; they never go down, pruning included. Maintained by pg_tide.';
CREATE TABLE tide.count_delta (
    task_id bigint NOT NULL,
    metric  text NOT NULL,
    label   text NOT NULL DEFAULT '',
    value   double precision NOT NULL,
    owner   name NOT NULL
);
COMMENT ON TABLE tide.count_delta IS
    'Counts added since the last fold (appended by the functions that write history rows, moved into tide.run_count each tick). Maintained by pg_tide.';

-- The upper bounds (in seconds) of the histogram buckets of run durations and queue waits, as
-- their `le` labels: the smallest bound a value is at most, NULL above the largest (those count
-- only in the +Inf bucket, which is the count). src/monitor/prometheus.rs has the same list (BUCKETS).
-- Inlined into tide._counts_of (no SET clause; names qualified, scripts/pgspot.sh lists it).
CREATE FUNCTION tide._le(seconds double precision)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN seconds OPERATOR(pg_catalog.<=) 0.01 THEN '0.01'
                WHEN seconds OPERATOR(pg_catalog.<=) 0.05 THEN '0.05'
                WHEN seconds OPERATOR(pg_catalog.<=) 0.1 THEN '0.1'
                WHEN seconds OPERATOR(pg_catalog.<=) 0.5 THEN '0.5'
                WHEN seconds OPERATOR(pg_catalog.<=) 1 THEN '1'
                WHEN seconds OPERATOR(pg_catalog.<=) 5 THEN '5'
                WHEN seconds OPERATOR(pg_catalog.<=) 10 THEN '10'
                WHEN seconds OPERATOR(pg_catalog.<=) 30 THEN '30'
                WHEN seconds OPERATOR(pg_catalog.<=) 60 THEN '60'
                WHEN seconds OPERATOR(pg_catalog.<=) 300 THEN '300'
                WHEN seconds OPERATOR(pg_catalog.<=) 900 THEN '900'
                WHEN seconds OPERATOR(pg_catalog.<=) 3600 THEN '3600'
                WHEN seconds OPERATOR(pg_catalog.<=) 21600 THEN '21600'
           END
$$;
COMMENT ON FUNCTION tide._le(double precision) IS
    'Internal: the histogram bucket (its upper bound, the le label) of a duration or wait in seconds; NULL above 21600 (+Inf only).';

-- A duration as the index of its bucket in the hourly counters: bucket k holds durations of at
-- most 2^(k/4) milliseconds (each bucket 19% wider than the one before; 0: 1 ms or less, 120:
-- 12 days or more). tide._bucket_bound gives a bucket's bound back. Inlined into
-- tide._counts_of (no SET clause; names qualified, scripts/pgspot.sh lists it).
CREATE FUNCTION tide._duration_bucket(d interval) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN extract(epoch FROM d) OPERATOR(pg_catalog.<=) 0.001 THEN 0
                ELSE LEAST(120::numeric, pg_catalog.ceil(4 OPERATOR(pg_catalog.*)
                         pg_catalog.log(2.0, (extract(epoch FROM d) OPERATOR(pg_catalog.*) 1000)::numeric)))::integer END
$$;
COMMENT ON FUNCTION tide._duration_bucket(interval) IS
    'Internal: the bucket of a duration in the hourly counters (durations of at most 2^(k/4) ms in bucket k).';

-- What one history row adds to the counters of tide.metrics(), from the run it ends in: an
-- outcome reached (a replayed run counts again), with the duration of a success (its last
-- attempt) and its histogram bucket; a run's first start, with its wait from fire (or creation)
-- and its bucket. Buckets are counted once each (not cumulative): tide.metrics() adds them up.
-- The one definition every writer of history rows counts them with (below). Inlined into
-- its callers, so it has no SET clause, which would forbid inlining: its body names everything
-- with its schema instead, so it is safe under any search_path (scripts/pgspot.sh lists it).
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

-- There is no trigger on tide.run_event: history rows are written by one function,
-- tide._write_history (src/runs/record.sql), which writes what they count with them, in the same
-- statement. A statement trigger's transition table copied every history row, even those the
-- hot paths counted themselves (measured by hand: 17% of one tide.emit per transaction from one
-- client with asynchronous commit; bulk enqueue within the noise). A restore's COPY into tide.run_event counts nothing again: the
-- counters are restored with it (tide.run_count and tide.count_delta are dumped).

-- tide.metrics() reads tide.run_count and tide.count_delta with task health and writes the
-- Prometheus text in Rust (src/monitor/metrics.rs, src/monitor/prometheus.rs).

-- Row-level security and grants, as for the other tables: every role reads its own rows and
-- changes them only through the functions above.
ALTER TABLE tide.run_count ENABLE ROW LEVEL SECURITY;
CREATE POLICY run_count_owner ON tide.run_count FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.run_count TO PUBLIC;
ALTER TABLE tide.count_delta ENABLE ROW LEVEL SECURITY;
CREATE POLICY count_delta_owner ON tide.count_delta FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.count_delta TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.run_count', '');
SELECT pg_catalog.pg_extension_config_dump('tide.count_delta', '');

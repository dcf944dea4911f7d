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

-- What one history row counts is tide._counts_of(to, attempts, claimed, finished, started, fire,
-- created), a C function (src/monitor/counting.rs): runs by outcome, a success's duration and
-- its histogram bucket (the bounds of tide._le and tide.metrics()), a first start's wait and its bucket, and the hour an attempt
-- ended (with a success's duration bucket, for the hourly counters). The writers of history
-- rows (src/runs/record.sql) call it once a run.

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

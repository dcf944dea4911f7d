-- pg_tide 0.2.0 to 0.2.1: run durations and queue waits as Prometheus histograms (tide.metrics()),
-- and the view tide.metric (the samples as rows, for sql_exporter, pgwatch and Grafana).
-- Run by ALTER EXTENSION pg_tide UPDATE; the upgrade tier (pg_test/tests/upgrade.rs) checks that
-- the schema it leaves is the one a fresh CREATE EXTENSION makes.
\echo Use "ALTER EXTENSION pg_tide UPDATE TO '0.2.1'" to load this file. \quit
SET LOCAL search_path = pg_catalog, pg_temp;

-- The upper bounds (in seconds) of the histogram buckets of run durations and queue waits, as
-- their `le` labels: the smallest bound a value is at most, NULL above the largest (those count
-- only in the +Inf bucket, which is the count). src/prometheus.rs has the same list (BUCKETS).
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

-- Successes and first starts count in their buckets from now on; those counted before the
-- update are in the +Inf bucket only (it is the count). Dropped and created again rather than
-- replaced (pgspot's PS002: CREATE OR REPLACE could take over a function made by someone else);
-- nothing depends on it but the plans of its callers, which the drop invalidates.
DROP FUNCTION tide._counts_of(tide.run_state, integer, timestamptz, timestamptz, timestamptz, timestamptz, timestamptz);
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
           p_to OPERATOR(pg_catalog.=) 'running'::tide.run_state AND p_attempts OPERATOR(pg_catalog.=) 1))
          AS m(metric, label, value, counts)
     WHERE m.counts AND m.label IS NOT NULL
$$;
COMMENT ON FUNCTION tide._counts_of(tide.run_state, integer, timestamptz, timestamptz, timestamptz, timestamptz, timestamptz) IS
    'Internal: what a history row that brings a run to a state adds to the counters of tide.metrics() (metric, label, value).';

CREATE  FUNCTION tide."_metric_samples"() RETURNS TABLE (
	"family" TEXT,  /* String */
	"kind" TEXT,  /* String */
	"metric" TEXT,  /* String */
	"owner" TEXT,  /* Option < String > */
	"task" TEXT,  /* Option < String > */
	"labels" jsonb,  /* pgrx :: JsonB */
	"value" double precision  /* f64 */
)
STRICT STABLE  
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'metric_samples_wrapper';
COMMENT ON FUNCTION tide._metric_samples() IS
    'Internal: the samples of tide.metrics() read back as rows (what the view tide.metric shows): family, kind, metric, owner, task, the other labels, value.';

CREATE VIEW tide.metric WITH (security_invoker = true) AS
SELECT s.family, s.kind, s.metric, s.owner, s.task, s.labels, s.value
  FROM tide._metric_samples() s;
COMMENT ON VIEW tide.metric IS
    'The samples of tide.metrics() as rows: family (the metric family), kind (counter, gauge, histogram), metric (the sample''s name: the family, or with _bucket, _sum, _count), owner and task (the task''s labels, NULL for alerts), labels (the others: outcome, status, state, le, kind, severity, check, side, for), value (NaN when unknown). The caller''s own, like tide.metrics().';
GRANT SELECT ON tide.metric TO PUBLIC;

COMMENT ON FUNCTION tide.metrics() IS
    'metrics(): Prometheus text exposition of the caller''s tasks and checks (a superuser''s: every role''s), labelled by owner and name: runs by task and outcome (counters), duration and queue wait (histograms, with 24-hour percentiles as gauges), backlog, silence, failures, unresolved runs, task and check status, open alerts (gauges).';

COMMENT ON TYPE tide.alert_kind IS 'What an alert is about; see docs/operations.md, Alerts.';

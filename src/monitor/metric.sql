-- tide.metric: the samples of tide.metrics() as rows, for tools that read SQL rather than
-- Prometheus text: sql_exporter and pgwatch (a query per metric, labels as columns) and
-- Grafana's PostgreSQL data source (a table or a time series per panel). The rows are the
-- exposition read back (src/monitor/metrics.rs), so the two never say different things; like
-- tide.metrics() it shows a role its own tasks, checks and alerts (a superuser every role's).
SET LOCAL search_path = pg_catalog, pg_temp;
CREATE VIEW tide.metric WITH (security_invoker = true) AS
SELECT s.family, s.kind, s.metric, s.owner, s.task, s.labels, s.value
  FROM tide._metric_samples() s;
COMMENT ON VIEW tide.metric IS
    'The samples of tide.metrics() as rows: family (the metric family), kind (counter, gauge, histogram), metric (the sample''s name: the family, or with _bucket, _sum, _count), owner and task (the task''s labels, NULL for alerts), labels (the others: outcome, status, state, le, kind, severity, check, side, for), value (NaN when unknown). The caller''s own, like tide.metrics().';
GRANT SELECT ON tide.metric TO PUBLIC;

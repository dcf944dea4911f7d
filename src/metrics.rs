//! `tide.metrics()`: reads the figures of the caller's tasks, checks and alerts (row-level
//! security shows a role its own, a superuser every role's) and writes them as Prometheus text
//! (src/prometheus.rs). Four queries, each one pass: task health with the counters, the run
//! counts by outcome, the checks, the open alerts.

use pgrx::prelude::*;
use pgrx::spi::SpiHeapTupleData;

use crate::prometheus::{render, AlertCount, CheckStatus, Figures, RunCount, TaskFigures};
use crate::sqlerr::OrRaise;

const F: &str = "tide.metrics";

/// Each task's health, its duration and wait counters (folded, and added since the last fold)
/// and, for a reconciliation, its latest comparison's row counts. Durations in seconds
/// (`date_part` gives float8 directly, where `extract` computes a numeric first).
const TASKS: &str = "
WITH sums AS (
    SELECT c.task_id,
           sum(c.value) FILTER (WHERE c.metric = 'duration_sum') AS duration_sum,
           sum(c.value) FILTER (WHERE c.metric = 'duration_count') AS duration_count,
           sum(c.value) FILTER (WHERE c.metric = 'wait_sum') AS wait_sum,
           sum(c.value) FILTER (WHERE c.metric = 'wait_count') AS wait_count
      FROM (SELECT p.task_id, p.metric, p.value FROM tide.run_count p WHERE p.metric <> 'runs'
            UNION ALL
            SELECT d.task_id, d.metric, d.value FROM tide.count_delta d WHERE d.metric <> 'runs') c
     GROUP BY c.task_id
)
SELECT h.owner::text, h.task, h.status, h.backlog, h.consecutive_failures, h.dead, h.need_check,
       date_part('epoch', h.silence), date_part('epoch', h.max_silence),
       date_part('epoch', h.p50_duration), date_part('epoch', h.p95_duration),
       coalesce(s.duration_sum, 0), coalesce(s.duration_count, 0),
       date_part('epoch', h.p95_queue_wait), coalesce(s.wait_sum, 0), coalesce(s.wait_count, 0),
       h.open_differences, h.differences_for_a_person,
       (SELECT ARRAY[x.left_count, x.right_count] FROM tide.recon_result x
         WHERE h.open_differences IS NOT NULL AND x.task_id = h.task_id
         ORDER BY x.result_id DESC LIMIT 1)
  FROM tide._health(now()) h
  LEFT JOIN sums s ON s.task_id = h.task_id";

/// Runs by task and outcome (the counters folded, and added since the last fold).
const RUNS: &str = "
SELECT t.owner::text, t.name, c.label, c.value
  FROM (SELECT x.task_id, x.label, sum(x.value) AS value
          FROM (SELECT p.task_id, p.label, p.value FROM tide.run_count p WHERE p.metric = 'runs'
                UNION ALL
                SELECT d.task_id, d.label, d.value FROM tide.count_delta d WHERE d.metric = 'runs') x
         GROUP BY x.task_id, x.label) c
  JOIN tide.task t ON t.task_id = c.task_id";

const CHECKS: &str = "SELECT s.owner::text, s.name, s.status FROM tide._checks(now()) s";

/// Every kind and severity, with the open alerts of each (0 included).
const ALERTS: &str = "
SELECT k.kind::text, v.severity::text,
       (SELECT count(*) FROM tide.alert a WHERE a.resolved_at IS NULL AND a.kind = k.kind AND a.severity = v.severity)
  FROM unnest(enum_range(NULL::tide.alert_kind)) WITH ORDINALITY k(kind, i)
 CROSS JOIN unnest(enum_range(NULL::tide.severity)) WITH ORDINALITY v(severity, j)
 ORDER BY k.i, v.j";

fn text(row: &SpiHeapTupleData, n: usize) -> String {
    row.get::<String>(n).or_raise(F).unwrap_or_default()
}

fn float(row: &SpiHeapTupleData, n: usize) -> Option<f64> {
    row.get::<f64>(n).or_raise(F)
}

fn int(row: &SpiHeapTupleData, n: usize) -> Option<i64> {
    row.get::<i32>(n).or_raise(F).map(i64::from)
}

fn bigint(row: &SpiHeapTupleData, n: usize) -> Option<i64> {
    row.get::<i64>(n).or_raise(F)
}

fn task_figures(row: &SpiHeapTupleData) -> TaskFigures {
    let open = int(row, 17);
    TaskFigures {
        owner: text(row, 1),
        task: text(row, 2),
        status: text(row, 3),
        backlog: int(row, 4).unwrap_or(0),
        consecutive_failures: int(row, 5),
        dead: int(row, 6).unwrap_or(0),
        need_check: int(row, 7).unwrap_or(0),
        silence: float(row, 8),
        max_silence: float(row, 9),
        p50_duration: float(row, 10),
        p95_duration: float(row, 11),
        duration_sum: float(row, 12).unwrap_or(0.0),
        duration_count: float(row, 13).unwrap_or(0.0),
        p95_queue_wait: float(row, 14),
        wait_sum: float(row, 15).unwrap_or(0.0),
        wait_count: float(row, 16).unwrap_or(0.0),
        open_differences: open.map(|all| (all, int(row, 18).unwrap_or(0))),
        recon_rows: row
            .get::<Vec<i64>>(19)
            .or_raise(F)
            .and_then(|v| Some((*v.first()?, *v.get(1)?))),
    }
}

/// Every row of a query, each made into a `T`.
fn rows<T>(
    client: &pgrx::spi::SpiClient<'_>,
    query: &str,
    make: impl Fn(&SpiHeapTupleData) -> T,
) -> Vec<T> {
    client
        .select(query, None, &[])
        .or_raise(F)
        .map(|row| make(&row))
        .collect()
}

/// The caller's tasks, checks and open alerts as Prometheus text (see sql/comments.sql).
#[pg_extern(stable, schema = "tide", name = "metrics")]
#[search_path(pg_catalog, pg_temp)]
fn metrics() -> String {
    let figures = Spi::connect(|client| Figures {
        tasks: rows(client, TASKS, task_figures),
        runs: rows(client, RUNS, |row| RunCount {
            owner: text(row, 1),
            task: text(row, 2),
            outcome: text(row, 3),
            value: float(row, 4).unwrap_or(0.0),
        }),
        checks: rows(client, CHECKS, |row| CheckStatus {
            owner: text(row, 1),
            check: text(row, 2),
            status: text(row, 3),
        }),
        alerts: rows(client, ALERTS, |row| AlertCount {
            kind: text(row, 1),
            severity: text(row, 2),
            open: bigint(row, 3).unwrap_or(0),
        }),
    });
    render(&figures)
}

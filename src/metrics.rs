//! `tide.metrics()`: reads the figures of the caller's tasks, checks and alerts (row-level
//! security shows a role its own, a superuser every role's) and writes them as Prometheus text
//! (src/prometheus.rs). Four queries, each one pass: task health, the counters (joined to the
//! tasks here), the checks, the open alerts.

use std::collections::HashMap;

use pgrx::prelude::*;
use pgrx::spi::SpiHeapTupleData;

use crate::prometheus::{
    bucket_of, render, samples, AlertCount, CheckStatus, Figures, RunCount, TaskFigures,
};
use crate::sqlerr::OrRaise;

const F: &str = "tide.metrics";

/// Each task's health and, for a reconciliation, its latest comparison's row counts. Durations
/// in seconds (`date_part` gives float8 directly, where `extract` computes a numeric first).
const TASKS: &str = "
SELECT h.task_id, h.owner::text, h.task, h.status, h.backlog, h.consecutive_failures, h.dead,
       h.need_check, date_part('epoch', h.silence), date_part('epoch', h.max_silence),
       date_part('epoch', h.p50_duration), date_part('epoch', h.p95_duration),
       date_part('epoch', h.p95_queue_wait), h.open_differences, h.differences_for_a_person,
       (SELECT ARRAY[x.left_count, x.right_count] FROM tide.recon_result x
         WHERE h.open_differences IS NOT NULL AND x.task_id = h.task_id
         ORDER BY x.result_id DESC LIMIT 1)
  FROM tide._health(now()) h";

/// The counters of every task: those folded and what was added since the last fold, read once
/// for the runs by outcome and for the duration and wait sums and counts.
const COUNTERS: &str = "
SELECT c.task_id, c.metric, c.label, sum(c.value)
  FROM (SELECT p.task_id, p.metric, p.label, p.value FROM tide.run_count p
        UNION ALL
        SELECT d.task_id, d.metric, d.label, d.value FROM tide.count_delta d) c
 GROUP BY c.task_id, c.metric, c.label";

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

/// A task's id and its figures from health (its counters are added from `COUNTERS`).
fn task_figures(row: &SpiHeapTupleData) -> (i64, TaskFigures) {
    let id = bigint(row, 1).unwrap_or_default();
    let figures = TaskFigures {
        owner: text(row, 2),
        task: text(row, 3),
        status: text(row, 4),
        backlog: int(row, 5).unwrap_or(0),
        consecutive_failures: int(row, 6),
        dead: int(row, 7).unwrap_or(0),
        need_check: int(row, 8).unwrap_or(0),
        silence: float(row, 9),
        max_silence: float(row, 10),
        p50_duration: float(row, 11),
        p95_duration: float(row, 12),
        p95_queue_wait: float(row, 13),
        open_differences: int(row, 14).map(|all| (all, int(row, 15).unwrap_or(0))),
        recon_rows: row
            .get::<Vec<i64>>(16)
            .or_raise(F)
            .and_then(|v| Some((*v.first()?, *v.get(1)?))),
        ..TaskFigures::default()
    };
    (id, figures)
}

/// Adds the counters to the tasks they belong to: the runs by outcome, and the duration and
/// wait sums and counts. Counters of a task not among them (deleted since, not yet pruned) are
/// left out, as health leaves the task out.
fn add_counters(
    tasks: &mut [TaskFigures],
    ids: &[i64],
    counters: Vec<(i64, String, String, f64)>,
) -> Vec<RunCount> {
    let index: HashMap<i64, usize> = ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let mut runs = Vec::new();
    for (task_id, metric, outcome, value) in counters {
        let Some(t) = index.get(&task_id).map(|&i| &mut tasks[i]) else {
            continue;
        };
        match metric.as_str() {
            "runs" => runs.push(RunCount {
                owner: t.owner.clone(),
                task: t.task.clone(),
                outcome,
                value,
            }),
            "duration_sum" => t.duration_sum += value,
            "duration_count" => t.duration_count += value,
            "wait_sum" => t.wait_sum += value,
            "wait_count" => t.wait_count += value,
            "duration_bucket" => {
                if let Some(i) = bucket_of(&outcome) {
                    t.duration_buckets[i] += value;
                }
            }
            "wait_bucket" => {
                if let Some(i) = bucket_of(&outcome) {
                    t.wait_buckets[i] += value;
                }
            }
            _ => {}
        }
    }
    runs
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
    let figures = Spi::connect(|client| {
        let (ids, mut tasks): (Vec<i64>, Vec<TaskFigures>) =
            rows(client, TASKS, task_figures).into_iter().unzip();
        let counters = rows(client, COUNTERS, |row| {
            (
                bigint(row, 1).unwrap_or_default(),
                text(row, 2),
                text(row, 3),
                float(row, 4).unwrap_or(0.0),
            )
        });
        let runs = add_counters(&mut tasks, &ids, counters);
        Figures {
            tasks,
            runs,
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
        }
    });
    render(&figures)
}

/// The samples of `tide.metrics()` as rows, for the view `tide.metric` (see sql/comments.sql):
/// the exposition read back (src/prometheus.rs `samples`), so the two never differ. A task's
/// `owner` and `task` labels are columns; its other labels are in `labels`.
#[pg_extern(stable, schema = "tide", name = "_metric_samples")]
#[search_path(pg_catalog, pg_temp)]
#[allow(clippy::type_complexity)]
fn metric_samples() -> TableIterator<
    'static,
    (
        name!(family, String),
        name!(kind, String),
        name!(metric, String),
        name!(owner, Option<String>),
        name!(task, Option<String>),
        name!(labels, pgrx::JsonB),
        name!(value, f64),
    ),
> {
    let rows = samples(&metrics()).into_iter().map(|s| {
        let (mut owner, mut task) = (None, None);
        let mut labels = serde_json::Map::new();
        for (k, v) in s.labels {
            match k.as_str() {
                "owner" if owner.is_none() => owner = Some(v),
                "task" if task.is_none() => task = Some(v),
                _ => {
                    labels.insert(k, serde_json::Value::String(v));
                }
            }
        }
        (
            s.family,
            s.kind,
            s.name,
            owner,
            task,
            pgrx::JsonB(serde_json::Value::Object(labels)),
            s.value,
        )
    });
    TableIterator::new(rows.collect::<Vec<_>>())
}

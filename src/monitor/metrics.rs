//! `tide.metrics()`: reads the figures of the caller's tasks, checks and alerts (row-level
//! security shows a role its own, a superuser every role's) and writes them as Prometheus text
//! (src/monitor/prometheus.rs). Four queries, each one pass: task health, the counters (joined to the
//! tasks here), the checks, the open alerts.

use std::collections::HashMap;

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::SpiHeapTupleData;

use crate::base::sqlerr::OrRaise;
use crate::monitor::prometheus::{
    bucket_of, render, samples, AlertCount, CheckStatus, DeliveryCount, Figures, QueueFigures,
    RunCount, SelfFigures, TaskFigures,
};

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
         ORDER BY x.result_id DESC LIMIT 1),
       date_part('epoch', h.last_success), date_part('epoch', h.oldest_ready)
  FROM tide._health(now()) h";

/// Each queue with runs ready or running: how many, and the oldest ready run's wait (by the
/// oldest id, as task health takes it).
const QUEUES: &str = "
SELECT q.owner::text, q.queue, q.ready, q.running,
       date_part('epoch', now() - (SELECT greatest(r.updated_at, r.run_after) FROM tide.run r
                                   WHERE r.run_id = q.oldest_id))
  FROM (SELECT p.owner, p.queue,
               count(*) FILTER (WHERE p.state = 'ready' AND (p.parked OR p.due_at IS NULL OR p.due_at <= now())) AS ready,
               count(*) FILTER (WHERE p.state = 'running') AS running,
               min(p.run_id) FILTER (WHERE p.state = 'ready' AND (p.parked OR p.due_at IS NULL OR p.due_at <= now())) AS oldest_id
          FROM tide.pending p WHERE p.state IN ('ready', 'running')
         GROUP BY p.owner, p.queue) q
 ORDER BY 1, 2";

/// Every channel of pg_tide's with its deliveries by outcome (0 for none yet).
const DELIVERIES: &str = "
SELECT c.owner::text, c.name::text,
       coalesce(sum(d.value) FILTER (WHERE d.outcome = 'sent'), 0)::float8,
       coalesce(sum(d.value) FILTER (WHERE d.outcome = 'failed'), 0)::float8,
       coalesce(sum(d.value) FILTER (WHERE d.outcome = 'dead'), 0)::float8
  FROM tide.alert_channel c
  LEFT JOIN tide.delivery_count d ON d.owner = c.owner AND d.channel = c.name
 GROUP BY 1, 2 ORDER BY 1, 2";

/// pg_tide itself, for those who may see it (no row for others).
const OWN: &str = "
SELECT x.scheduler_alive::integer, x.executors_alive, x.executors_expected, x.delivery_alive::integer,
       x.notifier_alive::integer, date_part('epoch', x.last_tick)
  FROM tide._self(now()) x";

/// The busy command workers (asked only of those who see pg_tide itself).
const COMMAND_WORKERS: &str = "SELECT count(*)::integer FROM tide._command_workers()";

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
        last_success: float(row, 17),
        oldest_ready: float(row, 18),
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

/// Whether the caller reads every owner's figures as a member of `tide_monitor` (and is not a
/// superuser, who reads them anyway).
fn monitor_role() -> bool {
    Spi::get_one::<bool>(
        "SELECT NOT tide._caller_is_superuser()
                AND tide._can_set_role(CURRENT_USER, 'tide_monitor')",
    )
    .or_raise(F)
    .unwrap_or(false)
}

/// The owner of the extension (who reads every row).
fn extension_owner() -> Option<pg_sys::Oid> {
    Spi::get_one::<pg_sys::Oid>(
        "SELECT e.extowner FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_tide'",
    )
    .or_raise(F)
}

/// The caller's tasks, checks and open alerts as Prometheus text (see src/comments.sql). A
/// member of `tide_monitor` reads every owner's, and pg_tide's own figures, and nothing else:
/// the queries below run as the extension's owner for it, and it reads no table itself.
#[pg_extern(stable, schema = "tide", name = "metrics")]
#[search_path(pg_catalog, pg_temp)]
fn metrics() -> String {
    let as_owner = if monitor_role() {
        extension_owner()
    } else {
        None
    };
    let Some(owner) = as_owner else {
        return figures_text();
    };
    let mut saved_user = pg_sys::Oid::INVALID;
    let mut saved_context: std::ffi::c_int = 0;
    // SAFETY: switches to the extension's owner as a security-definer function switches, for
    // the read-only queries of figures_text; restored below, and by an abort on error.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
        pg_sys::SetUserIdAndSecContext(
            owner,
            saved_context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as std::ffi::c_int,
        );
    }
    let text = figures_text();
    // SAFETY: back to the caller.
    unsafe { pg_sys::SetUserIdAndSecContext(saved_user, saved_context) };
    text
}

/// The exposition of what the current user may see.
fn figures_text() -> String {
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
            version: env!("CARGO_PKG_VERSION").to_string(),
            queues: rows(client, QUEUES, |row| QueueFigures {
                owner: text(row, 1),
                queue: text(row, 2),
                ready: bigint(row, 3).unwrap_or(0),
                running: bigint(row, 4).unwrap_or(0),
                oldest_ready: float(row, 5),
            }),
            deliveries: rows(client, DELIVERIES, |row| DeliveryCount {
                owner: text(row, 1),
                channel: text(row, 2),
                values: [
                    float(row, 3).unwrap_or(0.0),
                    float(row, 4).unwrap_or(0.0),
                    float(row, 5).unwrap_or(0.0),
                ],
            }),
            own: rows(client, OWN, |row| SelfFigures {
                workers: [
                    ("scheduler", int(row, 1).unwrap_or(0), 1),
                    (
                        "executor",
                        int(row, 2).unwrap_or(0),
                        int(row, 3).unwrap_or(0),
                    ),
                    ("delivery", int(row, 4).unwrap_or(0), 1),
                    ("notifier", int(row, 5).unwrap_or(0), 1),
                ],
                command_workers: 0,
                last_tick: float(row, 6),
            })
            .into_iter()
            .next()
            .map(|mut own| {
                own.command_workers = rows(client, COMMAND_WORKERS, |row| int(row, 1))
                    .into_iter()
                    .next()
                    .flatten()
                    .unwrap_or(0);
                own
            }),
        }
    });
    render(&figures)
}

/// The samples of `tide.metrics()` as rows, for the view `tide.metric` (see src/comments.sql):
/// the exposition read back (src/monitor/prometheus.rs `samples`), so the two never differ. A task's
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

//! The overview: alerts no channel takes, open alerts, charts of all the role's tasks and of
//! its queues, and every task worst first with the strip of its last windows.

use axum::extract::Query;
use axum::response::Response;
use maud::{html, Markup};
use tokio_postgres::types::ToSql;

use super::{done, o, paged, rows, s, PageQuery, Row, PAGE, TS};
use crate::charts::{self, Hour};
use crate::html::{badge, dur, pager, table, when};
use crate::{Ctx, Fail};

/// The overview's query: the tasks worst first (the order of tide.dashboard), each with its
/// last 30 business windows (event tasks: its last 30 runs), oldest first, and its next fire
/// in its own zone. $1 limit, $2 offset. The benchmark runs this same file from psql.
pub const OVERVIEW_SQL: &str = include_str!("../../sql/overview.sql");

/// An alert's instant in the zone of the task it is about (UTC for other subjects): the
/// columns `local` and `utc` of a query over `tide.alert a`.
pub(crate) fn alert_zone_sql(column: &str) -> String {
    format!(
        "to_char({column} AT TIME ZONE coalesce((SELECT t.tz FROM tide.task t WHERE a.subject_type = 'task'
                   AND t.name = a.subject AND t.owner = a.owner), 'UTC'), '{TS}'),
         to_char({column} AT TIME ZONE 'UTC', '{TS}')"
    )
}

/// The hours of `tide.run_hours` for a chart, labelled in `tz`: of one task (`task`, `owner`),
/// or of every task the role sees.
pub(crate) async fn hours(
    ctx: &Ctx,
    task: Option<(&str, &str)>,
    tz: &str,
    n: i32,
) -> Result<Vec<Hour>, Fail> {
    let (name, owner) = task.unzip();
    let params: [&(dyn ToSql + Sync); 4] = [&name, &owner, &n, &tz];
    let r = rows(
        ctx,
        &format!(
            "SELECT to_char(h.hour AT TIME ZONE $4, 'Dy HH24:00'), to_char(h.hour AT TIME ZONE 'UTC', '{TS}'),
                    h.succeeded::text, h.failed::text, h.dead::text, h.skipped::text, h.need_check::text,
                    h.cancelled::text, extract(epoch FROM h.p50_duration)::text, extract(epoch FROM h.p95_duration)::text
               FROM tide.run_hours(task => $1, owner => $2::text::name, hours => $3) h"
        ),
        &params,
    )
    .await?;
    let num = |r: &Row, i| s(r, i).parse::<i64>().unwrap_or(0);
    let secs = |r: &Row, i| o(r, i).as_deref().and_then(|v| v.parse::<f64>().ok());
    Ok(r.iter()
        .map(|r| Hour {
            label: s(r, 0).to_string(),
            utc: s(r, 1).to_string(),
            succeeded: num(r, 2),
            failed: num(r, 3),
            dead: num(r, 4),
            skipped: num(r, 5),
            need_check: num(r, 6),
            cancelled: num(r, 7),
            p50: secs(r, 8),
            p95: secs(r, 9),
        })
        .collect())
}

/// The charts of a day and a week, side by side on a wide screen.
pub(crate) async fn charts_of(
    ctx: &Ctx,
    task: Option<(&str, &str)>,
    tz: &str,
) -> Result<Markup, Fail> {
    let day = hours(ctx, task, tz, 24).await?;
    let week = hours(ctx, task, tz, 168).await?;
    Ok(html! {
        div.charts {
            (charts::runs("runs-day", "last day", tz, &day))
            (charts::runs("runs-week", "last week", tz, &week))
            (charts::durations("durations-day", "last day", tz, &day))
            (charts::durations("durations-week", "last week", tz, &week))
        }
    })
}

pub async fn overview(ctx: Ctx, Query(q): Query<PageQuery>) -> Result<Response, Fail> {
    let pageno = q.number();
    let offset = pageno * PAGE;
    let limit = PAGE + 1;
    let alerts = rows(
        &ctx,
        &format!(
            "SELECT a.alert_id::text, a.subject, a.kind::text, a.severity::text, {},
                    (a.acked_at IS NOT NULL)::text, a.owner::text
               FROM tide.alert a WHERE a.resolved_at IS NULL
              ORDER BY a.severity DESC, a.opened_at, a.alert_id LIMIT 20",
            alert_zone_sql("a.opened_at")
        ),
        &[],
    )
    .await?;
    // Open alerts that reach no person: no channel or route takes them.
    let untaken = rows(
        &ctx,
        "SELECT count(*)::text, string_agg(DISTINCT severity, ', ') FROM tide.untaken_alerts()",
        &[],
    )
    .await?;
    let queues = rows(
        &ctx,
        "SELECT q.owner::text, q.queue, q.ready::text, q.running::text,
                extract(epoch FROM now() - (SELECT greatest(r.updated_at, r.run_after) FROM tide.run r
                                             WHERE r.run_id = q.oldest_id))::text
           FROM (SELECT p.owner, p.queue,
                        count(*) FILTER (WHERE p.state = 'ready' AND (p.parked OR p.due_at IS NULL OR p.due_at <= now())) AS ready,
                        count(*) FILTER (WHERE p.state = 'running') AS running,
                        min(p.run_id) FILTER (WHERE p.state = 'ready' AND (p.parked OR p.due_at IS NULL OR p.due_at <= now())) AS oldest_id
                   FROM tide.pending p WHERE p.state IN ('ready', 'running')
                  GROUP BY p.owner, p.queue) q
          WHERE q.ready + q.running > 0
          ORDER BY q.ready + q.running DESC, q.queue, q.owner LIMIT 20",
        &[],
    )
    .await?;
    let charts = charts_of(&ctx, None, "UTC").await?;
    let (tasks, more) = paged(rows(&ctx, OVERVIEW_SQL, &[&limit, &offset]).await?);
    let frame = ctx.frame("overview", Some(String::new()));
    let untaken = untaken.first().filter(|u| s(u, 0) != "0");
    let queue_rows: Vec<(String, String, i64, i64, Option<f64>)> = queues
        .iter()
        .map(|q| {
            (
                s(q, 0).to_string(),
                s(q, 1).to_string(),
                s(q, 2).parse().unwrap_or(0),
                s(q, 3).parse().unwrap_or(0),
                o(q, 4).as_deref().and_then(|v| v.parse().ok()),
            )
        })
        .collect();
    let list: Vec<Vec<Markup>> = tasks.iter().map(task_row).collect();
    let body = html! {
        @if let Some(u) = untaken {
            section #untaken-alerts .untaken {
                strong { (s(u, 0)) " open alert" @if s(u, 0) != "1" { "s" } " that no channel takes" }
                " (" (s(u, 1)) "): they reach no one. Create a channel for them: "
                code { r#"SELECT tide.create_channel('ops', 'webhook', '{"url": "…"}')"# }
                " (it takes warning and above), then " code { "SELECT * FROM tide.test_channel('ops')" }
                "; " code { "SELECT * FROM tide.untaken_alerts()" } " lists them."
            }
        }
        @if !alerts.is_empty() {
            section #open-alerts {
                h2 { "Open alerts" }
                ul.alerts {
                    @for a in &alerts {
                        li class=(format!("sev-{}", s(a, 3))) {
                            (badge(s(a, 3))) " " strong { (s(a, 1)) } " " (s(a, 2)) " "
                            span.muted { "since " (when(o(a, 4), o(a, 5))) " · " (s(a, 7)) }
                            @if s(a, 6) == "true" { " " em { "acknowledged" } }
                        }
                    }
                }
                p { a href="/alerts" { "All alerts" } }
            }
        }
        section #overview-charts {
            h2 { "All your tasks" }
            p.muted { "Hours in UTC; each task's own page shows its hours in its zone." }
            (charts)
            (charts::queues(&queue_rows))
        }
        section {
            h1 { "Tasks" }
            (table(&["task", "status", "last 30 windows", "failing", "dead", "backlog", "quiet for", "next fire", "owner"],
                   &list, "No tasks you can see."))
            (pager("/?", pageno, more))
        }
    };
    Ok(done("Overview", &frame, body))
}

/// One task of the overview: 0 task_id, 1 task, 2 owner, 3 status, 4 severity, 5 silence
/// (seconds), 6 failures, 7 backlog, 8 dead, 9 next local, 10 next utc, 11 tz, 12 strip, 13 paused.
fn task_row(t: &Row) -> Vec<Markup> {
    vec![
        html! {
            @if let Some(id) = o(t, 0) { a.task href=(format!("/task/{id}")) { (s(t, 1)) } }
            @else { strong { (s(t, 1)) } }
            @if s(t, 13) == "true" { " " em { "paused" } }
        },
        badge(s(t, 3)),
        strip(s(t, 12)),
        html! { (s(t, 6)) },
        html! { (s(t, 8)) },
        html! { (s(t, 7)) },
        dur(o(t, 5)),
        html! {
            @if o(t, 10).is_some() { (when(o(t, 9), o(t, 10))) " " span.muted { (s(t, 11)) } }
            @else { "–" }
        },
        html! { (s(t, 2)) },
    ]
}

/// The strip of a task's last windows: a JSON array of `[state, label, run_id]`, oldest first.
fn strip(items: &str) -> Markup {
    let items: Vec<(String, String, i64)> = serde_json::from_str(items).unwrap_or_default();
    html! {
        @if items.is_empty() {
            span.muted { "no runs yet" }
        } @else {
            span.strip {
                @for (state, label, run) in &items {
                    a class=(format!("cell s-{state}")) href=(format!("/run/{run}")) title=(format!("{label}: {state}")) {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_strip_links_each_window() {
        let st =
            strip(r#"[["succeeded", "2026-11-01", 7], ["dead", "2026-11-02", 9]]"#).into_string();
        assert!(
            st.contains("class=\"cell s-succeeded\" href=\"/run/7\""),
            "{st}"
        );
        assert!(
            st.contains("class=\"cell s-dead\" href=\"/run/9\" title=\"2026-11-02: dead\""),
            "{st}"
        );
        assert!(strip("[]").into_string().contains("no runs yet"));
    }
}

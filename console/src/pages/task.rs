//! A task's page: its rules, its health (read for this task alone, `tide.task_health`), its
//! charts, upcoming fires, rule versions and runs. It costs what one task costs, however many
//! tasks the role sees.

use std::collections::BTreeSet;

use axum::extract::{Path, Query};
use axum::response::Response;
use maud::{html, Markup};
use serde::Deserialize;

use super::overview::charts_of;
use super::{blank_none, done, o, paged, rows, s, Row, PAGE, TS};
use crate::html::{badge, dur, human, pager, table, when};
use crate::{Ctx, Fail};

/// The runs of one task, for its page.
pub const TASK_RUNS_SQL: &str = include_str!("../../sql/task_runs.sql");

#[derive(Deserialize)]
pub struct RunFilter {
    /// Upcoming fires after this instant (default now).
    from: Option<String>,
    state: Option<String>,
    biz_date: Option<String>,
    trigger: Option<String>,
    page: Option<i64>,
}

const STATES: [&str; 12] = [
    "",
    "waiting",
    "ready",
    "running",
    "retry",
    "held",
    "paused",
    "succeeded",
    "need_check",
    "dead",
    "skipped",
    "cancelled",
];
const TRIGGERS: [&str; 9] = [
    "",
    "scheduled",
    "catch_up",
    "manual",
    "replay",
    "backfill",
    "event",
    "enqueued",
    "reconcile",
];

pub async fn task(
    ctx: Ctx,
    Path(id): Path<String>,
    Query(f): Query<RunFilter>,
) -> Result<Response, Fail> {
    let id = super::id_of("task", &id)?;
    let t = rows(
        &ctx,
        "SELECT t.name, t.owner::text, t.schedule, t.tz, t.biz_window::text, t.command, t.queue,
                t.paused::text, t.version::text, array_to_string(t.topics, ', '), t.tick_error
           FROM tide.task t WHERE t.task_id = $1",
        &[&id],
    )
    .await?;
    let Some(t) = t.first() else {
        return Err(Fail::NotFound(format!(
            "there is no task {id} that your role can see"
        )));
    };
    let (name, owner, tz) = (s(t, 0), s(t, 1), s(t, 3));
    let frame = ctx.frame("overview", Some(id.to_string()));
    let health = rows(
        &ctx,
        "SELECT h.status, h.consecutive_failures::text, h.backlog::text, h.dead::text, h.need_check::text,
                extract(epoch FROM h.silence)::text, extract(epoch FROM h.max_silence)::text,
                extract(epoch FROM h.p50_duration)::text, extract(epoch FROM h.p95_duration)::text,
                extract(epoch FROM h.p95_queue_wait)::text
           FROM tide.task_health($1, owner => $2::text::name) h",
        &[&name, &owner],
    )
    .await?;
    let charts = charts_of(&ctx, Some((name, owner)), tz).await?;
    // Upcoming fires through tide.preview, of this owner's task (a tide_admin sees any role's).
    let fires = if o(t, 2).is_some() {
        Some(
            rows(
                &ctx,
                &format!(
                    "SELECT to_char(p.fire_local, '{TS}'), to_char(p.fire_at AT TIME ZONE 'UTC', '{TS}'),
                            to_char(p.window_start_local, '{TS}'), to_char(p.window_end_local, '{TS}'),
                            extract(epoch FROM p.window_length)::text, p.biz_date::text,
                            (p.window_end_local - p.window_start_local <> p.window_length)::text
                       FROM tide.preview(task => $1, n => 8, after => coalesce($2::text::timestamptz, now()), owner => $3) p"
                ),
                &[&name, &blank_none(&f.from), &owner],
            )
            .await?,
        )
    } else {
        None
    };
    // Rule versions side by side: the latest four, a changed value marked.
    let versions = rows(
        &ctx,
        &format!(
            "SELECT v.version::text, to_char(v.created_at AT TIME ZONE $2, '{TS}'), v.created_by::text, v.rules::text
               FROM tide.task_version v WHERE v.task_id = $1 ORDER BY v.version DESC LIMIT 4"
        ),
        &[&id, &tz],
    )
    .await?;
    // Runs, filtered, newest first (each part from the task's own index range: see the file).
    let state = blank_none(&f.state);
    let biz_date = blank_none(&f.biz_date);
    let trigger = blank_none(&f.trigger);
    let pageno = f.page.unwrap_or(0).max(0);
    let (runs, more) = paged(
        rows(
            &ctx,
            TASK_RUNS_SQL,
            &[
                &id,
                &state,
                &biz_date,
                &trigger,
                &(PAGE + 1),
                &(pageno * PAGE),
            ],
        )
        .await?,
    );
    let query = |k: &str, v: &Option<String>| {
        v.as_ref()
            .map(|v| {
                format!(
                    "{k}={}&",
                    form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>()
                )
            })
            .unwrap_or_default()
    };
    let base = format!(
        "/task/{id}?{}{}{}",
        query("state", &state),
        query("biz_date", &biz_date),
        query("trigger", &trigger)
    );
    let run_rows: Vec<Vec<Markup>> = runs.iter().map(run_row).collect();
    let body = html! {
        h1 { (name) }
        p.muted {
            "owner " (owner) " · rule version " (s(t, 8)) " · "
            @if let Some(sch) = o(t, 2) { code { (sch) } " in " (tz) ", " (s(t, 4)) " windows" }
            @else { "event task on " (s(t, 9)) }
            @if s(t, 7) == "true" { " · " em { "paused" } }
        }
        @if let Some(e) = o(t, 10) { p.err { "The scheduler could not fire it: " (e) } }
        @if let Some(h) = health.first() {
            p.facts #health {
                (badge(s(h, 0))) " · failing " (s(h, 1)) " in a row · backlog " (s(h, 2)) " · dead " (s(h, 3))
                " · need_check " (s(h, 4)) " · quiet for " span #quiet { (dur(o(h, 5))) }
                " (at most " (dur(o(h, 6))) ") · p50 " span #p50 { (dur(o(h, 7))) } " · p95 " (dur(o(h, 8)))
                " · p95 queue wait " (dur(o(h, 9)))
            }
        }
        h2 { "How it has run" }
        p.muted { "Hours in " (tz) ", the task's zone (UTC on hover)." }
        (charts)
        h2 { "Upcoming fires" }
        form.filters method="get" {
            label { "after " input name="from" type="date" value=(blank_none(&f.from).unwrap_or_default()); }
            button { "Show" }
        }
        @match &fires {
            Some(fires) => (table(&["fire (local)", "fire (UTC)", "business date", "window (local)", "length"],
                                  &fires.iter().map(fire_row).collect::<Vec<_>>(), "No upcoming fires.")),
            None => p.muted { "An event task: it runs when its topics are emitted." },
        }
        h2 { "Rules and their versions" }
        (versions_table(&versions))
        h2 #runs { "Runs" }
        form.filters method="get" action=(format!("/task/{id}")) {
            label { "state " select name="state" { (options(&STATES, state.as_deref().unwrap_or(""))) } }
            label { "business date " input name="biz_date" type="date" value=(biz_date.clone().unwrap_or_default()); }
            label { "trigger " select name="trigger" { (options(&TRIGGERS, trigger.as_deref().unwrap_or(""))) } }
            button { "Filter" }
        }
        (table(&["run", "state", "trigger", "date / key", "window start (local)", "attempts", "last error"],
               &run_rows, "No runs match."))
        (pager(&base, pageno, more))
    };
    Ok(done(name, &frame, body))
}

fn fire_row(p: &Row) -> Vec<Markup> {
    vec![
        when(o(p, 0), o(p, 1)),
        html! { (s(p, 1)) " UTC" },
        html! {
            (s(p, 5))
            @if s(p, 6) == "true" { " " span.b.b-dst title="the clocks change in this window" { "DST" } }
        },
        html! { (s(p, 2)) " → " (s(p, 3)) },
        dur(o(p, 4)),
    ]
}

fn run_row(r: &Row) -> Vec<Markup> {
    vec![
        html! { a class=(format!("run s-{}", s(r, 1))) href=(format!("/run/{}", s(r, 0))) { (s(r, 0)) } },
        badge(s(r, 1)),
        html! { (s(r, 2)) },
        html! { (o(r, 3).as_deref().or(o(r, 8).as_deref()).unwrap_or("–")) },
        when(o(r, 4), o(r, 5)),
        html! { (s(r, 6)) },
        html! { (o(r, 7).as_deref().unwrap_or("–")) },
    ]
}

fn options(values: &[&str], current: &str) -> Markup {
    html! {
        @for v in values {
            option value=(v) selected[*v == current] { @if v.is_empty() { "any" } @else { (v) } }
        }
    }
}

/// Rule versions as columns, rules as rows; a value that differs from the older version beside
/// it is marked.
fn versions_table(versions: &[Row]) -> Markup {
    type Rules = serde_json::Map<String, serde_json::Value>;
    let parsed: Vec<(String, Rules, String)> = versions
        .iter()
        .rev()
        .map(|v| {
            let rules = serde_json::from_str::<serde_json::Value>(s(v, 3))
                .ok()
                .and_then(|j| j.as_object().cloned())
                .unwrap_or_default();
            (
                s(v, 0).to_string(),
                rules,
                format!("{} by {}", s(v, 1), s(v, 2)),
            )
        })
        .collect();
    if parsed.is_empty() {
        return html! { p.empty { "No versions." } };
    }
    let keys: BTreeSet<&String> = parsed.iter().flat_map(|(_, r, _)| r.keys()).collect();
    let value = |r: &Rules, k: &str| r.get(k).cloned().unwrap_or(serde_json::Value::Null);
    html! {
        div.scroll {
            table.versions {
                thead { tr { th { "rule" } @for (v, _, by) in &parsed { th title=(by) { "version " (v) } } } }
                tbody {
                    @for k in keys {
                        @let changed: Vec<bool> = (0..parsed.len())
                            .map(|i| i > 0 && value(&parsed[i - 1].1, k) != value(&parsed[i].1, k)).collect();
                        tr class=[changed.contains(&true).then_some("has-change")] {
                            th { (k) }
                            @for (i, (_, r, _)) in parsed.iter().enumerate() {
                                td class=[changed[i].then_some("changed")] {
                                    @match value(r, k) {
                                        serde_json::Value::String(x) => @match interval_secs(&x) {
                                            Some(secs) => span.dur title=(x) { (human(secs)) },
                                            None => (x),
                                        },
                                        serde_json::Value::Null => "–",
                                        other => (other.to_string()),
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// An interval as PostgreSQL writes it (`00:00:10`, `1 day 02:00:00`, `3 days`), in seconds;
/// None for any other text.
fn interval_secs(text: &str) -> Option<f64> {
    let mut secs = 0.0;
    let mut words = text.split_whitespace().peekable();
    let mut any = false;
    while let Some(w) = words.next() {
        if let Some(unit) = words
            .peek()
            .filter(|u| u.starts_with("day") || u.starts_with("mon") || u.starts_with("year"))
        {
            let n: f64 = w.parse().ok()?;
            secs += n * match unit.chars().next() {
                Some('d') => 86400.0,
                Some('m') => 30.0 * 86400.0,
                _ => 365.25 * 86400.0,
            };
            words.next();
        } else {
            let (neg, hms) = w.strip_prefix('-').map_or((false, w), |r| (true, r));
            let parts: Vec<&str> = hms.split(':').collect();
            if parts.len() != 3 {
                return None;
            }
            let v = parts[0].parse::<f64>().ok()? * 3600.0
                + parts[1].parse::<f64>().ok()? * 60.0
                + parts[2].parse::<f64>().ok()?;
            secs += if neg { -v } else { v };
        }
        any = true;
    }
    any.then_some(secs)
}

#[cfg(test)]
mod tests {
    #[test]
    fn intervals_are_read_back() {
        assert_eq!(interval_secs("00:00:10"), Some(10.0));
        assert_eq!(interval_secs("1 day 02:00:00"), Some(93600.0));
        assert_eq!(interval_secs("3 days"), Some(259200.0));
        assert_eq!(interval_secs("00:00:00.5"), Some(0.5));
        assert_eq!(interval_secs("SELECT 1"), None);
        assert_eq!(interval_secs("0 2 * * *"), None);
        assert_eq!(interval_secs("Europe/Paris"), None);
    }

    use super::*;

    fn row(v: &[&str]) -> Row {
        v.iter().map(|x| Some(x.to_string())).collect()
    }

    #[test]
    fn versions_mark_what_changed() {
        let v = vec![
            row(&[
                "2",
                "t",
                "alice",
                r#"{"schedule": "0 2 * * *", "tz": "UTC"}"#,
            ]),
            row(&[
                "1",
                "t",
                "alice",
                r#"{"schedule": "0 1 * * *", "tz": "UTC"}"#,
            ]),
        ];
        let t = versions_table(&v).into_string();
        assert!(
            t.find("version 1").unwrap() < t.find("version 2").unwrap(),
            "oldest first: {t}"
        );
        assert!(t.contains("<tr class=\"has-change\"><th>schedule</th><td>0 1 * * *</td><td class=\"changed\">0 2 * * *</td>"), "{t}");
        assert!(
            t.contains("<tr><th>tz</th><td>UTC</td><td>UTC</td></tr>"),
            "{t}"
        );
    }
}

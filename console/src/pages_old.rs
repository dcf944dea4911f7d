//! The pages and the actions. Each page is one or a few queries of pg_tide's views and tables
//! (row-level security shows the signed-in role its own rows, its teams', or all of them to a
//! tide_admin); each action is one call of a pg_tide function, which checks what the role may
//! do. Every query returns text columns, rendered through `html::esc`.

use std::collections::BTreeSet;
use std::fmt::Write;

use axum::extract::{Path, Query};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;
use tokio_postgres::types::ToSql;

use crate::html::{self, action, badge, esc, opt, table, when};
use crate::{Ctx, Fail};

type Row = Vec<Option<String>>;

/// An id from the path, or a page saying it is not one.
fn id_of(what: &str, raw: &str) -> Result<i64, Fail> {
    raw.parse::<i64>().map_err(|_| {
        let shown: String = raw.chars().take(100).collect();
        Fail::BadRequest(format!("{what} id \"{shown}\" is not a number: the address names a {what} by its id, such as /{what}/42"))
    })
}

/// Runs a query whose columns are all text.
async fn rows(ctx: &Ctx, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Fail> {
    let rs = ctx.db.query(sql, params).await?;
    Ok(rs
        .iter()
        .map(|r| {
            (0..r.len())
                .map(|i| r.get::<_, Option<String>>(i))
                .collect()
        })
        .collect())
}

fn s(r: &Row, i: usize) -> &str {
    r.get(i).and_then(|v| v.as_deref()).unwrap_or("")
}

fn o(r: &Row, i: usize) -> &Option<String> {
    const NONE: &Option<String> = &None;
    r.get(i).unwrap_or(NONE)
}

fn done(title: &str, frame: &html::Frame, body: &str) -> Response {
    Html(html::page(title, Some(frame), body)).into_response()
}

/// Renders an instant as text in a zone, and in UTC: for `when`.
const TS: &str = "YYYY-MM-DD HH24:MI:SS";

/// The overview's query: the tasks worst first (the order of tide.dashboard), each with its
/// last 30 business windows (event tasks: its last 30 runs), oldest first, and its next fire
/// in its own zone. $1 limit, $2 offset. The benchmark runs this same file from psql.
pub const OVERVIEW_SQL: &str = include_str!("../sql/overview.sql");
/// The runs of one task, for its page.
pub const TASK_RUNS_SQL: &str = include_str!("../sql/task_runs.sql");

const PAGE: i64 = 100;

#[derive(Deserialize)]
pub struct PageQuery {
    page: Option<i64>,
}

pub async fn overview(ctx: Ctx, Query(q): Query<PageQuery>) -> Result<Response, Fail> {
    let pageno = q.page.unwrap_or(0).max(0);
    let offset = pageno * PAGE;
    let alerts = rows(
        &ctx,
        &format!(
            "SELECT a.alert_id::text, a.subject, a.kind::text, a.severity::text,
                    to_char(a.opened_at, '{TS}'), (a.acked_at IS NOT NULL)::text, a.owner::text
               FROM tide.alert a WHERE a.resolved_at IS NULL
              ORDER BY a.severity DESC, a.opened_at LIMIT 20"
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
    let tasks = rows(&ctx, OVERVIEW_SQL, &[&PAGE, &offset]).await?;
    let frame = ctx.frame("overview", Some(String::new()));
    let mut b = String::new();
    if let Some(u) = untaken.first().filter(|u| s(u, 0) != "0") {
        let n = s(u, 0);
        let _ = write!(
            b,
            "<section id=\"untaken-alerts\" class=\"untaken\"><strong>{n} open alert{} that no channel takes</strong> ({}): \
             they reach no one. Create a channel for them: \
             <code>SELECT tide.create_channel('ops', 'webhook', url =&gt; '…')</code> (it takes warning and above), \
             then <code>SELECT * FROM tide.test_channel('ops')</code>; <code>SELECT * FROM tide.untaken_alerts()</code> lists them.</section>",
            if n == "1" { "" } else { "s" },
            esc(s(u, 1)),
        );
    }
    if !alerts.is_empty() {
        b.push_str("<section id=\"open-alerts\"><h2>Open alerts</h2><ul class=\"alerts\">");
        for a in &alerts {
            let acked = if s(a, 5) == "true" {
                " <em>acknowledged</em>"
            } else {
                ""
            };
            let _ = write!(
                b,
                "<li class=\"sev-{}\">{} <strong>{}</strong> {} <span class=\"muted\">since {} · {}</span>{acked}</li>",
                esc(s(a, 3)),
                badge(s(a, 3)),
                esc(s(a, 1)),
                esc(s(a, 2)),
                when(&None, o(a, 4)),
                esc(s(a, 6)),
            );
        }
        b.push_str("</ul><p><a href=\"/alerts\">All alerts</a></p></section>");
    }
    b.push_str("<section><h1>Tasks</h1>");
    let mut list = Vec::new();
    for t in &tasks {
        // 0 task_id, 1 task, 2 owner, 3 status, 4 severity, 5 silence, 6 failures, 7 backlog,
        // 8 dead, 9 next local, 10 next utc, 11 tz, 12 strip, 13 paused
        let name = match o(t, 0) {
            Some(id) => format!(
                "<a class=\"task\" href=\"/task/{}\">{}</a>",
                esc(id),
                esc(s(t, 1))
            ),
            None => format!("<strong>{}</strong>", esc(s(t, 1))),
        };
        let paused = if s(t, 13) == "true" {
            " <em>paused</em>"
        } else {
            ""
        };
        let next = if o(t, 10).is_some() {
            format!(
                "{} <span class=\"muted\">{}</span>",
                when(o(t, 9), o(t, 10)),
                esc(s(t, 11))
            )
        } else {
            "–".to_string()
        };
        list.push(vec![
            format!("{name}{paused}"),
            badge(s(t, 3)),
            strip(s(t, 12)),
            esc(s(t, 6)),
            esc(s(t, 8)),
            esc(s(t, 7)),
            opt(o(t, 5)),
            next,
            esc(s(t, 2)),
        ]);
    }
    b.push_str(&table(
        &[
            "task",
            "status",
            "last 30 windows",
            "failing",
            "dead",
            "backlog",
            "quiet for",
            "next fire",
            "owner",
        ],
        &list,
        "No tasks you can see.",
    ));
    b.push_str("<p class=\"pager\">");
    if pageno > 0 {
        let _ = write!(b, "<a href=\"/?page={}\">← previous</a> ", pageno - 1);
    }
    if tasks.len() as i64 == PAGE {
        let _ = write!(b, "<a href=\"/?page={}\">next →</a>", pageno + 1);
    }
    b.push_str("</p></section>");
    Ok(done("Overview", &frame, &b))
}

/// The strip of a task's last windows: a JSON array of `[state, label, run_id]`, oldest first.
fn strip(items: &str) -> String {
    let items: Vec<(String, String, i64)> = serde_json::from_str(items).unwrap_or_default();
    if items.is_empty() {
        return "<span class=\"muted\">no runs yet</span>".into();
    }
    let mut out = String::from("<span class=\"strip\">");
    for (state, label, run) in items {
        let _ = write!(
            out,
            "<a class=\"cell s-{0}\" href=\"/run/{2}\" title=\"{1}: {0}\"></a>",
            esc(&state),
            esc(&label),
            run
        );
    }
    out.push_str("</span>");
    out
}

#[derive(Deserialize)]
pub struct RunFilter {
    /// Upcoming fires after this instant (default now).
    from: Option<String>,
    state: Option<String>,
    biz_date: Option<String>,
    trigger: Option<String>,
}

fn blank_none(v: &Option<String>) -> Option<String> {
    v.as_ref()
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
}

pub async fn task(
    ctx: Ctx,
    Path(id): Path<i64>,
    Query(f): Query<RunFilter>,
) -> Result<Response, Fail> {
    let t = rows(
        &ctx,
        &format!(
            "SELECT t.name, t.owner::text, t.schedule, t.tz, t.biz_window::text, t.command, t.queue,
                    t.paused::text, t.version::text,
                    to_char(t.next_fire_at AT TIME ZONE t.tz, '{TS}'), to_char(t.next_fire_at AT TIME ZONE 'UTC', '{TS}'),
                    array_to_string(t.topics, ', '), t.tick_error
               FROM tide.task t WHERE t.task_id = $1"
        ),
        &[&id],
    )
    .await?;
    let Some(t) = t.first() else {
        return Err(Fail::NotFound(format!(
            "there is no task {id} that your role can see"
        )));
    };
    let name = s(t, 0).to_string();
    let owner = s(t, 1).to_string();
    let frame = ctx.frame("overview", Some(id.to_string()));
    let mut b = format!(
        "<h1>{}</h1><p class=\"muted\">owner {} · rule version {} · {}{}</p>",
        esc(&name),
        esc(&owner),
        esc(s(t, 8)),
        match o(t, 2) {
            Some(sch) => format!(
                "<code>{}</code> in {}, {} windows",
                esc(sch),
                esc(s(t, 3)),
                esc(s(t, 4))
            ),
            None => format!("event task on {}", esc(s(t, 11))),
        },
        if s(t, 7) == "true" {
            " · <em>paused</em>"
        } else {
            ""
        }
    );
    if let Some(e) = o(t, 12) {
        let _ = write!(
            b,
            "<p class=\"err\">The scheduler could not fire it: {}</p>",
            esc(e)
        );
    }
    let h = rows(
        &ctx,
        "SELECT h.status, h.consecutive_failures::text, h.backlog::text, h.dead::text, h.need_check::text,
                date_trunc('second', h.silence)::text, h.max_silence::text,
                date_trunc('milliseconds', h.p50_duration)::text, date_trunc('milliseconds', h.p95_duration)::text
           FROM tide.health h WHERE h.task = $1 AND h.owner = $2::name",
        &[&name, &owner],
    )
    .await?;
    if let Some(h) = h.first() {
        let _ = write!(
            b,
            "<p class=\"facts\">{} · failing {} in a row · backlog {} · dead {} · need_check {} · quiet for {} (at most {}) · p50 {} · p95 {}</p>",
            badge(s(h, 0)),
            esc(s(h, 1)),
            esc(s(h, 2)),
            esc(s(h, 3)),
            esc(s(h, 4)),
            opt(o(h, 5)),
            opt(o(h, 6)),
            opt(o(h, 7)),
            opt(o(h, 8))
        );
    }
    // Upcoming fires through tide.preview (the caller's own task of that name).
    let _ = write!(
        b,
        "<h2>Upcoming fires</h2><form class=\"filters\" method=\"get\"><label>after \
         <input name=\"from\" type=\"date\" value=\"{}\"></label><button>Show</button></form>",
        esc(blank_none(&f.from).as_deref().unwrap_or(""))
    );
    if o(t, 2).is_some() {
        match rows(
            &ctx,
            &format!(
                "SELECT to_char(p.fire_local, '{TS}'), to_char(p.fire_at AT TIME ZONE 'UTC', '{TS}'),
                        to_char(p.window_start_local, '{TS}'), to_char(p.window_end_local, '{TS}'),
                        p.window_length::text, p.biz_date::text,
                        (p.window_end_local - p.window_start_local <> p.window_length)::text
                   FROM tide.preview(task => $1, n => 8, after => coalesce($2::text::timestamptz, now())) p"
            ),
            &[&name, &blank_none(&f.from)],
        )
        .await
        {
            Ok(fires) => {
                let list: Vec<Vec<String>> = fires
                    .iter()
                    .map(|p| {
                        let dst = if s(p, 6) == "true" {
                            " <span class=\"b b-dst\" title=\"the clocks change in this window\">DST</span>"
                        } else {
                            ""
                        };
                        vec![
                            when(o(p, 0), o(p, 1)),
                            format!("{} UTC", esc(s(p, 1))),
                            format!("{}{dst}", esc(s(p, 5))),
                            format!("{} → {}", esc(s(p, 2)), esc(s(p, 3))),
                            esc(s(p, 4)),
                        ]
                    })
                    .collect();
                b.push_str(&table(
                    &["fire (local)", "fire (UTC)", "business date", "window (local)", "length"],
                    &list,
                    "No upcoming fires.",
                ));
            }
            Err(Fail::Db(e)) => {
                let m = e.as_db_error().map(|d| d.message().to_string()).unwrap_or(e.to_string());
                let _ = write!(b, "<p class=\"muted\">Only the task's owner sees its next fires here: {}</p>", esc(&m));
            }
            Err(e) => return Err(e),
        }
    } else {
        b.push_str("<p class=\"muted\">An event task: it runs when its topics are emitted.</p>");
    }
    // Rule versions side by side: the latest four, a changed value marked.
    let versions = rows(
        &ctx,
        "SELECT v.version::text, to_char(v.created_at, 'YYYY-MM-DD HH24:MI:SS'), v.created_by::text, v.rules::text
           FROM tide.task_version v WHERE v.task_id = $1 ORDER BY v.version DESC LIMIT 4",
        &[&id],
    )
    .await?;
    b.push_str("<h2>Rules and their versions</h2>");
    b.push_str(&versions_table(&versions));
    // Runs, filtered, newest first (each part from the task's own index range: see the file).
    let state = blank_none(&f.state);
    let biz_date = blank_none(&f.biz_date);
    let trigger = blank_none(&f.trigger);
    let runs = rows(&ctx, TASK_RUNS_SQL, &[&id, &state, &biz_date, &trigger]).await?;
    let _ = write!(
        b,
        "<h2>Runs</h2><form class=\"filters\" method=\"get\"><label>state <select name=\"state\">{}</select></label>\
         <label>business date <input name=\"biz_date\" type=\"date\" value=\"{}\"></label>\
         <label>trigger <select name=\"trigger\">{}</select></label><button>Filter</button></form>",
        options(
            &["", "waiting", "ready", "running", "retry", "held", "paused", "succeeded", "need_check", "dead", "skipped", "cancelled"],
            state.as_deref().unwrap_or("")
        ),
        esc(biz_date.as_deref().unwrap_or("")),
        options(
            &["", "scheduled", "catch_up", "manual", "replay", "backfill", "event", "enqueued", "reconcile"],
            trigger.as_deref().unwrap_or("")
        )
    );
    let list: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                format!(
                    "<a class=\"run s-{1}\" href=\"/run/{0}\">{0}</a>",
                    esc(s(r, 0)),
                    esc(s(r, 1))
                ),
                badge(s(r, 1)),
                esc(s(r, 2)),
                o(r, 3)
                    .as_ref()
                    .map(|d| esc(d))
                    .or_else(|| o(r, 8).as_ref().map(|k| esc(k)))
                    .unwrap_or_else(|| "–".into()),
                when(o(r, 4), o(r, 5)),
                esc(s(r, 6)),
                opt(o(r, 7)),
            ]
        })
        .collect();
    b.push_str(&table(
        &[
            "run",
            "state",
            "trigger",
            "date / key",
            "window start (local)",
            "attempts",
            "last error",
        ],
        &list,
        "No runs match.",
    ));
    Ok(done(&name, &frame, &b))
}

fn options(values: &[&str], current: &str) -> String {
    let mut out = String::new();
    for v in values {
        let sel = if *v == current { " selected" } else { "" };
        let label = if v.is_empty() { "any" } else { v };
        let _ = write!(
            out,
            "<option value=\"{}\"{sel}>{}</option>",
            esc(v),
            esc(label)
        );
    }
    out
}

/// Rule versions as columns, rules as rows; a value that differs from the older version beside
/// it is marked.
fn versions_table(versions: &[Row]) -> String {
    let parsed: Vec<(String, serde_json::Map<String, serde_json::Value>, String)> = versions
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
        return "<p class=\"empty\">No versions.</p>".into();
    }
    let keys: BTreeSet<&String> = parsed.iter().flat_map(|(_, r, _)| r.keys()).collect();
    let mut out =
        String::from("<div class=\"scroll\"><table class=\"versions\"><thead><tr><th>rule</th>");
    for (v, _, by) in &parsed {
        let _ = write!(out, "<th title=\"{}\">version {}</th>", esc(by), esc(v));
    }
    out.push_str("</tr></thead><tbody>");
    for k in keys {
        let mut cells = String::new();
        let mut any_change = false;
        for (i, (_, r, _)) in parsed.iter().enumerate() {
            let val = r
                .get(k.as_str())
                .cloned()
                .unwrap_or(serde_json::Value::Null);
            let changed = i > 0
                && parsed[i - 1]
                    .1
                    .get(k.as_str())
                    .cloned()
                    .unwrap_or(serde_json::Value::Null)
                    != val;
            any_change |= changed;
            let text = match &val {
                serde_json::Value::String(x) => x.clone(),
                serde_json::Value::Null => "–".into(),
                other => other.to_string(),
            };
            let class = if changed { " class=\"changed\"" } else { "" };
            let _ = write!(cells, "<td{class}>{}</td>", esc(&text));
        }
        let row_class = if any_change {
            " class=\"has-change\""
        } else {
            ""
        };
        let _ = write!(out, "<tr{row_class}><th>{}</th>{cells}</tr>", esc(k));
    }
    out.push_str("</tbody></table></div>");
    out
}

pub async fn run(ctx: Ctx, Path(id): Path<String>) -> Result<Response, Fail> {
    let id = id_of("run", &id)?;
    let r = rows(
        &ctx,
        &format!(
            "SELECT r.run_id::text, t.name, r.task_id::text, r.state::text, r.trigger::text, r.biz_date::text,
                    to_char(r.window_start AT TIME ZONE t.tz, '{TS}'), to_char(r.window_start AT TIME ZONE 'UTC', '{TS}'),
                    to_char(r.window_end AT TIME ZONE t.tz, '{TS}'), to_char(r.window_end AT TIME ZONE 'UTC', '{TS}'),
                    r.attempts::text, r.last_error, r.lock_key, t.tz, r.result::text, r.reason, r.owner::text,
                    r.event_key, r.topic, r.control
               FROM tide.run r JOIN tide.task t ON t.task_id = r.task_id WHERE r.run_id = $1"
        ),
        &[&id],
    )
    .await?;
    let Some(r) = r.first() else {
        return Err(Fail::NotFound(format!(
            "there is no run {id} that your role can see"
        )));
    };
    let state = s(r, 3).to_string();
    let frame = ctx.frame("overview", Some(s(r, 2).to_string()));
    let mut b = format!(
        "<p class=\"muted\"><a href=\"/task/{}\">{}</a></p><h1>Run {} <span id=\"state\">{}</span></h1>\
         <p class=\"facts\">{} · {} · attempts {} · owner {}</p>",
        esc(s(r, 2)),
        esc(s(r, 1)),
        esc(s(r, 0)),
        badge(&state),
        esc(s(r, 4)),
        match (o(r, 5), o(r, 17)) {
            (Some(d), _) => format!(
                "business date {} · window {} → {} ({})",
                esc(d),
                when(o(r, 6), o(r, 7)),
                when(o(r, 8), o(r, 9)),
                esc(s(r, 13))
            ),
            (None, Some(k)) => format!("event {} on {}", esc(k), opt(o(r, 18))),
            _ => "no window".into(),
        },
        esc(s(r, 10)),
        esc(s(r, 16)),
    );
    let _ = write!(b, "<p>{}</p>", esc(s(r, 15)));
    if let Some(e) = o(r, 11) {
        let _ = write!(b, "<p class=\"err\">{}</p>", esc(e));
    }
    // The actions the state allows.
    let mut acts = String::new();
    let path = |verb: &str| format!("/run/{id}/{verb}");
    if ["dead", "need_check", "cancelled", "skipped"].contains(&state.as_str()) {
        acts.push_str(&action(&frame, &path("replay"), "Replay", "", None));
    }
    if state == "need_check" {
        acts.push_str(&action(
            &frame,
            &path("accept"),
            "Resolve: accept the short count",
            "",
            None,
        ));
    }
    if ["waiting", "ready", "retry", "held"].contains(&state.as_str())
        || (state == "running" && o(r, 19).is_none())
    {
        acts.push_str(&action(&frame, &path("pause"), "Pause", "", None));
    }
    if state == "paused" {
        acts.push_str(&action(&frame, &path("resume"), "Resume", "", None));
    }
    if ["waiting", "ready", "running", "retry", "held", "paused"].contains(&state.as_str()) {
        acts.push_str(&action(
            &frame,
            &path("cancel"),
            "Cancel",
            "",
            Some("Cancel this run?"),
        ));
    }
    if !acts.is_empty() {
        let _ = write!(b, "<div class=\"actions\" id=\"actions\">{acts}</div>");
    }
    if let Some(res) = o(r, 14) {
        let _ = write!(b, "<h2>Result</h2><pre>{}</pre>", esc(res));
    }
    let tl = rows(
        &ctx,
        &format!(
            "SELECT to_char(e.at AT TIME ZONE $2, '{TS}'), to_char(e.at AT TIME ZONE 'UTC', '{TS}'),
                    e.from_state::text, e.to_state::text, e.reason, e.actor
               FROM tide.run_event e WHERE e.run_id = $1 ORDER BY e.event_id"
        ),
        &[&id, &s(r, 13)],
    )
    .await?;
    b.push_str("<h2>Timeline</h2><ol class=\"timeline\">");
    for e in &tl {
        let _ = write!(
            b,
            "<li>{} {} → {} <span class=\"muted\">{} · {}</span></li>",
            when(o(e, 0), o(e, 1)),
            opt(o(e, 2)),
            badge(s(e, 3)),
            esc(s(e, 4)),
            esc(s(e, 5))
        );
    }
    b.push_str("</ol>");
    let at = rows(
        &ctx,
        &format!(
            "SELECT a.attempt::text, a.worker, to_char(a.claimed_at AT TIME ZONE 'UTC', '{TS}'),
                    to_char(a.finished_at AT TIME ZONE 'UTC', '{TS}'), a.outcome::text, a.error_kind::text,
                    a.sqlstate, a.error
               FROM tide.attempt a WHERE a.run_id = $1 ORDER BY a.attempt"
        ),
        &[&id],
    )
    .await?;
    b.push_str("<h2>Attempts</h2>");
    let list: Vec<Vec<String>> = at
        .iter()
        .map(|a| {
            vec![
                esc(s(a, 0)),
                opt(o(a, 1)),
                when(&None, o(a, 2)),
                when(&None, o(a, 3)),
                badge(s(a, 4)),
                format!("{} {}", opt(o(a, 5)), opt(o(a, 6))),
                opt(o(a, 7)),
            ]
        })
        .collect();
    b.push_str(&table(
        &[
            "#", "worker", "claimed", "finished", "outcome", "kind", "error",
        ],
        &list,
        "No finished attempts.",
    ));
    let steps = rows(
        &ctx,
        "SELECT st.name, st.done::text, st.attempt::text, st.output::text FROM tide.step st WHERE st.run_id = $1 ORDER BY st.started_at",
        &[&id],
    )
    .await?;
    if !steps.is_empty() {
        let list: Vec<Vec<String>> = steps
            .iter()
            .map(|x| vec![esc(s(x, 0)), esc(s(x, 1)), esc(s(x, 2)), opt(o(x, 3))])
            .collect();
        b.push_str("<h2>Steps</h2>");
        b.push_str(&table(&["step", "done", "attempt", "output"], &list, ""));
    }
    let effects = rows(
        &ctx,
        "SELECT e.effect_id::text, e.channel::text, e.dedupe_key, e.state::text, e.attempts::text, e.last_error
           FROM tide.effect e WHERE e.run_id = $1 ORDER BY e.effect_id",
        &[&id],
    )
    .await?;
    if !effects.is_empty() {
        let list: Vec<Vec<String>> = effects
            .iter()
            .map(|x| {
                vec![
                    esc(s(x, 0)),
                    esc(s(x, 1)),
                    esc(s(x, 2)),
                    badge(s(x, 3)),
                    esc(s(x, 4)),
                    opt(o(x, 5)),
                ]
            })
            .collect();
        b.push_str("<h2>Side effects</h2>");
        b.push_str(&table(
            &[
                "effect",
                "channel",
                "dedupe key",
                "state",
                "attempts",
                "last error",
            ],
            &list,
            "",
        ));
    }
    let lock = rows(
        &ctx,
        &format!(
            "SELECT l.key, l.lease_token::text, to_char(l.expires_at AT TIME ZONE 'UTC', '{TS}') FROM tide.lock l WHERE l.run_id = $1"
        ),
        &[&id],
    )
    .await?;
    if let Some(l) = lock.first() {
        let _ = write!(
            b,
            "<h2>Lock</h2><p>holds <code>{}</code> with fencing token {} until {}</p>",
            esc(s(l, 0)),
            esc(s(l, 1)),
            when(&None, o(l, 2))
        );
    } else if let Some(k) = o(r, 12) {
        let _ = write!(
            b,
            "<h2>Lock</h2><p>locks <code>{}</code> while it runs</p>",
            esc(k)
        );
    }
    let story = rows(&ctx, "SELECT x FROM tide.explain($1) x", &[&id]).await?;
    b.push_str("<h2>The whole story (tide.explain)</h2><pre class=\"explain\">");
    for l in &story {
        b.push_str(&esc(s(l, 0)));
        b.push('\n');
    }
    b.push_str("</pre>");
    Ok(done(&format!("Run {id}"), &frame, &b))
}

#[derive(Deserialize)]
pub struct ActionForm {
    csrf: Option<String>,
    note: Option<String>,
    decision: Option<String>,
    back: Option<String>,
}

/// Where to go after an action: the page the form was on (a path of this console), else `default`.
fn back_to(f: &ActionForm, default: String) -> Response {
    let to = match &f.back {
        Some(b) if b.starts_with('/') && !b.starts_with("//") && !b.contains('\\') => b.clone(),
        _ => default,
    };
    Redirect::to(&to).into_response()
}

pub async fn run_action(
    ctx: Ctx,
    Path((id, verb)): Path<(String, String)>,
    Form(f): Form<ActionForm>,
) -> Result<Response, Fail> {
    ctx.check_action(&f.csrf)?;
    let id = id_of("run", &id)?;
    let sql = match verb.as_str() {
        "replay" => "SELECT tide.replay_run($1)::text",
        "cancel" => "SELECT tide.cancel_run($1, reason => 'cancelled in the console')::text",
        "pause" => "SELECT tide.pause_run($1)::text",
        "resume" => "SELECT tide.resume_run($1)::text",
        "accept" => "SELECT tide.resolve_run($1, 'accept')::text",
        other => return Err(Fail::NotFound(format!("no run action {other:?}"))),
    };
    let out = ctx.db.query_one(sql, &[&id]).await?;
    let next: Option<String> = out.get(0);
    // A replay may put back a new run (a skipped window): follow it.
    let target = match (
        verb.as_str(),
        next.as_deref().and_then(|n| n.parse::<i64>().ok()),
    ) {
        ("replay", Some(n)) => n,
        _ => id,
    };
    Ok(back_to(&f, format!("/run/{target}")))
}

pub async fn dead(ctx: Ctx) -> Result<Response, Fail> {
    let d = rows(
        &ctx,
        &format!(
            "SELECT d.run_id::text, d.task, d.biz_date::text, d.attempts::text, d.last_error_kind::text,
                    left(d.last_error, 200), to_char(d.died_at AT TIME ZONE z.tz, '{TS}'),
                    to_char(d.died_at AT TIME ZONE 'UTC', '{TS}'), z.tz
               FROM tide.dead_letter d CROSS JOIN LATERAL (SELECT coalesce(d.rules->>'tz', 'UTC') AS tz) z
              ORDER BY d.died_at DESC NULLS LAST LIMIT 200"
        ),
        &[],
    )
    .await?;
    let frame = ctx.frame("dead", Some(String::new()));
    let list: Vec<Vec<String>> = d
        .iter()
        .map(|x| {
            vec![
                format!("<a href=\"/run/{0}\">{0}</a>", esc(s(x, 0))),
                esc(s(x, 1)),
                opt(o(x, 2)),
                esc(s(x, 3)),
                opt(o(x, 4)),
                opt(o(x, 5)),
                format!(
                    "{} <span class=\"muted\">{}</span>",
                    when(o(x, 6), o(x, 7)),
                    esc(s(x, 8))
                ),
                action(
                    &frame,
                    &format!("/run/{}/replay", s(x, 0)),
                    "Replay",
                    "<input type=\"hidden\" name=\"back\" value=\"/dead\">",
                    None,
                ),
            ]
        })
        .collect();
    let b = format!(
        "<h1>Dead letters</h1>{}",
        table(
            &["run", "task", "date", "attempts", "kind", "error", "died", ""],
            &list,
            "No dead runs. Nothing waits for a person."
        )
    );
    Ok(done("Dead letters", &frame, &b))
}

pub async fn alerts(ctx: Ctx) -> Result<Response, Fail> {
    let a = rows(
        &ctx,
        &format!(
            "SELECT a.alert_id::text, a.subject_type, a.subject, a.kind::text, a.severity::text,
                    to_char(a.opened_at AT TIME ZONE 'UTC', '{TS}'), to_char(a.resolved_at AT TIME ZONE 'UTC', '{TS}'),
                    a.count::text, a.details::text, a.acked_by::text, a.ack_note, a.owner::text
               FROM tide.alert a
              ORDER BY a.resolved_at IS NULL DESC, a.severity DESC, a.opened_at DESC LIMIT 200"
        ),
        &[],
    )
    .await?;
    let frame = ctx.frame("alerts", Some(String::new()));
    let list: Vec<Vec<String>> = a
        .iter()
        .map(|x| {
            let open = o(x, 6).is_none();
            let ack = match (open, o(x, 9)) {
                (_, Some(by)) => format!("acknowledged by {} {}", esc(by), opt(o(x, 10))),
                (true, None) => action(
                    &frame,
                    &format!("/alert/{}/ack", s(x, 0)),
                    "Acknowledge",
                    "<input name=\"note\" placeholder=\"note\" maxlength=\"500\">",
                    None,
                ),
                (false, None) => String::new(),
            };
            vec![
                badge(s(x, 4)),
                format!(
                    "{} <span class=\"muted\">{}</span>",
                    esc(s(x, 2)),
                    esc(s(x, 1))
                ),
                esc(s(x, 3)),
                when(&None, o(x, 5)),
                if open {
                    badge("open")
                } else {
                    when(&None, o(x, 6))
                },
                esc(s(x, 7)),
                format!("<code class=\"small\">{}</code>", esc(s(x, 8))),
                esc(s(x, 11)),
                ack,
            ]
        })
        .collect();
    let b = format!(
        "<h1>Alerts</h1>{}",
        table(
            &[
                "severity",
                "subject",
                "kind",
                "opened (UTC)",
                "resolved",
                "count",
                "details",
                "owner",
                ""
            ],
            &list,
            "No alerts."
        )
    );
    Ok(done("Alerts", &frame, &b))
}

pub async fn ack(
    ctx: Ctx,
    Path(id): Path<i64>,
    Form(f): Form<ActionForm>,
) -> Result<Response, Fail> {
    ctx.check_action(&f.csrf)?;
    let note = blank_none(&f.note);
    ctx.db
        .query_one("SELECT tide.ack($1, note => $2)::text", &[&id, &note])
        .await?;
    Ok(back_to(&f, "/alerts".into()))
}

pub async fn checks(ctx: Ctx) -> Result<Response, Fail> {
    let c = rows(
        &ctx,
        &format!(
            "SELECT c.kind, c.name, c.status, c.severity::text, to_char(c.last_beat AT TIME ZONE 'UTC', '{TS}'),
                    to_char(c.expected_at AT TIME ZONE 'UTC', '{TS}'), c.grace::text, c.message, c.owner::text
               FROM tide.check_status c
              ORDER BY CASE c.status WHEN 'down' THEN 0 WHEN 'late' THEN 1 WHEN 'new' THEN 2 WHEN 'up' THEN 3 ELSE 4 END, c.name"
        ),
        &[],
    )
    .await?;
    let frame = ctx.frame("checks", Some(String::new()));
    let list: Vec<Vec<String>> = c
        .iter()
        .map(|x| {
            vec![
                esc(s(x, 1)),
                esc(s(x, 0)),
                badge(s(x, 2)),
                esc(s(x, 3)),
                when(&None, o(x, 4)),
                when(&None, o(x, 5)),
                opt(o(x, 6)),
                opt(o(x, 7)),
                esc(s(x, 8)),
            ]
        })
        .collect();
    let b = format!(
        "<h1>Heartbeats</h1>{}",
        table(
            &[
                "name",
                "kind",
                "status",
                "severity",
                "last beat",
                "expected by",
                "grace",
                "message",
                "owner"
            ],
            &list,
            "No heartbeat checks."
        )
    );
    Ok(done("Heartbeats", &frame, &b))
}

pub async fn backfills(ctx: Ctx) -> Result<Response, Fail> {
    let bf = rows(
        &ctx,
        &format!(
            "SELECT b.backfill_id::text, b.task, b.from_date::text, b.to_date::text, b.state,
                    b.windows_total::text, (b.windows_done + b.windows_failed + b.windows_skipped + b.windows_cancelled)::text,
                    b.windows_done::text, b.windows_failed::text, b.windows_running::text, b.windows_in_line::text,
                    round(b.rate, 2)::text, date_trunc('second', b.eta)::text, to_char(b.started AT TIME ZONE 'UTC', '{TS}'),
                    b.reason, b.owner::text
               FROM tide.backfill_status b ORDER BY b.finished IS NULL DESC, b.backfill_id DESC LIMIT 100"
        ),
        &[],
    )
    .await?;
    let frame = ctx.frame("backfills", Some(String::new()));
    let mut b = String::from("<h1>Backfills</h1>");
    if bf.is_empty() {
        b.push_str("<p class=\"empty\">No backfills.</p>");
    }
    for x in &bf {
        let id = s(x, 0);
        let state = s(x, 4);
        let mut acts = String::new();
        let back = "<input type=\"hidden\" name=\"back\" value=\"/backfills\">";
        if ["canary", "running", "sampling"].contains(&state) {
            acts.push_str(&action(
                &frame,
                &format!("/backfill/{id}/pause"),
                "Pause",
                back,
                None,
            ));
        }
        if ["paused", "verify_failed", "needs_review"].contains(&state) {
            acts.push_str(&action(
                &frame,
                &format!("/backfill/{id}/resume"),
                "Resume",
                back,
                None,
            ));
        }
        if [
            "canary",
            "running",
            "sampling",
            "paused",
            "verify_failed",
            "needs_review",
        ]
        .contains(&state)
        {
            acts.push_str(&action(
                &frame,
                &format!("/backfill/{id}/cancel"),
                "Cancel",
                back,
                Some("Cancel this backfill? Windows not started are cancelled."),
            ));
        }
        let _ = write!(
            b,
            "<article class=\"card\" id=\"backfill-{}\"><h2>#{} {} <span class=\"muted\">{} → {}</span> {}</h2>\
             <progress max=\"{}\" value=\"{}\"></progress>\
             <p class=\"facts\">{} of {} windows ended: {} done, {} failed · {} running, {} in line · {} windows/s · ETA {} · started {}</p>\
             <p class=\"muted\">{} · owner {}</p><div class=\"actions\">{acts}</div></article>",
            esc(id),
            esc(id),
            esc(s(x, 1)),
            esc(s(x, 2)),
            esc(s(x, 3)),
            badge(state),
            esc(s(x, 5)),
            esc(s(x, 6)),
            esc(s(x, 6)),
            esc(s(x, 5)),
            esc(s(x, 7)),
            esc(s(x, 8)),
            esc(s(x, 9)),
            esc(s(x, 10)),
            opt(o(x, 11)),
            opt(o(x, 12)),
            when(&None, o(x, 13)),
            opt(o(x, 14)),
            esc(s(x, 15)),
        );
    }
    Ok(done("Backfills", &frame, &b))
}

pub async fn backfill_action(
    ctx: Ctx,
    Path((id, verb)): Path<(String, String)>,
    Form(f): Form<ActionForm>,
) -> Result<Response, Fail> {
    ctx.check_action(&f.csrf)?;
    let id = id_of("backfill", &id)?;
    let sql = match verb.as_str() {
        "pause" => "SELECT tide.pause_backfill($1)",
        "resume" => "SELECT tide.resume_backfill($1)",
        "cancel" => "SELECT tide.cancel_backfill($1)",
        other => return Err(Fail::NotFound(format!("no backfill action {other:?}"))),
    };
    ctx.db.query_one(sql, &[&id]).await?;
    Ok(back_to(&f, "/backfills".into()))
}

pub async fn recon(ctx: Ctx) -> Result<Response, Fail> {
    let st = rows(
        &ctx,
        "SELECT r.name, r.date::text, r.status, r.left::text, r.right::text, r.open::text, r.human::text FROM tide.recon_status r",
        &[],
    )
    .await?;
    let classes = rows(
        &ctx,
        "SELECT d.class, count(*)::text FROM tide.recon_open o JOIN tide.recon_diff d ON d.diff_id = o.id GROUP BY d.class ORDER BY d.class",
        &[],
    )
    .await?;
    let diffs = rows(
        &ctx,
        "SELECT d.diff_id::text, d.reconciliation, d.biz_date::text, d.key, d.kind, d.class, d.escalated::text,
                d.left::text, d.right::text, d.reason
           FROM tide.recon_open o JOIN tide.recon_diff d ON d.diff_id = o.id
          ORDER BY d.escalated DESC, d.reconciliation, d.biz_date DESC, d.key LIMIT 500",
        &[],
    )
    .await?;
    let frame = ctx.frame("recon", Some(String::new()));
    let mut b = String::from("<h1>Reconciliations</h1>");
    let list: Vec<Vec<String>> = st
        .iter()
        .map(|x| {
            vec![
                esc(s(x, 0)),
                opt(o(x, 1)),
                badge(s(x, 2)),
                esc(s(x, 3)),
                esc(s(x, 4)),
                esc(s(x, 5)),
                esc(s(x, 6)),
            ]
        })
        .collect();
    b.push_str(&table(
        &[
            "reconciliation",
            "date",
            "status",
            "left rows",
            "right rows",
            "open",
            "for a person",
        ],
        &list,
        "No reconciliations.",
    ));
    if !classes.is_empty() {
        b.push_str("<h2>Open differences by class</h2><p class=\"facts\">");
        for c in &classes {
            let _ = write!(b, "{} {} · ", esc(s(c, 0)), esc(s(c, 1)));
        }
        b.push_str("</p>");
    }
    let list: Vec<Vec<String>> = diffs
        .iter()
        .map(|x| {
            let back = "<input type=\"hidden\" name=\"back\" value=\"/recon\">";
            let path = format!("/diff/{}/resolve", s(x, 0));
            vec![
                esc(s(x, 0)),
                esc(s(x, 1)),
                esc(s(x, 2)),
                format!("<code>{}</code>", esc(s(x, 3))),
                esc(s(x, 4)),
                format!(
                    "{}{}",
                    esc(s(x, 5)),
                    if s(x, 6) == "true" {
                        " <strong>for a person</strong>"
                    } else {
                        ""
                    }
                ),
                format!("<code class=\"small\">{}</code>", opt(o(x, 7))),
                format!("<code class=\"small\">{}</code>", opt(o(x, 8))),
                format!(
                    "{}{}",
                    action(
                        &frame,
                        &path,
                        "Accept",
                        &format!(
                            "{back}<input type=\"hidden\" name=\"decision\" value=\"accept\">"
                        ),
                        None
                    ),
                    action(
                        &frame,
                        &path,
                        "Fixed",
                        &format!("{back}<input type=\"hidden\" name=\"decision\" value=\"fixed\">"),
                        None
                    )
                ),
            ]
        })
        .collect();
    b.push_str("<h2>Open differences</h2>");
    b.push_str(&table(
        &[
            "id",
            "reconciliation",
            "date",
            "key",
            "kind",
            "class",
            "left",
            "right",
            "",
        ],
        &list,
        "No open differences.",
    ));
    Ok(done("Reconciliations", &frame, &b))
}

pub async fn resolve_diff(
    ctx: Ctx,
    Path(id): Path<i64>,
    Form(f): Form<ActionForm>,
) -> Result<Response, Fail> {
    ctx.check_action(&f.csrf)?;
    let decision = blank_none(&f.decision)
        .ok_or_else(|| Fail::BadRequest("a decision is needed: accept or fixed".into()))?;
    let note = blank_none(&f.note);
    ctx.db
        .query_one(
            "SELECT tide.resolve_diff($1, $2, note => $3)",
            &[&id, &decision, &note],
        )
        .await?;
    Ok(back_to(&f, "/recon".into()))
}

#[cfg(test)]
mod tests {
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
        let t = versions_table(&v);
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

    #[test]
    fn the_strip_links_each_window() {
        let st = strip(r#"[["succeeded", "2026-11-01", 7], ["dead", "2026-11-02", 9]]"#);
        assert!(
            st.contains("class=\"cell s-succeeded\" href=\"/run/7\""),
            "{st}"
        );
        assert!(
            st.contains("class=\"cell s-dead\" href=\"/run/9\" title=\"2026-11-02: dead\""),
            "{st}"
        );
        assert!(strip("[]").contains("no runs yet"));
    }

    #[test]
    fn ids_in_addresses_are_numbers() {
        assert_eq!(id_of("run", "42").ok(), Some(42));
        match id_of("run", "4<2") {
            Err(Fail::BadRequest(m)) => {
                assert!(m.contains("run id \"4<2\" is not a number"), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn back_links_stay_on_the_console() {
        let f = |b: &str| ActionForm {
            csrf: None,
            note: None,
            decision: None,
            back: Some(b.into()),
        };
        let loc = |r: Response| {
            r.headers()
                .get("location")
                .unwrap()
                .to_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(loc(back_to(&f("/dead"), "/x".into())), "/dead");
        assert_eq!(loc(back_to(&f("//evil.example/"), "/x".into())), "/x");
        assert_eq!(loc(back_to(&f("https://evil.example/"), "/x".into())), "/x");
    }
}

//! The lists: dead letters, alerts, heartbeats, backfills, reconciliations; each pages beyond
//! its first hundred rows in a stable order (ties broken by id), instants in the zone of the
//! task they concern (UTC on hover), and the actions on one row.

use axum::extract::{Path, Query};
use axum::response::Response;
use axum::Form;
use maud::{html, Markup};
use serde::Deserialize;

use super::overview::alert_zone_sql;
use super::{
    back_to, blank_none, done, id_of, o, paged, rows, s, ActionForm, PageQuery, Row, PAGE, TS,
};
use crate::html::{action, badge, csrf_field, dur, hidden, pager, table, when};
use crate::{Ctx, Fail};

#[derive(Deserialize)]
pub struct DeadQuery {
    /// Only this task's dead runs.
    task: Option<String>,
    page: Option<i64>,
}

pub async fn dead(ctx: Ctx, Query(q): Query<DeadQuery>) -> Result<Response, Fail> {
    let task = match blank_none(&q.task) {
        Some(t) => Some(id_of("task", &t)?),
        None => None,
    };
    let pageno = q.page.unwrap_or(0).max(0);
    let (d, more) = paged(
        rows(
            &ctx,
            &format!(
                "SELECT d.run_id::text, d.task, d.biz_date::text, d.attempts::text, d.last_error_kind::text,
                        left(d.last_error, 200), to_char(d.died_at AT TIME ZONE z.tz, '{TS}'),
                        to_char(d.died_at AT TIME ZONE 'UTC', '{TS}'), z.tz
                   FROM tide.dead_letter d CROSS JOIN LATERAL (SELECT coalesce(d.rules->>'tz', 'UTC') AS tz) z
                  WHERE $1::bigint IS NULL
                     OR d.run_id IN (SELECT p.run_id FROM tide.pending p WHERE p.state = 'dead' AND p.task_id = $1)
                  ORDER BY d.died_at DESC NULLS LAST, d.run_id DESC LIMIT $2 OFFSET $3"
            ),
            &[&task, &(PAGE + 1), &(pageno * PAGE)],
        )
        .await?,
    );
    // Replaying all of a task's dead runs: how many there are, and the task's name.
    let all = match task {
        Some(t) => rows(
            &ctx,
            "SELECT count(*)::text, (SELECT x.name FROM tide.task x WHERE x.task_id = $1)
               FROM tide.pending p WHERE p.state = 'dead' AND p.task_id = $1",
            &[&t],
        )
        .await?
        .into_iter()
        .next(),
        None => None,
    };
    let frame = ctx.frame("dead", Some(String::new()));
    let list: Vec<Vec<Markup>> = d
        .iter()
        .map(|x| {
            vec![
                html! {
                    @if !frame.read_only {
                        input.pick type="checkbox" name="run" value=(s(x, 0)) form="bulk-replay"
                            aria-label=(format!("select run {}", s(x, 0)));
                    }
                },
                html! { a href=(format!("/run/{}", s(x, 0))) { (s(x, 0)) } },
                html! { (s(x, 1)) },
                html! { (o(x, 2).as_deref().unwrap_or("–")) },
                html! { (s(x, 3)) },
                html! { (o(x, 4).as_deref().unwrap_or("–")) },
                html! { (o(x, 5).as_deref().unwrap_or("–")) },
                html! { (when(o(x, 6), o(x, 7))) " " span.muted { (s(x, 8)) } },
                action(
                    &frame,
                    &format!("/run/{}/replay", s(x, 0)),
                    "Replay",
                    hidden("back", "/dead"),
                    None,
                ),
            ]
        })
        .collect();
    let base = match task {
        Some(t) => format!("/dead?task={t}&"),
        None => "/dead?".into(),
    };
    let body = html! {
        h1 { "Dead letters" }
        @if let Some(a) = &all {
            p { "Of task " strong { (s(a, 1)) } ": " (s(a, 0)) " dead. " a href="/dead" { "All tasks" } }
        }
        @if !frame.read_only && !d.is_empty() {
            form #bulk-replay .bulk method="post" action="/dead/replay" {
                (csrf_field(frame.csrf))
                button #replay-selected name="pick" value="selected" { "Replay selected…" }
                @if let (Some(t), Some(a)) = (task, &all) {
                    " "
                    button #replay-all name="all_task" value=(t) { "Replay all " (s(a, 0)) " dead letters of " (s(a, 1)) "…" }
                }
                span.muted { " You confirm the count before anything is replayed." }
            }
        }
        (table(&["", "run", "task", "date", "attempts", "kind", "error", "died", ""], &list,
               "No dead runs. Nothing waits for a person."))
        (pager(&base, pageno, more))
    };
    Ok(done("Dead letters", &frame, body))
}

pub async fn alerts(ctx: Ctx, Query(q): Query<PageQuery>) -> Result<Response, Fail> {
    let pageno = q.number();
    let (a, more) = paged(
        rows(
            &ctx,
            &format!(
                "SELECT a.alert_id::text, a.subject_type, a.subject, a.kind::text, a.severity::text,
                        {}, {}, a.count::text, a.details::text, a.acked_by::text, a.ack_note, a.owner::text
                   FROM tide.alert a
                  ORDER BY a.resolved_at IS NULL DESC, a.severity DESC, a.opened_at DESC, a.alert_id DESC
                  LIMIT $1 OFFSET $2",
                alert_zone_sql("a.opened_at"),
                alert_zone_sql("a.resolved_at")
            ),
            &[&(PAGE + 1), &(pageno * PAGE)],
        )
        .await?,
    );
    let frame = ctx.frame("alerts", Some(String::new()));
    let list: Vec<Vec<Markup>> = a
        .iter()
        .map(|x| {
            let open = o(x, 8).is_none();
            let id = s(x, 0);
            vec![
                html! {
                    @if open && o(x, 11).is_none() && !frame.read_only {
                        input.pick type="checkbox" name="alert" value=(id) form="bulk-ack"
                            aria-label=(format!("select alert {id}"));
                    }
                },
                badge(s(x, 4)),
                html! { (s(x, 2)) " " span.muted { (s(x, 1)) } },
                html! { (s(x, 3)) },
                when(o(x, 5), o(x, 6)),
                html! { @if open { (badge("open")) } @else { (when(o(x, 7), o(x, 8))) } },
                html! { (s(x, 9)) },
                html! { code.small { (s(x, 10)) } },
                html! { (s(x, 13)) },
                html! {
                    @match (open, o(x, 11)) {
                        (_, Some(by)) => { "acknowledged by " (by) " " (o(x, 12).as_deref().unwrap_or("")) },
                        (true, None) => (action(&frame, &format!("/alert/{id}/ack"), "Acknowledge",
                                               html! { input name="note" placeholder="note" maxlength="500"; }, None)),
                        (false, None) => {},
                    }
                },
            ]
        })
        .collect();
    let pickable = a.iter().any(|x| o(x, 8).is_none() && o(x, 11).is_none());
    let body = html! {
        h1 { "Alerts" }
        p.muted { "Instants in the zone of the task an alert is about (UTC for others; UTC on hover)." }
        @if !frame.read_only && pickable {
            form #bulk-ack .bulk method="post" action="/alerts/ack" {
                (csrf_field(frame.csrf))
                button #ack-selected { "Acknowledge selected…" }
                span.muted { " You confirm the count, and may add a note, before anything is acknowledged." }
            }
        }
        (table(&["", "severity", "subject", "kind", "opened", "resolved", "count", "details", "owner", ""],
               &list, "No alerts."))
        (pager("/alerts?", pageno, more))
    };
    Ok(done("Alerts", &frame, body))
}

pub async fn ack(
    ctx: Ctx,
    Path(id): Path<String>,
    Form(f): Form<ActionForm>,
) -> Result<Response, Fail> {
    ctx.check_action(&f.csrf)?;
    let id = id_of("alert", &id)?;
    let note = blank_none(&f.note);
    ctx.db
        .query_one("SELECT tide.ack_alert($1, note => $2)::text", &[&id, &note])
        .await?;
    Ok(back_to(&f, "/alerts".into()))
}

pub async fn checks(ctx: Ctx) -> Result<Response, Fail> {
    // A check's instants in its own zone (tide.check.tz), a task's in the task's.
    let c = rows(
        &ctx,
        &format!(
            "SELECT c.kind, c.name, c.status, c.severity::text,
                    to_char(c.last_beat AT TIME ZONE z.tz, '{TS}'), to_char(c.last_beat AT TIME ZONE 'UTC', '{TS}'),
                    to_char(c.expected_at AT TIME ZONE z.tz, '{TS}'), to_char(c.expected_at AT TIME ZONE 'UTC', '{TS}'),
                    extract(epoch FROM c.grace)::text, c.message, c.owner::text, z.tz
               FROM tide.check_status c
               CROSS JOIN LATERAL (SELECT coalesce(
                   CASE WHEN c.kind = 'task' THEN (SELECT t.tz FROM tide.task t WHERE t.name = c.name AND t.owner = c.owner)
                        ELSE (SELECT k.tz FROM tide.check k WHERE k.name = c.name AND k.owner = c.owner) END, 'UTC') AS tz) z
              ORDER BY CASE c.status WHEN 'down' THEN 0 WHEN 'late' THEN 1 WHEN 'new' THEN 2 WHEN 'up' THEN 3 ELSE 4 END,
                       c.name, c.owner"
        ),
        &[],
    )
    .await?;
    let frame = ctx.frame("checks", Some(String::new()));
    let list: Vec<Vec<Markup>> = c
        .iter()
        .map(|x| {
            vec![
                html! { (s(x, 1)) },
                html! { (s(x, 0)) },
                badge(s(x, 2)),
                html! { (s(x, 3)) },
                html! { (when(o(x, 4), o(x, 5))) " " span.muted { (s(x, 11)) } },
                when(o(x, 6), o(x, 7)),
                dur(o(x, 8)),
                html! { (o(x, 9).as_deref().unwrap_or("–")) },
                html! { (s(x, 10)) },
            ]
        })
        .collect();
    let body = html! {
        h1 { "Heartbeats" }
        (table(&["name", "kind", "status", "severity", "last beat", "expected by", "grace", "message", "owner"],
               &list, "No heartbeat checks."))
    };
    Ok(done("Heartbeats", &frame, body))
}

pub async fn backfills(ctx: Ctx) -> Result<Response, Fail> {
    let bf = rows(
        &ctx,
        &format!(
            "SELECT b.backfill_id::text, b.task, b.from_date::text, b.to_date::text, b.state,
                    b.windows_total::text, (b.windows_done + b.windows_failed + b.windows_skipped + b.windows_cancelled)::text,
                    b.windows_done::text, b.windows_failed::text, b.windows_running::text, b.windows_in_line::text,
                    round(b.rate, 2)::text, extract(epoch FROM b.eta)::text,
                    to_char(b.started AT TIME ZONE z.tz, '{TS}'), to_char(b.started AT TIME ZONE 'UTC', '{TS}'),
                    b.reason, b.owner::text, z.tz
               FROM tide.backfill_status b
               CROSS JOIN LATERAL (SELECT coalesce((SELECT t.tz FROM tide.task t WHERE t.name = b.task AND t.owner = b.owner), 'UTC') AS tz) z
              ORDER BY b.finished IS NULL DESC, b.backfill_id DESC LIMIT 100"
        ),
        &[],
    )
    .await?;
    let frame = ctx.frame("backfills", Some(String::new()));
    let body = html! {
        h1 { "Backfills" }
        @if bf.is_empty() { p.empty { "No backfills." } }
        @for x in &bf { (backfill_card(&frame, x)) }
    };
    Ok(done("Backfills", &frame, body))
}

fn backfill_card(frame: &crate::html::Frame, x: &Row) -> Markup {
    let id = s(x, 0);
    let state = s(x, 4);
    let back = hidden("back", "/backfills");
    html! {
        article.card #(format!("backfill-{id}")) {
            h2 { "#" (id) " " (s(x, 1)) " " span.muted { (s(x, 2)) " → " (s(x, 3)) } " " (badge(state)) }
            progress max=(s(x, 5)) value=(s(x, 6)) {}
            p.facts {
                (s(x, 6)) " of " (s(x, 5)) " windows ended: " (s(x, 7)) " done, " (s(x, 8)) " failed · "
                (s(x, 9)) " running, " (s(x, 10)) " in line · " (o(x, 11).as_deref().unwrap_or("–")) " windows/s · ETA "
                (dur(o(x, 12))) " · started " (when(o(x, 13), o(x, 14))) " " span.muted { (s(x, 17)) }
            }
            p.muted { (o(x, 15).as_deref().unwrap_or("–")) " · owner " (s(x, 16)) }
            div.actions {
                @if ["canary", "running", "sampling"].contains(&state) {
                    (action(frame, &format!("/backfill/{id}/pause"), "Pause", back.clone(), None))
                }
                @if ["paused", "verify_failed", "needs_review"].contains(&state) {
                    (action(frame, &format!("/backfill/{id}/resume"), "Resume", back.clone(), None))
                }
                @if ["canary", "running", "sampling", "paused", "verify_failed", "needs_review"].contains(&state) {
                    (action(frame, &format!("/backfill/{id}/cancel"), "Cancel", back.clone(),
                            Some("Cancel this backfill? Windows not started are cancelled.")))
                }
            }
        }
    }
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

pub async fn recon(ctx: Ctx, Query(q): Query<PageQuery>) -> Result<Response, Fail> {
    let pageno = q.number();
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
    let (diffs, more) = paged(
        rows(
            &ctx,
            "SELECT d.diff_id::text, d.reconciliation, d.biz_date::text, d.key, d.kind, d.class, d.escalated::text,
                    d.left::text, d.right::text, d.reason
               FROM tide.recon_open o JOIN tide.recon_diff d ON d.diff_id = o.id
              ORDER BY d.escalated DESC, d.reconciliation, d.biz_date DESC, d.key, d.diff_id
              LIMIT $1 OFFSET $2",
            &[&(PAGE + 1), &(pageno * PAGE)],
        )
        .await?,
    );
    let frame = ctx.frame("recon", Some(String::new()));
    let status: Vec<Vec<Markup>> = st
        .iter()
        .map(|x| {
            vec![
                html! { (s(x, 0)) },
                html! { (o(x, 1).as_deref().unwrap_or("–")) },
                badge(s(x, 2)),
                html! { (s(x, 3)) },
                html! { (s(x, 4)) },
                html! { (s(x, 5)) },
                html! { (s(x, 6)) },
            ]
        })
        .collect();
    let list: Vec<Vec<Markup>> = diffs
        .iter()
        .map(|x| {
            let path = format!("/diff/{}/resolve", s(x, 0));
            let fields = |decision: &str| html! { (hidden("back", "/recon")) (hidden("decision", decision)) };
            vec![
                html! { (s(x, 0)) },
                html! { (s(x, 1)) },
                html! { (s(x, 2)) },
                html! { code { (s(x, 3)) } },
                html! { (s(x, 4)) },
                html! { (s(x, 5)) @if s(x, 6) == "true" { " " strong { "for a person" } } },
                html! { code.small { (o(x, 7).as_deref().unwrap_or("–")) } },
                html! { code.small { (o(x, 8).as_deref().unwrap_or("–")) } },
                html! {
                    (action(&frame, &path, "Accept", fields("accept"), None))
                    (action(&frame, &path, "Fixed", fields("fixed"), None))
                },
            ]
        })
        .collect();
    let body = html! {
        h1 { "Reconciliations" }
        (table(&["reconciliation", "date", "status", "left rows", "right rows", "open", "for a person"],
               &status, "No reconciliations."))
        @if !classes.is_empty() {
            h2 { "Open differences by class" }
            p.facts { @for c in &classes { (s(c, 0)) " " (s(c, 1)) " · " } }
        }
        h2 { "Open differences" }
        (table(&["id", "reconciliation", "date", "key", "kind", "class", "left", "right", ""], &list,
               "No open differences."))
        (pager("/recon?", pageno, more))
    };
    Ok(done("Reconciliations", &frame, body))
}

pub async fn resolve_diff(
    ctx: Ctx,
    Path(id): Path<String>,
    Form(f): Form<ActionForm>,
) -> Result<Response, Fail> {
    ctx.check_action(&f.csrf)?;
    let id = id_of("diff", &id)?;
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

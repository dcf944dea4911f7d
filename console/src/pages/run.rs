//! A run's page: the story `tide.explain` tells, its timeline, attempts, steps, side effects and
//! lock, every instant in its task's zone; and the actions its state allows.

use axum::extract::Path;
use axum::response::Response;
use axum::Form;
use maud::{html, Markup};

use super::{back_to, done, id_of, o, rows, s, ActionForm, Row, TS};
use crate::html::{action, badge, dur, table, when};
use crate::{Ctx, Fail};

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
    let state = s(r, 3);
    let tz = s(r, 13);
    let frame = ctx.frame("overview", Some(s(r, 2).to_string()));
    let timeline = rows(
        &ctx,
        &format!(
            "SELECT to_char(e.at AT TIME ZONE $2, '{TS}'), to_char(e.at AT TIME ZONE 'UTC', '{TS}'),
                    e.from_state::text, e.to_state::text, e.reason, e.actor
               FROM tide.run_event e WHERE e.run_id = $1 ORDER BY e.event_id"
        ),
        &[&id, &tz],
    )
    .await?;
    let attempts = rows(
        &ctx,
        &format!(
            "SELECT a.attempt::text, a.worker, to_char(a.claimed_at AT TIME ZONE $2, '{TS}'),
                    to_char(a.claimed_at AT TIME ZONE 'UTC', '{TS}'), to_char(a.finished_at AT TIME ZONE $2, '{TS}'),
                    to_char(a.finished_at AT TIME ZONE 'UTC', '{TS}'), extract(epoch FROM a.finished_at - a.claimed_at)::text,
                    a.outcome::text, a.error_kind::text, a.sqlstate, a.error
               FROM tide.attempt a WHERE a.run_id = $1 ORDER BY a.attempt"
        ),
        &[&id, &tz],
    )
    .await?;
    let steps = rows(
        &ctx,
        "SELECT st.name, st.done::text, st.attempt::text, st.output::text FROM tide.step st WHERE st.run_id = $1 ORDER BY st.started_at",
        &[&id],
    )
    .await?;
    let effects = rows(
        &ctx,
        "SELECT e.effect_id::text, e.channel::text, e.dedupe_key, e.state::text, e.attempts::text, e.last_error
           FROM tide.effect e WHERE e.run_id = $1 ORDER BY e.effect_id",
        &[&id],
    )
    .await?;
    let lock = rows(
        &ctx,
        &format!(
            "SELECT l.key, l.lease_token::text, to_char(l.expires_at AT TIME ZONE $2, '{TS}'),
                    to_char(l.expires_at AT TIME ZONE 'UTC', '{TS}')
               FROM tide.lock l WHERE l.run_id = $1"
        ),
        &[&id, &tz],
    )
    .await?;
    let story = rows(&ctx, "SELECT x FROM tide.explain($1) x", &[&id]).await?;
    let acts = actions(&frame, id, state, o(r, 19).is_some());
    let body = html! {
        p.muted { a href=(format!("/task/{}", s(r, 2))) { (s(r, 1)) } }
        h1 { "Run " (s(r, 0)) " " span #state { (badge(state)) } }
        p.facts {
            (s(r, 4)) " · "
            @match (o(r, 5), o(r, 17)) {
                (Some(d), _) => { "business date " (d) " · window " (when(o(r, 6), o(r, 7))) " → " (when(o(r, 8), o(r, 9))) " (" (tz) ")" },
                (None, Some(k)) => { "event " (k) " on " (o(r, 18).as_deref().unwrap_or("–")) },
                _ => "no window",
            }
            " · attempts " (s(r, 10)) " · owner " (s(r, 16))
        }
        p { (s(r, 15)) }
        @if let Some(e) = o(r, 11) { p.err { (e) } }
        @if !acts.is_empty() { div.actions #actions { @for a in &acts { (a) } } }
        @if let Some(res) = o(r, 14) { h2 { "Result" } pre { (res) } }
        h2 { "Timeline" }
        p.muted { "In " (tz) ", the task's zone (UTC on hover)." }
        ol.timeline {
            @for e in &timeline {
                li {
                    (when(o(e, 0), o(e, 1))) " " (o(e, 2).as_deref().unwrap_or("–")) " → " (badge(s(e, 3))) " "
                    span.muted { (s(e, 4)) " · " (s(e, 5)) }
                }
            }
        }
        h2 { "Attempts" }
        (table(&["#", "worker", "claimed", "finished", "took", "outcome", "kind", "error"],
               &attempts.iter().map(attempt_row).collect::<Vec<_>>(), "No finished attempts."))
        @if !steps.is_empty() {
            h2 { "Steps" }
            (table(&["step", "done", "attempt", "output"],
                   &steps.iter().map(|x| vec![html! { (s(x, 0)) }, html! { (s(x, 1)) }, html! { (s(x, 2)) },
                                               html! { (o(x, 3).as_deref().unwrap_or("–")) }]).collect::<Vec<_>>(), ""))
        }
        @if !effects.is_empty() {
            h2 { "Side effects" }
            (table(&["effect", "channel", "dedupe key", "state", "attempts", "last error"],
                   &effects.iter().map(|x| vec![html! { (s(x, 0)) }, html! { (s(x, 1)) }, html! { (s(x, 2)) },
                                                 badge(s(x, 3)), html! { (s(x, 4)) },
                                                 html! { (o(x, 5).as_deref().unwrap_or("–")) }]).collect::<Vec<_>>(), ""))
        }
        @if let Some(l) = lock.first() {
            h2 { "Lock" }
            p { "holds " code { (s(l, 0)) } " with fencing token " (s(l, 1)) " until " (when(o(l, 2), o(l, 3))) }
        } @else if let Some(k) = o(r, 12) {
            h2 { "Lock" }
            p { "locks " code { (k) } " while it runs" }
        }
        h2 { "The whole story (tide.explain)" }
        pre.explain { @for l in &story { (s(l, 0)) "\n" } }
    };
    Ok(done(&format!("Run {id}"), &frame, body))
}

fn attempt_row(a: &Row) -> Vec<Markup> {
    vec![
        html! { (s(a, 0)) },
        html! { (o(a, 1).as_deref().unwrap_or("–")) },
        when(o(a, 2), o(a, 3)),
        when(o(a, 4), o(a, 5)),
        dur(o(a, 6)),
        badge(s(a, 7)),
        html! { (o(a, 8).as_deref().unwrap_or("–")) " " (o(a, 9).as_deref().unwrap_or("")) },
        html! { (o(a, 10).as_deref().unwrap_or("–")) },
    ]
}

/// The actions a run's state allows (none in read-only mode).
fn actions(frame: &crate::html::Frame, id: i64, state: &str, controlled: bool) -> Vec<Markup> {
    let path = |verb: &str| format!("/run/{id}/{verb}");
    let mut acts = Vec::new();
    if ["dead", "need_check", "cancelled", "skipped"].contains(&state) {
        acts.push(action(frame, &path("replay"), "Replay", html! {}, None));
    }
    if state == "need_check" {
        acts.push(action(
            frame,
            &path("accept"),
            "Resolve: accept the short count",
            html! {},
            None,
        ));
    }
    if ["waiting", "ready", "retry", "held"].contains(&state) || (state == "running" && !controlled)
    {
        acts.push(action(frame, &path("pause"), "Pause", html! {}, None));
    }
    if state == "paused" {
        acts.push(action(frame, &path("resume"), "Resume", html! {}, None));
    }
    if ["waiting", "ready", "running", "retry", "held", "paused"].contains(&state) {
        acts.push(action(
            frame,
            &path("cancel"),
            "Cancel",
            html! {},
            Some("Cancel this run?"),
        ));
    }
    acts.retain(|a| !a.0.is_empty());
    acts
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

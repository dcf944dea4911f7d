//! Acting on many: replaying dead runs (those selected, or every dead run of a task) and
//! acknowledging alerts. Each is two steps: a page that says how many and asks to confirm
//! (carrying the ids it counted, so what is confirmed is what was counted), then one call of
//! the pg_tide function per object, each in its own transaction, so each is recorded as its own
//! action in history and one refusal (a run replayed meanwhile) does not undo the others.

use axum::body::Bytes;
use axum::response::Response;
use maud::{html, Markup};

use super::{back_path, done, o, rows, s};
use crate::html::{csrf_field, hidden, table};
use crate::{Ctx, Fail};

/// The most objects one bulk action takes (a task with more dead runs is replayed in rounds).
pub const MAX_BULK: usize = 1000;

/// A posted form, whose fields may repeat (`run=1&run=2`).
struct Fields(Vec<(String, String)>);

impl Fields {
    fn parse(body: &[u8]) -> Fields {
        Fields(
            form_urlencoded::parse(body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    fn one(&self, key: &str) -> Option<String> {
        self.0
            .iter()
            .find(|(k, v)| k == key && !v.trim().is_empty())
            .map(|(_, v)| v.trim().to_string())
    }

    /// Every value of a repeated field, as ids; a value that is not one is refused.
    fn ids(&self, key: &str, what: &str) -> Result<Vec<i64>, Fail> {
        let mut ids = Vec::new();
        for (_, v) in self.0.iter().filter(|(k, _)| k == key) {
            ids.push(super::id_of(what, v.trim())?);
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }
}

fn too_many(n: usize, what: &str) -> Fail {
    Fail::BadRequest(format!(
        "{n} {what} selected: one action takes at most {MAX_BULK}; nothing was done"
    ))
}

/// What happened to each object of a confirmed bulk action.
struct Outcome {
    /// Acted on.
    done: usize,
    /// Already as asked (replayed or acknowledged before): nothing done, as the function says.
    unchanged: usize,
    refused: Vec<(i64, String, String)>,
}

/// Calls `sql` once per id (`$1`, and `note` as `$2` when given), each in its own transaction.
/// Its first column says whether the object was in a state the call changes, read with the
/// statement's snapshot, before the call.
async fn each(ctx: &Ctx, ids: &[i64], sql: &str, note: Option<&Option<String>>) -> Outcome {
    let mut out = Outcome {
        done: 0,
        unchanged: 0,
        refused: Vec::new(),
    };
    for id in ids {
        let r = match note {
            Some(note) => ctx.db.query_one(sql, &[id, note]).await,
            None => ctx.db.query_one(sql, &[id]).await,
        };
        match r {
            Ok(row) if row.get::<_, bool>(0) => out.done += 1,
            Ok(_) => out.unchanged += 1,
            Err(e) => {
                let (code, msg) = match e.as_db_error() {
                    Some(d) => (d.code().code().to_string(), d.message().to_string()),
                    None => (String::new(), e.to_string()),
                };
                out.refused.push((*id, code, msg));
            }
        }
    }
    out
}

fn outcome_page(
    ctx: &Ctx,
    title: &str,
    verb: &str,
    noun: &str,
    back: &str,
    out: &Outcome,
    total: usize,
) -> Response {
    let frame = ctx.frame("dead", None);
    let rows: Vec<Vec<Markup>> = out
        .refused
        .iter()
        .map(|(id, code, msg)| vec![html! { (id) }, html! { code { (code) } }, html! { (msg) }])
        .collect();
    let body = html! {
        h1 { (title) }
        p #bulk-result data-done=(out.done) data-unchanged=(out.unchanged) data-refused=(out.refused.len()) {
            (verb) " " (out.done) " of " (total) " " (noun) "."
            @if out.unchanged > 0 { " " (out.unchanged) " already were (nothing done to them)." }
            @if !out.refused.is_empty() { " PostgreSQL refused " (out.refused.len()) ":" }
        }
        @if !out.refused.is_empty() { (table(&["id", "SQLSTATE", "message"], &rows, "")) }
        p { a href=(back) { "Back" } }
    };
    done(title, &frame, body)
}

/// POST /dead/replay: `run` (repeated) the runs selected, or `all_task` every dead run of that
/// task; `confirm=yes` replays them.
pub async fn replay_many(ctx: Ctx, body: Bytes) -> Result<Response, Fail> {
    let f = Fields::parse(&body);
    ctx.check_action(&f.one("csrf"))?;
    let confirmed = f.one("confirm").as_deref() == Some("yes");
    let mut back = "/dead".to_string();
    let ids = match (confirmed, f.one("all_task")) {
        (false, Some(task)) => {
            let task = super::id_of("task", &task)?;
            back = format!("/dead?task={task}");
            let r = rows(
                &ctx,
                "SELECT p.run_id::text FROM tide.pending p WHERE p.state = 'dead' AND p.task_id = $1
                  ORDER BY p.run_id LIMIT $2",
                &[&task, &(MAX_BULK as i64)],
            )
            .await?;
            r.iter().filter_map(|x| s(x, 0).parse().ok()).collect()
        }
        _ => f.ids("run", "run")?,
    };
    if let Some(b) = f.one("back") {
        back = back_path(Some(&b), back);
    }
    if ids.is_empty() {
        return Err(Fail::BadRequest(
            "no dead run was selected: tick the runs to replay, then Replay selected; nothing was done".into(),
        ));
    }
    if ids.len() > MAX_BULK {
        return Err(too_many(ids.len(), "runs"));
    }
    if confirmed {
        let out = each(
            &ctx,
            &ids,
            "SELECT coalesce((SELECT r.state IN ('dead', 'need_check', 'cancelled', 'skipped') FROM tide.run r WHERE r.run_id = $1), false),
                    tide.replay_run($1)::text",
            None,
        ).await;
        return Ok(outcome_page(
            &ctx,
            "Replayed",
            "Replayed",
            "runs",
            &back,
            &out,
            ids.len(),
        ));
    }
    // What the ids are now, by task (a run the role cannot see is not counted: replaying it
    // would be refused).
    let by_task = rows(
        &ctx,
        "SELECT t.name, count(*)::text, count(*) FILTER (WHERE r.state = 'dead')::text
           FROM tide.run r JOIN tide.task t ON t.task_id = r.task_id
          WHERE r.run_id = ANY ($1) GROUP BY t.name ORDER BY t.name",
        &[&ids],
    )
    .await?;
    let frame = ctx.frame("dead", None);
    let n = ids.len();
    let body = html! {
        h1 { "Replay " (n) " run" @if n != 1 { "s" } "?" }
        p #bulk-count data-count=(n) {
            (n) " run" @if n != 1 { "s" } " will each be put back to run again, as "
            code { "tide.replay_run" } " does, one by one: each replay is its own action in the run's history."
        }
        ul { @for t in &by_task { li { strong { (s(t, 0)) } ": " (s(t, 1)) " (" (s(t, 2)) " dead now)" } } }
        form.bulk method="post" action="/dead/replay" {
            (csrf_field(frame.csrf)) (hidden("confirm", "yes")) (hidden("back", &back))
            @for id in &ids { (hidden("run", &id.to_string())) }
            button #confirm-replay { "Replay " (n) " run" @if n != 1 { "s" } }
            " " a href=(back) { "Cancel" }
        }
    };
    Ok(done("Replay dead runs", &frame, body))
}

/// POST /alerts/ack: `alert` (repeated); `confirm=yes` acknowledges them, with `note`.
pub async fn ack_many(ctx: Ctx, body: Bytes) -> Result<Response, Fail> {
    let f = Fields::parse(&body);
    ctx.check_action(&f.one("csrf"))?;
    let ids = f.ids("alert", "alert")?;
    if ids.is_empty() {
        return Err(Fail::BadRequest(
            "no alert was selected: tick the alerts to acknowledge; nothing was done".into(),
        ));
    }
    if ids.len() > MAX_BULK {
        return Err(too_many(ids.len(), "alerts"));
    }
    let note = f.one("note");
    if f.one("confirm").as_deref() == Some("yes") {
        let out = each(
            &ctx,
            &ids,
            "SELECT coalesce((SELECT a.acked_at IS NULL FROM tide.alert a WHERE a.alert_id = $1), false),
                    tide.ack_alert($1, note => $2)::text",
            Some(&note),
        ).await;
        return Ok(outcome_page(
            &ctx,
            "Acknowledged",
            "Acknowledged",
            "alerts",
            "/alerts",
            &out,
            ids.len(),
        ));
    }
    let shown = rows(
        &ctx,
        "SELECT a.subject, a.kind::text, a.severity::text FROM tide.alert a WHERE a.alert_id = ANY ($1)
          ORDER BY a.severity DESC, a.alert_id",
        &[&ids],
    )
    .await?;
    let frame = ctx.frame("alerts", None);
    let n = ids.len();
    let body = html! {
        h1 { "Acknowledge " (n) " alert" @if n != 1 { "s" } "?" }
        p #bulk-count data-count=(n) { "Each is acknowledged with " code { "tide.ack_alert" } ", with the note below." }
        ul { @for a in &shown { li { strong { (s(a, 0)) } " " (s(a, 1)) " " span.muted { (o(a, 2).as_deref().unwrap_or("")) } } } }
        form.bulk method="post" action="/alerts/ack" {
            (csrf_field(frame.csrf)) (hidden("confirm", "yes"))
            @for id in &ids { (hidden("alert", &id.to_string())) }
            label { "Note " input name="note" maxlength="500" value=(note.clone().unwrap_or_default()); }
            " " button #confirm-ack { "Acknowledge " (n) " alert" @if n != 1 { "s" } }
            " " a href="/alerts" { "Cancel" }
        }
    };
    Ok(done("Acknowledge alerts", &frame, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_fields_are_all_read() {
        let f = Fields::parse(b"csrf=t&run=3&run=1&run=3&confirm=yes&note=");
        assert_eq!(f.ids("run", "run").ok(), Some(vec![1, 3]));
        assert_eq!(f.one("csrf").as_deref(), Some("t"));
        assert_eq!(f.one("note"), None);
        assert!(matches!(
            Fields::parse(b"run=1&run=x").ids("run", "run"),
            Err(Fail::BadRequest(_))
        ));
    }
}

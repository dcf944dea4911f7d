//! The pages and the actions. Each page is one or a few queries of pg_tide's views, tables and
//! functions (row-level security shows the signed-in role its own rows, its teams', or all of
//! them to a tide_admin); each action is one call of a pg_tide function per object, which checks
//! what the role may do. Every query returns text columns; maud escapes them into the page.

mod bulk;
mod lists;
mod overview;
mod run;
mod task;

pub use bulk::{ack_many, replay_many};
pub use lists::{ack, alerts, backfill_action, backfills, checks, dead, recon, resolve_diff};
pub use overview::overview;
pub use run::{run, run_action};
pub use task::task;

use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::Markup;
use serde::Deserialize;
use tokio_postgres::types::ToSql;

use crate::{html, Ctx, Fail};

pub(crate) type Row = Vec<Option<String>>;

/// The rows a list shows on one page; one more is read to know whether there is a next page.
pub(crate) const PAGE: i64 = 100;

/// An id from the path, or a page saying it is not one.
pub(crate) fn id_of(what: &str, raw: &str) -> Result<i64, Fail> {
    raw.parse::<i64>().map_err(|_| {
        let shown: String = raw.chars().take(100).collect();
        Fail::BadRequest(format!("{what} id \"{shown}\" is not a number: the address names a {what} by its id, such as /{what}/42"))
    })
}

/// Runs a query whose columns are all text.
pub(crate) async fn rows(
    ctx: &Ctx,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, Fail> {
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

/// Column `i` of a row, "" for NULL.
pub(crate) fn s(r: &Row, i: usize) -> &str {
    r.get(i).and_then(|v| v.as_deref()).unwrap_or("")
}

/// Column `i` of a row as it is.
pub(crate) fn o(r: &Row, i: usize) -> &Option<String> {
    const NONE: &Option<String> = &None;
    r.get(i).unwrap_or(NONE)
}

pub(crate) fn done(title: &str, frame: &html::Frame, body: Markup) -> Response {
    Html(html::page(title, Some(frame), body).into_string()).into_response()
}

/// Renders an instant as text in a zone, and in UTC: for `html::when`.
pub(crate) const TS: &str = "YYYY-MM-DD HH24:MI:SS";

/// A page number from the query string (0 first; a negative one is the first).
#[derive(Deserialize, Default)]
pub struct PageQuery {
    pub page: Option<i64>,
}

impl PageQuery {
    pub fn number(&self) -> i64 {
        self.page.unwrap_or(0).max(0)
    }
}

/// The rows of one page (read with `LIMIT PAGE + 1`) and whether there is a next page.
pub(crate) fn paged(mut rows: Vec<Row>) -> (Vec<Row>, bool) {
    let more = rows.len() as i64 > PAGE;
    rows.truncate(PAGE as usize);
    (rows, more)
}

pub(crate) fn blank_none(v: &Option<String>) -> Option<String> {
    v.as_ref()
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
}

#[derive(Deserialize)]
pub struct ActionForm {
    pub csrf: Option<String>,
    pub note: Option<String>,
    pub decision: Option<String>,
    pub back: Option<String>,
}

/// Where to go after an action: `back` when it is a path of this console, else `default`.
pub(crate) fn back_path(back: Option<&str>, default: String) -> String {
    match back {
        Some(b) if b.starts_with('/') && !b.starts_with("//") && !b.contains('\\') => b.to_string(),
        _ => default,
    }
}

pub(crate) fn back_to(f: &ActionForm, default: String) -> Response {
    Redirect::to(&back_path(f.back.as_deref(), default)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(back_path(Some("/dead"), "/x".into()), "/dead");
        assert_eq!(back_path(Some("//evil.example/"), "/x".into()), "/x");
        assert_eq!(back_path(Some("https://evil.example/"), "/x".into()), "/x");
        assert_eq!(back_path(None, "/x".into()), "/x");
    }

    #[test]
    fn a_page_reads_one_row_more_than_it_shows() {
        let r: Vec<Row> = (0..=PAGE).map(|i| vec![Some(i.to_string())]).collect();
        let (shown, more) = paged(r);
        assert_eq!(shown.len() as i64, PAGE);
        assert!(more);
        let (shown, more) = paged(vec![vec![None]]);
        assert_eq!(shown.len(), 1);
        assert!(!more);
    }
}

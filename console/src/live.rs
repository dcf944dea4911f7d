//! Live pages: a page that shows runs opens `/events`; the console LISTENs, as the signed-in
//! role on a connection of its own, to `pg_tide_changed` (the tick's fold, at most once per
//! tick, lists the tasks whose runs changed) and `pg_tide_alert` (an alert opened, escalated,
//! reminded or resolved), and tells the browser `changed`; the page then fetches itself again
//! and swaps its `<main>`. Payloads stay in the console: the browser learns only that its page
//! may be stale.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Query;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;

use crate::session::Session;
use crate::{Fail, Signed};

#[derive(Deserialize)]
pub struct LiveQuery {
    /// Only changes of this task matter to the page (a task's or a run's page).
    task: Option<i64>,
}

/// Whether a `pg_tide_changed` payload concerns a page that follows `task` (None: any task).
/// An empty payload means too many tasks changed to list: every page refreshes.
pub fn concerns(payload: &str, task: Option<i64>) -> bool {
    match task {
        None => true,
        Some(t) => {
            payload.is_empty()
                || payload
                    .split(',')
                    .any(|id| id.trim().parse::<i64>() == Ok(t))
        }
    }
}

/// The most live pages one session keeps open at once (each holds a PostgreSQL connection).
pub const MAX_STREAMS: usize = 16;

/// Counts a session's open stream; dropped with it.
struct StreamSlot(Arc<Session>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::SeqCst);
    }
}

pub async fn events(s: Signed, Query(q): Query<LiveQuery>) -> Response {
    if s.session.streams.fetch_add(1, Ordering::SeqCst) >= MAX_STREAMS {
        s.session.streams.fetch_sub(1, Ordering::SeqCst);
        let mut r = Fail::Forbidden(format!(
            "this session already has {MAX_STREAMS} live pages open: close some (a page still works, it just does not update by itself)"
        ))
        .into_response();
        *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        return r;
    }
    let slot = StreamSlot(s.session.clone());
    let (client, mut messages) = match s.app.sessions.listener(&s.session).await {
        Ok(x) => x,
        Err(e) => return Fail::Db(e).into_response(),
    };
    let (tx, rx) = mpsc::channel::<()>(4);
    let task = q.task;
    // The connection is driven here; notifications that concern the page are passed on. The
    // task ends when the browser goes (the receiver is dropped) or the server closes.
    tokio::spawn(async move {
        let _slot = slot;
        loop {
            tokio::select! {
                _ = tx.closed() => break,
                m = futures_util::StreamExt::next(&mut messages) => match m {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        let wanted = n.channel() == "pg_tide_alert" && task.is_none()
                            || n.channel() == "pg_tide_changed" && concerns(n.payload(), task);
                        if wanted && tx.try_send(()).is_err() && tx.is_closed() {
                            break;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => break,
                },
            }
        }
    });
    if let Err(e) = client
        .batch_execute("LISTEN pg_tide_changed; LISTEN pg_tide_alert")
        .await
    {
        return Fail::Db(e).into_response();
    }
    let body = stream::unfold((rx, client), |(mut rx, client)| async move {
        rx.recv().await?;
        let ev: Result<Event, Infallible> = Ok(Event::default().event("changed").data("1"));
        Some((ev, (rx, client)))
    });
    sse(body).into_response()
}

fn sse<S: Stream<Item = Result<Event, Infallible>> + Send + 'static>(s: S) -> impl IntoResponse {
    Sse::new(s).keep_alive(KeepAlive::new().interval(Duration::from_secs(20)))
}

#[cfg(test)]
mod tests {
    use super::concerns;

    #[test]
    fn a_task_page_follows_its_task_only() {
        assert!(concerns("1,12,30", Some(12)));
        assert!(!concerns("1,120,30", Some(12)));
        assert!(
            concerns("", Some(12)),
            "an empty payload: anything may have changed"
        );
        assert!(concerns("5", None));
    }
}

//! `/metrics`: pg_tide's Prometheus exposition (`tide.metrics()`) over HTTP, for a scraper.
//!
//! Read on a connection of its own, read-only, as a role of the operator's choosing (given whole
//! in `--metrics-database`): a member of `tide_monitor`, which reads every owner's figures and
//! pg_tide's own, and nothing else. No sign-in: a scraper has none; keep the listen address to
//! where the scraper is (loopback, or a monitoring network). `--metrics-only` serves this page
//! alone, without the console's web pages.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::sync::Mutex;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The metrics connection: made on the first scrape, made again after it breaks.
pub struct Metrics {
    config: Config,
    tls: MakeRustlsConnect,
    client: Mutex<Option<Client>>,
}

impl Metrics {
    pub fn new(mut config: Config, tls: MakeRustlsConnect) -> Metrics {
        config.application_name("pg_tide-console metrics");
        config.options("-c default_transaction_read_only=on");
        Metrics {
            config,
            tls,
            client: Mutex::new(None),
        }
    }

    async fn scrape(&self) -> Result<String, tokio_postgres::Error> {
        let mut held = self.client.lock().await;
        if held.as_ref().is_none_or(Client::is_closed) {
            let (client, conn) = self.config.connect(self.tls.clone()).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            *held = Some(client);
        }
        let Some(client) = held.as_ref() else {
            unreachable!("connected above");
        };
        match client.query_one("SELECT tide.metrics()", &[]).await {
            Ok(row) => Ok(row.get(0)),
            Err(e) => {
                // Connected again at the next scrape (the server restarted, say).
                *held = None;
                Err(e)
            }
        }
    }
}

/// The exposition, or 503 with the reason (Prometheus then marks the target down: `up` is 0).
pub async fn serve(State(app): State<std::sync::Arc<crate::App>>) -> Response {
    let Some(metrics) = app.metrics.as_ref() else {
        return (
            StatusCode::NOT_FOUND,
            "no metrics here: start pg_tide-console with --metrics-database URL (a role that is a member of tide_monitor)\n",
        )
            .into_response();
    };
    match metrics.scrape().await {
        Ok(text) => (
            [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            text,
        )
            .into_response(),
        Err(e) => {
            let reason = match e.as_db_error() {
                Some(db) => format!("{}: {}", db.code().code(), db.message()),
                None => e.to_string(),
            };
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("pg_tide metrics unavailable: {reason}\n"),
            )
                .into_response()
        }
    }
}

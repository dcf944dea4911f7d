//! A pg_tide external worker in Rust (tokio-postgres): see examples/README.md.

use std::time::Duration;

use futures_util::{stream, StreamExt};
use serde_json::{json, Value};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, Client, NoTls};

/// Why a run failed: a business error goes to the dead letters at once, anything else is
/// retried after its backoff.
enum Failure {
    Business(String),
    Transient(String),
}

struct Run {
    id: i64,
    token: i64,
    attempt: i32,
    key: String,
    payload: Value,
}

/// Does what the payload asks for; returns n squared.
async fn work(db: &Client, run: &Run) -> Result<i64, Failure> {
    let n = run.payload["n"].as_i64().unwrap_or(0);
    if n < 0 {
        return Err(Failure::Business(format!(
            "n must not be negative, got {n}"
        )));
    }
    if run.payload["flaky"] == json!(true) && run.attempt == 1 {
        return Err(Failure::Transient("flaky: fails its first attempt".into()));
    }
    let slow_ms = run.payload["slow_ms"].as_i64().unwrap_or(0);
    let mut done_ms = 250;
    while done_ms <= slow_ms {
        tokio::time::sleep(Duration::from_millis(250)).await;
        // Keeps the lease and records progress (the run's checkpoint).
        db.execute(
            "SELECT tide.heartbeat_run($1, $2, $3)",
            &[&run.id, &run.token, &json!({ "done_ms": done_ms })],
        )
        .await
        .map_err(|e| Failure::Transient(e.to_string()))?;
        done_ms += 250;
    }
    Ok(n * n)
}

async fn run_one(db: &mut Client, worker: &str, run: &Run) -> Result<(), tokio_postgres::Error> {
    let square = match work(db, run).await {
        Ok(square) => square,
        Err(failure) => {
            let (kind, error) = match failure {
                Failure::Business(e) => ("business", e),
                Failure::Transient(e) => ("transient", e),
            };
            db.execute(
                "SELECT tide.fail_run($1, $2, $3, $4)",
                &[&run.id, &run.token, &error, &kind],
            )
            .await?;
            return Ok(());
        }
    };
    // The result and the completion commit together: a stale lease token rolls both back.
    let tx = db.transaction().await?;
    tx.execute(
        "INSERT INTO example_result (key, n, square, worker) VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING",
        &[&run.key, &run.payload["n"].as_i64(), &square, &worker],
    )
    .await?;
    tx.execute("SELECT tide.complete_run($1, $2)", &[&run.id, &run.token])
        .await?;
    tx.commit().await
}

async fn claim(db: &Client, queue: &str, worker: &str) -> Result<Vec<Run>, tokio_postgres::Error> {
    let rows = db
        .query(
            "SELECT run_id, lease_token, attempt, coalesce(dedupe_key, ''), coalesce(payload, '{}')
               FROM tide.claim_runs($1, $2, n => 10, lease => interval '30 seconds')",
            &[&queue, &worker],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Run {
            id: r.get(0),
            token: r.get(1),
            attempt: r.get(2),
            key: r.get(3),
            payload: r.get(4),
        })
        .collect())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres:///postgres".into());
    let queue = std::env::var("QUEUE").unwrap_or_else(|_| "default".into());
    let worker = format!("rust-{}", std::process::id());

    let (mut db, mut connection) = tokio_postgres::connect(&url, NoTls).await?;
    // The connection is driven by its own task; notifications wake the claim loop.
    let ready = std::sync::Arc::new(Notify::new());
    let woken = ready.clone();
    let mut messages = stream::poll_fn(move |cx| connection.poll_message(cx));
    tokio::spawn(async move {
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(_)) => woken.notify_one(),
                Ok(_) => {}
                Err(e) => {
                    eprintln!("connection: {e}");
                    break;
                }
            }
        }
    });
    db.batch_execute("LISTEN pg_tide_ready").await?;

    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    println!("{worker}: claiming from queue {queue}");
    'claiming: loop {
        let runs = claim(&db, &queue, &worker).await?;
        for run in &runs {
            // The run in hand is finished; a signal is seen before the next one.
            run_one(&mut db, &worker, run).await?;
            tokio::select! {
                biased;
                _ = term.recv() => break 'claiming,
                _ = interrupt.recv() => break 'claiming,
                _ = std::future::ready(()) => {}
            }
        }
        if runs.is_empty() {
            // Wake on a notification, or after 2 seconds (one can be missed).
            tokio::select! {
                _ = term.recv() => break,
                _ = interrupt.recv() => break,
                _ = ready.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
        }
    }
    println!("{worker}: stopped");
    Ok(())
}

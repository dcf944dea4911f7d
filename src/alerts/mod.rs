//! Alerts: what opens, escalates and resolves them (`alerts.sql`, evaluated by the tick), and
//! how they leave the database: channels and routes (`delivery.sql`), the delivery worker that
//! sends each alert event once, with retries (`delivery`), and what a webhook or an e-mail looks
//! like and how it is sent (`notify`, no pgrx).

pub(crate) mod delivery;
pub mod notify;

// Alert delivery by pg_tide's own worker: tide.create_channel (webhook, email), tide.ack_alert.
::pgrx::extension_sql_file!("delivery.sql", name = "delivery", requires = ["effects"]);
// Alerts: their kinds, causes, routes and evaluation (between heartbeat checks and run log lines,
// src/monitor/).
::pgrx::extension_sql_file!("alerts.sql", name = "alerts", requires = ["checks"]);

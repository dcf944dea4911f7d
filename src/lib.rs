//! pg_tide: reliable scheduled work inside PostgreSQL.
//!
//! This file is the table of contents. Pure logic (no pgrx) lives in `calendar/` and
//! `error.rs`; the SQL surface lives in the other modules, one concern each.

// Pure logic, unit-tested with plain `cargo test`.
pub mod calendar;
pub mod error;
pub mod jsontext;
pub mod lockkey;
pub mod misfire;
pub mod prometheus;
pub mod retry;
pub mod rules;

// The security boundary: who is calling (public functions run as the extension's owner), and
// user code run sealed as its owner.
mod caller;
mod sealed;

// Alert messages and their sending (no pgrx).
pub mod notify;

// The SQL surface.
mod catalog;
mod jsonarg;
mod ledger;
mod metrics;
mod monitor;
mod pgtime;
mod pgversion;
mod queue_count;
mod roles;
mod run_change;
mod share;
mod sqlerr;
mod tick;
mod timeline;

// Settings and background workers.
mod bgw;
mod command;
mod delivery;
mod import;
mod settings;
mod wake;
mod worker;

::pgrx::pg_module_magic!(name, version);

/// Schema `tide`, made known to pgrx so that the functions written in Rust are created in it by
/// name (`schema = "tide"`) rather than wherever the installing session's search_path points.
/// sql/schema.sql creates it (without IF NOT EXISTS: a schema someone made beforehand makes
/// CREATE EXTENSION fail rather than be adopted).
#[pgrx::pg_schema]
mod tide {}

// Tables, types, RLS policies and grants; the Rust functions refer to them at run time.
::pgrx::extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);
// The run ledger: runs, attempts, history and the state-transition trigger.
// (Its history rows default their actor to tide._caller(), defined in src/caller.rs.)
::pgrx::extension_sql_file!(
    "../sql/ledger.sql",
    name = "ledger",
    requires = ["schema", caller::caller_sql]
);
// Claiming, completion, failure, replay: PL/pgSQL over the ledger (see the file for why).
::pgrx::extension_sql_file!(
    "../sql/execution.sql",
    name = "execution",
    requires = ["ledger"]
);
// Deduplicated side effects (an outbox): tide.create_effect, delivered by workers per channel.
::pgrx::extension_sql_file!(
    "../sql/effects.sql",
    name = "effects",
    requires = ["execution"]
);
// Alert delivery by pg_tide's own worker: tide.create_channel (webhook, email), tide.ack.
::pgrx::extension_sql_file!(
    "../sql/delivery.sql",
    name = "delivery",
    requires = ["effects"]
);
// Steps inside a run, skipped by later attempts and reruns once done.
::pgrx::extension_sql_file!("../sql/steps.sql", name = "steps", requires = ["execution"]);
// Per-object locks, overlap control and serial groups: what a claim checks for gated runs.
::pgrx::extension_sql_file!("../sql/locks.sql", name = "locks", requires = ["execution"]);
// Event tasks: tide.emit, tide.create_emit_trigger.
::pgrx::extension_sql_file!("../sql/events.sql", name = "events", requires = ["locks"]);
// Long runs: the checkpoint, pause_run / resume_run / cancel_run.
::pgrx::extension_sql_file!("../sql/long.sql", name = "long", requires = ["execution"]);
// Queues with limits: tide.create_queue, pause_queue, resume_queue, drop_queue; the claim's
// queue admission and the retry budget.
::pgrx::extension_sql_file!("../sql/queues.sql", name = "queues", requires = ["locks"]);
// Moving over from pg_cron: tide.import_pg_cron.
::pgrx::extension_sql_file!(
    "../sql/import.sql",
    name = "import",
    requires = ["execution"]
);
// Predefined roles' grants: tide.grant, tide.revoke; who may claim, emit, enqueue.
::pgrx::extension_sql_file!(
    "../sql/roles.sql",
    name = "roles",
    requires = ["execution", caller::may_act, caller::caller_is_superuser]
);
// Roles sharing a database: fair share of the executors, each role's limits, a role's end.
::pgrx::extension_sql_file!("../sql/share.sql", name = "share", requires = ["monitor"]);
// One-off and delayed jobs: tide.enqueue.
::pgrx::extension_sql_file!("../sql/jobs.sql", name = "jobs", requires = ["locks"]);
// Backfills: tide.backfill, its plan, canary, batches and sample check; pause, resume, cancel.
::pgrx::extension_sql_file!(
    "../sql/backfill.sql",
    name = "backfill",
    requires = ["queues", "jobs", "long"]
);
// Reconciliation: tide.reconcile, its comparison, differences, compensation and resolve_diff.
::pgrx::extension_sql_file!("../sql/recon.sql", name = "recon", requires = ["backfill"]);
// Monitoring: health, heartbeat checks, alerts, metrics, run log lines, explain, retention.
::pgrx::extension_sql_file!(
    "../sql/monitor.sql",
    name = "monitor",
    requires = [
        "effects",
        "delivery",
        "roles",
        "steps",
        "locks",
        "events",
        "long",
        "jobs",
        "queues",
        "backfill",
        "recon",
        run_change::history_unwritten
    ]
);
// Hourly counters for charts (tide.run_hours) and one task's health (tide.task_health).
::pgrx::extension_sql_file!("../sql/charts.sql", name = "charts", requires = ["monitor"]);
// The samples of tide.metrics() as rows (the view tide.metric).
::pgrx::extension_sql_file!(
    "../sql/metric.sql",
    name = "metric",
    requires = ["monitor", metrics::metric_samples]
);
// Comments on the generated functions, once they exist.
::pgrx::extension_sql_file!("../sql/comments.sql", name = "comments", finalize);

/// Refuses to load other than by shared_preload_libraries; defines the settings, installs the
/// caller hook, registers the scheduler, executor and delivery workers and the shared memory.
#[pgrx::pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // Loaded by CREATE EXTENSION (or LOAD) rather than at server start: nothing could ever run
    // or alert, and the settings that take effect at server start cannot be defined now.
    // SAFETY: reads a flag the postmaster sets while loading shared_preload_libraries.
    if !unsafe { pgrx::pg_sys::process_shared_preload_libraries_in_progress } {
        pgrx::pg_sys::panic::ErrorReport::new(
            pgrx::PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "pg_tide must be loaded by shared_preload_libraries",
            "pg_tide",
        )
        .set_detail("Without it no scheduler, executor or delivery worker runs: nothing would ever run or alert.")
        .set_hint("add pg_tide to shared_preload_libraries in postgresql.conf, set pg_tide.database, restart PostgreSQL, then CREATE EXTENSION pg_tide again")
        .report(pgrx::PgLogLevel::ERROR);
    }
    // Clients get an error's message, SQLSTATE, detail and hint, never a Rust backtrace: pgrx
    // captures one into the detail of every error it reports when RUST_BACKTRACE is set in the
    // server's environment. RUST_LIB_BACKTRACE=0 turns the capture off (it overrides
    // RUST_BACKTRACE for captured backtraces); set here, in the postmaster, every process it
    // starts inherits it.
    std::env::set_var("RUST_LIB_BACKTRACE", "0");
    settings::define();
    caller::install();
    roles::install();
    worker::register();
    queue_count::init_shared();
    delivery::init_shared();
    wake::init_shared();
    command::init_shared();
    monitor::init_shared();
}

#[cfg(any(test, feature = "pg_test"))]
mod sql_tests;

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        // The tests' database is not pg_tide.database: nothing runs there by itself.
        vec![
            "shared_preload_libraries = 'pg_tide'",
            "pg_tide.allow_unscheduled = on",
        ]
    }
}

//! pg_tide: reliable scheduled work inside PostgreSQL.
//!
//! This file is the table of contents: one folder per concept, each with its Rust and its SQL
//! (tables, functions, triggers, policies) side by side; see docs/architecture.md for the
//! concepts and the life of a run through them.

// Foundations: errors and their SQLSTATEs, JSON and time conversions, what differs between
// PostgreSQL versions.
pub mod base;
// The time engine: cron, zones, DST, business windows, misfires (pure Rust), and its SQL face.
pub mod calendar;
// The `pg_tide.*` settings.
mod settings;
// What every background worker does: attach, transactions, waits, exit.
mod bgw;

// Tasks: their definitions, rules and versions (the schema's tables are created here first).
pub mod tasks;
// Runs: the ledger, their history, claiming, completion, failure, retries, steps, long runs.
pub mod runs;
// Ways runs come: events (tide.emit), jobs (tide.enqueue), backfills, reconciliations.
mod backfill;
mod events;
mod jobs;
mod recon;
// What gates a run: per-object locks, overlap and serial groups; queues and their limits.
pub mod locks;
mod queues;
// Side effects recorded once (an outbox for external workers).
mod effects;
// The scheduler: the tick, and waking the workers when there is work.
mod scheduler;
// The background workers: scheduler and executor loops, command workers, shared helpers.
mod workers;
// Monitoring: health, checks, alerts, metrics, explain, retention.
pub mod monitor;
// Alerts leaving the database: webhooks and e-mail, by the delivery worker.
pub mod alerts;
// Roles: who is calling, user code run sealed as its owner, grants, fair share.
mod security;
// Moving over from pg_cron.
mod import;

::pgrx::pg_module_magic!(name, version);

/// Schema `tide`, made known to pgrx so that the functions written in Rust are created in it by
/// name (`schema = "tide"`) rather than wherever the installing session's search_path points.
/// src/tasks/schema.sql creates it (without IF NOT EXISTS: a schema someone made beforehand makes
/// CREATE EXTENSION fail rather than be adopted).
#[pgrx::pg_schema]
mod tide {}

// Comments on the generated functions, once they exist.
::pgrx::extension_sql_file!("comments.sql", name = "comments", finalize);

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
    security::caller::install();
    security::roles::install();
    workers::register();
    queues::count::init_shared();
    alerts::delivery::init_shared();
    scheduler::wake::init_shared();
    workers::command::init_shared();
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

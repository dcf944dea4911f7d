//! What every background worker of pg_tide does, whatever its loop: attach to the database
//! with PostgreSQL's signal handlers, run a short transaction or a subtransaction that catches
//! errors, wait on the latch, and exit so that the postmaster starts it again. The loops are in
//! src/workers/mod.rs (scheduler, executors), src/alerts/delivery.rs and src/scheduler/wake.rs
//! (notifier); the command workers in src/workers/command.rs.

use std::ffi::c_int;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use pgrx::bgworkers::{BackgroundWorker, SignalWakeFlags};
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::base::sqlerr::OrRaise;
use crate::settings;

extern "C-unwind" {
    /// PostgreSQL's SIGTERM handler (tcop/postgres.c): sets ProcDiePending and the latch.
    fn die(postgres_signal_arg: c_int);
    /// PostgreSQL's SIGINT handler (tcop/postgres.c): sets QueryCancelPending and the latch.
    fn StatementCancelHandler(postgres_signal_arg: c_int);
}

pub(crate) fn interval() -> Duration {
    Duration::from_millis(u64::try_from(settings::TICK_INTERVAL.get()).unwrap_or(1000))
}

/// Exits (the postmaster died) with code 1, as a FATAL error would.
pub(crate) fn exit_for_restart() -> ! {
    // SAFETY: ends the process the way a FATAL error would, running exit callbacks.
    unsafe { crate::base::pgversion::proc_exit(1) }
}

/// Waits for the next round; a pending SIGTERM ends the worker here (FATAL, exit code 1).
/// False means the postmaster died.
pub(crate) fn wait(timeout: Duration) -> bool {
    let alive = BackgroundWorker::wait_latch(Some(timeout));
    if BackgroundWorker::sighup_received() {
        // SAFETY: the documented way for a worker to reload postgresql.conf on SIGHUP.
        unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
    }
    alive
}

pub(crate) fn start(name: &str) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    // SAFETY: installs PostgreSQL's standard SIGTERM and SIGINT handlers, as regular backends
    // have: pg_cancel_backend (tide.cancel_run of a running SQL run) interrupts the command
    // being run, and only that.
    unsafe {
        crate::base::pgversion::pqsignal(pg_sys::SIGTERM, Some(die));
        crate::base::pgversion::pqsignal(pg_sys::SIGINT, Some(StatementCancelHandler));
    }
    BackgroundWorker::connect_worker_to_spi(Some(&settings::database()), None);
    // A worker's session lives as long as the server: a generic plan it kept from when the
    // tables were small (a fresh install) would outlive every ANALYZE (which does not
    // invalidate cached plans). One kept for an UPDATE of the tick, a nested loop over every
    // run made for a small tide.pending, ran for minutes once both had grown. Plans are made
    // for each execution instead, with the statistics of the day. (The claim paths keep
    // generic plans by their own SET clauses; the owners' code runs with the defaults, under
    // a RESET ALL of its own.)
    let _ = in_transaction("settings", || {
        Spi::run("SET plan_cache_mode = force_custom_plan").or_raise("pg_tide worker");
    });
    log!("{name} started in database \"{}\"", settings::database());
}

/// Runs `body` in its own transaction. An error is logged and the transaction rolled back; the
/// worker goes on with the error's message.
pub(crate) fn in_transaction<R>(what: &str, body: impl FnOnce() -> R) -> Result<R, String> {
    // SAFETY: the standard sequence for a worker's own transaction, as in worker_spi.c.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    // The commit is inside the try: an error it raises (a deferred constraint, a notification
    // queue that is full) fails this transaction alone, and the worker goes on.
    let result = PgTryBuilder::new(AssertUnwindSafe(move || {
        let r = body();
        // SAFETY: the end of the sequence above, after success.
        unsafe {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        }
        Ok(r)
    }))
    .catch_others(|e| {
        let message = caught_message(&e);
        warning!("pg_tide: {what} failed: {message}");
        Err(message)
    })
    .execute();
    if result.is_err() {
        // SAFETY: after an error, in the body or at the commit, abort (which also pops the
        // snapshot and restores the user id and GUC state) so the next transaction starts clean.
        unsafe { pg_sys::AbortCurrentTransaction() };
    }
    result
}

/// Runs `body` in a subtransaction of the caller's transaction: an error in it (a PostgreSQL
/// error or a Rust panic) rolls back what it did and is returned as its message, and the caller
/// goes on (each task the tick fires and each of its steps, an executor's chained claim).
pub(crate) fn isolated<R>(body: impl FnOnce() -> R) -> Result<R, String> {
    // SAFETY: the sequence PL/pgSQL uses for an exception block: remember the memory context and
    // resource owner, begin, and after release or rollback go back to both.
    let (context, owner) = unsafe {
        let saved = (pg_sys::CurrentMemoryContext, pg_sys::CurrentResourceOwner);
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(saved.0);
        saved
    };
    let result = PgTryBuilder::new(AssertUnwindSafe(|| Ok(body())))
        .catch_others(|e| Err(caught_message(&e)))
        .execute();
    // SAFETY: ends the subtransaction begun above, committing or rolling back.
    unsafe {
        if result.is_ok() {
            pg_sys::ReleaseCurrentSubTransaction();
        } else {
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        }
        pg_sys::MemoryContextSwitchTo(context);
        pg_sys::CurrentResourceOwner = owner;
    }
    result
}

/// The message of an error caught by `PgTryBuilder`.
fn caught_message(e: &pg_sys::panic::CaughtError) -> String {
    match e {
        pg_sys::panic::CaughtError::PostgresError(r)
        | pg_sys::panic::CaughtError::ErrorReport(r)
        | pg_sys::panic::CaughtError::RustPanic { ereport: r, .. } => r.message().to_string(),
    }
}

/// Whether this database has the extension (it may be created or dropped at any time). A
/// catalog lookup rather than a query: an executor woken by a fire asks it before it claims.
fn installed() -> bool {
    // SAFETY: an index lookup in pg_extension, inside the caller's transaction.
    unsafe { pg_sys::get_extension_oid(c"pg_tide".as_ptr(), true) != pg_sys::InvalidOid }
}

/// Whether this round has work to look for: enabled, not a standby, the extension present.
pub(crate) fn may_work() -> bool {
    // SAFETY: reads shared recovery state.
    settings::ENABLED.get()
        && !unsafe { pg_sys::RecoveryInProgress() }
        && in_transaction("extension check", installed).unwrap_or(false)
}

//! The background workers: one scheduler, `pg_tide.executors` executors.
//!
//! Both are thin loops: wait on the latch, open a short transaction, call one SQL function,
//! record errors, loop. All logic lives in SQL-callable functions (`tide.tick`, `tide._claim`,
//! `tide._execute`, `tide._check_ready`) that tests call directly.
//!
//! Restart policy: registered with a restart time. SIGTERM (`pg_terminate_backend`, or a
//! shutdown) is handled by PostgreSQL's own `die`: at the next interrupt check — also inside a
//! running command, so a fast shutdown never waits for a long one — the worker ends with FATAL,
//! exit code 1, which the postmaster restarts after that time. Exit code 0 would unregister the
//! worker for good. During shutdown nothing is restarted anyway; a command cut short leaves its
//! run to be taken back when its lease expires.

use std::ffi::c_int;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::settings;
use crate::sqlerr::OrRaise;

/// Where worker errors are reported from.
const F: &str = "pg_tide worker";

const RESTART: Duration = Duration::from_secs(1);
/// TimeoutId STATEMENT_TIMEOUT from utils/timeout.h (PostgreSQL 13 to 18).
const STATEMENT_TIMEOUT: c_int = 3;

extern "C-unwind" {
    fn enable_timeout_after(id: c_int, delay_ms: c_int);
    fn disable_timeout(id: c_int, keep_indicator: bool);
    /// PostgreSQL's SIGTERM handler (tcop/postgres.c): sets ProcDiePending and the latch.
    fn die(postgres_signal_arg: c_int);
}

/// Registers the workers; called from `_PG_init` while shared_preload_libraries loads.
pub fn register() {
    BackgroundWorkerBuilder::new("pg_tide scheduler")
        .set_type("pg_tide scheduler")
        .set_library("pg_tide")
        .set_function("pg_tide_scheduler_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(RESTART))
        .load();
    for i in 1..=settings::EXECUTORS.get() {
        BackgroundWorkerBuilder::new(&format!("pg_tide executor {i}"))
            .set_type("pg_tide executor")
            .set_library("pg_tide")
            .set_function("pg_tide_executor_main")
            .set_argument(Some(pg_sys::Datum::from(i)))
            .enable_spi_access()
            .set_start_time(BgWorkerStartTime::RecoveryFinished)
            .set_restart_time(Some(RESTART))
            .load();
    }
}

fn interval() -> Duration {
    Duration::from_millis(u64::try_from(settings::TICK_INTERVAL.get()).unwrap_or(1000))
}

/// Exits (the postmaster died) with code 1, as a FATAL error would.
fn exit_for_restart() -> ! {
    // SAFETY: ends the process the way a FATAL error would, running exit callbacks.
    unsafe { pg_sys::proc_exit(1) }
}

/// Waits for the next round; a pending SIGTERM ends the worker here (FATAL, exit code 1).
/// False means the postmaster died.
fn wait(timeout: Duration) -> bool {
    let alive = BackgroundWorker::wait_latch(Some(timeout));
    if BackgroundWorker::sighup_received() {
        // SAFETY: the documented way for a worker to reload postgresql.conf on SIGHUP.
        unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
    }
    alive
}

fn start(name: &str) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    // SAFETY: installs PostgreSQL's standard SIGTERM handler, as regular backends have.
    unsafe {
        pg_sys::pqsignal(pg_sys::SIGTERM as c_int, Some(die));
    }
    BackgroundWorker::connect_worker_to_spi(Some(&settings::database()), None);
    log!("{name} started in database \"{}\"", settings::database());
}

/// Runs `body` in its own transaction. An error is logged and the transaction rolled back; the
/// worker goes on.
fn in_transaction<R>(what: &str, body: impl FnOnce() -> R) -> Option<R> {
    // SAFETY: the standard sequence for a worker's own transaction, as in worker_spi.c.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let result = PgTryBuilder::new(AssertUnwindSafe(move || Some(body())))
        .catch_others(|e| {
            let message = match &e {
                pg_sys::panic::CaughtError::PostgresError(r)
                | pg_sys::panic::CaughtError::ErrorReport(r)
                | pg_sys::panic::CaughtError::RustPanic { ereport: r, .. } => {
                    r.message().to_string()
                }
            };
            warning!("pg_tide: {what} failed: {message}");
            None
        })
        .execute();
    // SAFETY: commit after success; after an error, abort (which also pops the snapshot and
    // restores the user id and timeouts' state) so the next transaction starts clean.
    unsafe {
        if result.is_some() {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        } else {
            disable_timeout(STATEMENT_TIMEOUT, false);
            pg_sys::AbortCurrentTransaction();
        }
    }
    result
}

/// Whether this database has the extension (it may be created or dropped at any time).
fn installed() -> bool {
    Spi::get_one::<bool>("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_tide')")
        .or_raise(F)
        .unwrap_or(false)
}

/// Whether this round has work to look for: enabled, not a standby, the extension present.
fn may_work() -> bool {
    // SAFETY: reads shared recovery state.
    settings::ENABLED.get()
        && !unsafe { pg_sys::RecoveryInProgress() }
        && in_transaction("extension check", installed).unwrap_or(false)
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_tide_scheduler_main(_arg: pg_sys::Datum) {
    start("pg_tide scheduler");
    while wait(interval()) {
        if !may_work() {
            continue;
        }
        in_transaction("tick", || {
            let counts = Spi::get_one::<pgrx::JsonB>("SELECT tide.tick()").or_raise(F);
            debug1!("pg_tide tick: {:?}", counts.map(|j| j.0));
        });
    }
    exit_for_restart();
}

/// One claimed SQL run: what the executor needs to run it as its owner.
struct Claimed {
    run_id: i64,
    token: i64,
    owner: String,
    timeout_ms: i32,
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_tide_executor_main(arg: pg_sys::Datum) {
    let number = arg.value();
    let name = format!("pg_tide executor {number}");
    start(&name);
    while wait(interval()) {
        if !may_work() {
            continue;
        }
        // Work until there is nothing left, then sleep until the next poll. Both kinds of work
        // are tried each round, so neither starves the other.
        loop {
            let checked = in_transaction("readiness check", check_one).unwrap_or(false);
            let ran = execute_one(&name);
            if !(checked || ran) {
                break;
            }
        }
    }
    exit_for_restart();
}

/// Claims one SQL run (committed at once, so the attempt is on record even if the command
/// kills the process), then runs it in a second transaction.
fn execute_one(worker: &str) -> bool {
    // Inside the transaction, an error (SPI or a row that does not fit) rolls the claim back.
    let claimed = in_transaction("claim", || {
        let rows = Spi::connect_mut(|client| {
            client
                .update(
                    "SELECT c.run_id, c.lease_token, c.owner::text,
                            (extract(epoch FROM c.timeout) * 1000)::bigint
                       FROM tide._claim('sql', NULL, $1, 1, NULL) c",
                    None,
                    &[worker.into()],
                )
                .or_raise(F)
                .next()
                .map(|row| {
                    (
                        row.get::<i64>(1).or_raise(F),
                        row.get::<i64>(2).or_raise(F),
                        row.get::<String>(3).or_raise(F),
                        row.get::<i64>(4).or_raise(F),
                    )
                })
        });
        match rows {
            Some((Some(run_id), Some(token), Some(owner), timeout_ms)) => Some(Claimed {
                run_id,
                token,
                owner,
                timeout_ms: timeout_ms
                    .map_or(3_600_000, |ms| i32::try_from(ms).unwrap_or(i32::MAX)),
            }),
            _ => None,
        }
    })
    .flatten();
    let Some(run) = claimed else {
        return false;
    };
    // One transaction per call; a long task's command is called once per batch, each batch in
    // its own transaction, until it returns no checkpoint (or is paused, cancelled, fenced).
    loop {
        let outcome = in_transaction("run", || {
            as_owner(&run.owner, run.timeout_ms, || {
                Spi::get_one_with_args::<String>(
                    "SELECT tide._execute($1, $2)",
                    &[run.run_id.into(), run.token.into()],
                )
                .or_raise(F)
            })
        })
        .flatten()
        .flatten();
        debug1!("pg_tide: run {} {:?}", run.run_id, outcome);
        let Some(delay) = outcome.as_deref().and_then(more_after) else {
            break;
        };
        if !sleep(delay) {
            exit_for_restart();
        }
    }
    true
}

/// The delay before the next batch of a long task, from `tide._execute`'s answer `more <ms>`.
fn more_after(outcome: &str) -> Option<Duration> {
    let ms = outcome.strip_prefix("more ")?.trim().parse::<u64>().ok()?;
    Some(Duration::from_millis(ms))
}

/// Sleeps `delay` (a pending SIGTERM ends the worker at the next transaction). False means the
/// postmaster died.
fn sleep(delay: Duration) -> bool {
    let until = std::time::Instant::now() + delay;
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return true;
        }
        if !wait(left) {
            return false;
        }
    }
}

/// Evaluates one due readiness check; true if there was one.
fn check_one() -> bool {
    let due = Spi::connect_mut(|client| {
        client
            .update(
                "SELECT run_id, owner::text,
                        (extract(epoch FROM timeout) * 1000)::bigint FROM tide._claim_check()",
                None,
                &[],
            )
            .or_raise(F)
            .next()
            .map(|row| {
                (
                    row.get::<i64>(1).or_raise(F),
                    row.get::<String>(2).or_raise(F),
                    row.get::<i64>(3).or_raise(F),
                )
            })
    });
    let Some((Some(run_id), Some(owner), timeout_ms)) = due else {
        return false;
    };
    let timeout_ms = timeout_ms.map_or(60_000, |ms| i32::try_from(ms).unwrap_or(60_000));
    as_owner(&owner, timeout_ms, || {
        let ready =
            Spi::get_one_with_args::<bool>("SELECT tide._check_ready($1)", &[run_id.into()])
                .or_raise(F);
        debug1!("pg_tide: readiness of run {run_id}: {ready:?}");
    });
    true
}

/// Runs `body` as role `owner`, as a SECURITY DEFINER function would: the user id is switched
/// with SECURITY_LOCAL_USERID_CHANGE, so the user's SQL cannot SET ROLE or RESET ROLE back to
/// the worker's superuser. A statement timeout bounds it.
fn as_owner<R>(owner: &str, timeout_ms: i32, body: impl FnOnce() -> R) -> Option<R> {
    let Ok(role) = std::ffi::CString::new(owner) else {
        return None;
    };
    // SAFETY: get_role_oid with missing_ok returns InvalidOid for a dropped role.
    let oid = unsafe { pg_sys::get_role_oid(role.as_ptr(), true) };
    if oid == pg_sys::InvalidOid {
        warning!("pg_tide: role \"{owner}\" no longer exists; its runs cannot be executed");
        return None;
    }
    let mut saved_user = pg_sys::InvalidOid;
    let mut saved_context: c_int = 0;
    // SAFETY: save, switch and restore the user id; an error in between aborts the transaction,
    // and transaction abort restores the saved user id itself.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
        pg_sys::SetUserIdAndSecContext(
            oid,
            saved_context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as c_int,
        );
        enable_timeout_after(STATEMENT_TIMEOUT, timeout_ms.max(1));
    }
    let result = body();
    // SAFETY: as above.
    unsafe {
        disable_timeout(STATEMENT_TIMEOUT, false);
        pg_sys::SetUserIdAndSecContext(saved_user, saved_context);
    }
    Some(result)
}

//! Top-level commands (`tide.schedule(..., top_level => true)`): what pg_cron runs and a
//! function cannot — `VACUUM`, `CREATE INDEX CONCURRENTLY`, `CALL` of a procedure that commits,
//! several statements in one string.
//!
//! An executor that claims such a run does not execute it in its own transaction. It starts a
//! background worker for that one run and waits for it to exit. The worker:
//! 1. reads the run's command and owner (`tide._top_level_start`: nothing when the lease was
//!    lost meanwhile);
//! 2. runs the command the way `psql -c` runs a script, as PostgreSQL's simple-query protocol
//!    runs a statement: each statement parsed, planned and run through a portal at top level,
//!    in its own transaction, so `VACUUM` and friends find no transaction block around them.
//!    It runs as the task's owner, switched to the way a security-definer function switches
//!    (`SECURITY_LOCAL_USERID_CHANGE`: no `SET ROLE`, no `SET SESSION AUTHORIZATION`, no
//!    `DISCARD ALL`), bounded by the task's timeout over all its statements, with the run
//!    context (`tide.run_id()` ...). The first error stops it; statements before it stay
//!    committed.
//! 3. resets every setting the command made and records the outcome (`tide._top_level_finish`:
//!    completed, or failed with the error's SQLSTATE deciding retry or dead letter), then exits:
//!    whatever the command left in its session (temporary tables, advisory locks, settings)
//!    ends with the process.
//!
//! At least once: the command's own commits are not the run's. If the worker dies mid-command
//! (or the server does), the run is failed as lost by its executor (or taken back when its lease
//! expires) and retried from the first statement, so a top-level command should be safe to run
//! again (`VACUUM`, `CREATE INDEX CONCURRENTLY IF NOT EXISTS`, `REFRESH MATERIALIZED VIEW`).

use std::ffi::{c_int, c_long, CString};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::sqlerr::OrRaise;

const F: &str = "pg_tide top-level command";

/// TimeoutId STATEMENT_TIMEOUT from utils/timeout.h (PostgreSQL 13 to 18).
const STATEMENT_TIMEOUT: c_int = 3;

extern "C-unwind" {
    fn enable_timeout_after(id: c_int, delay_ms: c_int);
    fn disable_timeout(id: c_int, keep_indicator: bool);
    fn die(postgres_signal_arg: c_int);
}

/// Runs a claimed top-level run in a worker of its own and waits for the worker to exit.
/// An error means no worker could be started.
pub fn run(run_id: i64, token: i64) -> Result<(), String> {
    let worker = BackgroundWorkerBuilder::new(&format!("pg_tide top-level run {run_id}"))
        .set_type("pg_tide top-level command")
        .set_library("pg_tide")
        .set_function("pg_tide_top_level_main")
        .set_argument(Some(pg_sys::Datum::from(run_id)))
        .set_extra(&token.to_string())
        .enable_spi_access()
        // SAFETY: reads this process's pid.
        .set_notify_pid(unsafe { pg_sys::MyProcPid })
        .load_dynamic()
        .map_err(|_| {
            "no background worker slot was free to run the top-level command (raise max_worker_processes)"
                .to_string()
        })?;
    worker.wait_for_shutdown().map_err(|status| {
        format!("the top-level command's worker could not be followed: {status:?}")
    })
}

/// What the command did: statements run, the error that stopped it, what it reported.
struct Outcome {
    statements: i32,
    error: Option<(String, String)>,
    reported: (Option<i64>, Option<i64>),
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_tide_top_level_main(arg: pg_sys::Datum) {
    let run_id = arg.value() as i64;
    let token: i64 = BackgroundWorker::get_extra().parse().unwrap_or(0);
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    // SAFETY: as in every backend, SIGTERM ends the process at the next interrupt check.
    unsafe {
        pg_sys::pqsignal(pg_sys::SIGTERM as c_int, Some(die));
    }
    BackgroundWorker::connect_worker_to_spi(Some(&crate::settings::database()), None);
    let start = crate::worker::in_transaction("top-level start", || {
        Spi::connect(|client| {
            client
                .select(
                    "SELECT command, owner::text, timeout_ms FROM tide._top_level_start($1, $2)",
                    None,
                    &[run_id.into(), token.into()],
                )
                .or_raise(F)
                .next()
                .map(|row| {
                    (
                        row.get::<String>(1).or_raise(F).unwrap_or_default(),
                        row.get::<String>(2).or_raise(F).unwrap_or_default(),
                        row.get::<i32>(3).or_raise(F).unwrap_or(3_600_000),
                    )
                })
        })
    });
    let Ok(Some((command, owner, timeout_ms))) = start else {
        // Fenced (the lease was lost) or gone: nothing to run.
        // SAFETY: a clean exit of a worker that is never restarted.
        unsafe { pg_sys::proc_exit(0) }
    };
    let outcome = execute(run_id, &command, &owner, timeout_ms);
    let (sqlstate, message) = match outcome.error {
        Some((s, m)) => (Some(s), Some(m)),
        None => (None, None),
    };
    let recorded = crate::worker::in_transaction("top-level outcome", || {
        // Whatever the command set in this session is undone before pg_tide's own SQL runs.
        // SAFETY: RESET ALL, inside a transaction, as the superuser again.
        unsafe { pg_sys::ResetAllOptions() };
        Spi::get_one_with_args::<String>(
            "SELECT tide._top_level_finish($1, $2, $3, $4, $5, $6, $7)",
            &[
                run_id.into(),
                token.into(),
                sqlstate.clone().into(),
                message.clone().into(),
                outcome.statements.into(),
                outcome.reported.0.into(),
                outcome.reported.1.into(),
            ],
        )
        .or_raise(F)
    });
    debug1!("pg_tide: top-level run {run_id}: {recorded:?}");
    // SAFETY: a clean exit of a worker that is never restarted.
    unsafe { pg_sys::proc_exit(0) }
}

/// The SQLSTATE of an error code, as five characters.
fn sqlstate_text(code: PgSqlErrorCode) -> String {
    let mut n = code as isize as i64;
    let mut out = String::with_capacity(5);
    for _ in 0..5 {
        out.push(char::from(b'0' + u8::try_from(n & 0x3F).unwrap_or(0)));
        n >>= 6;
    }
    out
}

fn caught(e: &pg_sys::panic::CaughtError) -> (String, String) {
    match e {
        pg_sys::panic::CaughtError::PostgresError(r)
        | pg_sys::panic::CaughtError::ErrorReport(r)
        | pg_sys::panic::CaughtError::RustPanic { ereport: r, .. } => {
            (sqlstate_text(r.sql_error_code()), r.message().to_string())
        }
    }
}

/// Runs the command's statements one transaction each, as `owner`, within `timeout_ms` in all.
fn execute(run_id: i64, command: &str, owner: &str, timeout_ms: i32) -> Outcome {
    let mut outcome = Outcome {
        statements: 0,
        error: None,
        reported: (None, None),
    };
    let Ok(text) = CString::new(command) else {
        outcome.error = Some(("22021".into(), "the command contains a NUL byte".into()));
        return outcome;
    };
    let deadline = Instant::now() + Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0));
    // The parse trees outlive the statements' transactions: they live in a context of their own.
    let context = unsafe {
        pg_sys::AllocSetContextCreateInternal(
            pg_sys::TopMemoryContext,
            c"pg_tide top-level command".as_ptr(),
            pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
        )
    };
    let parsed = crate::worker::in_transaction("top-level parse", || {
        let owner_oid = unsafe {
            let name = CString::new(owner).unwrap_or_default();
            pg_sys::get_role_oid(name.as_ptr(), false)
        };
        PgTryBuilder::new(AssertUnwindSafe(|| {
            // SAFETY: parses into our own context, as exec_simple_query parses into its own.
            let list = unsafe {
                let old = pg_sys::MemoryContextSwitchTo(context);
                let list = pg_sys::pg_parse_query(text.as_ptr());
                pg_sys::MemoryContextSwitchTo(old);
                list
            };
            Ok((list, owner_oid))
        }))
        .catch_others(|e| Err(caught(&e)))
        .execute()
    });
    let (list, owner_oid) = match parsed {
        Ok(Ok(found)) => found,
        Ok(Err(error)) => {
            outcome.error = Some(error);
            return outcome;
        }
        Err(message) => {
            outcome.error = Some(("XX000".into(), message));
            return outcome;
        }
    };
    let mut saved_user = pg_sys::Oid::INVALID;
    let mut saved_context: c_int = 0;
    // SAFETY: switches to the owner as a security-definer function does; restored below.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
        pg_sys::SetUserIdAndSecContext(
            owner_oid,
            saved_context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as c_int,
        );
    }
    crate::sealed::enter_top_level(run_id);
    // SAFETY: a List of RawStmt from pg_parse_query (NIL, a null pointer, when empty).
    let statements: Vec<*mut pg_sys::RawStmt> = unsafe {
        if list.is_null() {
            Vec::new()
        } else {
            (0..usize::try_from((*list).length).unwrap_or(0))
                .map(|i| {
                    (*(*list).elements.add(i))
                        .ptr_value
                        .cast::<pg_sys::RawStmt>()
                })
                .collect()
        }
    };
    for raw in statements {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            outcome.error = Some((
                "57014".into(),
                format!("canceling statement due to statement timeout (the task's timeout of {timeout_ms} ms is spent)"),
            ));
            break;
        }
        let left_ms = c_int::try_from(left.as_millis().max(1)).unwrap_or(c_int::MAX);
        let ran = PgTryBuilder::new(AssertUnwindSafe(|| {
            // SAFETY: the statement's life as exec_simple_query leads it, at top level.
            unsafe { run_statement(raw, &text, left_ms, context) };
            Ok(())
        }))
        .catch_others(|e| Err(caught(&e)))
        .execute();
        // SAFETY: disarms the timer; after an error, ends the failed transaction (which also
        // puts the user back to the one it started with: the owner).
        unsafe {
            disable_timeout(STATEMENT_TIMEOUT, false);
            if ran.is_err() {
                pg_sys::AbortCurrentTransaction();
            }
        }
        match ran {
            Ok(()) => outcome.statements += 1,
            Err(error) => {
                outcome.error = Some(error);
                break;
            }
        }
    }
    // A command that opened a transaction block and did not end it (BEGIN without COMMIT, or an
    // error inside the block) leaves it here: it is rolled back, and the run fails saying so.
    // SAFETY: ends whatever transaction state the statements left, as a backend does at exit.
    unsafe {
        if pg_sys::IsTransactionBlock() || pg_sys::IsAbortedTransactionBlockState() {
            pg_sys::AbortOutOfAnyTransaction();
            if outcome.error.is_none() {
                outcome.error = Some((
                    "25001".into(),
                    "the command left a transaction block open (BEGIN without COMMIT); its statements since BEGIN were rolled back".into(),
                ));
            }
        }
    }
    outcome.reported = crate::sealed::leave_top_level();
    // SAFETY: back to the worker's own identity; the parse trees are no longer needed.
    unsafe {
        pg_sys::SetUserIdAndSecContext(saved_user, saved_context);
        pg_sys::MemoryContextDelete(context);
    }
    outcome
}

/// One statement at top level in its own transaction: analyze, plan, run through a portal,
/// commit. The query and plan trees live in `context`, not in the transaction's memory: a
/// statement such as `VACUUM` commits and starts transactions itself, which would free them
/// under the portal (exec_simple_query keeps them in its MessageContext for the same reason).
///
/// # Safety
/// Called outside any transaction, in a backend connected to a database; `context` outlives
/// the call.
unsafe fn run_statement(
    raw: *mut pg_sys::RawStmt,
    text: &CString,
    timeout_ms: c_int,
    context: pg_sys::MemoryContext,
) {
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        enable_timeout_after(STATEMENT_TIMEOUT, timeout_ms);
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        let transaction_context = pg_sys::MemoryContextSwitchTo(context);
        let queries = pg_sys::pg_analyze_and_rewrite_fixedparams(
            raw,
            text.as_ptr(),
            std::ptr::null(),
            0,
            std::ptr::null_mut(),
        );
        let plans = pg_sys::pg_plan_queries(
            queries,
            text.as_ptr(),
            pg_sys::CURSOR_OPT_PARALLEL_OK as c_int,
            std::ptr::null_mut(),
        );
        pg_sys::MemoryContextSwitchTo(transaction_context);
        pg_sys::PopActiveSnapshot();
        let portal = pg_sys::CreatePortal(c"".as_ptr(), true, true);
        (*portal).visible = false;
        pg_sys::PortalDefineQuery(
            portal,
            std::ptr::null(),
            text.as_ptr(),
            pg_sys::CreateCommandTag((*raw).stmt),
            plans,
            std::ptr::null_mut(),
        );
        pg_sys::PortalStart(portal, std::ptr::null_mut(), 0, std::ptr::null_mut());
        let mut format: i16 = 0;
        pg_sys::PortalSetResultFormat(portal, 1, &mut format);
        let dest = pg_sys::CreateDestReceiver(pg_sys::CommandDest::DestNone);
        let mut qc: pg_sys::QueryCompletion = std::mem::zeroed();
        pg_sys::PortalRun(portal, c_long::MAX, true, true, dest, dest, &mut qc);
        if let Some(destroy) = (*dest).rDestroy {
            destroy(dest);
        }
        pg_sys::PortalDrop(portal, false);
        disable_timeout(STATEMENT_TIMEOUT, false);
        pg_sys::CommitTransactionCommand();
    }
}

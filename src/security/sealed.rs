//! Running a user's SQL sealed: a task's command or readiness check runs as its owner, starts
//! from the executor's own session state, and leaves nothing behind for the next owner's code.
//!
//! This is what PostgreSQL does when it runs code as a table's owner (`vacuum_rel` in
//! vacuum.c, `ExecRefreshMatView` in matview.c): remember the user and security context, switch
//! to the owner with `SECURITY_RESTRICTED_OPERATION`, open a new GUC nest level, run, then roll
//! the nest level back (`AtEOXact_GUC(false, ...)`: every setting the code made, `SET`,
//! `set_config(..., false)` or `SET LOCAL`, is undone) and restore the user. Inside the nest
//! level every setting is first reset to the session's defaults (`RESET ALL`), so the code
//! starts from the executor's own settings (postgresql.conf, `ALTER DATABASE/ROLE ... SET`), not
//! from the pinned `search_path` of the pg_tide function that runs it. The restricted
//! operation refuses what would outlive the run in the session: temporary tables and functions
//! (`pg_temp` could otherwise shadow another owner's tables), `LISTEN`, `PREPARE`, cursors
//! `WITH HOLD`, `SET ROLE` and `SET SESSION AUTHORIZATION`. What it allows but a pg_tide executor
//! must not keep is dropped after each run: session-level advisory locks and sequence caches
//! (`lastval()`); prepared statements too, should a PostgreSQL version allow them.
//!
//! The user's SQL itself is executed by PL/pgSQL (`tide._execute`, `tide._check_ready`) between
//! `tide._seal_begin` and `tide._seal_end`: an error in it must reach the PL/pgSQL handler as
//! PostgreSQL raised it (its SQLSTATE decides retry or dead letter), which it would not after a
//! trip through Rust frames. `_seal_begin` returns a random key that only the calling PL/pgSQL
//! frame holds: `_seal_end` (which the owner's code could call, as it runs as the owner) undoes
//! nothing without it. After an error the subtransaction's abort restores the user and the
//! settings, and `_seal_abort` the rest.
//!
//! The run context (`tide.run_id()` and the functions built on it) lives here too, in process
//! memory set only while a run's code runs, so no setting a user can write decides which run
//! `tide.args()` or `tide.start_step(name)` refer to.

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, CString};

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// TimeoutId STATEMENT_TIMEOUT from utils/timeout.h (PostgreSQL 13 to 18).
const STATEMENT_TIMEOUT: c_int = 3;
/// LOCKMETHODID of advisory locks (storage/lock.h).
const USER_LOCKMETHOD: pg_sys::LOCKMETHODID = 2;

extern "C-unwind" {
    fn enable_timeout_after(id: c_int, delay_ms: c_int);
    fn disable_timeout(id: c_int, keep_indicator: bool);
    fn ResetSequenceCaches();
}

thread_local! {
    /// The run whose code is running (its command or readiness check), if any.
    static CURRENT_RUN: Cell<Option<i64>> = const { Cell::new(None) };
    /// What the command passed to `tide.report(expected, actual)`.
    static REPORTED: Cell<Option<(Option<i64>, Option<i64>)>> = const { Cell::new(None) };
    /// Set in pg_tide's executors: their session is shared by every owner, so session state a
    /// run leaves is dropped. (In a user's own session, a sealed run leaves it alone.)
    static IN_EXECUTOR: Cell<bool> = const { Cell::new(false) };
    /// The sealed runs in progress (one at a time in practice).
    static SEALS: RefCell<Vec<Seal>> = const { RefCell::new(Vec::new()) };
    /// How many sealed runs are nested here: public pg_tide functions called from user code
    /// belong to the role it runs as (src/security/caller.rs tells the levels apart).
    static LEVEL: Cell<u32> = const { Cell::new(0) };
}

/// The nesting level of user code run as another role (0 outside any).
pub fn user_code_level() -> u32 {
    LEVEL.with(Cell::get)
}

/// Marks the start of user code run as another role; returns the level to go back to.
pub fn enter_user_code() -> u32 {
    LEVEL.with(|l| {
        let previous = l.get();
        l.set(previous + 1);
        previous
    })
}

pub fn leave_user_code(previous: u32) {
    LEVEL.with(|l| l.set(previous));
}

/// A sealed run in progress: what `_seal_end` undoes.
struct Seal {
    key: i64,
    nest: c_int,
    saved_user: pg_sys::Oid,
    saved_context: c_int,
    level: u32,
    outer_run: Option<i64>,
}

/// Called once by an executor worker at its start.
pub fn mark_executor() {
    IN_EXECUTOR.with(|e| e.set(true));
}

/// Forgets the seals a failed transaction left (called at every transaction abort).
pub fn forget_after_abort() {
    LEVEL.with(|l| l.set(0));
    if SEALS.with(|s| !s.borrow().is_empty()) {
        SEALS.with(|s| s.borrow_mut().clear());
        CURRENT_RUN.with(|r| r.set(None));
        // SAFETY: disarming a timer that may still be armed.
        unsafe { disable_timeout(STATEMENT_TIMEOUT, false) };
    }
}

fn raise(code: PgSqlErrorCode, message: String, hint: &str) -> ! {
    pgrx::pg_sys::panic::ErrorReport::new(code, message, "tide._seal")
        .set_hint(hint)
        .report(PgLogLevel::ERROR);
    unreachable!("ereport(ERROR) returned")
}

/// Drops the session state a run may leave and the restricted operation allows, between
/// owners in an executor (`DISCARD ALL` would, for the rest it is refused in the run).
fn clean_session() {
    if IN_EXECUTOR.with(Cell::get) {
        // SAFETY: plain session cleanup calls, outside the run's code.
        unsafe {
            pg_sys::DropAllPreparedStatements();
            pg_sys::LockReleaseSession(USER_LOCKMETHOD);
            ResetSequenceCaches();
        }
    }
}

/// Starts running a run's code sealed as role `owner` (see the module comment), bounded by
/// `timeout_ms` (`NO_TIMEOUT`: by the owner's own statement_timeout), with `run_id` as the run
/// context. Returns the key `_seal_end` needs. Only
/// pg_tide's own bookkeeping (a superuser) calls this.
#[pg_extern(volatile, schema = "tide", name = "_seal_begin")]
fn seal_begin(run_id: i64, owner: &str, timeout_ms: i32) -> i64 {
    // SAFETY: reads the current user's superuser flag.
    if !unsafe { pg_sys::superuser() } {
        raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            "permission denied for function _seal_begin".to_string(),
            "only pg_tide's executors run user code",
        );
    }
    let role = CString::new(owner)
        .ok()
        // SAFETY: missing_ok returns InvalidOid for a role that no longer exists.
        .map(|name| unsafe { pg_sys::get_role_oid(name.as_ptr(), true) })
        .filter(|oid| *oid != pg_sys::InvalidOid)
        .unwrap_or_else(|| {
            raise(
                PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
                format!("role \"{owner}\" of the task no longer exists"),
                "a task runs as the role that created it; recreate the role or unschedule the task",
            )
        });
    let mut bytes = [0u8; 8];
    // SAFETY: fills the buffer from the operating system's random source.
    if !unsafe { pg_sys::pg_strong_random(bytes.as_mut_ptr().cast(), bytes.len()) } {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            "could not generate a random key".to_string(),
            "the operating system's random source failed",
        );
    }
    let key = i64::from_ne_bytes(bytes);
    let mut saved_user = pg_sys::InvalidOid;
    let mut saved_context: c_int = 0;
    // SAFETY: the sequence of vacuum_rel: save, open a GUC nest level (here reset to the
    // session's defaults), switch to the owner in a restricted operation.
    let nest = unsafe {
        pg_sys::GetUserIdAndSecContext(&mut saved_user, &mut saved_context);
        let nest = pg_sys::NewGUCNestLevel();
        pg_sys::ResetAllOptions();
        // Read before the switch, as pg_tide (the owner's setting is looked up, not run).
        let timeout_ms = effective_timeout_ms(timeout_ms, role);
        pg_sys::SetUserIdAndSecContext(
            role,
            saved_context
                | pg_sys::SECURITY_LOCAL_USERID_CHANGE as c_int
                | pg_sys::SECURITY_RESTRICTED_OPERATION as c_int,
        );
        if timeout_ms > 0 {
            enable_timeout_after(STATEMENT_TIMEOUT, timeout_ms);
        }
        nest
    };
    let level = enter_user_code();
    let outer_run = CURRENT_RUN.with(|r| r.replace(Some(run_id)));
    REPORTED.with(|r| r.set(None));
    SEALS.with(|s| {
        s.borrow_mut().push(Seal {
            key,
            nest,
            saved_user,
            saved_context,
            level,
            outer_run,
        })
    });
    key
}

/// A task's timeout that is none (`timeout => '0'`), as `tide._timeout_ms` gives it.
pub const NO_TIMEOUT: i32 = i32::MAX;

/// The milliseconds a run's code may take (0: no limit): the task's timeout, or for a task
/// without one (`NO_TIMEOUT`) the `statement_timeout` a session of `role` in this database
/// starts with, as pg_cron's job would have had it (`ALTER ROLE ... IN DATABASE ... SET`, then
/// `ALTER ROLE ... SET`, then `ALTER DATABASE ... SET`, then the server's setting). Called after
/// the settings were reset to the session's defaults.
pub fn effective_timeout_ms(timeout_ms: i32, role: pg_sys::Oid) -> i32 {
    if timeout_ms != NO_TIMEOUT {
        return timeout_ms.max(1);
    }
    let configured = Spi::get_one_with_args::<String>(
        "SELECT substr(c, length('statement_timeout=') + 1)
           FROM pg_catalog.pg_db_role_setting s CROSS JOIN LATERAL pg_catalog.unnest(s.setconfig) c
          WHERE s.setrole IN (0, $1) AND s.setdatabase IN (0, $2) AND (s.setrole, s.setdatabase) <> (0, 0)
            AND c LIKE 'statement\\_timeout=%'
          ORDER BY s.setrole <> 0 DESC, s.setdatabase <> 0 DESC LIMIT 1",
        // SAFETY: reads this backend's database id.
        &[role.into(), unsafe { pg_sys::MyDatabaseId }.into()],
    )
    .ok()
    .flatten();
    let parsed = configured.and_then(|value| {
        let text = CString::new(value).ok()?;
        let mut ms: c_int = 0;
        // SAFETY: parses a setting's value as PostgreSQL parses statement_timeout.
        unsafe {
            pg_sys::parse_int(
                text.as_ptr(),
                &mut ms,
                pg_sys::GUC_UNIT_MS as c_int,
                std::ptr::null_mut(),
            )
        }
        .then_some(ms)
    });
    // SAFETY: reads the session's statement_timeout (its default, after the reset).
    parsed.unwrap_or(unsafe { pg_sys::StatementTimeout }).max(0)
}

/// The seal of this key, taken off the stack; an unknown key is refused.
fn take_seal(key: i64) -> Option<Seal> {
    SEALS.with(|s| {
        let mut seals = s.borrow_mut();
        if seals.last().is_some_and(|top| top.key == key) {
            seals.pop()
        } else {
            None
        }
    })
}

/// Ends a sealed run after its code ran: undoes every setting it made, switches back, drops
/// what it left in the session. Returns what the code passed to `tide.report`.
#[pg_extern(volatile, schema = "tide", name = "_seal_end")]
fn seal_end(
    key: i64,
) -> TableIterator<'static, (name!(expected, Option<i64>), name!(actual, Option<i64>))> {
    let Some(seal) = take_seal(key) else {
        raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            "no sealed run with this key".to_string(),
            "only pg_tide's executors end a sealed run",
        )
    };
    // SAFETY: undoes what _seal_begin did, in reverse, as vacuum_rel does at its end.
    unsafe {
        disable_timeout(STATEMENT_TIMEOUT, false);
        pg_sys::AtEOXact_GUC(false, seal.nest);
        pg_sys::SetUserIdAndSecContext(seal.saved_user, seal.saved_context);
    }
    leave_user_code(seal.level);
    CURRENT_RUN.with(|r| r.set(seal.outer_run));
    clean_session();
    let (expected, actual) = REPORTED.with(|r| r.take()).unwrap_or((None, None));
    TableIterator::once((expected, actual))
}

/// Ends a sealed run whose code failed, after the subtransaction's abort restored the user and
/// the settings: disarms the timeout, forgets the run context, drops what it left in the
/// session. A NULL or unknown key does nothing (the error came before `_seal_begin`).
#[pg_extern(volatile, schema = "tide", name = "_seal_abort")]
fn seal_abort(key: Option<i64>) {
    let Some(seal) = key.and_then(take_seal) else {
        return;
    };
    // SAFETY: disarming a timer that may still be armed.
    unsafe { disable_timeout(STATEMENT_TIMEOUT, false) };
    leave_user_code(seal.level);
    CURRENT_RUN.with(|r| r.set(seal.outer_run));
    REPORTED.with(|r| r.set(None));
    clean_session();
}

/// A command run by a worker of its own (see `command.rs`) starts: its run is the run context of its statements.
pub fn enter_top_level(run_id: i64) {
    CURRENT_RUN.with(|r| r.set(Some(run_id)));
    REPORTED.with(|r| r.set(None));
}

/// A top-level command ended: forgets the run context, returns what it passed to `tide.report`.
pub fn leave_top_level() -> (Option<i64>, Option<i64>) {
    CURRENT_RUN.with(|r| r.set(None));
    REPORTED.with(|r| r.take()).unwrap_or((None, None))
}

/// Inside a task's command or readiness check: the id of the run being executed; NULL
/// elsewhere. Set by pg_tide's executor while the run's code runs, not by any setting.
#[pg_extern(stable, parallel_restricted, schema = "tide")]
fn run_id() -> Option<i64> {
    CURRENT_RUN.with(Cell::get)
}

/// Inside a task's command: the counts its completion is checked against; actual < expected
/// ends the run in need_check.
#[pg_extern(volatile, schema = "tide")]
fn report(expected: Option<i64>, actual: Option<i64>) {
    if CURRENT_RUN.with(Cell::get).is_none() {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "tide.report is only meaningful inside a task's command".to_string(),
            "external workers pass expected and actual to tide.complete_run(run_id, token, ...)",
        );
    }
    if expected.is_some_and(|e| e < 0) || actual.is_some_and(|a| a < 0) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "expected and actual must not be negative, got expected {}, actual {}",
                expected.map_or("NULL".into(), |e| e.to_string()),
                actual.map_or("NULL".into(), |a| a.to_string())
            ),
            "pass the number of records the run should have and did process",
        );
    }
    REPORTED.with(|r| r.set(Some((expected, actual))));
}

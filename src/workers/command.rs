//! Commands run by a worker of their own: top-level commands (`top_level => true`: `VACUUM`,
//! `CREATE INDEX CONCURRENTLY`, `CALL` of a procedure that commits) and the commands of tasks
//! that run in another database of the cluster (`database => 'app'`, pg_cron's
//! `schedule_in_database`). Neither can run in an executor's transaction: the first refuses a
//! transaction block, the second needs a connection to another database, which a backend cannot
//! switch to.
//!
//! The life of such a run:
//! 1. An executor claims it as any SQL run; `tide._execute` answers `top_level`. The executor
//!    reads what to run (`tide._command_start`: the command, owner, database, mode, timeout; a
//!    database the owner may not reach fails the run there, with the server's error), takes a
//!    slot in shared memory (at most `pg_tide.command_workers` at once, and
//!    `pg_tide.command_workers_per_database` in one database; without room the run waits two
//!    seconds in line, no attempt counted), hands the command over in a dynamic shared memory
//!    segment and starts a background worker for it. Then it goes back to its other work: a
//!    command that runs for hours holds a command worker, never an executor.
//! 2. The worker connects to the task's database (as the bootstrap superuser: no password, no
//!    libpq, no login rights needed), checks that the owner still exists and may connect there
//!    (`CONNECT`, as the server checks a login), and runs the command as the owner, switched to
//!    the way a security-definer function switches (`SECURITY_LOCAL_USERID_CHANGE`: no `SET
//!    ROLE`), bounded by the task's timeout (or, with none, the owner's own `statement_timeout`):
//!    - top-level: each statement parsed, planned and run through a portal at top level in its
//!      own transaction, as `psql -f` runs a script: `VACUUM` and friends find no transaction
//!      block around them; the first error stops it, statements before it stay committed;
//!    - otherwise (a task in another database): every statement in one transaction, an
//!      implicit transaction block, as PostgreSQL's simple-query protocol runs a string of
//!      several statements (and pg_cron with it): all or nothing.
//!
//!    The outcome (statements run, the last statement's command tag, the error that stopped it,
//!    what `tide.report` was given) goes into its slot, the executors and the scheduler are
//!    woken, and the worker exits: whatever the command left in its session ends with the
//!    process. A worker that dies before it reports (it could not connect, it was terminated)
//!    leaves the error it died of, caught from the server log's stream.
//! 3. An executor (or the scheduler) records the outcome in pg_tide's database
//!    (`tide._command_finish`: completed, or failed by the error's SQLSTATE), then frees the slot.
//!    The tick leaves runs in a slot to this path (`tide._command_runs`).
//!
//! At least once: the command's commits are not the run's. If the server stops between a
//! command's commit and the record of its outcome, the run is failed as lost when the server
//! comes back and retried from its first statement (if it has attempts left; an imported pg_cron
//! job has one, so it goes to the dead letters and alerts instead of running twice).

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, CStr, CString};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::lwlock::PgLwLock;
use pgrx::prelude::*;
use pgrx::{pg_sys, PGRXSharedMemory};

use crate::base::sqlerr::OrRaise;
use crate::settings::MAX_COMMAND_WORKERS;

const F: &str = "pg_tide command worker";

/// TimeoutId STATEMENT_TIMEOUT from utils/timeout.h (PostgreSQL 13 to 18).
const STATEMENT_TIMEOUT: c_int = 3;

extern "C-unwind" {
    fn enable_timeout_after(id: c_int, delay_ms: c_int);
    fn disable_timeout(id: c_int, keep_indicator: bool);
    fn die(postgres_signal_arg: c_int);
    fn StatementCancelHandler(postgres_signal_arg: c_int);
}

extern "C" {
    /// kill(2): signal 0 only asks whether the process exists.
    fn kill(pid: c_int, sig: c_int) -> c_int;
}

/// A database or role name: at most 63 bytes (NAMEDATALEN).
const NAME: usize = 64;
/// The error message a worker reports is cut to this many bytes.
const MESSAGE: usize = 2000;
const TAG: usize = 64;

const FREE: u8 = 0;
/// Taken by an executor; the worker is starting.
const LAUNCHING: u8 = 1;
/// The worker runs the command.
const RUNNING: u8 = 2;
/// The outcome is in; nobody records it yet.
const DONE: u8 = 3;
/// A collector records the outcome.
const COLLECTING: u8 = 4;

/// One command worker's slot: what it runs, then how it ended.
#[derive(Copy, Clone)]
#[repr(C)]
struct Slot {
    state: u8,
    /// Raised each time the slot is taken: a worker or a handle of an earlier use is told apart.
    generation: u64,
    run_id: i64,
    token: i64,
    database: [u8; NAME],
    database_len: u16,
    owner: [u8; NAME],
    owner_len: u16,
    top_level: bool,
    timeout_ms: i32,
    /// The dynamic shared memory segment holding the command, pinned until the worker took it.
    command: pg_sys::dsm_handle,
    command_len: u32,
    command_taken: bool,
    launcher_pid: i32,
    launched_at: i64,
    pid: i32,
    collector_pid: i32,
    // The outcome.
    statements: i32,
    failed: bool,
    sqlstate: [u8; 5],
    message: [u8; MESSAGE],
    message_len: u16,
    reported: bool,
    expected: i64,
    expected_null: bool,
    actual: i64,
    actual_null: bool,
    tag: [u8; TAG],
    tag_len: u16,
}

impl Slot {
    const EMPTY: Slot = Slot {
        state: FREE,
        generation: 0,
        run_id: 0,
        token: 0,
        database: [0; NAME],
        database_len: 0,
        owner: [0; NAME],
        owner_len: 0,
        top_level: false,
        timeout_ms: 0,
        command: 0,
        command_len: 0,
        command_taken: false,
        launcher_pid: 0,
        launched_at: 0,
        pid: 0,
        collector_pid: 0,
        statements: 0,
        failed: false,
        sqlstate: [0; 5],
        message: [0; MESSAGE],
        message_len: 0,
        reported: false,
        expected: 0,
        expected_null: true,
        actual: 0,
        actual_null: true,
        tag: [0; TAG],
        tag_len: 0,
    };

    fn database(&self) -> String {
        text(&self.database, self.database_len)
    }

    fn write_outcome(&mut self, outcome: &Outcome) {
        self.statements = outcome.statements;
        self.failed = outcome.error.is_some();
        if let Some((sqlstate, message)) = &outcome.error {
            let code = sqlstate.as_bytes();
            for (i, b) in self.sqlstate.iter_mut().enumerate() {
                *b = code.get(i).copied().unwrap_or(b'0');
            }
            self.message_len = put(&mut self.message, message);
        }
        self.reported = outcome.reported.0.is_some() || outcome.reported.1.is_some();
        self.expected_null = outcome.reported.0.is_none();
        self.expected = outcome.reported.0.unwrap_or(0);
        self.actual_null = outcome.reported.1.is_none();
        self.actual = outcome.reported.1.unwrap_or(0);
        self.tag_len = put(&mut self.tag, outcome.tag.as_deref().unwrap_or(""));
        self.state = DONE;
    }

    fn outcome(&self) -> Outcome {
        Outcome {
            statements: self.statements,
            error: self.failed.then(|| {
                (
                    String::from_utf8_lossy(&self.sqlstate).into_owned(),
                    text(&self.message, self.message_len),
                )
            }),
            reported: (
                (!self.expected_null).then_some(self.expected),
                (!self.actual_null).then_some(self.actual),
            ),
            tag: (self.tag_len > 0).then(|| text(&self.tag, self.tag_len)),
        }
    }
}

#[derive(Copy, Clone)]
#[repr(C)]
pub struct Slots {
    slot: [Slot; MAX_COMMAND_WORKERS],
}

impl Default for Slots {
    fn default() -> Self {
        Slots {
            slot: [Slot::EMPTY; MAX_COMMAND_WORKERS],
        }
    }
}

// SAFETY: plain data, shared across processes under the LWLock.
unsafe impl PGRXSharedMemory for Slots {}

// SAFETY: the name is unique to pg_tide.
static SLOTS: PgLwLock<Slots> = unsafe { PgLwLock::new(c"pg_tide_command_workers") };

/// Requests and sets up the slots (from `_PG_init` while preloading).
#[allow(unexpected_cfgs)]
pub fn init_shared() {
    pgrx::pg_shmem_init!(SLOTS);
}

/// Copies `value` into `buf`, cut at a character boundary; its length.
fn put(buf: &mut [u8], value: &str) -> u16 {
    let mut end = value.len().min(buf.len());
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    buf[..end].copy_from_slice(&value.as_bytes()[..end]);
    u16::try_from(end).unwrap_or(0)
}

fn text(buf: &[u8], len: u16) -> String {
    String::from_utf8_lossy(&buf[..usize::from(len).min(buf.len())]).into_owned()
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 delivers nothing; it only checks that the process exists.
    pid > 0 && unsafe { kill(pid, 0) } == 0
}

fn now() -> i64 {
    // SAFETY: reads the clock.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

/// What a command did: statements run, the error that stopped it, what it reported, the last
/// statement's command tag (`UPDATE 3`, `VACUUM`).
struct Outcome {
    statements: i32,
    error: Option<(String, String)>,
    reported: (Option<i64>, Option<i64>),
    tag: Option<String>,
}

impl Outcome {
    fn failed(sqlstate: &str, message: String) -> Outcome {
        Outcome {
            statements: 0,
            error: Some((sqlstate.to_string(), message)),
            reported: (None, None),
            tag: None,
        }
    }
}

/// What `tide._command_start` says of a claimed run.
struct Start {
    command: String,
    owner: String,
    database: Option<String>,
    top_level: bool,
    timeout_ms: i32,
}

/// Whether this database's pg_tide has the 0.2.2 functions of this module (before `ALTER
/// EXTENSION pg_tide UPDATE`, the 0.2.1 ones: top-level commands in this database only).
fn current_sql() -> bool {
    Spi::get_one::<bool>("SELECT pg_catalog.to_regproc('tide._command_start') IS NOT NULL")
        .or_raise(F)
        .unwrap_or(false)
}

/// The run's command and how to run it, if the claim still holds the run (in the caller's
/// transaction). A database the owner cannot reach has failed the run already: nothing then.
fn start_of(run_id: i64, token: i64) -> Option<Start> {
    let current = current_sql();
    let sql = if current {
        "SELECT command, owner::text, database, top_level, timeout_ms FROM tide._command_start($1, $2)"
    } else {
        "SELECT command, owner::text, NULL::text, true, timeout_ms FROM tide._top_level_start($1, $2)"
    };
    Spi::connect_mut(|client| {
        client
            .update(sql, None, &[run_id.into(), token.into()])
            .or_raise(F)
            .next()
            .map(|row| Start {
                command: row.get::<String>(1).or_raise(F).unwrap_or_default(),
                owner: row.get::<String>(2).or_raise(F).unwrap_or_default(),
                database: row.get::<String>(3).or_raise(F),
                top_level: row.get::<bool>(4).or_raise(F).unwrap_or(true),
                timeout_ms: row
                    .get::<i32>(5)
                    .or_raise(F)
                    .unwrap_or(crate::security::sealed::NO_TIMEOUT),
            })
    })
}

thread_local! {
    /// The workers this process started and whose slots it has not seen end: the handle
    /// tells when one stopped without reporting (it never started, say).
    static LAUNCHED: RefCell<Vec<(usize, u64, *mut pg_sys::BackgroundWorkerHandle)>> =
        const { RefCell::new(Vec::new()) };
}

/// Starts the command of a claimed run in a worker of its own (see the module comment); called
/// by an executor, outside any transaction. Whatever goes wrong is recorded on the run.
pub fn launch(run_id: i64, token: i64) {
    let start = match crate::bgw::in_transaction("command start", || start_of(run_id, token)) {
        Ok(Some(start)) => start,
        // Fenced, or failed already (its database cannot be reached): nothing to run.
        Ok(None) => return,
        Err(message) => return abandon(run_id, token, &message),
    };
    let (index, generation) = match reserve(run_id, token, &start) {
        Ok(taken) => taken,
        Err(why) => return wait(run_id, token, &why),
    };
    let handed = crate::bgw::in_transaction("command text", || hand_over(&start.command));
    let Ok(segment) = handed else {
        free(index, generation);
        return abandon(
            run_id,
            token,
            "the command could not be handed to its worker",
        );
    };
    {
        let mut slots = SLOTS.exclusive();
        let slot = &mut slots.slot[index];
        slot.command = segment;
        slot.command_len = u32::try_from(start.command.len()).unwrap_or(u32::MAX);
    }
    match spawn(run_id, index, generation) {
        Some(handle) => LAUNCHED.with_borrow_mut(|l| l.push((index, generation, handle))),
        None => {
            free(index, generation);
            wait(
                run_id,
                token,
                "no background worker slot was free for its command worker (raise max_worker_processes by pg_tide.command_workers)",
            );
        }
    }
}

/// Takes a free slot for the run, if the limits leave room; else says why not.
fn reserve(run_id: i64, token: i64, start: &Start) -> Result<(usize, u64), String> {
    let total = usize::try_from(crate::settings::COMMAND_WORKERS.get())
        .unwrap_or(1)
        .min(MAX_COMMAND_WORKERS);
    let per_database =
        usize::try_from(crate::settings::COMMAND_WORKERS_PER_DATABASE.get()).unwrap_or(1);
    let database = start.database.clone().unwrap_or_default();
    let mut slots = SLOTS.exclusive();
    let busy = slots.slot.iter().filter(|s| s.state != FREE).count();
    let here = slots
        .slot
        .iter()
        .filter(|s| s.state != FREE && s.database() == database)
        .count();
    let shown = start
        .database
        .clone()
        .unwrap_or_else(crate::settings::database);
    if busy >= total {
        return Err(format!(
            "waits for a command worker: all {total} are busy (pg_tide.command_workers)"
        ));
    }
    if here >= per_database {
        return Err(format!(
            "waits for a command worker: {here} run in database {shown} (pg_tide.command_workers_per_database)"
        ));
    }
    let index = slots
        .slot
        .iter()
        .position(|s| s.state == FREE)
        .ok_or_else(|| "waits for a command worker: none is free".to_string())?;
    let slot = &mut slots.slot[index];
    let generation = slot.generation.wrapping_add(1);
    *slot = Slot::EMPTY;
    slot.state = LAUNCHING;
    slot.generation = generation;
    slot.run_id = run_id;
    slot.token = token;
    slot.database_len = put(&mut slot.database, &database);
    slot.owner_len = put(&mut slot.owner, &start.owner);
    slot.top_level = start.top_level;
    slot.timeout_ms = start.timeout_ms;
    // SAFETY: reads this process's pid.
    slot.launcher_pid = unsafe { pg_sys::MyProcPid };
    slot.launched_at = now();
    Ok((index, generation))
}

/// Frees a slot this process took (its worker never ran), with the command's segment.
fn free(index: usize, generation: u64) {
    let segment = {
        let mut slots = SLOTS.exclusive();
        let slot = &mut slots.slot[index];
        if slot.generation != generation {
            return;
        }
        let segment = (!slot.command_taken && slot.command != 0).then_some(slot.command);
        slot.state = FREE;
        segment
    };
    if let Some(handle) = segment {
        unpin(handle);
    }
}

/// Lets a pinned command segment go (it is destroyed with its last mapping). An error (the
/// segment is gone already) is only logged.
fn unpin(handle: pg_sys::dsm_handle) {
    let unpinned = PgTryBuilder::new(|| {
        // SAFETY: the handle of a segment pg_tide pinned; an error is caught here.
        unsafe { pg_sys::dsm_unpin_segment(handle) };
        true
    })
    .catch_others(|_| false)
    .execute();
    if !unpinned {
        log!("pg_tide: the command segment {handle} was not pinned any more");
    }
}

/// The command in a pinned dynamic shared memory segment of its own, for the worker to take:
/// its handle. In the caller's transaction (the segment outlives it).
fn hand_over(command: &str) -> pg_sys::dsm_handle {
    let bytes = command.as_bytes();
    // SAFETY: a new segment of the command's size, written, pinned (it survives this process's
    // detach) and detached.
    unsafe {
        let segment = pg_sys::dsm_create(bytes.len().max(1), 0);
        let address = pg_sys::dsm_segment_address(segment).cast::<u8>();
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), address, bytes.len());
        pg_sys::dsm_pin_segment(segment);
        let handle = pg_sys::dsm_segment_handle(segment);
        pg_sys::dsm_detach(segment);
        handle
    }
}

/// Registers the worker of slot `index`; its handle (in memory that lives as long as this
/// process), or None when no background worker slot is free.
fn spawn(
    run_id: i64,
    index: usize,
    generation: u64,
) -> Option<*mut pg_sys::BackgroundWorkerHandle> {
    let builder = BackgroundWorkerBuilder::new(&format!("pg_tide command of run {run_id}"))
        .set_type("pg_tide command")
        .set_library("pg_tide")
        .set_function("pg_tide_command_main")
        .set_argument(Some(pg_sys::Datum::from(index)))
        .set_extra(&generation.to_string())
        .enable_spi_access();
    let mut worker: pg_sys::BackgroundWorker = (&builder).into();
    let mut handle: *mut pg_sys::BackgroundWorkerHandle = std::ptr::null_mut();
    // SAFETY: registers the worker; the handle is allocated in TopMemoryContext so that it
    // outlives the transaction, and freed once the slot is seen to end (check_launched).
    let registered = unsafe {
        let old = pg_sys::MemoryContextSwitchTo(pg_sys::TopMemoryContext);
        let ok = pg_sys::RegisterDynamicBackgroundWorker(&mut worker, &mut handle);
        pg_sys::MemoryContextSwitchTo(old);
        ok
    };
    (registered && !handle.is_null()).then_some(handle)
}

/// The run waits in line for a moment, no attempt counted (no room for its command worker).
fn wait(run_id: i64, token: i64, why: &str) {
    let sql = if current_sql_outside() {
        "SELECT tide._command_wait($1, $2, $3)"
    } else {
        "SELECT tide._abandon($1, $2, $3)"
    };
    let _ = crate::bgw::in_transaction("command wait", || {
        Spi::run_with_args(sql, &[run_id.into(), token.into(), why.into()]).or_raise(F)
    });
}

fn current_sql_outside() -> bool {
    crate::bgw::in_transaction("command check", current_sql).unwrap_or(false)
}

/// The attempt ends as lost (retried if it has attempts left): its worker could not be started.
fn abandon(run_id: i64, token: i64, why: &str) {
    let _ = crate::bgw::in_transaction("abandon", || {
        Spi::run_with_args(
            "SELECT tide._abandon($1, $2, $3)",
            &[run_id.into(), token.into(), why.into()],
        )
        .or_raise(F)
    });
}

/// Records the outcomes of the command workers that finished, and of those that ended without
/// one; called by the executors and the scheduler, outside any transaction, at every round.
pub fn collect() {
    // The common case, no command worker at all, under a shared lock only (executors call this
    // between runs).
    let busy = SLOTS.share().slot.iter().any(|s| s.state != FREE);
    if !busy && LAUNCHED.with_borrow(Vec::is_empty) {
        return;
    }
    check_launched();
    check_orphans();
    let mut seen = Vec::new();
    while let Some((index, generation, run_id, token, outcome)) = take_done(&seen) {
        seen.push(index);
        let recorded =
            crate::bgw::in_transaction("command outcome", || record(run_id, token, &outcome));
        let segment = {
            let mut slots = SLOTS.exclusive();
            let slot = &mut slots.slot[index];
            if slot.generation != generation || slot.state != COLLECTING {
                None
            } else if recorded.is_ok() {
                slot.state = FREE;
                (!slot.command_taken && slot.command != 0).then_some(slot.command)
            } else {
                // Tried again at the next round.
                slot.state = DONE;
                slot.collector_pid = 0;
                None
            }
        };
        if let Some(handle) = segment {
            unpin(handle);
        }
    }
}

/// A finished slot to record (marked as being collected by this process), at most once per
/// round each.
fn take_done(seen: &[usize]) -> Option<(usize, u64, i64, i64, Outcome)> {
    let mut slots = SLOTS.exclusive();
    // SAFETY: reads this process's pid.
    let me = unsafe { pg_sys::MyProcPid };
    let index = slots.slot.iter().enumerate().position(|(i, s)| {
        !seen.contains(&i)
            && (s.state == DONE || (s.state == COLLECTING && !alive(s.collector_pid)))
    })?;
    let slot = &mut slots.slot[index];
    slot.state = COLLECTING;
    slot.collector_pid = me;
    Some((
        index,
        slot.generation,
        slot.run_id,
        slot.token,
        slot.outcome(),
    ))
}

/// The outcome on the run, in pg_tide's database (the caller's transaction).
fn record(run_id: i64, token: i64, outcome: &Outcome) {
    let (sqlstate, message) = match &outcome.error {
        Some((s, m)) => (Some(s.clone()), Some(m.clone())),
        None => (None, None),
    };
    let mut args = vec![
        run_id.into(),
        token.into(),
        sqlstate.into(),
        message.into(),
        outcome.statements.into(),
        outcome.reported.0.into(),
        outcome.reported.1.into(),
    ];
    let sql = if current_sql() {
        args.push(outcome.tag.clone().into());
        "SELECT tide._command_finish($1, $2, $3, $4, $5, $6, $7, $8)"
    } else {
        "SELECT tide._top_level_finish($1, $2, $3, $4, $5, $6, $7)"
    };
    let recorded = Spi::get_one_with_args::<String>(sql, &args).or_raise(F);
    debug1!("pg_tide: command of run {run_id}: {recorded:?}");
}

/// The workers this process started: one that stopped before reporting leaves its slot done,
/// with that said; handles of slots that ended are let go.
fn check_launched() {
    LAUNCHED.with_borrow_mut(|launched| {
        launched.retain(|&(index, generation, handle)| {
            let mut pid: pg_sys::pid_t = 0;
            // SAFETY: a handle RegisterDynamicBackgroundWorker gave this process.
            let status = unsafe { pg_sys::GetBackgroundWorkerPid(handle, &mut pid) };
            let mut slots = SLOTS.exclusive();
            let slot = &mut slots.slot[index];
            let ours = slot.generation == generation;
            let open = ours && (slot.state == LAUNCHING || slot.state == RUNNING);
            if open && status == pg_sys::BgwHandleStatus::BGWH_STOPPED {
                slot.write_outcome(&Outcome::failed(
                    "58000",
                    "the command's worker stopped before it reported an outcome (see the server log)"
                        .to_string(),
                ));
            }
            let keep = open && status != pg_sys::BgwHandleStatus::BGWH_STOPPED;
            if !keep {
                // SAFETY: the handle was allocated for this process, and is not used again.
                unsafe { pg_sys::pfree(handle.cast()) };
            }
            keep
        });
    });
}

/// Slots whose worker is gone without a word (killed, say) or never started, while the
/// executor that launched it is gone too: done, with that said.
fn check_orphans() {
    let mut slots = SLOTS.exclusive();
    let at = now();
    for slot in slots.slot.iter_mut() {
        if slot.state == RUNNING && !alive(slot.pid) {
            let message = format!(
                "the command's worker (pid {}) ended before it reported an outcome",
                slot.pid
            );
            slot.write_outcome(&Outcome::failed("58000", message));
        } else if slot.state == LAUNCHING
            && !alive(slot.launcher_pid)
            && at - slot.launched_at > 60_000_000
        {
            slot.write_outcome(&Outcome::failed(
                "58000",
                "the command's worker did not start within a minute".to_string(),
            ));
        }
    }
}

/// The runs whose commands run in a command worker, or whose outcome is not recorded yet: the
/// tick leaves them to the worker and its collector (a run's executor may be gone meanwhile).
#[pg_extern(volatile, parallel_restricted, schema = "tide", name = "_command_runs")]
fn command_runs() -> Vec<i64> {
    SLOTS
        .share()
        .slot
        .iter()
        .filter(|s| s.state != FREE)
        .map(|s| s.run_id)
        .collect()
}

/// The command workers at this instant, one row per busy slot: its run, database, state
/// (launching, running, done, collecting), worker pid, and since when. For superusers and
/// tide_admin (it names every role's runs).
// pgrx reads the column names from `name!` inside the signature: no type alias.
#[allow(clippy::type_complexity)]
#[pg_extern(
    volatile,
    parallel_restricted,
    schema = "tide",
    name = "_command_workers"
)]
fn command_workers() -> TableIterator<
    'static,
    (
        name!(run_id, i64),
        name!(database, String),
        name!(state, String),
        name!(pid, Option<i32>),
        name!(since, Option<pgrx::datum::TimestampWithTimeZone>),
    ),
> {
    let rows: Vec<_> = SLOTS
        .share()
        .slot
        .iter()
        .filter(|s| s.state != FREE)
        .map(|s| {
            let state = match s.state {
                LAUNCHING => "launching",
                RUNNING => "running",
                DONE => "done",
                _ => "collecting",
            };
            let database = Some(s.database())
                .filter(|d| !d.is_empty())
                .unwrap_or_else(crate::settings::database);
            (
                s.run_id,
                database,
                state.to_string(),
                (s.pid > 0).then_some(s.pid),
                pgrx::datum::TimestampWithTimeZone::try_from(s.launched_at).ok(),
            )
        })
        .collect();
    TableIterator::new(rows)
}

// ------------------------------------------------------------------------------------------
// The worker.

thread_local! {
    /// This worker's slot and generation, while it owes the slot an outcome.
    static MINE: Cell<Option<(usize, u64)>> = const { Cell::new(None) };
    /// The last error the server logged in this worker (a FATAL at connection ends the process
    /// before any code of ours sees it): its SQLSTATE and message.
    static LAST_ERROR: RefCell<Option<(String, String)>> = const { RefCell::new(None) };
}

/// What the worker runs, read from its slot (which it marks running).
struct Job {
    run_id: i64,
    database: Option<String>,
    owner: String,
    top_level: bool,
    timeout_ms: i32,
    command: pg_sys::dsm_handle,
    command_len: usize,
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_tide_command_main(arg: pg_sys::Datum) {
    let index = arg.value();
    let generation: u64 = BackgroundWorker::get_extra().parse().unwrap_or(0);
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP);
    // SAFETY: as in every backend, SIGTERM ends the process at the next interrupt check, and
    // SIGINT (pg_cancel_backend: tide.cancel_run, tide.pause_run) cancels the running statement.
    unsafe {
        crate::base::pgversion::pqsignal(pg_sys::SIGTERM, Some(die));
        crate::base::pgversion::pqsignal(pg_sys::SIGINT, Some(StatementCancelHandler));
    }
    let Some(job) = begin(index, generation) else {
        // Its slot was given up meanwhile (the executor that launched it saw it stop).
        // SAFETY: a clean exit of a worker that is never restarted.
        unsafe { crate::base::pgversion::proc_exit(0) }
    };
    MINE.set(Some((index, generation)));
    // SAFETY: registers the exit callback that reports a death without an outcome, and the
    // hook that notes the error it died of.
    unsafe {
        pg_sys::before_shmem_exit(Some(at_exit), pg_sys::Datum::from(0));
        pg_sys::emit_log_hook = Some(note_error);
    }
    let command = take_command(index, &job);
    let database = job
        .database
        .clone()
        .unwrap_or_else(crate::settings::database);
    // A database that is gone or refuses connections ends the process here (FATAL): at_exit
    // reports it.
    BackgroundWorker::connect_worker_to_spi(Some(&database), None);
    let outcome = match command {
        Some(command) => execute(&job, &database, &command),
        None => Outcome::failed(
            "58000",
            "the command's worker could not read the command".into(),
        ),
    };
    report(&outcome);
    // SAFETY: a clean exit of a worker that is never restarted.
    unsafe { crate::base::pgversion::proc_exit(0) }
}

/// Marks the slot running by this process and reads the job from it.
fn begin(index: usize, generation: u64) -> Option<Job> {
    let mut slots = SLOTS.exclusive();
    let slot = slots.slot.get_mut(index)?;
    if slot.generation != generation || slot.state != LAUNCHING {
        return None;
    }
    slot.state = RUNNING;
    // SAFETY: reads this process's pid.
    slot.pid = unsafe { pg_sys::MyProcPid };
    Some(Job {
        run_id: slot.run_id,
        database: Some(slot.database()).filter(|d| !d.is_empty()),
        owner: text(&slot.owner, slot.owner_len),
        top_level: slot.top_level,
        timeout_ms: slot.timeout_ms,
        command: slot.command,
        command_len: usize::try_from(slot.command_len).unwrap_or(0),
    })
}

/// Copies the command out of its segment and lets the segment go.
fn take_command(index: usize, job: &Job) -> Option<String> {
    // SAFETY: attaches the segment the executor pinned for this slot, copies the command out,
    // unpins and detaches it (it is then destroyed). NULL: it is gone.
    unsafe {
        let segment = pg_sys::dsm_attach(job.command);
        if segment.is_null() {
            return None;
        }
        let address = pg_sys::dsm_segment_address(segment).cast::<u8>();
        let bytes = std::slice::from_raw_parts(address, job.command_len).to_vec();
        SLOTS.exclusive().slot[index].command_taken = true;
        pg_sys::dsm_unpin_segment(job.command);
        pg_sys::dsm_detach(segment);
        String::from_utf8(bytes).ok()
    }
}

/// Writes the outcome into the slot (if it is still this worker's) and wakes the collectors.
fn report(outcome: &Outcome) {
    let Some((index, generation)) = MINE.take() else {
        return;
    };
    {
        let mut slots = SLOTS.exclusive();
        let slot = &mut slots.slot[index];
        if slot.generation == generation && slot.state == RUNNING {
            slot.write_outcome(outcome);
        }
    }
    crate::scheduler::wake::wake_now(true, true);
}

/// The exit of a worker that has not reported: the error it died of, from the server log.
#[pg_guard]
unsafe extern "C-unwind" fn at_exit(code: c_int, _arg: pg_sys::Datum) {
    if MINE.get().is_none() {
        return;
    }
    let (sqlstate, message) = LAST_ERROR.take().unwrap_or_else(|| {
        (
            "58000".to_string(),
            format!("the command's worker exited (code {code}) before it reported an outcome"),
        )
    });
    report(&Outcome::failed(&sqlstate, message));
}

/// Notes each error the server logs in this worker (see LAST_ERROR).
#[pg_guard]
unsafe extern "C-unwind" fn note_error(edata: *mut pg_sys::ErrorData) {
    // SAFETY: the error being reported, valid during the hook.
    unsafe {
        if edata.is_null()
            || (*edata).elevel < PgLogLevel::ERROR as c_int
            || (*edata).message.is_null()
        {
            return;
        }
        let message = CStr::from_ptr((*edata).message)
            .to_string_lossy()
            .into_owned();
        LAST_ERROR.set(Some((unpack_sqlstate((*edata).sqlerrcode), message)));
    }
}

/// A packed SQLSTATE (PGSIXBIT) as its five characters.
fn unpack_sqlstate(code: c_int) -> String {
    let mut n = code;
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
        | pg_sys::panic::CaughtError::RustPanic { ereport: r, .. } => (
            unpack_sqlstate(r.sql_error_code() as c_int),
            r.message().to_string(),
        ),
    }
}

/// Who runs the command and for how long, checked in the task's database as a login would be:
/// the owner exists and may connect here. The timeout: the task's, or the owner's own
/// statement_timeout here.
fn check_owner(job: &Job, database: &str) -> Result<(pg_sys::Oid, i32), (String, String)> {
    let name = CString::new(job.owner.as_str()).unwrap_or_default();
    // SAFETY: a catalog lookup, missing_ok.
    let oid = unsafe { pg_sys::get_role_oid(name.as_ptr(), true) };
    if oid == pg_sys::InvalidOid {
        return Err((
            "42704".into(),
            format!("role \"{}\" of the task no longer exists", job.owner),
        ));
    }
    let may_connect = Spi::get_one_with_args::<bool>(
        "SELECT pg_catalog.has_database_privilege($1, pg_catalog.current_database(), 'CONNECT')",
        &[oid.into()],
    )
    .or_raise(F)
    .unwrap_or(false);
    if !may_connect {
        return Err((
            "42501".into(),
            format!(
                "permission denied for database \"{database}\" (role \"{}\" does not have CONNECT privilege)",
                job.owner
            ),
        ));
    }
    Ok((
        oid,
        crate::security::sealed::effective_timeout_ms(job.timeout_ms, oid),
    ))
}

/// Runs the command as its owner: top-level, one transaction per statement; otherwise all its
/// statements in one implicit transaction block. Within `timeout_ms` in all (0: no limit).
fn execute(job: &Job, database: &str, command: &str) -> Outcome {
    let mut outcome = Outcome {
        statements: 0,
        error: None,
        reported: (None, None),
        tag: None,
    };
    let Ok(text) = CString::new(command) else {
        outcome.error = Some(("22021".into(), "the command contains a NUL byte".into()));
        return outcome;
    };
    let checked = crate::bgw::in_transaction("command owner", || check_owner(job, database));
    let (owner_oid, timeout_ms) = match settled(checked) {
        Ok(found) => found,
        Err(error) => {
            outcome.error = Some(error);
            return outcome;
        }
    };
    let deadline = (timeout_ms > 0)
        .then(|| Instant::now() + Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0)));
    // The parse trees outlive the statements' transactions: they live in a context of their own.
    // SAFETY: a memory context of this process, deleted below.
    let context = unsafe {
        pg_sys::AllocSetContextCreateInternal(
            pg_sys::TopMemoryContext,
            c"pg_tide command".as_ptr(),
            pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
        )
    };
    let parsed = crate::bgw::in_transaction("command parse", || {
        PgTryBuilder::new(AssertUnwindSafe(|| {
            // SAFETY: parses into our own context, as exec_simple_query parses into its own.
            let list = unsafe {
                let old = pg_sys::MemoryContextSwitchTo(context);
                let list = pg_sys::pg_parse_query(text.as_ptr());
                pg_sys::MemoryContextSwitchTo(old);
                list
            };
            Ok(list)
        }))
        .catch_others(|e| Err(caught(&e)))
        .execute()
    });
    let list = match settled(parsed) {
        Ok(list) => list,
        Err(error) => {
            outcome.error = Some(error);
            return outcome;
        }
    };
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
    crate::security::sealed::enter_top_level(job.run_id);
    if job.top_level {
        run_top_level(
            &statements,
            &text,
            context,
            deadline,
            timeout_ms,
            &mut outcome,
        );
    } else {
        run_in_one_transaction(&statements, &text, context, timeout_ms, &mut outcome);
    }
    outcome.reported = crate::security::sealed::leave_top_level();
    // SAFETY: back to the worker's own identity; the parse trees are no longer needed.
    unsafe {
        pg_sys::SetUserIdAndSecContext(saved_user, saved_context);
        pg_sys::MemoryContextDelete(context);
    }
    outcome
}

/// What a step of the worker gave, in its transaction: its value, or the error that stops the
/// command (one the transaction itself failed with is reported as internal, XX000).
fn settled<T>(r: Result<Result<T, (String, String)>, String>) -> Result<T, (String, String)> {
    r.unwrap_or_else(|message| Err(("XX000".into(), message)))
}

fn timeout_spent(timeout_ms: i32) -> (String, String) {
    (
        "57014".into(),
        format!("canceling statement due to statement timeout (the task's timeout of {timeout_ms} ms is spent)"),
    )
}

/// Each statement in its own transaction, as `psql -f` runs a script.
fn run_top_level(
    statements: &[*mut pg_sys::RawStmt],
    text: &CString,
    context: pg_sys::MemoryContext,
    deadline: Option<Instant>,
    timeout_ms: i32,
    outcome: &mut Outcome,
) {
    for &raw in statements {
        let left_ms = match deadline {
            None => 0,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    outcome.error = Some(timeout_spent(timeout_ms));
                    break;
                }
                c_int::try_from(left.as_millis().max(1)).unwrap_or(c_int::MAX)
            }
        };
        let ran = PgTryBuilder::new(AssertUnwindSafe(|| {
            // SAFETY: the statement's life as exec_simple_query leads it, at top level.
            unsafe {
                pg_sys::SetCurrentStatementStartTimestamp();
                pg_sys::StartTransactionCommand();
                if left_ms > 0 {
                    enable_timeout_after(STATEMENT_TIMEOUT, left_ms);
                }
                let tag = run_statement(raw, text, context);
                disable_timeout(STATEMENT_TIMEOUT, false);
                pg_sys::CommitTransactionCommand();
                Ok(tag)
            }
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
            Ok(tag) => {
                outcome.statements += 1;
                outcome.tag = Some(tag);
            }
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
}

/// Every statement in one implicit transaction block, as the simple-query protocol runs a
/// string of several: all or nothing.
fn run_in_one_transaction(
    statements: &[*mut pg_sys::RawStmt],
    text: &CString,
    context: pg_sys::MemoryContext,
    timeout_ms: i32,
    outcome: &mut Outcome,
) {
    let ran = PgTryBuilder::new(AssertUnwindSafe(|| {
        let mut done = 0;
        let mut last = None;
        // SAFETY: exec_simple_query's sequence for a string of several statements: one
        // transaction, an implicit block around them, each statement run and followed by a
        // command counter increment, the block ended and committed after the last.
        unsafe {
            pg_sys::SetCurrentStatementStartTimestamp();
            pg_sys::StartTransactionCommand();
            pg_sys::BeginImplicitTransactionBlock();
            if timeout_ms > 0 {
                enable_timeout_after(STATEMENT_TIMEOUT, timeout_ms);
            }
            for &raw in statements {
                last = Some(run_statement(raw, text, context));
                pg_sys::CommandCounterIncrement();
                done += 1;
            }
            disable_timeout(STATEMENT_TIMEOUT, false);
            pg_sys::EndImplicitTransactionBlock();
            pg_sys::CommitTransactionCommand();
        }
        Ok((done, last))
    }))
    .catch_others(|e| Err(caught(&e)))
    .execute();
    // SAFETY: disarms the timer; after an error, aborts the transaction and its block.
    unsafe {
        disable_timeout(STATEMENT_TIMEOUT, false);
        if ran.is_err() {
            pg_sys::AbortCurrentTransaction();
            pg_sys::AbortOutOfAnyTransaction();
        }
    }
    match ran {
        Ok((done, tag)) => {
            outcome.statements = done;
            outcome.tag = tag;
        }
        Err(error) => outcome.error = Some(error),
    }
}

/// One statement in the current transaction: analyze, plan, run through a portal. The query and
/// plan trees live in `context`, not in the transaction's memory: a statement such as `VACUUM`
/// commits and starts transactions itself, which would free them under the portal
/// (exec_simple_query keeps them in its MessageContext for the same reason). Returns the
/// statement's command tag, with its row count where psql shows one (`UPDATE 3`).
///
/// # Safety
/// Called inside a transaction, in a backend connected to a database; `context` outlives the
/// call.
unsafe fn run_statement(
    raw: *mut pg_sys::RawStmt,
    text: &CString,
    context: pg_sys::MemoryContext,
) -> String {
    unsafe {
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
        crate::base::pgversion::portal_run(portal, dest, &mut qc);
        if let Some(destroy) = (*dest).rDestroy {
            destroy(dest);
        }
        pg_sys::PortalDrop(portal, false);
        completion_tag(&qc)
    }
}

/// A statement's completion as psql shows it: `VACUUM`, `UPDATE 3`, `INSERT 0 1`.
fn completion_tag(qc: &pg_sys::QueryCompletion) -> String {
    // SAFETY: PostgreSQL's static name of a command tag.
    let name = unsafe {
        CStr::from_ptr(pg_sys::GetCommandTagName(qc.commandTag))
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: a lookup in PostgreSQL's table of command tags.
    if !unsafe { pg_sys::command_tag_display_rowcount(qc.commandTag) } {
        return name;
    }
    if qc.commandTag == pg_sys::CommandTag::CMDTAG_INSERT {
        format!("{name} 0 {}", qc.nprocessed)
    } else {
        format!("{name} {}", qc.nprocessed)
    }
}

#[cfg(test)]
mod tests {
    use super::{put, text, unpack_sqlstate};

    #[test]
    fn text_is_cut_at_a_character_boundary() {
        let mut buf = [0u8; 5];
        // "é" takes two bytes: the third character would straddle the end.
        let len = put(&mut buf, "abéé");
        assert_eq!(len, 4);
        assert_eq!(text(&buf, len), "abé");
        let len = put(&mut buf, "");
        assert_eq!(text(&buf, len), "");
        let len = put(&mut buf, "xyz");
        assert_eq!(text(&buf, len), "xyz");
    }

    #[test]
    fn sqlstates_unpack_as_postgres_packs_them() {
        // MAKE_SQLSTATE: each character's (code - '0') in six bits, the first lowest.
        let pack = |s: &str| -> i32 {
            s.bytes()
                .enumerate()
                .map(|(i, b)| (i32::from(b - b'0') & 0x3F) << (6 * i))
                .sum()
        };
        for code in ["57014", "3D000", "42501", "22012", "P0001", "XX000"] {
            assert_eq!(unpack_sqlstate(pack(code)), code);
        }
    }
}

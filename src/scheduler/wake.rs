//! Waking the workers when there is work, rather than letting them find it at their next poll.
//!
//! The scheduler and each executor note their `PGPROC` number in shared memory when they start.
//! A transaction that made an SQL run ready (an emit, an enqueue, a retry that came due, a run
//! the tick created) calls `tide._wake(false)`: at its commit — not before, or an executor
//! would look before the run is visible — the executors' latches are set, and an idle executor
//! claims at once. `tide.schedule` and `tide.alter` call `tide._wake(true)`: the scheduler
//! looks again at when it must next tick (it sleeps until the next fire, `tide._next_wake`).
//! A wake that finds nothing costs one claim query; one that is missed (a worker restarting)
//! costs at most the poll interval, as before.
//!
//! External workers are woken by `NOTIFY pg_tide_ready`, with an empty payload: a queue's name
//! belongs to its owner, and any role may LISTEN (each worker claims what its own row security
//! lets it see). A transaction that sends a notification holds a database-wide lock from just
//! before its commit until its commit record is flushed, so notifying transactions commit one
//! after another (measured: a bare INSERT with a `pg_notify` beside it committed half as often
//! from 4 clients). So in the database pg_tide serves, a transaction that made runs ready calls
//! `tide._ready(queues)`: at its commit a flag is set in shared memory and the notifier worker's
//! latch is set; the notifier sends one `NOTIFY pg_tide_ready` per round, in a transaction of
//! its own (asynchronous commit: a notification lost in a crash costs a worker one poll). In
//! another database (no notifier serves it) `tide._ready` notifies in the caller's transaction,
//! as `pg_notify` does.
//!
//! A notification is a hint, never a dependency: no notification of pg_tide's is sent while
//! PostgreSQL's notification queue is half full or more (a session that LISTENs in a
//! transaction it keeps open holds every notification after it in the queue), since at a full
//! queue the commit that would send it fails (54000). Workers then find their runs at their
//! next poll, and `tide.self_health` warns.

use std::cell::Cell;
use std::ffi::CString;
use std::time::Duration;

use pgrx::lwlock::PgLwLock;
use pgrx::prelude::*;
use pgrx::{pg_sys, PGRXSharedMemory, PgXactCallbackEvent};

use crate::base::sqlerr::OrRaise;

const SLOTS: usize = 67;
/// The notifier's slot in `Procs`.
pub const NOTIFIER: usize = 65;
/// The delivery worker's slot in `Procs`.
pub const DELIVERY: usize = 66;

#[derive(Copy, Clone)]
#[repr(C)]
pub struct Procs {
    /// Slot 0: the scheduler; 1..=64: executor n; 65: the notifier; 66: the delivery worker.
    /// -1: none.
    procno: [i32; SLOTS],
}

impl Default for Procs {
    fn default() -> Self {
        Procs {
            procno: [-1; SLOTS],
        }
    }
}

// SAFETY: plain data, shared across processes under the LWLock.
unsafe impl PGRXSharedMemory for Procs {}

// SAFETY: the name is unique to pg_tide.
static PROCS: PgLwLock<Procs> = unsafe { PgLwLock::new(c"pg_tide_wake") };

thread_local! {
    /// What this transaction will wake at its commit: executors, scheduler.
    static ARMED: Cell<(bool, bool)> = const { Cell::new((false, false)) };
}

/// Whether runs were made ready since the notifier's last round.
#[derive(Copy, Clone, Default)]
#[repr(C)]
pub struct Ready {
    ready: bool,
}

// SAFETY: plain data, shared across processes under the LWLock.
unsafe impl PGRXSharedMemory for Ready {}

// SAFETY: the name is unique to pg_tide.
static READY: PgLwLock<Ready> = unsafe { PgLwLock::new(c"pg_tide_ready") };

thread_local! {
    /// Whether this transaction made runs ready, noted for the notifier at its commit.
    static READY_HERE: Cell<bool> = const { Cell::new(false) };
    /// Whether this backend's database is the one pg_tide serves (asked once: it never changes).
    static SERVED: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Requests and sets up the shared slots (from `_PG_init` while preloading).
#[allow(unexpected_cfgs)]
pub fn init_shared() {
    pgrx::pg_shmem_init!(PROCS);
    pgrx::pg_shmem_init!(READY);
}

/// This process's PGPROC number, for another to set its latch (`set_latch`): its place in
/// ProcGlobal->allProcs, as PostgreSQL 17's GetNumberFromPGProc computes it (PGPROC lost its
/// `pgprocno` field there; up to 16 the field held the same number).
pub fn procno() -> i32 {
    // SAFETY: MyProc is set for every process attached to shared memory, workers included,
    // and points into ProcGlobal->allProcs.
    unsafe { pg_sys::MyProc.offset_from((*pg_sys::ProcGlobal).allProcs) as i32 }
}

/// The scheduler (slot 0) or executor `n` notes its PGPROC number.
pub fn register(slot: usize) {
    if slot < SLOTS {
        PROCS.exclusive().procno[slot] = procno();
    }
}

/// Sets the delivery worker's latch now (a test message to send).
pub fn wake_delivery() {
    set_latch(PROCS.share().procno[DELIVERY]);
}

pub fn set_latch(procno: i32) {
    if procno < 0 {
        return;
    }
    // SAFETY: ProcGlobal->allProcs has one PGPROC per procno for the server's life; setting
    // the latch of a PGPROC a process no longer uses (or another one now does) only wakes
    // that process once for nothing.
    unsafe {
        let global = pg_sys::ProcGlobal;
        if global.is_null() {
            return;
        }
        let total = (*global).allProcCount as i32;
        if procno >= total {
            return;
        }
        let proc_ = (*global).allProcs.add(procno as usize);
        pg_sys::SetLatch(&mut (*proc_).procLatch);
    }
}

/// Sets the latches of the executors (and the scheduler) now.
pub fn wake_now(executors: bool, scheduler: bool) {
    let procs = *PROCS.share();
    if scheduler {
        set_latch(procs.procno[0]);
    }
    if executors {
        for p in &procs.procno[1..NOTIFIER] {
            set_latch(*p);
        }
    }
}

/// At the commit of this transaction, wakes the executors (there is a ready SQL run) or the
/// scheduler (a task's schedule changed). Once per transaction and kind; nothing on abort.
#[pg_extern(volatile, parallel_unsafe, schema = "tide", name = "_wake")]
fn wake_at_commit(scheduler: bool) {
    let (executors_armed, scheduler_armed) = ARMED.get();
    let first = !executors_armed && !scheduler_armed;
    ARMED.set((executors_armed || !scheduler, scheduler_armed || scheduler));
    if first {
        pgrx::register_xact_callback(PgXactCallbackEvent::Commit, || {
            let (executors, scheduler) = ARMED.replace((false, false));
            wake_now(executors, scheduler);
        });
        pgrx::register_xact_callback(PgXactCallbackEvent::Abort, || {
            ARMED.set((false, false));
        });
        // A prepared transaction's runs become visible at COMMIT PREPARED, maybe in another
        // session: the executors find them at their next poll.
        pgrx::register_xact_callback(PgXactCallbackEvent::Prepare, || {
            ARMED.set((false, false));
        });
    }
}

/// Whether this backend works in the database pg_tide serves (where the notifier runs).
fn served() -> bool {
    if let Some(known) = SERVED.get() {
        return known;
    }
    // SAFETY: a catalog lookup of this backend's own database, inside the caller's transaction.
    let here = unsafe {
        let name = pg_sys::get_database_name(pg_sys::MyDatabaseId);
        (!name.is_null()).then(|| {
            std::ffi::CStr::from_ptr(name)
                .to_string_lossy()
                .into_owned()
        })
    };
    let known = here.as_deref() == Some(crate::settings::database().as_str());
    SERVED.set(Some(known));
    known
}

extern "C-unwind" {
    /// What `pg_notify(channel, payload)` calls (commands/async.c): queues a notification,
    /// sent at the transaction's commit.
    fn Async_Notify(channel: *const std::ffi::c_char, payload: *const std::ffi::c_char);
}

/// Below this share of PostgreSQL's notification queue in use, pg_tide notifies; at or above,
/// it does not (see the module's comment).
pub const QUEUE_USAGE_MOST: f64 = 0.5;

/// Whether a notification may be sent now: the notification queue is less than half full.
fn may_notify() -> bool {
    // SAFETY: pg_notification_queue_usage() takes no arguments and reads the queue's head and
    // tail under its lock.
    let usage =
        unsafe { pgrx::direct_function_call::<f64>(pg_sys::pg_notification_queue_usage, &[]) };
    usage.is_some_and(|u| u < QUEUE_USAGE_MOST)
}

/// Sends a notification at the current transaction's commit, unless the notification queue is
/// half full; true if it will.
fn notify(channel: &std::ffi::CStr, payload: &std::ffi::CStr) -> bool {
    if !may_notify() {
        return false;
    }
    // SAFETY: what pg_notify() does, inside a transaction; both strings outlive the call (the
    // notification is copied into the transaction's memory). An error it raises is turned
    // into a Rust panic at the boundary, and reported as an error.
    unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| Async_Notify(channel.as_ptr(), payload.as_ptr()));
    }
    true
}

/// Runs of these queues were made ready (their names are not sent): waiting workers are
/// notified once this transaction commits (by the notifier, or here outside the database
/// pg_tide serves). Nothing on abort.
#[pg_extern(volatile, parallel_unsafe, schema = "tide", name = "_ready")]
fn ready_at_commit(queues: Vec<Option<String>>) {
    if queues.iter().all(Option::is_none) {
        return;
    }
    if !served() {
        notify(c"pg_tide_ready", c"");
        return;
    }
    if READY_HERE.replace(true) {
        return;
    }
    pgrx::register_xact_callback(PgXactCallbackEvent::Commit, || {
        READY_HERE.set(false);
        READY.exclusive().ready = true;
        set_latch(PROCS.share().procno[NOTIFIER]);
    });
    pgrx::register_xact_callback(PgXactCallbackEvent::Abort, || {
        READY_HERE.set(false);
    });
    // A prepared transaction's runs become visible at COMMIT PREPARED, maybe in another
    // session: workers find them at their next poll.
    pgrx::register_xact_callback(PgXactCallbackEvent::Prepare, || {
        READY_HERE.set(false);
    });
}

/// The notifier: sends one `NOTIFY pg_tide_ready` for what committed transactions noted since
/// its last round, in a transaction of its own. See the module's comment.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_tide_notifier_main(_arg: pg_sys::Datum) {
    crate::bgw::start("pg_tide notifier");
    register(NOTIFIER);
    loop {
        let ready = std::mem::take(&mut READY.exclusive().ready);
        if ready {
            // A failed round is logged (workers find their runs at their next poll).
            let _ = crate::bgw::in_transaction("ready notifications", notify_round);
        } else if !crate::bgw::wait(Duration::from_secs(60)) {
            break;
        }
    }
    crate::bgw::exit_for_restart();
}

/// One round: one notification, if pg_tide is installed here and this is not a standby.
fn notify_round() {
    // SAFETY: reads shared recovery state; an index lookup in pg_extension.
    let installed = unsafe {
        !pg_sys::RecoveryInProgress()
            && pg_sys::get_extension_oid(c"pg_tide".as_ptr(), true) != pg_sys::InvalidOid
    };
    if !installed {
        return;
    }
    // The notification only wakes workers: not worth a flush of its own.
    Spi::run("SET LOCAL synchronous_commit = off").or_raise("pg_tide notifier");
    notify(c"pg_tide_ready", c"");
}

/// `tide._notify(channel, payload)`: `pg_notify` unless the notification queue is half full
/// (see the module's comment); true if it notified. pg_tide's every notification goes through
/// it, so that none can make a commit fail.
#[pg_extern(volatile, parallel_unsafe, schema = "tide", name = "_notify")]
fn notify_hint(channel: &str, payload: &str) -> bool {
    match (CString::new(channel), CString::new(payload)) {
        (Ok(channel), Ok(payload)) => notify(&channel, &payload),
        _ => false,
    }
}

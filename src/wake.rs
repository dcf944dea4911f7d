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

use std::cell::Cell;

use pgrx::lwlock::PgLwLock;
use pgrx::prelude::*;
use pgrx::{pg_sys, PGRXSharedMemory, PgXactCallbackEvent};

const SLOTS: usize = 65;

#[derive(Copy, Clone)]
#[repr(C)]
pub struct Procs {
    /// Slot 0: the scheduler; 1..=64: executor n. -1: none.
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

/// Requests and sets up the shared slots (from `_PG_init` while preloading).
#[allow(unexpected_cfgs)]
pub fn init_shared() {
    pgrx::pg_shmem_init!(PROCS);
}

fn my_procno() -> i32 {
    // SAFETY: MyProc is set for every process attached to shared memory, workers included.
    unsafe { (*pg_sys::MyProc).pgprocno }
}

/// The scheduler (slot 0) or executor `n` notes its PGPROC number.
pub fn register(slot: usize) {
    if slot < SLOTS {
        PROCS.exclusive().procno[slot] = my_procno();
    }
}

fn set_latch(procno: i32) {
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
        for p in &procs.procno[1..] {
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

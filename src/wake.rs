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
//! External workers are woken by `NOTIFY pg_tide_ready` (payload: the queue). A transaction
//! that sends a notification holds a database-wide lock from just before its commit until its
//! commit record is flushed, so notifying transactions commit one after another (measured: a
//! bare INSERT with a `pg_notify` beside it committed half as often from 4 clients). So in the
//! database pg_tide serves, a transaction that made runs ready calls `tide._ready(queues)`: at
//! its commit the queues are noted in shared memory and the notifier worker's latch is set; the
//! notifier sends one `NOTIFY pg_tide_ready` per queue noted, in a transaction of its own
//! (asynchronous commit: a notification lost in a crash costs a worker one poll). In another
//! database (no notifier serves it) `tide._ready` notifies in the caller's transaction, as
//! `pg_notify` does.

use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::time::Duration;

use pgrx::lwlock::PgLwLock;
use pgrx::prelude::*;
use pgrx::{pg_sys, PGRXSharedMemory, PgXactCallbackEvent};

use crate::sqlerr::OrRaise;

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

/// Queues noted for one shared note: more distinct queues between two rounds of the notifier
/// (or a longer name) set `all`, and it notifies every queue with ready runs.
const READY_SLOTS: usize = 32;
/// Queue names are at most 63 bytes (`tide._queue_name`).
const NAME_BYTES: usize = 64;

/// The queues whose ready runs committed since the notifier's last round.
#[derive(Copy, Clone)]
#[repr(C)]
pub struct Ready {
    count: usize,
    all: bool,
    len: [u8; READY_SLOTS],
    names: [[u8; NAME_BYTES]; READY_SLOTS],
}

impl Default for Ready {
    fn default() -> Self {
        Ready {
            count: 0,
            all: false,
            len: [0; READY_SLOTS],
            names: [[0; NAME_BYTES]; READY_SLOTS],
        }
    }
}

impl Ready {
    /// Notes a queue once; when there is no room, or the name does not fit, notes `all`.
    fn note(&mut self, queue: &str) {
        let bytes = queue.as_bytes();
        if self.all {
            return;
        }
        let known = (0..self.count).any(|i| &self.names[i][..usize::from(self.len[i])] == bytes);
        if known {
            return;
        }
        if self.count == READY_SLOTS || bytes.len() >= NAME_BYTES {
            self.all = true;
            return;
        }
        self.names[self.count][..bytes.len()].copy_from_slice(bytes);
        self.len[self.count] = bytes.len() as u8;
        self.count += 1;
    }

    /// What is noted, emptied: the queues, and whether every queue with ready runs is meant.
    fn take(&mut self) -> (Vec<String>, bool) {
        let names = (0..self.count)
            .map(|i| {
                String::from_utf8_lossy(&self.names[i][..usize::from(self.len[i])]).into_owned()
            })
            .collect();
        let all = self.all;
        self.count = 0;
        self.all = false;
        (names, all)
    }
}

// SAFETY: plain data, shared across processes under the LWLock.
unsafe impl PGRXSharedMemory for Ready {}

// SAFETY: the name is unique to pg_tide.
static READY: PgLwLock<Ready> = unsafe { PgLwLock::new(c"pg_tide_ready") };

thread_local! {
    /// The queues this transaction made runs ready in, noted for the notifier at its commit.
    static READY_HERE: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    /// Whether this backend's database is the one pg_tide serves (asked once: it never changes).
    static SERVED: Cell<Option<bool>> = const { Cell::new(None) };
}

/// Requests and sets up the shared slots (from `_PG_init` while preloading).
#[allow(unexpected_cfgs)]
pub fn init_shared() {
    pgrx::pg_shmem_init!(PROCS);
    pgrx::pg_shmem_init!(READY);
}

/// This process's PGPROC number, for another to set its latch (`set_latch`).
pub fn procno() -> i32 {
    // SAFETY: MyProc is set for every process attached to shared memory, workers included.
    unsafe { (*pg_sys::MyProc).pgprocno }
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

/// `NOTIFY pg_tide_ready, queue` in the current transaction (sent at its commit).
fn notify_now(queue: &str) {
    let Ok(payload) = CString::new(queue) else {
        return;
    };
    // SAFETY: what pg_notify() does, inside a transaction; both strings outlive the call (the
    // notification is copied into the transaction's memory). An error it raises is turned into
    // a Rust panic at the boundary, and reported as an error.
    unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| {
            Async_Notify(c"pg_tide_ready".as_ptr(), payload.as_ptr())
        });
    }
}

/// Runs of these queues were made ready: their waiting workers are notified once this
/// transaction commits (by the notifier, or here outside the database pg_tide serves).
/// Nothing on abort.
#[pg_extern(volatile, parallel_unsafe, schema = "tide", name = "_ready")]
fn ready_at_commit(queues: Vec<Option<String>>) {
    let queues = queues.into_iter().flatten();
    if !served() {
        for q in queues {
            notify_now(&q);
        }
        return;
    }
    let first = READY_HERE.with_borrow_mut(|here| {
        let first = here.is_empty();
        for q in queues {
            if !here.contains(&q) {
                here.push(q);
            }
        }
        first && !here.is_empty()
    });
    if first {
        pgrx::register_xact_callback(PgXactCallbackEvent::Commit, || {
            let here = READY_HERE.take();
            {
                let mut shared = READY.exclusive();
                for q in &here {
                    shared.note(q);
                }
            }
            set_latch(PROCS.share().procno[NOTIFIER]);
        });
        pgrx::register_xact_callback(PgXactCallbackEvent::Abort, || {
            READY_HERE.take();
        });
        // A prepared transaction's runs become visible at COMMIT PREPARED, maybe in another
        // session: workers find them at their next poll.
        pgrx::register_xact_callback(PgXactCallbackEvent::Prepare, || {
            READY_HERE.take();
        });
    }
}

/// The notifier: sends the `NOTIFY pg_tide_ready` that committed transactions noted, one per
/// queue and round, in a transaction of its own. See the module's comment.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_tide_notifier_main(_arg: pg_sys::Datum) {
    crate::worker::start("pg_tide notifier");
    register(NOTIFIER);
    loop {
        let (queues, all) = READY.exclusive().take();
        if !queues.is_empty() || all {
            // A failed round is logged (its queues' workers find their runs at their next poll).
            let _ =
                crate::worker::in_transaction("ready notifications", || notify_round(&queues, all));
        } else if !crate::worker::wait(Duration::from_secs(60)) {
            break;
        }
    }
    crate::worker::exit_for_restart();
}

/// One round: the queues noted, or (`all`) every queue with ready runs.
fn notify_round(queues: &[String], all: bool) {
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
    for q in queues {
        notify_now(q);
    }
    if all {
        Spi::connect(|client| {
            let rows = client
                .select(
                    "SELECT DISTINCT p.queue FROM tide.pending p WHERE p.state = 'ready'",
                    None,
                    &[],
                )
                .or_raise("pg_tide notifier");
            for row in rows {
                if let Some(q) = row.get::<String>(1).or_raise("pg_tide notifier") {
                    notify_now(&q);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{Ready, NAME_BYTES, READY_SLOTS};

    #[test]
    fn a_queue_is_noted_once_and_taking_empties_the_note() {
        let mut r = Ready::default();
        r.note("billing");
        r.note("mail");
        r.note("billing");
        assert_eq!(
            r.take(),
            (vec!["billing".to_string(), "mail".to_string()], false)
        );
        assert_eq!(r.take(), (Vec::new(), false));
    }

    #[test]
    fn beyond_the_slots_or_with_a_long_name_every_queue_is_meant() {
        let mut r = Ready::default();
        for i in 0..READY_SLOTS {
            r.note(&format!("q{i}"));
        }
        assert!(!r.all);
        r.note("q0");
        assert!(!r.all, "a queue noted before takes no slot");
        r.note("one_more");
        let (names, all) = r.take();
        assert_eq!((names.len(), all), (READY_SLOTS, true));
        assert_eq!(r.take(), (Vec::new(), false));

        r.note(&"x".repeat(NAME_BYTES));
        assert_eq!(r.take(), (Vec::new(), true));
        r.note(&"x".repeat(NAME_BYTES - 1));
        assert_eq!(r.take(), (vec!["x".repeat(NAME_BYTES - 1)], false));
    }
}

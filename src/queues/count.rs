//! The running counts of queues with a `max_concurrency` (src/queues/queues.sql), kept in shared memory
//! so that neither a claim nor a completion writes a row of its queue.
//!
//! The count of a queue is the number of its runs that are running and were counted
//! (`tide.pending.counted`, set by the claim that admitted them) in committed state, plus the
//! runs that claims still in progress reserved. A claim reserves at once (two claims never see
//! the same room) and gives back if it aborts; a run that stops running is subtracted when its
//! transaction commits (until then its room stays taken). Subtransactions are followed: what a
//! rolled-back subtransaction reserved or released is undone.
//!
//! Shared memory is lost with a restart (and a crash), and `tide.create_queue` marks a queue's
//! count stale when it commits. A stale count is counted again from `tide.pending` by the next
//! claim of the queue, with the latest snapshot, while it holds the queue's lock exclusively.
//! Every transaction that reserves or releases holds that lock in share mode until it ends, so
//! the recount sees every change that reached the count and none that did not. The lock is an
//! advisory lock tag (`objsubid` 3) that no SQL function can take, so no role can block it.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use pgrx::lwlock::PgLwLock;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::{pg_sys, IntoDatum, PGRXSharedMemory, PgLogLevel};

/// How many queues with a limit the shared table holds at once (beyond, a queue's count is
/// dropped and counted again at its next claim).
const ENTRIES: usize = 1024;
const NAME: usize = 64;

#[derive(Copy, Clone)]
#[repr(C)]
struct Entry {
    used: bool,
    valid: bool,
    db: u32,
    owner: [u8; NAME],
    queue: [u8; NAME],
    running: i64,
}

const EMPTY: Entry = Entry {
    used: false,
    valid: false,
    db: 0,
    owner: [0; NAME],
    queue: [0; NAME],
    running: 0,
};

#[derive(Copy, Clone)]
#[repr(C)]
pub struct Counts {
    entries: [Entry; ENTRIES],
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            entries: [EMPTY; ENTRIES],
        }
    }
}

// SAFETY: plain data (no pointers), shared across processes under the LWLock.
unsafe impl PGRXSharedMemory for Counts {}

// SAFETY: the name is unique to pg_tide.
static COUNTS: PgLwLock<Counts> = unsafe { PgLwLock::new(c"pg_tide_queue_counts") };

/// A queue's identity: database, owner, name (both at most 63 bytes).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Key {
    db: u32,
    owner: [u8; NAME],
    queue: [u8; NAME],
}

fn key(owner: &str, queue: &str) -> Key {
    let mut k = Key {
        // SAFETY: a backend's database, set before any SQL runs.
        db: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        owner: [0; NAME],
        queue: [0; NAME],
    };
    let (o, q) = (owner.as_bytes(), queue.as_bytes());
    k.owner[..o.len().min(NAME - 1)].copy_from_slice(&o[..o.len().min(NAME - 1)]);
    k.queue[..q.len().min(NAME - 1)].copy_from_slice(&q[..q.len().min(NAME - 1)]);
    k
}

impl Key {
    fn matches(&self, e: &Entry) -> bool {
        e.used && e.db == self.db && e.owner == self.owner && e.queue == self.queue
    }

    /// The queue's lock tag: an advisory tag with objsubid 3, which the SQL advisory lock
    /// functions (1 and 2) cannot name. It holds the owner's role id and a hash of the queue's
    /// name: two queues can share a tag only if they have the same owner, so no role can name a
    /// queue whose tag collides with another role's and hold up its recount.
    fn locktag(&self) -> pg_sys::LOCKTAG {
        // FNV-1a of the queue's name.
        let mut h: u32 = 0x811c_9dc5;
        for b in self.queue.iter() {
            h ^= u32::from(*b);
            h = h.wrapping_mul(0x0100_0193);
        }
        // SAFETY: owner is NUL-terminated (at most NAME - 1 bytes are copied into it).
        let role = unsafe { pg_sys::get_role_oid(self.owner.as_ptr().cast(), true) };
        pg_sys::LOCKTAG {
            locktag_field1: self.db,
            locktag_field2: role.to_u32(),
            locktag_field3: h,
            locktag_field4: 3,
            locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
            locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
        }
    }

    fn lock(&self, mode: u32) {
        let tag = self.locktag();
        // SAFETY: a valid tag; waits (honouring lock_timeout and cancel) or raises.
        unsafe {
            pg_sys::LockAcquire(&tag, mode as pg_sys::LOCKMODE, false, false);
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Taken now; given back if the transaction (or subtransaction) rolls back.
    Reserve,
    /// Given back when the transaction commits.
    Release,
    /// The count is stale once the transaction commits.
    Forget,
}

#[derive(Clone, Copy)]
struct Delta {
    key: Key,
    kind: Kind,
    n: i64,
    sub: pg_sys::SubTransactionId,
}

thread_local! {
    static LOCAL: RefCell<Vec<Delta>> = const { RefCell::new(Vec::new()) };
    static REGISTERED: RefCell<bool> = const { RefCell::new(false) };
}

/// Set by `_PG_init` in the postmaster when pg_tide is preloaded (backends inherit it): the
/// shared table exists only then.
pub static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Requests and sets up the shared table (from `_PG_init` while preloading).
// The macro tests for every PostgreSQL version pgrx supports, not only this crate's features.
#[allow(unexpected_cfgs)]
pub fn init_shared() {
    pgrx::pg_shmem_init!(COUNTS);
    PRELOADED.store(true, Ordering::Relaxed);
}

fn available() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

fn fail(code: PgSqlErrorCode, message: String, hint: &str) -> ! {
    ErrorReport::new(code, message, "tide._queue_reserve")
        .set_hint(hint)
        .report(PgLogLevel::ERROR);
    unreachable!("ereport(ERROR) returned")
}

fn require() {
    if !available() {
        fail(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "queue limits need pg_tide in shared_preload_libraries".into(),
            "add pg_tide to shared_preload_libraries in postgresql.conf and restart PostgreSQL",
        );
    }
}

fn register() {
    REGISTERED.with(|r| {
        if !*r.borrow() {
            // SAFETY: registered once per backend; the callbacks only touch this module's state.
            unsafe {
                pg_sys::RegisterXactCallback(Some(on_xact), std::ptr::null_mut());
                pg_sys::RegisterSubXactCallback(Some(on_subxact), std::ptr::null_mut());
            }
            *r.borrow_mut() = true;
        }
    });
}

fn record(key: Key, kind: Kind, n: i64) {
    register();
    // SAFETY: inside a transaction.
    let sub = unsafe { pg_sys::GetCurrentSubTransactionId() };
    LOCAL.with(|l| {
        let mut l = l.borrow_mut();
        if let Some(d) = l
            .iter_mut()
            .find(|d| d.key == key && d.kind == kind && d.sub == sub)
        {
            d.n += n;
        } else {
            l.push(Delta { key, kind, n, sub });
        }
    });
}

/// Applies `f` to the queue's entry if it is valid.
fn with_valid(counts: &mut Counts, key: &Key, f: impl FnOnce(&mut Entry)) {
    if let Some(e) = counts
        .entries
        .iter_mut()
        .find(|e| key.matches(e) && e.valid)
    {
        f(e);
    }
}

fn give_back(counts: &mut Counts, key: &Key, n: i64) {
    with_valid(counts, key, |e| e.running = (e.running - n).max(0));
}

#[pg_guard]
unsafe extern "C-unwind" fn on_xact(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_PREPARE => {
            let busy = LOCAL.with(|l| !l.borrow().is_empty());
            if busy {
                fail(
                    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                    "cannot PREPARE a transaction that claimed or ended runs of a queue with a max_concurrency".into(),
                    "claim and complete runs of limited queues outside prepared (two-phase) transactions",
                );
            }
        }
        XACT_EVENT_COMMIT
        | XACT_EVENT_PARALLEL_COMMIT
        | XACT_EVENT_ABORT
        | XACT_EVENT_PARALLEL_ABORT => {
            let deltas = LOCAL.with(|l| std::mem::take(&mut *l.borrow_mut()));
            if deltas.is_empty() || !available() {
                return;
            }
            let commit = matches!(event, XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT);
            let mut counts = COUNTS.exclusive();
            for d in &deltas {
                match (d.kind, commit) {
                    (Kind::Release, true) | (Kind::Reserve, false) => {
                        give_back(&mut counts, &d.key, d.n)
                    }
                    (Kind::Forget, true) => with_valid(&mut counts, &d.key, |e| e.valid = false),
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn on_subxact(
    event: pg_sys::SubXactEvent::Type,
    sub: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    _arg: *mut c_void,
) {
    use pg_sys::SubXactEvent::*;
    match event {
        SUBXACT_EVENT_COMMIT_SUB => LOCAL.with(|l| {
            for d in l.borrow_mut().iter_mut().filter(|d| d.sub == sub) {
                d.sub = parent;
            }
        }),
        SUBXACT_EVENT_ABORT_SUB => {
            let undone: Vec<Delta> = LOCAL.with(|l| {
                let mut l = l.borrow_mut();
                let (gone, kept): (Vec<Delta>, Vec<Delta>) = l.iter().partition(|d| d.sub == sub);
                *l = kept;
                gone
            });
            if undone.iter().any(|d| d.kind == Kind::Reserve) && available() {
                let mut counts = COUNTS.exclusive();
                for d in undone.iter().filter(|d| d.kind == Kind::Reserve) {
                    give_back(&mut counts, &d.key, d.n);
                }
            }
        }
        _ => {}
    }
}

/// The committed running runs of a queue that were counted, read with the latest snapshot
/// (whatever the transaction's isolation level).
fn count_latest(owner: &str, queue: &str) -> i64 {
    let owner_d = owner.into_datum().expect("a text datum");
    let queue_d = queue.into_datum().expect("a text datum");
    let query = c"SELECT count(*) FROM tide.pending p WHERE p.owner = $1::name AND p.queue = $2 AND p.state = 'running' AND p.counted";
    // SAFETY: SPI used as documented: connect, prepare, execute with a snapshot, read one
    // int8, finish. Errors are raised by PostgreSQL and unwind through pgrx's guard.
    unsafe {
        pg_sys::SPI_connect();
        let mut types = [pg_sys::TEXTOID, pg_sys::TEXTOID];
        let plan = pg_sys::SPI_prepare(query.as_ptr(), 2, types.as_mut_ptr());
        if plan.is_null() {
            pg_sys::SPI_finish();
            error!("pg_tide: could not prepare the queue recount");
        }
        let mut values = [owner_d, queue_d];
        let nulls = [b' ' as std::ffi::c_char, b' ' as std::ffi::c_char];
        let rc = pg_sys::SPI_execute_snapshot(
            plan,
            values.as_mut_ptr(),
            nulls.as_ptr(),
            pg_sys::GetLatestSnapshot(),
            std::ptr::null_mut(),
            true,
            false,
            1,
        );
        if rc != pg_sys::SPI_OK_SELECT as i32 || pg_sys::SPI_processed != 1 {
            pg_sys::SPI_finish();
            error!("pg_tide: the queue recount failed ({rc})");
        }
        let table = pg_sys::SPI_tuptable;
        let mut isnull = false;
        let datum = pg_sys::SPI_getbinval(*(*table).vals, (*table).tupdesc, 1, &mut isnull);
        let n = if isnull { 0 } else { datum.value() as i64 };
        pg_sys::SPI_finish();
        n
    }
}

/// Reserves room for up to `n` runs of a queue limited to `lim` running at once; returns how
/// many, or -1 when the queue's count is stale (`tide._queue_count_again` first).
#[pg_extern(volatile, parallel_unsafe, schema = "tide", name = "_queue_reserve")]
#[search_path(pg_catalog, pg_temp)]
fn queue_reserve(owner: &str, queue: &str, lim: i32, n: i32) -> i32 {
    require();
    let k = key(owner, queue);
    let valid = |counts: &Counts| counts.entries.iter().any(|e| k.matches(e) && e.valid);
    if !valid(&COUNTS.share()) {
        return -1;
    }
    // Held until this transaction ends: no recount of the queue can happen meanwhile.
    k.lock(pg_sys::ShareLock);
    let mut counts = COUNTS.exclusive();
    let Some(e) = counts.entries.iter_mut().find(|e| k.matches(e) && e.valid) else {
        // Made stale in between (tide.create_queue committed).
        return -1;
    };
    let got = (i64::from(lim) - e.running).clamp(0, i64::from(n.max(0)));
    e.running += got;
    drop(counts);
    if got > 0 {
        record(k, Kind::Reserve, got);
    }
    got as i32
}

/// Counts a queue's running runs again (its count was stale): waits for the queue's lock held
/// exclusively (no reservation or release of the queue is then in flight in any session;
/// lock_timeout bounds the wait), counts with the latest snapshot and stores the count. False
/// when this transaction reserved or released for the queue itself (its own changes would be
/// counted twice): its candidates wait for a later claim.
#[pg_extern(
    volatile,
    parallel_unsafe,
    schema = "tide",
    name = "_queue_count_again"
)]
#[search_path(pg_catalog, pg_temp)]
fn queue_count_again(owner: &str, queue: &str) -> bool {
    require();
    let k = key(owner, queue);
    if LOCAL.with(|l| l.borrow().iter().any(|d| d.key == k)) {
        return false;
    }
    k.lock(pg_sys::ExclusiveLock);
    let running = count_latest(owner, queue);
    let mut counts = COUNTS.exclusive();
    // The queue's own entry, else a free or stale one. When every entry holds a count (more
    // than ENTRIES limited queues in use), another queue's count is dropped, one with nothing
    // running first: dropping a count is always safe (that queue is counted again at its next
    // claim, as after tide.create_queue), so a role with many queues slows others' claims at
    // worst and never stops them.
    let slot = counts
        .entries
        .iter()
        .position(|e| k.matches(e))
        .or_else(|| counts.entries.iter().position(|e| !e.used || !e.valid))
        .or_else(|| counts.entries.iter().position(|e| e.running == 0))
        .unwrap_or(0);
    counts.entries[slot] = Entry {
        used: true,
        valid: true,
        db: k.db,
        owner: k.owner,
        queue: k.queue,
        running,
    };
    true
}

/// Gives back at once room reserved by this transaction that it will not use.
#[pg_extern(volatile, parallel_unsafe, schema = "tide", name = "_queue_unreserve")]
#[search_path(pg_catalog, pg_temp)]
fn queue_unreserve(owner: &str, queue: &str, n: i32) {
    require();
    let k = key(owner, queue);
    let n = i64::from(n.max(0));
    give_back(&mut COUNTS.exclusive(), &k, n);
    record(k, Kind::Reserve, -n);
}

/// `n` counted runs of a queue stopped running: their room is given back when this
/// transaction commits.
#[pg_extern(volatile, parallel_unsafe, schema = "tide", name = "_queue_release")]
#[search_path(pg_catalog, pg_temp)]
fn queue_release(owner: &str, queue: &str, n: i32) {
    require();
    let k = key(owner, queue);
    k.lock(pg_sys::ShareLock);
    record(k, Kind::Release, i64::from(n.max(0)));
}

/// The queue's count is stale once this transaction commits (its limit or its counted runs
/// changed): the next claim counts it again.
#[pg_extern(volatile, parallel_unsafe, schema = "tide", name = "_queue_forget")]
#[search_path(pg_catalog, pg_temp)]
fn queue_forget(owner: &str, queue: &str) {
    require();
    let k = key(owner, queue);
    k.lock(pg_sys::ShareLock);
    record(k, Kind::Forget, 0);
}

/// The queue's runs running now as this transaction sees them: the shared count less what this
/// transaction releases at its commit; NULL when the count is stale.
#[pg_extern(volatile, parallel_unsafe, schema = "tide", name = "_queue_running")]
#[search_path(pg_catalog, pg_temp)]
fn queue_running(owner: &str, queue: &str) -> Option<i64> {
    if !available() {
        return None;
    }
    let k = key(owner, queue);
    let shared = COUNTS
        .share()
        .entries
        .iter()
        .find(|e| k.matches(e) && e.valid)
        .map(|e| e.running)?;
    let mine = LOCAL.with(|l| {
        l.borrow()
            .iter()
            .filter(|d| d.key == k && d.kind == Kind::Release)
            .map(|d| d.n)
            .sum::<i64>()
    });
    Some((shared - mine).max(0))
}

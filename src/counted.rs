//! History rows the hot paths count themselves. Every statement that adds rows to
//! `tide.run_event` is counted by a statement trigger (`tide._events_counted`, sql/monitor.sql):
//! the tasks it touches for task health, and what it adds to the counters of `tide.metrics()`.
//! Claims and completions know both without reading the runs back, and write them in the
//! statements they run anyway; the trigger call was a tenth of a claim + complete.
//!
//! A hot path marks its next insert of history rows (`tide._counted_next()`), and the trigger's
//! condition (`WHEN (NOT tide._counted_taken())`) uses the mark up: the statement after the mark
//! is not counted again, every other one is. The mark lives in this backend's memory, not in a
//! setting, so no role can set it: both functions are internal, and only pg_tide's own code (its
//! public functions run as the extension's owner, and its workers) may call the first. A mark
//! left by an insert that failed is dropped when the (sub)transaction that failed ends.

use std::cell::Cell;

use pgrx::pg_sys;
use pgrx::prelude::*;

thread_local! {
    static MARKED: Cell<bool> = const { Cell::new(false) };
}

/// Marks the next insert into `tide.run_event` as counted by its caller. Returns true.
#[pg_extern(volatile, parallel_unsafe, schema = "tide", name = "_counted_next")]
fn counted_next() -> bool {
    MARKED.with(|m| m.set(true));
    true
}

/// The counting trigger's condition: true, once, when the statement's history rows were
/// counted by the hot path that wrote them. The mark is used up.
#[pg_extern(volatile, parallel_unsafe, schema = "tide", name = "_counted_taken")]
fn counted_taken() -> bool {
    MARKED.with(|m| m.replace(false))
}

/// Registers the callbacks that drop a mark left over at the end of a transaction or of a
/// subtransaction that failed; called once from `_PG_init`.
pub fn install() {
    // SAFETY: _PG_init runs once per process, before any transaction.
    unsafe {
        pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(at_subtransaction_end), std::ptr::null_mut());
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(
    _event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    MARKED.with(|m| m.set(false));
}

#[pg_guard]
unsafe extern "C-unwind" fn at_subtransaction_end(
    event: pg_sys::SubXactEvent::Type,
    _my_subid: pg_sys::SubTransactionId,
    _parent_subid: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        MARKED.with(|m| m.set(false));
    }
}

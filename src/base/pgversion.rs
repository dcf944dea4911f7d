//! What differs between the PostgreSQL major versions pg_tide builds for (15, 17 and 18), in
//! one place: the rest of the code calls these and never tests a version itself.

use pgrx::pg_sys;
use std::ffi::{c_int, c_long};

/// Attribute `i` (from 0) of a tuple descriptor. PostgreSQL 18 moved the attributes behind
/// `TupleDescAttr` (the descriptor's first array now holds its compact attributes).
///
/// # Safety
/// `tupdesc` is a valid tuple descriptor and `i < natts`.
pub unsafe fn tuple_desc_attr<'a>(
    tupdesc: pg_sys::TupleDesc,
    i: usize,
) -> &'a pg_sys::FormData_pg_attribute {
    #[cfg(not(feature = "pg18"))]
    {
        &(*tupdesc).attrs.as_slice((*tupdesc).natts as usize)[i]
    }
    #[cfg(feature = "pg18")]
    {
        &*pg_sys::TupleDescAttr(tupdesc, i as c_int)
    }
}

/// Sets the handler of signal `signo` (PostgreSQL 18's backends call it `pqsignal_be`).
///
/// # Safety
/// As `pqsignal`: `handler` is async-signal-safe.
pub unsafe fn pqsignal(signo: u32, handler: pg_sys::pqsigfunc) {
    #[cfg(not(feature = "pg18"))]
    pg_sys::pqsignal(signo as c_int, handler);
    #[cfg(feature = "pg18")]
    pg_sys::pqsignal_be(signo as c_int, handler);
}

/// Ends the process with `code`, running the exit callbacks (PostgreSQL 18's bindings lose the
/// function's `noreturn`).
///
/// # Safety
/// As `proc_exit`: outside a transaction's critical section.
pub unsafe fn proc_exit(code: c_int) -> ! {
    pg_sys::proc_exit(code);
    #[cfg(feature = "pg18")]
    unreachable!("proc_exit returned")
}

/// Runs a started portal to its end, sending its rows to `dest` (PostgreSQL 18 dropped
/// `run_once`).
///
/// # Safety
/// `portal` is started, `dest` and `qc` valid.
pub unsafe fn portal_run(
    portal: pg_sys::Portal,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) -> bool {
    #[cfg(not(feature = "pg18"))]
    {
        pg_sys::PortalRun(portal, c_long::MAX, true, true, dest, dest, qc)
    }
    #[cfg(feature = "pg18")]
    {
        pg_sys::PortalRun(portal, c_long::MAX, true, dest, dest, qc)
    }
}

/// Whether `member` may act as `role` (a superuser may act as every role). pg_tide lets a role
/// act for another (see its tasks, change them, receive its alerts) only where PostgreSQL lets
/// it SET ROLE to it: on 15 every membership allows that; from 16 a membership granted
/// `WITH SET FALSE` does not (`member_can_set_role`).
///
/// # Safety
/// Catalog lookups: inside a transaction.
pub unsafe fn can_set_role(member: pg_sys::Oid, role: pg_sys::Oid) -> bool {
    #[cfg(feature = "pg15")]
    {
        pg_sys::is_member_of_role(member, role)
    }
    #[cfg(not(feature = "pg15"))]
    {
        pg_sys::member_can_set_role(member, role)
    }
}

//! Moving over from pg_cron (`tide.import_pg_cron`, sql/import.sql): which commands need the
//! top-level mode, and creating an imported task as the role that owned the pg_cron job.

use std::ffi::{c_int, CString};
use std::panic::AssertUnwindSafe;

use pgrx::pg_sys::{self, NodeTag};
use pgrx::prelude::*;

use crate::sqlerr::OrRaise;

const F: &str = "tide.import_pg_cron";

/// Whether a command must run at top level (`top_level => true`) rather than in a transaction
/// with its run: more than one statement (pg_cron runs a string as one simple query), or a
/// statement PostgreSQL refuses inside a transaction block or a function — VACUUM, CREATE INDEX
/// / REINDEX / DROP INDEX CONCURRENTLY, CALL (the procedure may commit), transaction control,
/// database, tablespace, system and subscription commands, CLUSTER of every table. A command
/// that does not parse answers false: it will fail as a command, with its error on record.
#[pg_extern(volatile, schema = "tide", name = "_needs_top_level")]
#[search_path(pg_catalog, pg_temp)]
fn needs_top_level(command: &str) -> bool {
    let Ok(text) = CString::new(command) else {
        return false;
    };
    PgTryBuilder::new(AssertUnwindSafe(|| {
        // SAFETY: parses in the current memory context and only reads the trees.
        unsafe {
            let list = pg_sys::pg_parse_query(text.as_ptr());
            if list.is_null() {
                return false;
            }
            let n = usize::try_from((*list).length).unwrap_or(0);
            if n > 1 {
                return true;
            }
            let raw = (*(*list).elements).ptr_value.cast::<pg_sys::RawStmt>();
            refuses_transaction_block((*raw).stmt)
        }
    }))
    .catch_others(|_| false)
    .execute()
}

/// # Safety
/// `node` is a parse tree from the raw parser.
unsafe fn refuses_transaction_block(node: *mut pg_sys::Node) -> bool {
    unsafe {
        match (*node).type_ {
            NodeTag::T_VacuumStmt => (*node.cast::<pg_sys::VacuumStmt>()).is_vacuumcmd,
            NodeTag::T_IndexStmt => (*node.cast::<pg_sys::IndexStmt>()).concurrent,
            NodeTag::T_DropStmt => (*node.cast::<pg_sys::DropStmt>()).concurrent,
            NodeTag::T_ReindexStmt => {
                has_option((*node.cast::<pg_sys::ReindexStmt>()).params, "concurrently")
            }
            NodeTag::T_ClusterStmt => (*node.cast::<pg_sys::ClusterStmt>()).relation.is_null(),
            NodeTag::T_CallStmt
            | NodeTag::T_TransactionStmt
            | NodeTag::T_CreatedbStmt
            | NodeTag::T_DropdbStmt
            | NodeTag::T_AlterSystemStmt
            | NodeTag::T_CreateTableSpaceStmt
            | NodeTag::T_DropTableSpaceStmt
            | NodeTag::T_CreateSubscriptionStmt
            | NodeTag::T_AlterSubscriptionStmt
            | NodeTag::T_DropSubscriptionStmt => true,
            _ => false,
        }
    }
}

/// # Safety
/// `params` is NIL or a List of DefElem.
unsafe fn has_option(params: *mut pg_sys::List, name: &str) -> bool {
    if params.is_null() {
        return false;
    }
    unsafe {
        (0..usize::try_from((*params).length).unwrap_or(0)).any(|i| {
            let option = (*(*params).elements.add(i))
                .ptr_value
                .cast::<pg_sys::DefElem>();
            !(*option).defname.is_null()
                && std::ffi::CStr::from_ptr((*option).defname).to_bytes() == name.as_bytes()
        })
    }
}

/// Creates one imported task as `owner` (the role that owned the pg_cron job): through
/// `tide.schedule`, called as that role, so every rule of an ordinary schedule applies (its
/// validation, names per role, a same definition is a no-op), then paused when the job was
/// inactive. Returns the task id. Only `tide.import_pg_cron` (the extension's owner) calls it.
#[allow(clippy::too_many_arguments)]
#[pg_extern(volatile, schema = "tide", name = "_import_job")]
#[search_path(pg_catalog, pg_temp)]
fn import_job(
    owner: &str,
    task: &str,
    schedule: &str,
    command: &str,
    tz: &str,
    top_level: bool,
    paused: bool,
) -> i64 {
    // SAFETY: reads the current user's superuser flag.
    if !unsafe { pg_sys::superuser() } {
        pgrx::error!("tide._import_job is pg_tide's own");
    }
    // A role name from pg_roles has no NUL byte; an empty name is "role does not exist".
    let role = CString::new(owner).unwrap_or_default();
    // SAFETY: looks the role up (an error if it is gone), then switches to it the way a
    // security-definer function switches, as a new level of callers (caller.rs); restored
    // below, and by the transaction's abort on error.
    let (saved_user, saved_context, level) = unsafe {
        let oid = pg_sys::get_role_oid(role.as_ptr(), false);
        let mut user = pg_sys::Oid::INVALID;
        let mut context: c_int = 0;
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        let level = crate::caller::enter_user_code();
        pg_sys::SetUserIdAndSecContext(
            oid,
            context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as c_int,
        );
        (user, context, level)
    };
    let id = Spi::get_one_with_args::<i64>(
        "SELECT tide.schedule($1, $2, $3, tz => $4, top_level => $5)",
        &[
            task.into(),
            schedule.into(),
            command.into(),
            tz.into(),
            top_level.into(),
        ],
    )
    .or_raise(F)
    .unwrap_or_default();
    if paused {
        Spi::run_with_args("SELECT tide.pause($1)", &[task.into()]).or_raise(F);
    }
    // SAFETY: back to the caller's identity.
    unsafe { pg_sys::SetUserIdAndSecContext(saved_user, saved_context) };
    crate::caller::leave_user_code(level);
    id
}

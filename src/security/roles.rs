//! Roles come and go (src/security/roles.sql): pg_tide's rows follow DROP ROLE, REASSIGN OWNED and DROP
//! OWNED in the database pg_tide is installed in, through a utility hook.
//!
//! - `DROP ROLE` of a role that owns pg_tide rows here (tasks, queues, channels, heartbeat
//!   checks, grants) is refused before PostgreSQL drops anything, as PostgreSQL refuses to drop
//!   a role that owns objects (2BP01), with a hint to reassign or drop them first.
//! - `REASSIGN OWNED BY old TO new` and `DROP OWNED BY old` do to pg_tide's rows what they do to
//!   catalog objects (`tide._reassign_owned`, `tide._drop_owned`), once PostgreSQL has run them
//!   (and checked that the caller may).
//!
//! pg_tide's rows are read and written as the owner of schema `tide`, as its public functions
//! run: row-level security would hide other roles' rows from the role that runs the statement.
//! A role dropped from another database (where pg_tide's tables cannot be read) leaves its rows
//! behind: the tick pauses its tasks and alerts (`owner_gone`).

use std::ffi::{c_char, c_int, CStr};

use pgrx::pg_sys;
use pgrx::prelude::*;

static mut PREV: pg_sys::ProcessUtility_hook_type = None;

/// Installs the hook; called once from `_PG_init`.
pub fn install() {
    // SAFETY: _PG_init runs once per process, before any query; the previous hook is chained.
    unsafe {
        PREV = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(hook);
    }
}

/// What a statement asks of pg_tide's rows, before it runs.
enum Before {
    /// DROP ROLE of these roles: refused if they own pg_tide rows here.
    DropRole(Vec<String>),
    /// REASSIGN OWNED or DROP OWNED: applied to pg_tide's rows once it ran.
    Owned,
}

/// What REASSIGN OWNED or DROP OWNED does to pg_tide's rows, once it ran.
enum After {
    Reassign(Vec<String>, String),
    Drop(Vec<String>),
}

/// The names of a list of role specifications: their text as written for `DROP ROLE` (whose
/// roles may not exist), else the role each names (they exist once the statement ran).
///
/// # Safety
/// `list` is a `List` of `RoleSpec` nodes of the statement being run.
unsafe fn names(list: *mut pg_sys::List, as_written: bool) -> Vec<String> {
    let mut out = Vec::new();
    if list.is_null() {
        return out;
    }
    // SAFETY: a valid List of RoleSpec (caller's contract).
    unsafe {
        for i in 0..(*list).length {
            let spec = pg_sys::list_nth(list, i).cast::<pg_sys::RoleSpec>();
            if spec.is_null() {
                continue;
            }
            let name: *const c_char = if as_written {
                if (*spec).roletype != pg_sys::RoleSpecType::ROLESPEC_CSTRING {
                    continue;
                }
                (*spec).rolename
            } else {
                pg_sys::get_rolespec_name(spec)
            };
            if !name.is_null() {
                out.push(CStr::from_ptr(name).to_string_lossy().into_owned());
            }
        }
    }
    out
}

/// What the statement asks of pg_tide, if anything.
///
/// # Safety
/// `stmt` is the utility statement being run.
unsafe fn action_of(stmt: *mut pg_sys::Node) -> Option<Before> {
    if stmt.is_null() {
        return None;
    }
    // SAFETY: the node's tag says which statement it is.
    unsafe {
        match (*stmt).type_ {
            pg_sys::NodeTag::T_DropRoleStmt => {
                let s = stmt.cast::<pg_sys::DropRoleStmt>();
                Some(Before::DropRole(names((*s).roles, true)))
            }
            pg_sys::NodeTag::T_ReassignOwnedStmt | pg_sys::NodeTag::T_DropOwnedStmt => {
                Some(Before::Owned)
            }
            _ => None,
        }
    }
}

/// The names of REASSIGN OWNED's or DROP OWNED's roles, after it ran.
///
/// # Safety
/// `stmt` is the utility statement that was run.
unsafe fn owned_action(stmt: *mut pg_sys::Node) -> Option<After> {
    // SAFETY: as action_of.
    unsafe {
        match (*stmt).type_ {
            pg_sys::NodeTag::T_ReassignOwnedStmt => {
                let s = stmt.cast::<pg_sys::ReassignOwnedStmt>();
                let new = pg_sys::get_rolespec_name((*s).newrole);
                let new = CStr::from_ptr(new).to_string_lossy().into_owned();
                Some(After::Reassign(names((*s).roles, false), new))
            }
            pg_sys::NodeTag::T_DropOwnedStmt => {
                let s = stmt.cast::<pg_sys::DropOwnedStmt>();
                Some(After::Drop(names((*s).roles, false)))
            }
            _ => None,
        }
    }
}

/// Whether this database has pg_tide, with the functions of this module (0.2.3 and later: an
/// older version's SQL, before `ALTER EXTENSION pg_tide UPDATE`, has none).
fn here() -> bool {
    // SAFETY: an index lookup in pg_extension, inside the statement's transaction.
    let installed =
        unsafe { pg_sys::get_extension_oid(c"pg_tide".as_ptr(), true) != pg_sys::InvalidOid };
    installed
        && as_owner(|| {
            Spi::get_one::<bool>(
                "SELECT to_regprocedure('tide._reassign_owned(name,name)') IS NOT NULL",
            )
            .ok()
            .flatten()
            .unwrap_or(false)
        })
}

/// Runs `body` as the owner of schema `tide` (as pg_tide's public functions run).
fn as_owner<R>(body: impl FnOnce() -> R) -> R {
    let Some((_, owner)) = crate::security::caller::schema() else {
        return body();
    };
    let mut user = pg_sys::InvalidOid;
    let mut context: c_int = 0;
    // SAFETY: switches the current user as a security-definer call does; switched back below,
    // and by the transaction's abort on an error (it restores the user id and context).
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::SetUserIdAndSecContext(
            owner,
            context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as c_int,
        );
    }
    let out = body();
    // SAFETY: back to the identity saved above.
    unsafe { pg_sys::SetUserIdAndSecContext(user, context) };
    out
}

/// Refuses DROP ROLE of a role that owns pg_tide rows in this database.
fn refuse_drop(roles: &[String]) {
    if roles.is_empty() || !here() {
        return;
    }
    let owned = as_owner(|| {
        Spi::get_one_with_args::<String>(
            "SELECT string_agg(format('%s owns %s', quote_ident(o.role), o.summary), '; ' ORDER BY o.role)
               FROM tide._owned_summary($1) o",
            &[roles.to_vec().into()],
        )
    });
    let Ok(Some(owned)) = owned else {
        return;
    };
    let name = roles.first().map(String::as_str).unwrap_or_default();
    let first = quote_ident(name);
    let literal = format!("'{}'", name.replace('\'', "''"));
    pgrx::pg_sys::panic::ErrorReport::new(
        PgSqlErrorCode::ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
        format!("role cannot be dropped because it owns pg_tide tasks or other pg_tide objects: {owned}"),
        "DROP ROLE",
    )
    .set_hint(format!(
        "give them to another role first: REASSIGN OWNED BY {first} TO <role> (or SELECT tide.reassign_owned({literal}, '<role>')); or remove them: DROP OWNED BY {first} (or SELECT tide.drop_owned({literal})); list them with SELECT * FROM tide.owned_by({literal})"
    ))
    .report(PgLogLevel::ERROR);
}

/// A role's name as SQL writes it (quoted when it must be), as PostgreSQL's quote_ident does.
fn quote_ident(name: &str) -> String {
    let Ok(c) = std::ffi::CString::new(name) else {
        return name.to_string();
    };
    // SAFETY: quote_identifier reads a NUL-terminated string and returns it or a palloc'd copy.
    unsafe { CStr::from_ptr(pg_sys::quote_identifier(c.as_ptr())) }
        .to_string_lossy()
        .into_owned()
}

/// Applies REASSIGN OWNED or DROP OWNED to pg_tide's rows in this database.
fn apply(action: After) {
    if !here() {
        return;
    }
    as_owner(|| match action {
        After::Reassign(olds, new) => {
            for old in olds {
                Spi::get_one_with_args::<i64>(
                    "SELECT tide._reassign_owned($1, $2)",
                    &[old.as_str().into(), new.as_str().into()],
                )
                .map(|_| ())
                .unwrap_or_else(|e| error!("REASSIGN OWNED: {e}"));
            }
        }
        After::Drop(roles) => {
            for role in roles {
                Spi::get_one_with_args::<i64>(
                    "SELECT tide._drop_owned($1)",
                    &[role.as_str().into()],
                )
                .map(|_| ())
                .unwrap_or_else(|e| error!("DROP OWNED: {e}"));
            }
        }
    });
}

#[pg_guard]
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn hook(
    pstmt: *mut pg_sys::PlannedStmt,
    query: *const c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: pstmt is the statement being run; its utility node outlives this call.
    let stmt = unsafe { (*pstmt).utilityStmt };
    // SAFETY: as above.
    let action = unsafe { action_of(stmt) };
    if let Some(Before::DropRole(roles)) = &action {
        refuse_drop(roles);
    }
    // SAFETY: runs the statement as PostgreSQL would, through the hook installed before ours.
    unsafe {
        match PREV {
            Some(prev) => prev(
                pstmt,
                query,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
            None => pg_sys::standard_ProcessUtility(
                pstmt,
                query,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
        }
    }
    if matches!(action, Some(Before::Owned)) {
        // SAFETY: the statement that was run.
        if let Some(owned) = unsafe { owned_action(stmt) } {
            apply(owned);
        }
    }
}

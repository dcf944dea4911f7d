//! Who is calling. pg_tide's public functions that change anything run with the rights of the
//! owner of schema `tide` (the role that created the extension) and remember the role that
//! called them: roles write pg_tide's tables only through these functions, which act only on
//! what the caller owns. pg_cron's `cron.schedule` works the same way (C code that notes
//! `GetUserId()` and writes its table as the extension owner).
//!
//! A function manager hook, not `SECURITY DEFINER`: inside a security-definer function
//! PostgreSQL keeps no trace of the calling role (`current_user` is the definer, `session_user`
//! ignores `SET ROLE` and the role a pg_tide executor runs a command as). The hook is called
//! with the caller's identity still in place, so it can note it before switching; with
//! `SECURITY_LOCAL_USERID_CHANGE`, as a security-definer function switches, so nothing inside
//! can `SET ROLE` away.
//!
//! Which functions: those of schema `tide` whose name does not start with `_`, that are
//! VOLATILE and are not trigger functions. STABLE and IMMUTABLE functions cannot write; they run
//! as their caller, under row-level security. Internal (`_`) functions run with the rights of
//! whoever calls them: a public function (the owner's) or a pg_tide worker (a superuser);
//! the ones that write are not executable by PUBLIC.
//!
//! Inside a public function, `caller()` is the role that called the outermost one (public
//! functions call each other), unless user code ran in between as another role: a command run
//! between `_seal_begin` and `_seal_end` is a new level, whose calls belong to its owner.
//!
//! `search_path`: every pg_tide function that runs SQL pins it (`SET search_path = pg_catalog,
//! pg_temp`, in Rust `#[search_path]`). The small Rust functions that run none and resolve no
//! name (these, `tide.run_id()`, `tide._lock_key` ...) do not: they are called per row, and a
//! SET clause costs every call a GUC nest level.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::{c_int, CStr};

use pgrx::pg_sys::{self, Datum, FmgrHookEventType, FmgrInfo, Oid};
use pgrx::prelude::*;

/// One call of a public function in progress.
struct Frame {
    flinfo: *mut FmgrInfo,
    caller: Oid,
    /// The identity and security context to go back to.
    saved_user: Oid,
    saved_context: c_int,
    /// The role the call runs as (the schema's owner).
    runs_as: Oid,
    level: u32,
}

thread_local! {
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
    /// Which functions are public pg_tide functions, by oid; emptied when pg_proc or
    /// pg_namespace change.
    static KNOWN: RefCell<HashMap<Oid, bool>> = RefCell::new(HashMap::new());
    /// Schema `tide` and its owner, looked up once until pg_namespace changes.
    static SCHEMA: Cell<Option<(Oid, Oid)>> = const { Cell::new(None) };
}

static mut PREV_NEEDS: pg_sys::needs_fmgr_hook_type = None;
static mut PREV_HOOK: pg_sys::fmgr_hook_type = None;

/// Installs the hook; called once from `_PG_init` in every process that loads pg_tide.
pub fn install() {
    // SAFETY: _PG_init runs once per process, before any query; the previous hooks are chained.
    unsafe {
        PREV_NEEDS = pg_sys::needs_fmgr_hook;
        pg_sys::needs_fmgr_hook = Some(needs_hook);
        PREV_HOOK = pg_sys::fmgr_hook;
        pg_sys::fmgr_hook = Some(hook);
        pg_sys::CacheRegisterSyscacheCallback(
            pg_sys::SysCacheIdentifier::PROCOID as c_int,
            Some(forget),
            Datum::from(0),
        );
        pg_sys::CacheRegisterSyscacheCallback(
            pg_sys::SysCacheIdentifier::NAMESPACEOID as c_int,
            Some(forget),
            Datum::from(0),
        );
        pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn forget(_arg: Datum, _cache: c_int, _hash: u32) {
    KNOWN.with(|k| k.borrow_mut().clear());
    SCHEMA.with(|s| s.set(None));
}

/// Every frame ends with its function, and every seal with `_seal_end` or `_seal_abort`; one
/// left at a transaction's abort came from an error that bypassed them, so both are forgotten
/// then (the abort itself restores the user and the settings).
#[pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    if matches!(
        event,
        pg_sys::XactEvent::XACT_EVENT_ABORT | pg_sys::XactEvent::XACT_EVENT_PARALLEL_ABORT
    ) {
        FRAMES.with(|f| f.borrow_mut().clear());
        crate::security::sealed::forget_after_abort();
    }
}

/// Schema `tide` and its owner, if the extension is in this database.
pub(crate) fn schema() -> Option<(Oid, Oid)> {
    if let Some(s) = SCHEMA.with(Cell::get) {
        return Some(s);
    }
    // SAFETY: syscache lookups inside a transaction (checked by the callers).
    let found = unsafe {
        let nsp = pg_sys::get_namespace_oid(c"tide".as_ptr(), true);
        if nsp == pg_sys::InvalidOid {
            return None;
        }
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::NAMESPACEOID as c_int,
            Datum::from(nsp),
        );
        if tuple.is_null() {
            return None;
        }
        let form = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_namespace>(tuple);
        let owner = (*form).nspowner;
        pg_sys::ReleaseSysCache(tuple);
        (nsp, owner)
    };
    SCHEMA.with(|s| s.set(Some(found)));
    Some(found)
}

/// Whether `fn_oid` is a public pg_tide function that changes things (see the module comment).
fn is_public(fn_oid: Oid) -> bool {
    if fn_oid.to_u32() < pg_sys::FirstNormalObjectId {
        return false;
    }
    // SAFETY: reads transaction state.
    if !unsafe { pg_sys::IsTransactionState() } {
        return false;
    }
    if let Some(known) = KNOWN.with(|k| k.borrow().get(&fn_oid).copied()) {
        return known;
    }
    let Some((nsp, _)) = schema() else {
        return false;
    };
    // SAFETY: a syscache lookup inside a transaction; the tuple is released before returning.
    let public = unsafe {
        let tuple = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::PROCOID as c_int,
            Datum::from(fn_oid),
        );
        if tuple.is_null() {
            return false;
        }
        let p = &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_proc>(tuple);
        let name = CStr::from_ptr(p.proname.data.as_ptr());
        let public = p.pronamespace == nsp
            && !name.to_bytes().starts_with(b"_")
            && p.provolatile == pg_sys::PROVOLATILE_VOLATILE as std::ffi::c_char
            && p.prorettype != pg_sys::TRIGGEROID
            && !p.prosecdef;
        pg_sys::ReleaseSysCache(tuple);
        public
    };
    KNOWN.with(|k| k.borrow_mut().insert(fn_oid, public));
    public
}

#[pg_guard]
unsafe extern "C-unwind" fn needs_hook(fn_oid: Oid) -> bool {
    // SAFETY: calls the hook that was installed before ours, if any.
    let theirs = unsafe { PREV_NEEDS.is_some_and(|f| f(fn_oid)) };
    theirs || is_public(fn_oid)
}

#[pg_guard]
unsafe extern "C-unwind" fn hook(
    event: FmgrHookEventType::Type,
    flinfo: *mut FmgrInfo,
    private: *mut Datum,
) {
    // SAFETY: chains to the previous hook with the same arguments.
    unsafe {
        if let Some(prev) = PREV_HOOK {
            prev(event, flinfo, private);
        }
    }
    match event {
        FmgrHookEventType::FHET_START => {
            // SAFETY: flinfo is the function being called.
            let fn_oid = unsafe { (*flinfo).fn_oid };
            if !is_public(fn_oid) {
                return;
            }
            let Some((_, owner)) = schema() else {
                return;
            };
            let mut user = pg_sys::InvalidOid;
            let mut context: c_int = 0;
            // SAFETY: reads and switches the current user as fmgr_security_definer does.
            unsafe { pg_sys::GetUserIdAndSecContext(&mut user, &mut context) };
            let level = crate::security::sealed::user_code_level();
            let caller = FRAMES.with(|f| {
                f.borrow()
                    .last()
                    .filter(|top| top.runs_as == user && top.level == level)
                    .map_or(user, |top| top.caller)
            });
            FRAMES.with(|f| {
                f.borrow_mut().push(Frame {
                    flinfo,
                    caller,
                    saved_user: user,
                    saved_context: context,
                    runs_as: owner,
                    level,
                })
            });
            // SAFETY: as a SECURITY DEFINER call switches; undone at FHET_END / FHET_ABORT.
            unsafe {
                pg_sys::SetUserIdAndSecContext(
                    owner,
                    context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as c_int,
                )
            };
        }
        _ => {
            let frame = FRAMES.with(|f| {
                let mut frames = f.borrow_mut();
                if frames.last().is_some_and(|top| top.flinfo == flinfo) {
                    frames.pop()
                } else {
                    None
                }
            });
            if let Some(frame) = frame {
                // SAFETY: restores what FHET_START saved.
                unsafe { pg_sys::SetUserIdAndSecContext(frame.saved_user, frame.saved_context) };
            }
        }
    }
}

/// The role on whose behalf pg_tide acts now: the caller of the public function running, or
/// else the current user.
pub fn caller() -> Oid {
    FRAMES
        .with(|f| f.borrow().last().map(|top| top.caller))
        .unwrap_or_else(|| {
            // SAFETY: reads the current user id.
            unsafe { pg_sys::GetUserId() }
        })
}

/// The caller's role name.
pub fn caller_name() -> String {
    role_name(caller())
}

fn role_name(role: Oid) -> String {
    // SAFETY: noerr = true returns NULL for a role that no longer exists.
    unsafe {
        let name = pg_sys::GetUserNameFromId(role, true);
        if name.is_null() {
            format!("role {}", role.to_u32())
        } else {
            CStr::from_ptr(name).to_string_lossy().into_owned()
        }
    }
}

/// The role pg_tide acts for (see `caller`), as an SQL name.
#[pg_extern(stable, parallel_restricted, schema = "tide", name = "_caller")]
pub fn caller_sql() -> String {
    caller_name()
}

/// Whether the caller may act on something owned by `owner`: it is that role, a member of it,
/// a member of tide_admin, or a superuser. An owner role that no longer exists is left to
/// superusers and tide_admin.
#[pg_extern(stable, parallel_restricted, schema = "tide", name = "_may_act")]
pub fn may_act(owner: Option<&str>) -> bool {
    let Some(owner) = owner else {
        return false;
    };
    let me = caller();
    if role_oid("tide_admin").is_some_and(|admin| can_set_role(me, admin)) {
        return true;
    }
    match role_oid(owner) {
        Some(role) => can_set_role(me, role),
        // SAFETY: a catalog lookup.
        None => unsafe { pg_sys::superuser_arg(me) },
    }
}

/// The role of that name, if there is one.
fn role_oid(name: &str) -> Option<Oid> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: a catalog lookup; missing_ok returns InvalidOid for a role that does not exist.
    let oid = unsafe { pg_sys::get_role_oid(name.as_ptr(), true) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

fn can_set_role(member: Oid, role: Oid) -> bool {
    // SAFETY: catalog lookups, inside the caller's transaction.
    unsafe { crate::base::pgversion::can_set_role(member, role) }
}

/// Whether role `member` may act as role `role` (`SET ROLE` to it; see
/// `pgversion::can_set_role`): every membership test of pg_tide's SQL asks this, never
/// `pg_has_role(..., 'MEMBER')`, whose answer on PostgreSQL 16 and later includes memberships
/// granted `WITH SET FALSE`. False when either role does not exist or is NULL. Declared in
/// src/tasks/schema.sql (the row-level security policies' `tide._visible` calls it, and is created
/// before pgrx's own functions).
#[pg_extern(sql = false)]
pub fn can_set_role_sql(member: Option<&str>, role: Option<&str>) -> bool {
    match (member.and_then(role_oid), role.and_then(role_oid)) {
        (Some(member), Some(role)) => can_set_role(member, role),
        _ => false,
    }
}

/// Whether the caller is a superuser (who sees and claims every role's runs).
#[pg_extern(
    stable,
    parallel_restricted,
    schema = "tide",
    name = "_caller_is_superuser"
)]
pub fn caller_is_superuser() -> bool {
    // SAFETY: a catalog lookup of the caller's role.
    unsafe { pg_sys::superuser_arg(caller()) }
}

//! Roles sharing a database: who is calling (`caller`: public functions run as the extension's
//! owner and act for their caller), user code run sealed as its owner (`sealed`), roles that come
//! and go (`roles`), grants to other roles (`roles.sql`) and the executors' fair share between
//! roles (`share`, `share.sql`).

pub(crate) mod caller;
pub(crate) mod roles;
pub(crate) mod sealed;
pub(crate) mod share;

// Predefined roles' grants: tide.grant, tide.revoke; who may claim, emit, enqueue.
::pgrx::extension_sql_file!(
    "roles.sql",
    name = "roles",
    requires = [
        "execution",
        security::caller::may_act,
        security::caller::caller_is_superuser
    ]
);
// Roles sharing a database: fair share of the executors, each role's limits, a role's end.
::pgrx::extension_sql_file!("share.sql", name = "share", requires = ["monitor"]);

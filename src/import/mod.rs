//! Moving over from pg_cron (`tide.import_pg_cron`, src/import/import.sql): which commands need the
//! top-level mode, and creating an imported task as the role that owned the pg_cron job.

// Moving over from pg_cron: tide.import_pg_cron.
::pgrx::extension_sql_file!("import.sql", name = "import", requires = ["execution"]);

use std::ffi::{c_int, CString};
use std::panic::AssertUnwindSafe;

use pgrx::pg_sys::{self, NodeTag};
use pgrx::prelude::*;

use crate::base::sqlerr::OrRaise;

const F: &str = "tide.import_pg_cron";

/// A command's statements, parsed by PostgreSQL's raw parser (no catalog access, so a command
/// naming tables of another database parses here too). A syntax error is returned as its
/// message.
fn parse(command: &str) -> Result<Vec<*mut pg_sys::Node>, String> {
    let Ok(text) = CString::new(command) else {
        return Err("the command contains a NUL byte".into());
    };
    PgTryBuilder::new(AssertUnwindSafe(|| {
        // SAFETY: parses in the current memory context and only reads the trees.
        unsafe {
            let list = pg_sys::pg_parse_query(text.as_ptr());
            if list.is_null() {
                return Ok(Vec::new());
            }
            let n = usize::try_from((*list).length).unwrap_or(0);
            Ok((0..n)
                .map(|i| {
                    let raw = (*(*list).elements.add(i))
                        .ptr_value
                        .cast::<pg_sys::RawStmt>();
                    (*raw).stmt
                })
                .collect())
        }
    }))
    .catch_others(|e| match e {
        pg_sys::panic::CaughtError::PostgresError(r)
        | pg_sys::panic::CaughtError::ErrorReport(r)
        | pg_sys::panic::CaughtError::RustPanic { ereport: r, .. } => Err(r.message().to_string()),
    })
    .execute()
}

/// Whether an imported pg_cron job must run at top level (`top_level => true`) rather than in a
/// transaction with its run: a statement PostgreSQL refuses inside a transaction block (see
/// `refusing_statement`), or a command that is one `CALL` (pg_cron runs it outside a
/// transaction block, where the procedure may commit). Several ordinary statements are not a
/// reason: pg_cron runs them as one simple query, one implicit transaction, which is what the
/// ordinary mode gives (the command in one transaction with its run). A command that does not
/// parse answers false: it is refused when the task is made.
#[pg_extern(volatile, schema = "tide", name = "_needs_top_level")]
#[search_path(pg_catalog, pg_temp)]
fn needs_top_level(command: &str) -> bool {
    match parse(command) {
        Ok(statements) => {
            statements.iter().any(|s| refusing_statement(*s).is_some())
                // SAFETY: a parse tree from the raw parser.
                || (statements.len() == 1 && unsafe { (*statements[0]).type_ } == NodeTag::T_CallStmt)
        }
        Err(_) => false,
    }
}

/// Checks a task's command when the task is made or changed (`tide._check_task`): it must parse,
/// and unless the task is top-level, none of its statements may be one that PostgreSQL refuses
/// inside a transaction block — in the ordinary mode the command runs in one transaction with
/// its run, where such a statement could only fail at every run.
#[pg_extern(volatile, schema = "tide", name = "_check_command")]
#[search_path(pg_catalog, pg_temp)]
fn check_command(task: &str, command: &str, top_level: bool) {
    let statements = match parse(command) {
        Ok(s) => s,
        Err(message) => {
            pgrx::pg_sys::panic::ErrorReport::new(
                PgSqlErrorCode::ERRCODE_SYNTAX_ERROR,
                format!("task \"{task}\": the command does not parse: {message}"),
                "tide._check_command",
            )
            .set_hint(
                "a command that does not parse could only fail at every run; try it in psql first",
            )
            .report(PgLogLevel::ERROR);
            return;
        }
    };
    if top_level {
        return;
    }
    if let Some(name) = statements.iter().find_map(|s| refusing_statement(*s)) {
        pgrx::pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "task \"{task}\": {name} cannot run inside a transaction block, and a command runs in one transaction with its run"
            ),
            "tide._check_command",
        )
        .set_hint("pass top_level => true: the command then runs as pg_cron runs it, outside a transaction block, each statement committed on its own (at least once, so keep it safe to run again)")
        .report(PgLogLevel::ERROR);
    }
}

/// The statement, named as people write it, if PostgreSQL refuses to run it inside a
/// transaction block or a function (`PreventInTransactionBlock`, or transaction control, which
/// SPI refuses): VACUUM, CREATE INDEX / REINDEX / DROP INDEX CONCURRENTLY, REINDEX SCHEMA /
/// DATABASE / SYSTEM, CLUSTER of every table, CREATE / DROP DATABASE, ALTER DATABASE SET
/// TABLESPACE, tablespaces, ALTER SYSTEM, DISCARD ALL, subscriptions that make or drop slots,
/// BEGIN / COMMIT / ROLLBACK / SAVEPOINT and prepared transactions. `CALL` is not among them:
/// a procedure that does not commit runs in a transaction.
fn refusing_statement(node: *mut pg_sys::Node) -> Option<String> {
    // SAFETY: `node` is a parse tree from the raw parser; only its fields are read.
    let refuses = unsafe {
        match (*node).type_ {
            NodeTag::T_VacuumStmt => (*node.cast::<pg_sys::VacuumStmt>()).is_vacuumcmd,
            NodeTag::T_IndexStmt => (*node.cast::<pg_sys::IndexStmt>()).concurrent,
            NodeTag::T_DropStmt => (*node.cast::<pg_sys::DropStmt>()).concurrent,
            NodeTag::T_ReindexStmt => {
                let stmt = node.cast::<pg_sys::ReindexStmt>();
                has_option((*stmt).params, "concurrently")
                    || matches!(
                        (*stmt).kind,
                        pg_sys::ReindexObjectType::REINDEX_OBJECT_SCHEMA
                            | pg_sys::ReindexObjectType::REINDEX_OBJECT_SYSTEM
                            | pg_sys::ReindexObjectType::REINDEX_OBJECT_DATABASE
                    )
            }
            NodeTag::T_ClusterStmt => (*node.cast::<pg_sys::ClusterStmt>()).relation.is_null(),
            NodeTag::T_DiscardStmt => {
                (*node.cast::<pg_sys::DiscardStmt>()).target == pg_sys::DiscardMode::DISCARD_ALL
            }
            NodeTag::T_AlterDatabaseStmt => has_option(
                (*node.cast::<pg_sys::AlterDatabaseStmt>()).options,
                "tablespace",
            ),
            NodeTag::T_AlterSubscriptionStmt => matches!(
                (*node.cast::<pg_sys::AlterSubscriptionStmt>()).kind,
                pg_sys::AlterSubscriptionType::ALTER_SUBSCRIPTION_REFRESH
            ),
            NodeTag::T_TransactionStmt
            | NodeTag::T_CreatedbStmt
            | NodeTag::T_DropdbStmt
            | NodeTag::T_AlterSystemStmt
            | NodeTag::T_CreateTableSpaceStmt
            | NodeTag::T_DropTableSpaceStmt
            | NodeTag::T_CreateSubscriptionStmt
            | NodeTag::T_DropSubscriptionStmt => true,
            _ => false,
        }
    };
    if !refuses {
        return None;
    }
    // SAFETY: the command tag of a raw parse tree, a static string of PostgreSQL's.
    let tag = unsafe {
        std::ffi::CStr::from_ptr(pg_sys::GetCommandTagName(pg_sys::CreateCommandTag(node)))
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: as above.
    let concurrently = unsafe {
        match (*node).type_ {
            NodeTag::T_IndexStmt | NodeTag::T_DropStmt => true,
            NodeTag::T_ReindexStmt => {
                has_option((*node.cast::<pg_sys::ReindexStmt>()).params, "concurrently")
            }
            _ => false,
        }
    };
    Some(if concurrently {
        format!("{tag} CONCURRENTLY")
    } else {
        tag
    })
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

/// How many statements a command holds (1 for one that does not parse: it is refused as a
/// command anyway).
#[pg_extern(immutable, parallel_safe, schema = "tide", name = "_statement_count")]
#[search_path(pg_catalog, pg_temp)]
fn statement_count(command: &str) -> i32 {
    parse(command).map_or(1, |s| i32::try_from(s.len()).unwrap_or(i32::MAX))
}

/// The 0.2.1 import's entry point, kept (without SQL) so that the install scripts of earlier
/// versions, which name its symbol, load against this library: it is never called once
/// `ALTER EXTENSION pg_tide UPDATE` has run.
#[allow(clippy::too_many_arguments)]
#[pg_extern(sql = false)]
fn import_job(
    owner: &str,
    task: &str,
    schedule: &str,
    command: &str,
    tz: &str,
    top_level: bool,
    paused: bool,
) -> i64 {
    import_task(
        owner, task, schedule, command, tz, top_level, paused, None, 5, "catch_up", None, None,
    )
}

/// Creates one imported task as `owner` (the role that owned the pg_cron job): through
/// `tide.schedule`, called as that role, so every rule of an ordinary schedule applies (its
/// validation, names per role, a same definition is a no-op), then paused when the job was
/// inactive. Returns the task id. Only `tide.import_pg_cron` (the extension's owner) calls it.
#[allow(clippy::too_many_arguments)]
#[pg_extern(volatile, schema = "tide", name = "_import_task")]
#[search_path(pg_catalog, pg_temp)]
fn import_task(
    owner: &str,
    task: &str,
    schedule: &str,
    command: &str,
    tz: &str,
    top_level: bool,
    paused: bool,
    database: Option<&str>,
    max_attempts: i32,
    misfire: &str,
    misfire_threshold: Option<pgrx::datum::Interval>,
    timeout: Option<pgrx::datum::Interval>,
) -> i64 {
    // SAFETY: reads the current user's superuser flag.
    if !unsafe { pg_sys::superuser() } {
        pgrx::error!("tide._import_task is pg_tide's own");
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
        let level = crate::security::sealed::enter_user_code();
        pg_sys::SetUserIdAndSecContext(
            oid,
            context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as c_int,
        );
        (user, context, level)
    };
    let id = Spi::get_one_with_args::<i64>(
        "SELECT tide.schedule($1, $2, $3, tz => $4, top_level => $5, database => $6,
                              max_attempts => $7, misfire => $8,
                              misfire_threshold => coalesce($9, interval '60 seconds'),
                              timeout => coalesce($10, interval '1 hour'))",
        &[
            task.into(),
            schedule.into(),
            command.into(),
            tz.into(),
            top_level.into(),
            database.into(),
            max_attempts.into(),
            misfire.into(),
            misfire_threshold.into(),
            timeout.into(),
        ],
    )
    .or_raise(F)
    .unwrap_or_default();
    if paused {
        Spi::run_with_args("SELECT tide.pause($1)", &[task.into()]).or_raise(F);
    }
    // SAFETY: back to the caller's identity.
    unsafe { pg_sys::SetUserIdAndSecContext(saved_user, saved_context) };
    crate::security::sealed::leave_user_code(level);
    id
}

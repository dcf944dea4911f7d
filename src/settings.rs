//! The `pg_tide.*` settings (see the README's settings table).

use std::ffi::CString;

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

/// The database the scheduler and executors work in.
pub static DATABASE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"postgres"));
/// Milliseconds between two ticks of the scheduler, and between two polls of an idle executor.
pub static TICK_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(1000);
/// Number of executor workers running SQL commands.
pub static EXECUTORS: GucSetting<i32> = GucSetting::<i32>::new(2);
/// Off: the workers stay up but do nothing (maintenance, restores).
pub static ENABLED: GucSetting<bool> = GucSetting::<bool>::new(true);

pub fn define() {
    GucRegistry::define_string_guc(
        c"pg_tide.database",
        c"Database in which pg_tide's scheduler and executors run.",
        c"CREATE EXTENSION pg_tide in this database. Takes effect at server start.",
        &DATABASE,
        GucContext::Postmaster,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_int_guc(
        c"pg_tide.tick_interval",
        c"Time between two scheduler ticks (and idle executor polls).",
        c"Each tick creates due runs, moves retries, takes back expired leases and releases ready runs.",
        &TICK_INTERVAL,
        10,
        60_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"pg_tide.executors",
        c"Number of executor background workers that run tasks' SQL commands.",
        c"0 disables in-database execution (external workers still claim their runs). Takes effect at server start.",
        &EXECUTORS,
        0,
        64,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_tide.enabled",
        c"Whether the scheduler and executors work.",
        c"Off keeps the workers alive but idle; nothing is lost, due windows are handled by the misfire policy when it is turned on again.",
        &ENABLED,
        GucContext::Sighup,
        GucFlags::default(),
    );
}

/// The configured database name.
pub fn database() -> String {
    DATABASE
        .get()
        .and_then(|c| c.into_string().ok())
        .unwrap_or_else(|| "postgres".to_string())
}

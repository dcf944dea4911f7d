//! The `pg_tide.*` settings (see docs/settings.md).

use std::ffi::CString;

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};

/// The most command workers at once (src/workers/command.rs has a slot for each), whatever
/// `pg_tide.command_workers` says: its maximum.
pub const MAX_COMMAND_WORKERS: usize = 64;

/// The database the scheduler and executors work in.
pub static DATABASE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"postgres"));
/// Milliseconds between two ticks of the scheduler, and between two polls of an idle executor.
pub static TICK_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(1000);
/// Number of executor workers running SQL commands.
pub static EXECUTORS: GucSetting<i32> = GucSetting::<i32>::new(2);
/// The most command workers (top-level commands, commands in other databases) at once.
pub static COMMAND_WORKERS: GucSetting<i32> = GucSetting::<i32>::new(4);
/// The most command workers at once in one database.
pub static COMMAND_WORKERS_PER_DATABASE: GucSetting<i32> = GucSetting::<i32>::new(2);
/// Off: the workers stay up but do nothing (maintenance, restores).
pub static ENABLED: GucSetting<bool> = GucSetting::<bool>::new(true);

/// Server log level of the one line each run start, skip, success and failure writes.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum LogRuns {
    #[name = c"off"]
    Off,
    #[name = c"debug1"]
    Debug1,
    #[name = c"info"]
    Info,
    #[name = c"log"]
    Log,
}
pub static LOG_RUNS: GucSetting<LogRuns> = GucSetting::<LogRuns>::new(LogRuns::Log);
/// Seconds finished runs, their attempts and history, and resolved alerts are kept.
pub static HISTORY_RETENTION: GucSetting<i32> = GucSetting::<i32>::new(30 * 24 * 3600);
/// Milliseconds between two evaluations of health and alerts by the tick.
pub static MONITOR_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(10_000);
/// Alert thresholds.
pub static ALERT_FAILURES: GucSetting<i32> = GucSetting::<i32>::new(3);
pub static ALERT_SKIPS: GucSetting<i32> = GucSetting::<i32>::new(3);
pub static ALERT_RETRIES: GucSetting<i32> = GucSetting::<i32>::new(10);
pub static ALERT_BACKLOG: GucSetting<i32> = GucSetting::<i32>::new(1000);
/// Seconds without a successful tick after which the scheduler_down alert opens.
pub static ALERT_STALLED: GucSetting<i32> = GucSetting::<i32>::new(60);
/// Seconds a run may stay held (R12.3) before the held alert opens.
pub static ALERT_HELD: GucSetting<i32> = GucSetting::<i32>::new(3600);
/// Seconds between two reminders of an open, unacknowledged alert; 0 = never.
pub static ALERT_RENOTIFY: GucSetting<i32> = GucSetting::<i32>::new(4 * 3600);
/// Seconds after which an open, unacknowledged alert is raised one severity; 0 = never.
pub static ALERT_ESCALATE: GucSetting<i32> = GucSetting::<i32>::new(3600);
/// Seconds a one-off or event run may wait to start before a late_start alert opens (task
/// runs of a schedule derive theirs from its period; see `tide._start_deadline`).
pub static START_DEADLINE: GucSetting<i32> = GucSetting::<i32>::new(300);
/// Dead-man's switch: a URL the delivery worker pings while ticks succeed (`<url>/fail` else).
pub static PING_URL: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// Where the ping goes while ticks fail or stop (`<ping_url>/fail` when unset).
pub static PING_FAIL_URL: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// Seconds between two pings.
pub static PING_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(60);
/// A role's limits when its tide.role_limit row leaves them NULL (src/security/share.sql).
pub static ROLE_MAX_TASKS: GucSetting<i32> = GucSetting::<i32>::new(1000);
/// Seconds: the shortest time between two fires of a role's tasks.
pub static ROLE_FASTEST_SCHEDULE: GucSetting<i32> = GucSetting::<i32>::new(1);
pub static ROLE_MAX_BULK: GucSetting<i32> = GucSetting::<i32>::new(100_000);
/// Lets a superuser create the extension in a database no scheduler serves.
pub static ALLOW_UNSCHEDULED: GucSetting<bool> = GucSetting::<bool>::new(false);

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
    GucRegistry::define_int_guc(
        c"pg_tide.command_workers",
        c"Most background workers running commands of their own at once (top-level commands, commands in other databases).",
        c"Each is a background worker: raise max_worker_processes by as many. A run that finds none free waits in line. At most 64.",
        &COMMAND_WORKERS,
        1,
        MAX_COMMAND_WORKERS as i32,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_tide.command_workers_per_database",
        c"Most command workers at once in one database.",
        c"So that one database's slow commands never take every command worker. A run that finds no room waits in line.",
        &COMMAND_WORKERS_PER_DATABASE,
        1,
        MAX_COMMAND_WORKERS as i32,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_tide.role_max_tasks",
        c"The most tasks a role owns, unless tide.set_role_limits gives it another limit.",
        c"Superusers are not limited. tide.schedule refuses a task past the limit (54000).",
        &ROLE_MAX_TASKS,
        0,
        1_000_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_tide.role_fastest_schedule",
        c"The shortest time between two fires of a role's tasks, unless tide.set_role_limits gives it another.",
        c"Superusers are not limited. tide.schedule refuses a schedule that fires more often (54000).",
        &ROLE_FASTEST_SCHEDULE,
        1,
        31 * 86_400,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"pg_tide.role_max_bulk",
        c"The most runs one tide.enqueue, or events one tide.emit_many, makes for a role, unless tide.set_role_limits gives it another.",
        c"Superusers are not limited (beyond 100000 a call).",
        &ROLE_MAX_BULK,
        1,
        100_000,
        GucContext::Sighup,
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
    GucRegistry::define_enum_guc(
        c"pg_tide.log_runs",
        c"Server log level of the line each run start, skip, success and failure writes (off, debug1, info, log).",
        c"One line of key=value fields per event: task, run_id, biz_date, trigger, version, attempt, state, duration, error.",
        &LOG_RUNS,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_tide.history_retention",
        c"How long finished runs, their attempts and history, and resolved alerts are kept.",
        c"The tick prunes a bounded batch at a time; the latest runs of each task, dead and need_check runs and open alerts are always kept.",
        &HISTORY_RETENTION,
        3600,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"pg_tide.monitor_interval",
        c"Time between two evaluations of task health, heartbeat checks and alerts by the tick.",
        c"Alerts open and resolve at most this long after their cause.",
        &MONITOR_INTERVAL,
        100,
        3_600_000,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_bool_guc(
        c"pg_tide.allow_unscheduled",
        c"Lets a superuser create pg_tide in a database other than pg_tide.database.",
        c"Nothing runs there by itself (no scheduler serves it): for tests that drive tide.tick themselves.",
        &ALLOW_UNSCHEDULED,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"pg_tide.ping_url",
        c"Dead-man's switch URL pinged while the scheduler ticks (<url>/fail while ticks fail or stop).",
        c"Healthchecks-style: an outside monitor alerts when the pings stop (PostgreSQL or the machine is down).",
        &PING_URL,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"pg_tide.ping_fail_url",
        c"Where the dead-man's-switch ping goes while ticks fail or stop (default: <ping_url>/fail).",
        c"Uptime Kuma: its push URL with status=down. Healthchecks: leave it unset (<ping_url>/fail).",
        &PING_FAIL_URL,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    let seconds: [(&'static std::ffi::CStr, &'static std::ffi::CStr, &'static GucSetting<i32>, i32, GucContext); 6] = [
        (c"pg_tide.start_deadline", c"Time a one-off or event run may wait to start before a late_start alert opens (a task's tide.monitor start_deadline wins).", &START_DEADLINE, 1, GucContext::Suset),
        (c"pg_tide.ping_interval", c"Time between two pings of pg_tide.ping_url.", &PING_INTERVAL, 1, GucContext::Sighup),
        (c"pg_tide.alert_stalled_after", c"Time without a successful tick after which the scheduler_down alert opens.", &ALERT_STALLED, 5, GucContext::Sighup),
        (c"pg_tide.alert_held_after", c"Time a run may stay held after a rule change before the held alert opens.", &ALERT_HELD, 1, GucContext::Suset),
        (c"pg_tide.alert_renotify_interval", c"Time between two reminders of an open alert nobody acknowledged (0: never).", &ALERT_RENOTIFY, 0, GucContext::Suset),
        (c"pg_tide.alert_escalate_after", c"Time after which an open alert nobody acknowledged is raised one severity (0: never).", &ALERT_ESCALATE, 0, GucContext::Suset),
    ];
    for (name, short, setting, min, context) in seconds {
        GucRegistry::define_int_guc(
            name,
            short,
            c"See docs/operations.md, Alert delivery.",
            setting,
            min,
            i32::MAX,
            context,
            GucFlags::UNIT_S,
        );
    }
    let thresholds: [(&'static std::ffi::CStr, &'static std::ffi::CStr, &'static GucSetting<i32>); 4] = [
        (c"pg_tide.alert_failures", c"Failed attempts in a row (since the last success) that open a consecutive_failures alert.", &ALERT_FAILURES),
        (c"pg_tide.alert_skips", c"Skipped runs in a row above which a repeated_skips alert opens.", &ALERT_SKIPS),
        (c"pg_tide.alert_retries", c"Retries of a task's runs in 24 hours that open a retries alert.", &ALERT_RETRIES),
        (c"pg_tide.alert_backlog", c"Runs of a task ready or waiting that open a backlog alert.", &ALERT_BACKLOG),
    ];
    for (name, short, setting) in thresholds {
        GucRegistry::define_int_guc(
            name,
            short,
            c"See docs/operations.md, Alerts.",
            setting,
            1,
            i32::MAX,
            GucContext::Suset,
            GucFlags::default(),
        );
    }
}

/// The ping URL, if one is set.
pub fn ping_url() -> Option<String> {
    PING_URL
        .get()
        .and_then(|c| c.into_string().ok())
        .filter(|s| !s.trim().is_empty())
}

/// The ping's failure URL, if one is set.
pub fn ping_fail_url() -> Option<String> {
    PING_FAIL_URL
        .get()
        .and_then(|c| c.into_string().ok())
        .filter(|s| !s.trim().is_empty())
}

/// The configured database name.
pub fn database() -> String {
    DATABASE
        .get()
        .and_then(|c| c.into_string().ok())
        .unwrap_or_else(|| "postgres".to_string())
}

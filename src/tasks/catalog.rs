//! The task catalog: `tide.schedule`, `tide.alter`, `tide.unschedule`, `tide.pause`,
//! `tide.resume`.
//!
//! These functions run as the extension's owner (see `caller.rs`) and act only on the caller's
//! own tasks: every lookup by name is a lookup of the caller's task of that name, so two roles
//! may use one name and another role's task reads as no task at all. Validation happens in
//! `rules.rs` before anything is written; versioning happens in triggers (`src/tasks/schema.sql`) so
//! no write path can skip it.

use pgrx::datum::{DatumWithOid, Interval, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiHeapTupleData};
use pgrx::PgOid;
use std::cell::RefCell;
use std::rc::Rc;

use crate::base::error::TideError;
use crate::base::jsonarg::JsonbText;
use crate::base::sqlerr::{raise, required, OrRaise};
use crate::calendar::pgtime::span_of;
use crate::calendar::pgtime::{now, to_pg};
use crate::security::caller::caller_name;
use crate::tasks::rules::{check_name, ExecOptions, RuleChanges, RuleText, Span, TaskRules};

/// A task as stored.
pub struct TaskRow {
    pub task_id: i64,
    pub rules: RuleText,
    pub paused: bool,
}

/// The rule columns, in the order `rule_text` reads them.
pub const RULE_COLUMNS: &str =
    "schedule, command, tz, biz_window::text, queue, args::text, dst_gap::text, dst_overlap::text";

/// The rules of a task row whose `RULE_COLUMNS` start at column `first` (1-based).
pub fn rule_text(row: &SpiHeapTupleData, first: usize, function: &'static str) -> RuleText {
    let text = |i: usize| -> String {
        row.get::<String>(first + i)
            .or_raise(function)
            .unwrap_or_default()
    };
    RuleText {
        schedule: text(0),
        command: row.get::<String>(first + 1).or_raise(function),
        tz: text(2),
        biz_window: text(3),
        queue: text(4),
        args: text(5),
        dst_gap: text(6),
        dst_overlap: text(7),
    }
}

/// Reads the caller's task of this name. `lock` takes a row lock for a change.
pub fn load_task(name: &str, lock: bool) -> Result<TaskRow, TideError> {
    load_task_of(name, None, lock)
}

/// A task by name, of the role `owner` when given (a task the caller may see: its own, a
/// team's, any role's for tide_admin).
pub fn load_task_of(name: &str, owner: Option<&str>, lock: bool) -> Result<TaskRow, TideError> {
    // The caller's own task of that name, else a team's or (tide_admin) anyone's: which one,
    // and the error when two roles have it, are tide._named_task's (src/security/roles.sql); with an
    // owner, that role's task, as row-level security lets the caller see it. Without one, the
    // call every version's schema has (an older version runs with this library until ALTER
    // EXTENSION pg_tide UPDATE).
    let named = match owner {
        None => "tide._named_task($1)",
        Some(_) => "tide._named_task($1, NULL, $2::name)",
    };
    let query = format!(
        "SELECT task_id, {RULE_COLUMNS}, paused FROM tide.task WHERE task_id = {named} {}",
        // NO KEY UPDATE: it serialises changes of the task without blocking the inserts of its
        // runs, whose foreign-key checks take KEY SHARE (a role's open transaction after
        // tide.pause would otherwise block the emits, and ticks, that create its runs).
        if lock { "FOR NO KEY UPDATE" } else { "" }
    );
    const F: &str = "load_task";
    // `connect_mut`: a read-only SPI connection refuses the row lock.
    Spi::connect_mut(|client| {
        let args: Vec<pgrx::datum::DatumWithOid> = match owner {
            None => vec![name.into()],
            Some(o) => vec![name.into(), o.into()],
        };
        let table = client.update(&query, Some(1), &args).or_raise(F);
        let Some(row) = table.into_iter().next() else {
            return Err(TideError::NoSuchTask(name.to_string()));
        };
        Ok(TaskRow {
            task_id: row.get::<i64>(1).or_raise(F).unwrap_or_default(),
            rules: rule_text(&row, 2, F),
            paused: row.get::<bool>(10).or_raise(F).unwrap_or_default(),
        })
    })
}

fn next_fire_datum(rules: &TaskRules) -> Option<TimestampWithTimeZone> {
    rules.next_fire(now()).map(to_pg)
}

/// The rule columns in the order of `$2..$9` of the write queries below.
fn rule_args(rules: &TaskRules) -> Vec<DatumWithOid<'static>> {
    vec![
        rules.schedule_text().into(),
        rules.command.clone().into(),
        rules.tz.name().to_string().into(),
        rules.biz_window.as_str().to_string().into(),
        rules.queue.clone().into(),
        rules.args.clone().into(),
        rules.policy.gap.as_str().to_string().into(),
        rules.policy.overlap.as_str().to_string().into(),
    ]
}

fn interval_of(span: Option<Span>) -> Option<Interval> {
    span.and_then(|s| Interval::new(s.months, s.days, s.micros).ok())
}

/// The execution options as SQL parameters, in the column order of `exec_columns(o)`.
/// The `reconcile` argument of `tide.schedule` and `tide.alter` (a reconciliation's definition,
/// as `tide.reconcile` writes it): a JSON object, else 22023 naming the value. What the object
/// holds is checked by `tide._check_task`.
fn reconcile_arg(reconcile: Option<JsonbText>, function: &'static str) -> Option<String> {
    let text = reconcile?.0;
    if !text.trim_start().starts_with('{') {
        raise(
            TideError::OutOfRange {
                param: "reconcile",
                value: text,
                expected:
                    "a JSON object (a reconciliation's definition; make one with tide.reconcile)",
            },
            function,
        );
    }
    Some(text)
}

fn exec_args(o: &ExecOptions, reconcile: Option<String>) -> Vec<DatumWithOid<'static>> {
    let mut args = vec![
        interval_of(o.timeout).into(),
        interval_of(o.lease).into(),
        o.priority.into(),
        o.max_attempts.into(),
        interval_of(o.backoff_base).into(),
        interval_of(o.backoff_cap).into(),
        o.backoff_factor.into(),
        o.jitter.clone().into(),
        o.misfire.clone().into(),
        interval_of(o.misfire_threshold).into(),
        o.catch_up_max.into(),
        interval_of(o.source_retention).into(),
        o.ready_dataset.clone().into(),
        o.ready_check.clone().into(),
        interval_of(o.ready_timeout).into(),
        interval_of(o.recheck_interval).into(),
        o.not_ready_policy.clone().into(),
        o.overlap.clone().into(),
        o.max_concurrency.into(),
        o.lock_key.clone().into(),
        o.topics.clone().into(),
        o.long.into(),
        o.top_level.into(),
        o.batch_rate.into(),
        interval_of(o.batch_pause).into(),
        o.error_kinds.clone().into(),
        o.ready_watermark.clone().into(),
        interval_of(o.watermark_stable_for).into(),
        o.fallback.clone().into(),
        o.rescan_previous.into(),
        reconcile.into(),
        o.database.clone().into(),
    ];
    args.truncate(exec_columns(o).len());
    args
}

/// The columns `exec_args` fills: all of `EXEC_COLUMNS`, but `database` when the call does not
/// name it (tide.alter leaving it as it is, and the 0.2.1 signatures, whose schema has no such
/// column until `ALTER EXTENSION pg_tide UPDATE`).
fn exec_columns(o: &ExecOptions) -> &'static [(&'static str, &'static str)] {
    if o.database.is_some() {
        &EXEC_COLUMNS
    } else {
        &EXEC_COLUMNS[..EXEC_COLUMNS.len() - 1]
    }
}

/// Column names and casts for `exec_args`, starting at parameter `$first`.
const EXEC_COLUMNS: [(&str, &str); 32] = [
    ("timeout", ""),
    ("lease", ""),
    ("priority", ""),
    ("max_attempts", ""),
    ("backoff_base", ""),
    ("backoff_cap", ""),
    ("backoff_factor", ""),
    ("jitter", "::tide.jitter"),
    ("misfire", "::tide.misfire"),
    ("misfire_threshold", ""),
    ("catch_up_max", ""),
    ("source_retention", ""),
    ("ready_dataset", ""),
    ("ready_check", ""),
    ("ready_timeout", ""),
    ("recheck_interval", ""),
    ("not_ready_policy", "::tide.not_ready_policy"),
    ("overlap", "::tide.overlap"),
    ("max_concurrency", ""),
    ("lock_key", ""),
    ("topics", "::text[]"),
    ("long", ""),
    ("top_level", ""),
    ("batch_rate", ""),
    ("batch_pause", ""),
    ("error_kinds", "::jsonb"),
    ("ready_watermark", ""),
    ("watermark_stable_for", ""),
    ("fallback", ""),
    ("rescan_previous", ""),
    // A reconciliation's definition (set by tide.reconcile; checked by tide._check_task).
    ("reconcile", "::jsonb"),
    // Where the command runs (NULL: pg_tide's database; checked by tide._check_task).
    ("database", ""),
];

/// Options where a given "nothing" value ('' / 0 / empty) removes the setting, so NULL can keep
/// meaning "leave it" in tide.alter.
fn stored(col: &str, p: &str) -> String {
    match col {
        "ready_dataset" | "ready_check" | "lock_key" | "ready_watermark" | "fallback" => {
            format!("nullif({p}, '')")
        }
        "watermark_stable_for" => format!("nullif({p}, interval '0')"),
        "max_concurrency" => format!("nullif({p}, 0)"),
        "batch_rate" => format!("nullif({p}, 0)"),
        "batch_pause" => format!("nullif({p}, interval '0')"),
        "error_kinds" | "reconcile" => format!("nullif({p}, '{{}}'::jsonb)"),
        // '' or pg_tide's own database: the default, where every other command runs.
        "database" => format!("nullif(nullif({p}, ''), pg_catalog.current_database())"),
        _ => p.to_string(),
    }
}

/// The options of overlap, locks, events and long tasks.
struct Guarantees<'a> {
    overlap: Option<&'a str>,
    max_concurrency: Option<i32>,
    lock_key: Option<&'a str>,
    topics: Option<Vec<Option<String>>>,
    long: Option<bool>,
    top_level: Option<bool>,
    batch_rate: Option<f64>,
    batch_pause: Option<Interval>,
    error_kinds: Option<JsonbText>,
    ready_watermark: Option<&'a str>,
    watermark_stable_for: Option<Interval>,
    fallback: Option<&'a str>,
    rescan_previous: Option<bool>,
    database: Option<&'a str>,
}

/// Checks what involves several options at once (`tide._check_task`), after a write: an error
/// aborts the statement, so nothing is written.
fn check_task(task_id: i64, function: &'static str) {
    Spi::run_with_args("SELECT tide._check_task($1)", &[task_id.into()]).or_raise(function);
    // A WARNING when nothing would run the task (no scheduler serves this database).
    Spi::run("SELECT tide._scheduler_warning()").or_raise(function);
    // The scheduler looks again at when to tick, at this commit (the next fire may be sooner).
    Spi::run("SELECT tide._wake(true)").or_raise(function);
}

/// Collects the execution options of `tide.schedule` / `tide.alter` and validates them.
#[allow(clippy::too_many_arguments)]
fn exec_options(
    timeout: Option<Interval>,
    lease: Option<Interval>,
    priority: Option<i32>,
    max_attempts: Option<i32>,
    backoff_base: Option<Interval>,
    backoff_factor: Option<f64>,
    backoff_cap: Option<Interval>,
    jitter: Option<&str>,
    misfire: Option<&str>,
    misfire_threshold: Option<Interval>,
    catch_up_max: Option<i32>,
    source_retention: Option<Interval>,
    ready_dataset: Option<&str>,
    ready_check: Option<&str>,
    ready_timeout: Option<Interval>,
    recheck_interval: Option<Interval>,
    not_ready_policy: Option<&str>,
    guarantees: Guarantees,
    function: &'static str,
) -> ExecOptions {
    let span = |i: Option<Interval>| i.as_ref().map(span_of);
    let text = |t: Option<&str>| t.map(|t| t.trim().to_string());
    ExecOptions {
        timeout: span(timeout),
        lease: span(lease),
        priority,
        max_attempts,
        backoff_base: span(backoff_base),
        backoff_factor,
        backoff_cap: span(backoff_cap),
        jitter: text(jitter),
        misfire: text(misfire),
        misfire_threshold: span(misfire_threshold),
        catch_up_max,
        source_retention: span(source_retention),
        ready_dataset: text(ready_dataset),
        ready_check: text(ready_check),
        ready_timeout: span(ready_timeout),
        recheck_interval: span(recheck_interval),
        not_ready_policy: text(not_ready_policy),
        overlap: text(guarantees.overlap),
        max_concurrency: guarantees.max_concurrency,
        lock_key: guarantees.lock_key.map(str::to_string),
        // A NULL topic in the array is refused like any malformed one.
        topics: guarantees
            .topics
            .map(|t| t.into_iter().map(Option::unwrap_or_default).collect()),
        long: guarantees.long,
        top_level: guarantees.top_level,
        batch_rate: guarantees.batch_rate,
        batch_pause: span(guarantees.batch_pause),
        error_kinds: guarantees.error_kinds.map(|k| k.0),
        ready_watermark: text(guarantees.ready_watermark),
        watermark_stable_for: span(guarantees.watermark_stable_for),
        fallback: text(guarantees.fallback),
        rescan_previous: guarantees.rescan_previous,
        // Not trimmed: a database name may hold any character.
        database: guarantees.database.map(str::to_string),
    }
    .validate()
    .or_raise(function)
}

/// Creates a task and returns its id. Every option is validated before anything is written;
/// a bad one is refused with SQLSTATE 22023. On a name the caller has, the same definition
/// returns the same id; another is refused (23505) unless `replace`.
/// `tide.schedule` as 0.2.0 and 0.2.1 declare it (without `database`): kept, without SQL of its
/// own, so that their install scripts load and run against this library until `ALTER EXTENSION
/// pg_tide UPDATE` brings the new signature.
#[allow(clippy::too_many_arguments)]
#[pg_extern(sql = false)]
fn schedule(
    task: Option<&str>,
    schedule: Option<&str>,
    command: Option<&str>,
    tz: Option<&str>,
    biz_window: Option<&str>,
    queue: Option<&str>,
    args: Option<JsonbText>,
    dst_gap: Option<&str>,
    dst_overlap: Option<&str>,
    timeout: Option<Interval>,
    lease: Option<Interval>,
    priority: Option<i32>,
    max_attempts: Option<i32>,
    backoff_base: Option<Interval>,
    backoff_factor: Option<f64>,
    backoff_cap: Option<Interval>,
    jitter: Option<&str>,
    misfire: Option<&str>,
    misfire_threshold: Option<Interval>,
    catch_up_max: Option<i32>,
    source_retention: Option<Interval>,
    ready_dataset: Option<&str>,
    ready_check: Option<&str>,
    ready_timeout: Option<Interval>,
    recheck_interval: Option<Interval>,
    not_ready_policy: Option<&str>,
    overlap: Option<&str>,
    max_concurrency: Option<i32>,
    lock_key: Option<&str>,
    topics: Option<Vec<Option<String>>>,
    long: Option<bool>,
    top_level: Option<bool>,
    batch_rate: Option<f64>,
    batch_pause: Option<Interval>,
    error_kinds: Option<JsonbText>,
    ready_watermark: Option<&str>,
    watermark_stable_for: Option<Interval>,
    fallback: Option<&str>,
    rescan_previous: Option<bool>,
    reconcile: Option<JsonbText>,
    replace: Option<bool>,
    pending: Option<&str>,
) -> i64 {
    schedule_in(
        task,
        schedule,
        command,
        tz,
        biz_window,
        queue,
        args,
        dst_gap,
        dst_overlap,
        timeout,
        lease,
        priority,
        max_attempts,
        backoff_base,
        backoff_factor,
        backoff_cap,
        jitter,
        misfire,
        misfire_threshold,
        catch_up_max,
        source_retention,
        ready_dataset,
        ready_check,
        ready_timeout,
        recheck_interval,
        not_ready_policy,
        overlap,
        max_concurrency,
        lock_key,
        topics,
        long,
        top_level,
        batch_rate,
        batch_pause,
        error_kinds,
        ready_watermark,
        watermark_stable_for,
        fallback,
        rescan_previous,
        reconcile,
        replace,
        pending,
        None,
    )
}

#[allow(clippy::too_many_arguments)]
#[pg_extern(volatile, schema = "tide", name = "schedule")]
#[search_path(pg_catalog, pg_temp)]
fn schedule_task(
    task: Option<&str>,
    schedule: Option<&str>,
    command: default!(Option<&str>, "NULL"),
    tz: default!(Option<&str>, "'UTC'"),
    biz_window: default!(Option<&str>, "'fire'"),
    queue: default!(Option<&str>, "'default'"),
    args: default!(Option<JsonbText>, "'{}'"),
    dst_gap: default!(Option<&str>, "'shift'"),
    dst_overlap: default!(Option<&str>, "'once'"),
    timeout: default!(Option<Interval>, "'1 hour'"),
    lease: default!(Option<Interval>, "'5 minutes'"),
    priority: default!(Option<i32>, 0),
    max_attempts: default!(Option<i32>, 5),
    backoff_base: default!(Option<Interval>, "'10 seconds'"),
    backoff_factor: default!(Option<f64>, 2.0),
    backoff_cap: default!(Option<Interval>, "'1 hour'"),
    jitter: default!(Option<&str>, "'full'"),
    misfire: default!(Option<&str>, "'catch_up'"),
    misfire_threshold: default!(Option<Interval>, "'60 seconds'"),
    catch_up_max: default!(Option<i32>, 100),
    source_retention: default!(Option<Interval>, "NULL"),
    ready_dataset: default!(Option<&str>, "NULL"),
    ready_check: default!(Option<&str>, "NULL"),
    ready_timeout: default!(Option<Interval>, "NULL"),
    recheck_interval: default!(Option<Interval>, "'1 minute'"),
    not_ready_policy: default!(Option<&str>, "'next_window'"),
    overlap: default!(Option<&str>, "'queue'"),
    max_concurrency: default!(Option<i32>, "NULL"),
    lock_key: default!(Option<&str>, "NULL"),
    topics: default!(Option<Vec<Option<String>>>, "'{}'"),
    long: default!(Option<bool>, false),
    top_level: default!(Option<bool>, false),
    batch_rate: default!(Option<f64>, "NULL"),
    batch_pause: default!(Option<Interval>, "NULL"),
    error_kinds: default!(Option<JsonbText>, "NULL"),
    ready_watermark: default!(Option<&str>, "NULL"),
    watermark_stable_for: default!(Option<Interval>, "NULL"),
    fallback: default!(Option<&str>, "NULL"),
    rescan_previous: default!(Option<bool>, false),
    reconcile: default!(Option<JsonbText>, "NULL"),
    replace: default!(Option<bool>, false),
    pending: default!(Option<&str>, "'hold'"),
    database: default!(Option<&str>, "NULL"),
) -> i64 {
    // NULL is this database, as '' is: the column is written (and compared) either way.
    schedule_in(
        task,
        schedule,
        command,
        tz,
        biz_window,
        queue,
        args,
        dst_gap,
        dst_overlap,
        timeout,
        lease,
        priority,
        max_attempts,
        backoff_base,
        backoff_factor,
        backoff_cap,
        jitter,
        misfire,
        misfire_threshold,
        catch_up_max,
        source_retention,
        ready_dataset,
        ready_check,
        ready_timeout,
        recheck_interval,
        not_ready_policy,
        overlap,
        max_concurrency,
        lock_key,
        topics,
        long,
        top_level,
        batch_rate,
        batch_pause,
        error_kinds,
        ready_watermark,
        watermark_stable_for,
        fallback,
        rescan_previous,
        reconcile,
        replace,
        pending,
        Some(database.unwrap_or("")),
    )
}

/// The body of `tide.schedule`; `database` None: the 0.2.1 signature (no such column yet).
#[allow(clippy::too_many_arguments)]
fn schedule_in(
    task: Option<&str>,
    schedule: Option<&str>,
    command: Option<&str>,
    tz: Option<&str>,
    biz_window: Option<&str>,
    queue: Option<&str>,
    args: Option<JsonbText>,
    dst_gap: Option<&str>,
    dst_overlap: Option<&str>,
    timeout: Option<Interval>,
    lease: Option<Interval>,
    priority: Option<i32>,
    max_attempts: Option<i32>,
    backoff_base: Option<Interval>,
    backoff_factor: Option<f64>,
    backoff_cap: Option<Interval>,
    jitter: Option<&str>,
    misfire: Option<&str>,
    misfire_threshold: Option<Interval>,
    catch_up_max: Option<i32>,
    source_retention: Option<Interval>,
    ready_dataset: Option<&str>,
    ready_check: Option<&str>,
    ready_timeout: Option<Interval>,
    recheck_interval: Option<Interval>,
    not_ready_policy: Option<&str>,
    overlap: Option<&str>,
    max_concurrency: Option<i32>,
    lock_key: Option<&str>,
    topics: Option<Vec<Option<String>>>,
    long: Option<bool>,
    top_level: Option<bool>,
    batch_rate: Option<f64>,
    batch_pause: Option<Interval>,
    error_kinds: Option<JsonbText>,
    ready_watermark: Option<&str>,
    watermark_stable_for: Option<Interval>,
    fallback: Option<&str>,
    rescan_previous: Option<bool>,
    reconcile: Option<JsonbText>,
    replace: Option<bool>,
    pending: Option<&str>,
    database: Option<&str>,
) -> i64 {
    const F: &str = "tide.schedule";
    let replace = required(replace, "replace", F);
    let pending = pending_policy(pending, F);
    let exec = exec_options(
        Some(required(timeout, "timeout", F)),
        Some(required(lease, "lease", F)),
        Some(required(priority, "priority", F)),
        Some(required(max_attempts, "max_attempts", F)),
        Some(required(backoff_base, "backoff_base", F)),
        Some(required(backoff_factor, "backoff_factor", F)),
        Some(required(backoff_cap, "backoff_cap", F)),
        Some(required(jitter, "jitter", F)),
        Some(required(misfire, "misfire", F)),
        Some(required(misfire_threshold, "misfire_threshold", F)),
        Some(required(catch_up_max, "catch_up_max", F)),
        source_retention,
        ready_dataset.filter(|d| !d.trim().is_empty()),
        ready_check.filter(|c| !c.trim().is_empty()),
        ready_timeout,
        Some(required(recheck_interval, "recheck_interval", F)),
        Some(required(not_ready_policy, "not_ready_policy", F)),
        Guarantees {
            overlap: Some(required(overlap, "overlap", F)),
            max_concurrency,
            lock_key,
            topics: Some(required(topics, "topics", F)),
            long: Some(required(long, "long", F)),
            top_level: Some(required(top_level, "top_level", F)),
            batch_rate,
            batch_pause,
            error_kinds,
            ready_watermark,
            watermark_stable_for,
            fallback,
            rescan_previous: Some(required(rescan_previous, "rescan_previous", F)),
            database,
        },
        F,
    );
    let name = required(task, "task", F);
    check_name(name).or_raise(F);
    let text = RuleText {
        // NULL: an event task without a schedule (tide._check_task wants topics then).
        schedule: schedule.unwrap_or_default().to_string(),
        command: command.map(str::to_string),
        tz: required(tz, "tz", F).to_string(),
        biz_window: required(biz_window, "biz_window", F).to_string(),
        queue: required(queue, "queue", F).to_string(),
        args: required(args, "args", F).0,
        dst_gap: required(dst_gap, "dst_gap", F).to_string(),
        dst_overlap: required(dst_overlap, "dst_overlap", F).to_string(),
    };
    let rules = text.validate().or_raise(F);

    let mut args: Vec<DatumWithOid> = vec![name.into()];
    args.extend(rule_args(&rules));
    args.push(next_fire_datum(&rules).into());
    args.push(caller_name().into());
    args.extend(exec_args(&exec, reconcile_arg(reconcile, F)));
    let columns: Vec<&str> = exec_columns(&exec).iter().map(|(c, _)| *c).collect();
    let values: Vec<String> = exec_columns(&exec)
        .iter()
        .enumerate()
        .map(|(i, (col, cast))| stored(col, &format!("${}{cast}", i + 12)))
        .collect();
    // One statement inserts the task and its version-1 snapshot; a taken name inserts neither.
    let query = format!(
        "WITH task AS (
             INSERT INTO tide.task (name, schedule, command, tz, biz_window, queue, args,
                                    dst_gap, dst_overlap, next_fire_at, owner, {})
             VALUES ($1, $2, $3, $4, $5::tide.biz_window, $6, $7::jsonb,
                     $8::tide.dst_gap, $9::tide.dst_overlap, $10, $11::name, {})
             ON CONFLICT (owner, name) DO NOTHING
             RETURNING *
         ), snapshot AS (
             INSERT INTO tide.task_version (task_id, version, rules, owner, created_by)
             SELECT t.task_id, t.version, tide._task_rules(t::tide.task), t.owner, t.owner FROM task t
         )
         SELECT task_id FROM task",
        columns.join(", "),
        values.join(", ")
    );
    let id = Spi::connect_mut(|client| {
        let plan = kept_plan(client, &query, &args);
        let inserted = client.update(&*plan, None, &args).or_raise(F);
        inserted
            .into_iter()
            .next()
            .map(|row| row.get::<i64>(1).or_raise(F))
    });
    if let Some(Some(id)) = id {
        check_task(id, F);
        return id;
    }
    // The name is taken: the same definition is a no-op (a deploy script runs it every time);
    // another one is refused unless replace => true makes it the task's next rule version.
    let rule_columns = "schedule, command, tz, biz_window, queue, args, dst_gap, dst_overlap";
    let new_values =
        "$2, $3, $4, $5::tide.biz_window, $6, $7::jsonb, $8::tide.dst_gap, $9::tide.dst_overlap";
    let query = format!(
        "SELECT task_id,
                ({rule_columns}, {cols}) IS NOT DISTINCT FROM ({new_values}, {vals}),
                (schedule, tz, dst_gap, dst_overlap) IS NOT DISTINCT FROM ($2, $4, $8::tide.dst_gap, $9::tide.dst_overlap)
           FROM tide.task WHERE name = $1 AND owner = $11::name
            FOR NO KEY UPDATE",
        cols = columns.join(", "),
        vals = values.join(", ")
    );
    let found = Spi::connect_mut(|client| {
        let rows = client.update(&query, Some(1), &args).or_raise(F);
        rows.into_iter().next().map(|row| {
            (
                row.get::<i64>(1).or_raise(F).unwrap_or_default(),
                row.get::<bool>(2).or_raise(F).unwrap_or_default(),
                row.get::<bool>(3).or_raise(F).unwrap_or_default(),
            )
        })
    });
    let Some((task_id, same, same_timing)) = found else {
        // Deleted between the insert and this look: a rare race; the caller may retry.
        raise(TideError::DuplicateTask(name.to_string()), F)
    };
    if same {
        return task_id;
    }
    if !replace {
        raise(TideError::DuplicateTask(name.to_string()), F);
    }
    let sets: Vec<String> = columns
        .iter()
        .zip(values.iter())
        .map(|(c, v)| format!("{c} = {v}"))
        .collect();
    let update = format!(
        "UPDATE tide.task
            SET ({rule_columns}) = ({new_values}),
                next_fire_at = CASE WHEN {keep} THEN next_fire_at ELSE $10 END,
                {sets}
          WHERE task_id = (SELECT t.task_id FROM tide.task t WHERE t.name = $1 AND t.owner = $11::name)
          RETURNING version",
        keep = same_timing,
        sets = sets.join(",\n                ")
    );
    let version = Spi::connect_mut(|client| {
        let updated = client.update(&update, None, &args).or_raise(F);
        updated
            .into_iter()
            .next()
            .and_then(|row| row.get::<i32>(1).or_raise(F))
            .unwrap_or_else(|| raise(TideError::NoSuchTask(name.to_string()), F))
    });
    check_task(task_id, F);
    Spi::run_with_args(
        "SELECT tide._apply_pending($1, $2, $3)",
        &[task_id.into(), version.into(), pending.into()],
    )
    .or_raise(F);
    task_id
}

/// A statement's text and argument types, with its plan kept for the session.
type KeptPlan = (String, Vec<pg_sys::Oid>, Rc<OwnedPreparedStatement>);

thread_local! {
    /// `tide.schedule`'s insert, prepared once per session for each text and argument types
    /// (two in practice: with and without `database`): planning it anew cost a third of a call.
    /// PostgreSQL's plan cache plans it again when what it reads changes (an `ALTER EXTENSION`,
    /// a role's row-level security).
    static KEPT: RefCell<Vec<KeptPlan>> = const { RefCell::new(Vec::new()) };
}

/// This session's kept plan of `query` for arguments of these types, prepared and kept first
/// if there is none. Handed out, not borrowed: what runs it may come back here.
fn kept_plan(client: &SpiClient, query: &str, args: &[DatumWithOid]) -> Rc<OwnedPreparedStatement> {
    const F: &str = "tide.schedule";
    let oids: Vec<pg_sys::Oid> = args.iter().map(DatumWithOid::oid).collect();
    let found = KEPT.with_borrow(|kept| {
        kept.iter()
            .find(|(q, o, _)| q == query && *o == oids)
            .map(|(_, _, plan)| Rc::clone(plan))
    });
    found.unwrap_or_else(|| {
        let types: Vec<PgOid> = oids.iter().map(|o| PgOid::from(*o)).collect();
        let plan = Rc::new(client.prepare_mut(query, &types).or_raise(F).keep());
        KEPT.with_borrow_mut(|kept| kept.push((query.to_string(), oids, Rc::clone(&plan))));
        plan
    })
}

/// The `pending` option of tide.alter and tide.schedule(replace => true): what unstarted runs
/// created under older rules do.
fn pending_policy(pending: Option<&str>, function: &'static str) -> String {
    let pending = required(pending, "pending", function)
        .trim()
        .to_ascii_lowercase();
    if !matches!(pending.as_str(), "hold" | "adopt" | "keep") {
        raise(TideError::BadPending(pending), function);
    }
    pending
}

/// Changes only the options given (NULL leaves one as it is; `command => ''` removes the
/// command) and returns the task's rule version afterwards: one higher if any rule changed.
/// `tide.alter` as 0.2.0 and 0.2.1 declare it (without `database`): kept, without SQL of its
/// own, so that their install scripts load and run against this library until `ALTER EXTENSION
/// pg_tide UPDATE` brings the new signature.
#[allow(clippy::too_many_arguments)]
#[pg_extern(sql = false)]
fn alter(
    task: Option<&str>,
    schedule: Option<&str>,
    command: Option<&str>,
    tz: Option<&str>,
    biz_window: Option<&str>,
    queue: Option<&str>,
    args: Option<JsonbText>,
    dst_gap: Option<&str>,
    dst_overlap: Option<&str>,
    timeout: Option<Interval>,
    lease: Option<Interval>,
    priority: Option<i32>,
    max_attempts: Option<i32>,
    backoff_base: Option<Interval>,
    backoff_factor: Option<f64>,
    backoff_cap: Option<Interval>,
    jitter: Option<&str>,
    misfire: Option<&str>,
    misfire_threshold: Option<Interval>,
    catch_up_max: Option<i32>,
    source_retention: Option<Interval>,
    ready_dataset: Option<&str>,
    ready_check: Option<&str>,
    ready_timeout: Option<Interval>,
    recheck_interval: Option<Interval>,
    not_ready_policy: Option<&str>,
    pending: Option<&str>,
    overlap: Option<&str>,
    max_concurrency: Option<i32>,
    lock_key: Option<&str>,
    topics: Option<Vec<Option<String>>>,
    long: Option<bool>,
    top_level: Option<bool>,
    batch_rate: Option<f64>,
    batch_pause: Option<Interval>,
    error_kinds: Option<JsonbText>,
    ready_watermark: Option<&str>,
    watermark_stable_for: Option<Interval>,
    fallback: Option<&str>,
    rescan_previous: Option<bool>,
    reconcile: Option<JsonbText>,
) -> i32 {
    alter_task(
        task,
        schedule,
        command,
        tz,
        biz_window,
        queue,
        args,
        dst_gap,
        dst_overlap,
        timeout,
        lease,
        priority,
        max_attempts,
        backoff_base,
        backoff_factor,
        backoff_cap,
        jitter,
        misfire,
        misfire_threshold,
        catch_up_max,
        source_retention,
        ready_dataset,
        ready_check,
        ready_timeout,
        recheck_interval,
        not_ready_policy,
        pending,
        overlap,
        max_concurrency,
        lock_key,
        topics,
        long,
        top_level,
        batch_rate,
        batch_pause,
        error_kinds,
        ready_watermark,
        watermark_stable_for,
        fallback,
        rescan_previous,
        reconcile,
        None,
    )
}

#[allow(clippy::too_many_arguments)]
#[pg_extern(volatile, schema = "tide", name = "alter")]
#[search_path(pg_catalog, pg_temp)]
fn alter_task(
    task: Option<&str>,
    schedule: default!(Option<&str>, "NULL"),
    command: default!(Option<&str>, "NULL"),
    tz: default!(Option<&str>, "NULL"),
    biz_window: default!(Option<&str>, "NULL"),
    queue: default!(Option<&str>, "NULL"),
    args: default!(Option<JsonbText>, "NULL"),
    dst_gap: default!(Option<&str>, "NULL"),
    dst_overlap: default!(Option<&str>, "NULL"),
    timeout: default!(Option<Interval>, "NULL"),
    lease: default!(Option<Interval>, "NULL"),
    priority: default!(Option<i32>, "NULL"),
    max_attempts: default!(Option<i32>, "NULL"),
    backoff_base: default!(Option<Interval>, "NULL"),
    backoff_factor: default!(Option<f64>, "NULL"),
    backoff_cap: default!(Option<Interval>, "NULL"),
    jitter: default!(Option<&str>, "NULL"),
    misfire: default!(Option<&str>, "NULL"),
    misfire_threshold: default!(Option<Interval>, "NULL"),
    catch_up_max: default!(Option<i32>, "NULL"),
    source_retention: default!(Option<Interval>, "NULL"),
    ready_dataset: default!(Option<&str>, "NULL"),
    ready_check: default!(Option<&str>, "NULL"),
    ready_timeout: default!(Option<Interval>, "NULL"),
    recheck_interval: default!(Option<Interval>, "NULL"),
    not_ready_policy: default!(Option<&str>, "NULL"),
    pending: default!(Option<&str>, "'hold'"),
    overlap: default!(Option<&str>, "NULL"),
    max_concurrency: default!(Option<i32>, "NULL"),
    lock_key: default!(Option<&str>, "NULL"),
    topics: default!(Option<Vec<Option<String>>>, "NULL"),
    long: default!(Option<bool>, "NULL"),
    top_level: default!(Option<bool>, "NULL"),
    batch_rate: default!(Option<f64>, "NULL"),
    batch_pause: default!(Option<Interval>, "NULL"),
    error_kinds: default!(Option<JsonbText>, "NULL"),
    ready_watermark: default!(Option<&str>, "NULL"),
    watermark_stable_for: default!(Option<Interval>, "NULL"),
    fallback: default!(Option<&str>, "NULL"),
    rescan_previous: default!(Option<bool>, "NULL"),
    reconcile: default!(Option<JsonbText>, "NULL"),
    database: default!(Option<&str>, "NULL"),
) -> i32 {
    const F: &str = "tide.alter";
    let name = required(task, "task", F);
    let pending = pending_policy(pending, F);
    let exec = exec_options(
        timeout,
        lease,
        priority,
        max_attempts,
        backoff_base,
        backoff_factor,
        backoff_cap,
        jitter,
        misfire,
        misfire_threshold,
        catch_up_max,
        source_retention,
        ready_dataset,
        ready_check,
        ready_timeout,
        recheck_interval,
        not_ready_policy,
        Guarantees {
            overlap,
            max_concurrency,
            lock_key,
            topics,
            long,
            top_level,
            batch_rate,
            batch_pause,
            error_kinds,
            ready_watermark,
            watermark_stable_for,
            fallback,
            rescan_previous,
            database,
        },
        F,
    );
    let current = load_task(name, true).or_raise(F);
    let old = current.rules.validate().or_raise(F);
    let text = current.rules.with(RuleChanges {
        schedule: schedule.map(str::to_string),
        command: command.map(str::to_string),
        tz: tz.map(str::to_string),
        biz_window: biz_window.map(str::to_string),
        queue: queue.map(str::to_string),
        args: args.map(|a| a.0),
        dst_gap: dst_gap.map(str::to_string),
        dst_overlap: dst_overlap.map(str::to_string),
    });
    let rules = text.validate().or_raise(F);

    // The next fire moves only when the timing changed, so a no-op alter never skips a fire
    // that is due but not yet processed.
    let timing_changed = old.schedule_text() != rules.schedule_text()
        || old.tz != rules.tz
        || old.policy != rules.policy;
    let mut args: Vec<DatumWithOid> = vec![current.task_id.into()];
    args.extend(rule_args(&rules));
    args.push(timing_changed.into());
    args.push(next_fire_datum(&rules).into());
    args.extend(exec_args(&exec, reconcile_arg(reconcile, F)));
    // NULL leaves an option as it is; '' removes ready_dataset / ready_check.
    let sets: Vec<String> = exec_columns(&exec)
        .iter()
        .enumerate()
        .map(|(i, (col, cast))| {
            let p = format!("${}{cast}", i + 12);
            let value = stored(col, &p);
            if value == p {
                format!("{col} = coalesce({p}, {col})")
            } else {
                format!("{col} = CASE WHEN {p} IS NULL THEN {col} ELSE {value} END")
            }
        })
        .collect();
    let query = format!(
        "UPDATE tide.task
            SET schedule = $2, command = $3, tz = $4, biz_window = $5::tide.biz_window,
                queue = $6, args = $7::jsonb, dst_gap = $8::tide.dst_gap,
                dst_overlap = $9::tide.dst_overlap,
                next_fire_at = CASE WHEN $10 THEN $11 ELSE next_fire_at END,
                {}
          WHERE task_id = $1
          RETURNING version",
        sets.join(",\n                ")
    );
    let version = Spi::connect_mut(|client| {
        let updated = client.update(&query, None, &args).or_raise(F);
        updated
            .into_iter()
            .next()
            .and_then(|row| row.get::<i32>(1).or_raise(F))
            .unwrap_or_else(|| raise(TideError::NoSuchTask(name.to_string()), F))
    });
    check_task(current.task_id, F);
    // Unstarted runs created under older rules must not silently run under the new ones.
    Spi::run_with_args(
        "SELECT tide._apply_pending($1, $2, $3)",
        &[current.task_id.into(), version.into(), pending.into()],
    )
    .or_raise(F);
    version
}

/// Deletes a task and its rule versions. Returns false when the caller (or `owner`) has no
/// task of that name (like every removal verb, so a teardown script can run twice). `owner`
/// names another role's task: one the caller acts for (a team it is a member of) or, for a
/// superuser or tide_admin, any role's, a role that no longer exists included.
#[pg_extern(volatile, schema = "tide")]
#[search_path(pg_catalog, pg_temp)]
fn unschedule(task: Option<&str>, owner: default!(Option<&str>, "NULL")) -> bool {
    const F: &str = "tide.unschedule";
    let name = required(task, "task", F);
    check_name(name).or_raise(F);
    let caller = caller_name();
    if let Some(o) = owner.filter(|o| o.is_empty() || o.len() > 63) {
        raise(
            TideError::OutOfRange {
                param: "owner",
                value: o.to_string(),
                expected: "a role's name (1 to 63 bytes)",
            },
            F,
        );
    }
    let owner = owner.map(str::to_string).unwrap_or_else(|| caller.clone());
    if owner != caller {
        let allowed = Spi::get_one_with_args::<bool>(
            "SELECT tide._acts_for() IS NULL OR $1 = ANY (tide._acts_for())",
            &[owner.as_str().into()],
        )
        .or_raise(F)
        .unwrap_or(false);
        if !allowed {
            pgrx::pg_sys::panic::ErrorReport::new(
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                format!("permission denied to unschedule a task of role \"{owner}\""),
                F,
            )
            .set_hint("a superuser or a member of tide_admin unschedules any role's task; a role, its own and its teams'")
            .report(PgLogLevel::ERROR);
        }
    }
    let deleted = Spi::connect_mut(|client| {
        client
            .update(
                "DELETE FROM tide.task WHERE name = $1 AND owner = $2 RETURNING task_id",
                None,
                &[name.into(), owner.as_str().into()],
            )
            .or_raise(F)
            .len()
    });
    deleted > 0
}

/// Stops a task from firing. Not a rule change: no new version. Returns false if it was
/// already paused.
#[pg_extern(volatile, schema = "tide")]
#[search_path(pg_catalog, pg_temp)]
fn pause(task: Option<&str>) -> bool {
    const F: &str = "tide.pause";
    let name = required(task, "task", F);
    let task = load_task(name, true).or_raise(F);
    if task.paused {
        return false;
    }
    Spi::run_with_args(
        "UPDATE tide.task SET paused = true, paused_at = now() WHERE task_id = $1",
        &[task.task_id.into()],
    )
    .or_raise(F);
    true
}

/// Lets a paused task fire again. The paused time is not caught up: its windows are recorded
/// as skipped (paused) by the next tick. Returns false if it was not paused.
#[pg_extern(volatile, schema = "tide")]
#[search_path(pg_catalog, pg_temp)]
fn resume(task: Option<&str>) -> bool {
    const F: &str = "tide.resume";
    let name = required(task, "task", F);
    let task = load_task(name, true).or_raise(F);
    if !task.paused {
        return false;
    }
    // next_fire_at still holds the first fire the pause held back (the tick does not touch
    // paused tasks); fires up to now are recorded as skipped (paused) from there.
    Spi::run_with_args(
        "UPDATE tide.task SET paused = false, paused_at = NULL, skip_until = now()
          WHERE task_id = $1",
        &[task.task_id.into()],
    )
    .or_raise(F);
    Spi::run("SELECT tide._wake(true)").or_raise(F);
    true
}

/// Checks an interval argument of the PL/pgSQL functions with the rules `tide.schedule` applies
/// to its intervals (one sign, within the documented maximum for `param`) and returns it; NULL
/// passes (the caller decides whether NULL is allowed).
#[pg_extern(immutable, parallel_safe, schema = "tide", name = "_bounded")]
fn bounded(param: &str, value: Option<Interval>, zero_ok: bool) -> Option<Interval> {
    let value = value?;
    // The PL/pgSQL functions pass the names of documented options; an unknown one gets the
    // plain positive check.
    let param = crate::tasks::rules::interval_option(param).unwrap_or("interval");
    crate::tasks::rules::check_interval(param, span_of(&value), zero_ok).or_raise("tide._bounded");
    Some(value)
}

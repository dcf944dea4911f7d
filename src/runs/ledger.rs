//! The Rust pieces of the run ledger's SQL surface: retry delays and error classes for the
//! PL/pgSQL ledger (src/runs/*.sql), and `tide.rerun`, which needs the calendar to find a
//! business date's window (or the latest fire's).

use chrono::{Duration, NaiveDate, NaiveTime};
use pgrx::datum::{Date, Interval, TimestampWithTimeZone};
use pgrx::prelude::*;

use crate::base::error::TideError;
use crate::base::sqlerr::{raise, required, OrRaise};
use crate::calendar::pgtime::{from_pg, micros_of, now, span_of, to_pg};
use crate::calendar::{fire_iter, previous_fire, to_local, window_for, BizWindow, WindowKind};
use crate::tasks::catalog::{load_task, RULE_COLUMNS};
use crate::tasks::retry::{classify, delay_us, ErrorKind, Jitter};

/// The delay before the next try after `tries` failed ones: `min(cap, base * factor^(tries-1))`
/// spread by `jitter` using `unit` (a random number in [0, 1), pass `random()`). Internal
/// (`tide._backoff_delay`) since 0.3.0; the Rust name keeps the C symbol 0.2's scripts name.
#[pg_extern(immutable, parallel_safe, schema = "tide", name = "_backoff_delay")]
fn backoff_delay(
    tries: i32,
    base: Interval,
    factor: f64,
    cap: Interval,
    jitter: &str,
    unit: f64,
) -> Interval {
    const F: &str = "tide._backoff_delay";
    let jitter = Jitter::parse(jitter).or_raise(F);
    check_backoff(tries, &base, factor, &cap, unit).or_raise(F);
    let us = delay_us(
        tries,
        micros_of(&base),
        factor,
        micros_of(&cap),
        jitter,
        unit,
    );
    Interval::from_micros(us)
}

/// `tide._backoff_delay`'s arguments, checked with `tide.schedule`'s rules: a try number of at
/// least 0, `base` and `cap` as the options `backoff_base` and `backoff_cap` (one sign, within
/// their maximum), `factor` between 1 and 100, `unit` a number in [0, 1]. A delay is then never
/// negative and never past `cap`.
fn check_backoff(
    tries: i32,
    base: &Interval,
    factor: f64,
    cap: &Interval,
    unit: f64,
) -> Result<(), TideError> {
    if tries < 0 {
        return Err(TideError::OutOfRange {
            param: "tries",
            value: tries.to_string(),
            expected: "0 or more (the tries that failed so far)",
        });
    }
    crate::tasks::rules::check_interval("backoff_base", span_of(base), false)?;
    crate::tasks::rules::check_interval("backoff_cap", span_of(cap), false)?;
    if !(1.0..=100.0).contains(&factor) {
        return Err(TideError::OutOfRange {
            param: "factor",
            value: factor.to_string(),
            expected: "between 1 and 100",
        });
    }
    if !(0.0..=1.0).contains(&unit) {
        return Err(TideError::OutOfRange {
            param: "unit",
            value: unit.to_string(),
            expected: "between 0 and 1, such as random()",
        });
    }
    Ok(())
}

/// How a failed command's SQLSTATE is treated: 'transient', 'business' or 'not_ready'.
/// Internal (`tide._error_kind_of`) since 0.3.0; the Rust name keeps the C symbol.
#[pg_extern(immutable, parallel_safe, schema = "tide", name = "_error_kind_of")]
fn error_kind_of(sqlstate: &str) -> &'static str {
    classify(sqlstate).as_str()
}

/// How a failed command's SQLSTATE is treated under a task's `error_kinds` (its rules'
/// `error_kinds`, NULL for none): 'transient', 'business' or 'not_ready'.
#[pg_extern(immutable, parallel_safe, schema = "tide", name = "_error_kind")]
fn error_kind(sqlstate: &str, kinds: Option<crate::base::jsonarg::JsonbText>) -> &'static str {
    crate::tasks::retry::classify_with(sqlstate, kinds.as_ref().map(|k| k.0.as_str())).as_str()
}

/// Checks one run's args given to `tide.enqueue` with the rules `tide.schedule` applies to a
/// task's args (a JSON object, bounded in size and depth, numbers a double can hold): true,
/// or a 22023 error naming the bad value.
#[pg_extern(immutable, parallel_safe, schema = "tide", name = "_args_ok")]
fn args_ok(value: crate::base::jsonarg::JsonbText) -> bool {
    crate::base::jsontext::check_object(&value.0, "args").or_raise("tide.enqueue");
    true
}

/// Checks an error kind given by a worker and returns its canonical spelling.
#[pg_extern(immutable, parallel_safe, schema = "tide", name = "_error_kind_from")]
fn error_kind_from(kind: &str) -> &'static str {
    ErrorKind::parse(kind).or_raise("tide.fail_run").as_str()
}

/// The window of a task whose business date is `biz_date`: the one window of the task's
/// calendar starting on that local date.
fn window_by_date(
    rules: &crate::tasks::rules::TaskRules,
    biz_date: NaiveDate,
    task: &str,
) -> Result<(Option<chrono::DateTime<chrono::Utc>>, BizWindow), TideError> {
    let (tz, policy, kind) = (rules.tz, rules.policy, rules.biz_window);
    let schedule = rules.calendar(task)?;
    // The first fire at or after the local midnight of the date, then every fire while its
    // window still starts on or before that date.
    let midnight = biz_date.and_time(NaiveTime::MIN);
    let start = crate::calendar::zone_instant(tz, midnight) - Duration::days(1);
    let mut found: Vec<(chrono::DateTime<chrono::Utc>, BizWindow)> = Vec::new();
    for (i, fire) in fire_iter(schedule, tz, policy, start)
        .take(20_000)
        .enumerate()
    {
        if i % 1024 == 0 {
            pgrx::check_for_interrupts!();
        }
        let Some(w) = window_for(schedule, tz, policy, kind, fire) else {
            continue;
        };
        if w.biz_date > biz_date {
            break;
        }
        if w.biz_date == biz_date && !found.iter().any(|(_, f)| f.start == w.start) {
            found.push((fire, w));
        }
        if to_local(tz, fire).date() > biz_date + Duration::days(62) {
            break;
        }
    }
    match found.len() {
        1 => Ok((Some(found[0].0), found[0].1)),
        0 => Err(TideError::NoWindow {
            task: task.to_string(),
            what: format!("business date {biz_date}"),
            hint: match kind {
                WindowKind::Week => {
                    "week windows start on Mondays: pass the Monday's date".to_string()
                }
                WindowKind::Month => {
                    "month windows start on the 1st: pass the first day of the month".to_string()
                }
                _ => "see the task's windows with tide.preview(task)".to_string(),
            },
        }),
        n => Err(TideError::NoWindow {
            task: task.to_string(),
            what: format!("one business date {biz_date} ({n} windows start that day)"),
            hint: "pass window_start => the start of the window instead".to_string(),
        }),
    }
}

/// The window of a task that starts exactly at `start`.
fn window_by_start(
    rules: &crate::tasks::rules::TaskRules,
    start: chrono::DateTime<chrono::Utc>,
    task: &str,
) -> Result<(Option<chrono::DateTime<chrono::Utc>>, BizWindow), TideError> {
    let (tz, policy, kind) = (rules.tz, rules.policy, rules.biz_window);
    let schedule = rules.calendar(task)?;
    let not_a_start = || TideError::NoWindow {
        task: task.to_string(),
        what: format!("a window starting at {start}"),
        hint: "see the task's windows with tide.preview(task), or pass biz_date".to_string(),
    };
    let fire = match kind {
        // A fire window starts at a fire and ends at the next one.
        WindowKind::Fire => fire_iter(schedule, tz, policy, start).next().filter(|_| {
            previous_fire(schedule, tz, policy, start + Duration::microseconds(1)) == Some(start)
        }),
        // A period window belongs to the first fire at or after its end.
        _ => fire_iter(schedule, tz, policy, start)
            .take(20_000)
            .find(|f| window_for(schedule, tz, policy, kind, *f).is_some_and(|w| w.start >= start)),
    }
    .ok_or_else(not_a_start)?;
    let w = window_for(schedule, tz, policy, kind, fire).ok_or_else(not_a_start)?;
    if w.start != start {
        return Err(not_a_start());
    }
    Ok((Some(fire), w))
}

/// Runs one window of a task by hand — again, or for the first time: the window of a business
/// date, the one starting at `window_start`, or (neither given) the window of the latest fire
/// at or before now (what 0.2's `tide.run_now` did). It goes through the same idempotency key
/// as every run of that window: a run of it already in line is left as it is, one that
/// succeeded is refused unless `force`; `version` chooses between the run's original rules and
/// the current ones when they differ. Returns the run id.
#[pg_extern(volatile, schema = "tide")]
#[search_path(pg_catalog, pg_temp)]
fn rerun(
    task: Option<&str>,
    biz_date: default!(Option<Date>, "NULL"),
    window_start: default!(Option<TimestampWithTimeZone>, "NULL"),
    version: default!(Option<&str>, "NULL"),
    force: default!(Option<bool>, false),
) -> i64 {
    rerun_in(task, biz_date, window_start, version, force, "tide.rerun")
}

/// `tide.run_now`, folded into `tide.rerun` in 0.3.0: kept without SQL of its own so that the
/// install scripts of 0.2 versions, which name its symbol, load against this library until
/// `ALTER EXTENSION pg_tide UPDATE`.
#[pg_extern(sql = false)]
fn run_now(
    task: Option<&str>,
    biz_date: Option<Date>,
    version: Option<&str>,
    force: Option<bool>,
) -> i64 {
    rerun_in(task, biz_date, None, version, force, "tide.run_now")
}

fn rerun_in(
    task: Option<&str>,
    biz_date: Option<Date>,
    window_start: Option<TimestampWithTimeZone>,
    version: Option<&str>,
    force: Option<bool>,
    f: &'static str,
) -> i64 {
    let name = required(task, "task", f);
    let row = load_task(name, true).or_raise(f);
    let rules = row.rules.validate().or_raise(f);
    let (fire, window) = match (biz_date, window_start) {
        (Some(d), None) => {
            let date = crate::calendar::pgtime::date_from_pg(d, "biz_date").or_raise(f);
            window_by_date(&rules, date, name).or_raise(f)
        }
        (None, Some(ws)) => {
            window_by_start(&rules, from_pg(ws, "window_start").or_raise(f), name).or_raise(f)
        }
        (None, None) => latest_window(&rules, name).or_raise(f),
        (Some(_), Some(_)) => raise(
            TideError::OneOf {
                params: "biz_date or window_start",
            },
            f,
        ),
    };
    run_window(&row, fire, window, version, force, f)
}

/// The window of a task's latest fire at or before now.
fn latest_window(
    rules: &crate::tasks::rules::TaskRules,
    name: &str,
) -> Result<(Option<chrono::DateTime<chrono::Utc>>, BizWindow), TideError> {
    let schedule = rules.calendar(name)?;
    let (tz, policy, kind) = (rules.tz, rules.policy, rules.biz_window);
    let fire = previous_fire(schedule, tz, policy, now() + Duration::microseconds(1))
        .ok_or_else(|| TideError::NoSchedule(name.to_string()))?;
    let w = window_for(schedule, tz, policy, kind, fire)
        .ok_or_else(|| TideError::NoSchedule(name.to_string()))?;
    Ok((Some(fire), w))
}

/// Creates or reopens the run of one window that has ended (tide.rerun).
fn run_window(
    row: &crate::tasks::catalog::TaskRow,
    fire: Option<chrono::DateTime<chrono::Utc>>,
    window: BizWindow,
    version: Option<&str>,
    force: Option<bool>,
    function: &'static str,
) -> i64 {
    if window.end > now() {
        raise(
            TideError::OutOfRange {
                param: "biz_date",
                value: window.biz_date.to_string(),
                expected: "a window that has already ended",
            },
            function,
        );
    }
    Spi::get_one_with_args::<i64>(
        "SELECT tide._rerun($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            row.task_id.into(),
            fire.map(to_pg).into(),
            to_pg(window.start).into(),
            to_pg(window.end).into(),
            crate::calendar::pgtime::date_to_pg(window.biz_date).into(),
            version.into(),
            force.unwrap_or(false).into(),
            function.into(),
        ],
    )
    .or_raise(function)
    .unwrap_or_else(|| raise(TideError::NoSuchTask(String::new()), function))
}

/// The window of task `task_id` (of any owner: a reconciliation's replay, run for its owner)
/// whose business date is `biz_date`, with its fire: what `tide.rerun(task, biz_date)` finds.
#[pg_extern(stable, schema = "tide", name = "_window_of_date")]
#[search_path(pg_catalog, pg_temp)]
fn window_of_date(
    task_id: i64,
    biz_date: Date,
) -> TableIterator<
    'static,
    (
        name!(fire_at, Option<TimestampWithTimeZone>),
        name!(window_start, TimestampWithTimeZone),
        name!(window_end, TimestampWithTimeZone),
    ),
> {
    const F: &str = "tide.reconcile";
    let (name, rules) = Spi::connect(|client| {
        let query = format!("SELECT name, {RULE_COLUMNS} FROM tide.task WHERE task_id = $1");
        let table = client
            .select(&query, Some(1), &[task_id.into()])
            .or_raise(F);
        let row = table
            .into_iter()
            .next()
            .unwrap_or_else(|| raise(TideError::NoSuchTask(task_id.to_string()), F));
        let name: String = row.get::<String>(1).or_raise(F).unwrap_or_default();
        (name, crate::tasks::catalog::rule_text(&row, 2, F))
    });
    let rules = rules.validate().or_raise(F);
    let date = crate::calendar::pgtime::date_from_pg(biz_date, "biz_date").or_raise(F);
    let (fire, w) = window_by_date(&rules, date, &name).or_raise(F);
    TableIterator::once((fire.map(to_pg), to_pg(w.start), to_pg(w.end)))
}

/// The lock key of a run from its task's `lock_key` template (see src/locks/key.rs); NULL when the
/// task has none. A template stored around validation is used as a constant key: more
/// exclusion, never less.
#[pg_extern(immutable, parallel_safe, schema = "tide", name = "_lock_key")]
fn lock_key(
    template: Option<&str>,
    task: Option<&str>,
    args: Option<crate::base::jsonarg::JsonbText>,
    payload: Option<crate::base::jsonarg::JsonbText>,
    key: Option<&str>,
    biz_date: Option<&str>,
) -> Option<String> {
    let template = template.filter(|t| !t.trim().is_empty())?;
    let Ok(parsed) = crate::locks::key::Template::parse(template) else {
        return Some(template.to_string());
    };
    // Only the top-level fields are read, without parsing nested values: any payload works.
    let args = args.and_then(|a| crate::base::jsontext::top_level_fields(&a.0));
    let payload = payload.and_then(|p| crate::base::jsontext::top_level_fields(&p.0));
    Some(parsed.render(&crate::locks::key::RunFacts {
        task: task.unwrap_or(""),
        args: args.as_ref(),
        payload: payload.as_ref(),
        key,
        biz_date,
    }))
}

/// The most windows one backfill covers, and the most fires walked to find them.
const BACKFILL_MAX_WINDOWS: usize = 100_000;
const BACKFILL_MAX_FIRES: usize = 5_000_000;

/// The windows of the caller's task `task` whose business date lies in `[from_date, to_date]`
/// and that have ended, oldest first, with their fires (what `tide.backfill` plans). Locks the
/// task row (a change of its rules waits for the plan).
#[pg_extern(volatile, schema = "tide", name = "_backfill_windows")]
#[search_path(pg_catalog, pg_temp)]
fn backfill_windows(
    task: Option<&str>,
    from_date: Option<Date>,
    to_date: Option<Date>,
) -> TableIterator<
    'static,
    (
        name!(fire_at, TimestampWithTimeZone),
        name!(window_start, TimestampWithTimeZone),
        name!(window_end, TimestampWithTimeZone),
        name!(biz_date, Date),
    ),
> {
    const F: &str = "tide.backfill";
    let name = required(task, "task", F);
    let from =
        crate::calendar::pgtime::date_from_pg(required(from_date, "from_date", F), "from_date")
            .or_raise(F);
    let to = crate::calendar::pgtime::date_from_pg(required(to_date, "to_date", F), "to_date")
        .or_raise(F);
    if from > to {
        raise(
            TideError::OutOfRange {
                param: "to_date",
                value: format!("{to} (before from_date {from})"),
                expected: "on or after from_date",
            },
            F,
        );
    }
    if (to - from).num_days() >= 3660 {
        raise(
            TideError::OutOfRange {
                param: "to_date",
                value: format!(
                    "{to} ({} days after from_date {from})",
                    (to - from).num_days()
                ),
                expected:
                    "at most 3660 days after from_date (backfill longer ranges in several parts)",
            },
            F,
        );
    }
    let row = load_task(name, true).or_raise(F);
    let rules = row.rules.validate().or_raise(F);
    let schedule = rules.calendar(name).or_raise(F);
    let walked = crate::calendar::windows_between(
        schedule,
        rules.tz,
        rules.policy,
        rules.biz_window,
        from,
        to,
        now(),
        BACKFILL_MAX_WINDOWS,
        BACKFILL_MAX_FIRES,
        &mut || {
            pgrx::check_for_interrupts!();
        },
    );
    let windows = match walked {
        Ok(w) => w,
        Err(crate::calendar::RangeError::TooManyWindows) => raise(
            TideError::OutOfRange {
                param: "to_date",
                value: format!("{to} (from {from}: more than {BACKFILL_MAX_WINDOWS} windows)"),
                expected:
                    "a range of at most 100000 windows (backfill longer ranges in several parts)",
            },
            F,
        ),
        Err(crate::calendar::RangeError::TooManyFires) => raise(
            TideError::OutOfRange {
                param: "to_date",
                value: format!(
                    "{to} (from {from}: the schedule fires more than {BACKFILL_MAX_FIRES} times)"
                ),
                expected: "a shorter range for a schedule that fires this often",
            },
            F,
        ),
    };
    TableIterator::new(windows.into_iter().map(|(fire, w)| {
        (
            to_pg(fire),
            to_pg(w.start),
            to_pg(w.end),
            crate::calendar::pgtime::date_to_pg(w.biz_date),
        )
    }))
}

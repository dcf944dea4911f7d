//! The time engine's SQL face: `tide.next_fires` and `tide.preview`.

use pgrx::datum::{Date, Interval, Timestamp, TimestampWithTimeZone};
use pgrx::prelude::*;

use crate::base::error::TideError;
use crate::base::sqlerr::{raise, required, OrRaise};
use crate::calendar::pgtime::{date_to_pg, from_pg, local_to_pg, now, to_pg};
use crate::calendar::{
    fire_iter, parse_zone, to_local, window_for, DstGap, DstOverlap, DstPolicy, Schedule,
};
use crate::tasks::catalog::load_task_of;

/// The most fire times one call returns: enough for any preview, small enough to stay fast.
const MAX_FIRES: i32 = 10_000;

fn check_count(n: i32, function: &'static str) -> usize {
    if !(0..=MAX_FIRES).contains(&n) {
        raise(
            TideError::OutOfRange {
                param: "n",
                value: n.to_string(),
                expected: "between 0 and 10000",
            },
            function,
        );
    }
    usize::try_from(n).unwrap_or(0)
}

/// The next `n` fire instants of a cron expression in a time zone, strictly after `after`.
/// `dst_gap` and `dst_overlap` set the DST policy of fixed-time schedules (see docs/time.md).
#[pg_extern(stable, parallel_safe, schema = "tide")]
fn next_fires(
    schedule: Option<&str>,
    tz: default!(Option<&str>, "'UTC'"),
    after: default!(Option<TimestampWithTimeZone>, "now()"),
    n: default!(Option<i32>, 5),
    dst_gap: default!(Option<&str>, "'shift'"),
    dst_overlap: default!(Option<&str>, "'once'"),
) -> SetOfIterator<'static, TimestampWithTimeZone> {
    const F: &str = "tide.next_fires";
    let schedule = Schedule::parse(required(schedule, "schedule", F)).or_raise(F);
    let tz = parse_zone(required(tz, "tz", F)).or_raise(F);
    let policy = DstPolicy {
        gap: DstGap::parse(required(dst_gap, "dst_gap", F)).or_raise(F),
        overlap: DstOverlap::parse(required(dst_overlap, "dst_overlap", F)).or_raise(F),
    };
    let after = from_pg(required(after, "after", F), "after").or_raise(F);
    let n = check_count(required(n, "n", F), F);
    let fires: Vec<_> = fire_iter(&schedule, tz, policy, after)
        .take(n)
        .map(to_pg)
        .collect();
    SetOfIterator::new(fires)
}

/// The next `n` fires of a task after `after`: each fire in UTC and in the task's zone, the
/// business window it covers and its business date.
// pgrx reads the column names from `name!` inside the signature, so the tuple cannot be a
// type alias.
#[allow(clippy::type_complexity)]
#[pg_extern(stable, schema = "tide", name = "preview")]
#[search_path(pg_catalog, pg_temp)]
fn preview_of(
    task: Option<&str>,
    n: default!(Option<i32>, 5),
    after: default!(Option<TimestampWithTimeZone>, "NULL"),
    owner: default!(Option<&str>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(fire_at, TimestampWithTimeZone),
        name!(fire_local, Timestamp),
        name!(window_start, TimestampWithTimeZone),
        name!(window_end, TimestampWithTimeZone),
        name!(window_start_local, Timestamp),
        name!(window_end_local, Timestamp),
        name!(window_length, Interval),
        name!(biz_date, Date),
    ),
> {
    const F: &str = "tide.preview";
    let task = required(task, "task", F);
    let n = check_count(required(n, "n", F), F);
    let after = match after {
        Some(a) => from_pg(a, "after").or_raise(F),
        None => now(),
    };
    let row = load_task_of(task, owner, false).or_raise(F);
    let rules = row.rules.validate().or_raise(F);
    let tz = rules.tz;
    let schedule = rules.calendar(task).or_raise(F);
    let rows: Vec<_> = fire_iter(schedule, tz, rules.policy, after)
        .take(n)
        .filter_map(|fire| {
            let w = window_for(schedule, tz, rules.policy, rules.biz_window, fire)?;
            let length = (w.end - w.start).num_microseconds().unwrap_or(i64::MAX);
            Some((
                to_pg(fire),
                local_to_pg(to_local(tz, fire)),
                to_pg(w.start),
                to_pg(w.end),
                local_to_pg(to_local(tz, w.start)),
                local_to_pg(to_local(tz, w.end)),
                Interval::from_micros(length),
                date_to_pg(w.biz_date),
            ))
        })
        .collect();
    TableIterator::new(rows)
}

/// `tide.preview` as 0.2.0 to 0.2.3 declare it (without `owner`): kept, without SQL of its own,
/// so that their install scripts run against this library until `ALTER EXTENSION pg_tide
/// UPDATE` brings the new signature.
#[allow(clippy::type_complexity)]
#[pg_extern(sql = false)]
fn preview(
    task: Option<&str>,
    n: Option<i32>,
    after: Option<TimestampWithTimeZone>,
) -> TableIterator<
    'static,
    (
        name!(fire_at, TimestampWithTimeZone),
        name!(fire_local, Timestamp),
        name!(window_start, TimestampWithTimeZone),
        name!(window_end, TimestampWithTimeZone),
        name!(window_start_local, Timestamp),
        name!(window_end_local, Timestamp),
        name!(window_length, Interval),
        name!(biz_date, Date),
    ),
> {
    preview_of(task, n, after, None)
}

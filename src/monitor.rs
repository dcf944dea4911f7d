//! Calendar helpers of the monitoring SQL (`sql/monitor.sql`): how long a task's silence may
//! normally grow (the longest gap between its fires), and when a heartbeat check with a cron
//! schedule next expects a beat.

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::prelude::*;

use crate::calendar::{
    fire_iter, longest_gap, parse_zone, DstGap, DstOverlap, DstPolicy, Schedule,
};
use crate::pgtime::{from_pg, now, to_pg};
use crate::sqlerr::{required, OrRaise};

/// The longest time between two consecutive fires of a schedule (from now, a year ahead):
/// the base of a task's derived `max_silence`. NULL for a schedule that fires less than twice,
/// and for no schedule.
#[pg_extern(stable, parallel_safe, schema = "tide", name = "_fire_gap")]
fn fire_gap(
    schedule: Option<&str>,
    tz: Option<&str>,
    dst_gap: Option<&str>,
    dst_overlap: Option<&str>,
) -> Option<Interval> {
    const F: &str = "tide._fire_gap";
    // An event task without a schedule has no gaps between fires.
    let schedule = Schedule::parse(schedule.filter(|s| !s.trim().is_empty())?).or_raise(F);
    let tz = parse_zone(required(tz, "tz", F)).or_raise(F);
    let policy = DstPolicy {
        gap: DstGap::parse(dst_gap.unwrap_or("shift")).or_raise(F),
        overlap: DstOverlap::parse(dst_overlap.unwrap_or("once")).or_raise(F),
    };
    let gap = longest_gap(&schedule, tz, policy, now())?;
    Interval::new(0, 0, gap.num_microseconds().unwrap_or(i64::MAX)).ok()
}

/// The first fire of a cron schedule in time zone `tz` strictly after `after`: when a
/// heartbeat check with a schedule expects its next beat. Bad input is refused like
/// `tide.schedule` refuses it.
#[pg_extern(stable, parallel_safe, schema = "tide", name = "_next_fire")]
fn next_fire(
    schedule: Option<&str>,
    tz: Option<&str>,
    after: Option<TimestampWithTimeZone>,
) -> Option<TimestampWithTimeZone> {
    const F: &str = "tide.check";
    let schedule = Schedule::parse(required(schedule, "schedule", F)).or_raise(F);
    let tz = parse_zone(required(tz, "tz", F)).or_raise(F);
    let after = from_pg(required(after, "after", F), "after").or_raise(F);
    fire_iter(&schedule, tz, DstPolicy::default(), after)
        .next()
        .map(to_pg)
}

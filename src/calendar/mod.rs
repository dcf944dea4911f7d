//! The calendar: cron expressions, time zones, DST policy and business windows.
//!
//! Everything here but `pgtime.rs` (PostgreSQL's time types) is pure Rust (no pgrx), so the whole
//! time engine is exercised by plain `cargo test` in seconds. The SQL functions in
//! src/tasks/timeline.rs and src/tasks/catalog.rs are thin wrappers around it. `misfire.rs` decides what the scheduler does
//! with each due window.
//!
//! The model: a cron expression matches *wall-clock* times in the task's zone. Each matching
//! wall-clock time is resolved to zero, one or two instants (a spring-forward gap has none, a
//! fall-back overlap has two) by the task's [`DstPolicy`]. Instants are what is stored
//! (`timestamptz`); wall-clock times are only shown.

mod cron;
mod fires;
pub mod misfire;
pub(crate) mod pgtime;
mod window;
mod zone;

pub use cron::Schedule;
pub use fires::{fire_iter, gaps, next_fires, previous_fire, FireIter};
pub use window::{window_for, BizWindow, WindowKind};
pub use zone::{parse_zone, parse_zone_suggestion, to_local, zone_instant};

use chrono::{Datelike, NaiveDateTime};

use crate::base::error::TideError;

/// The years pg_tide computes calendars for. PostgreSQL's timestamps reach year 294276 and
/// chrono's 262143, but croner and the window arithmetic need room on both sides: every instant
/// a user passes in is checked against this range first (22008 outside it).
pub const FIRST_YEAR: i32 = 1;
pub const LAST_YEAR: i32 = 9999;

/// An SQL interval as PostgreSQL stores it: months, days and microseconds are kept apart
/// (a month is not a fixed number of days), so what the user wrote is stored unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub months: i32,
    pub days: i32,
    pub micros: i64,
}

impl Span {
    pub fn seconds(s: i64) -> Span {
        Span {
            months: 0,
            days: 0,
            micros: s * 1_000_000,
        }
    }

    /// Length in microseconds, counting a month as 30 days and a day as 24 hours, as
    /// PostgreSQL compares intervals.
    pub fn approx_micros(self) -> i128 {
        const DAY: i128 = 86_400_000_000;
        i128::from(self.months) * 30 * DAY + i128::from(self.days) * DAY + i128::from(self.micros)
    }

    pub fn describe(self) -> String {
        let mut parts = Vec::new();
        if self.months != 0 {
            parts.push(format!("{} mons", self.months));
        }
        if self.days != 0 {
            parts.push(format!("{} days", self.days));
        }
        if self.micros != 0 || parts.is_empty() {
            parts.push(format!("{} seconds", self.micros as f64 / 1e6));
        }
        parts.join(" ")
    }
}

/// Whether a wall-clock or UTC time lies in the calendar's range.
pub fn in_range(t: NaiveDateTime) -> bool {
    (FIRST_YEAR..=LAST_YEAR).contains(&t.year())
}

/// What to do with a fixed-time job whose wall-clock time does not exist (spring forward).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DstGap {
    /// Fire once, at the first instant after the gap (the default).
    Shift,
    /// Do not fire that day (pg_cron and Temporal behaviour).
    Skip,
}

/// What to do with a fixed-time job whose wall-clock time happens twice (fall back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DstOverlap {
    /// Fire once, at the earlier occurrence (the default).
    Once,
    /// Fire at both occurrences (pg_cron and Temporal behaviour).
    Both,
}

/// The DST policy of a task. It applies to *fixed-time* jobs only: an interval job (any `*`,
/// `/`, `,` or `-` in its second, minute or hour field) always skips wall-clock times that do
/// not exist and fires at every real instant whose wall clock matches, because its promise is
/// about elapsed time, not about one moment of the day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DstPolicy {
    pub gap: DstGap,
    pub overlap: DstOverlap,
}

impl Default for DstPolicy {
    fn default() -> Self {
        DstPolicy {
            gap: DstGap::Shift,
            overlap: DstOverlap::Once,
        }
    }
}

impl DstGap {
    pub fn parse(s: &str) -> Result<Self, TideError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "shift" => Ok(DstGap::Shift),
            "skip" => Ok(DstGap::Skip),
            _ => Err(TideError::UnknownOption {
                option: "dst_gap",
                value: s.to_string(),
                allowed: "'shift' (default) or 'skip'",
            }),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DstGap::Shift => "shift",
            DstGap::Skip => "skip",
        }
    }
}

impl DstOverlap {
    pub fn parse(s: &str) -> Result<Self, TideError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "once" => Ok(DstOverlap::Once),
            "both" => Ok(DstOverlap::Both),
            _ => Err(TideError::UnknownOption {
                option: "dst_overlap",
                value: s.to_string(),
                allowed: "'once' (default) or 'both'",
            }),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DstOverlap::Once => "once",
            DstOverlap::Both => "both",
        }
    }
}

#[cfg(test)]
mod tests;

/// Why [`windows_between`] gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeError {
    /// The range has more than the allowed number of windows.
    TooManyWindows,
    /// The schedule fires too often to walk the range (more fires than allowed).
    TooManyFires,
}

/// The windows of a schedule whose business date lies in `[from, to]` and that ended by
/// `ended_by`, oldest first, each with the fire that covers it (a period window reached by
/// several fires is kept once, with its first fire). At most `max_windows` windows and
/// `max_fires` fires walked; `every_1024` is called as the walk goes (to stay cancellable).
#[allow(clippy::too_many_arguments)]
pub fn windows_between(
    schedule: &Schedule,
    tz: chrono_tz::Tz,
    policy: DstPolicy,
    kind: WindowKind,
    from: chrono::NaiveDate,
    to: chrono::NaiveDate,
    ended_by: chrono::DateTime<chrono::Utc>,
    max_windows: usize,
    max_fires: usize,
    every_1024: &mut dyn FnMut(),
) -> Result<Vec<(chrono::DateTime<chrono::Utc>, BizWindow)>, RangeError> {
    let midnight = from.and_time(chrono::NaiveTime::MIN);
    let start = zone_instant(tz, midnight) - chrono::Duration::days(1);
    let mut previous = previous_fire(
        schedule,
        tz,
        policy,
        start + chrono::Duration::microseconds(1),
    );
    let mut out: Vec<(chrono::DateTime<chrono::Utc>, BizWindow)> = Vec::new();
    for (i, fire) in fire_iter(schedule, tz, policy, start).enumerate() {
        if i % 1024 == 0 {
            every_1024();
        }
        if i >= max_fires {
            return Err(RangeError::TooManyFires);
        }
        let window = match kind {
            WindowKind::Fire => previous.map(|s| BizWindow {
                start: s,
                end: fire,
                biz_date: to_local(tz, s).date(),
            }),
            period => window_for(schedule, tz, policy, period, fire),
        };
        previous = Some(fire);
        let Some(w) = window else { continue };
        if w.biz_date > to || w.end > ended_by {
            break;
        }
        if w.biz_date < from || out.last().is_some_and(|(_, last)| last.start >= w.start) {
            continue;
        }
        if out.len() == max_windows {
            return Err(RangeError::TooManyWindows);
        }
        out.push((fire, w));
    }
    Ok(out)
}

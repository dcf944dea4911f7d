//! Business windows: the span of business time a fire covers, and its business date.
//!
//! Windows are calendar computations in the task's zone, never fixed durations: a local day
//! is 23 or 25 hours on a DST day, and a month is 28 to 31 days long.

use chrono::{
    DateTime, Datelike, Duration, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, Timelike, Utc,
};
use chrono_tz::Tz;

use super::fires::previous_fire;
use super::zone::{gap_end, resolve, to_local};
use super::{DstPolicy, Schedule};
use crate::base::error::TideError;

/// Which span of business time each fire covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// From the previous fire to this one.
    Fire,
    /// The previous whole local hour before the fire.
    Hour,
    /// The previous whole local day (midnight to midnight).
    Day,
    /// The previous whole ISO week (Monday 00:00 to Monday 00:00).
    Week,
    /// The previous whole calendar month.
    Month,
}

impl WindowKind {
    pub fn parse(s: &str) -> Result<Self, TideError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fire" => Ok(WindowKind::Fire),
            "hour" => Ok(WindowKind::Hour),
            "day" => Ok(WindowKind::Day),
            "week" => Ok(WindowKind::Week),
            "month" => Ok(WindowKind::Month),
            _ => Err(TideError::UnknownOption {
                option: "biz_window",
                value: s.to_string(),
                allowed: "'fire' (default), 'hour', 'day', 'week' or 'month'",
            }),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WindowKind::Fire => "fire",
            WindowKind::Hour => "hour",
            WindowKind::Day => "day",
            WindowKind::Week => "week",
            WindowKind::Month => "month",
        }
    }
}

/// The business window `[start, end)` of one fire and its business date (the local date of
/// `start`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BizWindow {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub biz_date: NaiveDate,
}

/// The window covered by the fire at instant `fire`. `None` only for a `Fire` window of a
/// schedule that never fired in the 400 years before.
pub fn window_for(
    schedule: &Schedule,
    tz: Tz,
    policy: DstPolicy,
    kind: WindowKind,
    fire: DateTime<Utc>,
) -> Option<BizWindow> {
    let (start, end) = match kind {
        WindowKind::Fire => (previous_fire(schedule, tz, policy, fire)?, fire),
        period => {
            let end = period_start(tz, period, fire);
            let start = period_start(tz, period, end - Duration::microseconds(1));
            (start, end)
        }
    };
    Some(BizWindow {
        start,
        end,
        biz_date: to_local(tz, start).date(),
    })
}

/// The instant the local period (hour, day, week, month) containing `at` began.
fn period_start(tz: Tz, kind: WindowKind, at: DateTime<Utc>) -> DateTime<Utc> {
    let local = to_local(tz, at);
    let boundary = truncate(kind, local);
    match resolve(tz, boundary) {
        LocalResult::Single(t) => t,
        // A wall-clock hour that happens twice is two real hours: take the one `at` is in.
        // A day, week or month starts at the first of its midnights.
        LocalResult::Ambiguous(first, second) => {
            if kind == WindowKind::Hour && second <= at {
                second
            } else {
                first
            }
        }
        // The boundary was skipped by a spring-forward gap: the period starts when the gap ends.
        LocalResult::None => gap_end(tz, boundary),
    }
}

fn truncate(kind: WindowKind, local: NaiveDateTime) -> NaiveDateTime {
    let date = local.date();
    let midnight = |d: NaiveDate| d.and_time(NaiveTime::MIN);
    match kind {
        WindowKind::Hour => local
            .with_minute(0)
            .and_then(|t| t.with_second(0))
            .and_then(|t| t.with_nanosecond(0))
            .unwrap_or(local),
        WindowKind::Day | WindowKind::Fire => midnight(date),
        WindowKind::Week => {
            midnight(date - Duration::days(i64::from(date.weekday().num_days_from_monday())))
        }
        WindowKind::Month => midnight(date.with_day(1).unwrap_or(date)),
    }
}

//! Conversions between PostgreSQL's time types and chrono's.
//!
//! PostgreSQL counts microseconds (and days) from 2000-01-01; chrono counts from 1970.

use chrono::{DateTime, Duration, NaiveDate, NaiveDateTime, TimeZone, Utc};
use pgrx::datum::{Date, Timestamp, TimestampWithTimeZone};
use pgrx::pg_sys;

use crate::base::error::TideError;

fn pg_epoch() -> NaiveDateTime {
    NaiveDate::from_ymd_opt(2000, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .unwrap_or_default()
}

/// A `timestamptz` as a UTC instant. Infinities and instants outside the calendar's years
/// (`calendar::FIRST_YEAR` to `LAST_YEAR`) are refused with 22008, naming `param`.
pub fn from_pg(ts: TimestampWithTimeZone, param: &'static str) -> Result<DateTime<Utc>, TideError> {
    let out_of_range = |value: String| TideError::DateOutOfRange { param, value };
    if !ts.is_finite() {
        return Err(out_of_range(
            if ts.is_infinity() {
                "infinity"
            } else {
                "-infinity"
            }
            .to_string(),
        ));
    }
    let micros: pg_sys::TimestampTz = ts.into();
    pg_epoch()
        .checked_add_signed(Duration::microseconds(micros))
        .filter(|t| crate::calendar::in_range(*t))
        .map(|t| Utc.from_utc_datetime(&t))
        .ok_or_else(|| out_of_range(year_of(micros as f64 / 86_400_000_000.0)))
}

pub fn to_pg(t: DateTime<Utc>) -> TimestampWithTimeZone {
    let micros = (t.naive_utc() - pg_epoch())
        .num_microseconds()
        .unwrap_or(i64::MAX);
    TimestampWithTimeZone::try_from(micros)
        .unwrap_or_else(|_| TimestampWithTimeZone::positive_infinity())
}

pub fn local_to_pg(t: NaiveDateTime) -> Timestamp {
    let micros = (t - pg_epoch()).num_microseconds().unwrap_or(i64::MAX);
    Timestamp::try_from(micros).unwrap_or_else(|_| Timestamp::positive_infinity())
}

/// A `date` as a calendar date. Infinities and dates outside the calendar's years are refused
/// with 22008, naming `param`.
pub fn date_from_pg(d: Date, param: &'static str) -> Result<NaiveDate, TideError> {
    let out_of_range = |value: String| TideError::DateOutOfRange { param, value };
    if !d.is_finite() {
        return Err(out_of_range(
            if d.is_infinity() {
                "infinity"
            } else {
                "-infinity"
            }
            .to_string(),
        ));
    }
    let days = i64::from(d.to_pg_epoch_days());
    pg_epoch()
        .checked_add_signed(Duration::days(days))
        .filter(|t| crate::calendar::in_range(*t))
        .map(|t| t.date())
        .ok_or_else(|| out_of_range(year_of(days as f64)))
}

pub fn date_to_pg(d: NaiveDate) -> Date {
    let days = (d - pg_epoch().date()).num_days();
    i32::try_from(days)
        .ok()
        .and_then(|days| Date::try_from(days).ok())
        .unwrap_or_else(Date::positive_infinity)
}

/// "year N" for a time `days` days from 2000-01-01, for errors about times chrono cannot hold.
fn year_of(days: f64) -> String {
    let year = (2000.0 + days / 365.2425).floor() as i64;
    if year <= 0 {
        format!("year {} BC", 1 - year)
    } else {
        format!("year {year}")
    }
}

/// The start time of the current transaction, as `now()` returns it.
pub fn now() -> DateTime<Utc> {
    // SAFETY: reads a field of the current transaction's state; no preconditions.
    let micros = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    Utc.from_utc_datetime(&(pg_epoch() + Duration::microseconds(micros)))
}

/// An `interval` as the calendar's span (months, days, microseconds).
pub fn span_of(i: &pgrx::datum::Interval) -> crate::calendar::Span {
    crate::calendar::Span {
        months: i.months(),
        days: i.days(),
        micros: i.micros(),
    }
}

/// An interval's length in microseconds (a month as 30 days), saturating.
pub fn micros_of(i: &pgrx::datum::Interval) -> i64 {
    i64::try_from(span_of(i).approx_micros()).unwrap_or(i64::MAX)
}

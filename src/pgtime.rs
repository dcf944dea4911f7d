//! Conversions between PostgreSQL's time types and chrono's.
//!
//! PostgreSQL counts microseconds (and days) from 2000-01-01; chrono counts from 1970.

use chrono::{DateTime, Duration, NaiveDate, NaiveDateTime, TimeZone, Utc};
use pgrx::datum::{Date, Timestamp, TimestampWithTimeZone};
use pgrx::pg_sys;

use crate::error::TideError;

fn pg_epoch() -> NaiveDateTime {
    NaiveDate::from_ymd_opt(2000, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .unwrap_or_default()
}

/// A finite `timestamptz` as a UTC instant; infinity is refused, naming `param`.
pub fn from_pg(ts: TimestampWithTimeZone, param: &'static str) -> Result<DateTime<Utc>, TideError> {
    if !ts.is_finite() {
        return Err(TideError::OutOfRange {
            param,
            value: if ts.is_infinity() {
                "infinity"
            } else {
                "-infinity"
            }
            .to_string(),
            expected: "a finite timestamp",
        });
    }
    let micros: pg_sys::TimestampTz = ts.into();
    Ok(Utc.from_utc_datetime(&(pg_epoch() + Duration::microseconds(micros))))
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

/// A finite `date` as a calendar date; infinity is refused, naming `param`.
pub fn date_from_pg(d: Date, param: &'static str) -> Result<NaiveDate, TideError> {
    if !d.is_finite() {
        return Err(TideError::OutOfRange {
            param,
            value: "infinity".to_string(),
            expected: "a finite date",
        });
    }
    Ok(pg_epoch().date() + Duration::days(i64::from(d.to_pg_epoch_days())))
}

pub fn date_to_pg(d: NaiveDate) -> Date {
    let days = (d - pg_epoch().date()).num_days();
    i32::try_from(days)
        .ok()
        .and_then(|days| Date::try_from(days).ok())
        .unwrap_or_else(Date::positive_infinity)
}

/// The start time of the current transaction, as `now()` returns it.
pub fn now() -> DateTime<Utc> {
    // SAFETY: reads a field of the current transaction's state; no preconditions.
    let micros = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    Utc.from_utc_datetime(&(pg_epoch() + Duration::microseconds(micros)))
}

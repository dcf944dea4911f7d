//! Cron expressions: parsing (through `croner`) and classifying a job as fixed-time or interval.
//!
//! `croner` decides which wall-clock times match; this module only normalises the text, rejects
//! what our dialect does not have, and records whether the job is *fixed-time* (the DST policy
//! depends on it).

use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeZone, Utc};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

use crate::error::TideError;

/// A parsed cron expression.
#[derive(Debug, Clone)]
pub struct Schedule {
    text: String,
    cron: Cron,
    fixed_time: bool,
}

/// The longest cron expression accepted: far more than six fields of lists ever need.
pub const MAX_CRON_LEN: usize = 500;

/// `@macros` and the five-field expression each stands for.
const MACROS: &[(&str, &str)] = &[
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

impl Schedule {
    /// Parses a cron expression: five fields (minute hour day-of-month month day-of-week), or
    /// six with a leading seconds field, or one of the `@` macros.
    pub fn parse(expr: &str) -> Result<Schedule, TideError> {
        crate::error::check_len("schedule", expr, MAX_CRON_LEN)?;
        let bad = |reason: &str| TideError::BadCron {
            expr: expr.to_string(),
            reason: reason.to_string(),
        };
        let trimmed = expr.trim();
        if trimmed.is_empty() {
            return Err(bad("it is empty"));
        }
        let expanded = if trimmed.starts_with('@') {
            let lower = trimmed.to_ascii_lowercase();
            MACROS
                .iter()
                .find(|(name, _)| *name == lower)
                .map(|(_, five)| *five)
                .ok_or_else(|| {
                    bad("unknown macro; use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly")
                })?
        } else {
            trimmed
        };

        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let (second, minute, hour) = match fields.len() {
            5 => ("0", fields[0], fields[1]),
            6 => (fields[0], fields[1], fields[2]),
            n => {
                return Err(bad(&format!(
                    "it has {n} fields, expected 5 (minute hour day-of-month month day-of-week) or 6 (with a leading seconds field)"
                )))
            }
        };
        let single = |f: &str| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit());
        let fixed_time = single(second) && single(minute) && single(hour);

        let parser = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build();
        let cron = parser
            .parse(&fields.join(" "))
            .map_err(|e| bad(&croner_reason(&e)))?;

        let schedule = Schedule {
            text: trimmed.to_string(),
            cron,
            fixed_time,
        };
        if schedule.next_match(epoch(), false).is_none() {
            return Err(TideError::NeverFires(expr.to_string()));
        }
        Ok(schedule)
    }

    /// The expression as the user wrote it (trimmed).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// True when second, minute and hour are each a single value: one moment of the day.
    pub fn is_fixed_time(&self) -> bool {
        self.fixed_time
    }

    /// The next wall-clock time that matches, at or after (`inclusive`) or strictly after
    /// `local`. `None` when nothing matches before the year 5000.
    pub fn next_match(&self, local: NaiveDateTime, inclusive: bool) -> Option<NaiveDateTime> {
        // croner walks a zoned clock; UTC has no DST, so it walks the bare wall clock.
        let start: DateTime<Utc> = Utc.from_utc_datetime(&local);
        self.cron
            .find_next_occurrence(&start, inclusive)
            .ok()
            .map(|t| t.naive_utc())
    }
}

fn epoch() -> NaiveDateTime {
    NaiveDate::from_ymd_opt(1970, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .unwrap_or_default()
}

/// croner's messages, without its type prefixes, for an error users read.
fn croner_reason(e: &croner::errors::CronError) -> String {
    use croner::errors::CronError as E;
    match e {
        E::EmptyPattern => "it is empty".to_string(),
        E::InvalidPattern(m) | E::IllegalCharacters(m) | E::ComponentError(m) => m.clone(),
        other => other.to_string(),
    }
}

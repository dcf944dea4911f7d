//! Cron expressions: parsing (through `croner`) and classifying a job as fixed-time or interval.
//!
//! `croner` decides which wall-clock times match; this module only normalises the text, rejects
//! what our dialect does not have, and records whether the job is *fixed-time* (the DST policy
//! depends on it).

use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeZone, Utc};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

use crate::base::error::TideError;

/// A parsed cron expression, or pg_cron's `'N seconds'` interval.
#[derive(Debug, Clone)]
pub struct Schedule {
    text: String,
    kind: Kind,
    fixed_time: bool,
}

#[derive(Debug, Clone)]
enum Kind {
    Cron(Box<Cron>),
    /// pg_cron's `'N seconds'` (1 to 59): every N seconds of the wall clock, counted from the
    /// epoch so the windows do not depend on when the task was created.
    EverySeconds(i64),
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
    /// six with a leading seconds field, or one of the `@` macros; `$` in the day-of-month
    /// field is the last day of the month, and `'N seconds'` (1 to 59) runs every N seconds,
    /// as in pg_cron.
    pub fn parse(expr: &str) -> Result<Schedule, TideError> {
        crate::base::error::check_len("schedule", expr, MAX_CRON_LEN)?;
        let bad = |reason: &str| TideError::BadCron {
            expr: expr.to_string(),
            reason: reason.to_string(),
        };
        let trimmed = expr.trim();
        if trimmed.is_empty() {
            return Err(bad("it is empty"));
        }
        if let Some(n) = seconds_interval(trimmed) {
            if !(1..=59).contains(&n) {
                return Err(TideError::BadSecondsInterval(expr.to_string()));
            }
            return Ok(Schedule {
                text: trimmed.to_string(),
                kind: Kind::EverySeconds(n),
                fixed_time: false,
            });
        }
        let expanded = if trimmed.starts_with('@') {
            let lower = trimmed.to_ascii_lowercase();
            if lower == "@reboot" {
                return Err(TideError::Reboot(expr.to_string()));
            }
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

        let mut fields: Vec<&str> = expanded.split_whitespace().collect();
        let (second, minute, hour) = match fields.len() {
            5 => ("0", fields[0], fields[1]),
            6 => (fields[0], fields[1], fields[2]),
            n => {
                return Err(bad(&format!(
                    "it has {n} fields, expected 5 (minute hour day-of-month month day-of-week) or 6 (with a leading seconds field)"
                )))
            }
        };
        // pg_cron's `$` (last day of the month) is croner's `L`.
        let dom = fields.len() - 3;
        if fields[dom] == "$" {
            fields[dom] = "L";
        }
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
            kind: Kind::Cron(Box::new(cron)),
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
        match &self.kind {
            Kind::Cron(cron) => {
                // croner walks a zoned clock; UTC has no DST, so it walks the bare wall clock.
                let start: DateTime<Utc> = Utc.from_utc_datetime(&local);
                cron.find_next_occurrence(&start, inclusive)
                    .ok()
                    .map(|t| t.naive_utc())
            }
            Kind::EverySeconds(n) => {
                // Whole seconds: a fraction rounds up to the next second.
                let secs = local.and_utc().timestamp();
                let frac = local.and_utc().timestamp_subsec_nanos() > 0;
                let from = if frac { secs + 1 } else { secs };
                let aligned = from.div_euclid(*n) * n;
                let next = if aligned == from && (inclusive || frac) {
                    from
                } else {
                    aligned + n
                };
                DateTime::from_timestamp(next, 0).map(|t| t.naive_utc())
            }
        }
    }
}

/// `N second(s)` in any case and spacing, as pg_cron accepts it; None for anything else.
fn seconds_interval(text: &str) -> Option<i64> {
    let digits: String = text.chars().take_while(|c| c.is_ascii_digit()).collect();
    if digits.is_empty() {
        return None;
    }
    let unit = text[digits.len()..].trim().to_ascii_lowercase();
    if unit != "second" && unit != "seconds" {
        return None;
    }
    Some(digits.parse::<i64>().unwrap_or(i64::MAX))
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

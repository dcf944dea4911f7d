//! Task rules: the validated, canonical form of what `tide.schedule` and `tide.alter` accept.
//!
//! Validation is pure so that every refusal (and its message and hint) is unit-tested; the
//! catalog only stores what this module accepted.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use crate::base::error::{check_len, TideError, MAX_NAME_LEN};
use crate::calendar::parse_zone;
pub use crate::calendar::Span;
use crate::calendar::{next_fires, DstGap, DstOverlap, DstPolicy, Schedule, WindowKind};

/// The rules of a task, as the user gives them (text), before validation.
#[derive(Debug, Clone, Default)]
pub struct RuleText {
    pub schedule: String,
    /// `None` or blank: no command (external workers run the task).
    pub command: Option<String>,
    pub tz: String,
    pub biz_window: String,
    pub queue: String,
    /// The JSON text of the args (as `jsonb_out` prints it); checked by `validate`.
    pub args: String,
    pub dst_gap: String,
    pub dst_overlap: String,
}

/// Validated rules, with the canonical spellings to store.
#[derive(Debug, Clone)]
pub struct TaskRules {
    /// `None`: an event task without a schedule (it runs only on `tide.emit`).
    pub schedule: Option<Schedule>,
    pub command: Option<String>,
    pub tz: Tz,
    pub biz_window: WindowKind,
    pub queue: String,
    pub args: String,
    pub policy: DstPolicy,
}

/// A change to some rules: `None` leaves a rule as it is.
#[derive(Debug, Clone, Default)]
pub struct RuleChanges {
    pub schedule: Option<String>,
    /// `Some("")` removes the command.
    pub command: Option<String>,
    pub tz: Option<String>,
    pub biz_window: Option<String>,
    pub queue: Option<String>,
    pub args: Option<String>,
    pub dst_gap: Option<String>,
    pub dst_overlap: Option<String>,
}

/// Checks a task name: not blank, not absurdly long.
pub fn check_name(name: &str) -> Result<(), TideError> {
    check_len("name", name, MAX_NAME_LEN)?;
    if name.trim().is_empty() {
        return Err(TideError::EmptyName);
    }
    Ok(())
}

/// The longest command accepted (1 MB of SQL).
pub const MAX_COMMAND_LEN: usize = 1_048_576;
/// The longest readiness check accepted.
pub const MAX_CHECK_LEN: usize = 65_536;

/// The overlap policies of a task's scheduled runs.
pub fn parse_overlap(s: &str) -> Result<&'static str, TideError> {
    match s.trim().to_ascii_lowercase().as_str() {
        "queue" => Ok("queue"),
        "skip" => Ok("skip"),
        "allow" => Ok("allow"),
        _ => Err(TideError::UnknownOption {
            option: "overlap",
            value: s.to_string(),
            allowed: "'queue' (default: a window waits for the previous one), 'skip' or 'allow'",
        }),
    }
}

/// A topic name: 1 to 100 letters, digits, '_', '-', '.' or ':'.
pub fn check_topic(topic: &str) -> Result<(), TideError> {
    let ok = (1..=100).contains(&topic.len())
        && topic
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    if ok {
        Ok(())
    } else {
        Err(TideError::BadTopic(topic.to_string()))
    }
}

/// The topics a task subscribes to, deduplicated and sorted.
pub fn check_topics(topics: &[String]) -> Result<Vec<String>, TideError> {
    let mut out: Vec<String> = Vec::with_capacity(topics.len());
    for t in topics {
        check_topic(t)?;
        out.push(t.clone());
    }
    out.sort();
    out.dedup();
    if out.len() > 50 {
        return Err(TideError::OutOfRange {
            param: "topics",
            value: format!("{} topics", out.len()),
            expected: "at most 50 topics",
        });
    }
    Ok(out)
}

fn check_queue(queue: &str) -> Result<(), TideError> {
    check_len("queue", queue, 63)?;
    let ok = (1..=63).contains(&queue.len())
        && queue
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !ok {
        return Err(TideError::BadQueue(queue.to_string()));
    }
    if queue.to_ascii_lowercase().starts_with("backfill.") {
        return Err(TideError::OutOfRange {
            param: "queue",
            value: queue.to_string(),
            expected: "a name not starting with 'backfill.' (those queues belong to backfills)",
        });
    }
    Ok(())
}

impl RuleText {
    /// Validates every rule; the first problem found is returned.
    pub fn validate(&self) -> Result<TaskRules, TideError> {
        let schedule = if self.schedule.trim().is_empty() {
            None
        } else {
            Some(Schedule::parse(&self.schedule)?)
        };
        let tz = parse_zone(&self.tz)?;
        let biz_window = WindowKind::parse(&self.biz_window)?;
        let policy = DstPolicy {
            gap: DstGap::parse(&self.dst_gap)?,
            overlap: DstOverlap::parse(&self.dst_overlap)?,
        };
        check_queue(&self.queue)?;
        crate::base::jsontext::check_object(&self.args, "args")?;
        if let Some(c) = &self.command {
            check_len("command", c, MAX_COMMAND_LEN)?;
        }
        let command = self
            .command
            .as_deref()
            .filter(|c| !c.trim().is_empty())
            .map(str::to_string);
        Ok(TaskRules {
            schedule,
            command,
            tz,
            biz_window,
            queue: self.queue.clone(),
            args: self.args.clone(),
            policy,
        })
    }

    /// These rules with `changes` applied.
    pub fn with(&self, changes: RuleChanges) -> RuleText {
        RuleText {
            schedule: changes.schedule.unwrap_or_else(|| self.schedule.clone()),
            command: match changes.command {
                Some(c) => Some(c),
                None => self.command.clone(),
            },
            tz: changes.tz.unwrap_or_else(|| self.tz.clone()),
            biz_window: changes
                .biz_window
                .unwrap_or_else(|| self.biz_window.clone()),
            queue: changes.queue.unwrap_or_else(|| self.queue.clone()),
            args: changes.args.unwrap_or_else(|| self.args.clone()),
            dst_gap: changes.dst_gap.unwrap_or_else(|| self.dst_gap.clone()),
            dst_overlap: changes
                .dst_overlap
                .unwrap_or_else(|| self.dst_overlap.clone()),
        }
    }
}

impl TaskRules {
    /// The first fire strictly after `after`.
    pub fn next_fire(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        next_fires(self.schedule.as_ref()?, self.tz, self.policy, after, 1)
            .into_iter()
            .next()
    }

    /// The schedule, for what needs windows; an event task without one is refused.
    pub fn calendar(&self, task: &str) -> Result<&Schedule, TideError> {
        self.schedule
            .as_ref()
            .ok_or_else(|| TideError::NoSchedule(task.to_string()))
    }

    /// The schedule as stored: NULL for an event task without one.
    pub fn schedule_text(&self) -> Option<String> {
        self.schedule.as_ref().map(|s| s.text().to_string())
    }
}

/// How a still-unready run is handled at its readiness deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReadyPolicy {
    NextWindow,
    Skip,
    Fail,
}

impl NotReadyPolicy {
    pub fn parse(s: &str) -> Result<Self, TideError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "next_window" => Ok(NotReadyPolicy::NextWindow),
            "skip" => Ok(NotReadyPolicy::Skip),
            "fail" => Ok(NotReadyPolicy::Fail),
            _ => Err(TideError::UnknownOption {
                option: "not_ready_policy",
                value: s.to_string(),
                allowed: "'next_window' (default), 'skip' or 'fail'",
            }),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NotReadyPolicy::NextWindow => "next_window",
            NotReadyPolicy::Skip => "skip",
            NotReadyPolicy::Fail => "fail",
        }
    }
}

/// Execution options of a task: how runs are leased, retried, caught up and released.
/// `None` means "not given" (tide.alter leaves the option as it is). Text options are stored
/// in their canonical spelling; `Some("")` for ready_dataset/ready_check removes them.
#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    pub timeout: Option<Span>,
    pub lease: Option<Span>,
    pub priority: Option<i32>,
    pub max_attempts: Option<i32>,
    pub backoff_base: Option<Span>,
    pub backoff_factor: Option<f64>,
    pub backoff_cap: Option<Span>,
    pub jitter: Option<String>,
    pub misfire: Option<String>,
    pub misfire_threshold: Option<Span>,
    pub catch_up_max: Option<i32>,
    pub source_retention: Option<Span>,
    pub ready_dataset: Option<String>,
    pub ready_check: Option<String>,
    pub ready_timeout: Option<Span>,
    pub recheck_interval: Option<Span>,
    pub not_ready_policy: Option<String>,
    pub overlap: Option<String>,
    pub max_concurrency: Option<i32>,
    pub lock_key: Option<String>,
    pub topics: Option<Vec<String>>,
    pub long: Option<bool>,
    pub top_level: Option<bool>,
    pub batch_rate: Option<f64>,
    pub batch_pause: Option<Span>,
    /// SQLSTATEs or classes mapped to error kinds, as JSON text ('{}' removes them).
    pub error_kinds: Option<String>,
    /// An SQL expression whose value must stay unchanged for `watermark_stable_for` before a
    /// run is ready ('' removes it).
    pub ready_watermark: Option<String>,
    pub watermark_stable_for: Option<Span>,
    /// An event task's low-frequency scan for events that were never emitted ('' removes it).
    pub fallback: Option<String>,
    /// Each fire first reopens the previous window's run if it ended dead not ready or out of
    /// transient retries, once (R11.2, deferred window scan).
    pub rescan_previous: Option<bool>,
    /// The database the command runs in (`Some("")`: pg_tide's own); checked against the
    /// catalog by `tide._check_task`.
    pub database: Option<String>,
}

/// The most attempts a task may allow: retries are always bounded (R6.1, R14).
pub const MAX_ATTEMPTS: i32 = 100;
/// The most missed windows one outage may catch up.
pub const MAX_CATCH_UP: i32 = 10_000;

/// Each interval option's bounds: its name, the shortest interval it accepts in microseconds,
/// the longest in days, and what an error says it must be. The minima keep a typo ('1 ms' for
/// '1 s') from turning into a retry storm or a busy loop; the maxima keep every instant
/// pg_tide computes from them (`now() + timeout`, `fire - retention`) far inside PostgreSQL's
/// and chrono's ranges, so no arithmetic can overflow at run time.
const INTERVAL_BOUNDS: &[(&str, i64, i64, &str)] = &[
    // A timeout arms a timer counted in milliseconds in an int: at most 24.8 days. 0 is no
    // timeout of pg_tide's (as statement_timeout = 0): the owner's own statement_timeout applies.
    (
        "timeout",
        MS_100,
        7,
        "an interval of 100 milliseconds to 7 days, or 0 for none",
    ),
    ("lease", SECOND, 30, "an interval of 1 second to 30 days"),
    // A role's limit (tide.set_role_limits): the shortest time between two fires of its tasks.
    (
        "fastest_schedule",
        SECOND,
        31,
        "an interval of 1 second to 31 days",
    ),
    (
        "backoff_base",
        MS_100,
        30,
        "an interval of 100 milliseconds to 30 days",
    ),
    (
        "backoff_cap",
        MS_100,
        30,
        "an interval of 100 milliseconds to 30 days",
    ),
    (
        "recheck_interval",
        SECOND,
        31,
        "an interval of 1 second to 31 days",
    ),
    ("batch_pause", 0, 1, "an interval of 0 to 1 day"),
    (
        "watermark_stable_for",
        SECOND,
        7,
        "an interval of 1 second to 7 days (0: no watermark)",
    ),
    (
        "misfire_threshold",
        SECOND,
        366,
        "an interval of 1 second to 366 days",
    ),
    (
        "ready_timeout",
        SECOND,
        366,
        "an interval of 1 second to 366 days",
    ),
    ("grace", SECOND, 366, "an interval of 1 second to 366 days"),
    (
        "start_deadline",
        SECOND,
        31,
        "an interval of 1 second to 31 days",
    ),
    (
        "max_silence",
        SECOND,
        3660,
        "an interval of 1 second to 3660 days (10 years)",
    ),
    (
        "period",
        SECOND,
        3660,
        "an interval of 1 second to 3660 days (10 years)",
    ),
    (
        "source_retention",
        SECOND,
        36_525,
        "an interval of 1 second to 36525 days (100 years)",
    ),
];
const SECOND: i64 = 1_000_000;
const MS_100: i64 = 100_000;

/// The bounds of an interval option (see `INTERVAL_BOUNDS`); `None` for no such option.
fn bounds_of(param: &str) -> Option<&'static (&'static str, i64, i64, &'static str)> {
    INTERVAL_BOUNDS
        .iter()
        .find(|(name, _, _, _)| *name == param)
}

/// The name of an interval option with documented bounds, as a static string for errors.
pub fn interval_option(param: &str) -> Option<&'static str> {
    bounds_of(param).map(|(name, _, _, _)| *name)
}

/// Checks an interval option: one sign throughout (PostgreSQL keeps months, days and time
/// apart, so '-1 month 31 days' is neither positive nor negative), within its bounds.
/// `zero_ok` allows exactly zero (a pause of nothing).
pub fn check_interval(param: &'static str, span: Span, zero_ok: bool) -> Result<(), TideError> {
    let parts = [
        i128::from(span.months),
        i128::from(span.days),
        i128::from(span.micros),
    ];
    if parts.iter().any(|p| *p > 0) && parts.iter().any(|p| *p < 0) {
        return Err(TideError::OutOfRange {
            param,
            value: span.describe(),
            expected: "an interval whose months, days and time have one sign (such as '1 month 2 days', not '-1 month 31 days')",
        });
    }
    let micros = span.approx_micros();
    let bounds = bounds_of(param);
    let max = bounds.map_or(i128::MAX, |(_, _, days, _)| {
        i128::from(*days) * 86_400_000_000
    });
    let min = bounds.map_or(0, |(_, min, _, _)| i128::from(*min));
    let too_short = if micros == 0 { !zero_ok } else { micros < min };
    if micros > max || micros < 0 || too_short {
        return Err(TideError::OutOfRange {
            param,
            value: span.describe(),
            expected: bounds.map_or("a positive interval", |(_, _, _, text)| *text),
        });
    }
    Ok(())
}

fn positive(param: &'static str, span: Option<Span>) -> Result<(), TideError> {
    span.map_or(Ok(()), |s| check_interval(param, s, false))
}

fn within(
    param: &'static str,
    v: Option<i32>,
    lo: i32,
    hi: i32,
    expected: &'static str,
) -> Result<(), TideError> {
    match v {
        Some(v) if v < lo || v > hi => Err(TideError::OutOfRange {
            param,
            value: v.to_string(),
            expected,
        }),
        _ => Ok(()),
    }
}

impl ExecOptions {
    /// Checks every option given and returns them in canonical spelling.
    pub fn validate(mut self) -> Result<ExecOptions, TideError> {
        if let Some(t) = self.timeout {
            check_interval("timeout", t, true)?;
        }
        positive("lease", self.lease)?;
        positive("backoff_base", self.backoff_base)?;
        positive("backoff_cap", self.backoff_cap)?;
        positive("misfire_threshold", self.misfire_threshold)?;
        positive("source_retention", self.source_retention)?;
        positive("ready_timeout", self.ready_timeout)?;
        positive("recheck_interval", self.recheck_interval)?;
        within(
            "max_attempts",
            self.max_attempts,
            1,
            MAX_ATTEMPTS,
            "between 1 and 100",
        )?;
        within(
            "catch_up_max",
            self.catch_up_max,
            0,
            MAX_CATCH_UP,
            "between 0 and 10000",
        )?;
        within(
            "priority",
            self.priority,
            -1000,
            1000,
            "between -1000 and 1000",
        )?;
        if let Some(f) = self.backoff_factor {
            if !(1.0..=100.0).contains(&f) {
                return Err(TideError::OutOfRange {
                    param: "backoff_factor",
                    value: f.to_string(),
                    expected: "between 1 and 100",
                });
            }
        }
        if let Some(j) = &self.jitter {
            self.jitter = Some(crate::tasks::retry::Jitter::parse(j)?.as_str().to_string());
        }
        if let Some(m) = &self.misfire {
            self.misfire = Some(
                crate::calendar::misfire::Misfire::parse(m)?
                    .as_str()
                    .to_string(),
            );
        }
        if let Some(p) = &self.not_ready_policy {
            self.not_ready_policy = Some(NotReadyPolicy::parse(p)?.as_str().to_string());
        }
        if let Some(o) = &self.overlap {
            self.overlap = Some(parse_overlap(o)?.to_string());
        }
        within(
            "max_concurrency",
            self.max_concurrency,
            0,
            10_000,
            "between 1 and 10000 (0: no limit)",
        )?;
        if let Some(k) = &self.lock_key {
            // '' removes the lock key (tide.alter); anything else must be a valid template.
            if !k.trim().is_empty() {
                crate::locks::key::Template::parse(k)?;
            }
        }
        if let Some(topics) = &self.topics {
            self.topics = Some(check_topics(topics)?);
        }
        if let Some(r) = self.batch_rate {
            if !(0.0..=10_000.0).contains(&r) {
                return Err(TideError::OutOfRange {
                    param: "batch_rate",
                    value: r.to_string(),
                    expected: "between 0 and 10000 batches per second (0: no limit)",
                });
            }
        }
        if let Some(p) = self.batch_pause {
            check_interval("batch_pause", p, true)?;
        }
        if let Some(f) = &self.fallback {
            check_len("fallback", f, MAX_CHECK_LEN)?;
        }
        if let Some(w) = &self.ready_watermark {
            check_len("ready_watermark", w, MAX_CHECK_LEN)?;
        }
        if let Some(p) = self.watermark_stable_for {
            check_interval("watermark_stable_for", p, true)?;
        }
        if let Some(k) = &self.error_kinds {
            self.error_kinds = Some(crate::tasks::retry::parse_error_kinds(k)?);
        }
        if let Some(d) = &self.ready_dataset {
            check_len("ready_dataset", d, MAX_NAME_LEN)?;
        }
        if let Some(c) = &self.ready_check {
            check_len("ready_check", c, MAX_CHECK_LEN)?;
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> RuleText {
        RuleText {
            schedule: "0 1 * * *".into(),
            command: None,
            tz: "UTC".into(),
            biz_window: "fire".into(),
            queue: "default".into(),
            args: "{}".into(),
            dst_gap: "shift".into(),
            dst_overlap: "once".into(),
        }
    }

    #[test]
    fn defaults_are_valid_and_canonical() {
        let text = RuleText {
            tz: "asia/shanghai".into(),
            biz_window: "DAY".into(),
            ..defaults()
        };
        let rules = text.validate().unwrap();
        assert_eq!(rules.tz.name(), "Asia/Shanghai");
        assert_eq!(rules.biz_window, WindowKind::Day);
        assert_eq!(rules.command, None);
    }

    #[test]
    fn each_bad_rule_is_named() {
        let cases: Vec<(RuleText, &str)> = vec![
            (
                RuleText {
                    schedule: "0 0 30 2 *".into(),
                    ..defaults()
                },
                "never fires",
            ),
            (
                RuleText {
                    schedule: "99 * * * *".into(),
                    ..defaults()
                },
                "\"99 * * * *\"",
            ),
            (
                RuleText {
                    tz: "Asia/Shangai".into(),
                    ..defaults()
                },
                "\"Asia/Shangai\"",
            ),
            (
                RuleText {
                    biz_window: "fortnight".into(),
                    ..defaults()
                },
                "\"fortnight\"",
            ),
            (
                RuleText {
                    dst_gap: "later".into(),
                    ..defaults()
                },
                "\"later\"",
            ),
            (
                RuleText {
                    dst_overlap: "twice".into(),
                    ..defaults()
                },
                "\"twice\"",
            ),
            (
                RuleText {
                    queue: "".into(),
                    ..defaults()
                },
                "queue name \"\"",
            ),
            (
                RuleText {
                    queue: "has space".into(),
                    ..defaults()
                },
                "\"has space\"",
            ),
            (
                RuleText {
                    args: "[1, 2]".into(),
                    ..defaults()
                },
                "[1, 2]",
            ),
        ];
        for (text, needle) in cases {
            let err = text.validate().unwrap_err();
            assert!(
                err.to_string().contains(needle),
                "{err} should contain {needle}"
            );
            assert!(!err.hint().is_empty());
        }
    }

    #[test]
    fn names() {
        assert_eq!(check_name(""), Err(TideError::EmptyName));
        assert_eq!(check_name("  \t"), Err(TideError::EmptyName));
        assert!(check_name("daily_bill").is_ok());
        assert_eq!(
            check_name(&"x".repeat(100_000)).unwrap_err().to_string(),
            "name is too long (100000 characters, at most 200)"
        );
        assert_eq!(check_name("\t\n "), Err(TideError::EmptyName));
    }

    #[test]
    fn exec_options_are_bounded() {
        let ok = ExecOptions {
            timeout: Some(Span::seconds(30)),
            max_attempts: Some(3),
            jitter: Some("EQUAL".into()),
            misfire: Some("Coalesce".into()),
            ..Default::default()
        }
        .validate()
        .unwrap();
        assert_eq!(ok.jitter.as_deref(), Some("equal"));
        assert_eq!(ok.misfire.as_deref(), Some("coalesce"));
        let month = Span {
            months: 1,
            days: 0,
            micros: 0,
        };
        assert!(ExecOptions {
            source_retention: Some(month),
            ..Default::default()
        }
        .validate()
        .is_ok());
        // No timeout of pg_tide's: 0, as statement_timeout = 0.
        assert!(ExecOptions {
            timeout: Some(Span::seconds(0)),
            ..Default::default()
        }
        .validate()
        .is_ok());

        let bad: Vec<(ExecOptions, &str)> = vec![
            (
                ExecOptions {
                    timeout: Some(Span {
                        months: 0,
                        days: 0,
                        micros: 50_000,
                    }),
                    ..Default::default()
                },
                "timeout must be an interval of 100 milliseconds to 7 days, or 0 for none, got 0.05 seconds",
            ),
            (
                ExecOptions {
                    backoff_base: Some(Span::seconds(-10)),
                    ..Default::default()
                },
                "backoff_base must be an interval of 100 milliseconds to 30 days, got -10 seconds",
            ),
            (
                ExecOptions {
                    timeout: Some(Span {
                        months: 178_000_000 * 12,
                        days: 0,
                        micros: 0,
                    }),
                    ..Default::default()
                },
                "timeout must be an interval of 100 milliseconds to 7 days, or 0 for none, got 2136000000 mons",
            ),
            (
                ExecOptions {
                    source_retention: Some(Span {
                        months: 0,
                        days: 36_526,
                        micros: 0,
                    }),
                    ..Default::default()
                },
                "source_retention must be an interval of 1 second to 36525 days (100 years), got 36526 days",
            ),
            (
                ExecOptions {
                    backoff_base: Some(Span {
                        months: -1,
                        days: 31,
                        micros: 0,
                    }),
                    ..Default::default()
                },
                "backoff_base must be an interval whose months, days and time have one sign (such as '1 month 2 days', not '-1 month 31 days'), got -1 mons 31 days",
            ),
            (
                ExecOptions {
                    batch_pause: Some(Span::seconds(86_401)),
                    ..Default::default()
                },
                "batch_pause must be an interval of 0 to 1 day, got 86401 seconds",
            ),
            (
                ExecOptions {
                    ready_check: Some("x".repeat(MAX_CHECK_LEN + 1)),
                    ..Default::default()
                },
                "ready_check is too long (65537 characters, at most 65536)",
            ),
            (
                ExecOptions {
                    lease: Some(Span {
                        months: 0,
                        days: 1,
                        micros: -86_400_000_000,
                    }),
                    ..Default::default()
                },
                "lease must be an interval whose months, days and time have one sign (such as '1 month 2 days', not '-1 month 31 days'), got 1 days -86400 seconds",
            ),
            (
                ExecOptions {
                    max_attempts: Some(0),
                    ..Default::default()
                },
                "max_attempts must be between 1 and 100, got 0",
            ),
            (
                ExecOptions {
                    max_attempts: Some(1_000_000),
                    ..Default::default()
                },
                "max_attempts must be between 1 and 100, got 1000000",
            ),
            (
                ExecOptions {
                    backoff_factor: Some(0.5),
                    ..Default::default()
                },
                "backoff_factor must be between 1 and 100, got 0.5",
            ),
            (
                ExecOptions {
                    backoff_factor: Some(f64::NAN),
                    ..Default::default()
                },
                "backoff_factor must be between 1 and 100, got NaN",
            ),
            (
                ExecOptions {
                    catch_up_max: Some(-1),
                    ..Default::default()
                },
                "catch_up_max must be between 0 and 10000, got -1",
            ),
            (
                ExecOptions {
                    jitter: Some("random".into()),
                    ..Default::default()
                },
                "unknown jitter \"random\"",
            ),
            (
                ExecOptions {
                    misfire: Some("catchup".into()),
                    ..Default::default()
                },
                "unknown misfire policy \"catchup\"",
            ),
            (
                ExecOptions {
                    not_ready_policy: Some("wait".into()),
                    ..Default::default()
                },
                "unknown not_ready_policy \"wait\"",
            ),
        ];
        for (opts, want) in bad {
            let err = opts.validate().unwrap_err();
            assert_eq!(err.to_string(), want);
            assert!(!err.hint().is_empty());
        }
    }

    #[test]
    fn changes_touch_only_what_is_given() {
        let base = RuleText {
            command: Some("SELECT 1".into()),
            ..defaults()
        };
        let changed = base.with(RuleChanges {
            tz: Some("Europe/London".into()),
            ..Default::default()
        });
        assert_eq!(changed.tz, "Europe/London");
        assert_eq!(changed.schedule, base.schedule);
        assert_eq!(changed.command.as_deref(), Some("SELECT 1"));
        // A blank command removes it.
        let cleared = base.with(RuleChanges {
            command: Some(String::new()),
            ..Default::default()
        });
        assert_eq!(cleared.validate().unwrap().command, None);
    }

    #[test]
    fn guarantee_options_are_checked_and_canonical() {
        let ok = ExecOptions {
            overlap: Some(" Skip ".into()),
            topics: Some(vec!["b.x".into(), "a:y".into(), "b.x".into()]),
            lock_key: Some("account:{args.id}".into()),
            max_concurrency: Some(0),
            batch_rate: Some(0.5),
            batch_pause: Some(Span::seconds(0)),
            ..Default::default()
        }
        .validate()
        .unwrap();
        assert_eq!(ok.overlap.as_deref(), Some("skip"));
        assert_eq!(ok.topics, Some(vec!["a:y".to_string(), "b.x".to_string()]));
        let cases: Vec<(ExecOptions, &str)> = vec![
            (
                ExecOptions {
                    overlap: Some("sometimes".into()),
                    ..Default::default()
                },
                "unknown overlap \"sometimes\"",
            ),
            (
                ExecOptions {
                    topics: Some(vec!["ok".into(), "not ok".into()]),
                    ..Default::default()
                },
                "topic \"not ok\" is not valid",
            ),
            (
                ExecOptions {
                    topics: Some(vec![String::new()]),
                    ..Default::default()
                },
                "topic \"\" is not valid",
            ),
            (
                ExecOptions {
                    topics: Some((0..51).map(|i| format!("t{i}")).collect()),
                    ..Default::default()
                },
                "topics must be at most 50 topics, got 51 topics",
            ),
            (
                ExecOptions {
                    lock_key: Some("acct:{nope}".into()),
                    ..Default::default()
                },
                "unknown placeholder {nope}",
            ),
            (
                ExecOptions {
                    max_concurrency: Some(-1),
                    ..Default::default()
                },
                "max_concurrency must be between 1 and 10000 (0: no limit), got -1",
            ),
            (
                ExecOptions {
                    batch_rate: Some(-2.0),
                    ..Default::default()
                },
                "batch_rate must be between 0 and 10000",
            ),
            (
                ExecOptions {
                    batch_rate: Some(f64::NAN),
                    ..Default::default()
                },
                "batch_rate must be between 0 and 10000",
            ),
            (
                ExecOptions {
                    batch_pause: Some(Span::seconds(-1)),
                    ..Default::default()
                },
                "batch_pause must be an interval of 0 to 1 day, got -1 seconds",
            ),
        ];
        for (options, needle) in cases {
            let err = options.validate().unwrap_err();
            assert!(
                err.to_string().contains(needle),
                "{err} should contain {needle}"
            );
            assert!(!err.hint().is_empty());
        }
    }

    #[test]
    fn no_schedule_means_an_event_task() {
        let rules = RuleText {
            schedule: "  ".into(),
            ..defaults()
        }
        .validate()
        .unwrap();
        assert!(rules.schedule.is_none());
        assert_eq!(rules.next_fire(Utc::now()), None);
        assert_eq!(rules.schedule_text(), None);
        let e = rules.calendar("on_signup").unwrap_err();
        assert_eq!(
            e.to_string(),
            "task \"on_signup\" has no schedule, so it has no windows"
        );
        assert!(e.hint().contains("tide.alter('on_signup', schedule =>"));
    }

    #[test]
    fn every_bound_says_its_minimum_and_maximum() {
        for (name, min, days, text) in INTERVAL_BOUNDS {
            assert!(text.contains(&format!(" to {days} day")), "{name}: {text}");
            assert_eq!(interval_option(name), Some(*name));
            let over = Span {
                months: 0,
                days: i32::try_from(*days).unwrap() + 1,
                micros: 0,
            };
            let e = check_interval(name, over, true).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("{name} must be {text}, got {} days", days + 1)
            );
            let shortest = Span {
                months: 0,
                days: 0,
                micros: *min,
            };
            if *min > 0 {
                assert!(check_interval(name, shortest, false).is_ok(), "{name}");
                let under = Span {
                    micros: min - 1,
                    ..shortest
                };
                let e = check_interval(name, under, false).unwrap_err();
                assert!(
                    e.to_string()
                        .starts_with(&format!("{name} must be {text}, got ")),
                    "{e}"
                );
                let floor = if *min == SECOND {
                    "1 second"
                } else {
                    "100 milliseconds"
                };
                assert!(text.contains(floor), "{name}: {text}");
            }
        }
        // The floor refuses a typo that would retry in a busy loop.
        let one_ms = Span {
            months: 0,
            days: 0,
            micros: 1_000,
        };
        let e = check_interval("backoff_base", one_ms, false).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "backoff_base must be an interval of 100 milliseconds to 30 days, got {}",
                one_ms.describe()
            )
        );
        assert_eq!(interval_option("nonsense"), None);
    }
}

//! Task rules: the validated, canonical form of what `tide.schedule` and `tide.alter` accept.
//!
//! Validation is pure so that every refusal (and its message and hint) is unit-tested; the
//! catalog only stores what this module accepted.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde_json::Value;

use crate::calendar::parse_zone;
use crate::calendar::{next_fires, DstGap, DstOverlap, DstPolicy, Schedule, WindowKind};
use crate::error::{TideError, MAX_NAME_LEN};

/// The rules of a task, as the user gives them (text), before validation.
#[derive(Debug, Clone, Default)]
pub struct RuleText {
    pub schedule: String,
    /// `None` or blank: no command (external workers run the task).
    pub command: Option<String>,
    pub tz: String,
    pub biz_window: String,
    pub queue: String,
    pub args: Value,
    pub dst_gap: String,
    pub dst_overlap: String,
}

/// Validated rules, with the canonical spellings to store.
#[derive(Debug, Clone)]
pub struct TaskRules {
    pub schedule: Schedule,
    pub command: Option<String>,
    pub tz: Tz,
    pub biz_window: WindowKind,
    pub queue: String,
    pub args: Value,
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
    pub args: Option<Value>,
    pub dst_gap: Option<String>,
    pub dst_overlap: Option<String>,
}

/// Checks a task name: not blank, not absurdly long.
pub fn check_name(name: &str) -> Result<(), TideError> {
    if name.trim().is_empty() {
        return Err(TideError::EmptyName);
    }
    if name.chars().count() > MAX_NAME_LEN {
        return Err(TideError::NameTooLong(name.to_string()));
    }
    Ok(())
}

fn check_queue(queue: &str) -> Result<(), TideError> {
    let ok = (1..=63).contains(&queue.len())
        && queue
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(TideError::BadQueue(queue.to_string()))
    }
}

impl RuleText {
    /// Validates every rule; the first problem found is returned.
    pub fn validate(&self) -> Result<TaskRules, TideError> {
        let schedule = Schedule::parse(&self.schedule)?;
        let tz = parse_zone(&self.tz)?;
        let biz_window = WindowKind::parse(&self.biz_window)?;
        let policy = DstPolicy {
            gap: DstGap::parse(&self.dst_gap)?,
            overlap: DstOverlap::parse(&self.dst_overlap)?,
        };
        check_queue(&self.queue)?;
        if !self.args.is_object() {
            return Err(TideError::ArgsNotObject(self.args.to_string()));
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
        next_fires(&self.schedule, self.tz, self.policy, after, 1)
            .into_iter()
            .next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn defaults() -> RuleText {
        RuleText {
            schedule: "0 1 * * *".into(),
            command: None,
            tz: "UTC".into(),
            biz_window: "fire".into(),
            queue: "default".into(),
            args: json!({}),
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
                    args: json!([1, 2]),
                    ..defaults()
                },
                "[1,2]",
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
        assert!(matches!(
            check_name(&"x".repeat(MAX_NAME_LEN + 1)),
            Err(TideError::NameTooLong(_))
        ));
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
}

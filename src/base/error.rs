//! Errors as values. Pure code returns `TideError`; only the SQL boundary (`sqlerr.rs`) turns
//! one into an `ereport` with its SQLSTATE, message and hint.

/// The SQLSTATE classes pg_tide reports. Kept free of pgrx so pure code can name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlState {
    /// 22023 invalid_parameter_value
    InvalidParameterValue,
    /// 23505 unique_violation
    UniqueViolation,
    /// 42704 undefined_object
    UndefinedObject,
    /// 22004 null_value_not_allowed
    NullValueNotAllowed,
    /// 22008 datetime_field_overflow
    DatetimeFieldOverflow,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TideError {
    #[error("invalid cron expression \"{}\": {reason}", short(expr))]
    BadCron { expr: String, reason: String },

    #[error("cron expression \"{}\" never fires", short(.0))]
    NeverFires(String),

    /// With the closest real zone name, when one is close enough to be a typo.
    #[error("unknown time zone \"{}\"", short(name))]
    UnknownZone {
        name: String,
        suggestion: Option<&'static str>,
    },

    #[error("unknown {option} \"{}\"", short(value))]
    UnknownOption {
        option: &'static str,
        value: String,
        allowed: &'static str,
    },

    #[error("task name must not be empty")]
    EmptyName,

    #[error("{param} is too long ({len} characters, at most {max})")]
    TooLong {
        param: &'static str,
        len: usize,
        max: usize,
    },

    #[error("{param} is out of range ({value})")]
    DateOutOfRange { param: &'static str, value: String },

    #[error("{param} is not usable JSON: {reason}")]
    BadJson { param: &'static str, reason: String },

    #[error("queue name \"{}\" is not valid", short(.0))]
    BadQueue(String),

    #[error("task \"{}\" already exists with a different definition", short(.0))]
    DuplicateTask(String),

    #[error("schedule \"{}\" is not valid: an interval in seconds must be 1 to 59 seconds", short(.0))]
    BadSecondsInterval(String),

    #[error("schedule \"{}\" is not supported: pg_tide has no jobs that run at server start", short(.0))]
    Reboot(String),

    #[error("task \"{}\" does not exist", short(.0))]
    NoSuchTask(String),

    #[error("{param} must be {expected}, got {}", short(value))]
    OutOfRange {
        param: &'static str,
        value: String,
        expected: &'static str,
    },

    #[error("{param} must not be NULL")]
    NullArgument { param: &'static str },

    #[error("args must be a JSON object, got {0}")]
    ArgsNotObject(String),

    #[error("task \"{}\" has no window for {what}", short(task))]
    NoWindow {
        task: String,
        what: String,
        hint: String,
    },

    #[error("pass at most one of {params}")]
    OneOf { params: &'static str },

    #[error("unknown pending \"{}\"", short(.0))]
    BadPending(String),

    #[error("task \"{}\" has no schedule, so it has no windows", short(.0))]
    NoSchedule(String),

    #[error("topic \"{}\" is not valid", short(.0))]
    BadTopic(String),

    #[error("lock_key \"{}\" is not valid: {reason}", short(template))]
    BadLockKey { template: String, reason: String },

    #[error("error_kinds is not valid: {reason}")]
    BadErrorKinds { reason: String },
}

/// A value quoted in a message: at most 100 characters of it, so that no input makes a message
/// (and the server log line) huge.
fn short(value: &str) -> String {
    shorten(value)
}

/// At most 100 characters of a value, for an error message.
pub fn shorten(text: &str) -> String {
    if text.chars().count() <= 100 {
        text.to_string()
    } else {
        let head: String = text.chars().take(100).collect();
        format!("{head}...")
    }
}

/// The deepest nesting accepted in JSON a user passes (a task's args, a payload).
pub const MAX_JSON_DEPTH: usize = 32;
/// The longest JSON accepted, in bytes of JSON text.
pub const MAX_JSON_BYTES: usize = 1_048_576;

/// The longest task name accepted: long enough for descriptive names, short enough to read in
/// a psql table.
pub const MAX_NAME_LEN: usize = 200;

/// Refuses text longer than `max` characters, naming the parameter (not quoting the value).
pub fn check_len(param: &'static str, value: &str, max: usize) -> Result<(), TideError> {
    // Counting bytes first keeps a huge value cheap to refuse.
    if value.len() > max {
        let len = value.chars().count();
        if len > max {
            return Err(TideError::TooLong { param, len, max });
        }
    }
    Ok(())
}

impl TideError {
    pub fn sqlstate(&self) -> SqlState {
        match self {
            TideError::DuplicateTask(_) => SqlState::UniqueViolation,
            TideError::NoSuchTask(_) => SqlState::UndefinedObject,
            TideError::NullArgument { .. } => SqlState::NullValueNotAllowed,
            TideError::DateOutOfRange { .. } => SqlState::DatetimeFieldOverflow,
            _ => SqlState::InvalidParameterValue,
        }
    }

    /// The fix, in the user's terms.
    pub fn hint(&self) -> String {
        match self {
            TideError::BadCron { .. } => "use five fields (minute hour day-of-month month day-of-week), \
                 optionally a leading seconds field, or a macro such as '@daily'; \
                 for example '0 1 * * *' is every day at 01:00"
                .to_string(),
            TideError::NeverFires(_) => "the fields never match a real date (for example day 30 of February); \
                 check the day-of-month and month fields"
                .to_string(),
            TideError::UnknownZone { suggestion, .. } => match suggestion {
                Some(s) => format!("did you mean '{s}'? Time zones are IANA names; see pg_timezone_names"),
                None => "use an IANA name such as 'Asia/Shanghai' or 'America/New_York'; see pg_timezone_names"
                    .to_string(),
            },
            TideError::UnknownOption { allowed, .. } => format!("use {allowed}"),
            TideError::EmptyName => "give the task a name such as 'daily_bill'".to_string(),
            TideError::TooLong { param, max, .. } => format!("pass {param} of at most {max} characters"),
            TideError::DateOutOfRange { .. } => {
                "pg_tide computes calendars from 0001-01-01 to 9999-12-31; pass a finite date in that range"
                    .to_string()
            }
            TideError::BadJson { param, .. } => format!(
                "pass {param} as a JSON object nested at most {} levels deep and at most {} bytes long, with numbers a double can hold",
                MAX_JSON_DEPTH, MAX_JSON_BYTES
            ),
            TideError::BadQueue(_) => {
                "a queue name is 1 to 63 characters: letters, digits, '_', '-' or '.'".to_string()
            }
            TideError::DuplicateTask(name) => format!(
                "the same definition again is a no-op; to change it use tide.alter('{name}', ...), or pass replace => true to make this definition its next rule version"
            ),
            TideError::NoSuchTask(_) => {
                "list your tasks with: SELECT name FROM tide.task".to_string()
            }
            TideError::BadSecondsInterval(_) => {
                "use '1 second' to '59 seconds', or a cron expression such as '*/5 * * * *' (every 5 minutes) or '0 */2 * * * *' (every 2 minutes, with a seconds field)".to_string()
            }
            TideError::Reboot(_) => {
                "schedule the work at a time (such as '@daily'), or make it an event task and call tide.emit from the script that starts your server or application".to_string()
            }
            TideError::OutOfRange { expected, param, .. } => format!("pass {param} {expected}"),
            TideError::NullArgument { param } => format!("pass a value for {param}"),
            TideError::NoWindow { hint, .. } => hint.clone(),
            TideError::OneOf { params } => format!("for example tide.rerun('daily_bill', biz_date => DATE '2026-11-28'); pass {params}, not both (neither: the window of the latest fire)"),
            TideError::BadPending(_) => "use pending => 'hold' (default: unstarted runs wait for tide.confirm), 'adopt' (they take the new rules) or 'keep' (they keep the rules they were created under)".to_string(),
            TideError::NoSchedule(name) => format!(
                "it runs on events only (tide.emit); give it a schedule with tide.alter('{name}', schedule => '0 1 * * *')"
            ),
            TideError::BadTopic(_) => {
                "a topic is 1 to 100 characters: letters, digits, '_', '-', '.' or ':', such as 'order.created'".to_string()
            }
            TideError::BadLockKey { .. } => "write a template such as 'account:{args.account_id}'; placeholders are {args.NAME}, {payload.NAME}, {key}, {biz_date} and {task}".to_string(),
            TideError::BadErrorKinds { .. } => "map SQLSTATEs (5 characters, such as 'P0001') or SQLSTATE classes (2, such as '22') to 'transient', 'business' or 'not_ready': error_kinds => '{\"P0001\": \"transient\"}'".to_string(),
            TideError::ArgsNotObject(_) => {
                "pass an object such as '{\"account_id\": 42}'::jsonb".to_string()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_is_unique_violation_and_hint_names_the_fix() {
        let e = TideError::DuplicateTask("daily_bill".into());
        assert_eq!(e.sqlstate(), SqlState::UniqueViolation);
        assert_eq!(
            e.to_string(),
            "task \"daily_bill\" already exists with a different definition"
        );
        assert!(e.hint().contains("tide.alter('daily_bill'"));
        assert!(e.hint().contains("replace => true"));
    }

    #[test]
    fn missing_task_is_undefined_object() {
        assert_eq!(
            TideError::NoSuchTask("x".into()).sqlstate(),
            SqlState::UndefinedObject
        );
    }
}

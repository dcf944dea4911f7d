//! Retry rules: how long a run waits before its next try, and which errors are worth a retry.
//!
//! Pure functions so the bounds are unit-tested; src/runs/ledger.rs exposes them to the PL/pgSQL
//! ledger as `tide._backoff_delay` and `tide._error_kind_of`.

use crate::base::error::TideError;

/// How a retry delay is spread at random, so that runs failing together do not retry together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Uniform in `[0, d]` (AWS "full jitter"): the best spread, the default.
    Full,
    /// Uniform in `[d/2, d]`: never retries sooner than half the nominal delay.
    Equal,
    /// Exactly `d`.
    None,
}

impl Jitter {
    pub fn parse(s: &str) -> Result<Self, TideError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "full" => Ok(Jitter::Full),
            "equal" => Ok(Jitter::Equal),
            "none" => Ok(Jitter::None),
            _ => Err(TideError::UnknownOption {
                option: "jitter",
                value: s.to_string(),
                allowed: "'full' (default), 'equal' or 'none'",
            }),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Jitter::Full => "full",
            Jitter::Equal => "equal",
            Jitter::None => "none",
        }
    }
}

/// The nominal delay before try `tries + 1` after `tries` failed tries (1-based):
/// `min(cap, base * factor^(tries-1))`, in microseconds. Never negative, never overflows.
pub fn nominal_delay_us(tries: i32, base_us: i64, factor: f64, cap_us: i64) -> i64 {
    let exponent = f64::from(tries.max(1) - 1);
    let raw = (base_us.max(0) as f64) * factor.max(1.0).powf(exponent);
    let cap = cap_us.max(0) as f64;
    if raw.is_finite() && raw < cap {
        raw as i64
    } else {
        cap as i64
    }
}

/// The delay with jitter applied; `unit` is a random number in `[0, 1)`.
pub fn delay_us(
    tries: i32,
    base_us: i64,
    factor: f64,
    cap_us: i64,
    jitter: Jitter,
    unit: f64,
) -> i64 {
    let d = nominal_delay_us(tries, base_us, factor, cap_us) as f64;
    let u = if unit.is_finite() {
        unit.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let spread = match jitter {
        Jitter::Full => d * u,
        Jitter::Equal => d / 2.0 + d / 2.0 * u,
        Jitter::None => d,
    };
    spread.round() as i64
}

/// What kind of failure an SQLSTATE is, for a run's command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Transient,
    Business,
    NotReady,
}

impl ErrorKind {
    pub fn parse(s: &str) -> Result<Self, TideError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "transient" => Ok(ErrorKind::Transient),
            "business" => Ok(ErrorKind::Business),
            "not_ready" => Ok(ErrorKind::NotReady),
            _ => Err(TideError::UnknownOption {
                option: "error kind",
                value: s.to_string(),
                allowed: "'transient' (retry with backoff), 'business' (dead letter at once) or 'not_ready' (wait for the next window)",
            }),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Transient => "transient",
            ErrorKind::Business => "business",
            ErrorKind::NotReady => "not_ready",
        }
    }
}

/// SQLSTATE a command raises (via `tide.not_ready(...)`) to say its input is not there yet.
pub const NOT_READY_SQLSTATE: &str = "TDNR0";
/// SQLSTATE a command raises (via `tide.business_error(...)`) to say retrying cannot help.
pub const BUSINESS_SQLSTATE: &str = "TDBE0";
/// SQLSTATE a command raises (via `tide.transient_error(...)`) to say a later try may work.
pub const TRANSIENT_SQLSTATE: &str = "TDTE0";
/// The most entries a task's `error_kinds` may have.
pub const MAX_ERROR_KINDS: usize = 100;

/// Classifies the SQLSTATE of a failed command. Transient: the same command may well succeed
/// later (lost connection, serialization failure, deadlock, lock or statement timeout, out of
/// resources, shutdown). Everything else — bad data, constraint violations, missing objects,
/// a plain `RAISE EXCEPTION` — fails the same way again, so it is a business error.
pub fn classify(sqlstate: &str) -> ErrorKind {
    let s = sqlstate.trim().to_ascii_uppercase();
    if s == NOT_READY_SQLSTATE {
        return ErrorKind::NotReady;
    }
    if s == BUSINESS_SQLSTATE {
        return ErrorKind::Business;
    }
    if s == TRANSIENT_SQLSTATE {
        return ErrorKind::Transient;
    }
    let class = s.get(0..2).unwrap_or("");
    let transient = matches!(
        class,
        "08" // connection exception
        | "40" // transaction rollback: serialization failure, deadlock detected
        | "53" // insufficient resources: disk full, out of memory, too many connections
        | "57" // operator intervention: query_canceled (statement timeout), shutdown
        | "58" // system error: I/O error
        | "HV" // foreign data wrapper: the remote side
    ) || s == "55P03" // lock_not_available (lock_timeout, NOWAIT)
        || s == "55006" // object_in_use
        || s == "XX001"
        || s == "XX002"; // data / index corrupted: maybe a replica hiccup; bounded by max_attempts
    if transient {
        ErrorKind::Transient
    } else {
        ErrorKind::Business
    }
}

/// Checks a task's `error_kinds` (a JSON object mapping SQLSTATEs, 5 characters, or SQLSTATE
/// classes, 2, to error kinds) and returns it with upper-case keys and canonical kinds.
pub fn parse_error_kinds(text: &str) -> Result<String, TideError> {
    let bad = |reason: String| TideError::BadErrorKinds { reason };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not JSON ({e})")))?;
    let serde_json::Value::Object(map) = value else {
        return Err(bad(format!(
            "it must be a JSON object, got {}",
            crate::base::error::shorten(text)
        )));
    };
    if map.len() > MAX_ERROR_KINDS {
        return Err(bad(format!(
            "{} entries, at most {MAX_ERROR_KINDS}",
            map.len()
        )));
    }
    let mut out = serde_json::Map::new();
    for (code, kind) in &map {
        let key = code.trim().to_ascii_uppercase();
        let well_formed =
            matches!(key.len(), 2 | 5) && key.bytes().all(|b| b.is_ascii_alphanumeric());
        if !well_formed {
            return Err(bad(format!(
                "\"{}\" is not an SQLSTATE (5 letters or digits) or an SQLSTATE class (2)",
                crate::base::error::shorten(code)
            )));
        }
        if [NOT_READY_SQLSTATE, BUSINESS_SQLSTATE, TRANSIENT_SQLSTATE].contains(&key.as_str()) {
            return Err(bad(format!(
                "\"{key}\" is the SQLSTATE of a pg_tide error helper, whose kind is fixed"
            )));
        }
        let Some(kind) = kind.as_str() else {
            return Err(bad(format!(
                "the kind of \"{key}\" must be a string, got {}",
                crate::base::error::shorten(&kind.to_string())
            )));
        };
        let kind = ErrorKind::parse(kind).map_err(|_| {
            bad(format!(
                "unknown error kind \"{}\" for \"{key}\"",
                crate::base::error::shorten(kind)
            ))
        })?;
        if out.insert(key.clone(), kind.as_str().into()).is_some() {
            return Err(bad(format!("\"{key}\" is given twice")));
        }
    }
    Ok(serde_json::Value::Object(out).to_string())
}

/// Classifies a failed command's SQLSTATE with a task's `error_kinds` (checked by
/// `parse_error_kinds`): pg_tide's error helpers keep their kinds; then the exact SQLSTATE,
/// then its class, then the default list (`classify`).
pub fn classify_with(sqlstate: &str, kinds: Option<&str>) -> ErrorKind {
    let s = sqlstate.trim().to_ascii_uppercase();
    if [NOT_READY_SQLSTATE, BUSINESS_SQLSTATE, TRANSIENT_SQLSTATE].contains(&s.as_str()) {
        return classify(&s);
    }
    let map = kinds
        .and_then(|k| serde_json::from_str::<serde_json::Value>(k).ok())
        .and_then(|v| match v {
            serde_json::Value::Object(m) => Some(m),
            _ => None,
        });
    if let Some(map) = map {
        let class = s.get(0..2).unwrap_or("");
        for key in [s.as_str(), class] {
            if let Some(kind) = map.get(key).and_then(|k| k.as_str()) {
                if let Ok(kind) = ErrorKind::parse(kind) {
                    return kind;
                }
            }
        }
    }
    classify(&s)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    #[test]
    fn nominal_delay_grows_then_caps() {
        let cases = [
            (1, 10 * S),
            (2, 20 * S),
            (3, 40 * S),
            (4, 80 * S),
            (9, 2560 * S),
            (10, 3600 * S), // 5120 s capped at one hour
            (1000, 3600 * S),
            (i32::MAX, 3600 * S),
            (0, 10 * S),  // a zeroth try is treated as the first
            (-5, 10 * S), // so is nonsense
        ];
        for (tries, want) in cases {
            assert_eq!(
                nominal_delay_us(tries, 10 * S, 2.0, 3600 * S),
                want,
                "tries {tries}"
            );
        }
        // A factor below 1 would shrink delays: treated as 1 (constant backoff).
        assert_eq!(nominal_delay_us(5, 10 * S, 0.5, 3600 * S), 10 * S);
        // A cap below the base caps the base too.
        assert_eq!(nominal_delay_us(1, 10 * S, 2.0, 5 * S), 5 * S);
    }

    #[test]
    fn jitter_stays_within_its_bounds() {
        for i in 0..=100 {
            let u = f64::from(i) / 100.0;
            let d = nominal_delay_us(3, 10 * S, 2.0, 3600 * S);
            let full = delay_us(3, 10 * S, 2.0, 3600 * S, Jitter::Full, u);
            let equal = delay_us(3, 10 * S, 2.0, 3600 * S, Jitter::Equal, u);
            let none = delay_us(3, 10 * S, 2.0, 3600 * S, Jitter::None, u);
            assert!((0..=d).contains(&full), "full {full}");
            assert!((d / 2..=d).contains(&equal), "equal {equal}");
            assert_eq!(none, d);
        }
        assert_eq!(delay_us(3, 10 * S, 2.0, 3600 * S, Jitter::Full, 0.0), 0);
        assert_eq!(
            delay_us(3, 10 * S, 2.0, 3600 * S, Jitter::Equal, 0.0),
            20 * S
        );
        // A broken random source cannot produce a negative or infinite delay.
        assert_eq!(delay_us(1, S, 2.0, S, Jitter::Full, f64::NAN), 0);
        assert_eq!(delay_us(1, S, 2.0, S, Jitter::Full, 7.0), S);
    }

    #[test]
    fn sqlstates_are_classified() {
        let cases = [
            ("40001", ErrorKind::Transient), // serialization_failure
            ("40P01", ErrorKind::Transient), // deadlock_detected
            ("55P03", ErrorKind::Transient), // lock_not_available
            ("57014", ErrorKind::Transient), // query_canceled: statement timeout
            ("57P01", ErrorKind::Transient), // admin_shutdown
            ("08006", ErrorKind::Transient), // connection_failure
            ("53100", ErrorKind::Transient), // disk_full
            ("53200", ErrorKind::Transient), // out_of_memory
            ("58030", ErrorKind::Transient), // io_error
            ("HV00N", ErrorKind::Transient), // fdw_unable_to_establish_connection
            ("23505", ErrorKind::Business),  // unique_violation
            ("23503", ErrorKind::Business),  // foreign_key_violation
            ("22012", ErrorKind::Business),  // division_by_zero
            ("42P01", ErrorKind::Business),  // undefined_table
            ("42501", ErrorKind::Business),  // insufficient_privilege
            ("P0001", ErrorKind::Business),  // raise_exception
            ("XX000", ErrorKind::Business),  // internal_error
            ("TDNR0", ErrorKind::NotReady),
            ("tdnr0", ErrorKind::NotReady),
            ("TDBE0", ErrorKind::Business),
            ("", ErrorKind::Business),
        ];
        for (state, want) in cases {
            assert_eq!(classify(state), want, "{state}");
        }
    }

    #[test]
    fn kinds_and_jitters_parse() {
        assert_eq!(ErrorKind::parse("Business"), Ok(ErrorKind::Business));
        assert_eq!(ErrorKind::parse(" not_ready "), Ok(ErrorKind::NotReady));
        let err = ErrorKind::parse("fatal").unwrap_err();
        assert!(err.to_string().contains("\"fatal\""));
        assert_eq!(Jitter::parse("EQUAL"), Ok(Jitter::Equal));
        assert!(Jitter::parse("random").is_err());
        for j in [Jitter::Full, Jitter::Equal, Jitter::None] {
            assert_eq!(Jitter::parse(j.as_str()), Ok(j));
        }
    }

    #[test]
    fn error_kinds_map_codes_and_classes() {
        let kinds =
            parse_error_kinds(r#"{"p0001": "Transient", "22": "transient", "22012": "business"}"#)
                .unwrap();
        let k = Some(kinds.as_str());
        // The exact code, then its class, then the default list.
        assert_eq!(classify_with("P0001", k), ErrorKind::Transient);
        assert_eq!(classify_with("P0001", None), ErrorKind::Business);
        assert_eq!(classify_with("22003", k), ErrorKind::Transient);
        assert_eq!(classify_with("22012", k), ErrorKind::Business);
        assert_eq!(classify_with("40001", k), ErrorKind::Transient);
        assert_eq!(classify_with("23505", k), ErrorKind::Business);
        // The helpers keep their kinds.
        assert_eq!(
            classify_with(TRANSIENT_SQLSTATE, None),
            ErrorKind::Transient
        );
        assert_eq!(classify_with(NOT_READY_SQLSTATE, k), ErrorKind::NotReady);
        assert_eq!(classify_with(BUSINESS_SQLSTATE, k), ErrorKind::Business);
    }

    #[test]
    fn bad_error_kinds_are_refused_naming_the_value() {
        for (text, says) in [
            ("[1]", "must be a JSON object"),
            ("not json", "not JSON"),
            (r#"{"P001": "transient"}"#, "\"P001\" is not an SQLSTATE"),
            (
                r#"{"P0001": "sometimes"}"#,
                "unknown error kind \"sometimes\"",
            ),
            (r#"{"P0001": 1}"#, "must be a string"),
            (r#"{"TDBE0": "transient"}"#, "error helper"),
            (
                r#"{"p0001": "transient", "P0001": "business"}"#,
                "given twice",
            ),
        ] {
            let err = parse_error_kinds(text).unwrap_err();
            assert!(err.to_string().contains(says), "{text}: {err}");
            assert!(err.hint().contains("P0001"));
        }
        let many: Vec<String> = (0..=MAX_ERROR_KINDS)
            .map(|i| format!("\"{i:05}\": \"business\""))
            .collect();
        assert!(parse_error_kinds(&format!("{{{}}}", many.join(","))).is_err());
    }
}

//! Retry rules: how long a run waits before its next try, and which errors are worth a retry.
//!
//! Pure functions so the bounds are unit-tested; `ledger_sql.rs` exposes them to the PL/pgSQL
//! ledger as `tide.backoff_delay` and `tide.error_kind_of`.

use crate::error::TideError;

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
}

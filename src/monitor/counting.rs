//! What one change of a run adds to the counters of `tide.metrics()` and to the hourly counters
//! of the console's charts: the definition every writer of history rows counts with
//! (`tide._counts_of`, called by `tide._write_history` and `tide._create_runs` in
//! src/runs/record.sql). No pgrx: unit-tested with plain `cargo test`.
//!
//! Written here rather than in SQL: inlined into the writers, the SQL definition was an
//! expression of some hundred steps, compiled at every statement that wrote history (half of a
//! one-run claim's history write) and, as a VALUES list, again for every run it counted.

use crate::monitor::prometheus::le_of;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800_000_000;

/// The run after the change, as the counters read it. Instants are PostgreSQL's timestamps
/// (microseconds since 2000-01-01 UTC).
#[derive(Debug, Clone, Copy, Default)]
pub struct Change<'a> {
    /// The state the change brings the run to.
    pub to: &'a str,
    pub attempts: Option<i32>,
    pub claimed: Option<i64>,
    pub finished: Option<i64>,
    pub started: Option<i64>,
    pub fire: Option<i64>,
    pub created: Option<i64>,
}

/// One counter to add to: metric, label, value.
pub type Count = (&'static str, String, f64);

const OUTCOMES: [&str; 5] = ["succeeded", "need_check", "dead", "skipped", "cancelled"];

/// What the change counts, given the transaction's start (`now()`, the hour of a change with
/// no end): an outcome reached (a replayed run counts again), with the duration of a success
/// (its last attempt) and its histogram bucket; a run's first start, with its wait from fire
/// (or creation) and its bucket; the hour an attempt ended with its outcome (retry: a failed
/// attempt to be tried again) and a success's duration bucket (`duration_bucket`). Buckets are
/// counted once each (not cumulative): `tide.metrics()` adds them up. A value above the largest
/// bound has no bucket (+Inf only, which is the count).
pub fn counts_of(c: &Change, now: i64) -> Vec<Count> {
    let mut out = Vec::new();
    let outcome = OUTCOMES.contains(&c.to);
    if outcome {
        out.push(("runs", c.to.to_string(), 1.0));
    }
    // A success's duration: from its claim to its end.
    let duration = match (c.to, c.claimed, c.finished) {
        ("succeeded", Some(claimed), Some(finished)) => Some(finished - claimed),
        _ => None,
    };
    if let Some(d) = duration {
        let seconds = micros_to_seconds(d);
        out.push(("duration_sum", String::new(), seconds));
        out.push(("duration_count", String::new(), 1.0));
        if let Some(le) = le_of(seconds) {
            out.push(("duration_bucket", le.to_string(), 1.0));
        }
    }
    if c.to == "running" && c.attempts == Some(1) {
        // The wait of a first start: from the fire (or the creation), never below zero; no
        // start known counts as no wait.
        let wait = match (c.started, c.fire.or(c.created)) {
            (Some(started), Some(from)) => (started - from).max(0),
            _ => 0,
        };
        let seconds = micros_to_seconds(wait);
        out.push(("wait_sum", String::new(), seconds));
        out.push(("wait_count", String::new(), 1.0));
        if let Some(le) = le_of(seconds) {
            out.push(("wait_bucket", le.to_string(), 1.0));
        }
    }
    if outcome || c.to == "retry" {
        let hour = (c.finished.unwrap_or(now) + PG_EPOCH_UNIX_MICROS).div_euclid(3_600_000_000);
        let label = match duration {
            Some(d) => format!("{hour}|{}|{}", c.to, duration_bucket(d)),
            None => format!("{hour}|{}", c.to),
        };
        out.push(("hour", label, 1.0));
    }
    out
}

/// A duration (microseconds) as the index of its bucket in the hourly counters: bucket k holds
/// durations of at most 2^(k/4) milliseconds (each bucket 19% wider than the one before; 0: 1 ms
/// or less, 120: 12 days or more), as `tide.run_hourly` documents them.
pub fn duration_bucket(micros: i64) -> i32 {
    if micros <= 1000 {
        return 0;
    }
    let k = (4.0 * (micros as f64 / 1000.0).log2()).ceil();
    if k >= 120.0 {
        120
    } else {
        k as i32
    }
}

fn micros_to_seconds(micros: i64) -> f64 {
    micros as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = 3_600_000_000;
    // 2026-12-06 10:00 UTC in PostgreSQL's microseconds.
    const T: i64 = (1_796_551_200 - 946_684_800) * 1_000_000;

    fn labels(counts: &[Count]) -> Vec<String> {
        counts
            .iter()
            .map(|(m, l, v)| format!("{m}/{l}={v}"))
            .collect()
    }

    #[test]
    fn a_success_counts_its_outcome_duration_and_hour() {
        let c = Change {
            to: "succeeded",
            attempts: Some(2),
            claimed: Some(T),
            finished: Some(T + 1_500_000),
            ..Change::default()
        };
        assert_eq!(
            labels(&counts_of(&c, 0)),
            [
                "runs/succeeded=1",
                "duration_sum/=1.5",
                "duration_count/=1",
                "duration_bucket/5=1",
                "hour/499042|succeeded|43=1"
            ]
        );
    }

    #[test]
    fn a_first_start_counts_its_wait_from_the_fire_or_the_creation() {
        let mut c = Change {
            to: "running",
            attempts: Some(1),
            started: Some(T + 30_000_000),
            fire: Some(T),
            created: Some(T + 20_000_000),
            ..Change::default()
        };
        assert_eq!(
            labels(&counts_of(&c, 0)),
            ["wait_sum/=30", "wait_count/=1", "wait_bucket/30=1"]
        );
        c.fire = None;
        assert_eq!(
            labels(&counts_of(&c, 0)),
            ["wait_sum/=10", "wait_count/=1", "wait_bucket/10=1"]
        );
        // Started before it was due (a run now): no wait, not a negative one.
        c.started = Some(T);
        assert_eq!(
            labels(&counts_of(&c, 0)),
            ["wait_sum/=0", "wait_count/=1", "wait_bucket/0.01=1"]
        );
        // A later attempt is not a first start.
        c.attempts = Some(2);
        assert!(counts_of(&c, 0).is_empty());
    }

    #[test]
    fn other_ends_count_their_outcome_and_hour_a_retry_its_hour_alone() {
        let c = Change {
            to: "dead",
            finished: Some(T + H - 1),
            ..Change::default()
        };
        assert_eq!(
            labels(&counts_of(&c, 0)),
            ["runs/dead=1", "hour/499042|dead=1"]
        );
        // No end yet: the hour of the transaction.
        let c = Change {
            to: "retry",
            ..Change::default()
        };
        assert_eq!(labels(&counts_of(&c, T + H)), ["hour/499043|retry=1"]);
        for to in ["waiting", "ready", "held", "paused"] {
            assert!(counts_of(&Change { to, ..c }, T).is_empty(), "{to}");
        }
    }

    #[test]
    fn a_long_success_has_no_histogram_bucket_but_is_counted() {
        let c = Change {
            to: "succeeded",
            claimed: Some(T),
            finished: Some(T + 7 * H),
            ..Change::default()
        };
        assert_eq!(
            labels(&counts_of(&c, 0)),
            [
                "runs/succeeded=1",
                "duration_sum/=25200",
                "duration_count/=1",
                "hour/499049|succeeded|99=1"
            ]
        );
    }

    #[test]
    fn duration_buckets_hold_at_most_their_bound() {
        // Bucket k: at most 2^(k/4) ms.
        assert_eq!(duration_bucket(-5), 0);
        assert_eq!(duration_bucket(1000), 0);
        assert_eq!(duration_bucket(1001), 1);
        assert_eq!(duration_bucket(2000), 4);
        assert_eq!(duration_bucket(2001), 5);
        assert_eq!(duration_bucket(16_000), 16);
        assert_eq!(duration_bucket(1_500_000), 43);
        assert_eq!(duration_bucket(1_000_000_000_000), 120);
    }
}

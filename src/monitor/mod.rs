//! Helpers of the monitoring SQL (this folder's files): how long a task's silence may normally
//! grow (the longest gap between its fires), when a heartbeat check with a cron schedule next
//! expects a beat, and when external workers last claimed from each queue (a late start's
//! cause: "no worker claimed from queue Q in the last minute").

pub mod counting;
pub(crate) mod metrics;
pub mod prometheus;

// Monitoring, after every concept it watches: how quiet a task may be (silence.sql), task health
// (health.sql), heartbeat checks (checks.sql), then alerts (src/alerts/alerts.sql), run log lines
// and explain (explain.sql), the counters (counts.sql) and retention (retention.sql), in this
// order.
::pgrx::extension_sql_file!(
    "silence.sql",
    name = "silence",
    requires = [
        "effects",
        "delivery",
        "roles",
        "steps",
        "locks",
        "events",
        "long",
        "jobs",
        "queues",
        "backfill_progress",
        "recon_compare",
        runs::change::history_unwritten
    ]
);
::pgrx::extension_sql_file!("health.sql", name = "health", requires = ["silence"]);
::pgrx::extension_sql_file!("checks.sql", name = "checks", requires = ["health"]);
::pgrx::extension_sql_file!("explain.sql", name = "explain", requires = ["alerts"]);
::pgrx::extension_sql_file!("counts.sql", name = "counts", requires = ["explain"]);
::pgrx::extension_sql_file!("retention.sql", name = "retention", requires = ["counts"]);
// Monitoring as a whole; what builds on it requires this.
::pgrx::extension_sql!(
    "-- (monitoring: src/monitor/, src/alerts/alerts.sql)\n",
    name = "monitor",
    requires = [
        "silence",
        "health",
        "checks",
        "alerts",
        "explain",
        "counts",
        "retention"
    ]
);
// Hourly counters for charts (tide.run_hours) and one task's health (tide.task_health).
::pgrx::extension_sql_file!("charts.sql", name = "charts", requires = ["monitor"]);
// The samples of tide.metrics() as rows (the view tide.metric).
::pgrx::extension_sql_file!(
    "metric.sql",
    name = "metric",
    requires = ["monitor", monitor::metrics::metric_samples]
);

use chrono::Duration;
use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::lwlock::PgLwLock;
use pgrx::prelude::*;
use pgrx::{pg_sys, PGRXSharedMemory};
use std::cell::RefCell;

use crate::base::sqlerr::{required, OrRaise};
use crate::calendar::pgtime::{from_pg, now, to_pg};
use crate::calendar::{fire_iter, gaps, parse_zone, DstGap, DstOverlap, DstPolicy, Schedule};

/// `tide._le(seconds)`: the histogram bucket (its upper bound, the `le` label) of a duration or
/// wait in seconds, as `tide._counts_of` counts it (`prometheus::le_of`, with the list of
/// bounds `tide.metrics()` writes). pg_tide's own SQL no longer calls it (until 0.2.6 the
/// counters did, as SQL): it keeps the buckets readable from SQL, as the monitor tier reads them
/// to check the counters against the history.
#[pg_extern(immutable, parallel_safe, strict, schema = "tide", name = "_le")]
fn le(seconds: f64) -> Option<&'static str> {
    crate::monitor::prometheus::le_of(seconds)
}

/// `tide._counts_of(to, attempts, claimed, finished, started, fire, created)`: what a history
/// row that brings a run to the state `to` adds to the counters of `tide.metrics()` and to the
/// hourly counters of `tide.run_hours` (`counting::counts_of`). Called by the two writers of
/// history (src/runs/record.sql), once a run.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
#[pg_extern(stable, parallel_safe, schema = "tide", name = "_counts_of")]
fn counts_of(
    p_to: Option<&str>,
    p_attempts: Option<i32>,
    p_claimed: Option<TimestampWithTimeZone>,
    p_finished: Option<TimestampWithTimeZone>,
    p_started: Option<TimestampWithTimeZone>,
    p_fire: Option<TimestampWithTimeZone>,
    p_created: Option<TimestampWithTimeZone>,
) -> TableIterator<
    'static,
    (
        name!(metric, String),
        name!(label, String),
        name!(value, f64),
    ),
> {
    let micros = |t: Option<TimestampWithTimeZone>| t.map(TimestampWithTimeZone::into_inner);
    // No state (the writers always give one): nothing counts.
    let change = counting::Change {
        to: p_to.unwrap_or(""),
        attempts: p_attempts,
        claimed: micros(p_claimed),
        finished: micros(p_finished),
        started: micros(p_started),
        fire: micros(p_fire),
        created: micros(p_created),
    };
    // SAFETY: reads a field of the current transaction's state (now()); no preconditions.
    let now = unsafe { pg_sys::GetCurrentTransactionStartTimestamp() };
    TableIterator::new(
        counting::counts_of(&change, now)
            .into_iter()
            .map(|(metric, label, value)| (metric.to_string(), label, value)),
    )
}

/// The longest time between two consecutive fires of a schedule (from now, over the next 1000 fires or 400 days):
/// the base of a task's derived `max_silence`. NULL for a schedule that fires less than twice,
/// and for no schedule.
#[pg_extern(stable, parallel_safe, schema = "tide", name = "_fire_gap")]
fn fire_gap(
    schedule: Option<&str>,
    tz: Option<&str>,
    dst_gap: Option<&str>,
    dst_overlap: Option<&str>,
) -> Option<Interval> {
    // An event task without a schedule has no gaps between fires.
    let (_, longest) = gaps_now(schedule, tz, dst_gap, dst_overlap, "tide._fire_gap")?;
    Interval::new(0, 0, longest.num_microseconds().unwrap_or(i64::MAX)).ok()
}

/// What [`gaps_now`] worked out last: the schedule, zone and DST policy as given, the
/// transaction's start, and the shortest and longest gaps.
type Gaps = (
    (String, Option<String>, Option<String>, Option<String>, i64),
    Option<(Duration, Duration)>,
);

thread_local! {
    /// The last schedule's gaps: a task's trigger (`tide._fire_gap`) and its owner's limits
    /// (`tide._shortest_gap`) ask for the same schedule in one statement, and a deploy script
    /// for many tasks of one schedule asks for it again in one transaction (up to 1000 fires
    /// each time: most of a `tide.schedule` call of a frequent schedule).
    static LAST_GAPS: RefCell<Option<Gaps>> = const { RefCell::new(None) };
}

/// The shortest and longest gaps between fires of a schedule from the transaction's start (see
/// [`crate::calendar::gaps`]); `None` for no schedule or one that fires less than twice.
fn gaps_now(
    schedule: Option<&str>,
    tz: Option<&str>,
    dst_gap: Option<&str>,
    dst_overlap: Option<&str>,
    function: &'static str,
) -> Option<(Duration, Duration)> {
    let from = now();
    let key = (
        schedule?.to_string(),
        tz.map(str::to_string),
        dst_gap.map(str::to_string),
        dst_overlap.map(str::to_string),
        from.timestamp_micros(),
    );
    if let Some(found) = LAST_GAPS.with_borrow(|last| {
        last.as_ref()
            .filter(|(k, _)| *k == key)
            .map(|(_, gaps)| *gaps)
    }) {
        return found;
    }
    let (schedule, tz, policy) = calendar_of(Some(&key.0), tz, dst_gap, dst_overlap, function)?;
    let found = gaps(&schedule, tz, policy, from);
    LAST_GAPS.set(Some((key, found)));
    found
}

/// A task's schedule, zone and DST policy as its columns hold them; `None` for no schedule.
fn calendar_of(
    schedule: Option<&str>,
    tz: Option<&str>,
    dst_gap: Option<&str>,
    dst_overlap: Option<&str>,
    function: &'static str,
) -> Option<(Schedule, chrono_tz::Tz, DstPolicy)> {
    let schedule = Schedule::parse(schedule.filter(|s| !s.trim().is_empty())?).or_raise(function);
    let tz = parse_zone(required(tz, "tz", function)).or_raise(function);
    let policy = DstPolicy {
        gap: DstGap::parse(dst_gap.unwrap_or("shift")).or_raise(function),
        overlap: DstOverlap::parse(dst_overlap.unwrap_or("once")).or_raise(function),
    };
    Some((schedule, tz, policy))
}

/// The shortest time between two consecutive fires of a schedule (from now, over the fires
/// `tide._fire_gap` looks at): a role's limit `fastest_schedule` is checked against it. NULL for
/// a schedule that fires less than twice, and for no schedule.
#[pg_extern(stable, parallel_safe, schema = "tide", name = "_shortest_gap")]
fn fire_shortest_gap(
    schedule: Option<&str>,
    tz: Option<&str>,
    dst_gap: Option<&str>,
    dst_overlap: Option<&str>,
) -> Option<Interval> {
    let (shortest, _) = gaps_now(schedule, tz, dst_gap, dst_overlap, "tide._shortest_gap")?;
    Interval::new(0, 0, shortest.num_microseconds().unwrap_or(i64::MAX)).ok()
}

/// The first fire of a cron schedule in time zone `tz` strictly after `after`: when a
/// heartbeat check with a schedule expects its next beat. Bad input is refused like
/// `tide.schedule` refuses it.
#[pg_extern(stable, parallel_safe, schema = "tide", name = "_next_fire")]
fn next_fire(
    schedule: Option<&str>,
    tz: Option<&str>,
    after: Option<TimestampWithTimeZone>,
) -> Option<TimestampWithTimeZone> {
    const F: &str = "tide.check";
    let schedule = Schedule::parse(required(schedule, "schedule", F)).or_raise(F);
    let tz = parse_zone(required(tz, "tz", F)).or_raise(F);
    let after = from_pg(required(after, "after", F), "after").or_raise(F);
    fire_iter(&schedule, tz, DstPolicy::default(), after)
        .next()
        .map(to_pg)
}

/// Queues whose last external claim is remembered; beyond, the oldest is forgotten (its cause
/// then reads "none since the server started").
const QUEUES: usize = 256;
const NAME: usize = 64;

#[derive(Copy, Clone)]
#[repr(C)]
pub struct Claims {
    db: [u32; QUEUES],
    len: [u8; QUEUES],
    name: [[u8; NAME]; QUEUES],
    /// TimestampTz of the latest claim; 0: an empty entry.
    at: [i64; QUEUES],
}

impl Default for Claims {
    fn default() -> Self {
        Claims {
            db: [0; QUEUES],
            len: [0; QUEUES],
            name: [[0; NAME]; QUEUES],
            at: [0; QUEUES],
        }
    }
}

impl Claims {
    fn find(&self, db: u32, queue: &[u8]) -> Option<usize> {
        (0..QUEUES).find(|&i| {
            self.at[i] != 0
                && self.db[i] == db
                && &self.name[i][..usize::from(self.len[i])] == queue
        })
    }
}

// SAFETY: plain data, shared across processes under the LWLock.
unsafe impl PGRXSharedMemory for Claims {}

// SAFETY: the name is unique to pg_tide.
static CLAIMS: PgLwLock<Claims> = unsafe { PgLwLock::new(c"pg_tide_queue_claims") };

/// Requests and sets up the shared table (from `_PG_init` while preloading).
#[allow(unexpected_cfgs)]
pub fn init_shared() {
    pgrx::pg_shmem_init!(CLAIMS);
}

/// An external worker claimed from `queue` (called by `tide._claim`, whatever it found).
#[pg_extern(volatile, parallel_unsafe, schema = "tide", name = "_queue_claimed")]
fn queue_claimed(queue: &str) {
    let bytes = queue.as_bytes();
    if bytes.len() >= NAME {
        return;
    }
    // SAFETY: reads the clock and this backend's database id.
    let (now, db) = unsafe {
        (
            pg_sys::GetCurrentTimestamp(),
            u32::from(pg_sys::MyDatabaseId),
        )
    };
    // Noted at most once a second per queue (the cause speaks of the last minute): most claims
    // only read, under the shared lock, and busy workers do not queue on the exclusive one.
    let seen = {
        let claims = CLAIMS.share();
        claims.find(db, bytes).map(|i| claims.at[i])
    };
    if seen.is_some_and(|at| now - at < 1_000_000) {
        return;
    }
    let mut claims = CLAIMS.exclusive();
    let i = claims.find(db, bytes).unwrap_or_else(|| {
        // A free entry, else the one claimed from longest ago.
        (0..QUEUES).min_by_key(|&i| claims.at[i]).unwrap_or(0)
    });
    claims.db[i] = db;
    claims.len[i] = bytes.len() as u8;
    claims.name[i] = [0; NAME];
    claims.name[i][..bytes.len()].copy_from_slice(bytes);
    claims.at[i] = now;
}

/// When an external worker last claimed from `queue` in this database, since the server
/// started (NULL: not since, or forgotten).
#[pg_extern(
    volatile,
    parallel_restricted,
    schema = "tide",
    name = "_queue_claimed_at"
)]
fn queue_claimed_at(queue: &str) -> Option<TimestampWithTimeZone> {
    // SAFETY: reads this backend's database id.
    let db = u32::from(unsafe { pg_sys::MyDatabaseId });
    let claims = CLAIMS.share();
    let i = claims.find(db, queue.as_bytes())?;
    TimestampWithTimeZone::try_from(claims.at[i]).ok()
}

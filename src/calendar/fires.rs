//! Fire times: the instants at which a schedule fires in a zone under a DST policy.
//!
//! The walk goes through matching *wall-clock* times in order and resolves each one:
//! - one instant: it fires then;
//! - no instant (spring-forward gap): a fixed-time job with `dst_gap = shift` fires at the
//!   first instant after the gap; otherwise the time is skipped;
//! - two instants (fall-back overlap): the earlier always fires; the later fires for interval
//!   jobs and for fixed-time jobs with `dst_overlap = both`.
//!
//! Inside an overlap the wall clock runs twice, so instants do not come out in wall-clock
//! order: every first occurrence in the overlap precedes every second occurrence. Second
//! occurrences are therefore held back until a later instant proves nothing earlier can come.

use std::collections::VecDeque;

use chrono::{DateTime, Duration, LocalResult, NaiveDateTime, Timelike, Utc};
use chrono_tz::Tz;

use super::zone::{gap_end, overlap_len, resolve, to_local};
use super::{DstGap, DstOverlap, DstPolicy, Schedule};

/// A lazy, strictly increasing sequence of fire instants after a given instant.
pub struct FireIter<'a> {
    schedule: &'a Schedule,
    tz: Tz,
    policy: DstPolicy,
    after: DateTime<Utc>,
    cursor: NaiveDateTime,
    inclusive: bool,
    /// Instants that are certain to come next, in order.
    ready: VecDeque<DateTime<Utc>>,
    /// Second occurrences inside an overlap, waiting for the first occurrences to pass.
    held: VecDeque<DateTime<Utc>>,
    last: Option<DateTime<Utc>>,
    exhausted: bool,
}

/// Fire instants strictly after `after`.
pub fn fire_iter(
    schedule: &Schedule,
    tz: Tz,
    policy: DstPolicy,
    after: DateTime<Utc>,
) -> FireIter<'_> {
    let local = to_local(tz, after).with_nanosecond(0).unwrap_or_default();
    // If `after` is the first pass through an overlap, wall-clock times up to one overlap
    // length earlier still have their second occurrence ahead of `after`.
    let cursor = local - overlap_len(tz, local);
    FireIter {
        schedule,
        tz,
        policy,
        after,
        cursor,
        inclusive: true,
        ready: VecDeque::new(),
        held: VecDeque::new(),
        last: None,
        exhausted: false,
    }
}

/// The first `n` fire instants strictly after `after`.
pub fn next_fires(
    schedule: &Schedule,
    tz: Tz,
    policy: DstPolicy,
    after: DateTime<Utc>,
    n: usize,
) -> Vec<DateTime<Utc>> {
    fire_iter(schedule, tz, policy, after).take(n).collect()
}

/// The last fire instant strictly before `before`, if the schedule fired in the 400 years
/// before it. Searches backwards by doubling a look-back span, so a frequent schedule costs a
/// few fires and a yearly one a few dozen steps.
pub fn previous_fire(
    schedule: &Schedule,
    tz: Tz,
    policy: DstPolicy,
    before: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let limit = Duration::days(400 * 366);
    let mut span = Duration::seconds(1);
    loop {
        let from = before - span;
        let found = fire_iter(schedule, tz, policy, from)
            .take_while(|t| *t < before)
            .last();
        if found.is_some() {
            return found;
        }
        if span >= limit {
            return None;
        }
        span = (span * 2).min(limit);
    }
}

impl FireIter<'_> {
    fn push(&mut self, t: DateTime<Utc>) {
        if t <= self.after || self.last.is_some_and(|l| t <= l) {
            return;
        }
        self.last = Some(t);
        self.ready.push_back(t);
    }

    /// Releases held second occurrences that come before `t`.
    fn release_held_before(&mut self, t: DateTime<Utc>) {
        while self.held.front().is_some_and(|h| *h < t) {
            if let Some(h) = self.held.pop_front() {
                self.push(h);
            }
        }
    }

    fn release_all_held(&mut self) {
        while let Some(h) = self.held.pop_front() {
            self.push(h);
        }
    }

    /// Resolves the next matching wall-clock time into `ready`/`held`.
    fn advance(&mut self) {
        let Some(local) = self.schedule.next_match(self.cursor, self.inclusive) else {
            self.exhausted = true;
            self.release_all_held();
            return;
        };
        self.cursor = local;
        self.inclusive = false;
        let fixed = self.schedule.is_fixed_time();
        match resolve(self.tz, local) {
            LocalResult::Single(t) => {
                self.release_held_before(t);
                self.push(t);
            }
            LocalResult::Ambiguous(first, second) => {
                self.release_held_before(first);
                self.push(first);
                let fires_twice = !fixed || self.policy.overlap == DstOverlap::Both;
                if fires_twice && second > self.after {
                    self.held.push_back(second);
                }
            }
            LocalResult::None => {
                if fixed && self.policy.gap == DstGap::Shift {
                    let t = gap_end(self.tz, local);
                    self.release_held_before(t);
                    self.push(t);
                }
            }
        }
    }
}

impl Iterator for FireIter<'_> {
    type Item = DateTime<Utc>;

    fn next(&mut self) -> Option<DateTime<Utc>> {
        loop {
            if let Some(t) = self.ready.pop_front() {
                return Some(t);
            }
            if self.exhausted {
                return None;
            }
            self.advance();
        }
    }
}

/// The shortest and the longest time between two consecutive fires after `from`, in one walk
/// over up to 1000 fires or 400 days, whichever ends first (and always at least two fires). The
/// longest is what a task's silence may normally reach, weekends, month ends and DST changes
/// included (the base of its `max_silence`); the shortest, how often it fires at its fastest (a
/// role's limit `fastest_schedule`). `None` if it fires less than twice.
pub fn gaps(
    schedule: &Schedule,
    tz: Tz,
    policy: DstPolicy,
    from: DateTime<Utc>,
) -> Option<(Duration, Duration)> {
    let horizon = from + Duration::days(400);
    let mut fires = fire_iter(schedule, tz, policy, from);
    let mut previous = fires.next()?;
    let mut found: Option<(Duration, Duration)> = None;
    for (seen, fire) in fires.enumerate() {
        let gap = fire - previous;
        found = Some(found.map_or((gap, gap), |(s, l)| (s.min(gap), l.max(gap))));
        previous = fire;
        if seen >= 1000 || fire > horizon {
            break;
        }
    }
    found
}

//! Time zones: parsing IANA names and turning wall-clock times into instants.

use chrono::{DateTime, Duration, LocalResult, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;

use crate::base::error::TideError;

/// The longest zone name accepted: the longest IANA name is 32 characters.
pub const MAX_ZONE_LEN: usize = 64;

/// Parses an IANA zone name. Case is ignored, as PostgreSQL ignores it; the canonical
/// spelling is returned through `Tz::name()`. A name longer than any zone's is refused before
/// anything else looks at it (the typo hint compares a name with every zone).
pub fn parse_zone(name: &str) -> Result<Tz, TideError> {
    crate::base::error::check_len("tz", name, MAX_ZONE_LEN)?;
    let trimmed = name.trim();
    trimmed
        .parse::<Tz>()
        .or_else(|_| Tz::from_str_insensitive(trimmed))
        .map_err(|_| TideError::UnknownZone {
            name: name.to_string(),
            suggestion: parse_zone_suggestion(name),
        })
}

/// The closest real zone name to a misspelt one, if one is close enough to be a typo.
pub fn parse_zone_suggestion(name: &str) -> Option<&'static str> {
    if name.chars().count() > MAX_ZONE_LEN {
        return None;
    }
    let wanted = name.trim().to_ascii_lowercase();
    chrono_tz::TZ_VARIANTS
        .iter()
        .map(|tz| {
            (
                edit_distance(&wanted, &tz.name().to_ascii_lowercase()),
                tz.name(),
            )
        })
        .filter(|(d, _)| *d <= 3)
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = substitution.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The wall-clock time of an instant in a zone.
pub fn to_local(tz: Tz, instant: DateTime<Utc>) -> NaiveDateTime {
    instant.with_timezone(&tz).naive_local()
}

/// The instants a wall-clock time denotes: none (in a gap), one, or two (in an overlap,
/// earlier first).
pub(crate) fn resolve(tz: Tz, local: NaiveDateTime) -> LocalResult<DateTime<Utc>> {
    match tz.from_local_datetime(&local) {
        LocalResult::Single(t) => LocalResult::Single(t.with_timezone(&Utc)),
        LocalResult::Ambiguous(a, b) => {
            let (a, b) = (a.with_timezone(&Utc), b.with_timezone(&Utc));
            if a <= b {
                LocalResult::Ambiguous(a, b)
            } else {
                LocalResult::Ambiguous(b, a)
            }
        }
        LocalResult::None => LocalResult::None,
    }
}

/// The first instant after the gap that contains the non-existent wall-clock time `local`:
/// the moment the clocks jumped. Found by bisection on the instants around `local`, so it needs
/// no knowledge of the zone's rules.
pub(crate) fn gap_end(tz: Tz, local: NaiveDateTime) -> DateTime<Utc> {
    // Every real offset lies within -12h..+14h; widen a little for historical oddities.
    let naive_as_utc = Utc.from_utc_datetime(&local);
    let mut lo = naive_as_utc - Duration::hours(16); // local(lo) < local
    let mut hi = naive_as_utc + Duration::hours(16); // local(hi) > local
    while hi - lo > Duration::seconds(1) {
        let mid = lo + (hi - lo) / 2;
        if to_local(tz, mid) > local {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    // Transitions fall on whole seconds; `hi` is the first second whose wall clock is past.
    hi
}

/// The length of the overlap that an ambiguous wall-clock time sits in (its two instants
/// apart), or zero when the time is not ambiguous.
pub(crate) fn overlap_len(tz: Tz, local: NaiveDateTime) -> Duration {
    match resolve(tz, local) {
        LocalResult::Ambiguous(a, b) => b - a,
        _ => Duration::zero(),
    }
}

/// The first instant at or after which the wall clock reads `local`: the earlier of two in an
/// overlap, the end of the gap for a time that does not exist.
pub fn zone_instant(tz: Tz, local: NaiveDateTime) -> DateTime<Utc> {
    match resolve(tz, local) {
        LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => t,
        LocalResult::None => gap_end(tz, local),
    }
}

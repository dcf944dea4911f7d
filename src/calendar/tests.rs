//! Table-driven tests of the calendar. Every expected value was derived by hand from the
//! calendar and the zone rules (cross-checked with `zdump -v -c 2026,2027 ZONE`), never
//! copied from the code's output. The zone facts used:
//! - America/New_York 2026: EST (-5) until Sun Mar 8 02:00 -> 03:00 EDT (-4) at 07:00Z;
//!   back on Sun Nov 1 02:00 EDT -> 01:00 EST at 06:00Z (01:00-02:00 happens twice).
//! - Europe/London 2026: Sun Mar 29 01:00 GMT -> 02:00 BST at 01:00Z; Sun Oct 25 02:00 BST ->
//!   01:00 GMT at 01:00Z.
//! - Australia/Lord_Howe 2026 (30-minute shift): Sun Apr 5 02:00 (+11) -> 01:30 (+10:30) at
//!   Apr 4 15:00Z; Sun Oct 4 02:00 (+10:30) -> 02:30 (+11) at Oct 3 15:30Z.
//! - America/Havana 2026 (transitions at midnight): Sun Mar 8 00:00 CST -> 01:00 CDT at 05:00Z;
//!   Sun Nov 1 01:00 CDT -> 00:00 CST at 05:00Z.
//! - Asia/Shanghai: +8 all year.
//! - 2026-01-01 is a Thursday; 2028 is a leap year, 2100 is not.

use chrono::{DateTime, NaiveDate, Utc};

use super::*;
use crate::base::error::TideError;

const SHIFT_ONCE: DstPolicy = DstPolicy {
    gap: DstGap::Shift,
    overlap: DstOverlap::Once,
};
const SKIP_BOTH: DstPolicy = DstPolicy {
    gap: DstGap::Skip,
    overlap: DstOverlap::Both,
};
const SKIP_ONCE: DstPolicy = DstPolicy {
    gap: DstGap::Skip,
    overlap: DstOverlap::Once,
};
const SHIFT_BOTH: DstPolicy = DstPolicy {
    gap: DstGap::Shift,
    overlap: DstOverlap::Both,
};

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("bad instant {s}: {e}"))
        .with_timezone(&Utc)
}

fn fmt(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn fires(expr: &str, zone: &str, after: &str, policy: DstPolicy, n: usize) -> Vec<String> {
    let schedule = Schedule::parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    let tz = parse_zone(zone).unwrap_or_else(|e| panic!("{zone}: {e}"));
    next_fires(&schedule, tz, policy, at(after), n)
        .into_iter()
        .map(fmt)
        .collect()
}

struct FireCase {
    what: &'static str,
    expr: &'static str,
    zone: &'static str,
    after: &'static str,
    policy: DstPolicy,
    expect: &'static [&'static str],
}

const fn case(
    what: &'static str,
    expr: &'static str,
    zone: &'static str,
    after: &'static str,
    policy: DstPolicy,
    expect: &'static [&'static str],
) -> FireCase {
    FireCase {
        what,
        expr,
        zone,
        after,
        policy,
        expect,
    }
}

const FIRE_CASES: &[FireCase] = &[
    // --- New York: the examples the issue requires -------------------------------------
    case(
        "NY fixed 02:30 in the spring gap shifts to 03:00 EDT",
        "30 2 * * *",
        "America/New_York",
        "2026-03-07T12:00:00Z",
        SHIFT_ONCE,
        &["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"],
    ),
    case(
        "NY fixed 02:30 in the spring gap, dst_gap skip",
        "30 2 * * *",
        "America/New_York",
        "2026-03-07T12:00:00Z",
        SKIP_ONCE,
        &["2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"],
    ),
    case(
        "NY fixed 01:30 in the fall overlap fires once, at EDT",
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T12:00:00Z",
        SHIFT_ONCE,
        &["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"],
    ),
    case(
        "NY fixed 01:30 in the fall overlap, dst_overlap both",
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T12:00:00Z",
        SHIFT_BOTH,
        &[
            "2026-11-01T05:30:00Z",
            "2026-11-01T06:30:00Z",
            "2026-11-02T06:30:00Z",
        ],
    ),
    case(
        "NY hourly fires at 01:00 EDT and 01:00 EST",
        "0 * * * *",
        "America/New_York",
        "2026-11-01T04:30:00Z",
        SHIFT_ONCE,
        &[
            "2026-11-01T05:00:00Z",
            "2026-11-01T06:00:00Z",
            "2026-11-01T07:00:00Z",
        ],
    ),
    case(
        "NY hourly skips the 02:00 that does not exist",
        "0 * * * *",
        "America/New_York",
        "2026-03-08T05:30:00Z",
        SHIFT_ONCE,
        &[
            "2026-03-08T06:00:00Z",
            "2026-03-08T07:00:00Z",
            "2026-03-08T08:00:00Z",
        ],
    ),
    case(
        "NY half-hourly in the overlap: both passes, in time order",
        "*/30 1 * * *",
        "America/New_York",
        "2026-11-01T04:00:00Z",
        SHIFT_ONCE,
        &[
            "2026-11-01T05:00:00Z",
            "2026-11-01T05:30:00Z",
            "2026-11-01T06:00:00Z",
            "2026-11-01T06:30:00Z",
            "2026-11-02T06:00:00Z",
        ],
    ),
    case(
        "NY starting inside the first pass of the overlap",
        "*/30 1 * * *",
        "America/New_York",
        "2026-11-01T05:15:00Z",
        SHIFT_ONCE,
        &[
            "2026-11-01T05:30:00Z",
            "2026-11-01T06:00:00Z",
            "2026-11-01T06:30:00Z",
            "2026-11-02T06:00:00Z",
        ],
    ),
    case(
        "NY starting inside the second pass of the overlap",
        "*/30 1 * * *",
        "America/New_York",
        "2026-11-01T06:15:00Z",
        SHIFT_ONCE,
        &[
            "2026-11-01T06:30:00Z",
            "2026-11-02T06:00:00Z",
            "2026-11-02T06:30:00Z",
        ],
    ),
    case(
        "NY fixed 01:30 after its first pass, once: nothing more that day",
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T05:45:00Z",
        SHIFT_ONCE,
        &["2026-11-02T06:30:00Z"],
    ),
    case(
        "NY fixed 01:30 after its first pass, both: the EST pass still comes",
        "30 1 * * *",
        "America/New_York",
        "2026-11-01T05:45:00Z",
        SHIFT_BOTH,
        &["2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"],
    ),
    case(
        "NY fixed 02:00 (start of the gap) shifts to 03:00 EDT",
        "0 2 * * *",
        "America/New_York",
        "2026-03-07T12:00:00Z",
        SHIFT_ONCE,
        &["2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z"],
    ),
    case(
        "NY fixed 02:59 (end of the gap) shifts to 03:00 EDT",
        "59 2 * * *",
        "America/New_York",
        "2026-03-07T12:00:00Z",
        SHIFT_ONCE,
        &["2026-03-08T07:00:00Z", "2026-03-09T06:59:00Z"],
    ),
    case(
        "NY fixed 03:00 exists on the gap day",
        "0 3 * * *",
        "America/New_York",
        "2026-03-07T12:00:00Z",
        SHIFT_ONCE,
        &["2026-03-08T07:00:00Z", "2026-03-09T07:00:00Z"],
    ),
    case(
        "NY six-field fixed 02:00:30 shifts to the gap's end",
        "30 0 2 * * *",
        "America/New_York",
        "2026-03-07T12:00:00Z",
        SHIFT_ONCE,
        &["2026-03-08T07:00:00Z", "2026-03-09T06:00:30Z"],
    ),
    case(
        "NY every 6 hours is wall-clock aligned, not from process start",
        "0 */6 * * *",
        "America/New_York",
        "2026-01-01T00:00:00Z",
        SHIFT_ONCE,
        &[
            "2026-01-01T05:00:00Z",
            "2026-01-01T11:00:00Z",
            "2026-01-01T17:00:00Z",
        ],
    ),
    case(
        "NY midnight across the fall back",
        "0 0 * * *",
        "America/New_York",
        "2026-10-31T12:00:00Z",
        SHIFT_ONCE,
        &["2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"],
    ),
    case(
        "NY fixed 01:30 on the fall day with skip/both policy",
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T12:00:00Z",
        SKIP_BOTH,
        &[
            "2026-11-01T05:30:00Z",
            "2026-11-01T06:30:00Z",
            "2026-11-02T06:30:00Z",
        ],
    ),
    // --- London ---------------------------------------------------------------------------
    case(
        "London fixed 01:30 in the spring gap shifts to 02:00 BST",
        "30 1 * * *",
        "Europe/London",
        "2026-03-28T12:00:00Z",
        SHIFT_ONCE,
        &["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"],
    ),
    case(
        "London fixed 01:30 in the spring gap, skip",
        "30 1 * * *",
        "Europe/London",
        "2026-03-28T12:00:00Z",
        SKIP_ONCE,
        &["2026-03-30T00:30:00Z", "2026-03-31T00:30:00Z"],
    ),
    case(
        "London fixed 01:30 in the fall overlap, once",
        "30 1 * * *",
        "Europe/London",
        "2026-10-24T12:00:00Z",
        SHIFT_ONCE,
        &["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
    ),
    case(
        "London fixed 01:30 in the fall overlap, both",
        "30 1 * * *",
        "Europe/London",
        "2026-10-24T12:00:00Z",
        SHIFT_BOTH,
        &[
            "2026-10-25T00:30:00Z",
            "2026-10-25T01:30:00Z",
            "2026-10-26T01:30:00Z",
        ],
    ),
    case(
        "London weekdays 09:00 across the fall back",
        "0 9 * * 1-5",
        "Europe/London",
        "2026-10-23T12:00:00Z",
        SHIFT_ONCE,
        &["2026-10-26T09:00:00Z", "2026-10-27T09:00:00Z"],
    ),
    case(
        "London every 20 minutes skips the missing hour",
        "*/20 * * * *",
        "Europe/London",
        "2026-03-29T00:30:00Z",
        SHIFT_ONCE,
        &[
            "2026-03-29T00:40:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-29T01:20:00Z",
        ],
    ),
    // --- Lord Howe: a 30-minute shift -------------------------------------------------------
    case(
        "Lord Howe fixed 02:15 in the 30-minute gap shifts to 02:30",
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T00:00:00Z",
        SHIFT_ONCE,
        &["2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"],
    ),
    case(
        "Lord Howe fixed 02:15 in the gap, skip",
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-03T00:00:00Z",
        SKIP_ONCE,
        &["2026-10-04T15:15:00Z", "2026-10-05T15:15:00Z"],
    ),
    case(
        "Lord Howe fixed 01:45 in the 30-minute overlap, once",
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T00:00:00Z",
        SHIFT_ONCE,
        &["2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"],
    ),
    case(
        "Lord Howe fixed 01:45 in the 30-minute overlap, both",
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-04T00:00:00Z",
        SHIFT_BOTH,
        &[
            "2026-04-04T14:45:00Z",
            "2026-04-04T15:15:00Z",
            "2026-04-05T15:15:00Z",
        ],
    ),
    case(
        "Lord Howe hourly over the fall back: 01:00 to 02:00 is 90 minutes",
        "0 * * * *",
        "Australia/Lord_Howe",
        "2026-04-04T13:30:00Z",
        SHIFT_ONCE,
        &[
            "2026-04-04T14:00:00Z",
            "2026-04-04T15:30:00Z",
            "2026-04-04T16:30:00Z",
        ],
    ),
    case(
        "Lord Howe half-hourly: 01:30 happens twice",
        "*/30 * * * *",
        "Australia/Lord_Howe",
        "2026-04-04T13:45:00Z",
        SHIFT_ONCE,
        &[
            "2026-04-04T14:00:00Z",
            "2026-04-04T14:30:00Z",
            "2026-04-04T15:00:00Z",
            "2026-04-04T15:30:00Z",
        ],
    ),
    case(
        "Lord Howe hourly over the spring gap skips 02:00",
        "0 * * * *",
        "Australia/Lord_Howe",
        "2026-10-03T14:00:00Z",
        SHIFT_ONCE,
        &["2026-10-03T14:30:00Z", "2026-10-03T16:00:00Z"],
    ),
    // --- Havana: DST changes at midnight ------------------------------------------------------
    case(
        "Havana midnight does not exist on Mar 8: shifted to 01:00 CDT",
        "0 0 * * *",
        "America/Havana",
        "2026-03-07T12:00:00Z",
        SHIFT_ONCE,
        &["2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z"],
    ),
    case(
        "Havana midnight happens twice on Nov 1, once",
        "0 0 * * *",
        "America/Havana",
        "2026-10-31T12:00:00Z",
        SHIFT_ONCE,
        &["2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"],
    ),
    // --- Shanghai -----------------------------------------------------------------------------
    case(
        "Shanghai daily 01:00 bill run",
        "0 1 * * *",
        "Asia/Shanghai",
        "2026-05-09T12:00:00Z",
        SHIFT_ONCE,
        &["2026-05-09T17:00:00Z", "2026-05-10T17:00:00Z"],
    ),
    case(
        "Shanghai @daily is local midnight",
        "@daily",
        "Asia/Shanghai",
        "2026-05-09T12:00:00Z",
        SHIFT_ONCE,
        &["2026-05-09T16:00:00Z", "2026-05-10T16:00:00Z"],
    ),
    // --- Month ends and leap years ----------------------------------------------------------
    case(
        "L: last day of each month",
        "0 0 L * *",
        "UTC",
        "2026-01-15T00:00:00Z",
        SHIFT_ONCE,
        &[
            "2026-01-31T00:00:00Z",
            "2026-02-28T00:00:00Z",
            "2026-03-31T00:00:00Z",
            "2026-04-30T00:00:00Z",
        ],
    ),
    case(
        "L: February 29 in a leap year",
        "0 0 L * *",
        "UTC",
        "2028-01-31T00:00:00Z",
        SHIFT_ONCE,
        &["2028-02-29T00:00:00Z", "2028-03-31T00:00:00Z"],
    ),
    case(
        "29 February fires only in leap years",
        "0 0 29 2 *",
        "UTC",
        "2026-01-01T00:00:00Z",
        SHIFT_ONCE,
        &["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"],
    ),
    case(
        "29 February skips 2100, which is not a leap year",
        "0 0 29 2 *",
        "UTC",
        "2096-03-01T00:00:00Z",
        SHIFT_ONCE,
        &["2104-02-29T00:00:00Z"],
    ),
    case(
        "day 31 skips the short months",
        "0 0 31 * *",
        "UTC",
        "2026-01-31T12:00:00Z",
        SHIFT_ONCE,
        &[
            "2026-03-31T00:00:00Z",
            "2026-05-31T00:00:00Z",
            "2026-07-31T00:00:00Z",
            "2026-08-31T00:00:00Z",
        ],
    ),
    case(
        "day 30 skips February",
        "0 0 30 * *",
        "UTC",
        "2026-01-30T12:00:00Z",
        SHIFT_ONCE,
        &["2026-03-30T00:00:00Z"],
    ),
    case(
        "LW: last weekday of the month",
        "0 0 LW * *",
        "UTC",
        "2026-01-01T00:00:00Z",
        SHIFT_ONCE,
        &[
            "2026-01-30T00:00:00Z",
            "2026-02-27T00:00:00Z",
            "2026-03-31T00:00:00Z",
        ],
    ),
    case(
        "15W: nearest weekday to the 15th",
        "0 0 15W * *",
        "UTC",
        "2026-07-20T00:00:00Z",
        SHIFT_ONCE,
        &["2026-08-14T00:00:00Z", "2026-09-15T00:00:00Z"],
    ),
    case(
        "15W when the 15th is a Sunday",
        "0 0 15W * *",
        "UTC",
        "2026-02-01T00:00:00Z",
        SHIFT_ONCE,
        &[
            "2026-02-16T00:00:00Z",
            "2026-03-16T00:00:00Z",
            "2026-04-15T00:00:00Z",
        ],
    ),
    case(
        "1W never crosses into the previous month",
        "0 0 1W * *",
        "UTC",
        "2026-07-15T00:00:00Z",
        SHIFT_ONCE,
        &["2026-08-03T00:00:00Z", "2026-09-01T00:00:00Z"],
    ),
    case(
        "5#2: second Friday",
        "0 0 * * 5#2",
        "UTC",
        "2026-01-01T00:00:00Z",
        SHIFT_ONCE,
        &[
            "2026-01-09T00:00:00Z",
            "2026-02-13T00:00:00Z",
            "2026-03-13T00:00:00Z",
        ],
    ),
    case(
        "5L: last Friday",
        "0 0 * * 5L",
        "UTC",
        "2026-01-01T00:00:00Z",
        SHIFT_ONCE,
        &[
            "2026-01-30T00:00:00Z",
            "2026-02-27T00:00:00Z",
            "2026-03-27T00:00:00Z",
        ],
    ),
    case(
        "MON#1: first Monday, by name",
        "0 0 * * MON#1",
        "UTC",
        "2026-01-01T00:00:00Z",
        SHIFT_ONCE,
        &[
            "2026-01-05T00:00:00Z",
            "2026-02-02T00:00:00Z",
            "2026-03-02T00:00:00Z",
        ],
    ),
    case(
        "month-end report at 23:00 on the last day, Shanghai",
        "0 23 L * *",
        "Asia/Shanghai",
        "2026-02-01T00:00:00Z",
        SHIFT_ONCE,
        &["2026-02-28T15:00:00Z", "2026-03-31T15:00:00Z"],
    ),
    // --- Weekdays ------------------------------------------------------------------------------
    case(
        "Sunday as 0",
        "0 12 * * 0",
        "UTC",
        "2026-03-01T13:00:00Z",
        SHIFT_ONCE,
        &["2026-03-08T12:00:00Z", "2026-03-15T12:00:00Z"],
    ),
    case(
        "Sunday as 7",
        "0 12 * * 7",
        "UTC",
        "2026-03-01T13:00:00Z",
        SHIFT_ONCE,
        &["2026-03-08T12:00:00Z", "2026-03-15T12:00:00Z"],
    ),
    case(
        "Sunday as SUN",
        "0 12 * * sun",
        "UTC",
        "2026-03-01T13:00:00Z",
        SHIFT_ONCE,
        &["2026-03-08T12:00:00Z", "2026-03-15T12:00:00Z"],
    ),
    case(
        "range ending in 7 reaches Sunday",
        "0 12 * * 5-7",
        "UTC",
        "2026-03-02T00:00:00Z",
        SHIFT_ONCE,
        &[
            "2026-03-06T12:00:00Z",
            "2026-03-07T12:00:00Z",
            "2026-03-08T12:00:00Z",
        ],
    ),
    case(
        "MON-FRI by name",
        "0 9 * * MON-FRI",
        "UTC",
        "2026-01-03T00:00:00Z",
        SHIFT_ONCE,
        &["2026-01-05T09:00:00Z", "2026-01-06T09:00:00Z"],
    ),
    case(
        "day-of-month OR day-of-week when both are restricted",
        "0 0 13 * 5",
        "UTC",
        "2026-03-01T00:00:00Z",
        SHIFT_ONCE,
        &[
            "2026-03-06T00:00:00Z",
            "2026-03-13T00:00:00Z",
            "2026-03-20T00:00:00Z",
            "2026-03-27T00:00:00Z",
            "2026-04-03T00:00:00Z",
            "2026-04-10T00:00:00Z",
            "2026-04-13T00:00:00Z",
        ],
    ),
    // --- Steps, ranges, lists, names ------------------------------------------------------------
    case(
        "*/15 minutes",
        "*/15 * * * *",
        "UTC",
        "2026-01-01T00:07:00Z",
        SHIFT_ONCE,
        &[
            "2026-01-01T00:15:00Z",
            "2026-01-01T00:30:00Z",
            "2026-01-01T00:45:00Z",
            "2026-01-01T01:00:00Z",
        ],
    ),
    case(
        "a-b/n: 10-40/10",
        "10-40/10 * * * *",
        "UTC",
        "2026-01-01T00:35:00Z",
        SHIFT_ONCE,
        &[
            "2026-01-01T00:40:00Z",
            "2026-01-01T01:10:00Z",
            "2026-01-01T01:20:00Z",
        ],
    ),
    case(
        "hour list",
        "0 8,12,18 * * *",
        "UTC",
        "2026-01-01T09:00:00Z",
        SHIFT_ONCE,
        &[
            "2026-01-01T12:00:00Z",
            "2026-01-01T18:00:00Z",
            "2026-01-02T08:00:00Z",
        ],
    ),
    case(
        "month names",
        "0 0 1 JAN,JUL *",
        "UTC",
        "2026-02-01T00:00:00Z",
        SHIFT_ONCE,
        &["2026-07-01T00:00:00Z", "2027-01-01T00:00:00Z"],
    ),
    case(
        "seconds field: every 20 seconds",
        "*/20 * * * * *",
        "UTC",
        "2026-01-01T00:00:00Z",
        SHIFT_ONCE,
        &[
            "2026-01-01T00:00:20Z",
            "2026-01-01T00:00:40Z",
            "2026-01-01T00:01:00Z",
        ],
    ),
    // --- Macros ---------------------------------------------------------------------------------
    case(
        "@hourly",
        "@hourly",
        "UTC",
        "2026-01-01T00:30:00Z",
        SHIFT_ONCE,
        &["2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z"],
    ),
    case(
        "@weekly is Sunday midnight",
        "@weekly",
        "UTC",
        "2026-01-01T00:00:00Z",
        SHIFT_ONCE,
        &["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"],
    ),
    case(
        "@monthly",
        "@monthly",
        "UTC",
        "2026-01-15T00:00:00Z",
        SHIFT_ONCE,
        &["2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"],
    ),
    case(
        "@yearly",
        "@yearly",
        "UTC",
        "2026-06-01T00:00:00Z",
        SHIFT_ONCE,
        &["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"],
    ),
    case(
        "@annually",
        "@ANNUALLY",
        "UTC",
        "2026-06-01T00:00:00Z",
        SHIFT_ONCE,
        &["2027-01-01T00:00:00Z"],
    ),
    case(
        "@midnight",
        "@midnight",
        "UTC",
        "2026-01-01T12:00:00Z",
        SHIFT_ONCE,
        &["2026-01-02T00:00:00Z"],
    ),
    // --- Strictly after -------------------------------------------------------------------------
    case(
        "a fire exactly at `after` is not returned",
        "0 1 * * *",
        "UTC",
        "2026-01-01T01:00:00Z",
        SHIFT_ONCE,
        &["2026-01-02T01:00:00Z"],
    ),
    case(
        "a fraction of a second before a fire",
        "0 1 * * *",
        "UTC",
        "2026-01-01T00:59:59.5Z",
        SHIFT_ONCE,
        &["2026-01-01T01:00:00Z"],
    ),
];

#[test]
fn fire_times() {
    let mut failures = Vec::new();
    for c in FIRE_CASES {
        let got = fires(c.expr, c.zone, c.after, c.policy, c.expect.len());
        if got != c.expect {
            failures.push(format!(
                "{}: `{}` in {} after {}\n   expected {:?}\n   got      {:?}",
                c.what, c.expr, c.zone, c.after, c.expect, got
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        FIRE_CASES.len(),
        failures.join("\n")
    );
}

#[test]
fn enough_table_cases() {
    assert!(FIRE_CASES.len() + WINDOW_CASES.len() >= 60);
}

#[test]
fn fires_are_strictly_increasing_through_a_year_of_dst() {
    // Every 10 minutes through 2026 in three DST zones: no duplicates, no disorder.
    for zone in ["America/New_York", "Europe/London", "Australia/Lord_Howe"] {
        let schedule = Schedule::parse("*/10 * * * *").unwrap();
        let tz = parse_zone(zone).unwrap();
        let all: Vec<_> = fire_iter(&schedule, tz, SHIFT_ONCE, at("2026-01-01T00:00:00Z"))
            .take_while(|t| *t < at("2027-01-01T00:00:00Z"))
            .collect();
        assert!(all.windows(2).all(|w| w[0] < w[1]), "{zone}: out of order");
        // A 10-minute job fires every 10 real minutes, DST or not: 365 days * 144, minus the
        // first instant (fires are strictly after 00:00).
        assert_eq!(all.len(), 365 * 144 - 1, "{zone}");
    }
}

// --- Classification and parsing -----------------------------------------------------------------

#[test]
fn fixed_time_classification() {
    let cases = [
        ("30 2 * * *", true),
        ("0 30 2 * * *", true),
        ("@daily", true),
        ("@weekly", true),
        ("0 0 L * *", true),
        ("0 * * * *", false),
        ("@hourly", false),
        ("0 2,3 * * *", false),
        ("0 2-3 * * *", false),
        ("*/5 30 2 * * *", false),
        ("0 */6 * * *", false),
    ];
    for (expr, fixed) in cases {
        assert_eq!(
            Schedule::parse(expr).unwrap().is_fixed_time(),
            fixed,
            "{expr}"
        );
    }
}

#[test]
fn bad_cron_is_refused_with_the_expression_named() {
    for expr in [
        "",
        "   ",
        "* * * *",
        "0 0 1 1 * * 2030",
        "61 * * * *",
        "0 24 * * *",
        "0 0 32 * *",
        "0 0 * 13 *",
        "0 0 * * 8",
        "0/10 * * * *",
        "every day",
    ] {
        match Schedule::parse(expr) {
            Err(e @ TideError::BadCron { .. }) => {
                assert!(e.to_string().contains(&format!("\"{expr}\"")), "{e}");
                assert_eq!(
                    e.sqlstate(),
                    crate::base::error::SqlState::InvalidParameterValue
                );
            }
            other => panic!("{expr:?} should be a bad cron, got {other:?}"),
        }
    }
}

// --- pg_cron's dialect: 'N seconds', $ and @reboot --------------------------------------------

#[test]
fn seconds_intervals_fire_every_n_seconds_counted_from_the_epoch() {
    // 2026-03-08T06:59:50Z is a multiple of 10 s and of 5 s; 07:00:00Z is New York's
    // spring-forward instant (02:00 EST -> 03:00 EDT): an interval job has no fixed wall time,
    // so it runs on through the change every N seconds of the local wall clock.
    assert_eq!(
        fires("10 seconds", "UTC", "2026-03-08T06:59:50Z", SHIFT_ONCE, 3),
        [
            "2026-03-08T07:00:00Z",
            "2026-03-08T07:00:10Z",
            "2026-03-08T07:00:20Z"
        ]
    );
    // Any case and spacing pg_cron accepts; 7 does not divide a minute, and the spacing stays 7
    // across the minute (a cron '*/7' field would fire at :00 after :56, 4 seconds later):
    // 2026-01-01T00:00:00Z = 1_767_225_600 s = 7 x 252_460_800, so the multiples of 7 after
    // 00:00:50 are :56, then 01:03 and 01:10.
    assert_eq!(
        fires("  7 SECONDS ", "UTC", "2026-01-01T00:00:50Z", SHIFT_ONCE, 3),
        [
            "2026-01-01T00:00:56Z",
            "2026-01-01T00:01:03Z",
            "2026-01-01T00:01:10Z"
        ]
    );
    assert_eq!(
        fires(
            "1 second",
            "Asia/Shanghai",
            "2026-01-01T00:00:00Z",
            SHIFT_ONCE,
            2
        ),
        ["2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z"]
    );
    assert_eq!(
        fires("30seconds", "UTC", "2026-01-01T00:00:00Z", SHIFT_ONCE, 1),
        ["2026-01-01T00:00:30Z"]
    );
    assert!(!Schedule::parse("5 seconds").unwrap().is_fixed_time());
    for expr in [
        "0 seconds",
        "60 seconds",
        "90 SECONDS",
        "99999999999999999999 seconds",
    ] {
        match Schedule::parse(expr) {
            Err(e @ TideError::BadSecondsInterval(_)) => {
                assert!(e.to_string().contains(&format!("\"{expr}\"")), "{e}");
                assert!(e.hint().contains("59 seconds"), "{}", e.hint());
            }
            other => panic!("{expr:?} should be refused, got {other:?}"),
        }
    }
    // Not an interval: refused as a cron expression.
    assert!(matches!(
        Schedule::parse("5 minutes"),
        Err(TideError::BadCron { .. })
    ));
    assert!(matches!(
        Schedule::parse("seconds"),
        Err(TideError::BadCron { .. })
    ));
}

#[test]
fn dollar_is_the_last_day_of_the_month() {
    // 2026: January has 31 days, February 28; 2028 is a leap year.
    assert_eq!(
        fires("0 23 $ * *", "UTC", "2026-01-15T00:00:00Z", SHIFT_ONCE, 3),
        [
            "2026-01-31T23:00:00Z",
            "2026-02-28T23:00:00Z",
            "2026-03-31T23:00:00Z"
        ]
    );
    assert_eq!(
        fires("0 0 6 $ 2 *", "UTC", "2028-02-01T00:00:00Z", SHIFT_ONCE, 1),
        ["2028-02-29T06:00:00Z"]
    );
    assert!(Schedule::parse("0 23 $ * *").unwrap().is_fixed_time());
}

#[test]
fn reboot_is_refused_with_a_hint() {
    for expr in ["@reboot", "@REBOOT"] {
        let e = Schedule::parse(expr).unwrap_err();
        assert_eq!(e, TideError::Reboot(expr.to_string()));
        assert!(e.to_string().contains("server start"), "{e}");
        assert!(e.hint().contains("tide.emit"), "{}", e.hint());
        assert_eq!(
            e.sqlstate(),
            crate::base::error::SqlState::InvalidParameterValue
        );
    }
}

#[test]
fn cron_that_never_fires_is_refused() {
    for expr in ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6,9,11 *"] {
        assert_eq!(
            Schedule::parse(expr).unwrap_err(),
            TideError::NeverFires(expr.to_string()),
            "{expr}"
        );
    }
    // A date that exists only in leap years does fire.
    assert!(Schedule::parse("0 0 29 2 *").is_ok());
}

#[test]
fn zones_parse_case_insensitively_and_typos_are_refused() {
    assert_eq!(parse_zone("Asia/Shanghai").unwrap().name(), "Asia/Shanghai");
    assert_eq!(parse_zone("asia/shanghai").unwrap().name(), "Asia/Shanghai");
    assert_eq!(parse_zone("utc").unwrap().name(), "UTC");
    assert_eq!(
        parse_zone("Asia/Shangai").unwrap_err(),
        TideError::UnknownZone {
            name: "Asia/Shangai".into(),
            suggestion: Some("Asia/Shanghai")
        }
    );
    // The hint names the real zone; with none close enough, where to look.
    let hint = parse_zone("Asia/Shangai").unwrap_err().hint();
    assert!(hint.contains("did you mean 'Asia/Shanghai'?"), "{hint}");
    let hint = parse_zone("Mars/Olympus_Mons").unwrap_err().hint();
    assert!(hint.contains("pg_timezone_names"), "{hint}");
    assert_eq!(
        super::zone::parse_zone_suggestion("Asia/Shangai"),
        Some("Asia/Shanghai")
    );
    assert_eq!(super::zone::parse_zone_suggestion("Nowhere/Atlantis"), None);
}

#[test]
fn policy_and_window_names() {
    assert_eq!(DstGap::parse("SKIP").unwrap(), DstGap::Skip);
    assert_eq!(DstOverlap::parse("both").unwrap(), DstOverlap::Both);
    assert_eq!(WindowKind::parse("Month").unwrap(), WindowKind::Month);
    for bad in ["", "daily", "fortnight"] {
        assert!(matches!(
            WindowKind::parse(bad),
            Err(TideError::UnknownOption {
                option: "biz_window",
                ..
            })
        ));
    }
    assert!(matches!(
        DstGap::parse("later"),
        Err(TideError::UnknownOption {
            option: "dst_gap",
            ..
        })
    ));
    assert!(matches!(
        DstOverlap::parse("twice"),
        Err(TideError::UnknownOption {
            option: "dst_overlap",
            ..
        })
    ));
}

// --- Previous fires -------------------------------------------------------------------------------

#[test]
fn previous_fire_finds_the_last_fire_strictly_before() {
    let tz = parse_zone("America/New_York").unwrap();
    let hourly = Schedule::parse("0 * * * *").unwrap();
    // Back across the overlap: 02:00 EST (07:00Z) <- 01:00 EST (06:00Z) <- 01:00 EDT (05:00Z).
    assert_eq!(
        previous_fire(&hourly, tz, SHIFT_ONCE, at("2026-11-01T07:00:00Z")),
        Some(at("2026-11-01T06:00:00Z"))
    );
    assert_eq!(
        previous_fire(&hourly, tz, SHIFT_ONCE, at("2026-11-01T06:00:00Z")),
        Some(at("2026-11-01T05:00:00Z"))
    );
    let leap = Schedule::parse("0 0 29 2 *").unwrap();
    assert_eq!(
        previous_fire(
            &leap,
            chrono_tz::UTC,
            SHIFT_ONCE,
            at("2028-02-29T00:00:00Z")
        ),
        Some(at("2024-02-29T00:00:00Z"))
    );
}

// --- Business windows -----------------------------------------------------------------------------

struct WindowCase {
    what: &'static str,
    expr: &'static str,
    zone: &'static str,
    kind: WindowKind,
    fire: &'static str,
    start: &'static str,
    end: &'static str,
    biz_date: &'static str,
}

#[allow(clippy::too_many_arguments)]
const fn wcase(
    what: &'static str,
    expr: &'static str,
    zone: &'static str,
    kind: WindowKind,
    fire: &'static str,
    start: &'static str,
    end: &'static str,
    biz_date: &'static str,
) -> WindowCase {
    WindowCase {
        what,
        expr,
        zone,
        kind,
        fire,
        start,
        end,
        biz_date,
    }
}

const WINDOW_CASES: &[WindowCase] = &[
    wcase(
        "Shanghai 01:00 bill run fired May 10 covers local May 9",
        "0 1 * * *",
        "Asia/Shanghai",
        WindowKind::Day,
        "2026-05-09T17:00:00Z",
        "2026-05-08T16:00:00Z",
        "2026-05-09T16:00:00Z",
        "2026-05-09",
    ),
    wcase(
        "Shanghai fire window: previous fire to this one",
        "0 1 * * *",
        "Asia/Shanghai",
        WindowKind::Fire,
        "2026-05-09T17:00:00Z",
        "2026-05-08T17:00:00Z",
        "2026-05-09T17:00:00Z",
        "2026-05-09",
    ),
    wcase(
        "NY day window of the spring-forward day is 23 hours",
        "0 1 * * *",
        "America/New_York",
        WindowKind::Day,
        "2026-03-09T05:00:00Z",
        "2026-03-08T05:00:00Z",
        "2026-03-09T04:00:00Z",
        "2026-03-08",
    ),
    wcase(
        "NY day window of the fall-back day is 25 hours",
        "0 1 * * *",
        "America/New_York",
        WindowKind::Day,
        "2026-11-02T06:00:00Z",
        "2026-11-01T04:00:00Z",
        "2026-11-02T05:00:00Z",
        "2026-11-01",
    ),
    wcase(
        "London month window: March ends in BST",
        "0 2 1 * *",
        "Europe/London",
        WindowKind::Month,
        "2026-04-01T01:00:00Z",
        "2026-03-01T00:00:00Z",
        "2026-03-31T23:00:00Z",
        "2026-03-01",
    ),
    wcase(
        "month window over a leap February is 29 days",
        "0 0 1 * *",
        "UTC",
        WindowKind::Month,
        "2028-03-01T00:00:00Z",
        "2028-02-01T00:00:00Z",
        "2028-03-01T00:00:00Z",
        "2028-02-01",
    ),
    wcase(
        "month window over a common February is 28 days",
        "0 0 1 * *",
        "UTC",
        WindowKind::Month,
        "2026-03-01T00:00:00Z",
        "2026-02-01T00:00:00Z",
        "2026-03-01T00:00:00Z",
        "2026-02-01",
    ),
    wcase(
        "month window of a mid-month fire is the previous whole month",
        "0 6 15 * *",
        "UTC",
        WindowKind::Month,
        "2026-01-15T06:00:00Z",
        "2025-12-01T00:00:00Z",
        "2026-01-01T00:00:00Z",
        "2025-12-01",
    ),
    wcase(
        "week window: the previous ISO week, Monday to Monday",
        "0 10 * * 3",
        "UTC",
        WindowKind::Week,
        "2026-01-07T10:00:00Z",
        "2025-12-29T00:00:00Z",
        "2026-01-05T00:00:00Z",
        "2025-12-29",
    ),
    wcase(
        "hour window: 01:00 EST covers the 01:00 EDT hour",
        "0 * * * *",
        "America/New_York",
        WindowKind::Hour,
        "2026-11-01T06:00:00Z",
        "2026-11-01T05:00:00Z",
        "2026-11-01T06:00:00Z",
        "2026-11-01",
    ),
    wcase(
        "hour window: 02:00 EST covers the 01:00 EST hour",
        "0 * * * *",
        "America/New_York",
        WindowKind::Hour,
        "2026-11-01T07:00:00Z",
        "2026-11-01T06:00:00Z",
        "2026-11-01T07:00:00Z",
        "2026-11-01",
    ),
    wcase(
        "hour window: 03:00 EDT covers 01:00 EST (02:00 never existed)",
        "0 * * * *",
        "America/New_York",
        WindowKind::Hour,
        "2026-03-08T07:00:00Z",
        "2026-03-08T06:00:00Z",
        "2026-03-08T07:00:00Z",
        "2026-03-08",
    ),
    wcase(
        "Lord Howe hour window over the fall back is 90 minutes",
        "0 * * * *",
        "Australia/Lord_Howe",
        WindowKind::Hour,
        "2026-04-04T15:30:00Z",
        "2026-04-04T14:00:00Z",
        "2026-04-04T15:30:00Z",
        "2026-04-05",
    ),
    wcase(
        "Lord Howe day of the spring-forward is 23.5 hours",
        "0 3 * * *",
        "Australia/Lord_Howe",
        WindowKind::Day,
        "2026-10-04T16:00:00Z",
        "2026-10-03T13:30:00Z",
        "2026-10-04T13:00:00Z",
        "2026-10-04",
    ),
    wcase(
        "Havana: the day with no midnight starts at 01:00 CDT",
        "0 6 * * *",
        "America/Havana",
        WindowKind::Day,
        "2026-03-09T10:00:00Z",
        "2026-03-08T05:00:00Z",
        "2026-03-09T04:00:00Z",
        "2026-03-08",
    ),
    wcase(
        "Havana: the day with two midnights starts at the first",
        "0 6 * * *",
        "America/Havana",
        WindowKind::Day,
        "2026-11-02T11:00:00Z",
        "2026-11-01T04:00:00Z",
        "2026-11-02T05:00:00Z",
        "2026-11-01",
    ),
    wcase(
        "fire window of an hourly job across the overlap",
        "0 * * * *",
        "America/New_York",
        WindowKind::Fire,
        "2026-11-01T06:00:00Z",
        "2026-11-01T05:00:00Z",
        "2026-11-01T06:00:00Z",
        "2026-11-01",
    ),
    wcase(
        "fire window after the overlap, once: 25 hours",
        "30 1 * * *",
        "America/New_York",
        WindowKind::Fire,
        "2026-11-02T06:30:00Z",
        "2026-11-01T05:30:00Z",
        "2026-11-02T06:30:00Z",
        "2026-11-01",
    ),
    wcase(
        "fire window starts at the shifted fire of the gap day",
        "30 2 * * *",
        "America/New_York",
        WindowKind::Fire,
        "2026-03-09T06:30:00Z",
        "2026-03-08T07:00:00Z",
        "2026-03-09T06:30:00Z",
        "2026-03-08",
    ),
    wcase(
        "fire window of a month-end job runs month end to month end",
        "0 0 L * *",
        "UTC",
        WindowKind::Fire,
        "2026-03-31T00:00:00Z",
        "2026-02-28T00:00:00Z",
        "2026-03-31T00:00:00Z",
        "2026-02-28",
    ),
];

#[test]
fn business_windows() {
    let mut failures = Vec::new();
    for c in WINDOW_CASES {
        let schedule = Schedule::parse(c.expr).unwrap();
        let tz = parse_zone(c.zone).unwrap();
        let w = window_for(&schedule, tz, SHIFT_ONCE, c.kind, at(c.fire))
            .unwrap_or_else(|| panic!("{}: no window", c.what));
        let got = (fmt(w.start), fmt(w.end), w.biz_date);
        let want = (
            fmt(at(c.start)),
            fmt(at(c.end)),
            NaiveDate::parse_from_str(c.biz_date, "%Y-%m-%d").unwrap(),
        );
        if got != want {
            failures.push(format!("{}: expected {:?}, got {:?}", c.what, want, got));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} window cases failed:\n{}",
        failures.len(),
        WINDOW_CASES.len(),
        failures.join("\n")
    );
}

/// The longest gap between fires: what a task's silence normally reaches.
#[test]
fn longest_gap_between_fires() {
    let from: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
    let gap = |expr: &str, tz: &str| {
        gaps(
            &Schedule::parse(expr).unwrap(),
            parse_zone(tz).unwrap(),
            SHIFT_ONCE,
            from,
        )
        .map(|(_, longest)| longest.num_minutes())
    };
    // Every five minutes: five minutes.
    assert_eq!(gap("*/5 * * * *", "UTC"), Some(5));
    // Weekdays at 09:00: Friday 09:00 to Monday 09:00 is three days.
    assert_eq!(gap("0 9 * * 1-5", "UTC"), Some(3 * 24 * 60));
    // Daily at 02:00 in London: the autumn change (Oct 25) makes one day 25 hours long.
    assert_eq!(gap("0 2 * * *", "Europe/London"), Some(25 * 60));
    // Monthly on the 1st: July 1 to August 1 is 31 days.
    assert_eq!(gap("0 0 1 * *", "UTC"), Some(31 * 24 * 60));
    // Once a year: 365 days from 2026 to 2027 (looks at least two fires).
    assert_eq!(gap("0 0 1 1 *", "UTC"), Some(365 * 24 * 60));
}

/// A backfill's windows: every window whose business date lies in the range, once each, in
/// order; the spring-forward day of London is 23 hours long.
#[test]
fn windows_between_dates() {
    let walk = |expr: &str,
                zone: &str,
                kind: WindowKind,
                from: &str,
                to: &str,
                ended: &str,
                max: usize| {
        let schedule = Schedule::parse(expr).unwrap();
        let tz = parse_zone(zone).unwrap();
        let day = |s: &str| NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap();
        windows_between(
            &schedule,
            tz,
            SHIFT_ONCE,
            kind,
            day(from),
            day(to),
            at(ended),
            max,
            1_000_000,
            &mut || {},
        )
    };
    // Daily at 02:00 London, day windows, March 2026: 31 windows, the 29th is 23 hours.
    let w = walk(
        "0 2 * * *",
        "Europe/London",
        WindowKind::Day,
        "2026-03-01",
        "2026-03-31",
        "2026-06-01T00:00:00Z",
        1000,
    )
    .unwrap();
    assert_eq!(w.len(), 31);
    assert_eq!(
        w[0].1.biz_date,
        NaiveDate::from_ymd_opt(2026, 3, 1).unwrap()
    );
    assert_eq!(fmt(w[0].1.start), "2026-03-01T00:00:00Z");
    assert_eq!(fmt(w[0].0), "2026-03-02T02:00:00Z");
    assert_eq!(
        w[30].1.biz_date,
        NaiveDate::from_ymd_opt(2026, 3, 31).unwrap()
    );
    let dst = w
        .iter()
        .find(|(_, x)| x.biz_date == NaiveDate::from_ymd_opt(2026, 3, 29).unwrap())
        .unwrap();
    assert_eq!(
        (fmt(dst.1.start), fmt(dst.1.end)),
        ("2026-03-29T00:00:00Z".into(), "2026-03-29T23:00:00Z".into())
    );
    assert!(
        w.windows(2).all(|p| p[0].1.end == p[1].1.start),
        "day windows tile the range"
    );
    // Hourly, fire windows, one date: 24 hours; the 23-hour spring-forward date has 23.
    let h = walk(
        "0 * * * *",
        "UTC",
        WindowKind::Fire,
        "2026-03-02",
        "2026-03-02",
        "2026-06-01T00:00:00Z",
        1000,
    )
    .unwrap();
    assert_eq!(h.len(), 24);
    assert_eq!(
        (fmt(h[0].1.start), fmt(h[23].1.end)),
        ("2026-03-02T00:00:00Z".into(), "2026-03-03T00:00:00Z".into())
    );
    let h = walk(
        "0 * * * *",
        "Europe/London",
        WindowKind::Hour,
        "2026-03-29",
        "2026-03-29",
        "2026-06-01T00:00:00Z",
        1000,
    )
    .unwrap();
    assert_eq!(h.len(), 23);
    // Windows not yet ended are left out.
    let w = walk(
        "0 2 * * *",
        "UTC",
        WindowKind::Day,
        "2026-03-01",
        "2026-03-31",
        "2026-03-10T12:00:00Z",
        1000,
    )
    .unwrap();
    assert_eq!(
        w.last().unwrap().1.biz_date,
        NaiveDate::from_ymd_opt(2026, 3, 9).unwrap()
    );
    // Bounded.
    assert_eq!(
        walk(
            "0 * * * *",
            "UTC",
            WindowKind::Fire,
            "2026-03-01",
            "2026-03-31",
            "2026-06-01T00:00:00Z",
            100
        )
        .unwrap_err(),
        RangeError::TooManyWindows
    );
}

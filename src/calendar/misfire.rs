//! What the scheduler does with each due window: run it, or record why not.
//!
//! `plan` is pure: given the windows whose fire time has come and the task's policy, it says
//! which become runs (on time or caught up), which are skipped and why, and which are covered by
//! a coalesced run. Every window gets a row, so nothing missed vanishes silently.

use chrono::{DateTime, Duration, Utc};

use crate::base::error::TideError;
use crate::calendar::BizWindow;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misfire {
    CatchUp,
    Latest,
    Coalesce,
    Skip,
}

impl Misfire {
    pub fn parse(s: &str) -> Result<Self, TideError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "catch_up" => Ok(Misfire::CatchUp),
            "latest" => Ok(Misfire::Latest),
            "coalesce" => Ok(Misfire::Coalesce),
            "skip" => Ok(Misfire::Skip),
            _ => Err(TideError::UnknownOption {
                option: "misfire policy",
                value: s.to_string(),
                allowed: "'catch_up' (default), 'latest', 'coalesce' or 'skip'",
            }),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Misfire::CatchUp => "catch_up",
            Misfire::Latest => "latest",
            Misfire::Coalesce => "coalesce",
            Misfire::Skip => "skip",
        }
    }
}

/// A window whose fire time has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    pub fire: DateTime<Utc>,
    pub window: BizWindow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    Paused,
    Misfire,
    Superseded,
    Coalesced,
    CatchUpLimit,
    BeyondRetention,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Paused => "paused",
            SkipReason::Misfire => "misfire",
            SkipReason::Superseded => "superseded",
            SkipReason::Coalesced => "coalesced",
            SkipReason::CatchUpLimit => "catch_up_limit",
            SkipReason::BeyondRetention => "beyond_retention",
        }
    }
}

/// The decision for one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A run of this window, fired on time.
    Run,
    /// A run of a window that was missed.
    CatchUp,
    /// The one run of a coalesced span: its window is extended to `end`.
    Coalesced { end: DateTime<Utc>, windows: usize },
    /// Not run.
    Skip(SkipReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    pub due: Due,
    pub decision: Decision,
}

/// The task's policy and the moment of the tick.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub now: DateTime<Utc>,
    /// A fire older than this at the tick was missed.
    pub threshold: Duration,
    pub misfire: Misfire,
    pub catch_up_max: usize,
    /// Windows starting before `now - retention` cannot be caught up: the source lost the data.
    pub retention: Option<Duration>,
    /// Fires at or before this instant fell while the task was paused.
    pub skip_until: Option<DateTime<Utc>>,
}

/// Plans `due` (oldest first, one entry per window). `more_after` says that at least
/// `catch_up_max` further missed windows follow this batch (the scheduler plans a long outage
/// in bounded batches); then every window here is older than the ones a catch-up would run.
pub fn plan(due: &[Due], policy: &Policy, more_after: bool) -> Vec<Planned> {
    let missed = |d: &Due| policy.now - d.fire > policy.threshold || more_after;
    let paused = |d: &Due| policy.skip_until.is_some_and(|until| d.fire <= until);
    let too_old = |d: &Due| {
        policy
            .retention
            .is_some_and(|keep| d.window.start < policy.now - keep)
    };

    let mut out: Vec<Planned> = due
        .iter()
        .map(|&d| Planned {
            due: d,
            decision: if paused(&d) {
                Decision::Skip(SkipReason::Paused)
            } else if !missed(&d) {
                Decision::Run
            } else if policy.misfire == Misfire::Skip {
                Decision::Skip(SkipReason::Misfire)
            } else if too_old(&d) {
                Decision::Skip(SkipReason::BeyondRetention)
            } else {
                Decision::CatchUp
            },
        })
        .collect();

    // The windows a catch-up could run, oldest first.
    let candidates: Vec<usize> = (0..out.len())
        .filter(|&i| out[i].decision == Decision::CatchUp)
        .collect();
    match policy.misfire {
        Misfire::CatchUp => {
            // Run the newest `catch_up_max`; older ones hit the limit (and raise an alert).
            let keep = if more_after { 0 } else { policy.catch_up_max };
            let cut = candidates.len().saturating_sub(keep);
            for &i in &candidates[..cut] {
                out[i].decision = Decision::Skip(SkipReason::CatchUpLimit);
            }
        }
        Misfire::Latest => {
            // Only the newest window runs; an on-time window in this batch is newer still.
            let on_time = out.iter().any(|p| p.decision == Decision::Run);
            let keep = usize::from(!on_time && !more_after);
            let cut = candidates.len().saturating_sub(keep);
            for &i in &candidates[..cut] {
                out[i].decision = Decision::Skip(SkipReason::Superseded);
            }
        }
        Misfire::Coalesce => {
            if let Some((&first, rest)) = candidates.split_first() {
                for &i in rest {
                    out[i].decision = Decision::Skip(SkipReason::Coalesced);
                }
                out[first].decision = if more_after {
                    // Covered by a run made when the outage's last batch is planned.
                    Decision::Skip(SkipReason::Coalesced)
                } else {
                    let last = candidates[candidates.len() - 1];
                    Decision::Coalesced {
                        end: out[last].due.window.end,
                        windows: candidates.len(),
                    }
                };
            }
        }
        Misfire::Skip => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 1, h, 0, 0).unwrap()
    }

    /// Hourly windows [h-1, h) fired at h, for hours `from..=to`.
    fn hourly(from: u32, to: u32) -> Vec<Due> {
        (from..=to)
            .map(|h| Due {
                fire: at(h),
                window: BizWindow {
                    start: at(h - 1),
                    end: at(h),
                    biz_date: at(h - 1).date_naive(),
                },
            })
            .collect()
    }

    fn policy(misfire: Misfire, now: u32) -> Policy {
        Policy {
            now: at(now) + Duration::seconds(5),
            threshold: Duration::seconds(60),
            misfire,
            catch_up_max: 100,
            retention: None,
            skip_until: None,
        }
    }

    fn decisions(p: &[Planned]) -> Vec<Decision> {
        p.iter().map(|p| p.decision).collect()
    }

    use Decision::*;
    use SkipReason::{BeyondRetention, CatchUpLimit, Coalesced as Covered, Paused, Superseded};

    #[test]
    fn on_time_fire_runs() {
        let p = plan(&hourly(5, 5), &policy(Misfire::Skip, 5), false);
        assert_eq!(decisions(&p), vec![Run]);
    }

    #[test]
    fn a_tick_later_than_the_threshold_is_a_misfire() {
        let mut pol = policy(Misfire::Skip, 5);
        pol.now = at(5) + Duration::seconds(61);
        assert_eq!(
            decisions(&plan(&hourly(5, 5), &pol, false)),
            vec![Skip(SkipReason::Misfire)]
        );
        pol.now = at(5) + Duration::seconds(60);
        assert_eq!(decisions(&plan(&hourly(5, 5), &pol, false)), vec![Run]);
    }

    #[test]
    fn each_policy_after_three_missed_hours() {
        // Down from 01:30 to 05:00:05: fires 02, 03, 04 were missed, 05 is on time.
        let due = hourly(2, 5);
        let cases = [
            (Misfire::CatchUp, vec![CatchUp, CatchUp, CatchUp, Run]),
            (
                Misfire::Latest,
                vec![Skip(Superseded), Skip(Superseded), Skip(Superseded), Run],
            ),
            (
                Misfire::Coalesce,
                vec![
                    Coalesced {
                        end: at(4),
                        windows: 3,
                    },
                    Skip(Covered),
                    Skip(Covered),
                    Run,
                ],
            ),
            (
                Misfire::Skip,
                vec![
                    Skip(SkipReason::Misfire),
                    Skip(SkipReason::Misfire),
                    Skip(SkipReason::Misfire),
                    Run,
                ],
            ),
        ];
        for (misfire, want) in cases {
            assert_eq!(
                decisions(&plan(&due, &policy(misfire, 5), false)),
                want,
                "{misfire:?}"
            );
        }
    }

    #[test]
    fn latest_without_an_on_time_window_runs_the_newest_missed() {
        // The tick comes at 04:30: fires 02, 03, 04 all missed.
        let mut pol = policy(Misfire::Latest, 4);
        pol.now = at(4) + Duration::minutes(30);
        assert_eq!(
            decisions(&plan(&hourly(2, 4), &pol, false)),
            vec![Skip(Superseded), Skip(Superseded), CatchUp]
        );
    }

    #[test]
    fn catch_up_is_bounded_keeping_the_newest() {
        let mut pol = policy(Misfire::CatchUp, 10);
        pol.now = at(10) + Duration::minutes(30);
        pol.catch_up_max = 3;
        assert_eq!(
            decisions(&plan(&hourly(2, 10), &pol, false)),
            vec![
                Skip(CatchUpLimit),
                Skip(CatchUpLimit),
                Skip(CatchUpLimit),
                Skip(CatchUpLimit),
                Skip(CatchUpLimit),
                Skip(CatchUpLimit),
                CatchUp,
                CatchUp,
                CatchUp
            ]
        );
        pol.catch_up_max = 0;
        assert!(plan(&hourly(2, 10), &pol, false)
            .iter()
            .all(|p| p.decision == Skip(CatchUpLimit)));
    }

    #[test]
    fn retention_stops_catch_up_but_not_on_time_runs() {
        let mut pol = policy(Misfire::CatchUp, 5);
        pol.retention = Some(Duration::hours(3)); // source keeps data from 02:00:05 on
        assert_eq!(
            decisions(&plan(&hourly(2, 5), &pol, false)),
            vec![Skip(BeyondRetention), Skip(BeyondRetention), CatchUp, Run]
        );
        pol.misfire = Misfire::Coalesce;
        assert_eq!(
            decisions(&plan(&hourly(2, 5), &pol, false)),
            vec![
                Skip(BeyondRetention),
                Skip(BeyondRetention),
                Coalesced {
                    end: at(4),
                    windows: 1
                },
                Run
            ]
        );
    }

    #[test]
    fn paused_windows_are_skipped_not_caught_up() {
        let mut pol = policy(Misfire::CatchUp, 5);
        pol.skip_until = Some(at(4) + Duration::minutes(10));
        assert_eq!(
            decisions(&plan(&hourly(2, 5), &pol, false)),
            vec![Skip(Paused), Skip(Paused), Skip(Paused), Run]
        );
    }

    #[test]
    fn a_batch_with_more_to_come_keeps_nothing_for_itself() {
        let due = hourly(2, 5);
        let cases = [
            (Misfire::CatchUp, Skip(CatchUpLimit)),
            (Misfire::Latest, Skip(Superseded)),
            (Misfire::Coalesce, Skip(Covered)),
            (Misfire::Skip, Skip(SkipReason::Misfire)),
        ];
        for (misfire, want) in cases {
            let p = plan(&due, &policy(misfire, 5), true);
            assert!(p.iter().all(|p| p.decision == want), "{misfire:?}: {p:?}");
        }
    }

    #[test]
    fn policies_parse() {
        for m in [
            Misfire::CatchUp,
            Misfire::Latest,
            Misfire::Coalesce,
            Misfire::Skip,
        ] {
            assert_eq!(Misfire::parse(m.as_str()), Ok(m));
        }
        let err = Misfire::parse("catchup").unwrap_err();
        assert!(err.to_string().contains("\"catchup\""));
    }
}

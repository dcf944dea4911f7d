//! Charts drawn on the server as SVG (no script): runs per hour by outcome as stacked bars, and
//! the p50/p95 duration of each hour's successes as two lines, from `tide.run_hours` (pg_tide's
//! hourly counters, never a scan of history). Each bar and point has its figures as a tooltip
//! (`<title>`); each chart has a text summary and a table of its figures for screen readers and
//! anyone who wants the numbers. The axis labels are HTML, so they stay readable when the chart
//! shrinks to a phone's width.

use maud::{html, Markup};

use crate::html::human;

/// One hour of `tide.run_hours`.
pub struct Hour {
    /// The hour as shown (in the task's zone, or UTC on the overview), and in UTC.
    pub label: String,
    pub utc: String,
    pub succeeded: i64,
    pub failed: i64,
    pub dead: i64,
    pub skipped: i64,
    pub need_check: i64,
    pub cancelled: i64,
    /// Seconds.
    pub p50: Option<f64>,
    pub p95: Option<f64>,
}

/// The outcomes, in the order they are stacked (bottom first), with their CSS class.
const OUTCOMES: [&str; 6] = [
    "succeeded",
    "failed",
    "need_check",
    "dead",
    "skipped",
    "cancelled",
];

impl Hour {
    fn outcome(&self, o: &str) -> i64 {
        match o {
            "succeeded" => self.succeeded,
            "failed" => self.failed,
            "need_check" => self.need_check,
            "dead" => self.dead,
            "skipped" => self.skipped,
            _ => self.cancelled,
        }
    }

    fn total(&self) -> i64 {
        OUTCOMES.iter().map(|o| self.outcome(o)).sum()
    }

    fn figures(&self) -> String {
        let mut parts: Vec<String> = OUTCOMES
            .iter()
            .filter(|o| self.outcome(o) > 0)
            .map(|o| format!("{} {}", self.outcome(o), o.replace('_', " ")))
            .collect();
        if parts.is_empty() {
            parts.push("no runs".into());
        }
        format!("{}: {}", self.label, parts.join(", "))
    }
}

const W: f64 = 720.0;
const H: f64 = 120.0;

/// The sums of each outcome over the hours.
pub fn totals(hours: &[Hour]) -> Vec<(&'static str, i64)> {
    OUTCOMES
        .iter()
        .map(|o| (*o, hours.iter().map(|h| h.outcome(o)).sum()))
        .collect()
}

/// Runs per hour by outcome, stacked. `id` names the chart in the page (`#id`), `span` says
/// which hours it covers ("last day").
pub fn runs(id: &str, span: &str, zone: &str, hours: &[Hour]) -> Markup {
    let max = hours.iter().map(Hour::total).max().unwrap_or(0).max(1);
    let slot = W / hours.len().max(1) as f64;
    let bar = (slot * 0.8).max(1.0);
    let sums = totals(hours);
    let summary = sums
        .iter()
        .filter(|(o, n)| *n > 0 || ["succeeded", "failed", "dead", "skipped"].contains(o))
        .map(|(o, n)| format!("{n} {}", o.replace('_', " ")))
        .collect::<Vec<_>>()
        .join(", ");
    html! {
        figure.chart #(id) data-kind="runs" {
            figcaption #(format!("{id}-caption")) {
                strong { "Runs per hour, " (span) } " "
                span.summary #(format!("{id}-summary")) { (summary) }
                @for (o, n) in &sums { span hidden data-outcome=(o) data-count=(n) {} }
            }
            div.plot {
                span.ymax { (max) }
                svg viewBox=(format!("0 0 {W} {H}")) preserveAspectRatio="none" role="img"
                    aria-labelledby=(format!("{id}-caption")) {
                    line.axis x1="0" y1=(H) x2=(W) y2=(H) {}
                    @for (i, h) in hours.iter().enumerate() {
                        g.hour data-hour=(h.utc) data-total=(h.total()) {
                            title { (h.figures()) }
                            rect.hit x=(fmt(i as f64 * slot)) y="0" width=(fmt(slot)) height=(H) {}
                            @for (o, y, height) in stack(h, max) {
                                rect class=(format!("c-{o}")) x=(fmt(i as f64 * slot + (slot - bar) / 2.0))
                                    y=(fmt(y)) width=(fmt(bar)) height=(fmt(height)) {}
                            }
                        }
                    }
                }
            }
            (axis(hours, zone))
            p.legend {
                @for o in OUTCOMES { span class=(format!("key c-{o}")) {} (o.replace('_', " ")) " " }
            }
            details {
                summary { "Figures by hour" }
                (figures_table(hours))
            }
        }
    }
}

/// The segments of one hour's bar, bottom up: (outcome, y, height).
fn stack(h: &Hour, max: i64) -> Vec<(&'static str, f64, f64)> {
    let mut y = H;
    let mut out = Vec::new();
    for o in OUTCOMES {
        let n = h.outcome(o);
        if n == 0 {
            continue;
        }
        let height = (n as f64 / max as f64 * (H - 4.0)).max(1.0);
        y -= height;
        out.push((o, y, height));
    }
    out
}

/// The p50 and p95 duration of each hour's successes, as two lines.
pub fn durations(id: &str, span: &str, zone: &str, hours: &[Hour]) -> Markup {
    let max = hours
        .iter()
        .filter_map(|h| h.p95.or(h.p50))
        .fold(0.0_f64, f64::max);
    let slot = W / hours.len().max(1) as f64;
    let y = |v: f64| H - v / max.max(1e-9) * (H - 6.0);
    let line = |pick: fn(&Hour) -> Option<f64>| -> String {
        hours
            .iter()
            .enumerate()
            .filter_map(|(i, h)| {
                pick(h).map(|v| format!("{},{}", fmt((i as f64 + 0.5) * slot), fmt(y(v))))
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let worst = hours
        .iter()
        .filter_map(|h| h.p95)
        .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))));
    html! {
        figure.chart #(id) data-kind="durations" {
            figcaption #(format!("{id}-caption")) {
                strong { "Duration of successes, " (span) } " "
                span.summary {
                    @if let Some(w) = worst { "slowest hour's p95 " (human(w)) } @else { "no successes" }
                }
            }
            div.plot {
                span.ymax { @if max > 0.0 { (human(max)) } }
                svg viewBox=(format!("0 0 {W} {H}")) preserveAspectRatio="none" role="img"
                    aria-labelledby=(format!("{id}-caption")) {
                    line.axis x1="0" y1=(H) x2=(W) y2=(H) {}
                    polyline.p95 points=(line(|h| h.p95)) {}
                    polyline.p50 points=(line(|h| h.p50)) {}
                    @for (i, h) in hours.iter().enumerate() {
                        @if let (Some(p50), Some(p95)) = (h.p50, h.p95) {
                            g.hour data-hour=(h.utc) {
                                title { (h.label) ": p50 " (human(p50)) ", p95 " (human(p95)) }
                                rect.hit x=(fmt(i as f64 * slot)) y="0" width=(fmt(slot)) height=(H) {}
                                // Each hour's figures as a step across its slot: seen even
                                // for an hour alone between empty ones.
                                line.p95 x1=(fmt(i as f64 * slot)) x2=(fmt((i + 1) as f64 * slot)) y1=(fmt(y(p95))) y2=(fmt(y(p95))) {}
                                line.p50 x1=(fmt(i as f64 * slot)) x2=(fmt((i + 1) as f64 * slot)) y1=(fmt(y(p50))) y2=(fmt(y(p50))) {}
                            }
                        }
                    }
                }
            }
            (axis(hours, zone))
            p.legend { span.key.line-p50 {} "p50 " span.key.line-p95 {} "p95" }
        }
    }
}

/// The first and last hour under a chart (HTML, so it stays readable at any width).
fn axis(hours: &[Hour], zone: &str) -> Markup {
    html! {
        p.xaxis {
            span { (hours.first().map(|h| h.label.as_str()).unwrap_or("")) }
            span.muted { (zone) }
            span { (hours.last().map(|h| h.label.as_str()).unwrap_or("")) }
        }
    }
}

fn figures_table(hours: &[Hour]) -> Markup {
    html! {
        div.scroll {
            table.figures {
                thead { tr { th { "hour" } @for o in OUTCOMES { th { (o.replace('_', " ")) } } th { "p50" } th { "p95" } } }
                tbody {
                    @for h in hours.iter().rev().filter(|h| h.total() > 0) {
                        tr {
                            td { time title=(format!("{} UTC", h.utc)) { (h.label) } }
                            @for o in OUTCOMES { td { (h.outcome(o)) } }
                            td { (h.p50.map(human).unwrap_or_else(|| "–".into())) }
                            td { (h.p95.map(human).unwrap_or_else(|| "–".into())) }
                        }
                    }
                }
            }
        }
    }
}

/// Queue depth and the oldest ready run's wait, one bar per queue.
pub fn queues(rows: &[(String, String, i64, i64, Option<f64>)]) -> Markup {
    let max = rows.iter().map(|r| r.2 + r.3).max().unwrap_or(0).max(1);
    html! {
        figure.chart #queues data-kind="queues" {
            figcaption { strong { "Queues now" } " ready and running runs, and how long the oldest ready run has waited" }
            @if rows.is_empty() {
                p.empty { "No runs ready or running." }
            } @else {
                ul.qbars {
                    @for (owner, queue, ready, running, oldest) in rows {
                        li data-queue=(queue) data-owner=(owner) data-ready=(ready) data-running=(running) {
                            span.qname { (queue) " " span.muted { (owner) } }
                            svg viewBox="0 0 100 10" preserveAspectRatio="none" role="img"
                                aria-label=(format!("{queue}: {ready} ready, {running} running")) {
                                title { (queue) ": " (ready) " ready, " (running) " running" }
                                rect.c-running x="0" y="0" width=(fmt(*running as f64 / max as f64 * 100.0)) height="10" {}
                                rect.c-ready x=(fmt(*running as f64 / max as f64 * 100.0)) y="0"
                                    width=(fmt(*ready as f64 / max as f64 * 100.0)) height="10" {}
                            }
                            span.qfig {
                                (ready) " ready · " (running) " running"
                                @if let Some(w) = oldest { " · oldest waits " (human(*w)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn fmt(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hour(label: &str, succeeded: i64, dead: i64, p50: Option<f64>) -> Hour {
        Hour {
            label: label.into(),
            utc: label.into(),
            succeeded,
            failed: 0,
            dead,
            skipped: 0,
            need_check: 0,
            cancelled: 0,
            p50,
            p95: p50.map(|v| v * 2.0),
        }
    }

    #[test]
    fn bars_stack_each_outcome_and_say_their_figures() {
        let hours = vec![hour("10:00", 3, 1, Some(0.002)), hour("11:00", 0, 0, None)];
        let m = runs("day", "last day", "UTC", &hours).into_string();
        assert!(
            m.contains("<title>10:00: 3 succeeded, 1 dead</title>"),
            "{m}"
        );
        assert!(m.contains("<title>11:00: no runs</title>"), "{m}");
        assert!(
            m.contains("data-outcome=\"succeeded\" data-count=\"3\""),
            "{m}"
        );
        assert!(
            m.contains("3 succeeded, 0 failed, 1 dead, 0 skipped"),
            "{m}"
        );
        // The tallest hour fills the plot: 4 runs of 4, 3 of them succeeded.
        let s = stack(&hours[0], 4);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].0, "succeeded");
        assert!((s[0].2 - 87.0).abs() < 0.01, "{s:?}");
        assert!((s[1].1 - (H - 116.0)).abs() < 0.01, "{s:?}");
    }

    #[test]
    fn duration_lines_skip_hours_without_successes() {
        let hours = vec![hour("10:00", 3, 0, Some(0.002)), hour("11:00", 0, 0, None)];
        let m = durations("d", "last day", "UTC", &hours).into_string();
        assert!(
            m.contains("<title>10:00: p50 2 ms, p95 4 ms</title>"),
            "{m}"
        );
        assert!(!m.contains("11:00: p50"), "{m}");
        assert!(m.contains("slowest hour's p95 4 ms"), "{m}");
    }
}

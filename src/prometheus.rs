//! The Prometheus text exposition of `tide.metrics()`, written from figures already read
//! (src/metrics.rs reads them). No pgrx: unit-tested with plain `cargo test`.
//!
//! The text follows the exposition format 0.0.4: each family once, a `# HELP` and a `# TYPE`
//! line and then its samples, families in name order; label values quoted with `\`, `"` and
//! newlines escaped; a value unknown (no successful run to take a quantile of) is `NaN`.
//! Written here rather than in SQL because SQL built each sample line from several text
//! values, each a new string: with 10,000 tasks (140,000 lines) that was four fifths of the call.

use std::fmt::Write;

/// What one task contributes: its health (tide.health) and its counters (tide.run_count).
/// Durations are in seconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskFigures {
    pub owner: String,
    pub task: String,
    pub status: String,
    pub backlog: i64,
    pub consecutive_failures: Option<i64>,
    pub dead: i64,
    pub need_check: i64,
    pub silence: Option<f64>,
    pub max_silence: Option<f64>,
    pub p50_duration: Option<f64>,
    pub p95_duration: Option<f64>,
    pub duration_sum: f64,
    pub duration_count: f64,
    pub p95_queue_wait: Option<f64>,
    pub wait_sum: f64,
    pub wait_count: f64,
    /// A reconciliation's open differences (all, for a person); None for other tasks.
    pub open_differences: Option<(i64, i64)>,
    /// Rows of each side in a reconciliation's latest comparison, when there was one.
    pub recon_rows: Option<(i64, i64)>,
}

/// Runs of a task that reached an outcome (`pg_tide_runs_total`).
#[derive(Debug, Clone, PartialEq)]
pub struct RunCount {
    pub owner: String,
    pub task: String,
    pub outcome: String,
    pub value: f64,
}

/// A heartbeat check's current status.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckStatus {
    pub owner: String,
    pub check: String,
    pub status: String,
}

/// Open alerts of one kind and severity.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertCount {
    pub kind: String,
    pub severity: String,
    pub open: i64,
}

/// Everything one exposition shows.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub alerts: Vec<AlertCount>,
    pub checks: Vec<CheckStatus>,
    pub tasks: Vec<TaskFigures>,
    pub runs: Vec<RunCount>,
}

/// Appends a label value, quoted and escaped.
fn label(out: &mut String, v: &str) {
    out.push('"');
    if !v.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.push_str(v);
        out.push('"');
        return;
    }
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A sample's value.
#[derive(Clone, Copy)]
enum Value {
    Int(i64),
    /// A number; None (unknown) is `NaN`.
    Num(Option<f64>),
}

impl Value {
    /// Appends the value: an integer as is, a number as the shortest text that reads back as it.
    fn write(self, out: &mut String) {
        // `write!` to a String cannot fail.
        match self {
            Value::Int(n) => {
                let _ = write!(out, "{n}");
            }
            Value::Num(None) => out.push_str("NaN"),
            Value::Num(Some(v)) if v.is_nan() => out.push_str("NaN"),
            Value::Num(Some(v)) if v == f64::INFINITY => out.push_str("+Inf"),
            Value::Num(Some(v)) if v == f64::NEG_INFINITY => out.push_str("-Inf"),
            Value::Num(Some(v)) => {
                let _ = write!(out, "{v}");
            }
        }
    }
}

/// A task's labels, quoted once for all its lines: `{owner="…",task="…"`, left open.
fn task_labels(t: &TaskFigures) -> String {
    let mut l = String::with_capacity(t.owner.len() + t.task.len() + 20);
    l.push_str("{owner=");
    label(&mut l, &t.owner);
    l.push_str(",task=");
    label(&mut l, &t.task);
    l
}

/// One sample line of a task: a suffix to the family's name (`_sum`), one more label, the value.
type Line<'t> = Option<(&'static str, Option<(&'static str, &'t str)>, Value)>;

/// The text being written, with each task's labels quoted once.
struct Text<'a> {
    out: String,
    tasks: Vec<(&'a TaskFigures, String)>,
}

impl Text<'_> {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// A sample with labels of its own (not a task's).
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: Value) {
        self.out.push_str(name);
        for (i, (k, v)) in labels.iter().enumerate() {
            self.out.push(if i == 0 { '{' } else { ',' });
            self.out.push_str(k);
            self.out.push('=');
            label(&mut self.out, v);
        }
        self.out
            .push_str(if labels.is_empty() { " " } else { "} " });
        value.write(&mut self.out);
        self.out.push('\n');
    }

    /// A family with the lines `lines` gives for each task (up to four), in the tasks' order.
    fn per_task<F>(&mut self, name: &str, kind: &str, help: &str, lines: F)
    where
        F: for<'t> Fn(&'t TaskFigures) -> [Line<'t>; 4],
    {
        self.family(name, kind, help);
        let Text { out, tasks } = self;
        for (t, labels) in tasks.iter() {
            for (suffix, more, value) in lines(t).into_iter().flatten() {
                out.push_str(name);
                out.push_str(suffix);
                out.push_str(labels);
                if let Some((k, v)) = more {
                    out.push(',');
                    out.push_str(k);
                    out.push('=');
                    label(out, v);
                }
                out.push_str("} ");
                value.write(out);
                out.push('\n');
            }
        }
    }
}

/// The whole exposition, ending with a newline.
pub fn render(f: &Figures) -> String {
    // About 75 bytes per sample line, 14 lines per task.
    let mut x = Text {
        out: String::with_capacity(4096 + f.tasks.len() * 1100 + f.runs.len() * 100),
        tasks: f.tasks.iter().map(|t| (t, task_labels(t))).collect(),
    };

    x.family(
        "pg_tide_alerts_open",
        "gauge",
        "Open alerts by kind and severity.",
    );
    for a in &f.alerts {
        let labels = [("kind", a.kind.as_str()), ("severity", a.severity.as_str())];
        x.sample("pg_tide_alerts_open", &labels, Value::Int(a.open));
    }
    x.family(
        "pg_tide_check_status",
        "gauge",
        "1 for the current status of each heartbeat check.",
    );
    for c in &f.checks {
        let labels = [
            ("owner", c.owner.as_str()),
            ("check", c.check.as_str()),
            ("status", c.status.as_str()),
        ];
        x.sample("pg_tide_check_status", &labels, Value::Int(1));
    }
    x.per_task(
        "pg_tide_queue_wait_seconds",
        "summary",
        "Time from fire (or creation) to first claim; quantile over 24 h.",
        |t| {
            [
                Some(("", Some(("quantile", "0.95")), Value::Num(t.p95_queue_wait))),
                Some(("_sum", None, Value::Num(Some(t.wait_sum)))),
                Some(("_count", None, Value::Num(Some(t.wait_count)))),
                None,
            ]
        },
    );
    x.per_task(
        "pg_tide_reconciliation_open_differences",
        "gauge",
        "Open differences of a reconciliation (each once), all and those for a person.",
        |t| {
            let (all, person) = t.open_differences.unzip();
            [
                all.map(|n| ("", Some(("for", "all")), Value::Int(n))),
                person.map(|n| ("", Some(("for", "person")), Value::Int(n))),
                None,
                None,
            ]
        },
    );
    x.per_task(
        "pg_tide_reconciliation_rows",
        "gauge",
        "Rows of each side in a reconciliation's latest comparison.",
        |t| {
            let (left, right) = t.open_differences.and(t.recon_rows).unzip();
            [
                left.map(|n| ("", Some(("side", "left")), Value::Int(n))),
                right.map(|n| ("", Some(("side", "right")), Value::Int(n))),
                None,
                None,
            ]
        },
    );
    x.per_task(
        "pg_tide_run_duration_seconds",
        "summary",
        "Duration of successful runs (last attempt); quantiles over 24 h.",
        |t| {
            [
                Some(("", Some(("quantile", "0.5")), Value::Num(t.p50_duration))),
                Some(("", Some(("quantile", "0.95")), Value::Num(t.p95_duration))),
                Some(("_sum", None, Value::Num(Some(t.duration_sum)))),
                Some(("_count", None, Value::Num(Some(t.duration_count)))),
            ]
        },
    );
    x.family(
        "pg_tide_runs_total",
        "counter",
        "Runs that reached an outcome (a replayed run counts again).",
    );
    for r in &f.runs {
        let labels = [
            ("owner", r.owner.as_str()),
            ("task", r.task.as_str()),
            ("outcome", r.outcome.as_str()),
        ];
        x.sample("pg_tide_runs_total", &labels, Value::Num(Some(r.value)));
    }
    type Gauge = (&'static str, &'static str, fn(&TaskFigures) -> Value);
    let gauges: [Gauge; 4] = [
        ("pg_tide_task_backlog", "Runs ready or waiting.", |t| {
            Value::Int(t.backlog)
        }),
        (
            "pg_tide_task_consecutive_failures",
            "Failed attempts since the last success.",
            |t| t.consecutive_failures.map_or(Value::Num(None), Value::Int),
        ),
        (
            "pg_tide_task_max_silence_seconds",
            "Silence after which the task is late.",
            |t| Value::Num(t.max_silence),
        ),
        (
            "pg_tide_task_silence_seconds",
            "Time since the last successful run (or since creation).",
            |t| Value::Num(t.silence),
        ),
    ];
    for (name, help, value) in gauges {
        x.per_task(name, "gauge", help, |t| {
            [Some(("", None, value(t))), None, None, None]
        });
    }
    x.per_task(
        "pg_tide_task_status",
        "gauge",
        "1 for the current status of each task.",
        |t| {
            [
                Some(("", Some(("status", t.status.as_str())), Value::Int(1))),
                None,
                None,
                None,
            ]
        },
    );
    x.per_task(
        "pg_tide_task_unresolved_runs",
        "gauge",
        "Dead and need_check runs waiting for a person.",
        |t| {
            [
                Some(("", Some(("state", "dead")), Value::Int(t.dead))),
                Some(("", Some(("state", "need_check")), Value::Int(t.need_check))),
                None,
                None,
            ]
        },
    );
    x.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(name: &str) -> TaskFigures {
        TaskFigures {
            owner: "alice".into(),
            task: name.into(),
            status: "ok".into(),
            ..TaskFigures::default()
        }
    }

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[test]
    fn label_values_are_escaped() {
        let mut t = task("a \"quoted\" \\ name\nwith a break");
        t.owner = "o\"wner".into();
        let text = render(&Figures {
            tasks: vec![t],
            ..Figures::default()
        });
        assert!(
            text.contains(
                "pg_tide_task_backlog{owner=\"o\\\"wner\",task=\"a \\\"quoted\\\" \\\\ name\\nwith a break\"} 0\n"
            ),
            "{text}"
        );
        // The escaped break keeps every sample on one line.
        assert!(lines(&text)
            .iter()
            .all(|l| l.starts_with('#') || l.starts_with("pg_tide_")));
    }

    #[test]
    fn unknown_values_are_nan_and_numbers_read_back() {
        let mut t = task("t");
        t.p50_duration = Some(0.25);
        t.p95_duration = None;
        t.silence = Some(1e-7);
        t.max_silence = Some(f64::INFINITY);
        t.consecutive_failures = None;
        t.duration_sum = 12.5;
        t.duration_count = 3.0;
        let text = render(&Figures {
            tasks: vec![t],
            ..Figures::default()
        });
        for line in [
            "pg_tide_run_duration_seconds{owner=\"alice\",task=\"t\",quantile=\"0.5\"} 0.25",
            "pg_tide_run_duration_seconds{owner=\"alice\",task=\"t\",quantile=\"0.95\"} NaN",
            "pg_tide_run_duration_seconds_sum{owner=\"alice\",task=\"t\"} 12.5",
            "pg_tide_run_duration_seconds_count{owner=\"alice\",task=\"t\"} 3",
            "pg_tide_task_max_silence_seconds{owner=\"alice\",task=\"t\"} +Inf",
            "pg_tide_task_consecutive_failures{owner=\"alice\",task=\"t\"} NaN",
        ] {
            assert!(lines(&text).contains(&line), "no {line} in\n{text}");
        }
        let silence = lines(&text)
            .into_iter()
            .find(|l| l.starts_with("pg_tide_task_silence_seconds{"))
            .and_then(|l| l.rsplit(' ').next())
            .map(|v| v.parse::<f64>());
        assert_eq!(silence, Some(Ok(1e-7)));
    }

    #[test]
    fn every_family_once_in_name_order_with_its_header_even_when_empty() {
        let mut recon = task("recon");
        recon.open_differences = Some((3, 1));
        recon.recon_rows = Some((100, 99));
        let mut never_compared = task("new_recon");
        never_compared.open_differences = Some((0, 0));
        let text = render(&Figures {
            alerts: vec![AlertCount {
                kind: "dead_letter".into(),
                severity: "warning".into(),
                open: 2,
            }],
            checks: vec![],
            tasks: vec![task("plain"), recon, never_compared],
            runs: vec![RunCount {
                owner: "alice".into(),
                task: "plain".into(),
                outcome: "succeeded".into(),
                value: 7.0,
            }],
        });
        let families: Vec<&str> = lines(&text)
            .into_iter()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap_or(""))
            .collect();
        let mut sorted = families.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(families, sorted, "families once each, in name order");
        assert_eq!(families.len(), 13);
        assert!(
            families.contains(&"pg_tide_check_status"),
            "an empty family keeps its header"
        );
        // Each sample belongs to the family whose header came last.
        let mut current = "";
        for l in lines(&text) {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                current = rest.split(' ').next().unwrap_or("");
            } else if !l.starts_with('#') {
                assert!(l.starts_with(current), "{l} outside {current}");
            }
        }
        for line in [
            "pg_tide_alerts_open{kind=\"dead_letter\",severity=\"warning\"} 2",
            "pg_tide_runs_total{owner=\"alice\",task=\"plain\",outcome=\"succeeded\"} 7",
            "pg_tide_reconciliation_open_differences{owner=\"alice\",task=\"recon\",for=\"person\"} 1",
            "pg_tide_reconciliation_rows{owner=\"alice\",task=\"recon\",side=\"right\"} 99",
            "pg_tide_reconciliation_open_differences{owner=\"alice\",task=\"new_recon\",for=\"all\"} 0",
            "pg_tide_task_status{owner=\"alice\",task=\"plain\",status=\"ok\"} 1",
            "pg_tide_task_unresolved_runs{owner=\"alice\",task=\"plain\",state=\"need_check\"} 0",
        ] {
            assert!(lines(&text).contains(&line), "no {line} in\n{text}");
        }
        // Only reconciliations have their figures; one never compared has no rows yet.
        assert!(!text.contains("task=\"plain\",for="));
        assert!(!text.contains("task=\"new_recon\",side="));
        assert!(text.ends_with('\n'));
    }
}

//! The Prometheus text exposition of `tide.metrics()`, written from figures already read
//! (src/monitor/metrics.rs reads them). No pgrx: unit-tested with plain `cargo test`.
//!
//! The text follows the exposition format 0.0.4: each family once, a `# HELP` and a `# TYPE`
//! line and then its samples, families in name order; label values quoted with `\`, `"` and
//! newlines escaped; a value unknown (no successful run to take a quantile of) is `NaN`.
//! Written here rather than in SQL because SQL built each sample line from several text
//! values, each a new string: with 10,000 tasks (140,000 lines) that was four fifths of the call.

use std::fmt::Write;

/// The histogram buckets of run durations and queue waits: each `le` label (as `tide._le`
/// gives it to the counters, see `le_of`) and its bound in seconds.
pub const BUCKETS: [(&str, f64); 13] = [
    ("0.01", 0.01),
    ("0.05", 0.05),
    ("0.1", 0.1),
    ("0.5", 0.5),
    ("1", 1.0),
    ("5", 5.0),
    ("10", 10.0),
    ("30", 30.0),
    ("60", 60.0),
    ("300", 300.0),
    ("900", 900.0),
    ("3600", 3600.0),
    ("21600", 21600.0),
];

/// The bucket of a duration or wait in seconds: the `le` label of the smallest bound it is at
/// most; None above the largest, for NaN and for infinity (those count only in the +Inf bucket,
/// which is the count). A negative value (no duration can be) goes to the first.
pub fn le_of(seconds: f64) -> Option<&'static str> {
    BUCKETS
        .iter()
        .find(|(_, bound)| seconds <= *bound)
        .map(|(label, _)| *label)
}

/// The index in `BUCKETS` of an `le` label, if it is one.
pub fn bucket_of(le: &str) -> Option<usize> {
    BUCKETS.iter().position(|(l, _)| *l == le)
}

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
    /// Successes counted in each bucket of `BUCKETS` (each once: not cumulative).
    pub duration_buckets: [f64; 13],
    pub p95_queue_wait: Option<f64>,
    pub wait_sum: f64,
    pub wait_count: f64,
    /// First starts counted in each bucket of `BUCKETS` by their wait.
    pub wait_buckets: [f64; 13],
    /// A reconciliation's open differences (all, for a person); None for other tasks.
    pub open_differences: Option<(i64, i64)>,
    /// Rows of each side in a reconciliation's latest comparison, when there was one.
    pub recon_rows: Option<(i64, i64)>,
    /// The last success, in seconds since the epoch (None: never).
    pub last_success: Option<f64>,
    /// How long the oldest ready run has waited to start, in seconds (None: no ready run).
    pub oldest_ready: Option<f64>,
}

/// A task's statuses (tide.health), each with its gauge line (1 for the current one, 0 else).
pub const TASK_STATUSES: [&str; 7] = [
    "ok",
    "late",
    "failing",
    "unbalanced",
    "down",
    "paused",
    "never_ran",
];

/// A heartbeat check's statuses (tide.check_status).
pub const CHECK_STATUSES: [&str; 5] = ["new", "up", "late", "down", "paused"];

/// The outcomes of alert deliveries counted per channel.
pub const DELIVERY_OUTCOMES: [&str; 3] = ["sent", "failed", "dead"];

/// A queue's runs waiting to start, running, and the wait of its oldest ready run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueFigures {
    pub owner: String,
    pub queue: String,
    pub ready: i64,
    pub running: i64,
    pub oldest_ready: Option<f64>,
}

/// Alert deliveries of one of pg_tide's channels by outcome (`pg_tide_deliveries_total`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryCount {
    pub owner: String,
    pub channel: String,
    /// sent, failed, dead: in `DELIVERY_OUTCOMES`' order.
    pub values: [f64; 3],
}

/// pg_tide itself (tide.self_health), for those who may see it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SelfFigures {
    /// The workers alive of each kind, and how many are expected: scheduler, executor,
    /// delivery, notifier.
    pub workers: [(&'static str, i64, i64); 4],
    /// The command workers busy now (top-level commands, commands in other databases).
    pub command_workers: i64,
    /// The last successful tick, in seconds since the epoch.
    pub last_tick: Option<f64>,
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
    /// pg_tide's version (`pg_tide_build_info`).
    pub version: String,
    pub alerts: Vec<AlertCount>,
    pub checks: Vec<CheckStatus>,
    pub tasks: Vec<TaskFigures>,
    pub runs: Vec<RunCount>,
    pub queues: Vec<QueueFigures>,
    pub deliveries: Vec<DeliveryCount>,
    /// None: the reader may not see pg_tide itself (not a superuser, tide_admin or tide_monitor).
    pub own: Option<SelfFigures>,
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

/// One sample line of a task: the family's name with a suffix (`_sum`), the task's labels
/// (quoted once, left open), one more label if any, the value.
fn task_line(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &str,
    more: Option<(&str, &str)>,
    value: Value,
) {
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
                task_line(out, name, suffix, labels, more, value);
            }
        }
    }

    /// A histogram family: for each task, its cumulative buckets (0 before its first
    /// observation: a rate over them works from the start), the +Inf bucket (the count:
    /// observations above the largest bound, or counted before buckets were, are only there),
    /// `_sum` and `_count`.
    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        of: fn(&TaskFigures) -> (&[f64; 13], f64, f64),
    ) {
        self.family(name, "histogram", help);
        let Text { out, tasks } = self;
        for (t, labels) in tasks.iter() {
            let (buckets, sum, count) = of(t);
            let mut line = |suffix, le: Option<&str>, value| {
                task_line(
                    out,
                    name,
                    suffix,
                    labels,
                    le.map(|le| ("le", le)),
                    Value::Num(Some(value)),
                )
            };
            let mut cumulative = 0.0;
            for ((le, _), n) in BUCKETS.iter().zip(buckets) {
                cumulative += n;
                line("_bucket", Some(le), cumulative);
            }
            line("_bucket", Some("+Inf"), count);
            line("_sum", None, sum);
            line("_count", None, count);
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
        "pg_tide_build_info",
        "gauge",
        "pg_tide's version (always 1).",
    );
    x.sample(
        "pg_tide_build_info",
        &[("version", f.version.as_str())],
        Value::Int(1),
    );
    x.family(
        "pg_tide_check_status",
        "gauge",
        "1 for the current status of each heartbeat check, 0 for the others.",
    );
    for c in &f.checks {
        for status in CHECK_STATUSES {
            let labels = [
                ("owner", c.owner.as_str()),
                ("check", c.check.as_str()),
                ("status", status),
            ];
            x.sample(
                "pg_tide_check_status",
                &labels,
                Value::Int(i64::from(c.status == status)),
            );
        }
    }
    x.family(
        "pg_tide_command_workers_busy",
        "gauge",
        "Command workers running (or reporting) a top-level command or a command in another database.",
    );
    if let Some(own) = &f.own {
        x.sample(
            "pg_tide_command_workers_busy",
            &[],
            Value::Int(own.command_workers),
        );
    }
    x.family(
        "pg_tide_deliveries_total",
        "counter",
        "Alert deliveries of pg_tide's channels: sent, failed attempts, and given up (dead).",
    );
    for d in &f.deliveries {
        for (outcome, value) in DELIVERY_OUTCOMES.iter().zip(d.values) {
            let labels = [
                ("owner", d.owner.as_str()),
                ("channel", d.channel.as_str()),
                ("outcome", outcome),
            ];
            x.sample("pg_tide_deliveries_total", &labels, Value::Num(Some(value)));
        }
    }
    x.family(
        "pg_tide_last_tick_timestamp_seconds",
        "gauge",
        "When pg_tide's scheduler last ticked successfully (seconds since the epoch; NaN: not since the server started).",
    );
    if let Some(own) = &f.own {
        x.sample(
            "pg_tide_last_tick_timestamp_seconds",
            &[],
            Value::Num(own.last_tick),
        );
    }
    type QueueGauge = (&'static str, &'static str, fn(&QueueFigures) -> Value);
    let queue_gauges: [QueueGauge; 3] = [
        (
            "pg_tide_queue_oldest_ready_seconds",
            "How long the oldest ready run of the queue has waited to start (0: none).",
            |q| Value::Num(Some(q.oldest_ready.unwrap_or(0.0))),
        ),
        (
            "pg_tide_queue_ready",
            "Runs of the queue ready to start.",
            |q| Value::Int(q.ready),
        ),
        ("pg_tide_queue_running", "Runs of the queue running.", |q| {
            Value::Int(q.running)
        }),
    ];
    for (name, help, value) in queue_gauges {
        x.family(name, "gauge", help);
        for q in &f.queues {
            let labels = [("owner", q.owner.as_str()), ("queue", q.queue.as_str())];
            x.sample(name, &labels, value(q));
        }
    }
    x.histogram(
        "pg_tide_queue_wait_seconds",
        "Time from fire (or creation) to first claim.",
        |t| (&t.wait_buckets, t.wait_sum, t.wait_count),
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
    x.histogram(
        "pg_tide_run_duration_seconds",
        "Duration of successful runs (last attempt).",
        |t| (&t.duration_buckets, t.duration_sum, t.duration_count),
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
    let gauges: [Gauge; 9] = [
        ("pg_tide_task_backlog", "Runs ready or waiting.", |t| {
            Value::Int(t.backlog)
        }),
        (
            "pg_tide_task_consecutive_failures",
            "Failed attempts since the last success.",
            |t| t.consecutive_failures.map_or(Value::Num(None), Value::Int),
        ),
        (
            "pg_tide_task_duration_p50_seconds",
            "Median duration of the successful runs of the last 24 h (NaN: none).",
            |t| Value::Num(t.p50_duration),
        ),
        (
            "pg_tide_task_duration_p95_seconds",
            "95th percentile of the durations of the successful runs of the last 24 h.",
            |t| Value::Num(t.p95_duration),
        ),
        (
            "pg_tide_task_last_success_timestamp_seconds",
            "When the task last succeeded (seconds since the epoch; NaN: never).",
            |t| Value::Num(t.last_success),
        ),
        (
            "pg_tide_task_max_silence_seconds",
            "Silence after which the task is late.",
            |t| Value::Num(t.max_silence),
        ),
        (
            "pg_tide_task_oldest_ready_seconds",
            "How long the task's oldest ready run has waited to start (0: none).",
            |t| Value::Num(Some(t.oldest_ready.unwrap_or(0.0))),
        ),
        (
            "pg_tide_task_queue_wait_p95_seconds",
            "95th percentile of the queue waits of the runs started in the last 24 h.",
            |t| Value::Num(t.p95_queue_wait),
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
    x.family(
        "pg_tide_task_status",
        "gauge",
        "1 for the current status of each task, 0 for the others.",
    );
    {
        let Text { out, tasks } = &mut x;
        for (t, labels) in tasks.iter() {
            for status in TASK_STATUSES {
                task_line(
                    out,
                    "pg_tide_task_status",
                    "",
                    labels,
                    Some(("status", status)),
                    Value::Int(i64::from(t.status == status)),
                );
            }
        }
    }
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
    for (name, help, index) in [
        (
            "pg_tide_workers",
            "pg_tide's background workers alive, by kind (scheduler, executor, delivery, notifier).",
            1,
        ),
        (
            "pg_tide_workers_expected",
            "pg_tide's background workers that should be alive, by kind.",
            2,
        ),
    ] {
        x.family(name, "gauge", help);
        if let Some(own) = &f.own {
            for w in own.workers {
                let value = if index == 1 { w.1 } else { w.2 };
                x.sample(name, &[("kind", w.0)], Value::Int(value));
            }
        }
    }
    x.out
}

/// One sample of an exposition, as rows give it (`tide.metric`): its family, the family's type,
/// the sample's name (a family's name, or with `_bucket`, `_sum`, `_count`), its labels in
/// order, and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub family: String,
    pub kind: String,
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// A label value's text after its opening quote, unescaped, and what follows its closing quote.
fn unquote(s: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((value, &s[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => value.push('\n'),
                c => value.push(c),
            },
            c => value.push(c),
        }
    }
    None
}

/// The samples of an exposition that `render` wrote, read back: the rows of `tide.metric`, so
/// that they can never say other than `tide.metrics()`. A line it cannot read is left out.
pub fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    let (mut family, mut kind) = ("", "");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split(' ');
            family = words.next().unwrap_or("");
            kind = words.next().unwrap_or("");
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some(end) = line.find(['{', ' ']) else {
            continue;
        };
        let name = &line[..end];
        let mut rest = &line[end..];
        let mut labels = Vec::new();
        if let Some(mut inner) = rest.strip_prefix('{') {
            while let Some((key, after)) = inner.split_once("=\"") {
                let Some((value, after)) = unquote(after) else {
                    break;
                };
                labels.push((key.to_string(), value));
                match after.strip_prefix(',') {
                    Some(next) => inner = next,
                    None => {
                        inner = after;
                        break;
                    }
                }
            }
            rest = inner.strip_prefix('}').unwrap_or(inner);
        }
        let value = match rest.trim() {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => match v.parse::<f64>() {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        out.push(Sample {
            family: family.to_string(),
            kind: kind.to_string(),
            name: name.to_string(),
            labels,
            value,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_goes_to_the_smallest_bound_it_is_at_most() {
        let les: Vec<&str> = [0.0, 0.01, 0.0101, 0.05, 0.2, 1.0, 1.5, 21600.0, -1.0]
            .iter()
            .map(|s| le_of(*s).unwrap_or("-"))
            .collect();
        assert_eq!(
            les,
            ["0.01", "0.01", "0.05", "0.05", "0.5", "1", "5", "21600", "0.01"]
        );
        assert_eq!(le_of(21600.5), None);
        assert_eq!(le_of(f64::NAN), None);
        assert_eq!(le_of(f64::INFINITY), None);
        assert_eq!(le_of(f64::NEG_INFINITY), Some("0.01"));
    }

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
            "pg_tide_task_duration_p50_seconds{owner=\"alice\",task=\"t\"} 0.25",
            "pg_tide_task_duration_p95_seconds{owner=\"alice\",task=\"t\"} NaN",
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
            ..Figures::default()
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
        assert_eq!(families.len(), 27);
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
            "pg_tide_task_status{owner=\"alice\",task=\"plain\",status=\"down\"} 0",
            "pg_tide_build_info{version=\"\"} 1",
            "pg_tide_task_unresolved_runs{owner=\"alice\",task=\"plain\",state=\"need_check\"} 0",
        ] {
            assert!(lines(&text).contains(&line), "no {line} in\n{text}");
        }
        // Only reconciliations have their figures; one never compared has no rows yet.
        assert!(!text.contains("task=\"plain\",for="));
        assert!(!text.contains("task=\"new_recon\",side="));
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn histograms_are_cumulative_and_end_with_the_count() {
        let mut t = task("h");
        // Two successes of at most 10 ms, one of at most 1 s, one of two days (above every
        // bound: only in +Inf).
        t.duration_buckets[0] = 2.0;
        t.duration_buckets[4] = 1.0;
        t.duration_sum = 172_801.5;
        t.duration_count = 4.0;
        let idle = task("idle");
        let text = render(&Figures {
            tasks: vec![t, idle],
            ..Figures::default()
        });
        let bucket = |task: &str, le: &str| {
            let prefix =
                format!("pg_tide_run_duration_seconds_bucket{{owner=\"alice\",task=\"{task}\",le=\"{le}\"}} ");
            lines(&text)
                .into_iter()
                .find_map(|l| l.strip_prefix(prefix.as_str()).map(str::to_string))
        };
        assert_eq!(bucket("h", "0.01").as_deref(), Some("2"));
        assert_eq!(bucket("h", "0.5").as_deref(), Some("2"));
        assert_eq!(bucket("h", "1").as_deref(), Some("3"));
        assert_eq!(bucket("h", "21600").as_deref(), Some("3"));
        assert_eq!(bucket("h", "+Inf").as_deref(), Some("4"));
        // A task with nothing observed has every bucket, at 0, from the start.
        assert_eq!(bucket("idle", "+Inf").as_deref(), Some("0"));
        assert_eq!(bucket("idle", "0.01").as_deref(), Some("0"));
        assert_eq!(bucket("idle", "21600").as_deref(), Some("0"));
        assert!(text.contains("# TYPE pg_tide_run_duration_seconds histogram\n"));
        assert!(text.contains("# TYPE pg_tide_queue_wait_seconds histogram\n"));
        // Every bound has its label, in increasing order, and the labels read back as them.
        for pair in BUCKETS.windows(2) {
            assert!(pair[0].1 < pair[1].1);
        }
        for (le, bound) in BUCKETS {
            assert_eq!(le.parse::<f64>(), Ok(bound));
            assert_eq!(bucket_of(le).map(|i| BUCKETS[i].1), Some(bound));
        }
        assert_eq!(bucket_of("+Inf"), None);
    }

    #[test]
    fn pg_tide_itself_queues_and_deliveries_with_their_zeros() {
        let mut t = task("t");
        t.status = "late".into();
        t.last_success = Some(1_765_000_000.5);
        t.oldest_ready = None;
        let text = render(&Figures {
            version: "0.2.2".into(),
            tasks: vec![t],
            checks: vec![CheckStatus {
                owner: "alice".into(),
                check: "backup".into(),
                status: "up".into(),
            }],
            queues: vec![QueueFigures {
                owner: "alice".into(),
                queue: "default".into(),
                ready: 3,
                running: 1,
                oldest_ready: Some(42.5),
            }],
            deliveries: vec![DeliveryCount {
                owner: "alice".into(),
                channel: "ops".into(),
                values: [5.0, 0.0, 0.0],
            }],
            own: Some(SelfFigures {
                workers: [
                    ("scheduler", 1, 1),
                    ("executor", 1, 2),
                    ("delivery", 1, 1),
                    ("notifier", 0, 1),
                ],
                command_workers: 2,
                last_tick: Some(1_765_000_100.25),
            }),
            ..Figures::default()
        });
        for line in [
            "pg_tide_build_info{version=\"0.2.2\"} 1",
            "pg_tide_check_status{owner=\"alice\",check=\"backup\",status=\"up\"} 1",
            "pg_tide_check_status{owner=\"alice\",check=\"backup\",status=\"down\"} 0",
            "pg_tide_command_workers_busy 2",
            "pg_tide_deliveries_total{owner=\"alice\",channel=\"ops\",outcome=\"sent\"} 5",
            "pg_tide_deliveries_total{owner=\"alice\",channel=\"ops\",outcome=\"dead\"} 0",
            "pg_tide_last_tick_timestamp_seconds 1765000100.25",
            "pg_tide_queue_oldest_ready_seconds{owner=\"alice\",queue=\"default\"} 42.5",
            "pg_tide_queue_ready{owner=\"alice\",queue=\"default\"} 3",
            "pg_tide_queue_running{owner=\"alice\",queue=\"default\"} 1",
            "pg_tide_task_last_success_timestamp_seconds{owner=\"alice\",task=\"t\"} 1765000000.5",
            "pg_tide_task_oldest_ready_seconds{owner=\"alice\",task=\"t\"} 0",
            "pg_tide_task_status{owner=\"alice\",task=\"t\",status=\"late\"} 1",
            "pg_tide_task_status{owner=\"alice\",task=\"t\",status=\"ok\"} 0",
            "pg_tide_workers{kind=\"executor\"} 1",
            "pg_tide_workers{kind=\"notifier\"} 0",
            "pg_tide_workers_expected{kind=\"executor\"} 2",
        ] {
            assert!(lines(&text).contains(&line), "no {line} in\n{text}");
        }
        // Every status of the task and the check, once each.
        let statuses = |prefix: &str| {
            lines(&text)
                .iter()
                .filter(|l| l.starts_with(prefix))
                .count()
        };
        assert_eq!(statuses("pg_tide_task_status{"), TASK_STATUSES.len());
        assert_eq!(statuses("pg_tide_check_status{"), CHECK_STATUSES.len());
        // Without pg_tide itself (a role that may not see it): its families have no samples.
        let other = render(&Figures::default());
        assert!(other.contains("# TYPE pg_tide_workers gauge\n"));
        assert!(!other.contains("pg_tide_workers{"));
        assert!(!other.contains("\npg_tide_last_tick_timestamp_seconds "));
    }

    #[test]
    fn samples_read_back_what_render_wrote() {
        let mut t = task("odd \"one\" \\ with, commas={x}\nand a break");
        t.duration_buckets[1] = 1.0;
        t.duration_sum = 0.04;
        t.duration_count = 1.0;
        t.max_silence = Some(f64::INFINITY);
        let figures = Figures {
            alerts: vec![AlertCount {
                kind: "dead_letter".into(),
                severity: "warning".into(),
                open: 2,
            }],
            tasks: vec![t.clone()],
            ..Figures::default()
        };
        let text = render(&figures);
        let rows = samples(&text);
        // One row per sample line.
        let sample_lines = lines(&text).iter().filter(|l| !l.starts_with('#')).count();
        assert_eq!(rows.len(), sample_lines);
        let find = |name: &str, extra: Option<(&str, &str)>| {
            rows.iter().find(|r| {
                r.name == name
                    && extra.is_none_or(|(k, v)| r.labels.iter().any(|(a, b)| a == k && b == v))
            })
        };
        let alerts = find("pg_tide_alerts_open", None).expect("alerts row");
        assert_eq!(alerts.kind, "gauge");
        assert_eq!(
            alerts.labels,
            vec![
                ("kind".into(), "dead_letter".into()),
                ("severity".into(), "warning".into())
            ]
        );
        assert_eq!(alerts.value, 2.0);
        let b =
            find("pg_tide_run_duration_seconds_bucket", Some(("le", "0.05"))).expect("bucket row");
        assert_eq!(b.family, "pg_tide_run_duration_seconds");
        assert_eq!(b.kind, "histogram");
        assert_eq!(b.labels[0], ("owner".to_string(), "alice".to_string()));
        assert_eq!(b.labels[1], ("task".to_string(), t.task.clone()));
        assert_eq!(b.value, 1.0);
        let silence = find("pg_tide_task_max_silence_seconds", None).expect("gauge row");
        assert_eq!(silence.value, f64::INFINITY);
        let p50 = find("pg_tide_task_duration_p50_seconds", None).expect("p50 row");
        assert!(p50.value.is_nan());
        // Lines it cannot read are left out, not guessed at.
        assert!(samples("# TYPE x gauge\nx{a=\"unclosed} 1\nx not_a_number\n").is_empty());
    }
}

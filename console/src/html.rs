//! Server-rendered HTML through maud's templates, which escape every value unless it is marked
//! as markup: the page frame, and the small pieces every page uses (instants in a zone with UTC
//! on hover, durations as people write them, badges, tables, action forms, pagers).

use maud::{html, Markup, DOCTYPE};

/// An instant shown in a zone's local time, with UTC on hover: `local` and `utc` are the
/// database's renderings (`to_char` in the zone and in UTC). Without a local rendering the
/// instant is shown in UTC, and says so.
pub fn when(local: &Option<String>, utc: &Option<String>) -> Markup {
    match (local, utc) {
        (Some(l), Some(u)) => html! { time title=(format!("{u} UTC")) { (l) } },
        (None, Some(u)) => html! { time title=(format!("{u} UTC")) { (u) " UTC" } },
        _ => html! { "–" },
    }
}

/// A duration in seconds as people write it: `2 ms`, `6 s`, `3 min`, `26 h`, `3 d` (one decimal
/// below ten of a unit, `2.5 s`).
pub fn human(secs: f64) -> String {
    if !secs.is_finite() {
        return "–".into();
    }
    if secs < 0.0 {
        return format!("-{}", human(-secs));
    }
    fn unit(v: f64, u: &str) -> String {
        if v < 9.95 && (v - v.round()).abs() >= 0.05 {
            format!("{v:.1} {u}")
        } else {
            format!("{:.0} {u}", v.round())
        }
    }
    if secs < 0.0005 {
        "< 1 ms".into()
    } else if secs < 0.9995 {
        format!("{:.0} ms", (secs * 1000.0).round())
    } else if secs < 59.95 {
        unit(secs, "s")
    } else if secs < 3570.0 {
        unit(secs / 60.0, "min")
    } else if secs < 47.5 * 3600.0 {
        unit(secs / 3600.0, "h")
    } else {
        unit(secs / 86400.0, "d")
    }
}

/// A duration given as seconds (the database's `extract(epoch FROM ...)` as text): humanized,
/// the exact figure on hover; NULL shows as a dash.
pub fn dur(secs: &Option<String>) -> Markup {
    match secs.as_deref().and_then(|s| s.parse::<f64>().ok()) {
        Some(v) => html! { span.dur title=(format!("{v} s")) { (human(v)) } },
        None => html! { "–" },
    }
}

/// A state or status as a coloured badge (classes in the style sheet).
pub fn badge(state: &str) -> Markup {
    html! { span class=(format!("b b-{state}")) { (state) } }
}

/// What the page frame needs to know about the signed-in person.
pub struct Frame<'a> {
    pub user: &'a str,
    pub csrf: &'a str,
    pub read_only: bool,
    /// Which navigation entry is current.
    pub nav: &'a str,
    /// Live updates: `Some("")` refreshes on any change, `Some("12")` only on changes of task
    /// 12, `None` never.
    pub live: Option<String>,
}

const NAV: [(&str, &str, &str); 6] = [
    ("overview", "/", "Overview"),
    ("dead", "/dead", "Dead letters"),
    ("alerts", "/alerts", "Alerts"),
    ("checks", "/checks", "Heartbeats"),
    ("backfills", "/backfills", "Backfills"),
    ("recon", "/recon", "Reconciliations"),
];

/// A whole page: head, navigation, the body in `<main>`.
pub fn page(title: &str, frame: Option<&Frame>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · pg_tide" }
                link rel="stylesheet" href="/static/app.css";
                script src="/static/app.js" defer {}
            }
            body data-live=[frame.and_then(|f| f.live.clone())] {
                @if let Some(f) = frame {
                    nav {
                        a.brand href="/" { "pg_tide" }
                        @for (key, href, label) in NAV {
                            a href=(href) aria-current=[(key == f.nav).then_some("page")] { (label) }
                        }
                        span.who {
                            @if f.read_only { span.ro { "read-only" } }
                            span #user { (f.user) }
                            form method="post" action="/logout" { (csrf_field(f.csrf)) button { "Sign out" } }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The hidden CSRF field every form carries.
pub fn csrf_field(csrf: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(csrf); }
}

/// A one-button form that POSTs an action; nothing in read-only mode.
pub fn action(
    frame: &Frame,
    path: &str,
    label: &str,
    extra: Markup,
    confirm: Option<&str>,
) -> Markup {
    if frame.read_only {
        return html! {};
    }
    html! {
        form.act method="post" action=(path) data-confirm=[confirm] {
            (csrf_field(frame.csrf)) (extra) button { (label) }
        }
    }
}

/// A hidden field.
pub fn hidden(name: &str, value: &str) -> Markup {
    html! { input type="hidden" name=(name) value=(value); }
}

/// An HTML table: headers and rows of cells; on a phone each cell shows its header beside it.
pub fn table(headers: &[&str], rows: &[Vec<Markup>], empty: &str) -> Markup {
    html! {
        @if rows.is_empty() {
            p.empty { (empty) }
        } @else {
            div.scroll {
                table {
                    thead { tr { @for h in headers { th { (h) } } } }
                    tbody {
                        @for r in rows {
                            tr {
                                @for (i, c) in r.iter().enumerate() {
                                    td data-label=(headers.get(i).copied().unwrap_or("")) { (c) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Links to the previous and next page of a list: `base` is the page's address with its other
/// query parameters (ending in `?` or `&`).
pub fn pager(base: &str, page: i64, has_next: bool) -> Markup {
    html! {
        p.pager {
            @if page > 0 { a rel="prev" href=(format!("{base}page={}", page - 1)) { "← previous" } " " }
            @if has_next { a rel="next" href=(format!("{base}page={}", page + 1)) { "next →" } }
        }
    }
}

pub const CSS: &str = include_str!("../static/app.css");
pub const JS: &str = include_str!("../static/app.js");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped() {
        let m = html! { p title=("\"x\"") { ("<script>alert('x') & y</script>") } }.into_string();
        assert_eq!(
            m,
            "<p title=\"&quot;x&quot;\">&lt;script&gt;alert('x') &amp; y&lt;/script&gt;</p>"
        );
        assert_eq!(when(&None, &None).into_string(), "–");
    }

    #[test]
    fn durations_read_as_people_write_them() {
        for (secs, text) in [
            (0.0001, "< 1 ms"),
            (0.002, "2 ms"),
            (0.2504, "250 ms"),
            (0.9999, "1 s"),
            (6.0, "6 s"),
            (2.5, "2.5 s"),
            (42.2, "42 s"),
            (180.0, "3 min"),
            (90.0, "1.5 min"),
            (26.0 * 3600.0, "26 h"),
            (3.0 * 86400.0, "3 d"),
            (-6.0, "-6 s"),
        ] {
            assert_eq!(human(secs), text, "{secs} s");
        }
        assert_eq!(
            dur(&Some("6.0".into())).into_string(),
            "<span class=\"dur\" title=\"6 s\">6 s</span>"
        );
        assert_eq!(dur(&None).into_string(), "–");
    }

    #[test]
    fn read_only_frames_have_no_actions() {
        let f = Frame {
            user: "alice",
            csrf: "t",
            read_only: true,
            nav: "",
            live: None,
        };
        assert_eq!(
            action(&f, "/run/1/replay", "Replay", html! {}, None).into_string(),
            ""
        );
        let f = Frame {
            read_only: false,
            ..f
        };
        let a = action(&f, "/run/1/replay", "Replay", html! {}, None).into_string();
        assert!(a.contains("name=\"csrf\" value=\"t\""), "{a}");
        assert!(a.contains("action=\"/run/1/replay\""), "{a}");
    }
}

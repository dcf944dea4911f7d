//! Server-rendered HTML: escaping, the page frame, and the small pieces every page uses.
//! No template engine: each page is built from these helpers with `format!`, every value from
//! the database passing through `esc`.

use std::fmt::Write;

/// Escapes text for HTML element content and double-quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// Escapes an optional value; NULL shows as a dash.
pub fn opt(s: &Option<String>) -> String {
    match s {
        Some(v) => esc(v),
        None => "–".to_string(),
    }
}

/// An instant shown in a zone's local time, with UTC on hover: `local` and `utc` are the
/// database's renderings (`to_char` in the zone and in UTC).
pub fn when(local: &Option<String>, utc: &Option<String>) -> String {
    match (local, utc) {
        (Some(l), Some(u)) => format!("<time title=\"{} UTC\">{}</time>", esc(u), esc(l)),
        (None, Some(u)) => format!("<time title=\"{0} UTC\">{0} UTC</time>", esc(u)),
        _ => "–".to_string(),
    }
}

/// A state or status as a coloured badge (classes in the style sheet).
pub fn badge(state: &str) -> String {
    format!("<span class=\"b b-{0}\">{0}</span>", esc(state))
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
pub fn page(title: &str, frame: Option<&Frame>, body: &str) -> String {
    let mut nav = String::new();
    let mut live_attr = String::new();
    if let Some(f) = frame {
        nav.push_str("<nav><a class=\"brand\" href=\"/\">pg_tide</a>");
        for (key, href, label) in NAV {
            let cur = if key == f.nav {
                " aria-current=\"page\""
            } else {
                ""
            };
            let _ = write!(nav, "<a href=\"{href}\"{cur}>{label}</a>");
        }
        let ro = if f.read_only {
            "<span class=\"ro\">read-only</span>"
        } else {
            ""
        };
        let _ = write!(
            nav,
            "<span class=\"who\">{ro}<span id=\"user\">{}</span>\
             <form method=\"post\" action=\"/logout\">{}<button>Sign out</button></form></span></nav>",
            esc(f.user),
            csrf_field(f.csrf)
        );
        if let Some(l) = &f.live {
            let _ = write!(live_attr, " data-live=\"{}\"", esc(l));
        }
    }
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · pg_tide</title><link rel=\"stylesheet\" href=\"/static/app.css\">\
         <script src=\"/static/app.js\" defer></script></head>\
         <body{live_attr}>{nav}<main>{body}</main></body></html>",
        esc(title)
    )
}

/// The hidden CSRF field every form carries.
pub fn csrf_field(csrf: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        esc(csrf)
    )
}

/// A one-button form that POSTs an action; hidden in read-only mode.
pub fn action(
    frame: &Frame,
    path: &str,
    label: &str,
    extra: &str,
    confirm: Option<&str>,
) -> String {
    if frame.read_only {
        return String::new();
    }
    let confirm = confirm
        .map(|c| format!(" data-confirm=\"{}\"", esc(c)))
        .unwrap_or_default();
    format!(
        "<form class=\"act\" method=\"post\" action=\"{}\"{confirm}>{}{extra}<button>{}</button></form>",
        esc(path),
        csrf_field(frame.csrf),
        esc(label)
    )
}

/// An HTML table: headers and rows of ready-made cell HTML.
pub fn table(headers: &[&str], rows: &[Vec<String>], empty: &str) -> String {
    if rows.is_empty() {
        return format!("<p class=\"empty\">{}</p>", esc(empty));
    }
    let mut s = String::from("<div class=\"scroll\"><table><thead><tr>");
    for h in headers {
        let _ = write!(s, "<th>{}</th>", esc(h));
    }
    s.push_str("</tr></thead><tbody>");
    for r in rows {
        s.push_str("<tr>");
        for (i, c) in r.iter().enumerate() {
            let label = headers.get(i).copied().unwrap_or("");
            let _ = write!(s, "<td data-label=\"{}\">{c}</td>", esc(label));
        }
        s.push_str("</tr>");
    }
    s.push_str("</tbody></table></div>");
    s
}

pub const CSS: &str = include_str!("../static/app.css");
pub const JS: &str = include_str!("../static/app.js");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc("<script>alert('x') & \"y\"</script>"),
            "&lt;script&gt;alert(&#39;x&#39;) &amp; &quot;y&quot;&lt;/script&gt;"
        );
        assert_eq!(opt(&None), "–");
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
        assert_eq!(action(&f, "/run/1/replay", "Replay", "", None), "");
        let f = Frame {
            read_only: false,
            ..f
        };
        let a = action(&f, "/run/1/replay", "Replay", "", None);
        assert!(a.contains("name=\"csrf\" value=\"t\""), "{a}");
        assert!(a.contains("action=\"/run/1/replay\""), "{a}");
    }
}

//! What an alert looks like when it leaves the database, and how it is sent: the text and body of
//! a webhook (accepted by Slack, Mattermost and Discord incoming webhooks), its HMAC-SHA256
//! signature, an e-mail over SMTP with STARTTLS, and the dead-man's-switch ping.
//!
//! No pgrx here: the delivery worker (`src/alerts/delivery.rs`) calls these outside any transaction,
//! and the formatting is unit-tested with plain `cargo test`. Error messages never carry a
//! channel's secrets (its URL, signing secret, SMTP password): every message is scrubbed of them.

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

/// How one delivery attempt ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    /// Worth trying again later (the receiver is down, slow or overloaded).
    Retry(String),
    /// Trying again cannot help (the receiver refused the request, the configuration is wrong).
    Permanent(String),
}

fn field<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// One line that says what happened: `[pg_tide] CRITICAL opened: dead_letter of task nightly`.
pub fn headline(event: &Value) -> String {
    let what = match field(event, "event") {
        "opened" => "opened",
        "resolved" => "resolved",
        "renotify" => "still open",
        "escalated" => "escalated",
        other => other,
    };
    format!(
        "[pg_tide] {} {}: {} of {} {}",
        field(event, "severity").to_uppercase(),
        what,
        field(event, "kind"),
        field(event, "subject_type"),
        field(event, "subject"),
    )
}

/// The message a person reads: the headline, then the details and what to do.
pub fn text(event: &Value) -> String {
    let mut out = headline(event);
    if let Some(details) = event
        .get("details")
        .filter(|d| d.as_object().is_some_and(|o| !o.is_empty()))
    {
        out.push_str(&format!("\ndetails: {details}"));
    }
    if let Some(opened) = event.get("opened_at").and_then(Value::as_str) {
        out.push_str(&format!("\nopened at {opened}"));
    }
    if let Some(resolved) = event.get("resolved_at").and_then(Value::as_str) {
        out.push_str(&format!(", resolved at {resolved}"));
    }
    if let Some(id) = event.get("alert_id").and_then(Value::as_i64) {
        if field(event, "event") != "resolved" {
            out.push_str(&format!(
                "\nacknowledge in psql: SELECT tide.ack_alert({id}, 'looking into it');"
            ));
        }
    }
    out
}

/// The JSON body of a webhook. `chat` (the default): `text` (Slack, Mattermost) and `content`
/// (Discord) carry the message, `event` the alert itself and `delivery_id` the dedupe id; `json`:
/// the alert with its `delivery_id`, for a receiver of one's own.
pub fn webhook_body(event: &Value, delivery_id: &str, format: &str) -> String {
    let body = if format == "json" {
        let mut e = event.clone();
        if let Some(o) = e.as_object_mut() {
            o.insert("delivery_id".into(), json!(delivery_id));
        }
        e
    } else {
        // Discord refuses content longer than 2000 characters.
        let message: String = text(event).chars().take(1900).collect();
        json!({
            "text": message,
            "content": message,
            "username": "pg_tide",
            "event": event,
            "delivery_id": delivery_id,
        })
    };
    body.to_string()
}

/// `sha256=<hex>`: HMAC-SHA256 of the body with the channel's secret (GitHub's header format).
pub fn signature(secret: &str, body: &str) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC accepts a key of any size");
    mac.update(body.as_bytes());
    let bytes = mac.finalize().into_bytes();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// `message` with every secret replaced by `[secret]`.
pub fn scrub(message: &str, secrets: &[&str]) -> String {
    let mut out = message.to_string();
    for s in secrets.iter().filter(|s| s.len() >= 4) {
        out = out.replace(s, "[secret]");
    }
    out.chars().take(1000).collect()
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .user_agent(concat!("pg_tide/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// What went wrong in a request, without the URL.
fn http_error(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(t) => format!("timed out ({t})"),
        ureq::Error::HostNotFound => "host not found".to_string(),
        ureq::Error::Io(io) => format!("connection failed: {}", io.kind()),
        ureq::Error::ConnectionFailed => "connection failed".to_string(),
        ureq::Error::Tls(msg) => format!("TLS: {msg}"),
        ureq::Error::BadUri(_) => "the URL is not valid".to_string(),
        other => format!("request failed: {other}"),
    }
}

/// Sends one alert event to a webhook channel.
pub fn send_webhook(
    config: &Value,
    event: &Value,
    delivery_id: &str,
    timeout: Duration,
) -> Outcome {
    let url = field(config, "url");
    let secret = config.get("secret").and_then(Value::as_str);
    let secrets = [url, secret.unwrap_or("")];
    let body = webhook_body(
        event,
        delivery_id,
        config
            .get("format")
            .and_then(Value::as_str)
            .unwrap_or("chat"),
    );
    let mut request = agent(timeout)
        .post(url)
        .header("Content-Type", "application/json")
        .header("X-Tide-Delivery", delivery_id)
        .header("Idempotency-Key", delivery_id)
        .header("X-Tide-Event", field(event, "event"));
    if let Some(secret) = secret {
        request = request.header("X-Tide-Signature", signature(secret, &body));
    }
    match request.send(body.as_str()) {
        Ok(response) => {
            let status = response.status().as_u16();
            match status {
                200..=299 => Outcome::Delivered,
                408 | 425 | 429 | 500..=599 => {
                    Outcome::Retry(format!("the receiver answered HTTP {status}"))
                }
                _ => Outcome::Permanent(format!("the receiver refused it: HTTP {status}")),
            }
        }
        Err(e) => {
            let message = scrub(&http_error(&e), &secrets);
            match e {
                ureq::Error::BadUri(_) => Outcome::Permanent(message),
                _ => Outcome::Retry(message),
            }
        }
    }
}

/// The Message-ID of an alert e-mail: the same for every copy of one alert event, so that mail
/// clients show a duplicate once.
pub fn message_id(delivery_id: &str) -> String {
    let local: String = delivery_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '.'
            }
        })
        .collect();
    format!("<{local}@pg_tide>")
}

/// The addresses of `config->'to'`: one string or an array of strings.
pub fn recipients(config: &Value) -> Vec<String> {
    match config.get("to") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        _ => vec![],
    }
}

/// Sends one alert event to an e-mail channel.
pub fn send_email(config: &Value, event: &Value, delivery_id: &str, timeout: Duration) -> Outcome {
    use lettre::message::{header::ContentType, Mailbox, Message};
    use lettre::transport::smtp::authentication::Credentials;
    use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
    use lettre::{SmtpTransport, Transport};

    let password = field(config, "password");
    let username = field(config, "username");
    let secrets = [password];
    let permanent = |what: &str, e: &dyn std::fmt::Display| {
        Outcome::Permanent(scrub(&format!("{what}: {e}"), &secrets))
    };
    let from: Mailbox = match field(config, "from").parse() {
        Ok(m) => m,
        Err(e) => return permanent("from", &e),
    };
    let mut builder = Message::builder()
        .from(from)
        .subject(headline(event))
        .message_id(Some(message_id(delivery_id)))
        .header(ContentType::TEXT_PLAIN);
    for to in recipients(config) {
        match to.parse::<Mailbox>() {
            Ok(m) => builder = builder.to(m),
            Err(e) => return permanent("to", &e),
        }
    }
    let body = format!("{}\n\ndelivery id: {delivery_id}\n", text(event));
    let message = match builder.body(body) {
        Ok(m) => m,
        Err(e) => return permanent("message", &e),
    };
    let host = field(config, "host");
    let mode = config
        .get("tls")
        .and_then(Value::as_str)
        .unwrap_or("starttls");
    let tls = if mode == "none" {
        Tls::None
    } else {
        let mut params = TlsParameters::builder(host.to_string());
        if let Some(pem) = config.get("ca_cert").and_then(Value::as_str) {
            match Certificate::from_pem(pem.as_bytes()) {
                Ok(c) => params = params.add_root_certificate(c),
                Err(e) => return permanent("ca_cert", &e),
            }
        }
        match params.build_rustls() {
            Ok(p) if mode == "tls" => Tls::Wrapper(p),
            Ok(p) => Tls::Required(p),
            Err(e) => return permanent("TLS", &e),
        }
    };
    let default_port = if mode == "tls" { 465 } else { 587 };
    let port = config
        .get("port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(default_port);
    let mut transport = SmtpTransport::builder_dangerous(host)
        .port(port)
        .tls(tls)
        .timeout(Some(timeout));
    if !username.is_empty() {
        transport =
            transport.credentials(Credentials::new(username.to_string(), password.to_string()));
    }
    match transport.build().send(&message) {
        Ok(_) => Outcome::Delivered,
        Err(e) if e.is_permanent() => Outcome::Permanent(scrub(&format!("SMTP: {e}"), &secrets)),
        Err(e) => Outcome::Retry(scrub(&format!("SMTP: {e}"), &secrets)),
    }
}

/// Where a dead-man's-switch ping goes: `url` while all is well; otherwise the failure URL when
/// one is set (Uptime Kuma's push URL with `status=down`), else Healthchecks' `url/fail`.
pub fn ping_target(url: &str, fail_url: Option<&str>, ok: bool) -> String {
    match (ok, fail_url) {
        (true, _) => url.to_string(),
        (false, Some(fail)) => fail.to_string(),
        (false, None) => format!("{}/fail", url.trim_end_matches('/')),
    }
}

/// Pings a dead-man's-switch URL (see `ping_target`) with a short text body. Returns the HTTP
/// status, or an error without the URLs.
pub fn ping(
    url: &str,
    fail_url: Option<&str>,
    ok: bool,
    body: &str,
    timeout: Duration,
) -> Result<u16, String> {
    let target = ping_target(url, fail_url, ok);
    match agent(timeout)
        .post(&target)
        .header("Content-Type", "text/plain")
        .send(body)
    {
        Ok(r) => Ok(r.status().as_u16()),
        Err(e) => Err(scrub(&http_error(&e), &[url, fail_url.unwrap_or("")])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> Value {
        json!({"event": "opened", "alert_id": 7, "subject_type": "task", "subject": "nightly",
               "kind": "dead_letter", "severity": "critical", "opened_at": "2026-12-01T10:00:00+00:00",
               "details": {"dead": 1}})
    }

    #[test]
    fn a_failing_ping_goes_to_the_failure_url_or_to_slash_fail() {
        let hc = "https://hc-ping.com/uuid";
        assert_eq!(ping_target(hc, None, true), hc);
        assert_eq!(
            ping_target(hc, None, false),
            "https://hc-ping.com/uuid/fail"
        );
        assert_eq!(
            ping_target("https://hc-ping.com/uuid/", None, false),
            "https://hc-ping.com/uuid/fail"
        );
        let up = "https://kuma.example.com/api/push/Tok?status=up&msg=OK";
        let down = "https://kuma.example.com/api/push/Tok?status=down&msg=pg_tide";
        assert_eq!(ping_target(up, Some(down), true), up);
        assert_eq!(ping_target(up, Some(down), false), down);
    }

    #[test]
    fn headline_names_severity_kind_and_subject() {
        assert_eq!(
            headline(&event()),
            "[pg_tide] CRITICAL opened: dead_letter of task nightly"
        );
        let mut e = event();
        e["event"] = json!("renotify");
        assert!(headline(&e).contains("still open"));
    }

    #[test]
    fn chat_body_has_text_for_slack_and_content_for_discord() {
        let body: Value =
            serde_json::from_str(&webhook_body(&event(), "alert:7:opened:ops", "chat")).unwrap();
        assert_eq!(body["text"], body["content"]);
        assert!(body["text"]
            .as_str()
            .unwrap()
            .contains("SELECT tide.ack_alert(7"));
        assert_eq!(body["event"]["alert_id"], 7);
        assert_eq!(body["delivery_id"], "alert:7:opened:ops");
        let raw: Value = serde_json::from_str(&webhook_body(&event(), "d", "json")).unwrap();
        assert_eq!(raw["kind"], "dead_letter");
        assert_eq!(raw["delivery_id"], "d");
        assert!(raw.get("text").is_none());
    }

    #[test]
    fn long_messages_fit_discord() {
        let mut e = event();
        e["details"] = json!({"x": "y".repeat(5000)});
        let body: Value = serde_json::from_str(&webhook_body(&e, "d", "chat")).unwrap();
        assert!(body["content"].as_str().unwrap().chars().count() <= 2000);
    }

    #[test]
    fn signature_is_rfc_4231_hmac_sha256() {
        // RFC 4231 test case 2.
        assert_eq!(
            signature("Jefe", "what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn scrub_hides_secrets() {
        let s = scrub(
            "failed to reach https://hooks.example/T123/secret",
            &["https://hooks.example/T123/secret", ""],
        );
        assert_eq!(s, "failed to reach [secret]");
    }

    #[test]
    fn message_id_is_stable_and_valid() {
        assert_eq!(
            message_id("alert:7:opened:mail"),
            "<alert.7.opened.mail@pg_tide>"
        );
        assert_eq!(
            recipients(&json!({"to": ["a@x", "b@x"]})),
            vec!["a@x", "b@x"]
        );
        assert_eq!(recipients(&json!({"to": "a@x"})), vec!["a@x"]);
    }

    #[test]
    fn a_receiver_that_is_down_is_retried() {
        // A port of 127.0.0.1 that was free a moment ago: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let url = format!("http://127.0.0.1:{port}/hook/secret-path");
        let cfg = json!({ "url": url });
        match send_webhook(&cfg, &event(), "d", Duration::from_secs(2)) {
            Outcome::Retry(m) => assert!(
                !m.contains("secret-path") && !m.contains(&port.to_string()),
                "{m}"
            ),
            other => panic!("expected a retry, got {other:?}"),
        }
    }
}

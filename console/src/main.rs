//! pg_tide-console: a web console for the people who own pg_tide's tasks.
//!
//! Server-rendered HTML over pg_tide's SQL API, signed in as a PostgreSQL role (see
//! `session.rs`): the console keeps no data and decides nothing; PostgreSQL, as the signed-in
//! role, decides what each person sees and may do. Pages update live through LISTEN/NOTIFY
//! relayed to the browser as server-sent events (`live.rs`).

mod charts;
mod html;
mod live;
mod metrics;
mod pages;
mod session;
mod throttle;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, COOKIE, HOST, ORIGIN, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use clap::Parser;
use maud::html;
use serde::Deserialize;
use tokio_postgres::Client;

use session::{Session, Sessions};

pub struct App {
    pub sessions: Sessions,
    pub read_only: bool,
    secure_cookies: bool,
    /// `/metrics`, when `--metrics-database` is given.
    pub metrics: Option<metrics::Metrics>,
    /// Failed sign-ins per role and per address.
    throttle: throttle::Throttle,
    /// Take the client's address from `X-Forwarded-For` (behind a reverse proxy).
    trust_forwarded_for: bool,
}

pub type AppState = State<Arc<App>>;

/// pg_tide's web console: server-rendered pages over pg_tide's SQL API, signed in as a
/// PostgreSQL role. Every option can also be given as an environment variable (for a systemd
/// unit's EnvironmentFile).
#[derive(Parser, Debug)]
#[command(name = "pg_tide-console", version, about, long_about = None)]
struct Args {
    /// Where pg_tide is: postgres://host:port/dbname?sslmode=prefer (user and password come from
    /// each person's sign-in), or key=value pairs (host=/var/run/postgresql dbname=postgres).
    #[arg(
        long,
        env = "PG_TIDE_CONSOLE_DATABASE",
        value_name = "URL",
        required_unless_present = "metrics_only"
    )]
    database: Option<String>,
    /// Address to serve on (loopback by default: put a reverse proxy with TLS in front).
    #[arg(
        long,
        env = "PG_TIDE_CONSOLE_LISTEN",
        default_value = "127.0.0.1:8790",
        value_name = "ADDR"
    )]
    listen: SocketAddr,
    /// Show everything, change nothing (no action buttons; every transaction read-only).
    #[arg(long, env = "PG_TIDE_CONSOLE_READ_ONLY")]
    read_only: bool,
    /// Mark the session cookie Secure (behind a reverse proxy with TLS).
    #[arg(long, env = "PG_TIDE_CONSOLE_SECURE_COOKIES")]
    secure_cookies: bool,
    /// Serve /metrics (Prometheus) from a read-only connection of its own, as the role in URL, a
    /// member of tide_monitor: postgres://scraper:password@host:port/dbname.
    #[arg(long, env = "PG_TIDE_CONSOLE_METRICS_DATABASE", value_name = "URL")]
    metrics_database: Option<String>,
    /// Serve /metrics alone, no web pages (--database is then not needed).
    #[arg(
        long,
        env = "PG_TIDE_CONSOLE_METRICS_ONLY",
        requires = "metrics_database"
    )]
    metrics_only: bool,
    /// Check the database server's TLS certificate against this CA (PEM) and the host name
    /// (without it, TLS is used as the URL's sslmode says, the certificate unchecked).
    #[arg(long, env = "PG_TIDE_CONSOLE_DATABASE_CA", value_name = "FILE")]
    database_ca: Option<String>,
    /// Failed sign-ins in a row, for a role or from an address, before its sign-ins pause.
    #[arg(long, env = "PG_TIDE_CONSOLE_SIGN_IN_FAILURES", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..=1000), value_name = "N")]
    sign_in_failures: u32,
    /// How long sign-ins of a throttled role or address are refused, in seconds.
    #[arg(long, env = "PG_TIDE_CONSOLE_SIGN_IN_PAUSE", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86400), value_name = "SECONDS")]
    sign_in_pause: u64,
    /// Take the client's address for sign-in throttling from the last X-Forwarded-For entry
    /// (only behind a reverse proxy that sets it).
    #[arg(long, env = "PG_TIDE_CONSOLE_TRUST_FORWARDED_FOR")]
    trust_forwarded_for: bool,
}

/// A connection URL, or exit with what is wrong with it.
fn config_of(option: &str, url: &str) -> tokio_postgres::Config {
    url.parse().unwrap_or_else(|e| {
        eprintln!("pg_tide-console: {option} {url:?}: {e}");
        std::process::exit(2);
    })
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let tls = tls::connector(args.database_ca.as_deref()).unwrap_or_else(|e| {
        eprintln!("pg_tide-console: {e}");
        std::process::exit(2);
    });
    // Metrics only: no pages, and no database for them (a base that is never connected to).
    let base = args
        .database
        .as_deref()
        .map_or_else(tokio_postgres::Config::new, |url| {
            config_of("--database", url)
        });
    let app = Arc::new(App {
        sessions: Sessions::new(base, tls.clone(), args.read_only),
        read_only: args.read_only,
        secure_cookies: args.secure_cookies,
        metrics: args
            .metrics_database
            .as_deref()
            .map(|url| metrics::Metrics::new(config_of("--metrics-database", url), tls.clone())),
        throttle: throttle::Throttle::new(
            args.sign_in_failures,
            Duration::from_secs(args.sign_in_pause),
        ),
        trust_forwarded_for: args.trust_forwarded_for,
    });
    let router = if args.metrics_only {
        Router::new()
            .route("/metrics", get(metrics::serve))
            .fallback(|| async {
                (
                    StatusCode::NOT_FOUND,
                    "pg_tide-console --metrics-only serves /metrics alone\n",
                )
            })
            .with_state(app)
    } else {
        pages_router(app)
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("pg_tide-console: cannot listen on {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    println!(
        "pg_tide-console: serving http://{} for {}{}{}",
        listener.local_addr().unwrap_or(args.listen),
        args.database.as_deref().unwrap_or("metrics only"),
        if args.read_only { " (read-only)" } else { "" },
        if args.metrics_database.is_some() {
            ", /metrics"
        } else {
            ""
        }
    );
    serve(listener, router).await;
}

/// The console's pages (and /metrics when it is configured).
fn pages_router(app: Arc<App>) -> Router {
    Router::new()
        .route("/metrics", get(metrics::serve))
        .route("/", get(pages::overview))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/task/{id}", get(pages::task))
        .route("/run/{id}", get(pages::run))
        .route("/run/{id}/{verb}", post(pages::run_action))
        .route("/dead", get(pages::dead))
        .route("/dead/replay", post(pages::replay_many))
        .route("/alerts", get(pages::alerts))
        .route("/alerts/ack", post(pages::ack_many))
        .route("/alert/{id}/ack", post(pages::ack))
        .route("/checks", get(pages::checks))
        .route("/backfills", get(pages::backfills))
        .route("/backfill/{id}/{verb}", post(pages::backfill_action))
        .route("/recon", get(pages::recon))
        .route("/diff/{id}/resolve", post(pages::resolve_diff))
        .route("/events", get(live::events))
        .route(
            "/static/app.css",
            get(|| async { asset("text/css", html::CSS) }),
        )
        .route(
            "/static/app.js",
            get(|| async { asset("text/javascript", html::JS) }),
        )
        .fallback(|| async { Fail::NotFound("no such page".into()) })
        .layer(axum::middleware::map_response(security_headers))
        .with_state(app)
}

/// Serves until SIGTERM or ^C.
async fn serve(listener: tokio::net::TcpListener, router: Router) {
    let served = axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    })
    .await;
    if let Err(e) = served {
        eprintln!("pg_tide-console: {e}");
        std::process::exit(1);
    }
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, kind),
            (CACHE_CONTROL, "public, max-age=3600"),
        ],
        body,
    )
        .into_response()
}

/// Every response: no framing, no sniffing, scripts and styles only from the console itself.
async fn security_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        ),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    r
}

/// What went wrong, as a page: a refusal by PostgreSQL (its SQLSTATE, message and hint), a
/// forged or stale form, a read-only console, or a missing object.
#[derive(Debug)]
pub enum Fail {
    Db(tokio_postgres::Error),
    Forbidden(String),
    NotFound(String),
    BadRequest(String),
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Fail {
        Fail::Db(e)
    }
}

impl IntoResponse for Fail {
    fn into_response(self) -> Response {
        let (status, title, body) = match &self {
            Fail::Db(e) => match e.as_db_error() {
                Some(db) => {
                    let code = db.code().code();
                    let status = match code {
                        "42501" => StatusCode::FORBIDDEN,
                        "42704" => StatusCode::NOT_FOUND,
                        c if c.starts_with("22") || c == "42P08" => StatusCode::BAD_REQUEST,
                        "55000" | "23505" | "40001" | "40P01" => StatusCode::CONFLICT,
                        _ => StatusCode::INTERNAL_SERVER_ERROR,
                    };
                    let title = if status == StatusCode::FORBIDDEN {
                        "Not allowed"
                    } else {
                        "PostgreSQL refused this"
                    };
                    let body = html! {
                        p.err { code { (code) } " " (db.message()) }
                        @if let Some(d) = db.detail() { p { (d) } }
                        @if let Some(h) = db.hint() { p.hint { "Hint: " (h) } }
                    };
                    (status, title, body)
                }
                None => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Cannot reach PostgreSQL",
                    html! { p.err { (with_causes(e)) } },
                ),
            },
            Fail::Forbidden(m) => (
                StatusCode::FORBIDDEN,
                "Not allowed",
                html! { p.err { (m) } },
            ),
            Fail::NotFound(m) => (StatusCode::NOT_FOUND, "Not found", html! { p.err { (m) } }),
            Fail::BadRequest(m) => (
                StatusCode::BAD_REQUEST,
                "Bad request",
                html! { p.err { (m) } },
            ),
        };
        let body = html! {
            section.refusal #refusal { h1 { (title) } (body) p { a href="/" { "Back to the overview" } } }
        };
        (
            status,
            axum::response::Html(html::page(title, None, body).into_string()),
        )
            .into_response()
    }
}

/// An error with what caused it ("error performing TLS handshake: invalid peer certificate:
/// UnknownIssuer"): the top line alone rarely says what to fix.
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// A signed-in request: the session and its connection.
pub struct Ctx {
    pub session: Arc<Session>,
    pub db: Arc<Client>,
    pub app: Arc<App>,
    /// The browser said the request came from another site (its `Origin`).
    cross_origin: bool,
}

impl Ctx {
    pub fn frame(&self, nav: &'static str, live: Option<String>) -> html::Frame<'_> {
        html::Frame {
            user: &self.session.user,
            csrf: &self.session.csrf,
            read_only: self.app.read_only,
            nav,
            live,
        }
    }

    /// Every action checks its form came from this session (the CSRF token) and that the
    /// console may change things at all.
    pub fn check_action(&self, csrf: &Option<String>) -> Result<(), Fail> {
        check_form(&self.session, self.cross_origin, csrf)?;
        if self.app.read_only {
            return Err(Fail::Forbidden(
                "this console runs read-only (--read-only): nothing was done".into(),
            ));
        }
        Ok(())
    }
}

/// A form posted by a signed-in person came from this console: from its own site (the
/// `Origin`), with the session's CSRF token.
fn check_form(session: &Session, cross: bool, csrf: &Option<String>) -> Result<(), Fail> {
    if cross {
        return Err(Fail::Forbidden(CROSS_ORIGIN.into()));
    }
    match csrf {
        Some(t) if session::same_token(t, &session.csrf) => Ok(()),
        _ => Err(Fail::Forbidden(
            "this form did not come from your session (its CSRF token is missing or wrong): nothing was done"
                .into(),
        )),
    }
}

const CROSS_ORIGIN: &str =
    "this form was sent from another site (its Origin is not this console's): nothing was done";

/// Whether a browser's `Origin` names another site than the `Host` asked for. Requests without
/// an `Origin` (not from a browser's form or script) are judged by their session and CSRF token
/// alone; behind a proxy, the proxy must pass the `Host` on.
fn cross_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(ORIGIN) else {
        return false;
    };
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    match origin.to_str().ok().and_then(|o| o.split_once("://")) {
        Some((_, rest)) => !rest.trim_end_matches('/').eq_ignore_ascii_case(host),
        None => true, // "null" or garbage
    }
}

fn session_of(parts: &Parts, app: &App) -> Option<(String, Arc<Session>)> {
    let header = parts.headers.get(COOKIE)?.to_str().ok()?;
    let id = session::cookie(header, "tide_session")?;
    Some((id.to_string(), app.sessions.get(id)?))
}

/// Not signed in: a page is sent to the sign-in form, an action is refused.
fn not_signed_in(parts: &Parts) -> Response {
    if parts.method == Method::GET {
        Redirect::to("/login").into_response()
    } else {
        Fail::Forbidden("you are not signed in (or your session ended): nothing was done".into())
            .into_response()
    }
}

impl FromRequestParts<Arc<App>> for Ctx {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Response> {
        let Some((id, session)) = session_of(parts, app) else {
            return Err(not_signed_in(parts));
        };
        let db = match app.sessions.client(&session).await {
            Ok(db) => db,
            // The role may no longer sign in (its password changed, it lost LOGIN or was
            // dropped): the session ends, as if signed out.
            Err(e) if e.code().is_some_and(|c| c.code().starts_with("28")) => {
                app.sessions.sign_out(&id);
                return Err(not_signed_in(parts));
            }
            Err(e) => return Err(Fail::Db(e).into_response()),
        };
        Ok(Ctx {
            session,
            db,
            app: app.clone(),
            cross_origin: cross_origin(&parts.headers),
        })
    }
}

/// A signed-in request without its connection (sign-out, the live stream).
pub struct Signed {
    pub id: String,
    pub session: Arc<Session>,
    pub app: Arc<App>,
}

impl FromRequestParts<Arc<App>> for Signed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Response> {
        match session_of(parts, app) {
            Some((id, session)) => Ok(Signed {
                id,
                session,
                app: app.clone(),
            }),
            None => Err(not_signed_in(parts)),
        }
    }
}

fn login_form(status: StatusCode, error: Option<&str>, user: &str) -> Response {
    let body = html! {
        section.login {
            h1 { "pg_tide" }
            p { "Sign in with your PostgreSQL role: you see and change what PostgreSQL lets that role see and change." }
            @if let Some(e) = error { p.err #login-error { (e) } }
            form method="post" action="/login" {
                label { "Role " input name="user" #user-field autocomplete="username" required value=(user); }
                label { "Password " input type="password" name="password" #password-field autocomplete="current-password"; }
                button #sign-in { "Sign in" }
            }
        }
    };
    (
        status,
        axum::response::Html(html::page("Sign in", None, body).into_string()),
    )
        .into_response()
}

async fn login_page() -> Response {
    login_form(StatusCode::OK, None, "")
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    user: String,
    #[serde(default)]
    password: String,
}

/// The address a sign-in comes from: the peer's, or behind a trusted proxy the last entry of
/// `X-Forwarded-For` (the one the proxy added).
fn client_addr(app: &App, peer: SocketAddr, headers: &HeaderMap) -> String {
    if app.trust_forwarded_for {
        if let Some(last) = headers
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit(',').next())
            .map(str::trim)
            .filter(|v| !v.is_empty())
        {
            return last.to_string();
        }
    }
    peer.ip().to_string()
}

async fn login(
    State(app): AppState,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    if cross_origin(&headers) {
        return Fail::Forbidden(CROSS_ORIGIN.into()).into_response();
    }
    let user = f.user.trim();
    if user.is_empty() {
        return login_form(StatusCode::UNAUTHORIZED, Some("a role name is needed"), "");
    }
    let addr = client_addr(&app, peer, &headers);
    // Throttled: refused at once, PostgreSQL is not asked.
    if let Err(r) = app.throttle.check(user, &addr, Instant::now()) {
        let secs = r.wait.as_secs() + u64::from(r.wait.subsec_nanos() > 0);
        let mut resp = login_form(
            StatusCode::TOO_MANY_REQUESTS,
            Some(&format!(
                "too many failed sign-ins for {}: try again in {}",
                r.what,
                html::human(secs as f64)
            )),
            user,
        );
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            resp.headers_mut().insert("retry-after", v);
        }
        return resp;
    }
    match app.sessions.sign_in(user, &f.password).await {
        Ok(id) => {
            app.throttle.succeeded(user, &addr);
            let secure = if app.secure_cookies { "; Secure" } else { "" };
            let cookie = format!("tide_session={id}; Path=/; HttpOnly; SameSite=Strict{secure}");
            let mut r = Redirect::to("/").into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(SET_COOKIE, v);
            }
            r
        }
        Err(e) => {
            // Only a refusal of the role or its password counts (28xxx: invalid authorization);
            // a server that is down is not the person's failure.
            let (msg, counts) = match e.as_db_error() {
                Some(db) => (
                    format!("PostgreSQL refused the sign-in: {}", db.message()),
                    db.code().code().starts_with("28"),
                ),
                None => (format!("cannot sign in: {}", with_causes(&e)), false),
            };
            if counts {
                app.throttle.failed(user, &addr, Instant::now());
            }
            login_form(StatusCode::UNAUTHORIZED, Some(&msg), user)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(origin: Option<&str>, host: &str) -> HeaderMap {
        let mut m = HeaderMap::new();
        m.insert(HOST, HeaderValue::from_str(host).unwrap());
        if let Some(o) = origin {
            m.insert(ORIGIN, HeaderValue::from_str(o).unwrap());
        }
        m
    }

    #[test]
    fn options_are_checked_as_they_are_read() {
        use clap::CommandFactory;
        Args::command().debug_assert();
        let a = Args::try_parse_from(["pg_tide-console", "--database", "postgres://h/db"]).unwrap();
        assert_eq!(a.listen.to_string(), "127.0.0.1:8790");
        assert_eq!((a.sign_in_failures, a.sign_in_pause), (10, 60));
        assert!(!a.read_only && !a.metrics_only);
        for bad in [
            vec!["pg_tide-console"],
            vec!["pg_tide-console", "--metrics-only"],
            vec![
                "pg_tide-console",
                "--database",
                "x",
                "--sign-in-failures",
                "0",
            ],
            vec![
                "pg_tide-console",
                "--database",
                "x",
                "--listen",
                "localhost",
            ],
        ] {
            assert!(Args::try_parse_from(&bad).is_err(), "{bad:?}");
        }
        let m = Args::try_parse_from([
            "pg_tide-console",
            "--metrics-only",
            "--metrics-database",
            "postgres://scraper@h/db",
        ])
        .unwrap();
        assert!(m.metrics_only && m.database.is_none());
    }

    #[test]
    fn posts_from_other_sites_are_told_apart() {
        assert!(
            !cross_origin(&h(None, "127.0.0.1:8790")),
            "no Origin: not a browser's cross-site post"
        );
        assert!(!cross_origin(&h(
            Some("http://127.0.0.1:8790"),
            "127.0.0.1:8790"
        )));
        assert!(!cross_origin(&h(
            Some("https://Tide.example.com"),
            "tide.example.com"
        )));
        assert!(cross_origin(&h(
            Some("https://evil.example"),
            "tide.example.com"
        )));
        assert!(cross_origin(&h(
            Some("http://127.0.0.1:9999"),
            "127.0.0.1:8790"
        )));
        assert!(cross_origin(&h(Some("null"), "127.0.0.1:8790")));
    }
}

#[derive(Deserialize)]
pub struct CsrfForm {
    pub csrf: Option<String>,
}

async fn logout(s: Signed, headers: HeaderMap, Form(f): Form<CsrfForm>) -> Response {
    if let Err(refused) = check_form(&s.session, cross_origin(&headers), &f.csrf) {
        return refused.into_response();
    }
    s.app.sessions.sign_out(&s.id);
    let mut r = Redirect::to("/login").into_response();
    r.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_static("tide_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    r
}

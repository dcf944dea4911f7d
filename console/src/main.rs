//! pg_tide-console: a web console for the people who own pg_tide's tasks.
//!
//! Server-rendered HTML over pg_tide's SQL API, signed in as a PostgreSQL role (see
//! `session.rs`): the console keeps no data and decides nothing; PostgreSQL, as the signed-in
//! role, decides what each person sees and may do. Pages update live through LISTEN/NOTIFY
//! relayed to the browser as server-sent events (`live.rs`).

mod html;
mod live;
mod metrics;
mod pages;
mod session;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{FromRequestParts, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, COOKIE, HOST, ORIGIN, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;
use tokio_postgres::Client;

use session::{Session, Sessions};

pub struct App {
    pub sessions: Sessions,
    pub read_only: bool,
    secure_cookies: bool,
    /// `/metrics`, when `--metrics-database` is given.
    pub metrics: Option<metrics::Metrics>,
}

pub type AppState = State<Arc<App>>;

const USAGE: &str =
    "usage: pg_tide-console --database URL [--listen ADDR] [--read-only] [--secure-cookies]
                       [--metrics-database URL] [--metrics-only]

  --database URL     where pg_tide is: postgres://host:port/dbname (user and password come
                     from each person's sign-in); also PG_TIDE_CONSOLE_DATABASE
  --listen ADDR      address to serve on (default 127.0.0.1:8790: loopback only)
  --read-only        show everything, change nothing (no action buttons; every transaction
                     read-only)
  --secure-cookies   mark the session cookie Secure (behind a reverse proxy with TLS)
  --metrics-database URL
                     serve /metrics (Prometheus) from a read-only connection of its own, as the
                     role in URL, a member of tide_monitor:
                     postgres://scraper:password@host:port/dbname; also
                     PG_TIDE_CONSOLE_METRICS_DATABASE
  --metrics-only     serve /metrics alone, no web pages (--database is then not needed)";

struct Args {
    database: Option<String>,
    listen: SocketAddr,
    read_only: bool,
    secure_cookies: bool,
    metrics_database: Option<String>,
    metrics_only: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut database = std::env::var("PG_TIDE_CONSOLE_DATABASE").ok();
    let mut metrics_database = std::env::var("PG_TIDE_CONSOLE_METRICS_DATABASE").ok();
    let mut listen = "127.0.0.1:8790".to_string();
    let mut read_only = false;
    let mut secure_cookies = false;
    let mut metrics_only = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--database" => database = Some(it.next().ok_or("--database needs a value")?),
            "--listen" => listen = it.next().ok_or("--listen needs a value")?,
            "--read-only" => read_only = true,
            "--secure-cookies" => secure_cookies = true,
            "--metrics-database" => {
                metrics_database = Some(it.next().ok_or("--metrics-database needs a value")?)
            }
            "--metrics-only" => metrics_only = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if metrics_only && metrics_database.is_none() {
        return Err("--metrics-only needs --metrics-database".into());
    }
    if !metrics_only && database.is_none() {
        return Err("--database is required".into());
    }
    let listen = listen
        .parse()
        .map_err(|e| format!("--listen {listen:?} is not an address like 127.0.0.1:8790: {e}"))?;
    Ok(Args {
        database,
        listen,
        read_only,
        secure_cookies,
        metrics_database,
        metrics_only,
    })
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
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("pg_tide-console: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    // Metrics only: no pages, and no database for them (a base that is never connected to).
    let base = args
        .database
        .as_deref()
        .map_or_else(tokio_postgres::Config::new, |url| {
            config_of("--database", url)
        });
    let app = Arc::new(App {
        sessions: Sessions::new(base, args.read_only),
        read_only: args.read_only,
        secure_cookies: args.secure_cookies,
        metrics: args
            .metrics_database
            .as_deref()
            .map(|url| metrics::Metrics::new(config_of("--metrics-database", url))),
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
        .route("/alerts", get(pages::alerts))
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
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
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
                    let mut b = format!(
                        "<p class=\"err\"><code>{}</code> {}</p>",
                        html::esc(code),
                        html::esc(db.message())
                    );
                    if let Some(d) = db.detail() {
                        b.push_str(&format!("<p>{}</p>", html::esc(d)));
                    }
                    if let Some(h) = db.hint() {
                        b.push_str(&format!("<p class=\"hint\">Hint: {}</p>", html::esc(h)));
                    }
                    (status, title, b)
                }
                None => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Cannot reach PostgreSQL",
                    format!("<p class=\"err\">{}</p>", html::esc(&e.to_string())),
                ),
            },
            Fail::Forbidden(m) => (
                StatusCode::FORBIDDEN,
                "Not allowed",
                format!("<p class=\"err\">{}</p>", html::esc(m)),
            ),
            Fail::NotFound(m) => (
                StatusCode::NOT_FOUND,
                "Not found",
                format!("<p class=\"err\">{}</p>", html::esc(m)),
            ),
            Fail::BadRequest(m) => (
                StatusCode::BAD_REQUEST,
                "Bad request",
                format!("<p class=\"err\">{}</p>", html::esc(m)),
            ),
        };
        let body = format!(
            "<section class=\"refusal\" id=\"refusal\"><h1>{}</h1>{body}<p><a href=\"/\">Back to the overview</a></p></section>",
            html::esc(title)
        );
        (status, axum::response::Html(html::page(title, None, &body))).into_response()
    }
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

fn login_form(error: Option<&str>, user: &str) -> Response {
    let err = error
        .map(|e| format!("<p class=\"err\" id=\"login-error\">{}</p>", html::esc(e)))
        .unwrap_or_default();
    let body = format!(
        "<section class=\"login\"><h1>pg_tide</h1><p>Sign in with your PostgreSQL role: you see and \
         change what PostgreSQL lets that role see and change.</p>{err}\
         <form method=\"post\" action=\"/login\"><label>Role <input name=\"user\" id=\"user-field\" \
         autocomplete=\"username\" required value=\"{}\"></label><label>Password <input type=\"password\" \
         name=\"password\" id=\"password-field\" autocomplete=\"current-password\"></label>\
         <button id=\"sign-in\">Sign in</button></form></section>",
        html::esc(user)
    );
    let status = if error.is_some() {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::OK
    };
    (
        status,
        axum::response::Html(html::page("Sign in", None, &body)),
    )
        .into_response()
}

async fn login_page() -> Response {
    login_form(None, "")
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    user: String,
    #[serde(default)]
    password: String,
}

async fn login(State(app): AppState, headers: HeaderMap, Form(f): Form<LoginForm>) -> Response {
    if cross_origin(&headers) {
        return Fail::Forbidden(CROSS_ORIGIN.into()).into_response();
    }
    let user = f.user.trim();
    if user.is_empty() {
        return login_form(Some("a role name is needed"), "");
    }
    match app.sessions.sign_in(user, &f.password).await {
        Ok(id) => {
            let secure = if app.secure_cookies { "; Secure" } else { "" };
            let cookie = format!("tide_session={id}; Path=/; HttpOnly; SameSite=Strict{secure}");
            let mut r = Redirect::to("/").into_response();
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().insert(SET_COOKIE, v);
            }
            r
        }
        Err(e) => {
            let msg = match e.as_db_error() {
                Some(db) => format!("PostgreSQL refused the sign-in: {}", db.message()),
                None => format!("PostgreSQL refused the sign-in: {e}"),
            };
            login_form(Some(&msg), user)
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

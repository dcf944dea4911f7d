//! The console in a real browser: Debian's headless Chromium, driven through chromedriver
//! (WebDriver), against the console binary and a real cluster with pg_tide's workers. Two roles
//! with passwords (SCRAM) share the database. Screenshots of every page at desktop and phone
//! width are written to target/console-screenshots/.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use pg_tide_pg_test::{
    db_err, one, run_state, run_tests_with, wait_for, Client, Cluster, Failed, NoTls, WORKERS_DB,
};
use serde_json::{json, Value};

const CONSOLE: &str = env!("CARGO_BIN_EXE_pg_tide-console");

fn main() {
    let tls = tls_files();
    let conf = format!(
        "pg_tide.monitor_interval = '1s'\nssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'",
        tls.join("server.crt").display(),
        tls.join("server.key").display()
    );
    run_tests_with(
        "console",
        &conf,
        &[
            // First: its recorded scrape is compared with exact expectations (no other test's
            // tasks, alerts and deliveries in it yet).
            ("metrics_are_served_to_a_scraper", metrics_for_a_scraper),
            ("a_failing_task_is_replayed_from_the_browser", browser_story),
            ("alerts_that_reach_no_one_are_flagged", untaken_alerts),
            ("the_read_only_console_changes_nothing", read_only),
            ("forged_and_foreign_posts_are_refused", forged_posts),
            ("upcoming_fires_mark_dst_days", dst_days),
            ("charts_count_what_ran_in_the_tasks_zone", charts_and_times),
            ("forty_dead_letters_are_replayed_once_each", bulk_actions),
            ("lists_page_beyond_their_first_hundred", paging),
            ("a_tide_admin_sees_another_roles_fires", admin_fires),
            ("sign_ins_are_throttled_after_ten_failures", throttled),
            ("the_database_connection_uses_tls_when_offered", tls_used),
        ],
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Polls `probe` until it returns Some, or fails after `within` (pg_test's `wait_for`).
fn wait<T>(
    what: &str,
    within: Duration,
    mut probe: impl FnMut() -> Result<Option<T>, Failed>,
) -> Result<T, Failed> {
    wait_for(what, within, || {
        probe().map_err(|e| e.message().unwrap_or("failed").to_string())
    })
    .map_err(Failed::from)
}

/// Claims the one ready run of a queue as `worker`: its id and lease token.
fn claim_one(c: &mut Client, queue: &str, worker: &str) -> Result<(i64, i64), Failed> {
    let row = c
        .query_one(
            "SELECT run_id, lease_token FROM tide.claim_runs(queue => $1, worker => $2)",
            &[&queue, &worker],
        )
        .map_err(db_err)?;
    Ok((row.get(0), row.get(1)))
}

/// A child process killed when dropped.
struct Proc(Child, &'static str);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_port(port: u16, proc: &mut Proc) -> Result<(), Failed> {
    wait(
        &format!("{} on port {port}", proc.1),
        Duration::from_secs(30),
        || {
            if let Ok(Some(status)) = proc.0.try_wait() {
                let mut err = String::new();
                if let Some(e) = proc.0.stderr.as_mut() {
                    let _ = e.read_to_string(&mut err);
                }
                return Err(format!("{} exited ({status}): {err}", proc.1).into());
            }
            Ok(TcpStream::connect(("127.0.0.1", port)).ok().map(|_| ()))
        },
    )
}

/// The roles of the story: alice and bob sign in with passwords (SCRAM over TCP), the
/// superuser keeps trust. Idempotent.
fn roles(cluster: &Cluster) -> Result<Client, Failed> {
    let hba = cluster.data_dir.join("pg_hba.conf");
    let text = std::fs::read_to_string(&hba).map_err(|e| e.to_string())?;
    if !text.contains("alice,bob,ada") {
        std::fs::write(
            &hba,
            format!("host all alice,bob,ada 127.0.0.1/32 scram-sha-256\n{text}"),
        )
        .map_err(|e| e.to_string())?;
    }
    let mut c = cluster.workers_db()?;
    c.batch_execute(
        "DO $$ BEGIN
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'alice') THEN CREATE ROLE alice LOGIN; END IF;
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'bob') THEN CREATE ROLE bob LOGIN; END IF;
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'ada') THEN CREATE ROLE ada LOGIN IN ROLE tide_admin; END IF;
         END $$;
         SET password_encryption = 'scram-sha-256';
         ALTER ROLE alice PASSWORD 'alice-secret';
         ALTER ROLE bob PASSWORD 'bob-secret';
         ALTER ROLE ada PASSWORD 'ada-secret';
         SELECT pg_reload_conf();",
    )
    .map_err(db_err)?;
    Ok(c)
}

fn connect_as(cluster: &Cluster, user: &str, password: &str) -> Result<Client, Failed> {
    Client::connect(
        &format!(
            "host=127.0.0.1 port={} user={user} password={password} dbname={WORKERS_DB}",
            cluster.port
        ),
        NoTls,
    )
    .map_err(|e| format!("connect as {user}: {}", pg_tide_pg_test::describe(&e)).into())
}

fn console(cluster: &Cluster, extra: &[&str]) -> Result<(Proc, String), Failed> {
    console_at(
        &format!("postgres://127.0.0.1:{}/{WORKERS_DB}", cluster.port),
        extra,
    )
}

/// The console for the database at `database`.
fn console_at(database: &str, extra: &[&str]) -> Result<(Proc, String), Failed> {
    let port = free_port();
    let child = Command::new(CONSOLE)
        .arg("--database")
        .arg(database)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("start {CONSOLE}: {e}"))?;
    let mut p = Proc(child, "pg_tide-console");
    wait_port(port, &mut p)?;
    Ok((p, format!("http://127.0.0.1:{port}")))
}

// ---- The browser, through fantoccini (a maintained WebDriver client) -----------------------

/// A headless Chromium driven by chromedriver. fantoccini is asynchronous: each call runs on a
/// runtime of the browser's own, so the tests read as plain steps.
struct Browser {
    _driver: Proc,
    rt: tokio::runtime::Runtime,
    client: Option<fantoccini::Client>,
}

/// A WebDriver error as the tests' failure.
fn wd(e: impl std::fmt::Display) -> Failed {
    Failed::from(format!("WebDriver: {e}"))
}

impl Browser {
    /// Starts chromedriver and a headless Chromium; `phone` emulates a 375-pixel-wide phone.
    fn start(phone: bool) -> Result<Browser, Failed> {
        let port = free_port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start chromedriver (Debian's chromium-driver): {e}"))?;
        let mut driver = Proc(child, "chromedriver");
        wait_port(port, &mut driver)?;
        let mut options = json!({
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900", "--lang=en-US"],
        });
        if phone {
            options["mobileEmulation"] = json!({
                "deviceMetrics": {"width": 375, "height": 812, "pixelRatio": 2.0, "touch": true},
                "userAgent": "Mozilla/5.0 (Linux; Android 14) Mobile"
            });
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert("goog:chromeOptions".into(), options);
        let client = rt
            .block_on(
                fantoccini::ClientBuilder::new(
                    hyper_util::client::legacy::connect::HttpConnector::new(),
                )
                .capabilities(caps)
                .connect(&format!("http://127.0.0.1:{port}")),
            )
            .map_err(wd)?;
        Ok(Browser {
            _driver: driver,
            rt,
            client: Some(client),
        })
    }

    fn c(&self) -> &fantoccini::Client {
        self.client.as_ref().expect("a browser session")
    }

    fn go(&self, url: &str) -> Result<(), Failed> {
        self.rt.block_on(self.c().goto(url)).map_err(wd)
    }

    fn js(&self, script: &str, args: Value) -> Result<Value, Failed> {
        let args = match args {
            Value::Array(a) => a,
            other => vec![other],
        };
        self.rt.block_on(self.c().execute(script, args)).map_err(wd)
    }

    fn exists(&self, css: &str) -> Result<bool, Failed> {
        Ok(self.js(
            "return document.querySelector(arguments[0]) !== null",
            json!([css]),
        )? == json!(true))
    }

    fn text(&self, css: &str) -> Result<Option<String>, Failed> {
        let v = self.js(
            "var e = document.querySelector(arguments[0]); return e ? e.textContent.trim() : null",
            json!([css]),
        )?;
        Ok(v.as_str().map(str::to_string))
    }

    /// An attribute of the first element `css` finds (None: no element or no attribute).
    fn attr(&self, css: &str, name: &str) -> Result<Option<String>, Failed> {
        let v = self.js(
            "var e = document.querySelector(arguments[0]); return e ? e.getAttribute(arguments[1]) : null",
            json!([css, name]),
        )?;
        Ok(v.as_str().map(str::to_string))
    }

    /// Finds an element and acts on it; a live page may swap its content between the two
    /// (the element goes stale): then it is found again.
    fn on_element(&self, css: &str, click: Option<bool>, text: &str) -> Result<(), Failed> {
        let mut tries = 0;
        loop {
            let done = self.rt.block_on(async {
                let e = self.c().find(fantoccini::Locator::Css(css)).await?;
                match click {
                    Some(_) => e.click().await,
                    None => e.send_keys(text).await,
                }
            });
            match done {
                Err(e) if tries < 5 && e.is_stale_element_reference() => tries += 1,
                other => return other.map_err(|e| wd(format!("{css}: {e}"))),
            }
        }
    }

    fn type_in(&self, css: &str, text: &str) -> Result<(), Failed> {
        self.on_element(css, None, text)
    }

    fn click(&self, css: &str) -> Result<(), Failed> {
        self.on_element(css, Some(true), "")
    }

    fn url(&self) -> Result<String, Failed> {
        Ok(self
            .rt
            .block_on(self.c().current_url())
            .map_err(wd)?
            .to_string())
    }

    /// Waits for an element (the page it is on has loaded).
    fn wait_for(&self, css: &str) -> Result<(), Failed> {
        wait(css, Duration::from_secs(20), || {
            Ok(self.exists(css)?.then_some(()))
        })
    }

    fn screenshot(&self, name: &str) -> Result<(), Failed> {
        let png = self.rt.block_on(self.c().screenshot()).map_err(wd)?;
        let dir = screenshots();
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        std::fs::write(dir.join(format!("{name}.png")), png).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The page fits the viewport's width: nothing to scroll sideways.
    fn fits(&self) -> Result<(), Failed> {
        let v = self.js(
            "return [document.documentElement.scrollWidth, window.innerWidth]",
            json!([]),
        )?;
        let (w, inner) = (v[0].as_i64().unwrap_or(0), v[1].as_i64().unwrap_or(0));
        if w > inner {
            return Err(format!(
                "page {} is {w} px wide in a {inner} px viewport",
                self.url()?
            )
            .into());
        }
        Ok(())
    }

    /// Fills in and sends the sign-in form; the page it leads to is the caller's to check.
    fn try_sign_in(&self, console: &str, user: &str, password: &str) -> Result<(), Failed> {
        self.go(&format!("{console}/login"))?;
        self.wait_for("#user-field")?;
        self.js(
            "document.querySelector('#user-field').value = ''; document.querySelector('#password-field').value = ''",
            json!([]),
        )?;
        self.type_in("#user-field", user)?;
        self.type_in("#password-field", password)?;
        self.click("#sign-in")
    }

    fn sign_in(&self, console: &str, user: &str, password: &str) -> Result<(), Failed> {
        self.try_sign_in(console, user, password)?;
        self.wait_for("#user")?;
        let who = self.text("#user")?;
        if who.as_deref() != Some(user) {
            return Err(format!("signed in as {who:?}, not {user}").into());
        }
        Ok(())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            let _ = self.rt.block_on(c.close());
        }
    }
}

fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/console-screenshots")
}

/// alice's tasks: one that fails for good (its run is dead), one that succeeds, a daily task
/// with a slow backfill, a heartbeat check, a reconciliation with a difference. Returns the
/// dead run's id.
fn alice_world(cluster: &Cluster) -> Result<i64, Failed> {
    let mut a = connect_as(cluster, "alice", "alice-secret")?;
    a.batch_execute(
        "SELECT tide.schedule('c_failing', NULL, topics => '{c_failing}', queue => 'c_alice');
         SELECT tide.schedule('c_fine', '*/5 * * * *', command => 'SELECT 1', tz => 'Europe/Paris');
         SELECT tide.schedule('c_daily', '0 1 * * *', biz_window => 'day', tz => 'America/New_York',
                              command => 'SELECT 1');
         SELECT tide.alter('c_daily', command => 'SELECT 2');
         SELECT tide.create_check('c_backup', '1 day');
         SELECT tide.reconcile('c_recon', '0 6 * * *', biz_window => 'day',
             left_sql => $$SELECT k AS key FROM (VALUES ('a'), ('b')) v(k)$$,
             right_sql => $$SELECT 'a' AS key$$);
         SELECT tide.rerun('c_recon', biz_date => current_date - 1);",
    )
    .map_err(db_err)?;
    // The failing task's run: claimed by an external worker and failed for good.
    let n: i32 = one(
        &mut a,
        "SELECT tide.emit('c_failing', '{\"order\": 7}', event_key => 'order-7')",
    )?;
    assert_eq!(n, 1);
    let (run, token) = claim_one(&mut a, "c_alice", "w1")?;
    let state: String = a
        .query_one(
            "SELECT tide.fail_run($1, $2, 'the payment API said 402', kind => 'business')::text",
            &[&run, &token],
        )
        .map_err(db_err)?
        .get(0);
    assert_eq!(state, "dead");
    // A slow backfill: one window per batch, 30 s between batches.
    a.batch_execute(
        "SELECT tide.backfill('c_daily', current_date - 20, current_date - 2, canary => 0, batch => 1, pause => '30 seconds')",
    )
    .map_err(db_err)?;
    Ok(run)
}

fn browser_story(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = roles(cluster)?;
    let dead_run = alice_world(cluster)?;
    // bob has a task of his own.
    let mut bob_db = connect_as(cluster, "bob", "bob-secret")?;
    bob_db
        .batch_execute("SELECT tide.schedule('c_bobs', '0 3 * * *', command => 'SELECT 1')")
        .map_err(db_err)?;
    // The dead letter's alert is opened by the workers' tick.
    wait("the dead_letter alert", Duration::from_secs(30), || {
        let n: i64 = one(
            &mut admin,
            "SELECT count(*) FROM tide.alert WHERE subject = 'c_failing' AND kind = 'dead_letter' AND resolved_at IS NULL",
        )?;
        Ok((n > 0).then_some(()))
    })?;
    let (_console, url) = console(cluster, &[])?;
    let b = Browser::start(false)?;

    // A wrong password is refused on the sign-in page.
    b.go(&format!("{url}/"))?;
    b.wait_for("#user-field")?;
    b.type_in("#user-field", "alice")?;
    b.type_in("#password-field", "wrong")?;
    b.click("#sign-in")?;
    b.wait_for("#login-error")?;
    let err = b.text("#login-error")?.unwrap_or_default();
    assert!(err.contains("password authentication failed"), "{err}");
    b.screenshot("login-desktop")?;

    // alice signs in: the failing task comes first, with the open alert on top.
    b.sign_in(&url, "alice", "alice-secret")?;
    b.wait_for("a.task")?;
    let first = b.text("tbody tr:first-child a.task")?;
    assert!(
        b.exists("tbody tr:first-child .strip a.cell.s-dead")?,
        "its strip shows the dead run"
    );
    assert_eq!(
        first.as_deref(),
        Some("c_failing"),
        "the failing task first"
    );
    let alerts = b.text("#open-alerts")?.unwrap_or_default();
    assert!(
        alerts.contains("c_failing") && alerts.contains("dead_letter"),
        "{alerts}"
    );
    assert!(
        !b.text("main")?.unwrap_or_default().contains("c_bobs"),
        "alice does not see bob's task"
    );
    b.screenshot("overview-desktop")?;

    // Its task page, then its dead run through the strip.
    b.click("tbody tr:first-child a.task")?;
    b.wait_for("table.versions")?;
    b.screenshot("task-desktop")?;
    b.click("a.run.s-dead")?;
    b.wait_for("#state")?;
    assert_eq!(b.text("#state")?.as_deref(), Some("dead"));
    assert!(
        b.url()?.ends_with(&format!("/run/{dead_run}")),
        "{}",
        b.url()?
    );
    let story = b.text("pre.explain")?.unwrap_or_default();
    assert!(
        story.contains("402"),
        "the explain story has the error: {story}"
    );
    b.screenshot("run-desktop")?;

    // Replay: the run goes back in line; the page stays (no reload) while a worker finishes
    // it, and shows it succeeded.
    b.click("#actions form[action$='/replay'] button")?;
    wait("the replayed run's page", Duration::from_secs(20), || {
        Ok((b.text("#state")?.as_deref() == Some("ready")).then_some(()))
    })?;
    b.wait_for("body[data-listening]")?;
    b.js("window.tideMarker = 'no reload'", json!([]))?;
    let mut a = connect_as(cluster, "alice", "alice-secret")?;
    let (run, token) = claim_one(&mut a, "c_alice", "w2")?;
    assert_eq!(run, dead_run, "the replayed run is claimed");
    a.execute("SELECT tide.complete_run($1, $2)", &[&run, &token])
        .map_err(db_err)?;
    wait(
        "the page to show the run succeeded",
        Duration::from_secs(30),
        || Ok((b.text("#state")?.as_deref() == Some("succeeded")).then_some(())),
    )?;
    assert_eq!(
        b.js("return window.tideMarker", json!([]))?,
        json!("no reload"),
        "the page was not reloaded"
    );
    assert!(
        !b.exists("#actions form[action$='/replay']")?,
        "no Replay for a succeeded run"
    );

    // The other pages, and their actions.
    b.go(&format!("{url}/dead"))?;
    b.wait_for("main h1")?;
    b.screenshot("dead-desktop")?;
    // The reconciliation's alert stays open until its difference is accepted (below); the dead
    // letter's resolves on its own now that the run succeeded.
    let alert: i64 = wait(
        "the reconciliation's alert",
        Duration::from_secs(30),
        || {
            Ok(admin
            .query_opt(
                "SELECT alert_id FROM tide.alert WHERE subject = 'c_recon' AND resolved_at IS NULL",
                &[],
            )
            .map_err(db_err)?
            .map(|r| r.get(0)))
        },
    )?;
    b.go(&format!("{url}/alerts"))?;
    b.wait_for("main h1")?;
    let ack_form = format!("form[action='/alert/{alert}/ack']");
    b.wait_for(&ack_form)?;
    b.type_in(&format!("{ack_form} input[name=note]"), "looking at it")?;
    b.click(&format!("{ack_form} button"))?;
    wait("the acknowledgement", Duration::from_secs(20), || {
        let n: i64 = one(
            &mut admin,
            &format!(
                "SELECT count(*) FROM tide.alert WHERE alert_id = {alert} AND acked_by = 'alice' AND ack_note = 'looking at it'"
            ),
        )?;
        Ok((n == 1).then_some(()))
    })?;
    b.wait_for("main h1")?;
    b.screenshot("alerts-desktop")?;
    b.go(&format!("{url}/checks"))?;
    b.wait_for("main h1")?;
    assert!(b.text("main")?.unwrap_or_default().contains("c_backup"));
    b.screenshot("checks-desktop")?;
    b.go(&format!("{url}/backfills"))?;
    b.wait_for("progress")?;
    b.click("form[action$='/pause'] button")?;
    wait("the paused backfill", Duration::from_secs(20), || {
        let s: String = one(
            &mut admin,
            "SELECT state FROM tide.backfill_status WHERE task = 'c_daily'",
        )?;
        Ok((s == "paused").then_some(()))
    })?;
    b.wait_for("form[action$='/resume']")?;
    b.screenshot("backfills-desktop")?;
    wait(
        "the reconciliation's difference",
        Duration::from_secs(30),
        || {
            let n: i64 = one(
                &mut admin,
                "SELECT count(*) FROM tide.recon_open WHERE recon = 'c_recon'",
            )?;
            Ok((n > 0).then_some(()))
        },
    )?;
    b.go(&format!("{url}/recon"))?;
    b.wait_for("form[action^='/diff/']")?;
    b.screenshot("recon-desktop")?;
    b.click("form[action^='/diff/'] button")?;
    wait("the accepted difference", Duration::from_secs(20), || {
        let n: i64 = one(
            &mut admin,
            "SELECT count(*) FROM tide.recon_diff WHERE reconciliation = 'c_recon' AND status = 'accepted' AND resolved_by = 'alice'",
        )?;
        Ok((n > 0).then_some(()))
    })?;

    // bob: sees neither alice's tasks nor a Replay button on her run; a forged POST is refused.
    b.go(&format!("{url}/"))?;
    b.wait_for("nav form[action='/logout'] button")?;
    b.click("nav form[action='/logout'] button")?;
    b.wait_for("#user-field")?;
    b.sign_in(&url, "bob", "bob-secret")?;
    b.wait_for("a.task")?;
    let main = b.text("main")?.unwrap_or_default();
    assert!(main.contains("c_bobs"), "{main}");
    assert!(
        !main.contains("c_failing") && !main.contains("c_fine"),
        "bob sees alice's tasks: {main}"
    );
    b.go(&format!("{url}/dead"))?;
    b.wait_for("main h1")?;
    assert!(
        !b.exists("form[action$='/replay']")?,
        "bob has nothing to replay"
    );
    let bobs_token = b.js(
        "return document.querySelector('input[name=csrf]').value",
        json!([]),
    )?;
    b.go(&format!("{url}/run/{dead_run}"))?;
    b.wait_for("#refusal")?;
    assert!(!b.exists("#actions")?, "no actions on a run bob cannot see");
    let refusal = b.text("#refusal")?.unwrap_or_default();
    assert!(refusal.contains(&format!("no run {dead_run}")), "{refusal}");
    let events_before: i64 = one(
        &mut admin,
        &format!("SELECT count(*) FROM tide.run_event WHERE run_id = {dead_run}"),
    )?;
    // A form posted from bob's page without the session's token, and one with it.
    let forged = b.js(
        "return fetch('/run/' + arguments[0] + '/cancel', {method: 'POST', body: new URLSearchParams({csrf: 'forged'})})
             .then(function (r) { return r.text().then(function (t) { return [r.status, t]; }); })",
        json!([dead_run]),
    )?;
    assert_eq!(forged[0], json!(403), "{forged}");
    assert!(
        forged[1].as_str().unwrap_or("").contains("CSRF"),
        "{forged}"
    );
    let with_token = b.js(
        "return fetch('/run/' + arguments[0] + '/replay', {method: 'POST', body: new URLSearchParams({csrf: arguments[1]})})
             .then(function (r) { return r.text().then(function (x) { return [r.status, x]; }); })",
        json!([dead_run, bobs_token]),
    )?;
    assert_eq!(
        with_token[0],
        json!(404),
        "PostgreSQL refuses bob's replay of alice's run: {with_token}"
    );
    let events_after: i64 = one(
        &mut admin,
        &format!("SELECT count(*) FROM tide.run_event WHERE run_id = {dead_run}"),
    )?;
    assert_eq!(
        events_before, events_after,
        "nothing happened to alice's run"
    );
    b.screenshot("refusal-desktop")?;
    drop(b);

    // A phone: every page fits 375 pixels.
    let p = Browser::start(true)?;
    p.go(&format!("{url}/login"))?;
    p.wait_for("#user-field")?;
    p.fits()?;
    p.screenshot("login-phone")?;
    p.sign_in(&url, "alice", "alice-secret")?;
    let width = p.js("return window.innerWidth", json!([]))?;
    assert_eq!(width, json!(375), "the phone's viewport");
    let task_id: i64 = one(
        &mut admin,
        "SELECT task_id FROM tide.task WHERE name = 'c_daily'",
    )?;
    for (name, path) in [
        ("overview", "/".to_string()),
        ("task", format!("/task/{task_id}")),
        ("run", format!("/run/{dead_run}")),
        ("dead", "/dead".into()),
        ("alerts", "/alerts".into()),
        ("checks", "/checks".into()),
        ("backfills", "/backfills".into()),
        ("recon", "/recon".into()),
    ] {
        p.go(&format!("{url}{path}"))?;
        p.wait_for("main h1")?;
        p.fits()?;
        p.screenshot(&format!("{name}-phone"))?;
    }
    Ok(())
}

// ---- Plain HTTP: the read-only console and posts from elsewhere --------------------------

/// An HTTP client that shows every status and follows no redirect.
fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// Signs in over HTTP; returns the session cookie.
fn http_sign_in(url: &str, user: &str, password: &str) -> Result<String, Failed> {
    let resp = agent()
        .post(&format!("{url}/login"))
        .send_form([("user", user), ("password", password)])
        .map_err(|e| e.to_string())?;
    let cookie = resp
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .ok_or("no session cookie")?;
    for attr in ["HttpOnly", "SameSite=Strict"] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    Ok(cookie.split(';').next().unwrap_or("").to_string())
}

fn http_get(url: &str, cookie: &str) -> Result<(u16, String), Failed> {
    let mut r = agent()
        .get(url)
        .header("cookie", cookie)
        .call()
        .map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    Ok((
        status,
        r.body_mut().read_to_string().map_err(|e| e.to_string())?,
    ))
}

fn http_post(
    url: &str,
    cookie: Option<&str>,
    form: &[(&str, &str)],
) -> Result<(u16, String), Failed> {
    let mut req = agent().post(url);
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    let mut r = req
        .send_form(form.iter().copied())
        .map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    Ok((
        status,
        r.body_mut().read_to_string().map_err(|e| e.to_string())?,
    ))
}

fn csrf_of(page: &str) -> Result<String, Failed> {
    let at = page
        .find("name=\"csrf\" value=\"")
        .ok_or("no CSRF field on the page")?;
    let rest = &page[at + 19..];
    Ok(rest[..rest.find('"').ok_or("unterminated CSRF value")?].to_string())
}

/// A dead run of alice's for the HTTP tests.
fn a_dead_run(cluster: &Cluster, task: &str) -> Result<i64, Failed> {
    let mut a = connect_as(cluster, "alice", "alice-secret")?;
    a.batch_execute(&format!(
        "SELECT tide.schedule('{task}', NULL, topics => '{{{task}}}', queue => '{task}');
         SELECT tide.emit('{task}');"
    ))
    .map_err(db_err)?;
    let (run, token) = claim_one(&mut a, task, "w1")?;
    a.execute(
        "SELECT tide.fail_run($1, $2, 'no', kind => 'business')",
        &[&run, &token],
    )
    .map_err(db_err)?;
    Ok(run)
}

fn read_only(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = roles(cluster)?;
    let run = a_dead_run(cluster, "c_ro")?;
    let (_console, url) = console(cluster, &["--read-only"])?;
    let cookie = http_sign_in(&url, "alice", "alice-secret")?;
    let (status, page) = http_get(&format!("{url}/run/{run}"), &cookie)?;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("read-only"), "the page says so");
    assert!(!page.contains("/replay\""), "no Replay button: {page}");
    let csrf = csrf_of(&page)?;
    let (status, page) = http_post(
        &format!("{url}/run/{run}/replay"),
        Some(&cookie),
        &[("csrf", &csrf)],
    )?;
    assert_eq!(status, 403, "{page}");
    assert!(page.contains("read-only"), "{page}");
    let state = run_state(&mut admin, run)?;
    assert_eq!(state, "dead", "nothing was replayed");
    Ok(())
}

fn forged_posts(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = roles(cluster)?;
    let run = a_dead_run(cluster, "c_forged")?;
    let (_console, url) = console(cluster, &[])?;
    // Not signed in: refused, and a page is sent to the sign-in form.
    let (status, page) = http_post(&format!("{url}/run/{run}/replay"), None, &[("csrf", "x")])?;
    assert_eq!(status, 403, "{page}");
    assert!(page.contains("not signed in"), "{page}");
    let (status, _) = http_get(&format!("{url}/"), "")?;
    assert_eq!(status, 303, "to the sign-in page");
    // Signed in, without the token or with another session's: refused.
    let cookie = http_sign_in(&url, "alice", "alice-secret")?;
    let other = http_sign_in(&url, "alice", "alice-secret")?;
    let (_, other_page) = http_get(&format!("{url}/"), &other)?;
    let other_csrf = csrf_of(&other_page)?;
    for form in [vec![], vec![("csrf", other_csrf.as_str())]] {
        let (status, page) = http_post(&format!("{url}/run/{run}/replay"), Some(&cookie), &form)?;
        assert_eq!(status, 403, "{page}");
        assert!(page.contains("CSRF"), "{page}");
    }
    let state = run_state(&mut admin, run)?;
    assert_eq!(state, "dead", "nothing was replayed");
    // With the session's token, but sent by a page of another site: refused.
    let (_, page) = http_get(&format!("{url}/run/{run}"), &cookie)?;
    let csrf = csrf_of(&page)?;
    let mut r = agent()
        .post(&format!("{url}/run/{run}/replay"))
        .header("cookie", &cookie)
        .header("origin", "http://evil.example")
        .send_form([("csrf", csrf.as_str())])
        .map_err(|e| e.to_string())?;
    let text = r.body_mut().read_to_string().map_err(|e| e.to_string())?;
    assert_eq!(r.status().as_u16(), 403, "{text}");
    assert!(text.contains("another site"), "{text}");
    let state = run_state(&mut admin, run)?;
    assert_eq!(state, "dead", "nothing was replayed");
    // With its own token, from the console's own page, the same POST works: the refusals were
    // the token's and the origin's.
    let (status, page) = http_post(
        &format!("{url}/run/{run}/replay"),
        Some(&cookie),
        &[("csrf", &csrf)],
    )?;
    assert_eq!(status, 303, "{page}");
    let state = run_state(&mut admin, run)?;
    assert_eq!(state, "ready", "replayed");
    // The task's runs, filtered by state, trigger and business date.
    let task: i64 = one(
        &mut admin,
        "SELECT task_id FROM tide.task WHERE name = 'c_forged'",
    )?;
    let link = format!("href=\"/run/{run}\"");
    for (filter, shown) in [
        ("state=ready", true),
        ("state=dead", false),
        ("state=ready&trigger=replay", true),
        ("trigger=event", false),
        ("trigger=scheduled", false),
        ("biz_date=2001-01-01", false),
        ("", true),
    ] {
        let (status, page) = http_get(&format!("{url}/task/{task}?{filter}"), &cookie)?;
        assert_eq!(status, 200, "{filter}: {page}");
        assert_eq!(page.contains(&link), shown, "{filter}: {page}");
    }
    // Bad input in a filter is PostgreSQL's error, shown as a page.
    let (status, page) = http_get(
        &format!("{url}/task/{task}?biz_date=yesterday-ish"),
        &cookie,
    )?;
    assert_eq!(status, 400, "{page}");
    assert!(
        page.contains("22007") && page.contains("yesterday-ish"),
        "{page}"
    );
    // Live streams: at most 16 per session (each holds a PostgreSQL connection); a closed one
    // frees its place.
    let open_stream = || {
        agent()
            .get(&format!("{url}/events"))
            .header("cookie", &cookie)
            .call()
            .map_err(|e| Failed::from(e.to_string()))
    };
    let mut streams = Vec::new();
    for _ in 0..16 {
        let r = open_stream()?;
        assert_eq!(r.status().as_u16(), 200);
        streams.push(r);
    }
    let (status, page) = http_get(&format!("{url}/events"), &cookie)?;
    assert_eq!(status, 429, "{page}");
    assert!(page.contains("16 live pages"), "{page}");
    drop(streams);
    wait("a stream's place freed", Duration::from_secs(60), || {
        Ok((open_stream()?.status().as_u16() == 200).then_some(()))
    })?;
    // A role that may no longer sign in (its password changed; the console's connection ends
    // with a server restart or, here, pg_terminate_backend) is signed out.
    let (status, _) = http_get(&format!("{url}/"), &cookie)?;
    assert_eq!(status, 200);
    admin
        .batch_execute(
            "ALTER ROLE alice PASSWORD 'changed';
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE usename = 'alice' AND application_name = 'pg_tide-console';",
        )
        .map_err(db_err)?;
    let signed_out = wait("the session to end", Duration::from_secs(20), || {
        let (status, page) = http_get(&format!("{url}/"), &cookie)?;
        Ok((status == 303).then_some(page))
    });
    admin
        .batch_execute("ALTER ROLE alice PASSWORD 'alice-secret'")
        .map_err(db_err)?;
    signed_out?;
    let cookie = http_sign_in(&url, "alice", "alice-secret")?;
    let (status, page) = http_get(&format!("{url}/run/abc"), &cookie)?;
    assert_eq!(status, 400, "{page}");
    assert!(
        page.contains("run id &quot;abc&quot; is not a number"),
        "{page}"
    );
    Ok(())
}

fn dst_days(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = roles(cluster)?;
    let mut a = connect_as(cluster, "alice", "alice-secret")?;
    a.batch_execute(
        "SELECT tide.schedule('c_ny', '30 6 * * *', biz_window => 'day', tz => 'America/New_York', command => 'SELECT 1')",
    )
    .map_err(db_err)?;
    let task: i64 = one(
        &mut admin,
        "SELECT task_id FROM tide.task WHERE name = 'c_ny'",
    )?;
    let (_console, url) = console(cluster, &[])?;
    let cookie = http_sign_in(&url, "alice", "alice-secret")?;
    // The fires from 2027-03-12 on: the window of 2027-03-14 is 23 hours (spring forward).
    let (status, page) = http_get(&format!("{url}/task/{task}?from=2027-03-12"), &cookie)?;
    assert_eq!(status, 200, "{page}");
    let rows: Vec<&str> = page
        .split("<tr>")
        .filter(|r| r.contains("2027-03-1"))
        .collect();
    let marked: Vec<&str> = rows
        .iter()
        .filter(|r| r.contains("b-dst"))
        .copied()
        .collect();
    assert_eq!(marked.len(), 1, "one DST day among {rows:?}");
    assert!(
        marked[0].contains("2027-03-14") && marked[0].contains(">23 h<"),
        "{}",
        marked[0]
    );
    // Local and UTC side by side: 06:30 in New York is 10:30 UTC after the change.
    assert!(
        page.contains("2027-03-15 06:30:00") && page.contains("2027-03-15 10:30:00 UTC"),
        "{page}"
    );
    Ok(())
}

// ---- /metrics for a scraper ----------------------------------------------------------------

/// The roles of the metrics test: mona and otto own tasks, scraper is a member of tide_monitor
/// and nothing else; all three sign in with passwords (SCRAM). Idempotent.
fn metrics_roles(cluster: &Cluster) -> Result<Client, Failed> {
    let hba = cluster.data_dir.join("pg_hba.conf");
    let text = std::fs::read_to_string(&hba).map_err(|e| e.to_string())?;
    if !text.contains("mona,otto,scraper") {
        std::fs::write(
            &hba,
            format!("host all mona,otto,scraper 127.0.0.1/32 scram-sha-256\n{text}"),
        )
        .map_err(|e| e.to_string())?;
    }
    let mut c = cluster.workers_db()?;
    c.batch_execute(
        "DO $$ BEGIN
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mona') THEN CREATE ROLE mona LOGIN; END IF;
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'otto') THEN CREATE ROLE otto LOGIN; END IF;
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'scraper') THEN CREATE ROLE scraper LOGIN; END IF;
         END $$;
         GRANT tide_monitor TO scraper;
         SET password_encryption = 'scram-sha-256';
         ALTER ROLE mona PASSWORD 'mona-secret';
         ALTER ROLE otto PASSWORD 'otto-secret';
         ALTER ROLE scraper PASSWORD 'scraper-secret';
         SELECT pg_reload_conf();",
    )
    .map_err(db_err)?;
    Ok(c)
}

/// pg_tide-console serving /metrics alone, as `user`.
fn metrics_console(
    cluster: &Cluster,
    user: &str,
    password: &str,
) -> Result<(Proc, String), Failed> {
    let port = free_port();
    let child = Command::new(CONSOLE)
        .arg("--metrics-only")
        .arg("--metrics-database")
        .arg(format!(
            "postgres://{user}:{password}@127.0.0.1:{}/{WORKERS_DB}",
            cluster.port
        ))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("start {CONSOLE}: {e}"))?;
    let mut p = Proc(child, "pg_tide-console --metrics-only");
    wait_port(port, &mut p)?;
    Ok((p, format!("http://127.0.0.1:{port}")))
}

fn get_plain(url: &str) -> Result<(u16, String, String), Failed> {
    let mut r = agent().get(url).call().map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let kind = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    Ok((
        status,
        kind,
        r.body_mut().read_to_string().map_err(|e| e.to_string())?,
    ))
}

/// Runs a Python program of the reference parser's (prometheus_client) over the exposition.
fn python(program: &str, args: &[&str], stdin: &str) -> Result<String, Failed> {
    let mut child = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("python3: {e} (scripts/setup.sh installs it)"))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(stdin.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "python3 failed:\n{}{}\n--- input ---\n{stdin}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Each sample as "type|name{label=value,...} value" (labels sorted), by the reference parser.
fn parse_exposition(text: &str) -> Result<Vec<String>, Failed> {
    const PARSER: &str = "
import sys
from prometheus_client.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        labels = ','.join('%s=%s' % kv for kv in sorted(s.labels.items()))
        print('%s|%s{%s} %r' % (family.type, s.name, labels, s.value))
";
    Ok(python(PARSER, &[], text)?
        .lines()
        .map(str::to_string)
        .collect())
}

/// The value of one sample, by its exact "type|name{labels}" key.
fn sample(samples: &[String], key: &str) -> Option<f64> {
    samples.iter().find_map(|s| {
        s.strip_prefix(key)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    })
}

/// /metrics, served by pg_tide-console alone (--metrics-only) from its own read-only connection
/// as a role that is only a member of tide_monitor: every owner's figures and pg_tide's own,
/// liveness of each kind of worker, the last tick, build_info, each task's last success,
/// delivery counters per channel, histogram buckets and status zeros from the start; parsed
/// with the reference parser. The scraper reads none of pg_tide's tables itself. Then the
/// alert rules and Grafana panels of monitoring/ against the recorded scrape (promtool).
fn metrics_for_a_scraper(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = metrics_roles(cluster)?;
    // mona: a task that succeeds (run by an executor), one whose run is dead (a business
    // error), and a channel to a port nobody listens on (it takes warnings: her dead letter).
    let dead_port = free_port();
    let mut mona = connect_as(cluster, "mona", "mona-secret")?;
    mona.batch_execute(&format!(
        "SELECT tide.schedule('m_ok', '0 0 1 1 *', command => 'SELECT 1');
         SELECT tide.schedule('m_bad', NULL, topics => '{{m_bad}}', queue => 'm_bad');
         SELECT tide.create_channel('m_nowhere', 'webhook', '{{\"url\": \"http://127.0.0.1:{dead_port}/\"}}');
         SELECT tide.emit('m_bad');"
    ))
    .map_err(db_err)?;
    let ok_run: i64 = one(&mut mona, "SELECT tide.rerun('m_ok')")?;
    let (run, token) = claim_one(&mut mona, "m_bad", "w1")?;
    mona.execute(
        "SELECT tide.fail_run($1, $2, 'no such account', kind => 'business')",
        &[&run, &token],
    )
    .map_err(db_err)?;
    // otto: two runs waiting in a queue that no worker serves, and a task that never ran.
    let mut otto = connect_as(cluster, "otto", "otto-secret")?;
    otto.batch_execute(
        "SELECT tide.schedule('o_jobs', NULL, topics => '{o_never}', queue => 'o_queue');
         SELECT tide.enqueue('o_jobs', '[{\"n\": 1}, {\"n\": 2}]');",
    )
    .map_err(db_err)?;
    wait("m_ok's run to succeed", Duration::from_secs(30), || {
        Ok((run_state(&mut admin, ok_run)? == "succeeded").then_some(()))
    })?;

    // The cluster started moments ago: pg_tide raised no false alarm of its own while its
    // workers started (no scheduler_down, nothing undelivered).
    let own: String = one(
        &mut admin,
        "SELECT coalesce(string_agg(kind::text, ','), '') FROM tide.alert WHERE subject_type = 'pg_tide'",
    )?;
    assert_eq!(own, "", "pg_tide's own alerts at start");
    // Without --metrics-database the console has no /metrics.
    let (_pages, pages_url) = console(cluster, &[])?;
    let (status, _, body) = get_plain(&format!("{pages_url}/metrics"))?;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("--metrics-database"), "{body}");

    let (_metrics, url) = metrics_console(cluster, "scraper", "scraper-secret")?;
    let (status, _, body) = get_plain(&format!("{url}/"))?;
    assert_eq!(status, 404, "--metrics-only serves no pages: {body}");
    let version: String = one(
        &mut admin,
        "SELECT extversion FROM pg_extension WHERE extname = 'pg_tide'",
    )?;
    let scrape = || -> Result<(String, Vec<String>), Failed> {
        let (status, kind, text) = get_plain(&format!("{url}/metrics"))?;
        assert_eq!(status, 200, "{text}");
        assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
        let samples = parse_exposition(&text)?;
        Ok((text, samples))
    };
    // Polled until the delivery worker has tried mona's channel (and failed) and every worker
    // of pg_tide is counted alive.
    let (text, samples) = wait(
        "a failed delivery and every worker alive in /metrics",
        Duration::from_secs(60),
        || {
            let (text, samples) = scrape()?;
            let failed = sample(
                &samples,
                "counter|pg_tide_deliveries_total{channel=m_nowhere,outcome=failed,owner=mona}",
            )
            .unwrap_or(0.0);
            let all_alive = ["scheduler", "executor", "delivery", "notifier"]
                .iter()
                .all(|k| {
                    let alive = sample(&samples, &format!("gauge|pg_tide_workers{{kind={k}}}"));
                    alive.is_some()
                        && alive
                            == sample(
                                &samples,
                                &format!("gauge|pg_tide_workers_expected{{kind={k}}}"),
                            )
                });
            Ok((failed >= 1.0 && all_alive).then_some((text, samples)))
        },
    )?;
    let has = |key: &str| sample(&samples, key);
    let all = samples.join("\n");
    assert_eq!(
        has(&format!("gauge|pg_tide_build_info{{version={version}}}")),
        Some(1.0),
        "{all}"
    );
    assert_eq!(
        has("gauge|pg_tide_workers{kind=scheduler}"),
        Some(1.0),
        "{all}"
    );
    let now: f64 = one(&mut admin, "SELECT date_part('epoch', now())")?;
    let tick = has("gauge|pg_tide_last_tick_timestamp_seconds{}").ok_or("no last tick")?;
    assert!((now - tick).abs() < 120.0, "last tick {tick}, now {now}");
    let success = has("gauge|pg_tide_task_last_success_timestamp_seconds{owner=mona,task=m_ok}")
        .ok_or_else(|| format!("no last success of m_ok:\n{all}"))?;
    let finished: f64 = one(
        &mut admin,
        &format!("SELECT date_part('epoch', finished_at) FROM tide.run WHERE run_id = {ok_run}"),
    )?;
    assert!(
        (success - finished).abs() < 0.001,
        "{success} against {finished}"
    );
    // Every owner's figures: mona's and otto's, to a role that owns none.
    assert_eq!(
        has("gauge|pg_tide_task_status{owner=mona,status=failing,task=m_bad}"),
        Some(1.0),
        "{all}"
    );
    assert_eq!(
        has("gauge|pg_tide_queue_ready{owner=otto,queue=o_queue}"),
        Some(2.0),
        "{all}"
    );
    // Zeros from the start: every status of a task, every bucket of a histogram of a task that
    // never finished a run, every outcome of a channel.
    for status in ["ok", "late", "failing", "down", "paused"] {
        assert!(
            has(&format!(
                "gauge|pg_tide_task_status{{owner=otto,status={status},task=o_jobs}}"
            ))
            .is_some(),
            "no {status} for o_jobs:\n{all}"
        );
    }
    let buckets: Vec<&String> = samples
        .iter()
        .filter(|s| {
            s.starts_with("histogram|pg_tide_run_duration_seconds_bucket{")
                && s.contains("owner=otto,task=o_jobs}")
        })
        .collect();
    assert_eq!(buckets.len(), 14, "13 bounds and +Inf: {buckets:?}");
    assert!(buckets.iter().all(|b| b.ends_with(" 0.0")), "{buckets:?}");
    assert_eq!(
        has("counter|pg_tide_deliveries_total{channel=m_nowhere,outcome=sent,owner=mona}"),
        Some(0.0),
        "{all}"
    );

    // An ordinary role's own tide.metrics(): its own series alone, nothing of pg_tide itself.
    let own: String = one(&mut otto, "SELECT tide.metrics()")?;
    let own_samples = parse_exposition(&own)?;
    assert!(
        own_samples.iter().any(|s| s.contains("owner=otto")),
        "{own}"
    );
    assert!(
        !own_samples.iter().any(|s| s.contains("owner=mona")
            || s.contains("|pg_tide_workers{")
            || s.contains("|pg_tide_last_tick_timestamp_seconds")),
        "otto reads only his own: {own}"
    );
    // The scraper itself reads nothing of pg_tide's: no tasks, runs or alerts, no commands.
    let mut scraper = connect_as(cluster, "scraper", "scraper-secret")?;
    for table in [
        "tide.task",
        "tide.run",
        "tide.alert",
        "tide.alert_channel",
        "tide.health",
    ] {
        let seen: i64 = one(&mut scraper, &format!("SELECT count(*) FROM {table}"))?;
        assert_eq!(seen, 0, "the scraper reads {table}");
    }
    // Its connection is read-only: the console cannot write through it.
    let session: String = one(
        &mut admin,
        "SELECT string_agg(DISTINCT application_name, ',') FROM pg_stat_activity WHERE usename = 'scraper' AND application_name <> ''",
    )?;
    assert_eq!(session, "pg_tide-console metrics");

    // The rules and panels of monitoring/ against this scrape.
    let dir = std::env::temp_dir().join(format!("pg_tide-promtool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let recorded = dir.join("scrape.txt");
    std::fs::write(&recorded, format!("# recorded_at {now}\n{text}")).map_err(|e| e.to_string())?;
    let failing = json!({"alertname": "PgTideTaskFailing",
                         "labels": {"owner": "mona", "task": "m_bad", "status": "failing", "severity": "warning"}});
    let deliveries = json!({"alertname": "PgTideDeliveriesFailing",
                            "labels": {"owner": "mona", "channel": "m_nowhere", "outcome": "failed", "severity": "warning"}});
    let expect = json!({
        "as_recorded": [failing, deliveries],
        "scheduler_stopped": [
            failing, deliveries,
            {"alertname": "PgTideSchedulerDown", "labels": {"kind": "scheduler", "severity": "critical"}},
            {"alertname": "PgTideSchedulerStalled", "labels": {"severity": "critical"}},
            {"alertname": "PgTideWorkersMissing", "labels": {"kind": "scheduler", "severity": "warning"}}
        ]
    });
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("/usr/bin/python3")
        .arg(root.join("console/tests/promtool_case.py"))
        .arg(&recorded)
        .arg(expect.to_string())
        .arg(root.join("monitoring/prometheus-rules.yml"))
        .arg(root.join("monitoring/grafana-prometheus.json"))
        .arg(&dir)
        .output()
        .map_err(|e| format!("promtool_case.py: {e}"))?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        let open: String = one(
            &mut admin,
            "SELECT coalesce(string_agg(format('%s %s %s (%s) %s opened %s seen %s resolved %s', subject_type, subject, kind,
                                               owner, details, opened_at, last_seen_at, resolved_at), E'\n' ORDER BY alert_id), '-')
               FROM tide.alert",
        )?;
        return Err(
            format!("{said}\n--- alerts ---\n{open}\n--- the recorded scrape ---\n{text}").into(),
        );
    }
    println!("{}", said.trim());
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The overview flags the open alerts of the signed-in role that no channel takes, until a
/// channel takes them.
fn untaken_alerts(cluster: &Cluster) -> Result<(), Failed> {
    roles(cluster)?;
    let mut bob = connect_as(cluster, "bob", "bob-secret")?;
    bob.batch_execute(
        "SELECT tide.drop_channel(name) FROM tide.alert_channel WHERE owner = 'bob';
         SELECT tide.schedule('c_untaken', NULL, topics => '{c_untaken}', queue => 'c_untaken');
         SELECT tide.emit('c_untaken');",
    )
    .map_err(db_err)?;
    let (run, token) = claim_one(&mut bob, "c_untaken", "w1")?;
    bob.execute(
        "SELECT tide.fail_run($1, $2, 'no', kind => 'business')",
        &[&run, &token],
    )
    .map_err(db_err)?;
    let alert: i64 = wait("bob's dead letter alert", Duration::from_secs(30), || {
        let id: Option<i64> = bob
            .query_opt(
                "SELECT alert_id FROM tide.alert WHERE subject = 'c_untaken' AND kind = 'dead_letter' AND resolved_at IS NULL",
                &[],
            )
            .map_err(db_err)?
            .map(|r| r.get(0));
        Ok(id)
    })?;
    let untaken: Vec<i64> = bob
        .query("SELECT alert_id FROM tide.untaken_alerts()", &[])
        .map_err(db_err)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(untaken.contains(&alert), "{untaken:?}");
    let (_console, url) = console(cluster, &[])?;
    let cookie = http_sign_in(&url, "bob", "bob-secret")?;
    let (status, page) = http_get(&format!("{url}/"), &cookie)?;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("id=\"untaken-alerts\"") && page.contains("that no channel takes"),
        "{page}"
    );
    // A channel of bob's that takes warnings (the default): nothing left to flag.
    bob.batch_execute(&format!(
        "SELECT tide.create_channel('c_bob_ops', 'webhook', '{{\"url\": \"http://127.0.0.1:{}/\"}}')",
        free_port()
    ))
    .map_err(db_err)?;
    let left: i64 = one(&mut bob, "SELECT count(*) FROM tide.untaken_alerts()")?;
    assert_eq!(left, 0);
    let (_, page) = http_get(&format!("{url}/"), &cookie)?;
    assert!(!page.contains("id=\"untaken-alerts\""), "{page}");
    Ok(())
}

// ---- Charts, times, acting on many, paging, throttling, TLS (issue 46) ---------------------

/// A CA, a server certificate it signed for 127.0.0.1 (the cluster's, with ssl = on), and another
/// CA that signed nothing: made with openssl once per run, readable by the postgres user.
fn tls_files() -> PathBuf {
    let dir = std::env::temp_dir().join("pg_tide-console-tls");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory for the test certificates");
    let sh = "set -e
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj '/CN=pg_tide test CA' 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj '/CN=127.0.0.1' 2>/dev/null
        printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' > server.ext
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile server.ext 2>/dev/null
        openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.crt -days 2 -subj '/CN=another CA' 2>/dev/null
        chmod 755 .; chmod 600 server.key; chown postgres server.key server.crt";
    let ok = Command::new("sh")
        .arg("-c")
        .arg(sh)
        .current_dir(&dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "openssl could not make the test certificates in {}",
        dir.display()
    );
    dir
}

/// What the hourly counters of `filter` (a condition on `r`, a tide.run) must say, computed
/// from history: each attempt that ended (each history row that brings a run to an outcome), by
/// the hour it ended (UTC, as the page's data-hour) and its outcome (a failed attempt to be
/// tried again: "failed").
fn ended_by_hour(c: &mut Client, filter: &str) -> Result<Vec<(String, String, i64)>, Failed> {
    let rows = c
        .query(
            &format!(
                "SELECT to_char(date_trunc('hour', e.at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),
                        CASE e.to_state WHEN 'retry' THEN 'failed' ELSE e.to_state::text END, count(*)
                   FROM tide.run_event e JOIN tide.run r ON r.run_id = e.run_id
                  WHERE {filter} AND e.to_state IN ('succeeded', 'dead', 'need_check', 'skipped', 'cancelled', 'retry')
                    AND e.at > date_trunc('hour', now()) - interval '168 hours'
                  GROUP BY 1, 2 ORDER BY 1, 2"
            ),
            &[],
        )
        .map_err(db_err)?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect())
}

/// The humanized durations of a page: `2 ms`, `6 s`, `3 min`, `26 h`, `< 1 ms`.
fn humanized(text: &str) -> bool {
    let t = text.trim();
    if t == "< 1 ms" {
        return true;
    }
    match t.split_once(' ') {
        Some((n, unit)) => n.parse::<f64>().is_ok() && ["ms", "s", "min", "h", "d"].contains(&unit),
        None => false,
    }
}

fn charts_and_times(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = roles(cluster)?;
    let mut a = connect_as(cluster, "alice", "alice-secret")?;
    a.batch_execute(
        "SELECT tide.schedule('c_week', NULL, topics => '{c_week}', queue => 'c_week', tz => 'Asia/Tokyo',
                              max_attempts => 3);
         SELECT tide.emit_many('c_week', array_fill('{}'::jsonb, ARRAY[12]));",
    )
    .map_err(db_err)?;
    let task: i64 = one(
        &mut admin,
        "SELECT task_id FROM tide.task WHERE name = 'c_week'",
    )?;
    let claimed: Vec<(i64, i64)> = a
        .query(
            "SELECT run_id, lease_token FROM tide.claim_runs(queue => 'c_week', worker => 'w', n => 12) ORDER BY run_id",
            &[],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(claimed.len(), 12);
    // Five succeed now; three die, 2, 30 and 100 hours ago; two fail and wait to be tried again,
    // 50 hours ago (pg_tide's own failure path, at an instant the test gives: the week of
    // history a test cannot wait for); two stay running.
    for (run, token) in &claimed[..5] {
        a.execute("SELECT tide.complete_run($1, $2)", &[run, token])
            .map_err(db_err)?;
    }
    for ((run, _), hours) in claimed[5..8].iter().zip([2, 30, 100]) {
        admin
            .execute(
                &format!("SELECT tide._fail($1, 'the ledger was closed', 'business', NULL, 'failed', now() - interval '{hours} hours')"),
                &[run],
            )
            .map_err(db_err)?;
    }
    for (run, _) in &claimed[8..10] {
        admin
            .execute(
                "SELECT tide._fail($1, 'timeout talking to the bank', 'transient', NULL, 'failed', now() - interval '50 hours')",
                &[run],
            )
            .map_err(db_err)?;
    }
    let filter = format!("r.task_id = {task}");
    let expected = ended_by_hour(&mut admin, &filter)?;
    assert_eq!(
        expected.iter().map(|e| e.2).sum::<i64>(),
        10,
        "ten attempts ended: {expected:?}"
    );
    // The fold (every tick) has counted them when tide.run_hours says so.
    wait("the hourly counters", Duration::from_secs(30), || {
        let n: i64 = one(
            &mut a,
            "SELECT sum(succeeded + failed + dead)::bigint FROM tide.run_hours('c_week', hours => 168)",
        )?;
        Ok((n == 10).then_some(()))
    })?;
    let alert: i64 = wait("the dead_letter alert", Duration::from_secs(30), || {
        Ok(admin
            .query_opt(
                "SELECT alert_id FROM tide.alert WHERE subject = 'c_week' AND kind = 'dead_letter'",
                &[],
            )
            .map_err(db_err)?
            .map(|r| r.get(0)))
    })?;

    let (_console, url) = console(cluster, &[])?;
    let b = Browser::start(false)?;
    b.sign_in(&url, "alice", "alice-secret")?;
    b.go(&format!("{url}/task/{task}"))?;
    b.wait_for("#runs-week")?;
    // Each hour's bar holds what history says ended in it; the day's chart only the last 24.
    // The day's first hour as the page drew it (an hour may begin between two reads).
    let day_start = b
        .attr("#runs-day g.hour", "data-hour")?
        .ok_or("no hour in the day's chart")?;
    let mut hours: Vec<&str> = expected.iter().map(|e| e.0.as_str()).collect();
    hours.dedup();
    for h in &hours {
        let want: i64 = expected.iter().filter(|e| e.0 == *h).map(|e| e.2).sum();
        let bar = format!("#runs-week g.hour[data-hour='{h}']");
        assert_eq!(
            b.attr(&bar, "data-total")?,
            Some(want.to_string()),
            "the week's bar of {h}"
        );
        let in_day = b.attr(&format!("#runs-day g.hour[data-hour='{h}']"), "data-total")?;
        if *h >= day_start.as_str() {
            assert_eq!(in_day, Some(want.to_string()), "the day's bar of {h}");
        } else {
            assert_eq!(in_day, None, "{h} is older than a day");
        }
    }
    for (chart, since) in [
        ("runs-week", "0001-01-01 00:00:00"),
        ("runs-day", day_start.as_str()),
    ] {
        for outcome in ["succeeded", "failed", "dead", "skipped"] {
            let want: i64 = expected
                .iter()
                .filter(|e| e.1 == outcome && e.0.as_str() >= since)
                .map(|e| e.2)
                .sum();
            assert_eq!(
                b.attr(&format!("#{chart} [data-outcome={outcome}]"), "data-count")?,
                Some(want.to_string()),
                "{chart}: {outcome}"
            );
        }
    }
    // Hours in the task's zone (Tokyo), UTC in the data: the bar of the death 2 hours ago, in
    // the hour history has it.
    let (utc, local): (String, String) = {
        let r = admin
            .query_one(
                "SELECT to_char(h AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'), to_char(h AT TIME ZONE 'Asia/Tokyo', 'Dy HH24:00')
                   FROM (SELECT date_trunc('hour', e.at) h FROM tide.run_event e WHERE e.run_id = $1 AND e.to_state = 'dead') x",
                &[&claimed[5].0],
            )
            .map_err(db_err)?;
        (r.get(0), r.get(1))
    };
    let title = b
        .text(&format!("#runs-day g.hour[data-hour='{utc}'] title"))?
        .unwrap_or_default();
    assert_eq!(
        title,
        format!("{local}: 1 dead"),
        "the bar's figures, in Tokyo's hours"
    );
    assert!(
        b.exists("#durations-day g.hour title")?,
        "the successes of this hour have a duration"
    );
    // Durations as people write them.
    for css in ["#health #quiet", "#health #p50"] {
        let t = b.text(css)?.unwrap_or_default();
        assert!(humanized(&t), "{css}: {t:?}");
    }
    b.screenshot("task-charts-desktop")?;
    // The dead run's page: its attempt in Tokyo time, UTC on hover.
    let dead_run = claimed[5].0;
    let (local, utc): (String, String) = {
        let r = admin
            .query_one(
                "SELECT to_char(at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM-DD HH24:MI:SS'), to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')
                   FROM tide.run_event WHERE run_id = $1 AND to_state = 'dead'",
                &[&dead_run],
            )
            .map_err(db_err)?;
        (r.get(0), r.get(1))
    };
    b.go(&format!("{url}/run/{dead_run}"))?;
    b.wait_for("#state")?;
    let shown = b.js(
        "return Array.from(document.querySelectorAll('td[data-label=finished] time')).map(function (t) { return [t.textContent, t.title]; })",
        json!([]),
    )?;
    assert_eq!(
        shown,
        json!([[local, format!("{utc} UTC")]]),
        "the attempt's end"
    );
    // The alerts page: the alert's opening in Tokyo time.
    let opened: String = one(
        &mut admin,
        &format!("SELECT to_char(opened_at AT TIME ZONE 'Asia/Tokyo', 'YYYY-MM-DD HH24:MI:SS') FROM tide.alert WHERE alert_id = {alert}"),
    )?;
    b.go(&format!("{url}/alerts"))?;
    b.wait_for("main h1")?;
    let row = b.js(
        "var r = Array.from(document.querySelectorAll('tbody tr')).find(function (tr) { return tr.textContent.indexOf('c_week') >= 0; });
         return r ? r.querySelector('td[data-label=opened] time').textContent : null",
        json!([]),
    )?;
    assert_eq!(row, json!(opened), "the alert opened, in the task's zone");
    // The overview: all of alice's tasks, and her queues now (the two running runs).
    let all = ended_by_hour(&mut admin, "r.owner = 'alice'")?;
    b.go(&format!("{url}/"))?;
    b.wait_for("#overview-charts #runs-week")?;
    let dead: i64 = all.iter().filter(|e| e.1 == "dead").map(|e| e.2).sum();
    assert_eq!(
        b.attr(
            "#overview-charts #runs-week [data-outcome=dead]",
            "data-count"
        )?,
        Some(dead.to_string()),
        "alice's dead runs of the week"
    );
    assert_eq!(
        b.attr("#queues li[data-queue=c_week]", "data-running")?,
        Some("2".into()),
        "the queue's running runs"
    );
    b.screenshot("overview-charts-desktop")?;
    drop(b);
    let p = Browser::start(true)?;
    p.sign_in(&url, "alice", "alice-secret")?;
    for (name, path) in [
        ("task-charts", format!("/task/{task}")),
        ("overview-charts", "/".into()),
    ] {
        p.go(&format!("{url}{path}"))?;
        p.wait_for("#runs-week")?;
        p.fits()?;
        p.screenshot(&format!("{name}-phone"))?;
    }
    Ok(())
}

fn bulk_actions(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = roles(cluster)?;
    let mut a = connect_as(cluster, "alice", "alice-secret")?;
    a.batch_execute(
        "SELECT tide.schedule('c_bulk', NULL, topics => '{c_bulk}', queue => 'c_bulk');
         SELECT tide.emit_many('c_bulk', array_fill('{}'::jsonb, ARRAY[40]));
         SELECT tide.fail_run(c.run_id, c.lease_token, 'the partner was down', 'business')
           FROM tide.claim_runs('c_bulk', 'w', 40) c;",
    )
    .map_err(db_err)?;
    let task: i64 = one(
        &mut admin,
        "SELECT task_id FROM tide.task WHERE name = 'c_bulk'",
    )?;
    let dead: i64 = one(
        &mut admin,
        &format!("SELECT count(*) FROM tide.run WHERE task_id = {task} AND state = 'dead'"),
    )?;
    assert_eq!(dead, 40);
    let replays = format!(
        "SELECT count(*), coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM tide.run_event e JOIN tide.run r USING (run_id)
          WHERE r.task_id = {task} AND e.from_state = 'dead' GROUP BY e.run_id) x"
    );
    let (_console, url) = console(cluster, &[])?;
    let b = Browser::start(false)?;
    b.sign_in(&url, "alice", "alice-secret")?;
    b.go(&format!("{url}/dead?task={task}"))?;
    b.wait_for("#replay-all")?;
    assert!(
        b.text("#replay-all")?.unwrap_or_default().contains("40"),
        "the button says how many"
    );
    b.click("#replay-all")?;
    b.wait_for("#bulk-count")?;
    assert_eq!(
        b.attr("#bulk-count", "data-count")?,
        Some("40".into()),
        "the count to confirm"
    );
    let r = admin.query_one(&replays, &[]).map_err(db_err)?;
    assert_eq!(
        r.get::<_, i64>(0),
        0,
        "nothing is replayed before the confirmation"
    );
    b.screenshot("bulk-confirm-desktop")?;
    // The confirmation as it is sent, to send it again below.
    let sent = b.js(
        "return new URLSearchParams(new FormData(document.querySelector('#confirm-replay').form)).toString()",
        json!([]),
    )?;
    b.click("#confirm-replay")?;
    b.wait_for("#bulk-result")?;
    assert_eq!(b.attr("#bulk-result", "data-done")?, Some("40".into()));
    assert_eq!(b.attr("#bulk-result", "data-refused")?, Some("0".into()));
    let r = admin.query_one(&replays, &[]).map_err(db_err)?;
    assert_eq!(
        (r.get::<_, i64>(0), r.get::<_, i64>(1)),
        (40, 1),
        "40 runs replayed, once each"
    );
    // The confirmation sent again, from the browser (a second press, a reload): none replayed twice.
    let again = b.js(
        "return fetch('/dead/replay', {method: 'POST', body: new URLSearchParams(arguments[0])})
             .then(function (r) { return r.text(); })
             .then(function (t) {
                 var p = new DOMParser().parseFromString(t, 'text/html').querySelector('#bulk-result');
                 return p ? [p.getAttribute('data-done'), p.getAttribute('data-unchanged')] : t;
             })",
        json!([sent]),
    )?;
    assert_eq!(again, json!(["0", "40"]), "already back in line");
    let r = admin.query_one(&replays, &[]).map_err(db_err)?;
    assert_eq!(
        (r.get::<_, i64>(0), r.get::<_, i64>(1)),
        (40, 1),
        "still once each"
    );
    // Several alerts acknowledged at once, after their count is confirmed.
    b.go(&format!("{url}/alerts"))?;
    b.wait_for("main h1")?;
    let picked = b.js(
        "return Array.from(document.querySelectorAll('input.pick[name=alert]')).map(function (c) { c.click(); return c.value; })",
        json!([]),
    )?;
    let picked: Vec<i64> = picked
        .as_array()
        .map(|v| v.iter().filter_map(|x| x.as_str()?.parse().ok()).collect())
        .unwrap_or_default();
    assert!(!picked.is_empty(), "alice has open alerts to acknowledge");
    b.click("#ack-selected")?;
    b.wait_for("#bulk-count")?;
    assert_eq!(
        b.attr("#bulk-count", "data-count")?,
        Some(picked.len().to_string())
    );
    b.type_in("input[name=note]", "on it")?;
    b.click("#confirm-ack")?;
    b.wait_for("#bulk-result")?;
    // Each is acknowledged with the note, but one that resolved in the meantime (the tick
    // resolves c_bulk's dead letter alert now that its runs are back in line): tide.ack_alert
    // refuses a resolved alert (55000), and the result says so.
    let count = |what: &str| -> Result<usize, Failed> {
        Ok(b.attr("#bulk-result", what)?
            .and_then(|v| v.parse().ok())
            .ok_or(format!("no {what} on the result"))?)
    };
    let (done, refused) = (count("data-done")?, count("data-refused")?);
    assert_eq!(
        done + refused,
        picked.len(),
        "each picked alert is accounted for"
    );
    let r = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE acked_by = 'alice' AND ack_note = 'on it'),
                    count(*) FILTER (WHERE acked_by IS NULL AND resolved_at IS NOT NULL)
               FROM tide.alert WHERE alert_id = ANY ($1)",
            &[&picked],
        )
        .map_err(db_err)?;
    let (acked, resolved): (i64, i64) = (r.get(0), r.get(1));
    assert_eq!(acked as usize, done, "each acknowledged with the note");
    assert_eq!(resolved as usize, refused, "those refused had resolved");
    assert!(done > 0, "at least one alert acknowledged");
    // Nothing is selected: refused, nothing done.
    let cookie = http_sign_in(&url, "alice", "alice-secret")?;
    let (_, page) = http_get(&format!("{url}/dead"), &cookie)?;
    let csrf = csrf_of(&page)?;
    let (status, page) = http_post(
        &format!("{url}/dead/replay"),
        Some(&cookie),
        &[("csrf", &csrf)],
    )?;
    assert_eq!(status, 400, "{page}");
    assert!(page.contains("no dead run was selected"), "{page}");
    Ok(())
}

/// The run links of a page's runs table.
fn run_links(page: &str) -> Vec<String> {
    page.split("href=\"/run/")
        .skip(1)
        .filter_map(|x| x.split('"').next())
        .map(str::to_string)
        .collect()
}

fn paging(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = roles(cluster)?;
    let mut a = connect_as(cluster, "alice", "alice-secret")?;
    a.batch_execute(
        "SELECT tide.schedule('c_many', NULL, topics => '{c_many}', queue => 'c_many');
         SELECT tide.emit_many('c_many', array_fill('{}'::jsonb, ARRAY[150]));
         SELECT tide.fail_run(c.run_id, c.lease_token, 'no', 'business') FROM tide.claim_runs('c_many', 'w', 120) c;",
    )
    .map_err(db_err)?;
    let task: i64 = one(
        &mut admin,
        "SELECT task_id FROM tide.task WHERE name = 'c_many'",
    )?;
    let (_console, url) = console(cluster, &["--read-only"])?;
    let cookie = http_sign_in(&url, "alice", "alice-secret")?;
    for (path, total) in [
        (format!("/task/{task}?"), 150usize),
        (format!("/dead?task={task}&"), 120),
    ] {
        let (status, first) = http_get(&format!("{url}{path}"), &cookie)?;
        assert_eq!(status, 200, "{first}");
        let (status, second) = http_get(&format!("{url}{path}page=1"), &cookie)?;
        assert_eq!(status, 200, "{second}");
        let (one_, two) = (run_links(&first), run_links(&second));
        assert_eq!(one_.len(), 100, "{path}: a page of 100");
        assert_eq!(two.len(), total - 100, "{path}: the rest");
        assert!(
            first.contains("rel=\"next\"") && !first.contains("rel=\"prev\""),
            "{path}"
        );
        assert!(
            second.contains("rel=\"prev\"") && !second.contains("rel=\"next\""),
            "{path}"
        );
        let mut all: Vec<i64> = one_
            .iter()
            .chain(&two)
            .filter_map(|x| x.parse().ok())
            .collect();
        assert!(
            all.windows(2).all(|w| w[0] > w[1]),
            "{path}: newest first, across the pages"
        );
        all.dedup();
        assert_eq!(all.len(), total, "{path}: every run once");
    }
    Ok(())
}

fn admin_fires(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = roles(cluster)?;
    let mut bob = connect_as(cluster, "bob", "bob-secret")?;
    bob.batch_execute("SELECT tide.schedule('c_same', '0 3 * * *', command => 'SELECT 1')")
        .map_err(db_err)?;
    // ada, a tide_admin, has a task of the same name: the name alone would mean hers.
    let mut ada = connect_as(cluster, "ada", "ada-secret")?;
    ada.batch_execute("SELECT tide.schedule('c_same', '0 4 * * *', command => 'SELECT 1')")
        .map_err(db_err)?;
    let task: i64 = one(
        &mut admin,
        "SELECT task_id FROM tide.task WHERE name = 'c_same' AND owner = 'bob'",
    )?;
    let first: String = one(
        &mut admin,
        "SELECT to_char(fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') FROM tide.preview('c_same', 1, owner => 'bob')",
    )?;
    let (_console, url) = console(cluster, &[])?;
    let cookie = http_sign_in(&url, "ada", "ada-secret")?;
    let (status, page) = http_get(&format!("{url}/task/{task}"), &cookie)?;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("owner bob"), "bob's task: {page}");
    assert!(
        page.contains(&format!("{first} UTC")) && !page.contains("04:00:00 UTC"),
        "bob's next fires, not ada's: {page}"
    );
    assert!(page.contains("id=\"health\""), "its health: {page}");
    Ok(())
}

fn throttled(cluster: &Cluster) -> Result<(), Failed> {
    roles(cluster)?;
    let (_console, url) = console(
        cluster,
        &["--sign-in-failures", "10", "--sign-in-pause", "10"],
    )?;
    let b = Browser::start(false)?;
    for i in 1..=10 {
        b.try_sign_in(&url, "alice", "not her password")?;
        b.wait_for("#login-error")?;
        let e = b.text("#login-error")?.unwrap_or_default();
        assert!(
            e.contains("password authentication failed"),
            "attempt {i}: {e}"
        );
    }
    // The eleventh, even with the right password, is refused without asking PostgreSQL.
    b.try_sign_in(&url, "alice", "alice-secret")?;
    b.wait_for("#login-error")?;
    let e = b.text("#login-error")?.unwrap_or_default();
    assert!(
        e.contains("too many failed sign-ins for role \"alice\""),
        "{e}"
    );
    b.screenshot("throttled-desktop")?;
    // Another role from the same address waits too; the answer says when to come back.
    let r = agent()
        .post(&format!("{url}/login"))
        .send_form([("user", "bob"), ("password", "bob-secret")])
        .map_err(|e| e.to_string())?;
    assert_eq!(r.status().as_u16(), 429);
    assert!(
        r.headers().get("retry-after").is_some(),
        "a Retry-After header"
    );
    // After the pause, the right password lets alice in.
    wait(
        "alice let in after the pause",
        Duration::from_secs(30),
        || {
            b.try_sign_in(&url, "alice", "alice-secret")?;
            wait("a page", Duration::from_secs(20), || {
                Ok((b.exists("#user")? || b.exists("#login-error")?).then_some(()))
            })?;
            Ok(b.exists("#user")?.then_some(()))
        },
    )?;
    assert_eq!(b.text("#user")?.as_deref(), Some("alice"));
    Ok(())
}

fn tls_used(cluster: &Cluster) -> Result<(), Failed> {
    let mut admin = roles(cluster)?;
    let tls = std::env::temp_dir().join("pg_tide-console-tls");
    let base = format!("postgres://127.0.0.1:{}/{WORKERS_DB}", cluster.port);
    let ca = tls.join("ca.crt").display().to_string();
    let other = tls.join("other.crt").display().to_string();
    // Whether the console's connections for alice made since `t0` are over TLS.
    let mut encrypted = |t0: &str| -> Result<(bool, i64), Failed> {
        let r = admin
            .query_one(
                "SELECT coalesce(bool_and(s.ssl), false), count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
                  WHERE a.usename = 'alice' AND a.application_name = 'pg_tide-console' AND a.backend_start >= $1::text::timestamptz",
                &[&t0],
            )
            .map_err(db_err)?;
        Ok((r.get(0), r.get(1)))
    };
    for (url, extra, ssl) in [
        (base.clone(), vec![], true),
        (format!("{base}?sslmode=disable"), vec![], false),
        (
            format!("{base}?sslmode=require"),
            vec!["--database-ca", ca.as_str()],
            true,
        ),
    ] {
        let t0: String = one(&mut roles(cluster)?, "SELECT clock_timestamp()::text")?;
        let (console, http) = console_at(&url, &extra)?;
        let cookie = http_sign_in(&http, "alice", "alice-secret")?;
        let (status, page) = http_get(&format!("{http}/"), &cookie)?;
        assert_eq!(status, 200, "{page}");
        let (all_tls, n) = encrypted(&t0)?;
        assert!(n >= 1, "{url}: the console's connection");
        assert_eq!(all_tls, ssl, "{url} {extra:?}: TLS");
        drop(console);
    }
    // A certificate that does not chain to the CA given: the sign-in fails, nothing connects.
    let (_console, http) = console_at(
        &format!("{base}?sslmode=require"),
        &["--database-ca", &other],
    )?;
    let r = agent()
        .post(&format!("{http}/login"))
        .send_form([("user", "alice"), ("password", "alice-secret")]);
    let mut r = r.map_err(|e| e.to_string())?;
    let text = r.body_mut().read_to_string().map_err(|e| e.to_string())?;
    assert_eq!(r.status().as_u16(), 401, "{text}");
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    Ok(())
}

//! Alerts that reach a person, and pg_tide watching itself, on a real cluster with the real
//! workers: channels of tide.create_channel delivered by the delivery worker to an HTTP receiver
//! and an SMTP sink (STARTTLS) started by the tests on 127.0.0.1; a receiver that is down, a
//! crash mid-send; escalation, reminders and acknowledgement; the scheduler stopped (SIGSTOP)
//! noticed by the watchdog and the ping; CREATE EXTENSION where pg_tide cannot work; and the
//! alert kinds of event and enqueued runs, readiness deferrals and held runs.

use std::process::Command;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use pg_tide_pg_test::sinks::{Receiver, Request, SmtpSink};
use pg_tide_pg_test::{
    db_err, describe, exec, one, refused, run_tests_with, tick, wait_for, Client, Cluster, Failed,
    TestFn,
};

fn sign(secret: &str, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key size");
    mac.update(body.as_bytes());
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

/// The requests of `r` whose body mentions `needle`, once at least `n` arrived.
fn wait_requests(
    r: &Receiver,
    needle: &str,
    n: usize,
    within: Duration,
) -> Result<Vec<Request>, Failed> {
    Ok(wait_for(
        &format!("{n} request(s) about {needle}"),
        within,
        || {
            let got: Vec<Request> = r
                .requests()
                .into_iter()
                .filter(|q| q.body.contains(needle))
                .collect();
            Ok((got.len() >= n).then_some(got))
        },
    )?)
}

/// Polls `sql` (one row, one column, read as text) until it reads `want`, for at most `secs`.
fn wait_text(db: &mut Client, what: &str, sql: &str, want: &str, secs: u64) -> Result<(), Failed> {
    wait_for(what, Duration::from_secs(secs), || {
        let got: Option<String> = db
            .query_one(&format!("SELECT ({sql})::text"), &[])
            .map_err(|e| describe(&e))?
            .get(0);
        Ok((got.as_deref() == Some(want)).then_some(()))
    })?;
    Ok(())
}

/// A daily task of the workers' database whose command fails at once (dead after one
/// attempt), and its run for a past window: a dead_letter alert opens at the next evaluation.
fn dead_run(db: &mut Client, task: &str) -> Result<i64, Failed> {
    exec(
        db,
        &format!(
            "SELECT tide.schedule('{task}', '0 0 * * *', 'SELECT pg_catalog.int4div(1, (random() * 0)::int)',
                                  max_attempts => 1, biz_window => 'day')"
        ),
    )?;
    let run: i64 = one(
        db,
        &format!("SELECT tide.rerun('{task}', biz_date => current_date - 2)"),
    )?;
    wait_text(
        db,
        "the run to die",
        &format!("SELECT state FROM tide.run WHERE run_id = {run}"),
        "dead",
        60,
    )?;
    Ok(run)
}

// ---------------------------------------------------------------------------------------------
// 1. Alerts leave the database by themselves.

fn create_channel_refuses_bad_input_without_showing_secrets(
    cluster: &Cluster,
) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("a_channel_input")?;
    let secret_url = "https://hooks.example.com/services/T0/B0/XyzSecretToken";
    for (sql, needle) in [
        ("SELECT tide.create_channel('ops', 'pager', '{}')", "unknown channel kind 'pager'"),
        ("SELECT tide.create_channel('bad name!', 'webhook', '{}')", "invalid channel 'bad name!'"),
        ("SELECT tide.create_channel('ops', 'webhook', '[]')", "must be a JSON object"),
        ("SELECT tide.create_channel('ops', 'webhook', '{\"url\": \"x\", \"secrett\": \"y\"}')", "unknown key 'secrett'"),
        ("SELECT tide.create_channel('ops', 'webhook', '{\"url\": \"ftp://files.example.com/XyzSecretToken\"}')", "http:// or https:// URL"),
        ("SELECT tide.create_channel('ops', 'webhook', '{\"url\": \"https://x.example\", \"format\": \"xml\"}')", "chat or json, got 'xml'"),
        (&format!("SELECT tide.create_channel('ops', 'webhook', '{{\"url\": \"{secret_url}\"}}', 'fatal')"), "fatal"),
        ("SELECT tide.create_channel('ops', 'email', '{\"host\": \"smtp.example.com\"}')", "needs config keys host, from and to"),
        ("SELECT tide.create_channel('ops', 'email', '{\"host\": \"h\", \"from\": \"a@x\", \"to\": [\"nobody\"]}')", "'nobody'"),
        ("SELECT tide.create_channel('ops', 'email', '{\"host\": \"h\", \"from\": \"a@x\", \"to\": \"b@x\", \"port\": 70000}')", "got 70000"),
        ("SELECT tide.create_channel('ops', 'email', '{\"host\": \"h\", \"from\": \"a@x\", \"to\": \"b@x\", \"tls\": \"ssl\"}')", "got 'ssl'"),
        ("SELECT tide.create_channel('ops', 'email', '{\"host\": \"h\", \"from\": \"a@x\", \"to\": \"b@x\", \"password\": \"XyzSecretToken\"}')", "both username and password"),
        ("SELECT tide.ack_alert(424242)", "no alert 424242"),
    ] {
        let (code, message, hint) = refused(&mut c, sql)?;
        assert!(code == "22023" || code == "42704", "{sql}: {code} {message}");
        assert!(message.contains(needle), "{sql}: {message}");
        assert!(!hint.is_empty(), "{sql}: no hint");
        assert!(!message.contains("XyzSecretToken") && !hint.contains("XyzSecretToken"), "a secret shown: {message} / {hint}");
    }
    let n: i64 = one(&mut c, "SELECT count(*) FROM tide.alert_channel")?;
    assert_eq!(n, 0, "nothing is written by a refused call");
    // A good one, then the same name again changes it.
    exec(&mut c, &format!("SELECT tide.create_channel('ops', 'webhook', '{{\"url\": \"{secret_url}\"}}', 'warning')"))?;
    exec(&mut c, &format!("SELECT tide.create_channel('ops', 'webhook', '{{\"url\": \"{secret_url}\"}}', 'critical')"))?;
    let alerts: String = one(
        &mut c,
        "SELECT string_agg(name || ':' || alerts, ',') FROM tide.alert_channel",
    )?;
    assert_eq!(alerts, "ops:critical");
    let dropped: bool = one(&mut c, "SELECT tide.drop_channel('ops')")?;
    let again: bool = one(&mut c, "SELECT tide.drop_channel('ops')")?;
    assert!(dropped && !again);
    Ok(())
}

/// Deliveries recorded for an alert, as their dedupe keys in order.
fn deliveries(c: &mut Client, like: &str) -> Result<String, Failed> {
    one(
        c,
        &format!(
            "SELECT coalesce(string_agg(regexp_replace(dedupe_key, '^alert:[0-9]+:', ''), ' ' ORDER BY effect_id), '')
               FROM tide.effect WHERE dedupe_key LIKE 'alert:%' AND payload->>'subject' LIKE '{like}'"
        ),
    )
}

/// A channel made without `alerts` takes warnings and above (a channel that takes nothing must
/// say so: `alerts => NULL`).
fn a_channel_made_without_alerts_takes_warnings(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("a_default_channel")?;
    exec(
        &mut c,
        "SELECT tide.create_channel('ops', 'webhook', '{\"url\": \"https://chat.example/hook\"}');
         SELECT tide.create_channel('none', 'webhook', '{\"url\": \"https://none.example/hook\"}', alerts => NULL);
         SELECT tide.schedule('dflt', '0 0 1 1 *', max_attempts => 1);
         SELECT tide.monitor('dflt', max_silence => '3000 days', severity => 'warning');",
    )?;
    let takes: String = one(
        &mut c,
        "SELECT string_agg(name || '=' || coalesce(alerts::text, '-'), ',' ORDER BY name) FROM tide.alert_channel",
    )?;
    assert_eq!(takes, "none=-,ops=warning");
    let run: i64 = one(&mut c, "SELECT tide.rerun('dflt', window_start => (date_trunc('year', now() AT TIME ZONE 'UTC') - interval '2 years') AT TIME ZONE 'UTC')")?;
    let token: i64 = one(
        &mut c,
        "SELECT lease_token FROM tide.claim_runs(worker => 'w')",
    )?;
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({run}, {token}, 'no such account', 'business')"),
    )?;
    tick(&mut c, "now()")?;
    assert_eq!(deliveries(&mut c, "dflt")?, "opened:ops");
    Ok(())
}

fn escalation_reminders_ack_and_resolution_are_each_notified_once(
    cluster: &Cluster,
) -> Result<(), Failed> {
    // No worker serves this database: the deliveries stay in the outbox, where the test reads
    // them. Time is driven with tide.tick.
    let mut c = cluster.fresh_db("a_escalate")?;
    exec(
        &mut c,
        "SET pg_tide.alert_escalate_after = '1h'; SET pg_tide.alert_renotify_interval = '4h';
         SELECT tide.create_channel('ops', 'webhook', '{\"url\": \"https://chat.example/hook\"}', 'warning');
         SELECT tide.create_channel('pager', 'webhook', '{\"url\": \"https://pager.example/hook\"}', 'critical');
         SELECT tide.create_channel('quiet', 'webhook', '{\"url\": \"https://quiet.example/hook\"}', alerts => NULL);
         SELECT tide.schedule('esc', '0 0 1 1 *', max_attempts => 1);
         SELECT tide.monitor('esc', max_silence => '3000 days', severity => 'warning');",
    )?;
    let run: i64 = one(&mut c, "SELECT tide.rerun('esc', window_start => (date_trunc('year', now() AT TIME ZONE 'UTC') - interval '2 years') AT TIME ZONE 'UTC')")?;
    let token: i64 = one(
        &mut c,
        "SELECT lease_token FROM tide.claim_runs(worker => 'w')",
    )?;
    exec(
        &mut c,
        &format!("SELECT tide.fail_run({run}, {token}, 'no such account', 'business')"),
    )?;
    tick(&mut c, "now()")?;
    assert_eq!(
        deliveries(&mut c, "esc")?,
        "opened:ops",
        "a warning reaches the warning channel only"
    );
    tick(&mut c, "now() + interval '30 minutes'")?;
    assert_eq!(
        deliveries(&mut c, "esc")?,
        "opened:ops",
        "nothing new within the hour"
    );
    tick(&mut c, "now() + interval '61 minutes'")?;
    assert_eq!(
        deliveries(&mut c, "esc")?,
        "opened:ops escalated:ops escalated:pager",
        "escalated to critical: the pager hears of it now"
    );
    let sev: String = one(
        &mut c,
        "SELECT severity::text FROM tide.alert WHERE subject = 'esc' AND resolved_at IS NULL",
    )?;
    assert_eq!(sev, "critical");
    tick(&mut c, "now() + interval '2 hours'")?;
    tick(&mut c, "now() + interval '5 hours 2 minutes'")?;
    assert_eq!(
        deliveries(&mut c, "esc")?,
        "opened:ops escalated:ops escalated:pager renotify1:ops renotify1:pager",
        "one reminder 4 hours after the escalation"
    );
    // Acknowledged: no more reminders; its resolution is still notified, once.
    let alert: i64 = one(
        &mut c,
        "SELECT alert_id FROM tide.alert WHERE subject = 'esc' AND resolved_at IS NULL",
    )?;
    let first: bool = one(&mut c, &format!("SELECT tide.ack_alert({alert}, 'on it')"))?;
    let second: bool = one(
        &mut c,
        &format!("SELECT tide.ack_alert({alert}, 'still on it')"),
    )?;
    assert!(first && !second);
    let who: String = one(
        &mut c,
        &format!("SELECT acked_by || ':' || ack_note FROM tide.alert WHERE alert_id = {alert}"),
    )?;
    assert_eq!(who, "postgres:still on it");
    tick(&mut c, "now() + interval '20 hours'")?;
    assert_eq!(
        deliveries(&mut c, "esc")?.matches("renotify").count(),
        2,
        "no reminder after the ack"
    );
    exec(&mut c, &format!("SELECT tide.replay_run({run})"))?;
    let token: i64 = one(
        &mut c,
        "SELECT lease_token FROM tide.claim_runs(worker => 'w')",
    )?;
    exec(&mut c, &format!("SELECT tide.complete_run({run}, {token})"))?;
    tick(&mut c, "now() + interval '21 hours'")?;
    tick(&mut c, "now() + interval '22 hours'")?;
    assert_eq!(
        deliveries(&mut c, "esc")?,
        "opened:ops escalated:ops escalated:pager renotify1:ops renotify1:pager resolved:ops resolved:pager"
    );
    let (code, message, _) = refused(&mut c, &format!("SELECT tide.ack_alert({alert})"))?;
    assert_eq!(code, "55000", "{message}");
    Ok(())
}

fn webhook_gets_the_alert_within_seconds_signed(cluster: &Cluster) -> Result<(), Failed> {
    let r = Receiver::start()?;
    let mut db = cluster.workers_db()?;
    exec(
        &mut db,
        &format!(
            "SELECT tide.create_channel('hook_signed', 'webhook', jsonb_build_object('url', '{}', 'secret', 'Sig-Secret-42'), 'warning')",
            r.url("/services/T1/B1/tok")
        ),
    )?;
    dead_run(&mut db, "a_signed")?;
    let got = wait_requests(&r, "\"a_signed\"", 1, Duration::from_secs(30))?;
    let q = &got[0];
    assert_eq!(q.method, "POST");
    assert_eq!(q.path, "/services/T1/B1/tok");
    assert_eq!(
        q.header("X-Tide-Signature"),
        Some(sign("Sig-Secret-42", &q.body).as_str()),
        "signed with the secret"
    );
    let id = q.header("X-Tide-Delivery").unwrap_or_default().to_string();
    assert!(
        id.starts_with("alert:") && id.ends_with(":opened:hook_signed"),
        "{id}"
    );
    assert_eq!(q.header("Idempotency-Key"), Some(id.as_str()));
    // Slack and Mattermost read text, Discord content.
    assert!(
        q.body.contains("\"text\":\"[pg_tide] ") && q.body.contains("\"content\":\"[pg_tide] "),
        "{}",
        q.body
    );
    assert!(q.body.contains("dead_letter"), "{}", q.body);
    let state: String = one(
        &mut db,
        &format!("SELECT state::text FROM tide.effect WHERE dedupe_key = '{id}'"),
    )?;
    if state != "delivered" {
        wait_text(
            &mut db,
            "the delivery to be recorded",
            &format!("SELECT state FROM tide.effect WHERE dedupe_key = '{id}'"),
            "delivered",
            10,
        )?;
    }
    exec(
        &mut db,
        "SELECT tide.drop_channel('hook_signed'); SELECT tide.unschedule('a_signed')",
    )?;
    Ok(())
}

fn a_receiver_that_is_down_gets_it_later(cluster: &Cluster) -> Result<(), Failed> {
    // A port nobody listens on yet.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let mut db = cluster.workers_db()?;
    let url = format!("http://127.0.0.1:{port}/hook/Down-Secret-Path");
    exec(&mut db, &format!("SELECT tide.create_channel('hook_down', 'webhook', jsonb_build_object('url', '{url}'), 'warning')"))?;
    dead_run(&mut db, "a_down")?;
    let error: String = wait_for("a failed attempt", Duration::from_secs(30), || {
        let row = db
            .query_opt(
                "SELECT last_error FROM tide.effect WHERE channel = 'hook_down' AND payload->>'subject' = 'a_down' AND last_error IS NOT NULL",
                &[],
            )
            .map_err(|e| describe(&e))?;
        Ok(row.map(|r| r.get::<_, String>(0)))
    })?;
    assert!(error.contains("connection failed"), "{error}");
    assert!(
        !error.contains("Down-Secret-Path") && !error.contains(&port.to_string()),
        "the URL leaked: {error}"
    );
    let channel_error: String = one(
        &mut db,
        "SELECT last_error FROM tide.alert_channel WHERE name = 'hook_down'",
    )?;
    assert_eq!(channel_error, error);
    // The receiver comes up: the retry (10 s backoff, jittered) delivers it.
    let r = Receiver::start_on(port)?;
    let got = wait_requests(&r, "\"a_down\"", 1, Duration::from_secs(90))?;
    assert!(got[0].body.contains("dead_letter"));
    exec(
        &mut db,
        "SELECT tide.drop_channel('hook_down'); SELECT tide.unschedule('a_down')",
    )?;
    Ok(())
}

fn a_refused_delivery_is_dead_alerts_and_is_replayed(cluster: &Cluster) -> Result<(), Failed> {
    let r = Receiver::start()?;
    r.status.store(404, std::sync::atomic::Ordering::SeqCst);
    let mut db = cluster.workers_db()?;
    exec(&mut db, &format!("SELECT tide.create_channel('hook_gone', 'webhook', jsonb_build_object('url', '{}'), 'warning')", r.url("/revoked")))?;
    dead_run(&mut db, "a_gone")?;
    // 404: trying again cannot help; the delivery is dead at once, and says why.
    let (effect, error): (i64, String) = wait_for(
        "a dead delivery",
        Duration::from_secs(30),
        || {
            let row = db
            .query_opt("SELECT effect_id, last_error FROM tide.effect
                   WHERE channel = 'hook_gone' AND state = 'dead' AND payload->>'subject' = 'a_gone'", &[])
            .map_err(|e| describe(&e))?;
            Ok(row.map(|r| (r.get(0), r.get(1))))
        },
    )?;
    assert_eq!(error, "the receiver refused it: HTTP 404");
    let open_failed =
        "SELECT count(*) FROM tide.alert WHERE subject_type = 'channel' AND subject = 'hook_gone'
                          AND kind = 'delivery_failed' AND resolved_at IS NULL";
    wait_text(&mut db, "the delivery_failed alert", open_failed, "1", 30)?;
    let dead: i32 = one(&mut db, "SELECT deliveries_dead_24h FROM tide.self_health")?;
    assert!(dead >= 1, "{dead}");
    let told: i64 = one(&mut db, "SELECT count(*) FROM tide.effect WHERE channel = 'hook_gone' AND payload->>'kind' = 'delivery_failed'")?;
    assert_eq!(told, 0, "a failing channel is not told that it fails");
    // Fixed, and replayed from psql: delivered, and the alert resolves.
    r.status.store(200, std::sync::atomic::Ordering::SeqCst);
    exec(&mut db, &format!("SELECT tide.replay_effect({effect})"))?;
    wait_requests(&r, "\"a_gone\"", 2, Duration::from_secs(30))?;
    wait_text(
        &mut db,
        "the alert to resolve",
        // Other alerts of this database that reached the channel meanwhile died too: replay
        // them all, as a person would.
        &format!("SELECT count(tide.replay_effect(effect_id)) FROM tide.effect WHERE channel = 'hook_gone' AND state = 'dead'
                  UNION ALL {open_failed} ORDER BY 1 DESC LIMIT 1"),
        "0",
        30,
    )?;
    exec(
        &mut db,
        "SELECT tide.drop_channel('hook_gone'); SELECT tide.unschedule('a_gone')",
    )?;
    Ok(())
}

fn a_crash_mid_send_sends_again_with_the_same_delivery_id(cluster: &Cluster) -> Result<(), Failed> {
    let r = Receiver::start()?;
    r.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut db = cluster.workers_db()?;
    exec(&mut db, &format!("SELECT tide.create_channel('hook_crash', 'webhook', jsonb_build_object('url', '{}'), 'warning')", r.url("/c")))?;
    dead_run(&mut db, "a_crash")?;
    // The delivery worker is inside the send (the receiver holds it): kill -9.
    let first = wait_requests(&r, "\"a_crash\"", 1, Duration::from_secs(30))?;
    let id = first[0]
        .header("X-Tide-Delivery")
        .unwrap_or_default()
        .to_string();
    cluster.kill_9("pg_tide delivery")?;
    r.hold.store(false, std::sync::atomic::Ordering::SeqCst);
    let mut db = cluster.workers_db()?;
    wait_text(
        &mut db,
        "the delivery to be recorded after the crash",
        &format!("SELECT state FROM tide.effect WHERE dedupe_key = '{id}'"),
        "delivered",
        60,
    )?;
    let all = wait_requests(&r, "\"a_crash\"", 2, Duration::from_secs(10))?;
    let opened: Vec<&Request> = all
        .iter()
        .filter(|q| q.header("X-Tide-Event") == Some("opened"))
        .collect();
    assert!(
        opened.len() == 2,
        "sent once before the crash and once after: {}",
        opened.len()
    );
    assert!(
        opened
            .iter()
            .all(|q| q.header("X-Tide-Delivery") == Some(id.as_str())),
        "the same delivery id: the receiver keeps one"
    );
    let rows: i64 = one(
        &mut db,
        &format!("SELECT count(*) FROM tide.effect WHERE dedupe_key = '{id}'"),
    )?;
    let attempts: i32 = one(
        &mut db,
        &format!("SELECT attempts FROM tide.effect WHERE dedupe_key = '{id}'"),
    )?;
    assert_eq!((rows, attempts), (1, 2));
    exec(
        &mut db,
        "SELECT tide.drop_channel('hook_crash'); SELECT tide.unschedule('a_crash')",
    )?;
    Ok(())
}

fn email_arrives_over_starttls(cluster: &Cluster) -> Result<(), Failed> {
    let sink = SmtpSink::start()?;
    let mut db = cluster.workers_db()?;
    db.execute(
        "SELECT tide.create_channel('mail_ops', 'email',
                   jsonb_build_object('host', '127.0.0.1', 'port', $1::int, 'username', 'alerts', 'password', 'Mail-Pass-7',
                                      'from', 'pg_tide@example.com', 'to', jsonb_build_array('ops@example.com', 'cto@example.com'),
                                      'ca_cert', $2::text),
                   'warning')",
        &[&i32::from(sink.port), &sink.cert_pem],
    )
    .map_err(db_err)?;
    dead_run(&mut db, "a_mail")?;
    let mail = wait_for("the e-mail", Duration::from_secs(30), || {
        Ok(sink.mails().into_iter().find(|m| m.data.contains("a_mail")))
    })?;
    assert!(mail.tls, "sent after STARTTLS");
    assert_eq!(
        mail.auth,
        Some(("alerts".to_string(), "Mail-Pass-7".to_string()))
    );
    assert_eq!(mail.to.len(), 2, "{:?}", mail.to);
    assert!(
        mail.data.contains("Subject: [pg_tide] ") && mail.data.contains("dead_letter"),
        "{}",
        mail.data
    );
    assert!(
        mail.data.contains("Message-ID: <alert."),
        "a stable Message-ID: {}",
        mail.data
    );
    // A wrong password never shows in what pg_tide records.
    exec(
        &mut db,
        "SELECT tide.drop_channel('mail_ops'); SELECT tide.unschedule('a_mail')",
    )?;
    let leaked: i64 = one(&mut db, "SELECT count(*) FROM tide.effect WHERE last_error LIKE '%Mail-Pass-7%' OR payload::text LIKE '%Mail-Pass-7%'")?;
    assert_eq!(leaked, 0);
    Ok(())
}

fn secrets_stay_with_their_owner(cluster: &Cluster) -> Result<(), Failed> {
    let mut db = cluster.workers_db()?;
    exec(
        &mut db,
        "DO $$ BEGIN
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'a_alice') THEN CREATE ROLE a_alice LOGIN; END IF;
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'a_bob') THEN CREATE ROLE a_bob LOGIN; END IF;
         END $$;",
    )?;
    let mut alice = cluster.connect_as("tide_workers", "a_alice")?;
    let mut bob = cluster.connect_as("tide_workers", "a_bob")?;
    exec(&mut alice, "SELECT tide.create_channel('alice_hook', 'webhook', '{\"url\": \"https://hooks.example/Alice-Token-9\", \"secret\": \"Alice-Sign-9\"}', 'warning')")?;
    let seen: i64 = one(
        &mut alice,
        "SELECT count(*) FROM tide.alert_channel WHERE config->>'url' LIKE '%Alice-Token-9'",
    )?;
    let by_bob: i64 = one(&mut bob, "SELECT count(*) FROM tide.alert_channel")?;
    assert_eq!((seen, by_bob), (1, 0), "only its owner reads a channel");
    let (code, _, _) = refused(&mut bob, "UPDATE tide.alert_channel SET alerts = NULL")?;
    assert_eq!(code, "42501");
    let dropped: bool = one(&mut bob, "SELECT tide.drop_channel('alice_hook')")?;
    assert!(!dropped, "another role's channel is not bob's to drop");
    let metrics: String = one(&mut db, "SELECT tide.metrics()")?;
    assert!(!metrics.contains("Alice-Token-9") && !metrics.contains("Alice-Sign-9"));
    exec(&mut alice, "SELECT tide.drop_channel('alice_hook')")?;
    // The server log never shows a channel's secrets (errors of the other tests included).
    let log = std::fs::read_to_string(cluster.data_dir.join("server.log"))?;
    for s in [
        "Alice-Token-9",
        "Alice-Sign-9",
        "Sig-Secret-42",
        "Mail-Pass-7",
        "Down-Secret-Path",
    ] {
        assert!(!log.contains(s), "{s} in the server log");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 2. pg_tide watches itself.

fn the_watchdog_and_the_ping_notice_a_stopped_scheduler(cluster: &Cluster) -> Result<(), Failed> {
    let r = Receiver::start()?;
    let mut db = cluster.workers_db()?;
    exec(
        &mut db,
        &format!(
            "ALTER SYSTEM SET pg_tide.ping_url = '{}'",
            r.url("/ping/uuid-1")
        ),
    )?;
    exec(
        &mut db,
        &format!(
            "SELECT pg_reload_conf(); SELECT tide.create_channel('ops_self', 'webhook', jsonb_build_object('url', '{}'), 'critical');",
            r.url("/ops")
        ),
    )?;
    wait_for("a ping", Duration::from_secs(30), || {
        Ok(r.requests()
            .iter()
            .any(|q| q.path == "/ping/uuid-1")
            .then_some(()))
    })?;
    let row: (String, bool, i32, bool, bool) = {
        let row = wait_for("self_health ok", Duration::from_secs(30), || {
            let row = db
                .query_one("SELECT status, scheduler_alive, executors_alive, delivery_alive, notifier_alive FROM tide.self_health", &[])
                .map_err(|e| describe(&e))?;
            let s: String = row.get(0);
            Ok((s == "ok").then_some(row))
        })?;
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4))
    };
    assert_eq!(row, ("ok".to_string(), true, 2, true, true));
    let health: String = one(
        &mut db,
        "SELECT status FROM tide.health WHERE task = 'pg_tide'",
    )?;
    assert_eq!(health, "ok");

    // The scheduler stops (SIGSTOP: alive, never ticking).
    let pid = cluster.pids("pg_tide scheduler")?[0];
    let stop = Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()?;
    assert!(stop.success());
    let outcome = (|| -> Result<(), Failed> {
        let got = wait_requests(&r, "scheduler_down", 1, Duration::from_secs(60))?;
        assert_eq!(got[0].path, "/ops");
        assert_eq!(got[0].header("X-Tide-Event"), Some("opened"));
        wait_for("a ping to /fail", Duration::from_secs(30), || {
            Ok(r.requests()
                .iter()
                .any(|q| q.path == "/ping/uuid-1/fail")
                .then_some(()))
        })?;
        let status: String = one(&mut db, "SELECT status FROM tide.self_health")?;
        assert_eq!(status, "down");
        Ok(())
    })();
    let cont = Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status()?;
    assert!(cont.success());
    outcome?;
    // Ticking again: the alert resolves and says so, and the pings are good again.
    let got = wait_for("the resolution", Duration::from_secs(60), || {
        Ok(r.requests().into_iter().find(|q| {
            q.body.contains("scheduler_down") && q.header("X-Tide-Event") == Some("resolved")
        }))
    })?;
    assert_eq!(got.path, "/ops");
    let fails = r
        .requests()
        .iter()
        .filter(|q| q.path.ends_with("/fail"))
        .count();
    wait_for(
        "a good ping after the fail",
        Duration::from_secs(30),
        || {
            let all = r.requests();
            let last_fail = all
                .iter()
                .rposition(|q| q.path.ends_with("/fail"))
                .unwrap_or(0);
            Ok(all[last_fail..]
                .iter()
                .any(|q| q.path == "/ping/uuid-1")
                .then_some(()))
        },
    )?;
    assert!(fails >= 1);
    // Uptime Kuma's push monitor: a failure URL of its own (status=down), not /fail.
    exec(
        &mut db,
        &format!(
            "ALTER SYSTEM SET pg_tide.ping_url = '{}'",
            r.url("/api/push/tok?status=up&msg=OK")
        ),
    )?;
    exec(
        &mut db,
        &format!(
            "ALTER SYSTEM SET pg_tide.ping_fail_url = '{}'",
            r.url("/api/push/tok?status=down&msg=pg_tide")
        ),
    )?;
    exec(&mut db, "SELECT pg_reload_conf()")?;
    wait_for("a Kuma-style ping", Duration::from_secs(30), || {
        Ok(r.requests()
            .iter()
            .any(|q| q.path == "/api/push/tok?status=up&msg=OK")
            .then_some(()))
    })?;
    let pid = cluster.pids("pg_tide scheduler")?[0];
    let stop = Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()?;
    assert!(stop.success());
    let down = wait_for("a Kuma-style failure ping", Duration::from_secs(60), || {
        Ok(r.requests()
            .iter()
            .any(|q| q.path == "/api/push/tok?status=down&msg=pg_tide")
            .then_some(()))
    });
    let cont = Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status()?;
    assert!(cont.success());
    down?;
    assert!(
        !r.requests()
            .iter()
            .any(|q| q.path.starts_with("/api/push/tok?status=up&msg=OK/fail")),
        "no /fail appended to a URL with a failure URL of its own"
    );
    exec(&mut db, "ALTER SYSTEM RESET pg_tide.ping_fail_url")?;
    exec(&mut db, "ALTER SYSTEM RESET pg_tide.ping_url")?;
    exec(
        &mut db,
        "SELECT pg_reload_conf(); SELECT tide.drop_channel('ops_self');",
    )?;
    Ok(())
}

fn create_extension_refuses_where_pg_tide_cannot_work(cluster: &Cluster) -> Result<(), Failed> {
    // A database no scheduler serves.
    let mut admin = cluster.connect("postgres")?;
    exec(&mut admin, "DROP DATABASE IF EXISTS a_elsewhere")?;
    exec(&mut admin, "CREATE DATABASE a_elsewhere")?;
    let mut c = cluster.connect("a_elsewhere")?;
    let (code, message, hint) = refused(
        &mut c,
        "SET pg_tide.allow_unscheduled = off; CREATE EXTENSION pg_tide",
    )?;
    assert_eq!(code, "55000");
    assert!(
        message.contains("can only be created in database \"tide_workers\"")
            && message.contains("a_elsewhere"),
        "{message}"
    );
    assert!(hint.contains("pg_tide.database"), "{hint}");
    let schemas: i64 = one(
        &mut c,
        "SELECT count(*) FROM pg_namespace WHERE nspname = 'tide'",
    )?;
    assert_eq!(schemas, 0, "nothing is left behind");
    // With the extension there (a test's own database), tide.schedule warns that no scheduler
    // runs; in the workers' database it does not.
    cluster.fresh_db("a_warned")?;
    let (_, warned) = cluster.psql(
        "a_warned",
        "SET pg_tide.allow_unscheduled = off; SELECT tide.schedule('w', '0 0 1 1 *', 'SELECT 1')",
    )?;
    assert!(
        warned.contains("WARNING:  no pg_tide scheduler is running for database \"a_warned\""),
        "{warned}"
    );
    assert!(warned.contains("HINT:"), "{warned}");
    let (_, quiet) = cluster.psql("tide_workers", "SET pg_tide.allow_unscheduled = off; SELECT tide.schedule('a_quiet', '0 0 1 1 *', 'SELECT 1'); SELECT tide.unschedule('a_quiet')")?;
    assert!(!quiet.contains("WARNING"), "{quiet}");
    // Nor while the scheduler is starting: terminated, it is back within a second or two, and
    // tide.schedule waits for it rather than warn (the demo's first screen showed such false
    // warnings while the scheduler connected to its new database). Tried until the call begins
    // while the scheduler is away (it says so: absent=0).
    let mut admin = cluster.connect("postgres")?;
    let mut exercised = false;
    for _ in 0..5 {
        let old: Vec<i32> = cluster.pids("pg_tide scheduler")?;
        exec(
            &mut admin,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'pg_tide scheduler'",
        )?;
        wait_for("the scheduler to exit", Duration::from_secs(10), || {
            let now = cluster.pids("pg_tide scheduler")?;
            Ok((!now.iter().any(|p| old.contains(p))).then_some(()))
        })?;
        let (out, starting) = cluster.psql(
            "tide_workers",
            "SET pg_tide.allow_unscheduled = off;
             SELECT 'absent=' || count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide scheduler';
             SELECT tide.schedule('a_starting', '0 0 1 1 *', 'SELECT 1'); SELECT tide.unschedule('a_starting')",
        )?;
        assert!(!starting.contains("WARNING"), "{starting}");
        if out.contains("absent=0") {
            exercised = true;
            break;
        }
    }
    assert!(
        exercised,
        "tide.schedule never began while the scheduler was away"
    );
    // A server without pg_tide preloaded.
    let bare = Cluster::start_with("a_bare", "shared_preload_libraries = ''")?;
    let mut c = bare.connect("postgres")?;
    let (code, message, hint) = refused(&mut c, "CREATE EXTENSION pg_tide")?;
    assert_eq!(code, "55000");
    assert!(message.contains("shared_preload_libraries"), "{message}");
    assert!(
        hint.contains("add pg_tide to shared_preload_libraries"),
        "{hint}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 3. Alerts on patterns for every kind of task.

/// Open alerts of a subject, as kinds (sorted).
fn kinds(c: &mut Client, subject: &str) -> Result<String, Failed> {
    one(
        c,
        &format!(
            "SELECT coalesce(string_agg(kind::text, ' ' ORDER BY kind::text), '') FROM tide.alert
              WHERE resolved_at IS NULL AND subject = '{subject}'"
        ),
    )
}

fn event_and_enqueued_runs_raise_failure_retry_and_skip_alerts(
    cluster: &Cluster,
) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("a_events")?;
    exec(
        &mut c,
        "SET pg_tide.alert_failures = 3; SET pg_tide.alert_retries = 4;
         SELECT tide.schedule('ev', NULL, topics => '{orders}', max_attempts => 10, backoff_base => '1 second', jitter => 'none');
         SELECT tide.schedule('jobs', NULL, topics => '{never}', queue => 'jobs', max_attempts => 10, backoff_base => '1 second', jitter => 'none');",
    )?;
    // Three failed attempts of event runs in a row: consecutive_failures.
    exec(&mut c, "SELECT tide.emit('orders', '{\"id\": 1}')")?;
    for i in 1..=3 {
        let (run, token): (i64, i64) = {
            let row = c
                .query_one(
                    "SELECT run_id, lease_token FROM tide.claim_runs(worker => 'w')",
                    &[],
                )
                .map_err(db_err)?;
            (row.get(0), row.get(1))
        };
        exec(
            &mut c,
            &format!("SELECT tide.fail_run({run}, {token}, 'timeout {i}')"),
        )?;
        tick(&mut c, &format!("now() + interval '{i} minutes'"))?;
    }
    assert_eq!(kinds(&mut c, "ev")?, "consecutive_failures");
    let failures: i32 = one(
        &mut c,
        "SELECT consecutive_failures FROM tide._health(now()) WHERE task = 'ev'",
    )?;
    assert_eq!(failures, 3);
    // Enqueued runs retried: 2 runs x 2 retries = 4 retries in 24 hours.
    exec(
        &mut c,
        "SELECT tide.enqueue('jobs', '[{\"n\": 1}, {\"n\": 2}]')",
    )?;
    let mut failed = 0;
    for i in 0..10 {
        tick(&mut c, &format!("now() + interval '{} minutes'", 10 + i))?;
        while let Some(row) = c
            .query_opt(
                "SELECT run_id, lease_token FROM tide.claim_runs('jobs', 'w')",
                &[],
            )
            .map_err(db_err)?
        {
            let (run, token): (i64, i64) = (row.get(0), row.get(1));
            exec(
                &mut c,
                &format!("SELECT tide.fail_run({run}, {token}, 'flaky {i}')"),
            )?;
            failed += 1;
        }
        if failed >= 6 {
            break;
        }
    }
    let retries: i32 = one(
        &mut c,
        "SELECT retries_24h FROM tide._health(now()) WHERE task = 'jobs'",
    )?;
    assert!(retries >= 4, "{retries}");
    tick(&mut c, "now() + interval '30 minutes'")?;
    assert!(
        kinds(&mut c, "jobs")?.contains("retries"),
        "{}",
        kinds(&mut c, "jobs")?
    );
    // A success of the event task ends its failure streak.
    exec(&mut c, "SELECT tide.emit('orders', '{\"id\": 2}')")?;
    loop {
        let row = c
            .query_opt(
                "SELECT run_id, lease_token FROM tide.claim_runs(worker => 'w')",
                &[],
            )
            .map_err(db_err)?;
        let Some(row) = row else { break };
        let (run, token): (i64, i64) = (row.get(0), row.get(1));
        exec(&mut c, &format!("SELECT tide.complete_run({run}, {token})"))?;
    }
    tick(&mut c, "now() + interval '40 minutes'")?;
    assert!(
        !kinds(&mut c, "ev")?.contains("consecutive_failures"),
        "{}",
        kinds(&mut c, "ev")?
    );
    Ok(())
}

fn readiness_deferrals_count_as_skips_and_held_runs_alert(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("a_skips")?;
    exec(
        &mut c,
        "SET pg_tide.alert_skips = 3; SET pg_tide.alert_held_after = '1h';
         CREATE TABLE flag (ok boolean); INSERT INTO flag VALUES (false);
         SELECT tide.schedule('gated', '0 * * * *', 'SELECT 1', biz_window => 'hour', ready_check => 'SELECT ok FROM flag',
                              ready_timeout => '10 minutes', not_ready_policy => 'next_window', max_attempts => 100);
         SELECT tide.monitor('gated', max_silence => '30 days');",
    )?;
    // The data is never ready: at each window's deadline its run is deferred to the next window
    // (ticks an hour apart; no executor runs here, so no check ever finds it ready).
    exec(&mut c, "SELECT tide.rerun('gated', window_start => date_trunc('hour', now()) - interval '3 hours')")?;
    let mut hours = 0;
    loop {
        hours += 1;
        tick(&mut c, &format!("now() + interval '{hours} hours'"))?;
        let skips: i32 = one(&mut c, &format!("SELECT consecutive_skips FROM tide._health(now() + interval '{hours} hours') WHERE task = 'gated'"))?;
        let deferred: i32 = one(&mut c, "SELECT max(deferrals) FROM tide.run")?;
        assert_eq!(
            skips, deferred,
            "each window that found the data not ready is a skip"
        );
        if skips > 3 {
            break;
        }
        assert_eq!(
            kinds(&mut c, "gated")?,
            "",
            "{skips} skips are not more than alert_skips"
        );
        assert!(hours < 10, "the runs were never deferred");
    }
    assert_eq!(kinds(&mut c, "gated")?, "repeated_skips");
    // Ready at last: the streak ends.
    exec(&mut c, "UPDATE flag SET ok = true")?;

    // A held run (the rules changed, pending => 'hold') opens an alert after alert_held_after.
    exec(
        &mut c,
        "SELECT tide.schedule('rules', '0 0 1 1 *', 'SELECT 1');
         SELECT tide.rerun('rules', window_start => (date_trunc('year', now() AT TIME ZONE 'UTC') - interval '1 year') AT TIME ZONE 'UTC');
         SELECT tide.alter('rules', command => 'SELECT 2');",
    )?;
    let held: i64 = one(&mut c, "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'rules' AND r.state = 'held'")?;
    assert_eq!(held, 1);
    tick(&mut c, "now() + interval '10 minutes'")?;
    assert_eq!(
        kinds(&mut c, "rules")?,
        "",
        "not yet: held for less than an hour"
    );
    tick(&mut c, "now() + interval '61 minutes'")?;
    assert_eq!(kinds(&mut c, "rules")?, "held");
    let details: String = one(&mut c, "SELECT details->>'confirm' FROM tide.alert WHERE subject = 'rules' AND resolved_at IS NULL")?;
    assert_eq!(details, "SELECT tide.confirm('rules', version)");
    exec(&mut c, "SELECT tide.confirm('rules', 2)")?;
    tick(&mut c, "now() + interval '62 minutes'")?;
    // Confirmed, the run is ready; no executor serves this database, so it now waits past its
    // start deadline instead (a quarter of a yearly task's fire gap, at most 15 minutes).
    assert_eq!(kinds(&mut c, "rules")?, "late_start");
    Ok(())
}

fn backlog_catch_up_limit_and_not_ready_alert(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.fresh_db("a_more_kinds")?;
    exec(
        &mut c,
        "SET pg_tide.alert_backlog = 5;
         SELECT tide.schedule('bl', NULL, topics => '{bl}', queue => 'bl');
         SELECT tide.schedule('cu', '0 * * * *', 'SELECT 1', biz_window => 'hour', catch_up_max => 2);
         SELECT tide.schedule('nr', '0 * * * *', 'SELECT 1', biz_window => 'hour', ready_check => 'SELECT false',
                              ready_timeout => '10 minutes', not_ready_policy => 'skip');",
    )?;
    // Six runs waiting for a worker, against a threshold of five.
    exec(&mut c, "SELECT tide.enqueue('bl', (SELECT jsonb_agg(jsonb_build_object('n', g)) FROM generate_series(1, 6) g))")?;
    let base: String = one(
        &mut c,
        "SELECT next_fire_at::text FROM tide.task WHERE name = 'cu'",
    )?;
    // nr's run of the first fire waits for readiness until 10 minutes after it.
    tick(
        &mut c,
        &format!("'{base}'::timestamptz + interval '1 second'"),
    )?;
    assert!(
        kinds(&mut c, "bl")?.contains("backlog"),
        "{}",
        kinds(&mut c, "bl")?
    );
    let waiting: i64 = one(&mut c, "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'nr' AND r.state = 'waiting'")?;
    assert_eq!(waiting, 1);
    assert!(!kinds(&mut c, "nr")?.contains("not_ready"));
    // Not ready by its deadline: skipped (not_ready_policy skip), and said so.
    tick(
        &mut c,
        &format!("'{base}'::timestamptz + interval '11 minutes'"),
    )?;
    assert!(
        kinds(&mut c, "nr")?.contains("not_ready"),
        "{}",
        kinds(&mut c, "nr")?
    );
    // Then down for three fires (+1h, +2h, +3h missed; +4h on time): cu catches up two windows
    // (catch_up_max) and skips the oldest.
    assert!(!kinds(&mut c, "cu")?.contains("catch_up_limit"));
    tick(
        &mut c,
        &format!("'{base}'::timestamptz + interval '4 hours 5 seconds'"),
    )?;
    assert!(
        kinds(&mut c, "cu")?.contains("catch_up_limit"),
        "{}",
        kinds(&mut c, "cu")?
    );
    let details: i32 = one(&mut c, "SELECT (details->>'windows_skipped_24h')::int FROM tide.alert WHERE subject = 'cu' AND kind = 'catch_up_limit'")?;
    assert_eq!(details, 1);
    Ok(())
}

/// tide.test_channel sends a test message through the delivery worker and says what the
/// receiver answered, for a receiver that answers and for a port nobody listens on; a role tests
/// its own channels only. Open alerts that no channel takes are counted in tide.self_health and
/// raise pg_tide's own `undelivered` alert, which resolves once a channel takes them.
fn channels_are_tested_and_alerts_that_reach_no_one_are_flagged(
    cluster: &Cluster,
) -> Result<(), Failed> {
    let r = Receiver::start()?;
    let closed = {
        // A port nobody listens on: bound, then let go.
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let mut db = cluster.workers_db()?;
    exec(
        &mut db,
        &format!(
            "SELECT tide.create_channel('t_ok', 'webhook', jsonb_build_object('url', '{}'));
             SELECT tide.create_channel('t_dead', 'webhook', jsonb_build_object('url', 'http://127.0.0.1:{closed}/hook'));",
            r.url("/test-hook")
        ),
    )?;
    let ok: String = one(
        &mut db,
        "SELECT concat_ws('|', channel, status, took IS NOT NULL, coalesce(error, '-')) FROM tide.test_channel('t_ok')",
    )?;
    assert_eq!(ok, "t_ok|delivered|t|-");
    let got = r
        .requests()
        .into_iter()
        .find(|q| q.path == "/test-hook")
        .ok_or("the receiver got no test message")?;
    assert!(got.body.contains("a test of channel t_ok"), "{}", got.body);
    assert_eq!(got.header("X-Tide-Event"), Some("test"));
    let dead: String = one(
        &mut db,
        "SELECT concat_ws('|', status, error) FROM tide.test_channel('t_dead')",
    )?;
    assert!(dead.starts_with("failed|connection failed"), "{dead}");
    assert!(
        !dead.contains(&closed.to_string()),
        "no URL in the error: {dead}"
    );
    let recorded: i64 = one(
        &mut db,
        "SELECT count(*) FROM tide.effect WHERE dedupe_key LIKE 'test:%'",
    )?;
    assert_eq!(recorded, 0, "a test records nothing");
    for (sql, code) in [
        ("SELECT * FROM tide.test_channel('t_none')", "42704"),
        ("SELECT * FROM tide.test_channel('bad name!')", "22023"),
        ("SELECT * FROM tide.test_channel(NULL)", "22004"),
    ] {
        let (got, message, hint) = refused(&mut db, sql)?;
        assert_eq!(got, code, "{sql}: {message}");
        assert!(!hint.is_empty(), "{sql}");
    }
    exec(
        &mut db,
        "DROP ROLE IF EXISTS t_other; CREATE ROLE t_other LOGIN;",
    )?;
    let mut other = cluster.connect_as(pg_tide_pg_test::WORKERS_DB, "t_other")?;
    let (code, _, _) = refused(&mut other, "SELECT * FROM tide.test_channel('t_ok')")?;
    assert_eq!(code, "42704", "another role's channel reads as none");

    // One test of a role's channels at a time: a receiver that takes the connection and says
    // nothing holds the first; a second of the same role is refused meanwhile (the delivery
    // worker sends one test per round, between its deliveries).
    let silent = std::net::TcpListener::bind("127.0.0.1:0")?;
    let silent_port = silent.local_addr()?.port();
    let (accepted_tx, accepted_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        if let Ok((conn, _)) = silent.accept() {
            let _ = accepted_tx.send(());
            let _ = release_rx.recv();
            drop(conn);
        }
    });
    exec(
        &mut db,
        &format!("SELECT tide.create_channel('t_silent', 'webhook', jsonb_build_object('url', 'http://127.0.0.1:{silent_port}/'))"),
    )?;
    let mut first = cluster.workers_db()?;
    let waiting = std::thread::spawn(move || {
        first
            .query_one("SELECT status FROM tide.test_channel('t_silent')", &[])
            .map(|r| r.get::<_, String>(0))
            .map_err(|e| describe(&e))
    });
    accepted_rx
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| "the delivery worker never connected to the silent receiver")?;
    let (code, message, hint) = refused(&mut db, "SELECT * FROM tide.test_channel('t_ok')")?;
    assert_eq!(code, "53400", "{message}");
    assert!(message.contains("under way"), "{message}");
    assert!(!hint.is_empty());
    let _ = release_tx.send(());
    let status = waiting.join().map_err(|_| "the waiting test panicked")??;
    assert_eq!(status, "failed", "the receiver closed without an answer");
    holder.join().map_err(|_| "the silent receiver panicked")?;
    let ok: String = one(&mut db, "SELECT status FROM tide.test_channel('t_ok')")?;
    assert_eq!(ok, "delivered", "the slot is free again once answered");

    // No channel at all: a dead letter's alert reaches no one, and pg_tide says so.
    exec(
        &mut db,
        "SELECT tide.drop_channel(name) FROM tide.alert_channel;
         SELECT tide.schedule('t_failing', '0 0 1 1 *', 'SELECT 1 / 0', max_attempts => 1);
         SELECT tide.rerun('t_failing');",
    )?;
    let untaken: i32 = wait_for(
        "the untaken alert to be counted",
        Duration::from_secs(60),
        || {
            let row = db
                .query_one("SELECT alerts_untaken, status FROM tide.self_health", &[])
                .map_err(|e| describe(&e))?;
            let (n, status): (i32, String) = (row.get(0), row.get(1));
            Ok((n >= 1 && status == "late").then_some(n))
        },
    )?;
    assert!(untaken >= 1);
    let details: String = wait_for(
        "pg_tide's undelivered alert",
        Duration::from_secs(60),
        || {
            db.query_opt(
                "SELECT details->>'message' FROM tide.alert
              WHERE subject_type = 'pg_tide' AND kind = 'undelivered' AND resolved_at IS NULL",
                &[],
            )
            .map(|r| r.map(|r| r.get::<_, String>(0)))
            .map_err(|e| describe(&e))
        },
    )?;
    assert!(details.contains("reach no one"), "{details}");
    let dashboard: String = one(
        &mut db,
        "SELECT status FROM tide.dashboard WHERE task = 'pg_tide'",
    )?;
    assert_eq!(dashboard, "late");
    // A channel takes them: the count goes back to 0 and the alert resolves.
    exec(
        &mut db,
        &format!(
            "SELECT tide.create_channel('t_ok', 'webhook', jsonb_build_object('url', '{}'), alerts => 'info')",
            r.url("/test-hook")
        ),
    )?;
    wait_for(
        "the undelivered alert to resolve",
        Duration::from_secs(60),
        || {
            let open: i64 = db
            .query_one(
                "SELECT count(*) FROM tide.alert WHERE subject_type = 'pg_tide' AND kind = 'undelivered' AND resolved_at IS NULL",
                &[],
            )
            .map_err(|e| describe(&e))?
            .get(0);
            Ok((open == 0).then_some(()))
        },
    )?;
    let now_taken: i32 = one(&mut db, "SELECT alerts_untaken FROM tide.self_health")?;
    assert_eq!(now_taken, 0);
    exec(
        &mut db,
        "SELECT tide.unschedule('t_failing'); SELECT tide.drop_channel('t_ok');",
    )?;
    Ok(())
}

/// The late_start alert of a task, once open: its details' cause.
fn late_cause(c: &mut Client, task: &str) -> Result<String, Failed> {
    Ok(wait_for(
        &format!("a late_start alert of {task}"),
        Duration::from_secs(30),
        || {
            c.query_opt(
                "SELECT details->>'cause' FROM tide.alert
                  WHERE subject = $1 AND kind = 'late_start' AND resolved_at IS NULL",
                &[&task],
            )
            .map(|r| r.map(|r| r.get::<_, String>(0)))
            .map_err(|e| describe(&e))
        },
    )?)
}

fn late_start_resolved(c: &mut Client, task: &str) -> Result<(), Failed> {
    wait_for(
        &format!("{task}'s late_start alert to resolve"),
        Duration::from_secs(60),
        || {
            let open: i64 = c
                .query_one(
                    "SELECT count(*) FROM tide.alert WHERE subject = $1 AND kind = 'late_start' AND resolved_at IS NULL",
                    &[&task],
                )
                .map_err(|e| describe(&e))?
                .get(0);
            Ok((open == 0).then_some(()))
        },
    )?;
    Ok(())
}

/// A run that does not start by its deadline opens a late_start alert naming the run, its wait
/// and the likely cause, for each cause pg_tide can tell; it resolves when the run starts.
fn late_starts_alert_with_their_cause(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = cluster.workers_db()?;
    exec(
        &mut c,
        "CREATE TABLE IF NOT EXISTS ls_hold (go boolean); TRUNCATE ls_hold;
         SELECT tide.create_queue('ls_paused'); SELECT tide.pause_queue('ls_paused');
         SELECT tide.create_queue('ls_one', max_concurrency => 1);
         SELECT tide.schedule('ls_in_paused', '0 0 1 1 *', 'SELECT 1', queue => 'ls_paused');
         SELECT tide.schedule('ls_busy', '0 0 1 1 *', $c$SELECT pg_sleep(60)$c$, queue => 'ls_one');
         SELECT tide.schedule('ls_behind', '0 0 1 1 *', 'SELECT 1', queue => 'ls_one');
         SELECT tide.schedule('ls_locker', '0 0 1 1 *', $c$SELECT pg_sleep(60)$c$, lock_key => 'acct:1');
         SELECT tide.schedule('ls_locked', '0 0 1 1 *', 'SELECT 1', lock_key => 'acct:1');
         SELECT tide.schedule('ls_external', '0 0 1 1 *', queue => 'ls_ext');",
    )?;
    for task in ["ls_in_paused", "ls_behind", "ls_locked", "ls_external"] {
        exec(
            &mut c,
            &format!("SELECT tide.monitor('{task}', start_deadline => '1 second')"),
        )?;
    }
    // A paused queue.
    let paused_run: i64 = one(&mut c, "SELECT tide.rerun('ls_in_paused')")?;
    let cause = late_cause(&mut c, "ls_in_paused")?;
    assert_eq!(cause, "queue ls_paused is paused (tide.resume_queue)");
    let details: String = one(
        &mut c,
        "SELECT concat_ws('|', details->>'run_id', (details->>'waited')::interval >= interval '1 second',
                          details->>'start_deadline')
           FROM tide.alert WHERE subject = 'ls_in_paused' AND kind = 'late_start' AND resolved_at IS NULL",
    )?;
    assert_eq!(details, format!("{paused_run}|t|00:00:01"));
    // The wait shows in health, the dashboard and the metrics (per task and per queue).
    let shown: String = one(
        &mut c,
        "SELECT concat_ws('|', (SELECT h.oldest_ready >= interval '1 second' FROM tide.health h WHERE h.task = 'ls_in_paused'),
                          (SELECT d.wait <> '' FROM tide.dashboard d WHERE d.task = 'ls_in_paused'),
                          (SELECT m.value >= 1 FROM tide.metric m
                            WHERE m.metric = 'pg_tide_task_oldest_ready_seconds' AND m.task = 'ls_in_paused'),
                          (SELECT m.value >= 1 FROM tide.metric m
                            WHERE m.metric = 'pg_tide_queue_oldest_ready_seconds' AND m.labels->>'queue' = 'ls_paused'),
                          (SELECT m.value >= 1 FROM tide.metric m
                            WHERE m.metric = 'pg_tide_alerts_open' AND m.labels->>'kind' = 'late_start'
                              AND m.labels->>'severity' = 'warning'))",
    )?;
    assert_eq!(shown, "t|t|t|t|t");
    exec(&mut c, "SELECT tide.resume_queue('ls_paused')")?;
    late_start_resolved(&mut c, "ls_in_paused")?;

    // A queue at its limit, and a lock another run holds.
    exec(
        &mut c,
        "SELECT tide.rerun('ls_busy'); SELECT tide.rerun('ls_locker');",
    )?;
    wait_for("the holders to run", Duration::from_secs(30), || {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id)
                  WHERE t.name IN ('ls_busy', 'ls_locker') AND r.state = 'running'",
                &[],
            )
            .map_err(|e| describe(&e))?
            .get(0);
        Ok((n == 2).then_some(()))
    })?;
    let locker: i64 = one(
        &mut c,
        "SELECT r.run_id FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'ls_locker'",
    )?;
    exec(
        &mut c,
        "SELECT tide.rerun('ls_behind'); SELECT tide.rerun('ls_locked');",
    )?;
    assert_eq!(
        late_cause(&mut c, "ls_behind")?,
        "queue ls_one is at its limit: 1 running of max_concurrency 1"
    );
    assert_eq!(
        late_cause(&mut c, "ls_locked")?,
        format!("lock acct:1 is held by run {locker}")
    );
    // Every executor busy: the two holders keep both; a third SQL run waits for one.
    exec(
        &mut c,
        "SELECT tide.schedule('ls_starved', '0 0 1 1 *', 'SELECT 1');
         SELECT tide.monitor('ls_starved', start_deadline => '1 second');
         SELECT tide.rerun('ls_starved');",
    )?;
    assert_eq!(
        late_cause(&mut c, "ls_starved")?,
        "no executor free: all 2 run other runs (raise pg_tide.executors)"
    );
    exec(
        &mut c,
        "SELECT tide.cancel_run(r.run_id) FROM tide.run r JOIN tide.task t USING (task_id)
          WHERE t.name IN ('ls_busy', 'ls_locker') AND r.state = 'running'",
    )?;
    for task in ["ls_behind", "ls_locked", "ls_starved"] {
        late_start_resolved(&mut c, task)?;
    }

    // An external queue no worker claims from.
    exec(&mut c, "SELECT tide.rerun('ls_external')")?;
    let cause = late_cause(&mut c, "ls_external")?;
    assert!(
        cause.starts_with("no worker claimed from queue ls_ext in the last minute"),
        "{cause}"
    );
    let claimed: i64 = one(
        &mut c,
        "SELECT count(tide.complete_run(run_id, lease_token)) FROM tide.claim_runs('ls_ext', worker => 'w')",
    )?;
    assert_eq!(claimed, 1);
    late_start_resolved(&mut c, "ls_external")?;

    // Bad input.
    let (code, message, hint) = refused(
        &mut c,
        "SELECT tide.monitor('ls_starved', start_deadline => '-1 minute')",
    )?;
    assert_eq!(code, "22023", "{message}");
    assert!(message.contains("start_deadline"), "{message}");
    assert!(!hint.is_empty());
    exec(
        &mut c,
        "SELECT tide.unschedule(name) FROM tide.task WHERE name LIKE 'ls\\_%';
         SELECT tide.drop_queue('ls_paused'); SELECT tide.drop_queue('ls_one');",
    )?;
    Ok(())
}

fn main() {
    let tests: &[(&'static str, TestFn)] = &[
        (
            "create_channel_refuses_bad_input_without_showing_secrets",
            create_channel_refuses_bad_input_without_showing_secrets,
        ),
        (
            "escalation_reminders_ack_and_resolution_are_each_notified_once",
            escalation_reminders_ack_and_resolution_are_each_notified_once,
        ),
        (
            "webhook_gets_the_alert_within_seconds_signed",
            webhook_gets_the_alert_within_seconds_signed,
        ),
        (
            "a_receiver_that_is_down_gets_it_later",
            a_receiver_that_is_down_gets_it_later,
        ),
        (
            "a_refused_delivery_is_dead_alerts_and_is_replayed",
            a_refused_delivery_is_dead_alerts_and_is_replayed,
        ),
        (
            "a_crash_mid_send_sends_again_with_the_same_delivery_id",
            a_crash_mid_send_sends_again_with_the_same_delivery_id,
        ),
        ("email_arrives_over_starttls", email_arrives_over_starttls),
        (
            "a_channel_made_without_alerts_takes_warnings",
            a_channel_made_without_alerts_takes_warnings,
        ),
        (
            "the_watchdog_and_the_ping_notice_a_stopped_scheduler",
            the_watchdog_and_the_ping_notice_a_stopped_scheduler,
        ),
        (
            "create_extension_refuses_where_pg_tide_cannot_work",
            create_extension_refuses_where_pg_tide_cannot_work,
        ),
        (
            "event_and_enqueued_runs_raise_failure_retry_and_skip_alerts",
            event_and_enqueued_runs_raise_failure_retry_and_skip_alerts,
        ),
        (
            "readiness_deferrals_count_as_skips_and_held_runs_alert",
            readiness_deferrals_count_as_skips_and_held_runs_alert,
        ),
        (
            "backlog_catch_up_limit_and_not_ready_alert",
            backlog_catch_up_limit_and_not_ready_alert,
        ),
        (
            "late_starts_alert_with_their_cause",
            late_starts_alert_with_their_cause,
        ),
        (
            "channels_are_tested_and_alerts_that_reach_no_one_are_flagged",
            channels_are_tested_and_alerts_that_reach_no_one_are_flagged,
        ),
        // Last: it reads the server log every other test wrote.
        (
            "secrets_stay_with_their_owner",
            secrets_stay_with_their_owner,
        ),
    ];
    run_tests_with(
        "alerts",
        // LOG lines too (delivery errors among them): the secrets test reads the whole server log.
        "pg_tide.monitor_interval = 300\npg_tide.alert_stalled_after = 5\npg_tide.ping_interval = 1\n\
         log_min_messages = log\n",
        tests,
    )
}

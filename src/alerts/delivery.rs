//! The delivery worker, and what pg_tide knows about itself.
//!
//! **Delivery.** Alerts routed to a channel made with `tide.create_channel` become side effects
//! (`tide.effect`, src/effects/effects.sql) in the transaction that opened, escalated, re-notified or
//! resolved them. This worker, `pg_tide delivery`, takes them in a short transaction (a lease,
//! committed), sends them with no transaction open (HTTP or SMTP, bounded by a timeout), and
//! records the outcome in a second short transaction: delivered, retried after a backoff, or dead
//! after its attempts. It is a process of its own, so a slow receiver never delays a tick or a
//! run. The guarantee is at least once, with a delivery id that is the same for every copy: a
//! crash between sending and recording sends that event again once the worker is back (it takes
//! back what it held at start), with the same `X-Tide-Delivery` header (`Message-ID` for e-mail).
//!
//! **Watching pg_tide itself.** The scheduler notes each tick's start, success or error in
//! shared memory. From it, `tide._watch()` tells SQL when pg_tide last ticked;
//! `tide.self_health` and the `pg_tide` row of `tide.health` show it; and this worker (which does
//! not depend on the scheduler) opens the `scheduler_down` alert when ticks stop, and pings
//! `pg_tide.ping_url`, so that an outside monitor notices when all of PostgreSQL is gone.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pgrx::lwlock::PgLwLock;
use pgrx::prelude::*;
use pgrx::{pg_sys, JsonB, PGRXSharedMemory};
use serde_json::{json, Value};

use crate::alerts::notify::{self, Outcome};
use crate::base::sqlerr::OrRaise;
use crate::bgw;
use crate::settings;

const F: &str = "pg_tide delivery";
/// The longest one send may take: a receiver that hangs is given up on (and retried) after it.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Sends per claim: at most this many timeouts fit well within the claim's lease (2 minutes).
const BATCH: i32 = 5;
const ERROR_LEN: usize = 200;

#[derive(Copy, Clone)]
#[repr(C)]
pub struct Watch {
    /// Epoch milliseconds; 0 = not since the server started.
    tick_started: i64,
    tick_ok: i64,
    tick_error_at: i64,
    tick_errors: i64,
    error: [u8; ERROR_LEN],
    /// The scheduler is alive and idle by choice (pg_tide.enabled off, no extension yet).
    idle: i64,
    delivery_round: i64,
    ping_at: i64,
    ping_status: i32,
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            tick_started: 0,
            tick_ok: 0,
            tick_error_at: 0,
            tick_errors: 0,
            error: [0; ERROR_LEN],
            idle: 0,
            delivery_round: 0,
            ping_at: 0,
            ping_status: 0,
        }
    }
}

// SAFETY: plain data (no pointers), shared across processes under the LWLock.
unsafe impl PGRXSharedMemory for Watch {}

// SAFETY: the name is unique to pg_tide.
static WATCH: PgLwLock<Watch> = unsafe { PgLwLock::new(c"pg_tide_watch") };

/// Test messages asked for with `tide.test_channel`, each sent by the delivery worker, which
/// writes back what the receiver answered.
const TESTS: usize = 8;
const TEXT: usize = 600;
const FREE: u8 = 0;
const ASKED: u8 = 1;
const SENDING: u8 = 2;
const ANSWERED: u8 = 3;

#[derive(Copy, Clone)]
#[repr(C)]
struct TestSlot {
    state: u8,
    id: u64,
    /// When it was asked (epoch ms): a slot whose asker is long gone (its call cancelled or its
    /// backend ended while it waited) is free again after `TEST_WAIT` and a margin.
    asked_at: i64,
    /// The PGPROC number of the backend waiting for the answer.
    requester: i32,
    owner: [u8; 64],
    owner_len: u16,
    name: [u8; 64],
    name_len: u16,
    status: [u8; 16],
    status_len: u16,
    took_ms: i64,
    error: [u8; TEXT],
    error_len: u16,
}

impl TestSlot {
    const EMPTY: TestSlot = TestSlot {
        state: FREE,
        id: 0,
        asked_at: 0,
        requester: -1,
        owner: [0; 64],
        owner_len: 0,
        name: [0; 64],
        name_len: 0,
        status: [0; 16],
        status_len: 0,
        took_ms: 0,
        error: [0; TEXT],
        error_len: 0,
    };
}

#[derive(Copy, Clone)]
#[repr(C)]
pub struct Tests {
    next_id: u64,
    slot: [TestSlot; TESTS],
}

impl TestSlot {
    /// Free, or left behind by an asker that no longer waits for it.
    fn free(&self, now: i64) -> bool {
        self.state == FREE
            || now - self.asked_at
                > i64::try_from(TEST_WAIT.as_millis()).unwrap_or(i64::MAX) + 30_000
    }
}

impl Default for Tests {
    fn default() -> Self {
        Tests {
            next_id: 0,
            slot: [TestSlot::EMPTY; TESTS],
        }
    }
}

// SAFETY: plain data (no pointers), shared across processes under the LWLock.
unsafe impl PGRXSharedMemory for Tests {}

// SAFETY: the name is unique to pg_tide.
static TESTS_ASKED: PgLwLock<Tests> = unsafe { PgLwLock::new(c"pg_tide_channel_tests") };

/// Copies `value` into `buf`, cut at a character boundary; its length.
fn put(buf: &mut [u8], value: &str) -> u16 {
    let mut end = value.len().min(buf.len());
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    buf[..end].copy_from_slice(&value.as_bytes()[..end]);
    u16::try_from(end).unwrap_or(0)
}

fn text_of(buf: &[u8], len: u16) -> String {
    String::from_utf8_lossy(&buf[..usize::from(len).min(buf.len())]).into_owned()
}

/// Requests and sets up the shared state (from `_PG_init` while preloading).
#[allow(unexpected_cfgs)]
pub fn init_shared() {
    pgrx::pg_shmem_init!(WATCH);
    pgrx::pg_shmem_init!(TESTS_ASKED);
}

/// How long `tide.test_channel` waits for the delivery worker's answer: its send timeout and a
/// round of the worker's.
const TEST_WAIT: Duration = Duration::from_secs(20);

/// Sends a test message to one of the caller's channels through pg_tide's delivery worker, as an
/// alert would go, and says what the receiver answered: `delivered`, `failed` (worth trying
/// again: no answer, a 5xx, a timeout) or `refused` (a 4xx, a bad address), how long the send
/// took, and the error (never with the channel's secrets). Nothing is recorded.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, schema = "tide", name = "test_channel")]
#[search_path(pg_catalog, pg_temp)]
fn test_channel(
    channel: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(channel, String),
        name!(status, String),
        name!(took, Option<pgrx::datum::Interval>),
        name!(error, Option<String>),
    ),
> {
    const F: &str = "tide.test_channel";
    let name = crate::base::sqlerr::required(channel, "channel", F);
    // A bad name is refused as tide.create_channel refuses it.
    Spi::run_with_args("SELECT tide._channel($1)", &[name.into()]).or_raise(F);
    let owner = crate::security::caller::caller_name();
    let found = Spi::get_one_with_args::<bool>(
        "SELECT EXISTS (SELECT FROM tide.alert_channel c WHERE c.name = $1 AND c.owner = $2::name)",
        &[name.into(), owner.clone().into()],
    )
    .or_raise(F);
    if found != Some(true) {
        pgrx::pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
            format!("channel \"{name}\" does not exist"),
            F,
        )
        .set_hint("list your channels with: SELECT name, kind, alerts FROM tide.alert_channel")
        .report(PgLogLevel::ERROR);
    }
    // SAFETY: the current database's name.
    let here = unsafe {
        std::ffi::CStr::from_ptr(pg_sys::get_database_name(pg_sys::MyDatabaseId))
            .to_string_lossy()
            .into_owned()
    };
    if here != settings::database() {
        pgrx::pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "no delivery worker serves database \"{here}\": it serves \"{}\" (pg_tide.database)",
                settings::database()
            ),
            F,
        )
        .set_hint("test the channels of the database pg_tide serves, where alerts are delivered")
        .report(PgLogLevel::ERROR);
    }
    // One test of a role's channels at a time, and TESTS in all: the delivery worker sends
    // them one per round, between its deliveries, so no role's tests hold up everyone's alerts.
    let asked = {
        let now = now_ms();
        let mut tests = TESTS_ASKED.exclusive();
        if tests
            .slot
            .iter()
            .any(|s| !s.free(now) && text_of(&s.owner, s.owner_len) == owner)
        {
            Err(format!(
                "a test of one of {owner}'s channels is under way already"
            ))
        } else {
            tests.next_id += 1;
            let id = tests.next_id;
            match tests.slot.iter().position(|s| s.free(now)) {
                Some(i) => {
                    let slot = &mut tests.slot[i];
                    *slot = TestSlot::EMPTY;
                    slot.state = ASKED;
                    slot.id = id;
                    slot.asked_at = now;
                    slot.requester = crate::scheduler::wake::procno();
                    slot.owner_len = put(&mut slot.owner, &owner);
                    slot.name_len = put(&mut slot.name, name);
                    Ok((i, id))
                }
                None => Err(format!("{TESTS} channel tests are under way already")),
            }
        }
    };
    let (index, id) = match asked {
        Ok(asked) => asked,
        Err(message) => {
            pgrx::pg_sys::panic::ErrorReport::new(
                PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
                message,
                F,
            )
            .set_hint("try again when it has answered (within 20 seconds)")
            .report(PgLogLevel::ERROR);
            unreachable!()
        }
    };
    crate::scheduler::wake::wake_delivery();
    let deadline = Instant::now() + TEST_WAIT;
    let answer = loop {
        {
            let mut tests = TESTS_ASKED.exclusive();
            let slot = &mut tests.slot[index];
            if slot.id == id && slot.state == ANSWERED {
                let answer = (
                    text_of(&slot.status, slot.status_len),
                    slot.took_ms,
                    Some(text_of(&slot.error, slot.error_len)).filter(|e| !e.is_empty()),
                );
                slot.state = FREE;
                break Some(answer);
            }
            if Instant::now() >= deadline {
                if slot.id == id {
                    slot.state = FREE;
                }
                break None;
            }
        }
        // SAFETY: waits on this backend's latch (set by the delivery worker when it answers),
        // at most 100 ms, ending the backend if the postmaster dies.
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                100,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
        }
        pgrx::check_for_interrupts!();
    };
    let row = match answer {
        Some((status, took_ms, error)) => (
            name.to_string(),
            status,
            pgrx::datum::Interval::new(0, 0, took_ms.saturating_mul(1000)).ok(),
            error,
        ),
        None => (
            name.to_string(),
            "no answer".to_string(),
            None,
            Some(format!(
                "the delivery worker did not answer within {} s: is it running? (SELECT delivery_alive FROM tide.self_health)",
                TEST_WAIT.as_secs()
            )),
        ),
    };
    TableIterator::once(row)
}

/// The delivery worker sends one test message asked for (the oldest): its channel read as its
/// owner's, a test alert sent to it as an alert would go, the receiver's answer written back.
/// One per round, so that deliveries go between them; with more asked, the next round comes at
/// once.
fn serve_tests() {
    let asked = {
        let mut tests = TESTS_ASKED.exclusive();
        let oldest = (0..TESTS)
            .filter(|&i| tests.slot[i].state == ASKED)
            .min_by_key(|&i| tests.slot[i].id);
        oldest.map(|i| {
            let slot = &mut tests.slot[i];
            slot.state = SENDING;
            (
                i,
                slot.id,
                text_of(&slot.owner, slot.owner_len),
                text_of(&slot.name, slot.name_len),
            )
        })
    };
    let Some((index, id, owner, name)) = asked else {
        return;
    };
    let channel = bgw::in_transaction("channel test", || {
        Spi::connect(|client| {
            client
                .select(
                    "SELECT c.kind, c.config FROM tide.alert_channel c WHERE c.owner = $1::name AND c.name = $2",
                    None,
                    &[owner.clone().into(), name.clone().into()],
                )
                .or_raise(F)
                .next()
                .map(|row| {
                    (
                        row.get::<String>(1).or_raise(F).unwrap_or_default(),
                        row.get::<JsonB>(2).or_raise(F).map(|j| j.0).unwrap_or(Value::Null),
                    )
                })
        })
    });
    let started = Instant::now();
    let outcome = match channel {
        Ok(Some((kind, config))) => {
            let job = Job {
                effect_id: 0,
                token: 0,
                kind,
                config,
                payload: json!({
                    "event": "test",
                    "subject_type": "channel",
                    "subject": name,
                    "kind": "test",
                    "severity": "info",
                    "details": {"message": format!(
                        "a test of channel {name} of {owner}, sent with tide.test_channel: alerts of this channel arrive like this"),
                        "database": settings::database()},
                }),
                delivery_id: format!("test:{id}"),
            };
            send(&job)
        }
        Ok(None) => Outcome::Permanent("the channel was dropped".to_string()),
        Err(e) => Outcome::Retry(e),
    };
    let took_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    let (status, error) = match outcome {
        Outcome::Delivered => ("delivered", String::new()),
        Outcome::Retry(e) => ("failed", e),
        Outcome::Permanent(e) => ("refused", e),
    };
    let requester = {
        let mut tests = TESTS_ASKED.exclusive();
        let slot = &mut tests.slot[index];
        if slot.id != id || slot.state != SENDING {
            None // the asker gave up meanwhile
        } else {
            slot.status_len = put(&mut slot.status, status);
            slot.took_ms = took_ms;
            slot.error_len = put(&mut slot.error, &error);
            slot.state = ANSWERED;
            Some(slot.requester)
        }
    };
    if let Some(requester) = requester {
        crate::scheduler::wake::set_latch(requester);
    }
    if TESTS_ASKED.share().slot.iter().any(|s| s.state == ASKED) {
        crate::scheduler::wake::set_latch(crate::scheduler::wake::procno());
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The scheduler starts a tick.
pub fn tick_started() {
    WATCH.exclusive().tick_started = now_ms();
}

/// The scheduler's tick committed, or failed with `error`.
pub fn tick_ended(error: Option<&str>) {
    let mut w = WATCH.exclusive();
    match error {
        None => w.tick_ok = now_ms(),
        Some(e) => {
            w.tick_error_at = now_ms();
            w.tick_errors += 1;
            let bytes = e.as_bytes();
            let mut n = bytes.len().min(ERROR_LEN - 1);
            while n > 0 && !e.is_char_boundary(n) {
                n -= 1;
            }
            w.error = [0; ERROR_LEN];
            w.error[..n].copy_from_slice(&bytes[..n]);
        }
    }
}

/// The scheduler is alive but does not tick by choice.
pub fn scheduler_idle() {
    WATCH.exclusive().idle = now_ms();
}

fn ms(v: i64) -> Value {
    if v == 0 {
        Value::Null
    } else {
        json!(v)
    }
}

impl Watch {
    fn error_text(&self) -> String {
        let len = self.error.iter().position(|b| *b == 0).unwrap_or(ERROR_LEN);
        String::from_utf8_lossy(&self.error[..len]).into_owned()
    }

    /// The last instant the scheduler was known well (epoch ms): a successful tick, an idle
    /// round by choice, or the server's start. What `scheduler_down`, the ping and
    /// `tide.self_health` compare with `pg_tide.alert_stalled_after`.
    fn alive_at(&self) -> i64 {
        // SAFETY: PgStartTime is set once by the postmaster (microseconds since 2000-01-01).
        let started = unsafe { pg_sys::PgStartTime } / 1000 + 946_684_800_000;
        self.tick_ok.max(self.idle).max(started)
    }

    /// The latest tick failed (no success or idle round since).
    fn failing(&self) -> bool {
        self.tick_error_at > self.tick_ok.max(self.idle)
    }
}

/// What the workers noted in shared memory, as epoch milliseconds (NULL: not since the server
/// started), with the scheduler's verdict (`alive_at`, `failing`) that the ping uses too.
#[pg_extern(stable, parallel_restricted, schema = "tide", name = "_watch")]
fn watch() -> JsonB {
    let w = *WATCH.share();
    let error = w.error_text();
    JsonB(json!({
        "database": settings::database(),
        "tick_started": ms(w.tick_started),
        "tick_ok": ms(w.tick_ok),
        "tick_error_at": ms(w.tick_error_at),
        "tick_errors": w.tick_errors,
        "tick_error": if error.is_empty() { Value::Null } else { json!(error) },
        "idle": ms(w.idle),
        "alive_at": w.alive_at(),
        "failing": w.failing(),
        "delivery_round": ms(w.delivery_round),
        "ping_at": ms(w.ping_at),
        "ping_status": if w.ping_at == 0 { Value::Null } else { json!(w.ping_status) },
        "ping_configured": settings::ping_url().is_some(),
    }))
}

/// Refuses CREATE EXTENSION in a database no scheduler serves (called from the install script;
/// without pg_tide in shared_preload_libraries, `_PG_init` refuses already).
#[pg_extern(volatile, schema = "tide", name = "_install_check")]
fn install_check() {
    use pgrx::pg_sys::panic::ErrorReport;
    use pgrx::PgLogLevel;
    // SAFETY: the current database's name, valid for the backend's life.
    let here = unsafe {
        let name = pg_sys::get_database_name(pg_sys::MyDatabaseId);
        std::ffi::CStr::from_ptr(name)
            .to_string_lossy()
            .into_owned()
    };
    if here != settings::database() && !settings::ALLOW_UNSCHEDULED.get() {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "pg_tide can only be created in database \"{}\" (pg_tide.database), not in \"{here}\"",
                settings::database()
            ),
            "CREATE EXTENSION pg_tide",
        )
        .set_detail("pg_tide's scheduler and workers serve the one database named by pg_tide.database.")
        .set_hint(format!(
            "connect to database \"{}\" and create it there, or set pg_tide.database = '{here}' in postgresql.conf and restart PostgreSQL",
            settings::database()
        ))
        .report(PgLogLevel::ERROR);
    }
}

/// One alert event to send.
struct Job {
    effect_id: i64,
    token: i64,
    kind: String,
    config: Value,
    payload: Value,
    delivery_id: String,
}

fn claim() -> Vec<Job> {
    Spi::connect_mut(|client| {
        let rows = client
            .update(
                "SELECT effect_id, lease_token, kind, config, payload, dedupe_key FROM tide._delivery_claim($1)",
                None,
                &[BATCH.into()],
            )
            .or_raise(F);
        rows.filter_map(|row| {
            Some(Job {
                effect_id: row.get::<i64>(1).or_raise(F)?,
                token: row.get::<i64>(2).or_raise(F)?,
                kind: row.get::<String>(3).or_raise(F)?,
                config: row.get::<JsonB>(4).or_raise(F)?.0,
                payload: row.get::<JsonB>(5).or_raise(F)?.0,
                delivery_id: row.get::<String>(6).or_raise(F)?,
            })
        })
        .collect()
    })
}

fn send(job: &Job) -> Outcome {
    match job.kind.as_str() {
        "webhook" => {
            notify::send_webhook(&job.config, &job.payload, &job.delivery_id, SEND_TIMEOUT)
        }
        "email" => notify::send_email(&job.config, &job.payload, &job.delivery_id, SEND_TIMEOUT),
        other => Outcome::Permanent(format!("unknown channel kind {other}")),
    }
}

/// Claims a batch (committed), sends it with no transaction open, records the outcomes.
/// Returns how many were claimed.
fn deliver_batch() -> usize {
    let jobs = bgw::in_transaction("delivery claim", claim).unwrap_or_default();
    let mut outcomes = Vec::with_capacity(jobs.len());
    for job in &jobs {
        // A pending SIGTERM ends the worker here: what it holds is taken back at its restart.
        pgrx::check_for_interrupts!();
        outcomes.push(send(job));
    }
    bgw::in_transaction("delivery outcome", || {
        for (job, outcome) in jobs.iter().zip(&outcomes) {
            let (error, permanent) = match outcome {
                Outcome::Delivered => (None, false),
                Outcome::Retry(e) => (Some(e.clone()), false),
                Outcome::Permanent(e) => (Some(e.clone()), true),
            };
            Spi::run_with_args(
                "SELECT tide._delivery_done($1, $2, $3, $4)",
                &[
                    job.effect_id.into(),
                    job.token.into(),
                    error.into(),
                    permanent.into(),
                ],
            )
            .or_raise(F);
        }
    })
    .ok();
    jobs.len()
}

/// Whether the scheduler ticks as it should, and what to tell the ping URL.
fn scheduler_ok() -> (bool, String) {
    let w = *WATCH.share();
    let bound = i64::from(settings::ALERT_STALLED.get()) * 1000;
    let since = now_ms() - w.alive_at();
    if w.failing() {
        (false, format!("pg_tide: ticks fail: {}", w.error_text()))
    } else if since > bound {
        (
            false,
            format!("pg_tide: no successful tick for {} s", since / 1000),
        )
    } else {
        (true, format!("pg_tide: last tick {since} ms ago"))
    }
}

fn maybe_ping(last: &mut Option<Instant>) {
    let Some(url) = settings::ping_url() else {
        return;
    };
    let every = Duration::from_secs(u64::try_from(settings::PING_INTERVAL.get()).unwrap_or(60));
    if last.is_some_and(|t| t.elapsed() < every) {
        return;
    }
    *last = Some(Instant::now());
    let (ok, body) = scheduler_ok();
    let fail_url = settings::ping_fail_url();
    let status = match notify::ping(&url, fail_url.as_deref(), ok, &body, SEND_TIMEOUT) {
        Ok(status) => i32::from(status),
        Err(e) => {
            warning!("pg_tide: ping failed: {e}");
            -1
        }
    };
    let mut w = WATCH.exclusive();
    w.ping_at = now_ms();
    w.ping_status = status;
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_tide_delivery_main(_arg: pg_sys::Datum) {
    bgw::start(F);
    // Woken by tide.test_channel.
    crate::scheduler::wake::register(crate::scheduler::wake::DELIVERY);
    let mut recovered = false;
    let mut last_ping: Option<Instant> = None;
    let mut last_watch: Option<Instant> = None;
    while bgw::wait(bgw::interval()) {
        WATCH.exclusive().delivery_round = now_ms();
        // The ping needs no database: it goes on whatever the state of the scheduler.
        maybe_ping(&mut last_ping);
        if !bgw::may_work() {
            continue;
        }
        if !recovered {
            // What an earlier life of this worker held when it died is sent again now (at
            // least once), rather than when its lease expires.
            recovered = bgw::in_transaction("delivery recovery", || {
                Spi::run("SELECT tide._delivery_recover()").or_raise(F)
            })
            .is_ok();
        }
        serve_tests();
        while deliver_batch() > 0 {}
        let every = Duration::from_millis(
            u64::try_from(settings::MONITOR_INTERVAL.get()).unwrap_or(10_000),
        );
        if last_watch.is_none_or(|t| t.elapsed() >= every) {
            last_watch = Some(Instant::now());
            bgw::in_transaction("watchdog", || {
                Spi::run("SELECT tide._evaluate_alerts(pg_catalog.clock_timestamp(), true)")
                    .or_raise(F)
            })
            .ok();
        }
    }
    bgw::exit_for_restart();
}

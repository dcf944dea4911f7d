//! The background workers: one scheduler, `pg_tide.executors` executors (the delivery worker is
//! in src/alerts/delivery.rs, the notifier in src/scheduler/wake.rs).
//!
//! Both are thin loops: wait on the latch, open a short transaction, call one SQL function,
//! record errors, loop. All logic lives in SQL-callable functions (`tide.tick`, `tide._claim`,
//! `tide._execute`, `tide._check_ready`) that tests call directly. The workers run as the
//! bootstrap superuser; user code runs only inside `tide._execute` and `tide._check_ready`,
//! sealed as its owner (`sealed.rs`).
//!
//! What every worker does (attach, transactions, waits, exits) is in src/bgw.rs.
//!
//! Restart policy: registered with a restart time. SIGTERM (`pg_terminate_backend`, or a
//! shutdown) is handled by PostgreSQL's own `die`: at the next interrupt check — also inside a
//! running command, so a fast shutdown never waits for a long one — the worker ends with FATAL,
//! exit code 1, which the postmaster restarts after that time. Exit code 0 would unregister the
//! worker for good. During shutdown nothing is restarted anyway; a command cut short leaves its
//! run to be taken back when its lease expires.

pub(crate) mod command;

// The executor's run of a task's command, and the command workers' side (after the end of an
// attempt, src/runs/complete.sql).
::pgrx::extension_sql_file!("execute.sql", name = "execute", requires = ["complete"]);
// How long a worker may sleep (after the tick's steps, src/scheduler/tick.sql).
::pgrx::extension_sql_file!("wake.sql", name = "worker_sleep", requires = ["tick_steps"]);

use std::time::Duration;

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime};
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::base::sqlerr::OrRaise;
use crate::bgw::{exit_for_restart, in_transaction, interval, isolated, may_work, start, wait};
use crate::settings;

/// Where worker errors are reported from.
const F: &str = "pg_tide worker";

const RESTART: Duration = Duration::from_secs(1);

/// Registers the workers; called from `_PG_init` while shared_preload_libraries loads.
pub fn register() {
    // pg_upgrade starts the old and the new server in binary-upgrade mode (`postgres -b`) while
    // it reads their control data, dumps the schema and moves the files: a worker that wrote
    // then (a tick, a claim's row locks) would change the old cluster behind pg_upgrade's back
    // (seen: row locks whose MultiXactIds the new cluster then does not know). No pg_tide
    // worker starts in that mode; the upgraded server starts them as usual.
    // SAFETY: the postmaster sets the flag from its command line before it loads
    // shared_preload_libraries.
    if unsafe { pg_sys::IsBinaryUpgrade } {
        pgrx::log!("pg_tide: binary-upgrade mode (pg_upgrade): no pg_tide worker starts");
        return;
    }
    load(
        "pg_tide scheduler",
        "pg_tide scheduler",
        "pg_tide_scheduler_main",
        None,
    );
    for i in 1..=settings::EXECUTORS.get() {
        let name = format!("pg_tide executor {i}");
        load(&name, "pg_tide executor", "pg_tide_executor_main", Some(i));
    }
    load(
        "pg_tide notifier",
        "pg_tide notifier",
        "pg_tide_notifier_main",
        None,
    );
    load(
        "pg_tide delivery",
        "pg_tide delivery",
        "pg_tide_delivery_main",
        None,
    );
}

/// Registers one worker of pg_tide's library: with SPI, started once recovery is over, and
/// started again RESTART after it ends.
fn load(name: &str, kind: &str, function: &str, argument: Option<i32>) {
    BackgroundWorkerBuilder::new(name)
        .set_type(kind)
        .set_library("pg_tide")
        .set_function(function)
        .set_argument(argument.map(pg_sys::Datum::from))
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(RESTART))
        .load();
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_tide_scheduler_main(_arg: pg_sys::Datum) {
    start("pg_tide scheduler");
    crate::scheduler::wake::register(0);
    // Due tasks are fired role by role (src/scheduler/tick.rs, TURN).
    crate::scheduler::tick::TURN.with_borrow_mut(|t| *t = Some(Vec::new()));
    // It sleeps until the next fire or due retry (at most pg_tide.tick_interval), and is woken
    // early when a task's schedule changes (src/scheduler/wake.rs).
    let mut next = interval();
    let mut last_steps = std::time::Instant::now();
    while wait(next) {
        next = interval();
        if !may_work() {
            crate::alerts::delivery::scheduler_idle();
            continue;
        }
        // The outcomes of command workers, should every executor be busy (src/workers/command.rs).
        crate::workers::command::collect();
        // A failed tick is logged by in_transaction; the next one tries again. Its start and
        // outcome are noted in shared memory (src/alerts/delivery.rs watches them).
        crate::alerts::delivery::tick_started();
        // The tick, in several transactions: each due task fired in its own (its runs committed
        // and the executors woken at once, while the next task is fired), or the tasks of a
        // fire close ahead fired together and committed at its instant (fire_ahead); then the
        // steps on existing runs and monitoring. (tide.tick does all of it in one.)
        let mut failed = None;
        let mut ahead = false;
        for _ in 0..crate::scheduler::tick::TASKS_PER_TICK {
            let fired = in_transaction("tick", || match fire_ahead() {
                Some(n) => (n, true),
                None => (fire_now(), false),
            });
            match fired {
                Ok((_, true)) => {
                    ahead = true;
                    break;
                }
                Ok((1, false)) => {}
                Ok(_) => break,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // Right after a fire made ahead, its runs start on the executors: the steps (tens of
        // milliseconds of monitoring with many tasks) wait for the next round, STEPS_AFTER_FIRE
        // later, unless they have not run for a poll interval.
        let mut outcome = Ok(());
        if !ahead || last_steps.elapsed() >= interval() {
            outcome = in_transaction("tick", || {
                let counts =
                    Spi::get_one::<pgrx::JsonB>("SELECT tide._tick_steps(now())").or_raise(F);
                debug1!("pg_tide tick: {:?}", counts.map(|j| j.0));
            });
            last_steps = std::time::Instant::now();
        }
        crate::alerts::delivery::tick_ended(failed.or(outcome.err()).as_deref());
        // When to tick next: the next fire or due retry, woken FIRE_AHEAD before it so that its
        // runs are made ahead (fire_ahead).
        next = sleep_until_due("tide._next_wake", next)
            .saturating_sub(FIRE_AHEAD)
            .max(Duration::from_millis(1));
        if ahead {
            next = next.min(STEPS_AFTER_FIRE);
        }
    }
    exit_for_restart();
}

/// How long before a fire instant the scheduler makes its runs (fire_ahead).
const FIRE_AHEAD: Duration = Duration::from_millis(100);

/// How long after a fire made ahead the scheduler runs the tick's steps.
const STEPS_AFTER_FIRE: Duration = Duration::from_millis(50);

/// Fires one due task as of now (in the caller's transaction); the number of tasks fired.
fn fire_now() -> u64 {
    fired_tasks(Spi::get_one::<pgrx::JsonB>("SELECT tide._fire(now(), 1)").or_raise(F))
}

fn fired_tasks(counts: Option<pgrx::JsonB>) -> u64 {
    counts
        .and_then(|j| j.0.get("tasks").and_then(serde_json::Value::as_u64))
        .unwrap_or(0)
}

/// On time to the millisecond: when the next fire is at most FIRE_AHEAD away (and no task is
/// due already), the tasks due at that instant are fired now, as of that instant, in the
/// caller's transaction, which then waits for the instant and commits at it. Their runs become
/// visible, and the executors are woken, at the fire instant itself rather than after each
/// task's firing and commit (about 2 ms each). Nothing sees the runs before their instant; a
/// role that pauses or alters one of these tasks meanwhile waits (at most FIRE_AHEAD) for the
/// task's row, which the firing locks, and its change follows the fire, as it would a moment
/// later. Tasks left when the instant comes are fired by the next rounds, as usual. Returns
/// None when no fire is that close: the caller fires as of now.
fn fire_ahead() -> Option<u64> {
    let lead_ms = i32::try_from(FIRE_AHEAD.as_millis()).unwrap_or(100);
    let at = Spi::get_one_with_args::<pgrx::datum::TimestampWithTimeZone>(
        "SELECT CASE WHEN x.at > clock_timestamp() THEN x.at END
           FROM (SELECT min(t.next_fire_at) AS at FROM tide.task t
                  WHERE NOT t.paused
                    AND t.next_fire_at <= clock_timestamp() + make_interval(secs => $1 / 1000.0)
                    AND (t.tick_retry_at IS NULL OR t.tick_retry_at <= clock_timestamp())) x",
        &[lead_ms.into()],
    )
    .or_raise(F)?;
    let mut fired = 0;
    while us_until(at) > 0 {
        let n = fired_tasks(
            Spi::get_one_with_args::<pgrx::JsonB>("SELECT tide._fire($1, 1)", &[at.into()])
                .or_raise(F),
        );
        if n == 0 {
            break;
        }
        fired += n;
    }
    // Until the instant. The latch waits in whole milliseconds and wakes a little late, so it
    // is left a millisecond or more short of the instant, and the rest is slept to the
    // microsecond: the commit comes at the instant, where waiting to the next whole millisecond
    // made it 0.7-0.9 ms late (measured), and never before it. An interrupt (SIGTERM) ends the
    // worker here, its transaction rolled back; a latch set meanwhile (a wake-up) only shortens
    // one wait.
    loop {
        let left = us_until(at);
        if left <= 0 {
            break;
        }
        if left > 2000 {
            let ms = u64::try_from((left - 1000) / 1000).unwrap_or(1);
            if !BackgroundWorker::wait_latch(Some(Duration::from_millis(ms))) {
                exit_for_restart();
            }
        } else {
            // SAFETY: a plain sleep of under 2 ms; a signal may cut it short, and the loop then
            // sleeps the rest.
            unsafe { pg_sys::pg_usleep(left) };
        }
        pgrx::check_for_interrupts!();
    }
    Some(fired)
}

/// Microseconds from the clock to `at` (0 or less: reached).
fn us_until(at: pgrx::datum::TimestampWithTimeZone) -> i64 {
    // SAFETY: reads the clock (microseconds since 2000, as TimestampTz is).
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    pg_sys::TimestampTz::from(at) - now
}

/// How long a worker may sleep, at most `cap`: what `function` (ms, given the cap) says, asked
/// in a transaction of its own; whatever goes wrong there leaves the cap (the poll interval),
/// never work undone.
fn sleep_until_due(function: &str, cap: Duration) -> Duration {
    let cap_ms = i32::try_from(cap.as_millis()).unwrap_or(i32::MAX);
    let wake = in_transaction("next wake", || {
        Spi::get_one_with_args::<i32>(&format!("SELECT {function}($1)"), &[cap_ms.into()])
            .or_raise(F)
    });
    match wake {
        Ok(Some(ms)) => Duration::from_millis(u64::try_from(ms.max(1)).unwrap_or(1)),
        _ => cap,
    }
}

/// How often a busy executor looks for readiness checks and backfill work between runs.
const SIDE_WORK_EVERY: Duration = Duration::from_millis(100);

/// One claimed SQL run.
struct Claimed {
    run_id: i64,
    token: i64,
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_tide_executor_main(arg: pg_sys::Datum) {
    let number = arg.value();
    let name = format!("pg_tide executor {number}");
    start(&name);
    crate::security::sealed::mark_executor();
    // Woken at the commit of a transaction that made an SQL run ready (src/scheduler/wake.rs).
    crate::scheduler::wake::register(number);
    let mut next = interval();
    while wait(next) {
        next = interval();
        if !may_work() {
            continue;
        }
        // Outcomes of commands run by workers of their own are recorded first: their runs are
        // over, and their slots make room for the next.
        crate::workers::command::collect();
        // Work until there is nothing left, then sleep until the next due instant. Both kinds of work
        // are tried each round, so neither starves the other.
        // With two executors or more, the first keeps to online runs: backfills never hold
        // every executor.
        let online_only = number == 1 && settings::EXECUTORS.get() >= 2;
        // Runs first: woken by a fire or an emit, an executor starts the run at once, its
        // readiness checks and backfill work after it. While runs keep coming those are looked
        // for every SIDE_WORK_EVERY rather than after every run (two transactions fewer per
        // run), never between a run and the one claimed with its end; a round that ran nothing
        // looks for them at once, and the loop ends only after a round that looked for
        // everything and found nothing.
        let mut last_side = std::time::Instant::now();
        // A run claimed with the end of the previous one (execute_one), to run next. It is
        // claimed only until the side work is due.
        let mut next_run = None;
        loop {
            let ran = execute_one(
                &name,
                online_only,
                &mut next_run,
                last_side + SIDE_WORK_EVERY,
            );
            if next_run.is_some() || (ran && last_side.elapsed() < SIDE_WORK_EVERY) {
                continue;
            }
            last_side = std::time::Instant::now();
            crate::workers::command::collect();
            let checked = in_transaction("readiness check", check_one).unwrap_or(false);
            // Backfill work (a verify is user code that may take its timeout) is not for the
            // executor kept for online runs.
            let verified =
                !online_only && in_transaction("backfill work", verify_one).unwrap_or(false);
            if !(checked || verified || ran) {
                break;
            }
        }
        // Idle: sleep until the next delayed run or readiness re-check comes due.
        next = sleep_until_due("tide._executor_wake", next);
    }
    exit_for_restart();
}

/// Runs one SQL run: `next` if a claim made with the previous run's end left one there, else
/// one claimed now (committed at once, so the attempt is on record even if the command kills
/// the process), in a second transaction. Before `chain_until`, the transaction that ends the
/// run also claims the next one into `next` (tide._claim_next): one commit, and one disk flush,
/// for both, where a claim committed on its own costs another. The claim is on record before
/// that run's command starts all the same.
fn execute_one(
    worker: &str,
    online_only: bool,
    next: &mut Option<Claimed>,
    chain_until: std::time::Instant,
) -> bool {
    let claimed = next.take().or_else(|| {
        // Inside the transaction, an error (SPI or a row that does not fit) rolls the claim
        // back.
        in_transaction("claim", || {
            claimed_row(
                "SELECT c.run_id, c.lease_token FROM tide._claim('sql', NULL, $1, 1, NULL, $2) c",
                &[worker.into(), online_only.into()],
            )
        })
        .ok()
        .flatten()
    });
    let Some(run) = claimed else {
        return false;
    };
    // One transaction per call; a long task's command is called once per batch, each batch in
    // its own transaction, until it returns no checkpoint (or is paused, cancelled, fenced).
    loop {
        let outcome = in_transaction("run", || {
            let answer = Spi::get_one_with_args::<String>(
                "SELECT tide._execute($1, $2)",
                &[run.run_id.into(), run.token.into()],
            )
            .or_raise(F);
            // The run is over (not a long task's batch, not run by a worker of its own): the
            // next one is claimed in the same transaction, stamped with this instant.
            let over = answer
                .as_deref()
                .is_some_and(|a| a != "top_level" && more_after(a).is_none());
            if over && std::time::Instant::now() < chain_until {
                // SAFETY: sets statement_timestamp(), which the claim's instants use.
                unsafe { pg_sys::SetCurrentStatementStartTimestamp() };
                // In a subtransaction of its own: whatever goes wrong in the claim (a query
                // cancel, say) undoes the claim alone, never the run that just ended.
                *next = isolated(|| {
                    claimed_row(
                        "SELECT c.run_id, c.lease_token FROM tide._claim_next($1, $2, $3) c",
                        &[worker.into(), online_only.into(), run.run_id.into()],
                    )
                })
                .unwrap_or_else(|e| {
                    log!("pg_tide: no claim with the end of run {}: {e}", run.run_id);
                    None
                });
            }
            answer
        });
        debug1!("pg_tide: run {} {:?}", run.run_id, outcome);
        if matches!(outcome.as_ref(), Ok(Some(answer)) if answer == "top_level") {
            // Run by a worker of its own (src/workers/command.rs): started here, then left to it; its
            // outcome is recorded by whoever collects it (this executor's next rounds, another,
            // or the scheduler).
            crate::workers::command::launch(run.run_id, run.token);
            break;
        }
        match outcome {
            Ok(answer) => {
                let Some(delay) = answer.as_deref().and_then(more_after) else {
                    break;
                };
                if !sleep(delay) {
                    exit_for_restart();
                }
            }
            // The run's transaction failed outside the command's own error handling (its
            // bookkeeping could not take a lock, say): the attempt ends now, as lost, rather
            // than when its lease expires.
            Err(message) => {
                // A failure here is logged by in_transaction; the lease still takes the run
                // back then.
                in_transaction("abandon", || {
                    Spi::run_with_args(
                        "SELECT tide._abandon($1, $2, $3)",
                        &[run.run_id.into(), run.token.into(), message.into()],
                    )
                    .or_raise(F)
                })
                .ok();
                break;
            }
        }
    }
    true
}

/// The run a claim statement returned, if any (in the caller's transaction).
fn claimed_row(sql: &str, args: &[pgrx::datum::DatumWithOid<'_>]) -> Option<Claimed> {
    let row = Spi::connect_mut(|client| {
        client
            .update(sql, None, args)
            .or_raise(F)
            .next()
            .map(|row| (row.get::<i64>(1).or_raise(F), row.get::<i64>(2).or_raise(F)))
    });
    match row {
        Some((Some(run_id), Some(token))) => Some(Claimed { run_id, token }),
        _ => None,
    }
}

/// The delay before the next batch of a long task, from `tide._execute`'s answer `more <ms>`.
fn more_after(outcome: &str) -> Option<Duration> {
    let ms = outcome.strip_prefix("more ")?.trim().parse::<u64>().ok()?;
    Some(Duration::from_millis(ms))
}

/// Sleeps `delay` (a pending SIGTERM ends the worker at the next transaction). False means the
/// postmaster died.
fn sleep(delay: Duration) -> bool {
    let until = std::time::Instant::now() + delay;
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return true;
        }
        if !wait(left) {
            return false;
        }
    }
}

/// Verifies the canary or the sample of one backfill that is due, or moves one backfill on;
/// true if it verified or released windows. The verify expression runs sealed as the task's
/// owner, read-only, inside `tide._backfill_work`.
fn verify_one() -> bool {
    Spi::get_one::<bool>("SELECT tide._backfill_work()")
        .or_raise(F)
        .unwrap_or(false)
}

/// Evaluates one due readiness check; true if there was one. The check runs sealed as the
/// task's owner inside `tide._check_ready`.
fn check_one() -> bool {
    let due = Spi::connect_mut(|client| {
        client
            .update("SELECT run_id FROM tide._claim_check()", None, &[])
            .or_raise(F)
            .next()
            .map(|row| row.get::<i64>(1).or_raise(F))
    });
    let Some(Some(run_id)) = due else {
        return false;
    };
    let ready = Spi::get_one_with_args::<bool>("SELECT tide._check_ready($1)", &[run_id.into()])
        .or_raise(F);
    debug1!("pg_tide: readiness of run {run_id}: {ready:?}");
    true
}

/// When this backend process started, as `pg_stat_activity.backend_start` shows it. A run
/// claimed by an executor records the executor's pid and start, so the scheduler sees at once
/// when that process is gone (pids are reused; a pid and its start time are not).
#[pg_extern(stable, parallel_restricted, schema = "tide", name = "_backend_start")]
fn backend_start() -> pgrx::datum::TimestampWithTimeZone {
    // SAFETY: MyStartTimestamp is set once when the process starts.
    let start = unsafe { pg_sys::MyStartTimestamp };
    pgrx::datum::TimestampWithTimeZone::try_from(start)
        .unwrap_or_else(|_| pgrx::datum::TimestampWithTimeZone::negative_infinity())
}

//! The scheduler tick, `tide.tick(now)`: everything the scheduler does, in one transaction.
//!
//! It only creates and moves run records; it never runs user SQL (commands and readiness
//! checks run in the executors). Tests call it with explicit instants to drive time.

use chrono::{DateTime, Duration, Utc};
use pgrx::datum::{Date, Interval, JsonB, TimestampWithTimeZone};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use serde_json::{json, Map, Value};

use crate::base::sqlerr::{required, OrRaise};
use crate::bgw::isolated;
use crate::calendar::misfire::{plan, Decision, Due, Misfire, Planned, Policy, SkipReason};
use crate::calendar::pgtime::{date_to_pg, from_pg, to_pg};
use crate::calendar::pgtime::{micros_of, span_of};
use crate::calendar::{fire_iter, previous_fire, window_for, BizWindow, Schedule, WindowKind};
use crate::tasks::catalog::{rule_text, RULE_COLUMNS};
use crate::tasks::rules::{check_interval, RuleText, TaskRules};

const F: &str = "tide.tick";
/// Tasks handled per tick; more due tasks wait for the next tick (a second later).
pub(crate) const TASKS_PER_TICK: i64 = 500;
/// Windows of one task planned per tick: a long outage is worked off in bounded batches.
const BATCH: usize = 1000;
/// The most fires looked at for one task in one tick.
const MAX_LOOKAHEAD: usize = 100_000;

thread_local! {
    /// The scheduler's turn between roles (src/workers/mod.rs turns it on; `tide.tick` leaves it
    /// off): the owners whose due tasks it fired since every role with a due task last had
    /// one fired. A role with many due tasks (hundreds firing every second) then holds back
    /// another role's next fire by one fire, not by all of its own: the next due task fired
    /// is the earliest of a role not yet served in this turn, and once none is left the turn
    /// starts again.
    pub(crate) static TURN: std::cell::RefCell<Option<Vec<String>>> =
        const { std::cell::RefCell::new(None) };
}

struct DueTask {
    task_id: i64,
    name: String,
    owner: String,
    /// Its owner no longer exists.
    owner_gone: bool,
    rules: RuleText,
    misfire: String,
    threshold: Interval,
    catch_up_max: i32,
    retention: Option<Interval>,
    next_fire_at: TimestampWithTimeZone,
    skip_until: Option<TimestampWithTimeZone>,
    rescan_previous: bool,
}

/// Creates the runs that are due (and records the windows that are skipped), moves retries,
/// takes back expired leases and lost runs, releases ready runs, evaluates alerts. Returns counts
/// of what it did.
///
/// One task cannot stop the others: each task is fired in its own subtransaction, and a task
/// whose firing fails (rules stored by an older version that no longer validate, say) has the
/// error recorded on it (`tick_error`, with an alert) and is tried again a minute later, while
/// the rest of the tick goes on. The steps after firing are isolated from each other in the
/// same way, and no row lock held by a user's open transaction stalls the tick for more than
/// `lock_timeout` (one second here): rows such a transaction holds are skipped until it ends.
///
/// The scheduler itself does the same in several transactions (`tide._fire`, one due task
/// each, then `tide._tick_steps`), so that each task's runs are committed, and the executors
/// woken, as soon as they are made.
#[pg_extern(volatile, schema = "tide")]
#[search_path(pg_catalog, pg_temp)]
fn tick(now: default!(Option<TimestampWithTimeZone>, "now()")) -> JsonB {
    let now_pg = required(now, "now", F);
    let mut out = fire_due(now_pg, TASKS_PER_TICK);
    out.extend(steps(now_pg));
    JsonB(Value::Object(out))
}

/// Fires at most `max_tasks` due tasks (the scheduler: one per transaction); returns the counts
/// of `tide.tick`'s firing (tasks, runs, caught_up, skipped, task_errors).
#[pg_extern(volatile, schema = "tide", name = "_fire")]
#[search_path(pg_catalog, pg_temp)]
fn fire(now: TimestampWithTimeZone, max_tasks: i32) -> JsonB {
    JsonB(Value::Object(fire_due(now, i64::from(max_tasks.max(0)))))
}

/// The steps of `tide.tick` after firing: retries, leases, lost runs, readiness
/// (src/scheduler/tick.sql, over src/runs/); health, alerts and retention (src/monitor/).
#[pg_extern(volatile, schema = "tide", name = "_tick_steps")]
#[search_path(pg_catalog, pg_temp)]
fn tick_steps(now: TimestampWithTimeZone) -> JsonB {
    JsonB(Value::Object(steps(now)))
}

fn fire_due(now_pg: TimestampWithTimeZone, max_tasks: i64) -> Map<String, Value> {
    let now = from_pg(now_pg, "now").or_raise(F);
    let mut counts: Map<String, Value> = Map::new();
    let mut add = |key: &str, n: usize| {
        let v = counts.get(key).and_then(Value::as_u64).unwrap_or(0) + n as u64;
        counts.insert(key.to_string(), json!(v));
    };
    for key in ["tasks", "runs", "caught_up", "skipped", "task_errors"] {
        add(key, 0);
    }
    Spi::run("SELECT pg_catalog.set_config('lock_timeout', '1s', true)").or_raise(F);
    Spi::connect_mut(|client| {
        let served = TURN.with_borrow(Clone::clone);
        let mut due = due_tasks(client, now_pg, max_tasks, served.as_deref().unwrap_or(&[]));
        if due.is_empty() && served.as_ref().is_some_and(|s| !s.is_empty()) {
            // Every role with a due task had its turn: a new turn.
            TURN.with_borrow_mut(|t| *t = Some(Vec::new()));
            due = due_tasks(client, now_pg, max_tasks, &[]);
        }
        for task in due {
            TURN.with_borrow_mut(|t| {
                if let Some(served) = t.as_mut().filter(|s| !s.contains(&task.owner)) {
                    served.push(task.owner.clone());
                }
            });
            if task.owner_gone {
                // Its owner no longer exists (dropped from another database, src/security/share.sql):
                // paused, not fired; the alert owner_gone says why.
                client
                    .update(
                        "UPDATE tide.task SET paused = true, paused_at = $2 WHERE task_id = $1",
                        None,
                        &[task.task_id.into(), now_pg.into()],
                    )
                    .or_raise(F);
                continue;
            }
            add("tasks", 1);
            match isolated(|| fire_task(client, &task, now)) {
                Ok(Ok(done)) => {
                    add("runs", done.runs);
                    add("caught_up", done.caught_up);
                    add("skipped", done.skipped);
                }
                Ok(Err(e)) | Err(e) => {
                    add("task_errors", 1);
                    record_error(client, &task, now_pg, &e);
                }
            }
        }
    });
    counts
}

fn steps(now_pg: TimestampWithTimeZone) -> Map<String, Value> {
    Spi::run("SELECT pg_catalog.set_config('lock_timeout', '1s', true)").or_raise(F);
    let mut out = Map::new();
    for step in ["_tick_runs", "_monitor"] {
        let result = isolated(|| {
            Spi::get_one_with_args::<JsonB>(&format!("SELECT tide.{step}($1)"), &[now_pg.into()])
                .or_raise(F)
                .map(|j| j.0)
        });
        match result {
            Ok(Some(Value::Object(more))) => out.extend(more),
            Ok(_) => {}
            Err(e) => pgrx::warning!("pg_tide: tick step {step} failed: {e}"),
        }
    }
    out
}

/// How long a task whose firing failed waits before the tick tries it again.
const RETRY_BROKEN_TASK: &str = "1 minute";

/// Records why a task could not be fired and when it is tried again; an alert
/// (`schedule_error`) opens at the next evaluation. Each failed try is logged as a WARNING.
fn record_error(client: &mut SpiClient, task: &DueTask, now: TimestampWithTimeZone, error: &str) {
    let message: String = error.chars().take(2000).collect();
    client
        .update(
            &format!(
                "UPDATE tide.task
                    SET tick_error = $2, tick_error_at = $3,
                        tick_retry_at = $3 + interval '{RETRY_BROKEN_TASK}'
                  WHERE task_id = $1"
            ),
            None,
            &[task.task_id.into(), message.clone().into(), now.into()],
        )
        .or_raise(F);
    pgrx::warning!(
        "pg_tide: task \"{}\" cannot be scheduled (tried again in {RETRY_BROKEN_TASK}): {message}",
        task.name
    );
}

/// The due tasks, earliest first, but for those of the owners in `skip` (the scheduler's turn).
fn due_tasks(
    client: &mut SpiClient,
    now: TimestampWithTimeZone,
    limit: i64,
    skip: &[String],
) -> Vec<DueTask> {
    let query = format!(
        "SELECT task_id, name, {RULE_COLUMNS}, misfire::text, misfire_threshold,
                catch_up_max, source_retention, next_fire_at, skip_until, rescan_previous, owner::text,
                NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = owner)
           FROM tide.task
          WHERE NOT paused AND next_fire_at <= $1
            AND (tick_retry_at IS NULL OR tick_retry_at <= $1)
            AND owner <> ALL ($3::name[])
          ORDER BY next_fire_at
          LIMIT $2
            FOR NO KEY UPDATE SKIP LOCKED"
    );
    let rows = client
        .update(
            &query,
            None,
            &[now.into(), limit.into(), skip.to_vec().into()],
        )
        .or_raise(F);
    let mut out = Vec::new();
    for row in rows {
        let text = |i: usize| -> String { row.get::<String>(i).or_raise(F).unwrap_or_default() };
        let (Some(task_id), Some(next_fire_at), Some(threshold)) = (
            row.get::<i64>(1).or_raise(F),
            row.get::<TimestampWithTimeZone>(15).or_raise(F),
            row.get::<Interval>(12).or_raise(F),
        ) else {
            continue;
        };
        out.push(DueTask {
            task_id,
            name: text(2),
            rules: rule_text(&row, 3, F),
            misfire: text(11),
            threshold,
            catch_up_max: row.get::<i32>(13).or_raise(F).unwrap_or(100),
            retention: row.get::<Interval>(14).or_raise(F),
            next_fire_at,
            skip_until: row.get::<TimestampWithTimeZone>(16).or_raise(F),
            rescan_previous: row.get::<bool>(17).or_raise(F).unwrap_or(false),
            owner: text(18),
            owner_gone: row.get::<bool>(19).or_raise(F).unwrap_or(false),
        });
    }
    out
}

#[derive(Default)]
struct Done {
    runs: usize,
    caught_up: usize,
    skipped: usize,
}

/// The windows of consecutive fires, one per window (a period window reached by several
/// fires is kept once, with its first fire).
fn windows(rules: &TaskRules, schedule: &Schedule, fires: &[DateTime<Utc>]) -> Vec<Due> {
    let mut out: Vec<Due> = Vec::with_capacity(fires.len());
    let mut previous = fires
        .first()
        .and_then(|f| previous_fire(schedule, rules.tz, rules.policy, *f));
    for &fire in fires {
        let window = match rules.biz_window {
            WindowKind::Fire => previous.map(|start| BizWindow {
                start,
                end: fire,
                biz_date: crate::calendar::to_local(rules.tz, start).date(),
            }),
            kind => window_for(schedule, rules.tz, rules.policy, kind, fire),
        };
        previous = Some(fire);
        let Some(window) = window else { continue };
        if out.last().is_some_and(|d| d.window.start >= window.start) {
            continue;
        }
        out.push(Due { fire, window });
    }
    out
}

fn fire_task(client: &mut SpiClient, task: &DueTask, now: DateTime<Utc>) -> Result<Done, String> {
    let rules = task.rules.validate().map_err(|e| e.to_string())?;
    // Stored options are checked again against their bounds: the planning arithmetic below
    // relies on them.
    check_interval("misfire_threshold", span_of(&task.threshold), false)
        .map_err(|e| e.to_string())?;
    if let Some(r) = &task.retention {
        check_interval("source_retention", span_of(r), false).map_err(|e| e.to_string())?;
    }
    let schedule = rules.calendar(&task.name).map_err(|e| e.to_string())?;
    let misfire = Misfire::parse(&task.misfire).map_err(|e| e.to_string())?;
    let from = from_pg(task.next_fire_at, "next_fire_at").map_err(|e| e.to_string())?;
    let threshold = Duration::microseconds(micros_of(&task.threshold));
    let catch_up_max = usize::try_from(task.catch_up_max).unwrap_or(0);
    let missed = |f: DateTime<Utc>| now - f > threshold;

    // Fires from next_fire_at (inclusive) up to now; a long outage is cut into batches, looking
    // far enough ahead to know whether this batch is older than the windows a catch-up keeps.
    let cap = BATCH + catch_up_max + 1;
    let mut iter = fire_iter(
        schedule,
        rules.tz,
        rules.policy,
        from - Duration::seconds(1),
    )
    .peekable();
    let mut fires = Vec::new();
    let mut more_after = false;
    while let Some(&f) = iter.peek() {
        if f > now {
            break;
        }
        // A long outage of a frequent schedule is a long walk: it stays cancellable.
        if fires.len() % 1024 == 0 {
            pgrx::check_for_interrupts!();
        }
        fires.push(f);
        iter.next();
        if (fires.len() >= cap && missed(fires[cap - 1])) || fires.len() >= MAX_LOOKAHEAD {
            more_after = true;
            break;
        }
    }
    let (batch, next_fire) = if more_after {
        (&fires[..BATCH], Some(fires[BATCH]))
    } else {
        let next = iter.peek().copied();
        (&fires[..], next)
    };

    let due = windows(&rules, schedule, batch);
    let policy = Policy {
        now,
        threshold,
        misfire,
        catch_up_max,
        retention: task
            .retention
            .as_ref()
            .map(|r| Duration::microseconds(micros_of(r))),
        skip_until: match task.skip_until {
            Some(t) => Some(from_pg(t, "skip_until").map_err(|e| e.to_string())?),
            None => None,
        },
    };
    let mut planned = plan(&due, &policy, more_after);

    // A coalesced span cut over several batches: its earlier windows were recorded as pending
    // coalesced skips; the last batch turns the oldest of them into the run. Only coalescing
    // tasks look (through the small index run_uncovered_idx), so other fires cost no query.
    let pending: Option<i64> = if misfire == Misfire::Coalesce {
        client
            .select(
                "SELECT run_id FROM tide.run
                  WHERE task_id = $1 AND skip_reason = 'coalesced' AND covered_by IS NULL
                  ORDER BY window_start LIMIT 1",
                None,
                &[task.task_id.into()],
            )
            .or_raise(F)
            .next()
            .and_then(|row| row.get::<i64>(1).ok().flatten())
    } else {
        None
    };
    let mut coalesced_end: Option<DateTime<Utc>> = None;
    if pending.is_some() {
        for p in planned.iter_mut() {
            if let Decision::Coalesced { end, .. } = p.decision {
                coalesced_end = Some(end);
                p.decision = Decision::Skip(SkipReason::Coalesced);
            }
        }
    }

    let done = insert_runs(client, task.task_id, &planned, &fires, next_fire)?;
    // Deferred window scan (R11.2): the window before the first one fired now, reopened once if
    // it died not ready or out of transient retries.
    let first_run = planned
        .iter()
        .find(|p| !matches!(p.decision, Decision::Skip(_)));
    if let (true, Some(first)) = (task.rescan_previous, first_run) {
        client
            .update(
                "SELECT tide._rescan_previous($1, $2, $3)",
                None,
                &[
                    task.task_id.into(),
                    to_pg(first.due.window.start).into(),
                    to_pg(first.due.fire).into(),
                ],
            )
            .or_raise(F);
    }

    if !more_after {
        cover_coalesced(client, task.task_id, pending, coalesced_end)?;
    }
    // Fired: a recorded error is over.
    client
        .update(
            "UPDATE tide.task SET next_fire_at = $2, tick_error = NULL, tick_error_at = NULL,
                                  tick_retry_at = NULL
              WHERE task_id = $1",
            None,
            &[task.task_id.into(), next_fire.map(to_pg).into()],
        )
        .or_raise(F);
    Ok(done)
}

/// A task's new runs, handed to the one creator: $1 the task, then one array element per
/// window ($2 fire, $3 and $4 its window, $5 business date, $6 trigger, $7 skip reason, $8
/// reason, $9 the fire after it, a waiting run's readiness deadline when the task has no
/// ready_timeout).
const CREATE_RUNS: &str = "SELECT tide._create_runs(array_agg(ROW(
        t.task_id, u.trigger::tide.run_trigger, t.version,
        CASE WHEN u.skip IS NOT NULL THEN 'skipped' ELSE tide._open_state(tide._task_rules(t)) END,
        u.reason, tide._run_executor(tide._task_rules(t), true), t.queue, t.priority,
        t.args, t.owner, u.fire_at, u.window_start, u.window_end, u.biz_date, NULL,
        u.skip::tide.skip_reason, NULL,
        CASE WHEN u.skip IS NULL AND tide._open_state(tide._task_rules(t)) = 'waiting'
             THEN coalesce(u.fire_at + t.ready_timeout, u.following) END,
        NULL, NULL, NULL, NULL, NULL, NULL)::tide.new_run ORDER BY u.n), false)
   FROM tide.task t,
        unnest($2::timestamptz[], $3::timestamptz[], $4::timestamptz[], $5::date[],
               $6::text[], $7::text[], $8::text[], $9::timestamptz[]) WITH ORDINALITY
          AS u(fire_at, window_start, window_end, biz_date, trigger, skip, reason, following, n)
  WHERE t.task_id = $1";

/// The same runs under 0.2.5's SQL, which has no tide._create_runs: the library of a newer
/// version runs it between its install and `ALTER EXTENSION pg_tide UPDATE`, and the scheduler
/// must go on firing meanwhile. Inserted as 0.2.5 did, then recorded by its
/// tide._record_created. (Remove when 0.2.5 is no longer a version one updates from.)
const CREATE_RUNS_0_2_5: &str = "INSERT INTO tide.run (task_id, trigger, fire_at, window_start,
        window_end, biz_date, version, state, skip_reason, reason, executor, queue, priority,
        args, owner, ready_deadline, finished_at)
 SELECT t.task_id, u.trigger::tide.run_trigger, u.fire_at, u.window_start,
        u.window_end, u.biz_date, t.version,
        CASE WHEN u.skip IS NOT NULL THEN 'skipped' ELSE tide._open_state(tide._task_rules(t)) END,
        u.skip::tide.skip_reason, u.reason,
        tide._run_executor(tide._task_rules(t), true),
        t.queue, t.priority, t.args, t.owner,
        CASE WHEN u.skip IS NULL AND tide._open_state(tide._task_rules(t)) = 'waiting'
             THEN coalesce(u.fire_at + t.ready_timeout, u.following) END,
        CASE WHEN u.skip IS NOT NULL THEN now() END
   FROM tide.task t,
        unnest($2::timestamptz[], $3::timestamptz[], $4::timestamptz[], $5::date[],
               $6::text[], $7::text[], $8::text[], $9::timestamptz[])
          AS u(fire_at, window_start, window_end, biz_date, trigger, skip, reason, following)
  WHERE t.task_id = $1
 ON CONFLICT (task_id, window_start) WHERE window_start IS NOT NULL DO NOTHING
 RETURNING run_id";

/// Whether this database's pg_tide has the one run creator (0.2.6 and later; before `ALTER
/// EXTENSION pg_tide UPDATE` from 0.2.5, not yet).
fn creator_installed(client: &SpiClient) -> bool {
    client
        .select(
            "SELECT pg_catalog.to_regproc('tide._create_runs') IS NOT NULL",
            None,
            &[],
        )
        .and_then(|t| t.first().get_one::<bool>())
        .or_raise(F)
        .unwrap_or(false)
}

fn insert_runs(
    client: &mut SpiClient,
    task_id: i64,
    planned: &[Planned],
    fires: &[DateTime<Utc>],
    next_fire: Option<DateTime<Utc>>,
) -> Result<Done, String> {
    let mut done = Done::default();
    if planned.is_empty() {
        return Ok(done);
    }
    let mut fire_at = Vec::new();
    let mut starts = Vec::new();
    let mut ends = Vec::new();
    let mut dates: Vec<Date> = Vec::new();
    let mut triggers = Vec::new();
    let mut skips: Vec<Option<String>> = Vec::new();
    let mut reasons = Vec::new();
    let mut following: Vec<Option<TimestampWithTimeZone>> = Vec::new();
    for p in planned {
        let w = p.due.window;
        let mut end = w.end;
        let (trigger, skip, reason) = match p.decision {
            Decision::Run => {
                done.runs += 1;
                ("scheduled", None, "scheduled fire".to_string())
            }
            Decision::CatchUp => {
                done.caught_up += 1;
                ("catch_up", None, "catch-up of a missed window".to_string())
            }
            Decision::Coalesced { end: e, windows } => {
                done.caught_up += 1;
                end = e;
                (
                    "catch_up",
                    None,
                    format!("coalesced run over {windows} missed windows"),
                )
            }
            Decision::Skip(reason) => {
                done.skipped += 1;
                (
                    "scheduled",
                    Some(reason.as_str().to_string()),
                    skip_text(reason),
                )
            }
        };
        fire_at.push(to_pg(p.due.fire));
        starts.push(to_pg(w.start));
        ends.push(to_pg(end));
        dates.push(date_to_pg(w.biz_date));
        triggers.push(trigger.to_string());
        skips.push(skip);
        reasons.push(reason);
        // A run waiting for readiness is deferred at the next fire unless ready_timeout says
        // otherwise.
        let next = fires
            .iter()
            .find(|f| **f > p.due.fire)
            .copied()
            .or(next_fire);
        following.push(next.map(to_pg));
    }
    // The runs, by the one creator (tide._create_runs, src/runs/record.sql); a window that has
    // a run already (a rerun by hand made it first) creates nothing.
    let args = [
        task_id.into(),
        fire_at.into(),
        starts.into(),
        ends.into(),
        dates.into(),
        triggers.into(),
        skips.into(),
        reasons.into(),
        following.into(),
    ];
    if creator_installed(client) {
        client.update(CREATE_RUNS, None, &args).or_raise(F);
    } else {
        let created = client.update(CREATE_RUNS_0_2_5, None, &args).or_raise(F);
        let ids: Vec<i64> = created
            .into_iter()
            .filter_map(|row| row.get::<i64>(1).ok().flatten())
            .collect();
        client
            .update("SELECT tide._record_created($1)", None, &[ids.into()])
            .or_raise(F);
    }
    // Skips covered by a coalesced run made in this same batch point to it.
    if let Some(run) = planned
        .iter()
        .find(|p| matches!(p.decision, Decision::Coalesced { .. }))
    {
        client
            .update(
                "UPDATE tide.run s SET covered_by = c.run_id
                   FROM tide.run c
                  WHERE c.task_id = $1 AND c.window_start = $2
                    AND s.task_id = $1 AND s.state = 'skipped' AND s.skip_reason = 'coalesced'
                    AND s.covered_by IS NULL AND s.window_start > $2",
                None,
                &[task_id.into(), to_pg(run.due.window.start).into()],
            )
            .or_raise(F);
    }
    Ok(done)
}

fn skip_text(reason: SkipReason) -> String {
    match reason {
        SkipReason::Paused => "skipped: the task was paused",
        SkipReason::Misfire => "skipped: missed window (misfire policy skip)",
        SkipReason::Superseded => {
            "skipped: missed window superseded by a newer one (misfire policy latest)"
        }
        SkipReason::Coalesced => "skipped: covered by a coalesced run",
        SkipReason::CatchUpLimit => "skipped: more missed windows than catch_up_max",
        SkipReason::BeyondRetention => "skipped: window older than the source's retention",
    }
    .to_string()
}

/// Ends a coalesced span planned over several batches: the oldest pending skip becomes the
/// run covering all of them.
fn cover_coalesced(
    client: &mut SpiClient,
    task_id: i64,
    pending: Option<i64>,
    end: Option<DateTime<Utc>>,
) -> Result<(), String> {
    let Some(run_id) = pending else {
        return Ok(());
    };
    client
        .update(
            "WITH span AS (
                 SELECT count(*) AS n, greatest(max(window_end), $3) AS span_end
                   FROM tide.run
                  WHERE task_id = $1 AND state = 'skipped' AND skip_reason = 'coalesced'
                    AND covered_by IS NULL
             ), promoted AS (
                 UPDATE tide.run r
                    SET state = tide._open_state(v.rules), skip_reason = NULL, finished_at = NULL,
                        trigger = 'catch_up', window_end = span.span_end, updated_at = now(),
                        reason = format('coalesced run over %s missed windows', span.n)
                   FROM span, tide.task_version v
                  WHERE r.run_id = $2 AND v.task_id = r.task_id AND v.version = r.version
                 RETURNING r.run_id
             )
             UPDATE tide.run s SET covered_by = $2
              WHERE s.task_id = $1 AND s.state = 'skipped' AND s.skip_reason = 'coalesced'
                AND s.covered_by IS NULL AND s.run_id <> $2",
            None,
            &[task_id.into(), run_id.into(), end.map(to_pg).into()],
        )
        .or_raise(F);
    Ok(())
}

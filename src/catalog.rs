//! The task catalog: `tide.schedule`, `tide.alter`, `tide.unschedule`, `tide.pause`,
//! `tide.resume`.
//!
//! These functions run with the caller's rights, so row-level security on `tide.task` limits
//! every role to its own tasks. Validation happens in `rules.rs` before anything is written;
//! versioning happens in triggers (`sql/schema.sql`) so no write path can skip it.

use pgrx::datum::{DatumWithOid, JsonB, TimestampWithTimeZone};
use pgrx::prelude::*;

use crate::error::TideError;
use crate::pgtime::{now, to_pg};
use crate::rules::{check_name, RuleChanges, RuleText, TaskRules};
use crate::sqlerr::{raise, required, OrRaise};

/// A task as stored.
pub struct TaskRow {
    pub task_id: i64,
    pub rules: RuleText,
    pub paused: bool,
}

/// Reads a task by name (as the caller, so RLS applies). `lock` takes a row lock for a change.
pub fn load_task(name: &str, lock: bool) -> Result<TaskRow, TideError> {
    let query = format!(
        "SELECT task_id, schedule, command, tz, biz_window::text, queue, args,
                dst_gap::text, dst_overlap::text, paused
           FROM tide.task WHERE name = $1 {}",
        if lock { "FOR UPDATE" } else { "" }
    );
    const F: &str = "load_task";
    // `connect_mut`: a read-only SPI connection refuses the row lock.
    Spi::connect_mut(|client| {
        let table = client.update(&query, Some(1), &[name.into()]).or_raise(F);
        let Some(row) = table.into_iter().next() else {
            return Err(TideError::NoSuchTask(name.to_string()));
        };
        let text = |i: usize| -> String { row.get::<String>(i).or_raise(F).unwrap_or_default() };
        Ok(TaskRow {
            task_id: row.get::<i64>(1).or_raise(F).unwrap_or_default(),
            rules: RuleText {
                schedule: text(2),
                command: row.get::<String>(3).or_raise(F),
                tz: text(4),
                biz_window: text(5),
                queue: text(6),
                args: row
                    .get::<JsonB>(7)
                    .or_raise(F)
                    .map(|j| j.0)
                    .unwrap_or_default(),
                dst_gap: text(8),
                dst_overlap: text(9),
            },
            paused: row.get::<bool>(10).or_raise(F).unwrap_or_default(),
        })
    })
}

fn next_fire_datum(rules: &TaskRules) -> Option<TimestampWithTimeZone> {
    rules.next_fire(now()).map(to_pg)
}

/// The rule columns in the order of `$2..$9` of the write queries below.
fn rule_args(rules: &TaskRules) -> Vec<DatumWithOid<'static>> {
    vec![
        rules.schedule.text().to_string().into(),
        rules.command.clone().into(),
        rules.tz.name().to_string().into(),
        rules.biz_window.as_str().to_string().into(),
        rules.queue.clone().into(),
        JsonB(rules.args.clone()).into(),
        rules.policy.gap.as_str().to_string().into(),
        rules.policy.overlap.as_str().to_string().into(),
    ]
}

/// Creates a task and returns its id. Every option is validated before anything is written;
/// a bad one is refused with SQLSTATE 22023 (23505 for a name that is taken).
#[allow(clippy::too_many_arguments)]
#[pg_extern(volatile)]
fn schedule(
    name: Option<&str>,
    schedule: Option<&str>,
    command: default!(Option<&str>, "NULL"),
    tz: default!(Option<&str>, "'UTC'"),
    biz_window: default!(Option<&str>, "'fire'"),
    queue: default!(Option<&str>, "'default'"),
    args: default!(Option<JsonB>, "'{}'"),
    dst_gap: default!(Option<&str>, "'shift'"),
    dst_overlap: default!(Option<&str>, "'once'"),
) -> i64 {
    const F: &str = "tide.schedule";
    let name = required(name, "name", F);
    check_name(name).or_raise(F);
    let text = RuleText {
        schedule: required(schedule, "schedule", F).to_string(),
        command: command.map(str::to_string),
        tz: required(tz, "tz", F).to_string(),
        biz_window: required(biz_window, "biz_window", F).to_string(),
        queue: required(queue, "queue", F).to_string(),
        args: required(args, "args", F).0,
        dst_gap: required(dst_gap, "dst_gap", F).to_string(),
        dst_overlap: required(dst_overlap, "dst_overlap", F).to_string(),
    };
    let rules = text.validate().or_raise(F);

    let mut args: Vec<DatumWithOid> = vec![name.into()];
    args.extend(rule_args(&rules));
    args.push(next_fire_datum(&rules).into());
    // One statement inserts the task and its version-1 snapshot; a taken name inserts neither.
    let id = Spi::connect_mut(|client| {
        let inserted = client
            .update(
                "WITH task AS (
                     INSERT INTO tide.task (name, schedule, command, tz, biz_window, queue, args,
                                            dst_gap, dst_overlap, next_fire_at)
                     VALUES ($1, $2, $3, $4, $5::tide.biz_window, $6, $7,
                             $8::tide.dst_gap, $9::tide.dst_overlap, $10)
                     ON CONFLICT (name) DO NOTHING
                     RETURNING *
                 ), snapshot AS (
                     INSERT INTO tide.task_version (task_id, version, rules, owner)
                     SELECT t.task_id, t.version, tide.task_rules(t::tide.task), t.owner FROM task t
                 )
                 SELECT task_id FROM task",
                None,
                &args,
            )
            .or_raise(F);
        inserted
            .into_iter()
            .next()
            .map(|row| row.get::<i64>(1).or_raise(F))
    });
    match id {
        Some(Some(id)) => id,
        _ => raise(TideError::DuplicateTask(name.to_string()), F),
    }
}

/// Changes only the options given (NULL leaves one as it is; `command => ''` removes the
/// command) and returns the task's rule version afterwards: one higher if any rule changed.
#[allow(clippy::too_many_arguments)]
#[pg_extern(volatile)]
fn alter(
    name: Option<&str>,
    schedule: default!(Option<&str>, "NULL"),
    command: default!(Option<&str>, "NULL"),
    tz: default!(Option<&str>, "NULL"),
    biz_window: default!(Option<&str>, "NULL"),
    queue: default!(Option<&str>, "NULL"),
    args: default!(Option<JsonB>, "NULL"),
    dst_gap: default!(Option<&str>, "NULL"),
    dst_overlap: default!(Option<&str>, "NULL"),
) -> i32 {
    const F: &str = "tide.alter";
    let name = required(name, "name", F);
    let current = load_task(name, true).or_raise(F);
    let old = current.rules.validate().or_raise(F);
    let text = current.rules.with(RuleChanges {
        schedule: schedule.map(str::to_string),
        command: command.map(str::to_string),
        tz: tz.map(str::to_string),
        biz_window: biz_window.map(str::to_string),
        queue: queue.map(str::to_string),
        args: args.map(|a| a.0),
        dst_gap: dst_gap.map(str::to_string),
        dst_overlap: dst_overlap.map(str::to_string),
    });
    let rules = text.validate().or_raise(F);

    // The next fire moves only when the timing changed, so a no-op alter never skips a fire
    // that is due but not yet processed.
    let timing_changed = old.schedule.text() != rules.schedule.text()
        || old.tz != rules.tz
        || old.policy != rules.policy;
    let mut args: Vec<DatumWithOid> = vec![current.task_id.into()];
    args.extend(rule_args(&rules));
    args.push(timing_changed.into());
    args.push(next_fire_datum(&rules).into());
    Spi::connect_mut(|client| {
        let updated = client
            .update(
                "UPDATE tide.task
                    SET schedule = $2, command = $3, tz = $4, biz_window = $5::tide.biz_window,
                        queue = $6, args = $7, dst_gap = $8::tide.dst_gap,
                        dst_overlap = $9::tide.dst_overlap,
                        next_fire_at = CASE WHEN $10 THEN $11 ELSE next_fire_at END
                  WHERE task_id = $1
                  RETURNING version",
                None,
                &args,
            )
            .or_raise(F);
        updated
            .into_iter()
            .next()
            .and_then(|row| row.get::<i32>(1).or_raise(F))
            .unwrap_or_else(|| raise(TideError::NoSuchTask(name.to_string()), F))
    })
}

/// Deletes a task and its rule versions. Returns true; an unknown name is an error.
#[pg_extern(volatile)]
fn unschedule(name: Option<&str>) -> bool {
    const F: &str = "tide.unschedule";
    let name = required(name, "name", F);
    let deleted = Spi::connect_mut(|client| {
        client
            .update(
                "DELETE FROM tide.task WHERE name = $1 RETURNING task_id",
                None,
                &[name.into()],
            )
            .or_raise(F)
            .len()
    });
    if deleted == 0 {
        raise(TideError::NoSuchTask(name.to_string()), F);
    }
    true
}

/// Stops a task from firing. Not a rule change: no new version. Returns false if it was
/// already paused.
#[pg_extern(volatile)]
fn pause(name: Option<&str>) -> bool {
    const F: &str = "tide.pause";
    let name = required(name, "name", F);
    let task = load_task(name, true).or_raise(F);
    if task.paused {
        return false;
    }
    Spi::run_with_args(
        "UPDATE tide.task SET paused = true, paused_at = now() WHERE task_id = $1",
        &[task.task_id.into()],
    )
    .or_raise(F);
    true
}

/// Lets a paused task fire again, from the next fire after now: the paused time is not caught
/// up. Returns false if it was not paused.
#[pg_extern(volatile)]
fn resume(name: Option<&str>) -> bool {
    const F: &str = "tide.resume";
    let name = required(name, "name", F);
    let task = load_task(name, true).or_raise(F);
    if !task.paused {
        return false;
    }
    let rules = task.rules.validate().or_raise(F);
    Spi::run_with_args(
        "UPDATE tide.task SET paused = false, paused_at = NULL, next_fire_at = $2
          WHERE task_id = $1",
        &[task.task_id.into(), next_fire_datum(&rules).into()],
    )
    .or_raise(F);
    true
}

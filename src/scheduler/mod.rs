//! The scheduler: `tide.tick` (`tick`) creates the runs of due windows and moves every run
//! along; `wake` wakes the workers through shared memory when there is work.

pub(crate) mod tick;
pub(crate) mod wake;

// The tick's work on existing runs: one list of steps (after replay, src/runs/replay.sql).
::pgrx::extension_sql_file!("tick.sql", name = "tick_steps", requires = ["replay"]);

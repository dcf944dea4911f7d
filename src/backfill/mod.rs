//! Backfills: `tide.backfill` plans a task's past windows and releases them in batches through a
//! queue of their own, with a canary, a failure budget and a sample check; pause, resume, cancel.

// A backfill's plan and tide.backfill; then its progress, pause, resume and cancel.
::pgrx::extension_sql_file!(
    "backfill.sql",
    name = "backfill",
    requires = ["queues", "jobs", "long"]
);
::pgrx::extension_sql_file!(
    "progress.sql",
    name = "backfill_progress",
    requires = ["backfill"]
);

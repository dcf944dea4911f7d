//! Backfills: `tide.backfill` plans a task's past windows and releases them in batches through a
//! queue of their own, with a canary, a failure budget and a sample check; pause, resume, cancel.

::pgrx::extension_sql_file!(
    "backfill.sql",
    name = "backfill",
    requires = ["queues", "jobs", "long"]
);

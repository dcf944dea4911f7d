//! One-off and delayed jobs: `tide.enqueue` creates runs of a task with their arguments.

::pgrx::extension_sql_file!("jobs.sql", name = "jobs", requires = ["locks"]);

//! Event tasks: `tide.emit`, `tide.emit_many` and `tide.create_emit_trigger` create the runs of
//! the tasks subscribed to a topic, in the caller's transaction.

::pgrx::extension_sql_file!("events.sql", name = "events", requires = ["locks"]);

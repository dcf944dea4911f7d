//! What gates a run: per-object locks named by a template (`key`), overlap and serial groups
//! (`locks.sql`), checked by every claim for gated runs.

pub mod key;

// Per-object locks, overlap control and serial groups: what a claim checks for gated runs.
::pgrx::extension_sql_file!("locks.sql", name = "locks", requires = ["execution"]);

//! Tasks: what a user defines (`tide.schedule`, `tide.alter`, `tide.unschedule`), checked by
//! the rules before anything is written (`rules`), stored with a version per change
//! (`catalog`). `schema.sql` makes the schema and the tables, types, policies and grants that
//! every other concept's SQL refers to, first.

pub(crate) mod catalog;
pub mod retry;
pub mod rules;
pub(crate) mod timeline;

// Tables, types, RLS policies and grants; the Rust functions refer to them at run time.
::pgrx::extension_sql_file!("schema.sql", name = "schema", bootstrap);

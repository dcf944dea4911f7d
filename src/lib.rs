//! pg_tide: reliable scheduled work inside PostgreSQL.
//!
//! This file is the table of contents. Pure logic (no pgrx) lives in `calendar/` and
//! `error.rs`; the SQL surface lives in the other modules, one concern each.

// Pure logic, unit-tested with plain `cargo test`.
pub mod calendar;
pub mod error;
pub mod rules;

// The SQL surface.
mod catalog;
mod pgtime;
mod sqlerr;
mod timeline;

::pgrx::pg_module_magic!(name, version);

// Tables, types, RLS policies and grants; the Rust functions refer to them at run time.
::pgrx::extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);
// Comments on the generated functions, once they exist.
::pgrx::extension_sql_file!("../sql/comments.sql", name = "comments", finalize);

#[cfg(any(test, feature = "pg_test"))]
mod sql_tests;

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'pg_tide'"]
    }
}

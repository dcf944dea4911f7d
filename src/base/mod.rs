//! Foundations every concept uses: errors with their SQLSTATE and hint (`error`, raised by
//! `sqlerr`), JSON a user passes (`jsonarg`, `jsontext`), and what differs between PostgreSQL
//! 15, 17 and 18 (`pgversion`, the only place that tests a version).

pub mod error;
pub(crate) mod jsonarg;
pub mod jsontext;
pub(crate) mod pgversion;
pub(crate) mod sqlerr;

//! Reconciliation: `tide.reconcile` compares two sides per window, records the differences,
//! compensates each once and alerts; `tide.resolve_diff`.

::pgrx::extension_sql_file!("recon.sql", name = "recon", requires = ["backfill"]);

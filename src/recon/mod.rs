//! Reconciliation: `tide.reconcile` compares two sides per window, records the differences,
//! compensates each once and alerts; `tide.resolve_diff`.

// A reconciliation's definition and tide.reconcile; then its comparison and compensation.
::pgrx::extension_sql_file!(
    "recon.sql",
    name = "recon",
    requires = ["backfill_progress"]
);
::pgrx::extension_sql_file!("compare.sql", name = "recon_compare", requires = ["recon"]);

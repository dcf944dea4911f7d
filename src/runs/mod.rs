//! Runs: the ledger of every run and its history (`ledger.sql`, with the transitions' trigger
//! and its WHEN clauses in `change`), what a worker does with one (`execution.sql`: claim,
//! heartbeat, complete, fail, replay, readiness, the executor's `_execute`), retries and their
//! backoff (`retry`), by-hand runs and reruns (`ledger`), steps inside a run (`steps.sql`) and
//! long runs in batches (`long.sql`).

pub(crate) mod change;
pub(crate) mod ledger;

// The run ledger: runs, attempts, history and the state-transition trigger.
// (Its history rows default their actor to tide._caller(), defined in src/security/caller.rs.)
::pgrx::extension_sql_file!(
    "ledger.sql",
    name = "ledger",
    requires = ["schema", security::caller::caller_sql]
);
// Claiming, completion, failure, replay: PL/pgSQL over the ledger (see the file for why).
::pgrx::extension_sql_file!("execution.sql", name = "execution", requires = ["ledger"]);
// Steps inside a run, skipped by later attempts and reruns once done.
::pgrx::extension_sql_file!("steps.sql", name = "steps", requires = ["execution"]);
// Long runs: the checkpoint, pause_run / resume_run / cancel_run.
::pgrx::extension_sql_file!("long.sql", name = "long", requires = ["execution"]);

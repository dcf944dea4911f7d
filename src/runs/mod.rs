//! Runs: the ledger of every run and its history (`ledger.sql`, with the transitions' trigger
//! and its WHEN clauses in `change`), its two writers (`record.sql`: every run is created and
//! every history row written there), what a run's code can ask (`context.sql`), what a worker
//! does with one (`claim.sql`: claim and heartbeat; `complete.sql`: complete and fail, with
//! retries), readiness (`readiness.sql`), replay, rerun and the dead letters (`replay.sql`),
//! by-hand runs and reruns (`ledger`), steps inside a run (`steps.sql`) and long runs in batches
//! (`long.sql`). The executor's own SQL is in src/workers/, the tick's steps in src/scheduler/.

pub(crate) mod change;
pub(crate) mod ledger;

// The run ledger: runs, attempts, history and the state-transition trigger.
// (Its history rows default their actor to tide._caller(), defined in src/security/caller.rs.)
::pgrx::extension_sql_file!(
    "ledger.sql",
    name = "ledger",
    requires = ["schema", security::caller::caller_sql]
);
// The ledger's two writers: tide._create_runs (the one way a run is created) and
// tide._write_history (the one way a history row is written, with what it counts).
::pgrx::extension_sql_file!("record.sql", name = "record", requires = ["ledger"]);
// What a run's code can ask (tide.run_id, args, window, the errors it may signal).
::pgrx::extension_sql_file!("context.sql", name = "run_context", requires = ["record"]);
// Claims and leases (tide.claim_runs, tide.heartbeat_run); an executor's claims too.
::pgrx::extension_sql_file!("claim.sql", name = "claim", requires = ["run_context"]);
// The end of an attempt: complete_run(s), fail_run, retries.
::pgrx::extension_sql_file!("complete.sql", name = "complete", requires = ["claim"]);
// Readiness checks and tide.mark_ready (after the executor's run, src/workers/execute.sql).
::pgrx::extension_sql_file!("readiness.sql", name = "readiness", requires = ["execute"]);
// Replay, rerun, resolve, confirm; the dead letters.
::pgrx::extension_sql_file!("replay.sql", name = "replay", requires = ["readiness"]);
// Run execution as a whole: what the files above, the executor's (src/workers/execute.sql,
// wake.sql) and the tick's steps (src/scheduler/tick.sql) make, in this order. The concepts
// built on runs require it.
::pgrx::extension_sql!(
    "-- (run execution: src/runs/, src/workers/execute.sql, src/scheduler/tick.sql, src/workers/wake.sql)\n",
    name = "execution",
    requires = [
        "run_context",
        "claim",
        "complete",
        "execute",
        "readiness",
        "replay",
        "tick_steps",
        "worker_sleep"
    ]
);
// Steps inside a run, skipped by later attempts and reruns once done.
::pgrx::extension_sql_file!("steps.sql", name = "steps", requires = ["execution"]);
// Long runs: the checkpoint, pause_run / resume_run / cancel_run.
::pgrx::extension_sql_file!("long.sql", name = "long", requires = ["execution"]);

//! Queues with limits (`queues.sql`: `tide.create_queue`, pause, resume, drop; the claim's
//! admission, the start rate and the retry budget), and the running count of each limited queue
//! in shared memory (`count`).

pub(crate) mod count;

// Queues with limits: tide.create_queue, pause_queue, resume_queue, drop_queue; the claim's
// queue admission and the retry budget.
::pgrx::extension_sql_file!("queues.sql", name = "queues", requires = ["locks"]);

//! The scheduler: `tide.tick` (`tick`) creates the runs of due windows and moves every run
//! along; `wake` wakes the workers through shared memory when there is work.

pub(crate) mod tick;
pub(crate) mod wake;

//! Fair share between roles (src/security/share.sql): the lock under which pg_tide's executors choose
//! whose run to take next.
//!
//! Two executors choosing at once would both see a role's runs occupy no executor and both take
//! one, past its limit. So an executor's choice and claim hold a lock until its transaction
//! commits: the next executor's choice sees the claim. The lock is an advisory lock tag with
//! `objsubid` 4, which the SQL advisory lock functions (1 and 2) cannot name: no role can take
//! it and hold up every executor (the queues' counts use 3, src/queues/count.rs).

use pgrx::pg_sys;
use pgrx::prelude::*;

/// "fair" in ASCII: the tag's third field.
const FAIR: u32 = 0x6661_6972;

/// Takes the executors' choice lock until the end of the transaction; without `wait`, only if
/// it is free at once (false otherwise). A claim made with the end of an executor's previous run
/// does not wait: that transaction may hold what the lock's holder waits for (the room of its
/// run's queue), and the executor claims after its commit anyway.
#[pg_extern(volatile, parallel_unsafe, schema = "tide", name = "_share_lock")]
fn share_lock(wait: bool) -> bool {
    // SAFETY: reads the backend's database id, set at connection.
    let db = unsafe { pg_sys::MyDatabaseId };
    let tag = pg_sys::LOCKTAG {
        locktag_field1: db.to_u32(),
        locktag_field2: 0,
        locktag_field3: FAIR,
        locktag_field4: 4,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    };
    // SAFETY: a valid tag; a transaction-level lock (released at commit or abort); waits,
    // honouring lock_timeout and cancel, or raises; or, without wait, answers at once.
    let got = unsafe {
        pg_sys::LockAcquire(
            &tag,
            pg_sys::ExclusiveLock as pg_sys::LOCKMODE,
            false,
            !wait,
        )
    };
    got != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

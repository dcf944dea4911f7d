//! The WHEN clauses of `tide.run`'s update triggers (src/runs/ledger.sql, src/monitor/health.sql), as C
//! functions.
//!
//! PostgreSQL keeps a trigger's compiled WHEN clause for one statement only: every UPDATE of
//! `tide.run` read each clause again from its stored text (`stringToNode`) and compiled it.
//! Written in SQL, `run_changed`'s was 5,800 characters, and reading it cost about 30 µs of
//! each update of a run (125–145 µs against 160–171 µs for a one-row update); claims,
//! completions and failures update one run at a time, so it was a twentieth of an SQL
//! executor's time per run. As calls of these functions the clauses are a few hundred
//! characters, and each row is decided here, by the same rules.

use std::cell::Cell;
use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::prelude::*;

/// The columns whose change is a change of the run (`tide._run_changed` records it), in the
/// order of `Numbers`.
const COLUMNS: [&CStr; 6] = [
    c"state",
    c"reason",
    c"run_after",
    c"queue",
    c"priority",
    c"executor",
];
const STATE: usize = 0;
/// The columns compared as text (the others are passed by value: enums, int4, timestamptz).
const TEXT: [bool; 6] = [false, true, false, true, false, false];

/// The states the rule names.
const STATES: [&str; 7] = [
    "ready",
    "running",
    "succeeded",
    "need_check",
    "retry",
    "dead",
    "waiting",
];

/// The row type the column numbers were found in, and the numbers (1-based).
type Numbers = (pg_sys::Oid, [i32; 6]);

thread_local! {
    static NUMBERS: Cell<Numbers> = const { Cell::new((pg_sys::Oid::INVALID, [0; 6])) };
}

/// Whether the transaction-local setting `tide.history` is `written`: the hot paths (claims,
/// completions, failures) write their own history rows while it is.
fn history_written() -> bool {
    // SAFETY: reads a setting by name; a missing one is NULL (missing_ok).
    let value = unsafe { pg_sys::GetConfigOption(c"tide.history".as_ptr(), true, false) };
    // SAFETY: a setting's value is a NUL-terminated string that lives at least as long as this
    // call.
    !value.is_null() && unsafe { CStr::from_ptr(value) } == c"written"
}

/// `run_touched_update`'s clause: a statement's changed runs are noted for task health unless
/// the statement's own history rows note them (`tide.history = 'written'`).
#[pg_extern(stable, parallel_safe, schema = "tide", name = "_history_unwritten")]
fn history_unwritten() -> bool {
    !history_written()
}

/// The columns' numbers in the row type of `tupdesc`: looked up by name the first time, and
/// again whenever a name no longer matches (another row type, or a column recreated).
///
/// # Safety
/// `tupdesc` is a valid tuple descriptor.
unsafe fn numbers(typid: pg_sys::Oid, tupdesc: pg_sys::TupleDesc) -> [i32; 6] {
    let natts = (*tupdesc).natts as usize;
    let name_at = |n: i32| -> Option<&CStr> {
        let i = usize::try_from(n).ok()?.checked_sub(1)?;
        let a = (i < natts).then(|| crate::base::pgversion::tuple_desc_attr(tupdesc, i))?;
        (!a.attisdropped).then(|| CStr::from_ptr(a.attname.data.as_ptr()))
    };
    let (seen, nums) = NUMBERS.get();
    if seen == typid
        && nums
            .iter()
            .zip(COLUMNS)
            .all(|(&n, c)| name_at(n) == Some(c))
    {
        return nums;
    }
    let mut found = [0i32; 6];
    for (slot, column) in found.iter_mut().zip(COLUMNS) {
        *slot = (1..=natts as i32)
            .find(|&n| name_at(n) == Some(column))
            .unwrap_or_else(|| {
                error!(
                    "pg_tide: tide.run has no column {}",
                    column.to_string_lossy()
                )
            });
    }
    NUMBERS.set((typid, found));
    found
}

/// One row of `tide.run` passed to the clause (OLD or NEW), its columns of `COLUMNS` read.
struct Row {
    values: [Option<pg_sys::Datum>; 6],
}

impl Row {
    /// The OLD and NEW rows, read with one look-up of their row type.
    ///
    /// # Safety
    /// Both datums are composite datums of `tide.run`'s row type.
    unsafe fn read_pair(old: pg_sys::Datum, new: pg_sys::Datum) -> (Row, Row) {
        let old = pg_sys::pg_detoast_datum(old.cast_mut_ptr()) as pg_sys::HeapTupleHeader;
        let new = pg_sys::pg_detoast_datum(new.cast_mut_ptr()) as pg_sys::HeapTupleHeader;
        let typid = (*old).t_choice.t_datum.datum_typeid;
        let tupdesc = pg_sys::lookup_rowtype_tupdesc(typid, (*old).t_choice.t_datum.datum_typmod);
        let nums = numbers(typid, tupdesc);
        let rows = (
            Row::read(old, tupdesc, &nums),
            Row::read(new, tupdesc, &nums),
        );
        if (*tupdesc).tdrefcount >= 0 {
            pg_sys::DecrTupleDescRefCount(tupdesc);
        }
        rows
    }

    /// # Safety
    /// `header` is a detoasted row described by `tupdesc`, `nums` its columns' numbers.
    unsafe fn read(
        header: pg_sys::HeapTupleHeader,
        tupdesc: pg_sys::TupleDesc,
        nums: &[i32; 6],
    ) -> Row {
        let mut tuple = pg_sys::HeapTupleData {
            t_len: pgrx::heap_tuple_header_get_datum_length(header) as u32,
            t_data: header,
            ..Default::default()
        };
        let mut values = [None; 6];
        for (value, &n) in values.iter_mut().zip(nums.iter()) {
            let mut isnull = false;
            let d = pg_sys::heap_getattr(&mut tuple, n, tupdesc, &mut isnull);
            *value = (!isnull).then_some(d);
        }
        Row { values }
    }

    /// The run's state, when it is one the rule names.
    ///
    /// # Safety
    /// The row was read from a valid tuple in this call.
    unsafe fn state(&self) -> Option<&'static str> {
        let d = self.values[STATE]?;
        let tup = pg_sys::SearchSysCache1(pg_sys::SysCacheIdentifier::ENUMOID as i32, d);
        if tup.is_null() {
            return None;
        }
        let form = ((*tup).t_data as *const u8).add((*(*tup).t_data).t_hoff as usize)
            as *const pg_sys::FormData_pg_enum;
        let label = CStr::from_ptr((*form).enumlabel.data.as_ptr());
        let known = STATES
            .iter()
            .copied()
            .find(|s| s.as_bytes() == label.to_bytes());
        pg_sys::ReleaseSysCache(tup);
        known
    }
}

/// Whether column `i` differs between the rows (`IS DISTINCT FROM`).
///
/// # Safety
/// Both rows were read in this call.
unsafe fn distinct(old: &Row, new: &Row, i: usize) -> bool {
    match (old.values[i], new.values[i]) {
        (None, None) => false,
        (Some(a), Some(b)) if TEXT[i] => {
            // Text with the database's deterministic collation: equal when its bytes are.
            let a = pg_sys::pg_detoast_datum_packed(a.cast_mut_ptr());
            let b = pg_sys::pg_detoast_datum_packed(b.cast_mut_ptr());
            pgrx::varlena::varlena_to_byte_slice(a) != pgrx::varlena::varlena_to_byte_slice(b)
        }
        (Some(a), Some(b)) => a.value() != b.value(),
        _ => true,
    }
}

/// The rule of `run_changed`'s clause: a change of state, reason, `run_after`, queue, priority
/// or executor calls `tide._run_changed`, except the hot paths' own legal changes (ready to
/// running; running to succeeded, need_check, retry, dead or waiting) while
/// `tide.history = 'written'`: those paths write their history rows themselves.
///
/// # Safety
/// Both datums are composite datums of `tide.run`'s row type.
unsafe fn fires(old: pg_sys::Datum, new: pg_sys::Datum) -> bool {
    let (o, n) = Row::read_pair(old, new);
    if !(0..COLUMNS.len()).any(|i| distinct(&o, &n, i)) {
        return false;
    }
    if !history_written() {
        return true;
    }
    let own = match (o.state(), n.state()) {
        (Some("ready"), Some("running")) => true,
        (Some("running"), Some(to)) => {
            matches!(
                to,
                "succeeded" | "need_check" | "retry" | "dead" | "waiting"
            )
        }
        _ => false,
    };
    !own
}

/// `tide._run_change_fires(OLD, NEW)`, declared in src/runs/ledger.sql (its arguments are
/// `tide.run` rows, a type this crate's SQL does not know). STRICT: both are always given.
///
/// # Safety
/// Called by PostgreSQL with two `tide.run` rows.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn pg_tide_run_change_fires(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    let old = pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 0);
    let new = pgrx::fcinfo::pg_getarg_datum_raw(fcinfo, 1);
    pg_sys::Datum::from(fires(old, new))
}

#[no_mangle]
#[doc(hidden)]
pub extern "C" fn pg_finfo_pg_tide_run_change_fires() -> &'static pg_sys::Pg_finfo_record {
    const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1
}

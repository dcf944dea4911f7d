//! `jsonb` as text for Rust functions: pgrx's own `JsonB` parses every value with serde_json
//! and panics (an internal error, XX000) on JSON nested deeper than 128 levels or on a number
//! beyond a double, both of which PostgreSQL accepts. `JsonbText` takes the text PostgreSQL
//! prints (`jsonb_out`) and leaves the checking to `jsontext`, which refuses with a proper
//! SQLSTATE or does not parse at all.

use pgrx::callconv::{Arg, ArgAbi};
use pgrx::nullable::Nullable;
use pgrx::pg_sys;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable,
};
use pgrx::{direct_function_call, FromDatum, IntoDatum};

/// A `jsonb` value as its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonbText(pub String);

impl FromDatum for JsonbText {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _typoid: pg_sys::Oid,
    ) -> Option<JsonbText> {
        if is_null {
            return None;
        }
        // SAFETY: the datum is a jsonb (the SQL signature says so); jsonb_out prints it as a
        // palloc'd C string, copied here and then freed.
        unsafe {
            let printed =
                direct_function_call::<&std::ffi::CStr>(pg_sys::jsonb_out, &[Some(datum)])?;
            let text = printed.to_string_lossy().into_owned();
            pg_sys::pfree(printed.as_ptr() as *mut std::ffi::c_void);
            Some(JsonbText(text))
        }
    }
}

impl IntoDatum for JsonbText {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        let text = std::ffi::CString::new(self.0).ok()?;
        // SAFETY: jsonb_in parses the text (it came from jsonb_out or was checked).
        unsafe {
            pgrx::direct_function_call_as_datum(pg_sys::jsonb_in, &[Some(text.as_ptr().into())])
        }
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

// SAFETY: unboxed through FromDatum, as pgrx's own by-reference types are.
unsafe impl<'fcx> ArgAbi<'fcx> for JsonbText {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        // SAFETY: the argument is a jsonb datum, checked non-null by the caller.
        unsafe { arg.unbox_arg_using_from_datum() }
            .unwrap_or_else(|| panic!("argument {index} must not be null"))
    }

    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> Nullable<Self> {
        // SAFETY: as above; a NULL argument is Null.
        unsafe { arg.unbox_arg_using_from_datum() }.into()
    }
}

// SAFETY: the SQL type is jsonb, which FromDatum/IntoDatum above read and write.
unsafe impl SqlTranslatable for JsonbText {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(JsonbText);
    const TYPE_ORIGIN: pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin =
        pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> =
        Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
}

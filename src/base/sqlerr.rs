//! The SQL boundary for errors: a `TideError` becomes an `ereport(ERROR)` with its SQLSTATE,
//! message and hint. Raising aborts the statement, so nothing it wrote is kept.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

use crate::base::error::{SqlState, TideError};

fn code(state: SqlState) -> PgSqlErrorCode {
    match state {
        SqlState::InvalidParameterValue => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        SqlState::UniqueViolation => PgSqlErrorCode::ERRCODE_UNIQUE_VIOLATION,
        SqlState::UndefinedObject => PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
        SqlState::NullValueNotAllowed => PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
        SqlState::DatetimeFieldOverflow => PgSqlErrorCode::ERRCODE_DATETIME_FIELD_OVERFLOW,
    }
}

/// Reports `err` as an SQL error. Does not return.
pub fn raise(err: TideError, function: &'static str) -> ! {
    ErrorReport::new(code(err.sqlstate()), err.to_string(), function)
        .set_hint(err.hint())
        .report(PgLogLevel::ERROR);
    unreachable!("ereport(ERROR) returned")
}

/// Unwraps a result at the SQL boundary, reporting the error as SQL.
pub trait OrRaise<T> {
    fn or_raise(self, function: &'static str) -> T;
}

impl<T> OrRaise<T> for Result<T, TideError> {
    fn or_raise(self, function: &'static str) -> T {
        self.unwrap_or_else(|e| raise(e, function))
    }
}

/// An SPI failure is pg_tide's own bug (a query that does not fit its tables), never the
/// user's: report it as an internal error rather than panicking.
impl<T> OrRaise<T> for Result<T, pgrx::spi::SpiError> {
    fn or_raise(self, function: &'static str) -> T {
        self.unwrap_or_else(|e| {
            ErrorReport::new(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                format!("pg_tide internal query failed: {e}"),
                function,
            )
            .report(PgLogLevel::ERROR);
            unreachable!("ereport(ERROR) returned")
        })
    }
}

/// A required SQL argument: NULL is refused with 22004 and the parameter named.
pub fn required<T>(value: Option<T>, param: &'static str, function: &'static str) -> T {
    value.unwrap_or_else(|| raise(TideError::NullArgument { param }, function))
}

//! JSON that pg_tide reads in Rust, kept as the text PostgreSQL prints (`jsonb_out`) and checked
//! before anything parses it.
//!
//! PostgreSQL accepts JSON nested as deep as its stack allows and numbers of any size;
//! `serde_json` stops at 128 levels and at numbers beyond a double. A task's `args` are checked
//! here (size, depth, numbers) before they are stored, so a stored task is always readable; an
//! event payload is never parsed at all beyond its top-level fields (`top_level_fields` skips
//! nested values without recursing), so no payload can make a lock key fail.

use std::collections::HashMap;

use serde_json::value::RawValue;

use crate::base::error::{
    shorten, TideError, MAX_JSON_BYTES as MAX_BYTES, MAX_JSON_DEPTH as MAX_DEPTH,
};

/// The nesting depth of JSON text (objects and arrays; 0 for a scalar), counted without parsing,
/// so it is safe on any input. Brackets inside strings do not count.
pub fn depth(text: &str) -> usize {
    let mut deepest = 0;
    let mut level = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                level += 1;
                deepest = deepest.max(level);
            }
            b'}' | b']' => level = level.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Checks a JSON object given as text (a task's args): at most `MAX_BYTES`, at most
/// `MAX_DEPTH` levels, an object, numbers a double can hold.
pub fn check_object(text: &str, param: &'static str) -> Result<(), TideError> {
    let bad = |reason: String| TideError::BadJson { param, reason };
    if text.len() > MAX_BYTES {
        return Err(bad(format!(
            "it is {} bytes long, more than {MAX_BYTES}",
            text.len()
        )));
    }
    let d = depth(text);
    if d > MAX_DEPTH {
        return Err(bad(format!(
            "it is nested {d} levels deep, more than {MAX_DEPTH}"
        )));
    }
    if !text.trim_start().starts_with('{') {
        return Err(TideError::ArgsNotObject(shorten(text)));
    }
    serde_json::from_str::<serde_json::Value>(text)
        .map(|_| ())
        .map_err(|e| bad(e.to_string()))
}

/// The top-level fields of a JSON object as text: a string field unquoted, any other value as
/// its JSON text. Nested values are skipped without recursion, so any depth and any number is
/// fine. `None` when the text is not an object.
pub fn top_level_fields(text: &str) -> Option<HashMap<String, String>> {
    let fields: HashMap<String, &RawValue> = serde_json::from_str(text).ok()?;
    Some(
        fields
            .into_iter()
            .map(|(name, raw)| {
                let raw = raw.get();
                let value = if raw.starts_with('"') {
                    serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.to_string())
                } else {
                    raw.to_string()
                };
                (name, value)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(n: usize) -> String {
        format!("{{\"a\": {}1{}}}", "[".repeat(n), "]".repeat(n))
    }

    #[test]
    fn depth_counts_brackets_outside_strings() {
        assert_eq!(depth("1"), 0);
        assert_eq!(depth("{}"), 1);
        assert_eq!(depth("{\"a\": [1, {\"b\": 2}]}"), 3);
        assert_eq!(depth("{\"a\": \"[[[[\\\"]]\"}"), 1);
        assert_eq!(depth(&nested(500)), 501);
    }

    #[test]
    fn args_are_bounded() {
        assert!(check_object("{\"account\": 42}", "args").is_ok());
        assert!(check_object(&nested(MAX_DEPTH - 1), "args").is_ok());
        let e = check_object(&nested(200), "args").unwrap_err();
        assert_eq!(
            e.to_string(),
            "args is not usable JSON: it is nested 201 levels deep, more than 32"
        );
        let e = check_object("{\"a\": 1e400}", "args").unwrap_err();
        assert!(e.to_string().starts_with("args is not usable JSON:"), "{e}");
        let e = check_object("[1, 2]", "args").unwrap_err();
        assert_eq!(e.to_string(), "args must be a JSON object, got [1, 2]");
        let big = format!("{{\"a\": \"{}\"}}", "x".repeat(MAX_BYTES));
        assert!(check_object(&big, "args")
            .unwrap_err()
            .to_string()
            .contains("bytes long"));
        assert!(!e.hint().is_empty());
    }

    #[test]
    fn fields_of_any_payload() {
        let deep = format!(
            "{{\"a\": \"x\", \"n\": 1e400, \"b\": {}{}}}",
            "[".repeat(5000),
            "]".repeat(5000)
        );
        let f = top_level_fields(&deep).unwrap();
        assert_eq!(f["a"], "x");
        assert_eq!(f["n"], "1e400");
        assert_eq!(top_level_fields("[1]"), None);
        assert_eq!(
            top_level_fields("{\"o\": {\"k\": 1}}").unwrap()["o"],
            "{\"k\": 1}"
        );
    }

    #[test]
    fn messages_quote_a_bounded_part() {
        assert_eq!(shorten("abc"), "abc");
        assert_eq!(shorten(&"x".repeat(1000)).len(), 103);
    }
}

//! Lock key templates: how a task names the business object a run works on, such as
//! `'account:{args.account_id}'`. A template, not SQL, so that computing a run's key never runs
//! user code in whoever creates the run (the scheduler, an emitting transaction).
//!
//! Placeholders: `{args.NAME}` and `{payload.NAME}` (a top-level field of the run's args or
//! its event payload), `{key}` (the event key), `{biz_date}` (YYYY-MM-DD) and `{task}`. A field
//! that is missing renders empty, which can only make more runs share a key: safe, never less
//! exclusion.

use std::collections::HashMap;

use crate::base::error::TideError;

/// The longest template accepted.
pub const MAX_LEN: usize = 200;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Args(String),
    Payload(String),
    Key,
    BizDate,
    Task,
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(Vec<Part>);

/// Top-level fields of a JSON object, as text (see `jsontext::top_level_fields`).
pub type Fields = HashMap<String, String>;

/// What a run's key is computed from.
pub struct RunFacts<'a> {
    pub task: &'a str,
    pub args: Option<&'a Fields>,
    pub payload: Option<&'a Fields>,
    pub key: Option<&'a str>,
    pub biz_date: Option<&'a str>,
}

fn field_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl Template {
    pub fn parse(template: &str) -> Result<Template, TideError> {
        let bad = |reason: &str| TideError::BadLockKey {
            template: template.to_string(),
            reason: reason.to_string(),
        };
        if template.trim().is_empty() {
            return Err(bad("it is empty"));
        }
        crate::base::error::check_len("lock_key", template, MAX_LEN)?;
        let mut parts = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(Part::Text(rest.to_string()));
                    break;
                }
                Some(i) => {
                    if i > 0 {
                        parts.push(Part::Text(rest[..i].to_string()));
                    }
                    if rest[i..].starts_with('}') {
                        return Err(bad("'}' without '{'"));
                    }
                    let Some(close) = rest[i..].find('}') else {
                        return Err(bad("'{' without '}'"));
                    };
                    let name = &rest[i + 1..i + close];
                    let part = match name {
                        "key" => Part::Key,
                        "biz_date" => Part::BizDate,
                        "task" => Part::Task,
                        _ => {
                            if let Some(f) = name.strip_prefix("args.").filter(|f| field_name_ok(f))
                            {
                                Part::Args(f.to_string())
                            } else if let Some(f) =
                                name.strip_prefix("payload.").filter(|f| field_name_ok(f))
                            {
                                Part::Payload(f.to_string())
                            } else {
                                return Err(bad(&format!("unknown placeholder {{{name}}}")));
                            }
                        }
                    };
                    parts.push(part);
                    rest = &rest[i + close + 1..];
                }
            }
        }
        // A constant key is allowed: one lock for every run of the tasks that share it.
        Ok(Template(parts))
    }

    /// The key of one run.
    pub fn render(&self, facts: &RunFacts) -> String {
        let field = |v: Option<&Fields>, name: &str| -> String {
            match v.and_then(|v| v.get(name)) {
                None => String::new(),
                Some(null) if null == "null" => String::new(),
                Some(value) => value.clone(),
            }
        };
        let mut out = String::new();
        for p in &self.0 {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Args(f) => out.push_str(&field(facts.args, f)),
                Part::Payload(f) => out.push_str(&field(facts.payload, f)),
                Part::Key => out.push_str(facts.key.unwrap_or("")),
                Part::BizDate => out.push_str(facts.biz_date.unwrap_or("")),
                Part::Task => out.push_str(facts.task),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::jsontext::top_level_fields;

    fn json(text: &str) -> Fields {
        top_level_fields(text).unwrap()
    }

    fn facts<'a>(args: &'a Fields, payload: Option<&'a Fields>) -> RunFacts<'a> {
        RunFacts {
            task: "bill",
            args: Some(args),
            payload,
            key: Some("k7"),
            biz_date: Some("2026-11-28"),
        }
    }

    #[test]
    fn renders_every_placeholder() {
        let t = Template::parse("acct:{args.account_id}/{payload.order}/{key}/{biz_date}/{task}")
            .unwrap();
        let args = json(r#"{"account_id": 42}"#);
        let payload = json(r#"{"order": "A-1"}"#);
        assert_eq!(
            t.render(&facts(&args, Some(&payload))),
            "acct:42/A-1/k7/2026-11-28/bill"
        );
    }

    #[test]
    fn missing_fields_render_empty() {
        let t = Template::parse("acct:{args.account_id}:{payload.x}").unwrap();
        let args = json("{}");
        assert_eq!(t.render(&facts(&args, None)), "acct::");
        let null = json(r#"{"account_id": null}"#);
        assert_eq!(t.render(&facts(&null, None)), "acct::");
    }

    #[test]
    fn constant_text_is_a_key() {
        let t = Template::parse("ledger").unwrap();
        assert_eq!(t.render(&facts(&json("{}"), None)), "ledger");
    }

    #[test]
    fn bad_templates_are_named() {
        for (bad, why) in [
            ("", "empty"),
            ("  ", "empty"),
            ("acct:{args.id", "'{' without '}'"),
            ("acct:}", "'}' without '{'"),
            ("acct:{account_id}", "unknown placeholder {account_id}"),
            ("acct:{args.}", "unknown placeholder {args.}"),
            ("acct:{args.a b}", "unknown placeholder {args.a b}"),
        ] {
            let e = Template::parse(bad).unwrap_err();
            assert!(e.to_string().contains(why), "{bad}: {e}");
            assert!(e.to_string().contains(&format!("\"{bad}\"")), "{e}");
            assert!(e.hint().contains("{args.NAME}"));
        }
        let long = "x".repeat(MAX_LEN + 1);
        assert_eq!(
            Template::parse(&long).unwrap_err().to_string(),
            "lock_key is too long (201 characters, at most 200)"
        );
    }
}

//! Every SQL example of the documentation runs (issue 18: docs that cannot rot). For each page
//! (README.md, docs/*.md, examples/README.md), in a fresh database with pg_tide, in the page's
//! order:
//! - each ```sql block runs whole, and must succeed;
//! - in a psql transcript (a plain ``` block), each `=# ` line is a statement: it must succeed,
//!   or, when the transcript shows `ERROR:  message` after it, fail with that message (an
//!   instant in it, `2026-05-10 09:30:03 UTC`, stands for any instant);
//! - each ```python and ```javascript block (worker excerpts, which call your own functions)
//!   must at least parse: `python3` compiles it, `node --check` checks it;
//! - `<!-- docs-test: setup ... -->` (an HTML comment, not shown by Markdown) runs its SQL
//!   before the next block: what the example takes for granted (the tables it reads, the runs it
//!   names), so that the example itself stays as a reader would type it.
//!
//! A page with SQL and no test would rot: every page is listed here, and a page that is not
//! fails the test that looks for them.

use std::path::{Path, PathBuf};

use pg_tide_pg_test::{describe, run_tests_with, Cluster, Failed, TestFn};

/// Every page with its test. One list: a page added to docs/ and not here fails
/// `every_page_with_sql_is_tested`.
const PAGES: [(&str, TestFn); 16] = [
    ("README.md", |c| page(c, "README.md")),
    ("docs/guide.md", |c| page(c, "docs/guide.md")),
    ("docs/time.md", |c| page(c, "docs/time.md")),
    ("docs/backfill-and-reconciliation.md", |c| {
        page(c, "docs/backfill-and-reconciliation.md")
    }),
    ("docs/sql-reference.md", |c| {
        page(c, "docs/sql-reference.md")
    }),
    ("docs/settings.md", |c| page(c, "docs/settings.md")),
    ("docs/operations.md", |c| page(c, "docs/operations.md")),
    ("docs/security.md", |c| page(c, "docs/security.md")),
    ("docs/patroni.md", |c| page(c, "docs/patroni.md")),
    ("docs/pg_cron.md", |c| page(c, "docs/pg_cron.md")),
    ("docs/console.md", |c| page(c, "docs/console.md")),
    ("docs/internals.md", |c| page(c, "docs/internals.md")),
    ("docs/performance.md", |c| page(c, "docs/performance.md")),
    ("docs/development.md", |c| page(c, "docs/development.md")),
    ("docs/architecture.md", |c| page(c, "docs/architecture.md")),
    ("examples/README.md", |c| page(c, "examples/README.md")),
];

fn main() {
    let mut tests: Vec<(&str, TestFn)> = vec![(
        "every_page_with_sql_is_tested",
        every_page_with_sql_is_tested,
    )];
    tests.extend(PAGES);
    // pg_cron beside pg_tide, for the migration guide's examples (its database: the page's).
    run_tests_with(
        "docs",
        "shared_preload_libraries = 'pg_tide,pg_cron'\ncron.database_name = 'docs_pg_cron'",
        &tests,
    )
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What a page asks to be run, in order.
#[derive(Debug)]
enum Step {
    /// Hidden set-up SQL (`<!-- docs-test: setup ... -->`).
    Setup { line: usize, sql: String },
    /// A ```sql block.
    Block { line: usize, sql: String },
    /// A ```python or ```javascript block: checked for syntax.
    Code {
        line: usize,
        lang: String,
        code: String,
    },
    /// A transcript's statement, and the error message it shows, if any.
    Typed {
        line: usize,
        sql: String,
        error: Option<String>,
    },
}

fn steps(text: &str) -> Vec<Step> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if let Some(rest) = l.trim_start().strip_prefix("<!-- docs-test: setup") {
            let start = i + 1; // the comment's line
            let mut sql = String::new();
            if let Some(inline) = rest.strip_suffix("-->") {
                sql.push_str(inline);
            } else {
                sql.push_str(rest);
                i += 1;
                while i < lines.len() && !lines[i].trim_start().starts_with("-->") {
                    sql.push_str(lines[i]);
                    sql.push('\n');
                    i += 1;
                }
            }
            out.push(Step::Setup { line: start, sql });
        } else if l.trim_start().starts_with("```") {
            // A fence, perhaps indented inside a list item: its body loses that indentation.
            let indent = l.len() - l.trim_start().len();
            let l = l.trim_start();
            let sql_block = l == "```sql";
            let plain = l == "```";
            let code = ["```python", "```javascript"]
                .contains(&l)
                .then(|| l.trim_start_matches('`').to_string());
            let start = i + 1;
            let mut body = Vec::new();
            i += 1;
            while i < lines.len() && !lines[i].trim_start().starts_with("```") {
                let line = lines[i];
                let cut = line.len() - line.trim_start().len();
                body.push((i + 1, &line[cut.min(indent)..]));
                i += 1;
            }
            if let Some(lang) = code {
                let code = body.iter().map(|(_, l)| *l).collect::<Vec<_>>().join("\n");
                out.push(Step::Code {
                    line: start + 1,
                    lang,
                    code,
                });
            } else if sql_block {
                let sql = body.iter().map(|(_, l)| *l).collect::<Vec<_>>().join("\n");
                out.push(Step::Block {
                    line: start + 1,
                    sql,
                });
            } else if plain {
                let mut j = 0;
                while j < body.len() {
                    if let Some(sql) = body[j].1.strip_prefix("=# ") {
                        let line = body[j].0;
                        let mut error = None;
                        j += 1;
                        while j < body.len() && !body[j].1.starts_with("=# ") {
                            if let Some(e) = body[j].1.strip_prefix("ERROR:  ") {
                                error.get_or_insert_with(|| e.to_string());
                            }
                            j += 1;
                        }
                        out.push(Step::Typed {
                            line,
                            sql: sql.to_string(),
                            error,
                        });
                    } else {
                        j += 1;
                    }
                }
            }
        }
        i += 1;
    }
    out
}

/// Whether a Python or JavaScript excerpt parses: Python's own compiler, `node --check`.
fn check_syntax(lang: &str, code: &str) -> Result<(), String> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let file = std::env::temp_dir().join(format!("pg_tide-docs-{}.js", std::process::id()));
    let mut cmd = match lang {
        "python" => {
            let mut c = Command::new("/usr/bin/python3");
            c.args([
                "-c",
                "import sys; compile(sys.stdin.read(), 'excerpt', 'exec')",
            ]);
            c
        }
        _ => {
            std::fs::write(&file, code).map_err(|e| e.to_string())?;
            let mut c = Command::new("node");
            c.arg("--check").arg(&file);
            c
        }
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{e} (the examples tier installs node)"))?;
    if lang == "python" {
        child
            .stdin
            .take()
            .ok_or("no stdin")?
            .write_all(code.as_bytes())
            .map_err(|e| e.to_string())?;
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&file);
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Whether a server's message is the one a page shows, where an instant shown
/// (`YYYY-MM-DD HH:MM:SS UTC`) stands for any instant.
fn same_message(got: &str, shown: &str) -> bool {
    let (g, s) = (got.as_bytes(), shown.as_bytes());
    let instant = |b: &[u8], i: usize| {
        b.len() >= i + 23
            && b[i..i + 19].iter().enumerate().all(|(k, c)| match k {
                4 | 7 => *c == b'-',
                10 => *c == b' ',
                13 | 16 => *c == b':',
                _ => c.is_ascii_digit(),
            })
            && &b[i + 19..i + 23] == b" UTC"
    };
    let (mut i, mut j) = (0, 0);
    while i < g.len() && j < s.len() {
        if instant(g, i) && instant(s, j) {
            i += 23;
            j += 23;
        } else if g[i] == s[j] {
            i += 1;
            j += 1;
        } else {
            return false;
        }
    }
    i == g.len() && j == s.len()
}

fn page(cluster: &Cluster, path: &str) -> Result<(), Failed> {
    let text = std::fs::read_to_string(repo().join(path))?;
    let db = format!(
        "docs_{}",
        Path::new(path)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("page")
            .replace('-', "_")
            .to_lowercase()
    );
    let db = if path.starts_with("examples/") {
        "docs_examples".to_string()
    } else {
        db
    };
    let mut c = cluster.fresh_db(&db)?;
    let mut ran = 0;
    for step in steps(&text) {
        match step {
            Step::Setup { line, sql } => c
                .batch_execute(&sql)
                .map_err(|e| format!("{path}:{line}: the set-up failed: {}", describe(&e)))?,
            Step::Block { line, sql } => {
                c.batch_execute(&sql)
                    .map_err(|e| format!("{path}:{line}: {}\n{sql}", describe(&e)))?;
                ran += 1;
            }
            Step::Code { line, lang, code } => {
                check_syntax(&lang, &code).map_err(|e| format!("{path}:{line}: {lang}: {e}"))?;
                ran += 1;
            }
            Step::Typed { line, sql, error } => {
                let got = c.batch_execute(&sql);
                match (got, error) {
                    (Ok(()), None) => {}
                    (Err(e), None) => {
                        return Err(format!("{path}:{line}: {}\n{sql}", describe(&e)).into())
                    }
                    (Ok(()), Some(want)) => {
                        return Err(format!(
                            "{path}:{line}: succeeded, but the page shows ERROR: {want}\n{sql}"
                        )
                        .into())
                    }
                    (Err(e), Some(want)) => {
                        let message = e.as_db_error().map(|d| d.message().to_string());
                        if !message.as_deref().is_some_and(|m| same_message(m, &want)) {
                            return Err(format!(
                                "{path}:{line}: the page shows ERROR: {want}\nthe server said: {}",
                                describe(&e)
                            )
                            .into());
                        }
                    }
                }
                ran += 1;
            }
        }
    }
    eprintln!("{path}: {ran} examples ran");
    Ok(())
}

/// Every Markdown page of the repository (but the console's and the examples' own pages,
/// which are listed) is in PAGES, so none is left untested.
fn every_page_with_sql_is_tested(_: &Cluster) -> Result<(), Failed> {
    let mut found = vec!["README.md".to_string(), "examples/README.md".to_string()];
    for entry in std::fs::read_dir(repo().join("docs"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            found.push(format!("docs/{name}"));
        }
    }
    for page in &found {
        assert!(
            PAGES.iter().any(|(p, _)| p == page),
            "{page} is not tested by pg_test/tests/docs.rs"
        );
    }
    assert!(same_message(
        "retry after 2026-12-03 03:30:03 UTC: lease",
        "retry after 2026-05-10 09:30:03 UTC: lease"
    ));
    assert!(!same_message(
        "retry after 2026-12-03 03:30:03 UTC",
        "retry after soon"
    ));
    assert!(!same_message("lease token 17", "lease token 18"));
    // The syntax check can fail.
    assert!(check_syntax("python", "def f(:\n").is_err());
    assert!(check_syntax("javascript", "function (").is_err());
    assert!(check_syntax("python", "x = 1\n").is_ok());
    // The parser sees what it must: a block, a transcript's error, a set-up.
    let sample = "<!-- docs-test: setup\nCREATE TABLE t ();\n-->\n```sql\nSELECT 1;\n```\n\
                  ```\n=# SELECT x;\nERROR:  column \"x\" does not exist\n=# SELECT 2;\n```\n\
                  1. a step:\n   ```sql\n   SELECT 3;\n     SELECT 4;\n   ```\n";
    let got = format!("{:?}", steps(sample));
    assert_eq!(
        got,
        "[Setup { line: 1, sql: \"CREATE TABLE t ();\\n\" }, Block { line: 5, sql: \"SELECT 1;\" }, \
         Typed { line: 8, sql: \"SELECT x;\", error: Some(\"column \\\"x\\\" does not exist\") }, \
         Typed { line: 10, sql: \"SELECT 2;\", error: None }, \
         Block { line: 14, sql: \"SELECT 3;\\n  SELECT 4;\" }]"
    );
    Ok(())
}

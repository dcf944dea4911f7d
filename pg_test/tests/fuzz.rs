//! Generated calls of every public pg_tide function, as a non-superuser, with hostile values:
//! NULLs, empty and blank strings, strings of megabytes, huge and tiny numbers, NaN, intervals of
//! millions of years and of mixed signs, infinite and far-away dates, JSON nested hundreds of
//! levels deep or holding numbers no double can hold, other roles' objects. For each call:
//! either it succeeds, or it is refused with a specific SQLSTATE (never an internal error, never
//! a bare RAISE) and writes nothing; the server never crashes; and every call ends within the
//! statement timeout (a statement that spins past it would show here as 57014).
//!
//! The calls are drawn from a fixed seed, so a failure repeats; `PG_TIDE_FUZZ_SEED` changes
//! the seed and `PG_TIDE_FUZZ_CALLS` the number of calls per function.

use pg_tide_pg_test::{db_err, exec, one, run_tests, Client, Cluster, Failed, TestFn};

/// splitmix64: a small deterministic generator, enough to pick values.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn pick<'a>(&mut self, items: &'a [String]) -> &'a str {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

/// SQL expressions of each argument type, hostile ones among ordinary ones. Every expression is
/// valid input for its type, so what is refused is refused by pg_tide, not by a cast.
fn pool(ty: &str, fixtures: &Fixtures) -> Vec<String> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let mut out = match ty {
        "text" | "name" => s(&[
            "NULL",
            "''",
            "' '",
            "E'\\t\\n '",
            "'f_hourly'",
            "'f_event'",
            "'c_daily'",
            "'victim_task'",
            "'victim_check'",
            "'x'",
            "repeat('x', 300)",
            "repeat('x', 70000)",
            "repeat('Europe/Berlin', 50000)",
            "'0 1 * * *'",
            "'* * * * * *'",
            "'99 * * * *'",
            "'@daily'",
            "'1 day'",
            "'UTC'",
            "'Asia/Shangai'",
            "'America/New_York'",
            "'default'",
            "'queue'",
            "'allow'",
            "'skip'",
            "'hold'",
            "'adopt'",
            "'original'",
            "'current'",
            "'accept'",
            "'replay'",
            "'business'",
            "'transient'",
            "'not_ready'",
            "'critical'",
            "'sms'",
            "'order.created'",
            "'t'",
            "'#1'",
            "'{args.account}'",
            "'acct:{payload.a}'",
            "'{'",
            "'''; DROP TABLE fuzz_table; --'",
            "'ñ✓ 🙂'",
            "'SELECT 1'",
            "'SELECT pg_sleep(30)'",
            "'true'",
        ]),
        "integer" => s(&[
            "NULL",
            "0",
            "1",
            "-1",
            "5",
            "1000",
            "1001",
            "2147483647",
            "-2147483648",
        ]),
        "bigint" => {
            let mut v = s(&[
                "NULL",
                "0",
                "1",
                "-1",
                "9223372036854775807",
                "-9223372036854775808",
            ]);
            v.extend(fixtures.runs.iter().map(|r| r.to_string()));
            v.extend(fixtures.tokens.iter().map(|t| t.to_string()));
            v
        }
        "boolean" => s(&["NULL", "true", "false"]),
        "double precision" => s(&[
            "NULL",
            "0",
            "1",
            "2",
            "-1",
            "0.5",
            "'NaN'",
            "'Infinity'",
            "'-Infinity'",
            "1e308",
            "10001",
        ]),
        "interval" => s(&[
            "NULL",
            "'0'",
            "'1 second'",
            "'-1 second'",
            "'1 hour'",
            "'1 day'",
            "'30 days'",
            "'31 days'",
            "'1 month'",
            "'178000000 years'",
            "'290000 years'",
            "'-1 month 31 days'",
            "'1 day -1 second'",
            "'00:00:00.000001'",
        ]),
        "timestamp with time zone" => s(&[
            "NULL",
            "now()",
            "'infinity'",
            "'-infinity'",
            "'294276-12-31'",
            "'262144-01-01'",
            "'4713-01-01 BC'",
            "'0001-01-01'",
            "'9999-12-31 23:59:59'",
            "'2026-03-08 02:30 America/New_York'",
            "date_trunc('hour', now()) - interval '5 hours'",
        ]),
        "date" => s(&[
            "NULL",
            "current_date",
            "current_date - 2",
            "'infinity'",
            "'-infinity'",
            "'5874897-12-31'",
            "'4713-01-01 BC'",
            "'0001-01-01'",
            "'9999-12-31'",
        ]),
        "jsonb" => s(&[
            "NULL",
            "'{}'",
            "'[]'",
            "'1'",
            "'null'",
            "'\"s\"'",
            "'{\"a\": 1, \"account\": 7}'",
            "('{\"a\":' || repeat('[', 200) || repeat(']', 200) || '}')::jsonb",
            "(repeat('[', 2000) || repeat(']', 2000))::jsonb",
            "'{\"a\": 1e400}'",
            "'{\"a\": -1e-400}'",
            "jsonb_build_object('big', repeat('x', 2000000))",
        ]),
        "text[]" => s(&[
            "NULL",
            "'{}'",
            "ARRAY[NULL]::text[]",
            "ARRAY['t']",
            "ARRAY['order.created', 't']",
            "ARRAY[repeat('x', 200)]",
            "ARRAY['not ok']",
            "(SELECT array_agg('t' || g) FROM generate_series(1, 60) g)",
        ]),
        "bigint[]" => {
            let mut v = s(&["NULL", "'{}'", "ARRAY[NULL]::bigint[]", "ARRAY[1, 1]"]);
            v.push(format!("ARRAY{:?}::bigint[]", fixtures.runs));
            v.push(format!("ARRAY{:?}::bigint[]", fixtures.tokens));
            v.push("(SELECT array_agg(g) FROM generate_series(1, 5000) g)".into());
            v
        }
        "jsonb[]" => s(&["NULL", "'{}'", "ARRAY['{}'::jsonb]", "ARRAY[NULL]::jsonb[]"]),
        "regclass" => s(&[
            "NULL",
            "'fuzz_table'",
            "'victim_table'",
            "'pg_class'",
            "'tide.task'",
            "'fuzz_view'",
        ]),
        "tide.task" => s(&["NULL", "(SELECT t FROM tide.task t LIMIT 1)"]),
        other => vec![format!("NULL::{other}")],
    };
    out.dedup();
    out
}

/// What the fuzzing role owns, and another role's objects it must not reach.
struct Fixtures {
    runs: Vec<i64>,
    tokens: Vec<i64>,
}

/// A public function and its arguments' types.
struct Function {
    name: String,
    args: Vec<String>,
    defaults: usize,
}

fn functions(c: &mut Client) -> Result<Vec<Function>, Failed> {
    let rows = c
        .query(
            "SELECT p.proname::text,
                    ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t)::text[],
                    p.pronargdefaults::int
               FROM pg_proc p
              WHERE p.pronamespace = 'tide'::regnamespace AND p.proname NOT LIKE '\\_%'
                AND p.prorettype <> 'trigger'::regtype AND p.prokind = 'f'
              ORDER BY 1, 2",
            &[],
        )
        .map_err(db_err)?;
    Ok(rows
        .iter()
        .map(|r| Function {
            name: r.get(0),
            args: r.get(1),
            defaults: usize::try_from(r.get::<_, i32>(2)).unwrap_or(0),
        })
        .collect())
}

/// Row counts and contents of every pg_tide table, as the superuser sees them.
const FINGERPRINT: &str = "
CREATE FUNCTION fuzz_fingerprint() RETURNS text LANGUAGE plpgsql AS $$
DECLARE r record; v text; out text := '';
BEGIN
    FOR r IN SELECT c.oid::regclass AS t FROM pg_class c
              WHERE c.relnamespace = 'tide'::regnamespace AND c.relkind = 'r' ORDER BY 1 LOOP
        EXECUTE format('SELECT count(*) || '':'' || coalesce(md5(string_agg(x::text, '','' ORDER BY x::text)), '''') FROM %s x', r.t)
           INTO v;
        out := out || r.t::text || '=' || v || ';';
    END LOOP;
    RETURN out;
END $$;";

fn setup(cluster: &Cluster) -> Result<(Client, Client, Fixtures), Failed> {
    let db = "fuzz";
    let mut admin = cluster.fresh_db(db)?;
    exec(
        &mut admin,
        &format!(
            "DO $$ BEGIN
                 IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'fuzzer') THEN CREATE ROLE fuzzer LOGIN; END IF;
                 IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'victim') THEN CREATE ROLE victim LOGIN; END IF;
             END $$;
             GRANT CREATE ON SCHEMA public TO fuzzer, victim;
             {FINGERPRINT}"
        ),
    )?;
    let mut victim = cluster.connect_as(db, "victim")?;
    exec(
        &mut victim,
        "CREATE TABLE victim_table (id int);
         SELECT tide.schedule('victim_task', '0 * * * *');
         SELECT tide.create_check('victim_check', '1 day');
         SELECT tide.rerun('victim_task', window_start => date_trunc('hour', now()) - interval '3 hours');",
    )?;
    let mut fuzzer = cluster.connect_as(db, "fuzzer")?;
    exec(
        &mut fuzzer,
        "CREATE TABLE fuzz_table (id int, customer text);
         CREATE VIEW fuzz_view AS SELECT 1 AS one;
         SELECT tide.schedule('f_hourly', '0 * * * *', lock_key => 'acct:{args.account}', args => '{\"account\": 7}');
         SELECT tide.schedule('f_event', NULL, topics => ARRAY['t', 'order.created']);
         SELECT tide.create_check('c_daily', '1 day');
         SELECT tide.rerun('f_hourly', window_start => date_trunc('hour', now()) - interval '3 hours');
         SELECT tide.rerun('f_hourly', window_start => date_trunc('hour', now()) - interval '4 hours');
         SELECT tide.emit('t', '{\"a\": 1}', event_key => 'k');
         SELECT tide.create_effect('sms', 'fuzz:1');",
    )?;
    let claimed = fuzzer
        .query(
            "SELECT run_id, lease_token FROM tide.claim_runs(n => 1)",
            &[],
        )
        .map_err(db_err)?;
    let mut runs: Vec<i64> = admin
        .query("SELECT run_id FROM tide.run ORDER BY run_id", &[])
        .map_err(db_err)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    runs.push(999_999);
    let mut tokens: Vec<i64> = claimed.iter().map(|r| r.get(1)).collect();
    tokens.push(1);
    Ok((admin, fuzzer, Fixtures { runs, tokens }))
}

/// SQLSTATEs that say nothing about what was wrong: an internal error, a bare RAISE.
fn unspecific(code: &str) -> bool {
    code.starts_with("XX") || code == "P0001"
}

fn every_public_function_refuses_hostile_input_cleanly(cluster: &Cluster) -> Result<(), Failed> {
    let (mut admin, mut fuzzer, fixtures) = setup(cluster)?;
    exec(&mut fuzzer, "SET statement_timeout = '10s'")?;
    let seed = std::env::var("PG_TIDE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_130_u64);
    let per_function: usize = std::env::var("PG_TIDE_FUZZ_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let mut rng = Rng(seed);
    let functions = functions(&mut admin)?;
    assert!(
        functions.len() >= 50,
        "found only {} public functions",
        functions.len()
    );
    let postmaster: i32 = one(
        &mut admin,
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'",
    )?;
    let mut calls = 0usize;
    let mut refused = 0usize;
    let mut codes: std::collections::BTreeMap<String, usize> = Default::default();
    for f in &functions {
        let pools: Vec<Vec<String>> = f.args.iter().map(|t| pool(t, &fixtures)).collect();
        for _ in 0..per_function {
            // Sometimes leave out the defaulted trailing arguments.
            let keep = if f.defaults > 0 && rng.next().is_multiple_of(3) {
                f.args.len() - (rng.next() as usize % (f.defaults + 1))
            } else {
                f.args.len()
            };
            let args: Vec<String> = (0..keep)
                .map(|i| format!("({})::{}", rng.pick(&pools[i]), f.args[i]))
                .collect();
            let sql = format!("SELECT tide.{}({})", f.name, args.join(", "));
            let before: String = one(&mut admin, "SELECT fuzz_fingerprint()")?;
            calls += 1;
            match fuzzer.batch_execute(&sql) {
                Ok(()) => {}
                Err(e) => {
                    let Some(db) = e.as_db_error() else {
                        return Err(format!("{sql}: the connection failed: {e}").into());
                    };
                    let code = db.code().code().to_string();
                    assert!(!unspecific(&code), "{sql}: {code} {}", db.message());
                    assert_ne!(code, "57014", "{sql} ran past the statement timeout");
                    assert_ne!(
                        code, "42883",
                        "{sql}: the generator built a call that does not exist"
                    );
                    assert!(
                        db.message().len() < 2000,
                        "{sql}: a message of {} bytes",
                        db.message().len()
                    );
                    refused += 1;
                    *codes.entry(code).or_default() += 1;
                    let after: String = one(&mut admin, "SELECT fuzz_fingerprint()")?;
                    assert_eq!(before, after, "{sql} was refused but wrote something");
                }
            }
        }
    }
    println!(
        "{calls} calls over {} functions, {refused} refused: {codes:?}",
        functions.len()
    );
    assert!(calls >= 2000, "only {calls} calls");
    // Nothing crashed: the server never restarted its backends, and the role's session lives.
    let still: i32 = one(
        &mut admin,
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'",
    )?;
    assert_eq!(postmaster, still, "the server went through crash recovery");
    let alive: i32 = one(&mut fuzzer, "SELECT 1")?;
    assert_eq!(alive, 1);
    // The other role's objects are untouched.
    let victim: String = one(
        &mut admin,
        "SELECT concat_ws('|', (SELECT count(*) FROM tide.task WHERE owner = 'victim'),
                          (SELECT count(*) FROM tide.check WHERE owner = 'victim' AND beats = 0),
                          (SELECT count(*) FROM tide.run WHERE owner = 'victim' AND state = 'ready'),
                          (SELECT count(*) FROM pg_trigger WHERE tgrelid = 'victim_table'::regclass))",
    )?;
    assert_eq!(victim, "1|1|1|0");
    Ok(())
}

fn main() {
    let tests: &[(&str, TestFn)] = &[(
        "every_public_function_refuses_hostile_input_cleanly",
        every_public_function_refuses_hostile_input_cleanly,
    )];
    run_tests("fuzz", tests)
}

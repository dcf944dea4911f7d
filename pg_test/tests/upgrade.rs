//! Upgrades, proven (issue 18): for every frozen version of pg_tide (sql/pg_tide--X.Y.Z.sql,
//! installed beside the current one by scripts/install.sh), a database created at that version
//! with the current library, holding tasks, runs and their history, a dead letter and its
//! alert, a heartbeat check, a queue, backfills and reconciliations, is brought to the current
//! version by `ALTER EXTENSION pg_tide UPDATE`. Then:
//! - its schema, as `pg_dump --schema-only --binary-upgrade` prints it (the only mode that
//!   prints an extension's member objects, with their grants and comments), is the one a fresh
//!   `CREATE EXTENSION pg_tide` makes, line for line once object ids are left out;
//! - every row written before is still there, finished runs unchanged;
//! - the workers go on: a run waiting in a paused queue across the update is run once the queue
//!   is resumed, and a rerun made after the update is run too, and counted in the metrics.
//!
//! A schema change made without a new version and its upgrade script fails here: the frozen
//! script brought up to date no longer matches the generated one.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use pg_tide_pg_test::{
    db_err, exec, one, pg_bin, run_tests, tick, wait_for, Client, Cluster, Failed, TestFn,
    WORKERS_DB,
};

fn main() {
    let tests: &[(&str, TestFn)] = &[
        (
            "every_frozen_version_updates_to_the_current_schema_keeping_its_rows",
            every_frozen_version_updates,
        ),
        (
            "schedule_plans_again_when_the_extension_is_made_again_in_its_session",
            schedule_plans_again_in_its_session,
        ),
    ];
    run_tests("upgrade", tests)
}

fn sql_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sql")
}

/// A version's numbers, for ordering.
fn parse_version(v: &str) -> Vec<u64> {
    v.split('.').map(|n| n.parse().unwrap_or(0)).collect()
}

/// The frozen versions in the repository, oldest first.
fn frozen_versions() -> Result<Vec<String>, Failed> {
    let mut versions: Vec<String> = std::fs::read_dir(sql_dir())?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| {
            let v = name.strip_prefix("pg_tide--")?.strip_suffix(".sql")?;
            (!v.contains("--")).then(|| v.to_string())
        })
        .collect();
    versions.sort_by_key(|v| parse_version(v));
    Ok(versions)
}

/// `pg_dump --schema-only --binary-upgrade` of a database, without what differs between two
/// databases of the same schema: the object ids pg_upgrade would carry over (the lines that set
/// them, and the ids of the extension's configuration tables, whose number is kept).
fn schema_of(cluster: &Cluster, db: &str) -> Result<Vec<String>, Failed> {
    let dump = cluster.tool(
        "pg_dump",
        &[
            "--schema-only",
            "--binary-upgrade",
            "--exclude-schema=app",
            "-d",
            db,
        ],
    )?;
    Ok(dump
        .lines()
        // The ids and transaction ids pg_upgrade would carry over, the sequences' positions (the
        // extension's sequences are dumped with their tables, even in a schema-only dump), and
        // psql's random \restrict key.
        .filter(|l| {
            let l = l.trim_start();
            !(l.contains("binary_upgrade_set_next_")
                || l.starts_with("SELECT pg_catalog.setval(")
                || l.starts_with("SET relfrozenxid = ")
                || (l.starts_with("WHERE oid = '") && l.ends_with("';"))
                || l.starts_with("\\restrict ")
                || l.starts_with("\\unrestrict "))
        })
        .map(|l| {
            if !l.contains("binary_upgrade_create_empty_extension(") {
                return l.to_string();
            }
            // ('pg_tide', 'public', false, '0.2.1', '{oid,oid,...}', '{"",...}', ARRAY[]...)
            let mut out = String::new();
            let mut rest = l;
            while let Some(start) = rest.find("'{") {
                out.push_str(&rest[..start]);
                let Some(end) = rest[start..].find("}'") else {
                    break;
                };
                let list = &rest[start + 2..start + end];
                let n = if list.is_empty() {
                    0
                } else {
                    list.split(',').count()
                };
                let all_oids = list.split(',').all(|x| x.parse::<u32>().is_ok());
                out.push_str(&if all_oids {
                    format!("'{{{n} config table oids}}'")
                } else {
                    rest[start..start + end + 2].to_string()
                });
                rest = &rest[start + end + 2..];
            }
            out.push_str(rest);
            out
        })
        .collect())
}

/// The lines of one dump that the other lacks (each side, up to 40), or None when equal.
fn differences(fresh: &[String], upgraded: &[String]) -> Option<String> {
    if fresh == upgraded {
        return None;
    }
    fn count(lines: &[String]) -> BTreeMap<&str, i64> {
        let mut m: BTreeMap<&str, i64> = BTreeMap::new();
        for l in lines {
            *m.entry(l.as_str()).or_default() += 1;
        }
        m
    }
    let (f, u) = (count(fresh), count(upgraded));
    let only = |a: &BTreeMap<&str, i64>, b: &BTreeMap<&str, i64>| {
        a.iter()
            .filter(|(l, n)| b.get(*l).copied().unwrap_or(0) < **n)
            .map(|(l, _)| format!("  {l}"))
            .take(40)
            .collect::<Vec<_>>()
            .join("\n")
    };
    Some(format!(
        "only in the fresh install:\n{}\nonly in the upgraded database:\n{}\n(the same lines in another order when both are empty)",
        only(&f, &u),
        only(&u, &f)
    ))
}

/// Tables whose rows come and go as pg_tide works (claims, folds, lock releases): not compared.
const TRANSIENT: [&str; 4] = ["pending", "count_delta", "task_touch", "lock"];

/// The number of rows of each of pg_tide's tables.
fn table_counts(c: &mut Client) -> Result<BTreeMap<String, i64>, Failed> {
    let tables: Vec<String> = c
        .query(
            "SELECT relname::text FROM pg_class
              WHERE relnamespace = 'tide'::regnamespace AND relkind IN ('r', 'p') ORDER BY 1",
            &[],
        )
        .map_err(db_err)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut counts = BTreeMap::new();
    for t in tables {
        if TRANSIENT.contains(&t.as_str()) {
            continue;
        }
        let n: i64 = one(c, &format!("SELECT count(*) FROM tide.{t}"))?;
        counts.insert(t, n);
    }
    Ok(counts)
}

/// Every finished run with what it ended as: what the update must not change.
fn finished(c: &mut Client) -> Result<Vec<String>, Failed> {
    Ok(c.query(
        "SELECT concat_ws(':', r.run_id, t.name, r.biz_date, r.state, r.attempts, r.finished_at)
               FROM tide.run r JOIN tide.task t USING (task_id)
              WHERE r.state IN ('succeeded', 'dead', 'need_check', 'skipped', 'cancelled')
              ORDER BY r.run_id",
        &[],
    )
    .map_err(db_err)?
    .iter()
    .map(|r| r.get(0))
    .collect())
}

/// Writes some of everything pg_tide keeps, through its functions as of the oldest frozen
/// version, and waits until the workers have done what they will do with it.
fn write_everything(c: &mut Client) -> Result<(), Failed> {
    exec(
        c,
        "CREATE SCHEMA app;
         CREATE TABLE app.up_log (biz_date date, note text);
         CREATE TABLE app.up_l AS
             SELECT current_date - g AS day, 'k' || g AS key, g::numeric AS v FROM generate_series(2, 4) g;
         CREATE TABLE app.up_r AS SELECT * FROM app.up_l WHERE day <> current_date - 3;
         SELECT tide.schedule('up_daily', '0 6 * * *', biz_window => 'day',
                              command => $$INSERT INTO app.up_log VALUES (tide.biz_date(), 'daily')$$);
         -- An external event task: one run done, one dead (a dead letter, then its alert).
         SELECT tide.schedule('up_ext', NULL, topics => '{up_ext}', queue => 'up_ext', max_attempts => 1);
         SELECT tide.emit('up_ext');
         SELECT tide.emit('up_ext');
         SELECT tide.complete_run(run_id, lease_token) FROM tide.claim_runs('up_ext', n => 1);
         SELECT tide.fail_run(run_id, lease_token, 'bad row', 'business') FROM tide.claim_runs('up_ext', n => 1);
         -- An SQL event run left waiting in a paused queue across the update.
         SELECT tide.create_queue('up_held', max_concurrency => 1);
         SELECT tide.pause_queue('up_held');",
    )?;
    // The paused queue is committed before its run is made. (In one transaction, an executor's
    // claim begun before that commit can read the queue's limits before it and the run after
    // it, and run it: seen once on PostgreSQL 18. A bug of tide._claim fixed in 0.2.6, which
    // reads the limits again with its candidates; the frozen versions this tier creates, and
    // whose SQL runs here until the update, still have it.)
    exec(
        c,
        "SELECT tide.schedule('up_cmd', NULL, topics => '{up_cmd}', queue => 'up_held',
                              command => $$INSERT INTO app.up_log VALUES (NULL, 'held')$$);
         SELECT tide.emit('up_cmd');
         -- A reconciliation, backfilled over three days (one unbalanced), and a backfill of the
         -- daily task.
         SELECT tide.reconcile('up_recon', '0 6 * * *', biz_window => 'day',
             left_sql => 'SELECT key, v FROM app.up_l WHERE day = tide.biz_date()',
             right_sql => 'SELECT key, v FROM app.up_r WHERE day = tide.biz_date()', amounts => ARRAY['v']);
         SELECT tide.backfill('up_recon', current_date - 4, current_date - 2, canary => 0, sample => 0);
         SELECT tide.backfill('up_daily', current_date - 3, current_date - 2, canary => 0, sample => 0);
         -- A heartbeat check with a beat.
         SELECT tide.create_check('up_check', '1 day');
         SELECT tide.heartbeat_check('up_check');
         -- The library's functions as the old version declares them (tide.preview without owner).
         SELECT count(*) FROM tide.preview('up_daily', 2);",
    )?;
    // The new library's tick fires a task under the old version's SQL (between the restart on
    // the new library and ALTER EXTENSION UPDATE, src/scheduler/tick.rs): an external task due
    // at the next minute, fired by a tick 61 seconds ahead (no lease of this test ends so soon).
    // Each run it made is recorded: its first history row and its line in tide.pending.
    exec(
        c,
        "SELECT tide.schedule('up_fire', '* * * * *', queue => 'up_fire')",
    )?;
    tick(c, "now() + interval '61 seconds'")?;
    let fired: i64 = one(
        c,
        "SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id)
          WHERE t.name = 'up_fire'
            AND EXISTS (SELECT FROM tide.run_event e WHERE e.run_id = r.run_id AND e.from_state IS NULL)
            AND EXISTS (SELECT FROM tide.pending p WHERE p.run_id = r.run_id)",
    )?;
    assert!(
        fired >= 1,
        "the tick fired up_fire under the old SQL: {fired} runs recorded"
    );
    // Functions 0.3.0 renamed or folded keep working under the old SQL until the update (the
    // library keeps their C symbols): run_now (rolled back: no run left behind), backoff_delay,
    // error_kind_of. (0.3.0 and later have them under their new names.)
    let version = extversion(c)?;
    if parse_version(&version) < parse_version("0.3.0") {
        exec(c, "BEGIN")?;
        let made: i64 = one(c, "SELECT tide.run_now('up_daily')")?;
        exec(c, "ROLLBACK")?;
        assert!(made > 0, "tide.run_now under {version}'s SQL: {made}");
        let helpers: String = one(
            c,
            "SELECT concat_ws('|', tide.backoff_delay(2, '10 seconds', 2, '1 hour', 'none', 0.5),
                                   tide.error_kind_of('40001'))",
        )?;
        assert_eq!(helpers, "00:00:20|transient");
    }
    wait_for(
        "the backfills to end, the dead letter's alert to open",
        Duration::from_secs(60),
        || {
            let done: bool = c
                .query_one(
                    "SELECT (SELECT count(*) FROM tide.backfill_status WHERE state = 'done') = 2
                        AND EXISTS (SELECT FROM tide.alert WHERE kind = 'dead_letter' AND resolved_at IS NULL)
                        AND EXISTS (SELECT FROM tide.recon_diff)",
                    &[],
                )
                .map_err(|e| e.to_string())?
                .get(0);
            Ok(done.then_some(()))
        },
    )?;
    Ok(())
}

fn extversion(c: &mut Client) -> Result<String, Failed> {
    one(
        c,
        "SELECT extversion FROM pg_extension WHERE extname = 'pg_tide'",
    )
}

/// Drops the workers' database, ending the workers' sessions in it (they come back and wait
/// for the extension), and creates it empty.
fn new_workers_db(cluster: &Cluster) -> Result<Client, Failed> {
    let mut admin = cluster.connect("postgres")?;
    exec(
        &mut admin,
        &format!("DROP DATABASE IF EXISTS {WORKERS_DB} WITH (FORCE)"),
    )?;
    exec(&mut admin, &format!("CREATE DATABASE {WORKERS_DB}"))?;
    Ok(cluster.connect(WORKERS_DB)?)
}

/// DROP EXTENSION pg_tide in the session `c`: its workers, which hold the database, are stopped
/// for it (they come back at once), until the drop goes through.
fn drop_extension(c: &mut Client) -> Result<(), Failed> {
    wait_for("DROP EXTENSION pg_tide", Duration::from_secs(10), || {
        exec(
            c,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type LIKE 'pg_tide%'",
        )
        .map_err(|e| format!("{e:?}"))?;
        Ok(c.batch_execute("DROP EXTENSION pg_tide CASCADE").ok())
    })?;
    Ok(())
}

/// tide.schedule keeps its insert's plan for the session (src/tasks/catalog.rs). Made again in
/// that session, the extension has new tables and types: the plan is made again, and a task
/// scheduled then is written whole; so after an update from the oldest frozen version, whose
/// tide.schedule wrote fewer columns.
fn schedule_plans_again_in_its_session(cluster: &Cluster) -> Result<(), Failed> {
    let mut c = new_workers_db(cluster)?;
    exec(
        &mut c,
        "SET client_min_messages = error;
         CREATE EXTENSION pg_tide;
         SELECT tide.schedule('kept_a', '0 * * * *', command => 'SELECT 1');",
    )?;
    drop_extension(&mut c)?;
    exec(
        &mut c,
        "CREATE EXTENSION pg_tide;
         SELECT tide.schedule('kept_b', '0 * * * *', command => 'SELECT 2', tz => 'Europe/Paris');",
    )?;
    let got: String = one(
        &mut c,
        "SELECT string_agg(name || ' ' || tz || ' ' || command || ' ' || version, ', ') FROM tide.task",
    )?;
    assert_eq!(got, "kept_b Europe/Paris SELECT 2 1");
    let oldest = frozen_versions()?
        .into_iter()
        .next()
        .ok_or("no frozen version")?;
    drop_extension(&mut c)?;
    exec(
        &mut c,
        &format!(
            "CREATE EXTENSION pg_tide VERSION '{oldest}';
             SELECT tide.schedule('kept_c', '0 * * * *', command => 'SELECT 3');
             ALTER EXTENSION pg_tide UPDATE;
             SELECT tide.schedule('kept_d', '0 * * * *', command => 'SELECT 4', tz => 'Asia/Tokyo');"
        ),
    )?;
    let got: String = one(
        &mut c,
        "SELECT string_agg(name || ' ' || tz || ' ' || command, ', ' ORDER BY name) FROM tide.task",
    )?;
    assert_eq!(got, "kept_c UTC SELECT 3, kept_d Asia/Tokyo SELECT 4");
    drop_extension(&mut c)?;
    Ok(())
}

fn every_frozen_version_updates(cluster: &Cluster) -> Result<(), Failed> {
    let versions = frozen_versions()?;
    assert!(
        !versions.is_empty(),
        "no frozen version in {} (sql/pg_tide--X.Y.Z.sql)",
        sql_dir().display()
    );
    // The frozen scripts must be installed as they are in the repository.
    let sharedir = std::process::Command::new(pg_bin().join("pg_config"))
        .arg("--sharedir")
        .output()?;
    let extension_dir =
        PathBuf::from(String::from_utf8_lossy(&sharedir.stdout).trim()).join("extension");
    for version in &versions {
        let name = format!("pg_tide--{version}.sql");
        let installed = std::fs::read(extension_dir.join(&name)).unwrap_or_default();
        assert!(
            installed == std::fs::read(sql_dir().join(&name))?,
            "{} is not sql/{name} (scripts/install.sh installs it)",
            extension_dir.join(&name).display()
        );
    }
    let mut c = new_workers_db(cluster)?;
    exec(&mut c, "CREATE EXTENSION pg_tide")?;
    let current = extversion(&mut c)?;
    assert!(
        !versions.contains(&current),
        "version {current} is both frozen and current: bump the version in Cargo.toml and write sql/pg_tide--{current}--NEXT.sql"
    );
    let fresh = schema_of(cluster, WORKERS_DB)?;
    assert!(
        fresh
            .iter()
            .any(|l| l.contains("ALTER EXTENSION pg_tide ADD")),
        "the dump lists the extension's members"
    );

    for version in &versions {
        let mut c = new_workers_db(cluster)?;
        c.batch_execute(&format!("CREATE EXTENSION pg_tide VERSION '{version}'"))
            .map_err(|e| {
                format!(
                    "{} (scripts/install.sh installs sql/pg_tide--{version}.sql beside the build)",
                    pg_tide_pg_test::describe(&e)
                )
            })?;
        assert_eq!(&extversion(&mut c)?, version);
        write_everything(&mut c)?;
        let counts_before = table_counts(&mut c)?;
        let finished_before = finished(&mut c)?;
        let held_before: String = one(
            &mut c,
            "SELECT r.run_id || ':' || r.state FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'up_cmd'",
        )?;
        assert!(held_before.ends_with(":ready"), "{held_before}");

        exec(&mut c, "ALTER EXTENSION pg_tide UPDATE")?;
        assert_eq!(extversion(&mut c)?, current, "updated from {version}");
        if let Some(d) = differences(&fresh, &schema_of(cluster, WORKERS_DB)?) {
            return Err(format!(
                "{version} updated to {current} differs from a fresh {current} \
                 (sql/pg_tide--*--{current}.sql must make what the generated script makes):\n{d}"
            )
            .into());
        }

        // Every row is still there (the update may only add), finished runs unchanged.
        let counts_after = table_counts(&mut c)?;
        for (table, before) in &counts_before {
            let after = counts_after.get(table).copied().unwrap_or(0);
            assert!(
                after >= *before,
                "tide.{table}: {before} rows before the update from {version}, {after} after"
            );
        }
        let finished_after = finished(&mut c)?;
        for run in &finished_before {
            assert!(
                finished_after.contains(run),
                "finished run {run} changed by the update from {version}: now {finished_after:?}"
            );
        }
        assert!(
            finished_before
                .iter()
                .any(|r| r.contains(":up_ext:") && r.contains(":dead:")),
            "a dead letter before the update: {finished_before:?}"
        );

        // The workers go on: the run held across the update, and a rerun made after it.
        exec(&mut c, "SELECT tide.resume_queue('up_held')")?;
        let rerun: i64 = one(
            &mut c,
            "SELECT tide.rerun('up_daily', biz_date => current_date - 1)",
        )?;
        wait_for(
            "the held run and the rerun to succeed after the update",
            Duration::from_secs(60),
            || {
                let done: bool = c
                    .query_one(
                        "SELECT (SELECT count(*) FROM tide.run WHERE run_id = $1 AND state = 'succeeded') = 1
                            AND (SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id)
                                  WHERE t.name = 'up_cmd' AND r.state = 'succeeded') = 1",
                        &[&rerun],
                    )
                    .map_err(|e| e.to_string())?
                    .get(0);
                Ok(done.then_some(()))
            },
        )?;
        let log: String = one(
            &mut c,
            "SELECT string_agg(coalesce((current_date - biz_date)::text, '-') || ':' || note, ' ' ORDER BY biz_date DESC NULLS LAST, note)
               FROM app.up_log",
        )?;
        assert_eq!(log, "1:daily 2:daily 3:daily -:held", "what the runs wrote");
        // What the update brought works on what was there: the rerun's success is counted in a
        // duration bucket; the successes before an update from 0.2.0 (which had no buckets) only
        // in +Inf (the count).
        let buckets: String = one(
            &mut c,
            "SELECT string_agg(labels->>'le' || '=' || value, ' ' ORDER BY value, labels->>'le')
               FROM tide.metric
              WHERE metric = 'pg_tide_run_duration_seconds_bucket' AND task = 'up_daily'
                AND labels->>'le' IN ('21600', '+Inf')",
        )?;
        let expected = if parse_version(version) < parse_version("0.2.1") {
            "21600=1 +Inf=3"
        } else {
            "+Inf=3 21600=3"
        };
        assert_eq!(
            buckets, expected,
            "up_daily's duration histogram from {version}"
        );
    }
    Ok(())
}

//! `#[pg_test]`: the SQL API inside one rolled-back transaction per test.
//! Background-worker behaviour is tested out of process, in `pg_test/`.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn one<T: pgrx::IntoDatum + pgrx::FromDatum>(sql: &str) -> T {
        Spi::get_one::<T>(sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .unwrap_or_else(|| panic!("{sql}: NULL"))
    }

    fn run(sql: &str) {
        Spi::run(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Runs `sql` expecting an error; returns "SQLSTATE|message|hint". The statement runs in a
    /// subtransaction that is rolled back, as a failed statement would be.
    fn error_of(sql: &str) -> String {
        run(
            "CREATE OR REPLACE FUNCTION pg_temp.error_of(q text) RETURNS text
             LANGUAGE plpgsql AS $$
             DECLARE st text; msg text; hint text;
             BEGIN
                 EXECUTE q;
                 RETURN 'no error';
             EXCEPTION WHEN OTHERS THEN
                 GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                                         hint = PG_EXCEPTION_HINT;
                 RETURN st || '|' || msg || '|' || hint;
             END $$",
        );
        Spi::get_one_with_args::<String>("SELECT pg_temp.error_of($1)", &[sql.into()])
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .unwrap_or_default()
    }

    fn assert_refused(sql: &str, sqlstate: &str, names: &str) {
        let got = error_of(sql);
        let parts: Vec<&str> = got.splitn(3, '|').collect();
        assert_eq!(parts.len(), 3, "{sql}: expected an error, got {got}");
        assert_eq!(parts[0], sqlstate, "{sql}: {got}");
        assert!(
            parts[1].contains(names),
            "{sql}: message should name {names}: {got}"
        );
        assert!(!parts[2].trim().is_empty(), "{sql}: no hint: {got}");
    }

    #[pg_test]
    fn statements_that_refuse_a_transaction_block_are_told_apart() {
        // What the import runs at top level: a statement that refuses a transaction block, or one
        // CALL; several ordinary statements run as one transaction, as under pg_cron.
        for (command, top_level) in [
            ("VACUUM", true),
            ("VACUUM (ANALYZE) t", true),
            ("ANALYZE t", false),
            ("SELECT 1; SELECT 2", false),
            ("CALL p()", true),
            ("CALL p(); SELECT 1", false),
            ("CREATE INDEX CONCURRENTLY i ON t (x)", true),
            ("CREATE INDEX i ON t (x)", false),
            ("REINDEX TABLE CONCURRENTLY t", true),
            ("REINDEX TABLE t", false),
            ("REINDEX DATABASE d", true),
            ("DROP INDEX CONCURRENTLY i", true),
            ("DROP INDEX i", false),
            ("CLUSTER", true),
            ("CLUSTER t USING i", false),
            ("DISCARD ALL", true),
            ("DISCARD TEMP", false),
            ("BEGIN; SELECT 1; COMMIT", true),
            ("ALTER SYSTEM SET work_mem = '1MB'", true),
            ("ALTER DATABASE d SET TABLESPACE s", true),
            ("ALTER DATABASE d SET work_mem = '1MB'", false),
            ("SELEC 1", false),
        ] {
            let got: bool = Spi::get_one_with_args::<bool>(
                "SELECT tide._needs_top_level($1)",
                &[command.into()],
            )
            .unwrap_or_else(|e| panic!("{command}: {e}"))
            .unwrap_or_else(|| panic!("{command}: NULL"));
            assert_eq!(got, top_level, "{command}");
        }
        let counts: String = one(
            "SELECT concat_ws(',', tide._statement_count('SELECT 1; SELECT 2;'), tide._statement_count('SELECT 1'),
                              tide._statement_count(''), tide._statement_count('SELEC 1'))",
        );
        assert_eq!(counts, "2,1,0,1");
        let thresholds: String = one(
            "SELECT concat_ws(',', tide._import_threshold('5 seconds'), tide._import_threshold(' 59 seconds '),
                              tide._import_threshold('* * * * *'), tide._import_threshold('@hourly'))",
        );
        assert_eq!(thresholds, "00:00:05,00:00:59,00:01:00,00:01:00");
    }

    #[pg_test]
    fn schedule_refuses_commands_that_could_only_fail_where_they_run() {
        assert_refused(
            "SELECT tide.schedule('n', '0 3 * * *', command => 'VACUUM big_table')",
            "22023",
            "task \"n\": VACUUM cannot run inside a transaction block",
        );
        assert_refused(
            "SELECT tide.schedule('n', '0 3 * * *', command => 'SELECT 1; CREATE INDEX CONCURRENTLY i ON t (x)')",
            "22023",
            "CREATE INDEX CONCURRENTLY cannot run",
        );
        assert_refused(
            "SELECT tide.schedule('n', '0 3 * * *', command => 'SELEC 1')",
            "42601",
            "task \"n\": the command does not parse: syntax error at or near \"SELEC\"",
        );
        assert_refused(
            "SELECT tide.schedule('n', '0 3 * * *', command => 'SELEC 1', top_level => true)",
            "42601",
            "does not parse",
        );
        let written: i64 = one("SELECT count(*) FROM tide.task");
        assert_eq!(written, 0);
        // Top-level: accepted; several ordinary statements too; a CALL too.
        run("SELECT tide.schedule('v', '0 3 * * *', command => 'VACUUM big_table', top_level => true)");
        run("SELECT tide.schedule('two', '0 3 * * *', command => 'SELECT 1; SELECT 2')");
        run("SELECT tide.schedule('call', '0 3 * * *', command => 'CALL p()')");
        assert_refused(
            "SELECT tide.alter('v', top_level => false)",
            "22023",
            "VACUUM cannot run inside a transaction block",
        );
        assert_refused(
            "SELECT tide.alter('two', command => 'VACUUM')",
            "22023",
            "VACUUM cannot run",
        );
        let versions: String =
            one("SELECT string_agg(name || version, ',' ORDER BY name) FROM tide.task");
        assert_eq!(versions, "call1,two1,v1");
    }

    #[pg_test]
    fn a_tasks_database_is_checked_when_the_task_is_made() {
        for (sql, sqlstate, names) in [
            (
                "SELECT tide.schedule('d', '@daily', 'SELECT 1', database => 'no_such_database')".to_string(),
                "3D000",
                "task \"d\": database \"no_such_database\" does not exist",
            ),
            (
                format!("SELECT tide.schedule('d', '@daily', 'SELECT 1', database => '{}')", "x".repeat(64)),
                "22023",
                "is too long (64 bytes, at most 63)",
            ),
            (
                "SELECT tide.schedule('d', '@daily', 'SELECT 1', database => 'template1')".to_string(),
                "22023",
                "database \"template1\" is a template",
            ),
            (
                "SELECT tide.schedule('d', '@daily', 'SELECT 1', database => 'template0')".to_string(),
                "22023",
                "database \"template0\" is a template",
            ),
            (
                "SELECT tide.schedule('d', '@daily', database => 'postgres')".to_string(),
                "22023",
                "database => 'postgres' needs an SQL command",
            ),
            (
                "SELECT tide.schedule('d', '@daily', 'SELECT NULL::jsonb', database => 'postgres', long => true)".to_string(),
                "22023",
                "cannot be a long task",
            ),
            (
                "SELECT tide.schedule('d', '@daily', 'SELECT 1', database => 'postgres', ready_watermark => 'now()', watermark_stable_for => '1 minute')".to_string(),
                "22023",
                "cannot be a watermark",
            ),
        ] {
            assert_refused(&sql, sqlstate, names);
        }
        let written: i64 = one("SELECT count(*) FROM tide.task");
        assert_eq!(written, 0);
        // This database, named or '', is the default: stored as NULL.
        run("SELECT tide.schedule('here', '@daily', 'SELECT 1', database => current_database())");
        run("SELECT tide.schedule('there', '@daily', 'SELECT 1', database => 'postgres')");
        let stored: String = one(
            "SELECT string_agg(name || '=' || coalesce(database, '-'), ',' ORDER BY name) FROM tide.task",
        );
        assert_eq!(stored, "here=-,there=postgres");
        run("SELECT tide.alter('there', database => '')");
        let back: String =
            one("SELECT coalesce(database, '-') || version FROM tide.task WHERE name = 'there'");
        assert_eq!(back, "-2", "back to this database, a new rule version");
    }

    #[pg_test]
    fn next_fires_follows_the_new_york_dst_rules() {
        let ok: bool = one(
            "SELECT array_agg(f) = ARRAY['2026-03-08 07:00Z', '2026-03-09 06:30Z']::timestamptz[]
               FROM tide.next_fires('30 2 * * *', 'America/New_York', '2026-03-07 12:00Z', 2) f",
        );
        assert!(ok);
        let ok: bool = one(
            "SELECT array_agg(f) = ARRAY['2026-11-01 05:00Z', '2026-11-01 06:00Z',
                                         '2026-11-01 07:00Z']::timestamptz[]
               FROM tide.next_fires('0 * * * *', 'America/New_York', '2026-11-01 04:30Z', 3) f",
        );
        assert!(ok);
        // The pg_cron/Temporal policy through named arguments.
        let ok: bool = one(
            "SELECT array_agg(f) = ARRAY['2026-11-01 05:30Z', '2026-11-01 06:30Z']::timestamptz[]
               FROM tide.next_fires('30 1 * * *', tz => 'America/New_York',
                                    after => '2026-10-31 12:00Z', n => 2,
                                    dst_overlap => 'both') f",
        );
        assert!(ok);
        let n: i64 = one("SELECT count(*) FROM tide.next_fires('* * * * *', n => 0)");
        assert_eq!(n, 0);
    }

    #[pg_test]
    fn next_fires_defaults_to_utc_after_now() {
        let ok: bool = one("SELECT bool_and(f > now()) AND count(*) = 5
               FROM tide.next_fires('*/5 * * * *') f");
        assert!(ok);
    }

    #[pg_test]
    fn next_fires_refuses_bad_input() {
        assert_refused(
            "SELECT tide.next_fires('61 * * * *')",
            "22023",
            "\"61 * * * *\"",
        );
        assert_refused(
            "SELECT tide.next_fires('0 0 30 2 *')",
            "22023",
            "never fires",
        );
        assert_refused("SELECT tide.next_fires('@reboot')", "22023", "\"@reboot\"");
        assert_refused(
            "SELECT tide.next_fires('0 1 * * *', 'Asia/Shangai')",
            "22023",
            "\"Asia/Shangai\"",
        );
        assert_refused(
            "SELECT tide.next_fires('0 1 * * *', n => -1)",
            "22023",
            "-1",
        );
        assert_refused(
            "SELECT tide.next_fires('0 1 * * *', n => 10001)",
            "22023",
            "10001",
        );
        assert_refused(
            "SELECT tide.next_fires('0 1 * * *', after => 'infinity')",
            "22008",
            "after is out of range (infinity)",
        );
        assert_refused(
            "SELECT tide.next_fires('0 1 * * *', dst_gap => 'later')",
            "22023",
            "\"later\"",
        );
        assert_refused("SELECT tide.next_fires(NULL)", "22004", "schedule");
        let hint = error_of("SELECT tide.next_fires('0 1 * * *', 'Asia/Shangai')");
        assert!(hint.contains("did you mean 'Asia/Shanghai'"), "{hint}");
    }

    #[pg_test]
    fn schedule_stores_canonical_rules_and_version_one() {
        let id: i64 = one("SELECT tide.schedule('daily_bill', '0 1 * * *', 'SELECT 1',
                                  tz => 'asia/shanghai', biz_window => 'DAY',
                                  args => '{\"region\": \"cn\"}')");
        assert!(id > 0);
        let row: String = one(
            "SELECT concat_ws(',', tz, biz_window, queue, version, dst_gap, dst_overlap,
                              owner = current_user, args->>'region', command)
               FROM tide.task WHERE name = 'daily_bill'",
        );
        assert_eq!(row, "Asia/Shanghai,day,default,1,shift,once,t,cn,SELECT 1");
        // next_fire_at is the next 01:00 in Shanghai after now.
        let ok: bool = one(
            "SELECT next_fire_at = (SELECT f FROM tide.next_fires('0 1 * * *', 'Asia/Shanghai') f LIMIT 1)
               FROM tide.task WHERE name = 'daily_bill'",
        );
        assert!(ok);
        let snap: String = one(
            "SELECT rules->>'schedule' || ' ' || (rules->>'tz') || ' ' || v.version
               FROM tide.task_version v JOIN tide.task USING (task_id)
              WHERE name = 'daily_bill'",
        );
        assert_eq!(snap, "0 1 * * * Asia/Shanghai 1");
    }

    /// The gaps between fires are worked out once per schedule and transaction (the last one
    /// kept): asked in turns in one transaction, each schedule and zone gets its own.
    #[pg_test]
    fn fire_gaps_in_one_transaction_are_each_schedules_own() {
        let got: String = one("SELECT concat_ws(',',
                    tide._fire_gap('*/5 * * * *', 'UTC', 'shift', 'once'),
                    tide._shortest_gap('0 9 * * 1-5', 'UTC', 'shift', 'once'),
                    tide._fire_gap('0 9 * * 1-5', 'UTC', 'shift', 'once'),
                    tide._shortest_gap('*/5 * * * *', 'UTC', 'shift', 'once'),
                    tide._fire_gap('*/5 * * * *', 'UTC', 'shift', 'once'),
                    tide._fire_gap('0 9 * * *', 'UTC', 'shift', 'once'),
                    tide._fire_gap('0 9 * * *', 'Asia/Shanghai', 'shift', 'once'))");
        assert_eq!(
            got,
            "00:05:00,24:00:00,72:00:00,00:05:00,00:05:00,24:00:00,24:00:00"
        );
        // Daily at 09:00 in New York, over the next 400 days (both DST changes of a year): the
        // shortest and longest gaps come from one walk, and differ from UTC's.
        let ny: String = one(
            "SELECT concat_ws(',', tide._fire_gap('0 9 * * *', 'America/New_York', 'shift', 'once'),
                                   tide._shortest_gap('0 9 * * *', 'America/New_York', 'shift', 'once'),
                                   tide._shortest_gap('0 9 * * *', 'UTC', 'shift', 'once'))",
        );
        assert_eq!(ny, "25:00:00,23:00:00,24:00:00");
        assert_refused(
            "SELECT tide._fire_gap('*/5 * * * *', 'Nowhere/Else', 'shift', 'once')",
            "22023",
            "Nowhere/Else",
        );
    }

    #[pg_test]
    fn schedule_refuses_bad_input_and_writes_nothing() {
        run("SELECT tide.schedule('taken', '@daily')");
        let cases = [
            (
                "SELECT tide.schedule('t1', '0 1 * * *', tz => 'Asia/Shangai')",
                "22023",
                "\"Asia/Shangai\"",
            ),
            (
                "SELECT tide.schedule('t1', '0 1 * *')",
                "22023",
                "\"0 1 * *\"",
            ),
            (
                "SELECT tide.schedule('t1', '0 0 30 2 *')",
                "22023",
                "\"0 0 30 2 *\"",
            ),
            ("SELECT tide.schedule('', '0 1 * * *')", "22023", "name"),
            ("SELECT tide.schedule('   ', '0 1 * * *')", "22023", "name"),
            (
                "SELECT tide.schedule('taken', '0 1 * * *')",
                "23505",
                "\"taken\"",
            ),
            (
                "SELECT tide.schedule('t1', '0 1 * * *', biz_window => 'fortnight')",
                "22023",
                "\"fortnight\"",
            ),
            (
                "SELECT tide.schedule('t1', '0 1 * * *', dst_gap => 'later')",
                "22023",
                "\"later\"",
            ),
            (
                "SELECT tide.schedule('t1', '0 1 * * *', dst_overlap => 'twice')",
                "22023",
                "\"twice\"",
            ),
            (
                "SELECT tide.schedule('t1', '0 1 * * *', queue => 'no spaces')",
                "22023",
                "\"no spaces\"",
            ),
            (
                "SELECT tide.schedule('t1', '0 1 * * *', args => '[1]')",
                "22023",
                "[1]",
            ),
            ("SELECT tide.schedule(NULL, '0 1 * * *')", "22004", "task"),
            ("SELECT tide.schedule('t1', NULL)", "22004", "schedule"),
            (
                "SELECT tide.schedule('t1', '@daily', replace => NULL)",
                "22004",
                "replace",
            ),
            (
                "SELECT tide.schedule('taken', '@hourly', replace => true, pending => 'later')",
                "22023",
                "\"later\"",
            ),
        ];
        for (sql, state, names) in cases {
            assert_refused(sql, state, names);
        }
        let tasks: i64 = one("SELECT count(*) FROM tide.task");
        let versions: i64 = one("SELECT count(*) FROM tide.task_version");
        assert_eq!((tasks, versions), (1, 1));
    }

    #[pg_test]
    fn schedule_again_is_a_no_op_and_replace_makes_a_new_version() {
        let define =
            "SELECT tide.schedule('deploy', '0 2 * * *', 'SELECT 1', tz => 'europe/berlin',
                                          max_attempts => 3, lock_key => 'k')";
        let id: i64 = one(define);
        let next: String = one("SELECT next_fire_at::text FROM tide.task");
        // The same definition, written differently (the zone's case), is the same task.
        assert_eq!(
            one::<i64>(define),
            id,
            "the same definition returns the same task_id"
        );
        assert_eq!(one::<i32>("SELECT max(version) FROM tide.task_version"), 1);
        // A different one is refused with a hint, and changes nothing.
        let refused = error_of(
            "SELECT tide.schedule('deploy', '0 3 * * *', 'SELECT 1', tz => 'Europe/Berlin')",
        );
        assert!(
            refused
                .starts_with("23505|task \"deploy\" already exists with a different definition|"),
            "{refused}"
        );
        assert!(refused.contains("replace => true"), "{refused}");
        let unchanged: String =
            one("SELECT concat_ws(',', schedule, max_attempts, lock_key, version) FROM tide.task");
        assert_eq!(unchanged, "0 2 * * *,3,k,1");
        // replace => true: the definition given, whole (options left out take their defaults).
        let replaced: i64 = one(
            "SELECT tide.schedule('deploy', '0 3 * * *', 'SELECT 2', tz => 'Europe/Berlin', replace => true)",
        );
        assert_eq!(replaced, id);
        let row: String = one(
            "SELECT concat_ws(',', schedule, command, max_attempts, coalesce(lock_key, '-'), version, next_fire_at::text <> $1)
               FROM tide.task"
                .replace("$1", &format!("'{next}'"))
                .as_str(),
        );
        assert_eq!(
            row, "0 3 * * *,SELECT 2,5,-,2,t",
            "new rules, version 2, next fire moved"
        );
        // Replacing with what is there already makes no version.
        one::<i64>("SELECT tide.schedule('deploy', '0 3 * * *', 'SELECT 2', tz => 'Europe/Berlin', replace => true)");
        assert_eq!(one::<i32>("SELECT max(version) FROM tide.task_version"), 2);
    }

    #[pg_test]
    fn alter_changes_only_what_is_given_and_versions_every_change() {
        run("SELECT tide.schedule('sync', '0 * * * *', 'SELECT 1', tz => 'America/New_York')");
        let v: i32 = one("SELECT tide.alter('sync', tz => 'Europe/London')");
        assert_eq!(v, 2);
        let row: String = one("SELECT concat_ws(',', schedule, tz, command, version) FROM tide.task WHERE name = 'sync'");
        assert_eq!(row, "0 * * * *,Europe/London,SELECT 1,2");
        // Nothing given, or the same values again: no new version.
        let v: i32 = one("SELECT tide.alter('sync')");
        assert_eq!(v, 2);
        let v: i32 =
            one("SELECT tide.alter('sync', tz => 'Europe/London', schedule => '0 * * * *')");
        assert_eq!(v, 2);
        // An empty command removes it.
        let v: i32 = one("SELECT tide.alter('sync', command => '')");
        assert_eq!(v, 3);
        let has_command: bool =
            one("SELECT command IS NOT NULL FROM tide.task WHERE name = 'sync'");
        assert!(!has_command);
        // Old versions keep their rules.
        let old_tz: String = one("SELECT string_agg(rules->>'tz', ',' ORDER BY v.version)
               FROM tide.task_version v JOIN tide.task USING (task_id) WHERE name = 'sync'");
        assert_eq!(old_tz, "America/New_York,Europe/London,Europe/London");
        // The next fire follows a new schedule.
        run("SELECT tide.alter('sync', schedule => '0 3 * * *')");
        let ok: bool = one(
            "SELECT next_fire_at = (SELECT f FROM tide.next_fires('0 3 * * *', 'Europe/London') f LIMIT 1)
               FROM tide.task WHERE name = 'sync'",
        );
        assert!(ok);
    }

    #[pg_test]
    fn alter_refuses_bad_input_and_changes_nothing() {
        run("SELECT tide.schedule('sync', '0 * * * *', tz => 'America/New_York')");
        assert_refused(
            "SELECT tide.alter('sync', tz => 'Mars/Olympus')",
            "22023",
            "\"Mars/Olympus\"",
        );
        assert_refused(
            "SELECT tide.alter('sync', schedule => '0 0 31 4 *')",
            "22023",
            "never fires",
        );
        assert_refused(
            "SELECT tide.alter('nope', tz => 'UTC')",
            "42704",
            "\"nope\"",
        );
        assert_refused("SELECT tide.alter(NULL)", "22004", "task");
        let row: String =
            one("SELECT concat_ws(',', schedule, tz, version) FROM tide.task WHERE name = 'sync'");
        assert_eq!(row, "0 * * * *,America/New_York,1");
    }

    #[pg_test]
    fn pause_and_resume_are_not_rule_changes() {
        run("SELECT tide.schedule('report', '0 23 L * *', tz => 'Asia/Shanghai')");
        assert!(one::<bool>("SELECT tide.pause('report')"));
        assert!(!one::<bool>("SELECT tide.pause('report')"));
        let row: String =
            one("SELECT concat_ws(',', paused, paused_at IS NOT NULL, version) FROM tide.task");
        assert_eq!(row, "t,t,1");
        assert!(one::<bool>("SELECT tide.resume('report')"));
        assert!(!one::<bool>("SELECT tide.resume('report')"));
        let row: String = one("SELECT concat_ws(',', paused, paused_at IS NULL, next_fire_at > now(), version) FROM tide.task");
        assert_eq!(row, "f,t,t,1");
        assert_refused("SELECT tide.pause('nope')", "42704", "\"nope\"");
        assert_refused("SELECT tide.resume('nope')", "42704", "\"nope\"");
    }

    #[pg_test]
    fn unschedule_deletes_the_task_and_its_versions() {
        run("SELECT tide.schedule('gone', '@hourly')");
        run("SELECT tide.alter('gone', schedule => '@daily')");
        assert!(one::<bool>("SELECT tide.unschedule('gone')"));
        let left: i64 = one(
            "SELECT (SELECT count(*) FROM tide.task) + (SELECT count(*) FROM tide.task_version)",
        );
        assert_eq!(left, 0);
        assert!(
            !one::<bool>("SELECT tide.unschedule('gone')"),
            "nothing by that name: false, so a teardown can run twice"
        );
        assert_refused("SELECT tide.unschedule(NULL)", "22004", "task");
    }

    #[pg_test]
    fn versions_are_immutable_and_direct_updates_are_versioned() {
        run("SELECT tide.schedule('v', '@daily')");
        assert_refused(
            "UPDATE tide.task_version SET rules = '{}'",
            "55000",
            "immutable",
        );
        run("UPDATE tide.task SET queue = 'bulk' WHERE name = 'v'");
        let v: String = one(
            "SELECT string_agg(version || ':' || (rules->>'queue'), ',' ORDER BY version)
               FROM tide.task_version",
        );
        assert_eq!(v, "1:default,2:bulk");
    }

    #[pg_test]
    fn each_role_sees_and_changes_only_its_own_tasks() {
        run("CREATE ROLE tide_alice; CREATE ROLE tide_bob;");
        run("SET ROLE tide_alice");
        run("SELECT tide.schedule('alice_job', '@daily')");
        run("RESET ROLE");
        run("SET ROLE tide_bob");
        let seen: i64 = one("SELECT count(*) FROM tide.task");
        assert_eq!(seen, 0);
        let versions: i64 = one("SELECT count(*) FROM tide.task_version");
        assert_eq!(versions, 0);
        assert_refused(
            "SELECT tide.alter('alice_job', tz => 'UTC')",
            "42704",
            "\"alice_job\"",
        );
        assert!(
            !one::<bool>("SELECT tide.unschedule('alice_job')"),
            "another role's task is not there to remove"
        );
        assert_refused("SELECT tide.pause('alice_job')", "42704", "\"alice_job\"");
        // A role writes pg_tide's tables only through its functions.
        let planted = error_of(
            "INSERT INTO tide.task (name, schedule, owner) VALUES ('x', '@daily', 'tide_alice')",
        );
        assert!(
            planted.starts_with("42501|permission denied for table task"),
            "{planted}"
        );
        run("SELECT tide.schedule('bob_job', '@hourly')");
        run("RESET ROLE");
        let owners: String =
            one("SELECT string_agg(name || '=' || owner, ',' ORDER BY name) FROM tide.task");
        assert_eq!(owners, "alice_job=tide_alice,bob_job=tide_bob");
    }

    #[pg_test]
    fn preview_shows_fires_windows_and_biz_dates() {
        run("SELECT tide.schedule('daily_bill', '0 1 * * *', tz => 'Asia/Shanghai', biz_window => 'day')");
        let first: String = one(
            "SELECT concat_ws(' | ', fire_at AT TIME ZONE 'UTC', fire_local, window_start AT TIME ZONE 'UTC',
                              window_end AT TIME ZONE 'UTC', window_start_local, window_length, biz_date)
               FROM tide.preview('daily_bill', 1, after => '2026-05-09 12:00Z')",
        );
        assert_eq!(
            first,
            "2026-05-09 17:00:00 | 2026-05-10 01:00:00 | 2026-05-08 16:00:00 | 2026-05-09 16:00:00 | 2026-05-09 00:00:00 | 24:00:00 | 2026-05-09"
        );
        // A New York day window across the spring-forward day is 23 hours long.
        run("SELECT tide.schedule('ny_daily', '0 1 * * *', tz => 'America/New_York', biz_window => 'day')");
        let lengths: String = one(
            "SELECT string_agg(biz_date || '=' || window_length, ',' ORDER BY fire_at)
               FROM tide.preview('ny_daily', 3, after => '2026-03-07 12:00Z')",
        );
        assert_eq!(
            lengths,
            "2026-03-07=24:00:00,2026-03-08=23:00:00,2026-03-09=24:00:00"
        );
        let n: i64 = one("SELECT count(*) FROM tide.preview('ny_daily')");
        assert_eq!(n, 5);
        assert_refused("SELECT * FROM tide.preview('nope')", "42704", "\"nope\"");
        assert_refused("SELECT * FROM tide.preview('ny_daily', -2)", "22023", "-2");
    }

    /// The WHEN clause of the trigger run_changed (tide._run_change_fires, in C): an update
    /// calls tide._run_changed when the state, reason, run_after, queue, priority or executor
    /// changes (NULLs compared as IS DISTINCT FROM does), never for other columns (a heartbeat),
    /// and, while tide.history = 'written', not for the hot paths' own changes: ready to
    /// running, running to succeeded, need_check, retry, dead or waiting.
    #[pg_test]
    fn run_changed_fires_for_the_changes_it_records() {
        // Each case: a change applied to a base row, and whether the trigger must fire.
        let decide = |base: &str, cases: &[(&str, bool)]| {
            for (change, expected) in cases {
                let fires: bool = one(&format!(
                    "SELECT tide._run_change_fires(b, jsonb_populate_record(b, '{change}'))
                       FROM jsonb_populate_record(NULL::tide.run, '{base}') b"
                ));
                let history =
                    Spi::get_one::<String>("SELECT current_setting('tide.history', true)")
                        .ok()
                        .flatten()
                        .unwrap_or_default();
                assert_eq!(
                    fires, *expected,
                    "from {base} by {change}, tide.history = '{history}'"
                );
            }
        };
        let long = "x".repeat(5000);
        let ready = format!(
            r#"{{"run_id": 1, "state": "ready", "reason": "{long}", "queue": "q", "priority": 0,
                "executor": "sql", "updated_at": "2026-01-01T00:00:00Z"}}"#
        );
        let running = r#"{"run_id": 1, "state": "running", "reason": "claimed", "queue": "q",
                          "priority": 0, "executor": "sql", "run_after": "2026-01-01T00:00:00Z"}"#;
        let anyway: [(&str, bool); 9] = [
            ("{}", false),
            (
                r#"{"updated_at": "2026-01-02T00:00:00Z", "lease_expires_at": "2026-01-02T00:00:00Z"}"#,
                false,
            ),
            (r#"{"reason": "other"}"#, true),
            (r#"{"run_after": "2026-01-02T00:00:00Z"}"#, true),
            (r#"{"queue": "other"}"#, true),
            (r#"{"priority": 5}"#, true),
            (r#"{"executor": "external"}"#, true),
            (r#"{"state": "skipped"}"#, true),
            (r#"{"reason": null}"#, true),
        ];
        // STRICT: no row, no decision (PostgreSQL always passes both).
        let none: Option<bool> = Spi::get_one("SELECT tide._run_change_fires(NULL, NULL)")
            .unwrap_or_else(|e| panic!("NULL rows: {e}"));
        assert_eq!(none, None);
        decide(&ready, &anyway);
        decide(&ready, &[(r#"{"state": "running"}"#, true)]);
        decide(
            running,
            &[
                (r#"{"state": "succeeded"}"#, true),
                (r#"{"run_after": null}"#, true),
            ],
        );
        run("SELECT set_config('tide.history', 'written', true)");
        decide(&ready, &anyway);
        decide(
            &ready,
            &[
                (r#"{"state": "running", "reason": "claimed"}"#, false),
                (r#"{"state": "cancelled"}"#, true),
            ],
        );
        decide(
            running,
            &[
                (r#"{"state": "succeeded", "reason": "done"}"#, false),
                (r#"{"state": "need_check"}"#, false),
                (r#"{"state": "retry"}"#, false),
                (r#"{"state": "dead"}"#, false),
                (r#"{"state": "waiting"}"#, false),
                (r#"{"state": "cancelled"}"#, true),
                (r#"{"state": "paused"}"#, true),
                (r#"{"reason": "still running"}"#, true),
            ],
        );
    }
}

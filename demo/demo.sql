-- pg_tide demo: run by `make demo` against a fresh cluster with pg_tide preloaded.
\pset footer off
\pset null '(none)'
\echo
\echo '== CREATE EXTENSION pg_tide'
CREATE EXTENSION pg_tide;
SELECT extname, extversion FROM pg_extension WHERE extname = 'pg_tide';

\echo
\echo '== Three realistic tasks, each in its own time zone'
\echo '   daily_bill:       every day 01:00 Asia/Shanghai, covering the previous local day'
\echo '   month_end_report: 06:00 on the 1st, Europe/London, covering the previous month'
\echo '   ny_sync:          every hour, America/New_York, covering the previous hour'
SELECT tide.schedule('daily_bill', '0 1 * * *', tz => 'Asia/Shanghai', biz_window => 'day',
                     queue => 'billing', args => '{"ledger": "cn-main"}') AS daily_bill_id;
SELECT tide.schedule('month_end_report', '0 6 1 * *', tz => 'Europe/London',
                     biz_window => 'month', queue => 'reports') AS month_end_report_id;
SELECT tide.schedule('ny_sync', '@hourly', tz => 'America/New_York', biz_window => 'hour',
                     queue => 'sync') AS ny_sync_id;

SELECT name, schedule, tz, biz_window, queue, version,
       to_char(next_fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI"Z"') AS next_fire_utc
  FROM tide.task ORDER BY task_id;

\echo
\echo '== Their next fires from now, in UTC and local time, with the business window covered'
SELECT t.name,
       to_char(p.fire_at AT TIME ZONE 'UTC', 'MM-DD HH24:MI"Z"') AS fire_utc,
       to_char(p.fire_local, 'MM-DD HH24:MI') AS fire_local,
       to_char(p.window_start_local, 'MM-DD HH24:MI') || ' .. ' ||
       to_char(p.window_end_local, 'MM-DD HH24:MI') AS local_window,
       p.window_length, p.biz_date
  FROM tide.task t, LATERAL tide.preview(t.name, 3) p
 ORDER BY t.task_id, p.fire_at;

\echo
\echo '== Across DST: ny_sync around the 2026-11-01 fall back in New York'
\echo '   01:00 happens twice (EDT then EST): an hourly job fires at both, each covering a real hour'
SET timezone = 'America/New_York';
SELECT to_char(fire_at AT TIME ZONE 'UTC', 'MM-DD HH24:MI"Z"') AS fire_utc,
       to_char(fire_at, 'HH24:MI TZ') AS ny_time,
       to_char(window_start, 'HH24:MI TZ') || ' .. ' || to_char(window_end, 'HH24:MI TZ') AS ny_window,
       window_length, biz_date
  FROM tide.preview('ny_sync', 4, after => '2026-11-01 04:30Z');
RESET timezone;

\echo
\echo '== Across DST: a daily New York job covering the previous day; 2026-03-08 has 23 hours'
SELECT tide.schedule('ny_daily_close', '0 1 * * *', tz => 'America/New_York', biz_window => 'day') AS ny_daily_close_id;
SELECT to_char(fire_at AT TIME ZONE 'UTC', 'MM-DD HH24:MI"Z"') AS fire_utc,
       to_char(fire_local, 'MM-DD HH24:MI') AS fire_local,
       biz_date, window_length
  FROM tide.preview('ny_daily_close', 3, after => '2026-03-07 12:00Z');

\echo
\echo '== The DST policy of fixed-time jobs: 02:30 does not exist on 2026-03-08 in New York'
SELECT 'shift (default)' AS dst_gap, string_agg(to_char(f AT TIME ZONE 'UTC', 'MM-DD HH24:MI"Z"'), ', ') AS fires
  FROM tide.next_fires('30 2 * * *', 'America/New_York', '2026-03-07 12:00Z', 2) f
UNION ALL
SELECT 'skip', string_agg(to_char(f AT TIME ZONE 'UTC', 'MM-DD HH24:MI"Z"'), ', ')
  FROM tide.next_fires('30 2 * * *', 'America/New_York', '2026-03-07 12:00Z', 2, dst_gap => 'skip') f;

\echo
\echo '== Month ends are calendar facts: the last day of each month, and 29 February'
SELECT string_agg(to_char(f, 'YYYY-MM-DD'), ', ') AS last_day_of_month
  FROM tide.next_fires('0 0 L * *', 'UTC', '2028-01-15', 4) f;

\echo
\echo '== Rules are versioned: changing the bill run''s args makes version 2'
SELECT tide.alter('daily_bill', args => '{"ledger": "cn-main", "currency": "CNY"}') AS new_version;
SELECT v.version, v.rules->>'schedule' AS schedule, v.rules->>'tz' AS tz, v.rules->'args' AS args
  FROM tide.task_version v JOIN tide.task t USING (task_id)
 WHERE t.name = 'daily_bill' ORDER BY v.version;

\echo
\echo '== Bad input is refused (SQLSTATE 22023) with the value named and a hint; nothing is written'
\set ON_ERROR_STOP 0
\set VERBOSITY default
SELECT tide.schedule('typo', '0 1 * * *', tz => 'Asia/Shangai');
SELECT tide.schedule('never', '0 0 30 2 *');
\set ON_ERROR_STOP 1
SELECT count(*) AS tasks FROM tide.task;

\echo
\echo '== Runs happen: the scheduler worker creates runs on time, executor workers run SQL commands'
CREATE TABLE demo_rollup (run_id bigint PRIMARY KEY, window_start timestamptz, window_end timestamptz);
-- Waits (polling, with a deadline) until a condition holds: the demo watches the real workers.
CREATE PROCEDURE demo_wait(condition text, seconds int DEFAULT 30) LANGUAGE plpgsql AS $$
DECLARE deadline timestamptz := clock_timestamp() + make_interval(secs => seconds); ok boolean;
BEGIN
    LOOP
        EXECUTE 'SELECT ' || condition INTO ok;
        EXIT WHEN ok;
        IF clock_timestamp() > deadline THEN
            RAISE EXCEPTION 'demo: timed out after % s waiting for %', seconds, condition;
        END IF;
        PERFORM pg_sleep(0.2);
    END LOOP;
END $$;
SELECT tide.schedule('rollup_5s', '*/5 * * * * *',
    command => 'INSERT INTO demo_rollup VALUES (tide.run_id(), tide.window_start(), tide.window_end())');
CALL demo_wait($$(SELECT count(*) >= 2 FROM tide.run r JOIN tide.task t USING (task_id)
                     WHERE t.name = 'rollup_5s' AND r.state = 'succeeded')$$);
SELECT tide.pause('rollup_5s');
SELECT r.run_id, r.trigger, r.state, to_char(r.window_start, 'HH24:MI:SS') AS window_from,
       to_char(r.window_end, 'HH24:MI:SS') AS window_to, r.reason
  FROM tide.run r JOIN tide.task t USING (task_id)
 WHERE t.name = 'rollup_5s' AND r.state = 'succeeded' ORDER BY r.run_id LIMIT 3;

\echo
\echo '== A retry: the bank sync hits a serialization failure (transient), backs off 1 s, succeeds'
CREATE TABLE demo_bank (biz_date date PRIMARY KEY, synced_at timestamptz);
CREATE FUNCTION demo_bank_sync() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT attempts FROM tide.run WHERE run_id = tide.run_id()) = 1 THEN
        RAISE EXCEPTION 'could not serialize access due to concurrent update'
            USING ERRCODE = 'serialization_failure';
    END IF;
    INSERT INTO demo_bank VALUES (tide.biz_date(), now());
END $$;
SELECT tide.schedule('bank_sync', '0 2 * * *', tz => 'Asia/Shanghai', biz_window => 'day',
                     command => 'SELECT demo_bank_sync()',
                     max_attempts => 3, backoff_base => '1 second', jitter => 'none');
\echo '   rerun by explicit business date (never "today minus one"):'
SELECT tide.rerun('bank_sync', biz_date => DATE '2026-11-01') AS run_id \gset
CALL demo_wait($$(SELECT state = 'succeeded' FROM tide.run WHERE run_id = $$ || :run_id || $$)$$);
SELECT attempt, outcome, error_kind, sqlstate, error FROM tide.attempt WHERE run_id = :run_id ORDER BY attempt;

\echo
\echo '== A dead letter: a business error is not retried; fix the data, then replay from psql'
CREATE TABLE demo_customers (id int PRIMARY KEY, billing_address text);
INSERT INTO demo_customers VALUES (42, NULL);
CREATE TABLE demo_invoices (biz_date date, customer int, address text, UNIQUE (biz_date, customer));
SELECT tide.schedule('invoice_export', '0 3 * * *', biz_window => 'day', command => $cmd$
    SELECT CASE WHEN billing_address IS NULL
                THEN tide.business_error('customer ' || id || ' has no billing address') END
      FROM demo_customers;
    INSERT INTO demo_invoices SELECT tide.biz_date(), id, billing_address FROM demo_customers
        ON CONFLICT DO NOTHING
$cmd$);
SELECT tide.rerun('invoice_export', biz_date => DATE '2026-11-01') AS run_id \gset
CALL demo_wait($$(SELECT state = 'dead' FROM tide.run WHERE run_id = $$ || :run_id || $$)$$);
\x on
SELECT run_id, task, version, biz_date, args, attempts, last_error_kind, last_error, attempt_errors
  FROM tide.dead_letter WHERE run_id = :run_id;
\x off
UPDATE demo_customers SET billing_address = '1 Harbour Road' WHERE id = 42;
SELECT tide.replay_run(:run_id);
CALL demo_wait($$(SELECT state = 'succeeded' FROM tide.run WHERE run_id = $$ || :run_id || $$)$$);
\echo '   its whole history, from tide.run_event:'
SELECT to_char(at, 'HH24:MI:SS.MS') AS at, from_state, to_state, reason
  FROM tide.run_event WHERE run_id = :run_id ORDER BY event_id;
\echo '   a second replay of a succeeded run is refused unless forced (it would write again):'
\set ON_ERROR_STOP 0
SELECT tide.replay_run(:run_id);
\set ON_ERROR_STOP 1
SELECT * FROM demo_invoices;

\echo
\echo '== Event tasks: a table change emits an event in the writing transaction; runs of one customer'
\echo '   go one at a time, in order, under the customer''s lock'
CREATE TABLE demo_orders (id int PRIMARY KEY, customer int NOT NULL, total int NOT NULL);
CREATE TABLE demo_shipments (order_id int PRIMARY KEY, customer int, seq bigint GENERATED ALWAYS AS IDENTITY);
SELECT tide.schedule('ship_order', NULL, topics => ARRAY['order.changed'], lock_key => 'customer:{key}',
    command => $$INSERT INTO demo_shipments (order_id, customer)
                 VALUES ((tide.payload()->'row'->>'id')::int, tide.event_key()::int) ON CONFLICT DO NOTHING$$);
SELECT tide.create_emit_trigger('demo_orders', 'order.changed', 'customer');
INSERT INTO demo_orders VALUES (1, 7, 10), (2, 7, 20), (3, 8, 30);
BEGIN;
INSERT INTO demo_orders VALUES (4, 9, 40);
ROLLBACK;
\echo '   (the rolled-back order 4 emitted nothing)'
CALL demo_wait($$(SELECT count(*) = 3 FROM tide.run r JOIN tide.task t USING (task_id)
                   WHERE t.name = 'ship_order' AND r.state = 'succeeded')$$);
SELECT r.run_id, r.event_key AS customer, r.payload->'row'->>'id' AS order_id, r.lock_key, r.state
  FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'ship_order' ORDER BY r.run_id;
SELECT order_id, customer, seq FROM demo_shipments ORDER BY seq;
\echo '   the same event twice with a dedupe key: the second emit creates nothing'
SELECT tide.emit('order.changed', '{"row": {"id": 5}}', event_key => '8', dedupe_key => 'order:5') AS first,
       tide.emit('order.changed', '{"row": {"id": 5}}', event_key => '8', dedupe_key => 'order:5') AS again;

\echo
\echo '== A long task: a backfill of 1000 rows in batches of 100, at most 5 batches a second,'
\echo '   each batch committed with its checkpoint; paused and resumed from psql'
CREATE TABLE demo_events (id int PRIMARY KEY, region text);
INSERT INTO demo_events SELECT g, NULL FROM generate_series(1, 1000) g;
CREATE FUNCTION demo_backfill(ck jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE last int := coalesce((ck->>'last_id')::int, 0);
BEGIN
    IF last >= 1000 THEN RETURN NULL; END IF;          -- done
    UPDATE demo_events SET region = CASE WHEN id % 2 = 0 THEN 'eu' ELSE 'us' END
     WHERE id > last AND id <= last + 100;
    RETURN jsonb_build_object('last_id', last + 100);
END $$;
SELECT tide.schedule('backfill_region', NULL, 'SELECT demo_backfill(tide.checkpoint())',
                     topics => ARRAY['backfill.region'], long => true, batch_rate => 5);
SELECT tide.emit('backfill.region');
SELECT r.run_id AS long_run FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name = 'backfill_region' \gset
CALL demo_wait($$(SELECT batches >= 2 FROM tide.run WHERE run_id = $$ || :long_run || $$)$$);
SELECT tide.pause_run(:long_run);
CALL demo_wait($$(SELECT state = 'paused' FROM tide.run WHERE run_id = $$ || :long_run || $$)$$);
SELECT run_id, state, batches, checkpoint, (SELECT count(region) FROM demo_events) AS rows_done
  FROM tide.run WHERE run_id = :long_run;
SELECT tide.resume_run(:long_run);
CALL demo_wait($$(SELECT state = 'succeeded' FROM tide.run WHERE run_id = $$ || :long_run || $$)$$);
SELECT run_id, state, batches, checkpoint, (SELECT count(region) FROM demo_events) AS rows_done
  FROM tide.run WHERE run_id = :long_run;

\echo
\echo '== Coming from pg_cron: three pg_cron jobs, one sent to the application database, the report of'
\echo '   what they become and how they will differ, then the import'
\c pg_tide_demo_app
CREATE TABLE demo_sessions (id int PRIMARY KEY, expires_at timestamptz);
INSERT INTO demo_sessions VALUES (1, now() - interval '1 hour'), (2, now() - interval '1 minute'), (3, now() + interval '1 hour');
\c pg_tide_demo
CREATE EXTENSION pg_cron;
CREATE TABLE demo_cron_daily (day date PRIMARY KEY, events bigint);
SELECT cron.schedule('nightly-vacuum', '30 3 * * *', 'VACUUM (ANALYZE) demo_events') AS jobid;
SELECT cron.schedule_in_database('purge-sessions', '*/10 * * * *', 'DELETE FROM demo_sessions WHERE expires_at < now()',
                                 'pg_tide_demo_app') AS jobid;
SELECT cron.schedule('daily-count', '0 1 * * *', 'DELETE FROM demo_cron_daily WHERE day = current_date - 1;
                     INSERT INTO demo_cron_daily SELECT current_date - 1, count(*) FROM demo_events') AS jobid;
SELECT jobid, jobname, task, database, top_level, settings->>'max_attempts' AS attempts, settings->>'misfire' AS misfire,
       settings->>'timeout' AS timeout, action
  FROM tide.import_pg_cron();
\echo '   how purge-sessions will behave differently, in words:'
SELECT d AS differences FROM tide.import_pg_cron() i, unnest(i.differences) d WHERE i.jobname = 'purge-sessions';
\echo '   apply: the tasks are created and the jobs leave pg_cron, in one transaction'
SELECT task, action FROM tide.import_pg_cron(apply => true);
SELECT count(*) AS jobs_left_in_pg_cron FROM cron.job;
\echo '   run now: the VACUUM at top level, the purge in pg_tide_demo_app, the two statements as one transaction;'
\echo '   pg_cron''s own view of runs, as tide.job_run_details:'
SELECT tide.rerun('nightly-vacuum') AS vac_run \gset
SELECT tide.rerun('purge-sessions') AS purge_run \gset
SELECT tide.rerun('daily-count') AS rollup_run \gset
CALL demo_wait($$(SELECT count(*) = 3 FROM tide.run WHERE run_id IN ($$ || :vac_run || ',' || :purge_run || ',' || :rollup_run
               || $$) AND state IN ('succeeded', 'dead'))$$);
SELECT jobname, database, status, return_message, end_time - start_time AS took
  FROM tide.job_run_details WHERE run_id IN (:vac_run, :purge_run, :rollup_run) ORDER BY jobid;
SELECT s.last_vacuum IS NOT NULL AS demo_events_vacuumed FROM pg_stat_user_tables s WHERE s.relname = 'demo_events';
\echo '   pasted as a pg_cron user writes it, a VACUUM that could only fail in a transaction is refused at once:'
\set ON_ERROR_STOP off
SELECT tide.schedule('vacuum-again', '0 4 * * *', command => 'VACUUM demo_events');
\set ON_ERROR_STOP on

\echo
\echo '== One-off and delayed jobs: an invoice mail now, its reminder in 3 seconds, 20 statements in one call'
CREATE TABLE demo_mails (n serial, recipient text, kind text, sent_at timestamptz);
SELECT tide.schedule('send_mail', NULL, topics => ARRAY['mail.none'],
    command => $$INSERT INTO demo_mails (recipient, kind, sent_at)
                 VALUES (tide.args()->>'to', tide.args()->>'kind', clock_timestamp())$$);
SELECT tide.enqueue('send_mail', '{"to": "ana@example.com", "kind": "invoice"}') AS invoice_run;
SELECT tide.enqueue('send_mail', '{"to": "ana@example.com", "kind": "reminder"}',
                    run_at => now() + interval '3 seconds', dedupe_key => 'reminder:ana:2026-11') AS reminder_run \gset
\echo '   enqueued again with the same dedupe key: the same run, nothing new'
SELECT tide.enqueue('send_mail', '{"to": "ana@example.com", "kind": "reminder"}', dedupe_key => 'reminder:ana:2026-11') = :reminder_run AS same_run;
SELECT count(*) AS statements_enqueued FROM tide.enqueue('send_mail',
    (SELECT jsonb_agg(jsonb_build_object('to', 'customer' || g || '@example.com', 'kind', 'statement'))
       FROM generate_series(1, 20) g));
CALL demo_wait($$(SELECT count(*) = 22 FROM demo_mails)$$);
SELECT kind, count(*) AS sent FROM demo_mails GROUP BY kind ORDER BY kind;
SELECT r.trigger, r.state, to_char(m.sent_at - r.created_at, 'SS.MS" s after enqueue"') AS reminder_sent
  FROM tide.run r, demo_mails m WHERE r.run_id = :reminder_run AND m.kind = 'reminder';

\echo
\echo '== A queue limit holding: the partner API takes one call at a time, whichever executor runs it'
CREATE TABLE demo_calls (n int PRIMARY KEY, started timestamptz, ended timestamptz);
SELECT tide.create_queue('partner_api', max_concurrency => 1, retry_budget => 20, retry_window => '10 minutes');
SELECT tide.schedule('call_partner', NULL, topics => ARRAY['partner.none'], queue => 'partner_api',
    command => $$INSERT INTO demo_calls SELECT s.n, s.started, clock_timestamp()
                   FROM (SELECT (tide.args()->>'n')::int AS n, clock_timestamp() AS started, pg_sleep(0.3)) s$$);
SELECT count(*) AS calls_enqueued FROM tide.enqueue('call_partner',
    (SELECT jsonb_agg(jsonb_build_object('n', g)) FROM generate_series(1, 6) g));
CALL demo_wait($$(SELECT count(*) = 6 FROM demo_calls)$$);
SELECT count(*) AS calls, (SELECT count(*) FROM demo_calls a JOIN demo_calls b ON a.n < b.n
                            WHERE a.started < b.ended AND b.started < a.ended) AS overlapping_calls
  FROM demo_calls;
SELECT name, max_concurrency, retry_budget, retry_window FROM tide.queue;

\echo
\echo '== Readiness by watermark: the daily report waits until the orders have stopped changing'
\echo '   (the latest updated_at the same for 3 seconds); the loader is still writing'
CREATE TABLE demo_loads (id int PRIMARY KEY, updated_at timestamptz NOT NULL DEFAULT clock_timestamp());
SELECT tide.schedule('orders_report', '0 2 * * *', biz_window => 'day',
    command => 'SELECT count(*) FROM demo_loads',
    ready_watermark => '(SELECT max(updated_at) FROM demo_loads)', watermark_stable_for => '3 seconds',
    recheck_interval => '1 second');
INSERT INTO demo_loads (id) VALUES (1);
SELECT tide.rerun('orders_report', biz_date => DATE '2026-11-20') AS wm_run \gset
CALL demo_wait($$(SELECT watermark IS NOT NULL FROM tide.run WHERE run_id = $$ || :wm_run || $$)$$);
INSERT INTO demo_loads (id) VALUES (2);
SELECT pg_sleep(1.5);
\echo '   still waiting: the watermark moved'
SELECT run_id, state, reason FROM tide.run WHERE run_id = :wm_run;
CALL demo_wait($$(SELECT state = 'succeeded' FROM tide.run WHERE run_id = $$ || :wm_run || $$)$$);
\echo '   the load stopped; 3 seconds later the report ran. Its story:'
SELECT line AS story FROM tide.explain(:wm_run) AS line WHERE line LIKE 'watermark:%' OR line LIKE '%-> %';

\echo
\echo '== A fallback scan: order 5 was inserted with the emitting trigger disabled (a migration'
\echo '   forgot it); the hourly scan finds the event that was never emitted, runs it, and alerts'
CREATE TABLE demo_paid (id int PRIMARY KEY);
CREATE TABLE demo_shipped (id int PRIMARY KEY);
CREATE FUNCTION demo_paid_emit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tide.emit('order.shippable', jsonb_build_object('id', NEW.id), NEW.id::text, NEW.id::text);
    RETURN NULL;
END $$;
CREATE TRIGGER demo_paid_emit AFTER INSERT ON demo_paid FOR EACH ROW EXECUTE FUNCTION demo_paid_emit();
SELECT tide.schedule('ship', '0 * * * *', topics => ARRAY['order.shippable'],
    command => $$INSERT INTO demo_shipped VALUES ((tide.payload()->>'id')::int)$$,
    fallback => 'SELECT id::text AS key, jsonb_build_object(''id'', id) AS payload FROM demo_paid');
INSERT INTO demo_paid SELECT g FROM generate_series(1, 4) g;
ALTER TABLE demo_paid DISABLE TRIGGER demo_paid_emit;
INSERT INTO demo_paid VALUES (5);
ALTER TABLE demo_paid ENABLE TRIGGER demo_paid_emit;
SELECT tide.rerun('ship') AS scan_run \gset
CALL demo_wait($$(SELECT count(*) = 5 FROM demo_shipped)$$);
SELECT run_id, state, result FROM tide.run WHERE run_id = :scan_run;
SELECT array_agg(id ORDER BY id) AS shipped FROM demo_shipped;
CALL demo_wait($$(SELECT count(*) > 0 FROM tide.alert WHERE kind = 'events_lost' AND resolved_at IS NULL)$$);
SELECT subject, kind, severity, details->'keys' AS lost_keys FROM tide.alert WHERE kind = 'events_lost';

\echo
\echo '== A backfill: 90 days of a daily total recomputed after a fix, isolated from online work.'
\echo '   A read-only precheck first, then a canary day run and verified, then batches of 10, two'
\echo '   at a time, in its own queue below every online run (an online pulse fires every 2 seconds)'
CREATE TABLE demo_daily (day date PRIMARY KEY, total int NOT NULL);
SELECT tide.schedule('daily_total', '0 1 * * *', biz_window => 'day', overlap => 'allow',
    command => $$INSERT INTO demo_daily SELECT tide.biz_date(), 42 FROM pg_sleep(0.05)
                 ON CONFLICT (day) DO UPDATE SET total = EXCLUDED.total$$);
SELECT tide.schedule('pulse', '*/2 * * * * *', command => 'SELECT 1');
SELECT tide.backfill('daily_total', current_date - 91, current_date - 2, concurrency => 2, batch => 10,
    precheck => '(SELECT count(*) = 0 FROM demo_daily)',
    verify => '(SELECT total = 42 FROM demo_daily WHERE day = tide.biz_date())') AS bf \gset
CALL demo_wait($$(SELECT state = 'running' FROM tide.backfill WHERE backfill_id = $$ || :bf || $$)$$);
\echo '   the canary is verified and the batches run; paused now (running windows finish):'
SELECT tide.pause_backfill(:bf);
SELECT pg_sleep(1);
SELECT backfill_id, task, state, windows_done AS done, windows_total AS total, reason
  FROM tide.backfill_status WHERE backfill_id = :bf;
SELECT pg_sleep(2);
\echo '   two seconds later, still paused: no window started'
SELECT backfill_id, state, windows_done AS done, windows_running AS running, windows_in_line AS in_line FROM tide.backfill_status WHERE backfill_id = :bf;
SELECT tide.resume_backfill(:bf);
CALL demo_wait($$(SELECT state NOT IN ('running', 'canary', 'sampling') FROM tide.backfill WHERE backfill_id = $$ || :bf || $$)$$, 120);
\echo '   done: a random sample of 3 windows was verified again at the end'
SELECT backfill_id, task, from_date, to_date, state, windows_done AS done, windows_total AS total,
       rate AS per_second, started::time(0), finished::time(0), reason
  FROM tide.backfill_status WHERE backfill_id = :bf;
SELECT count(*) AS days_written, min(day), max(day) FROM demo_daily;
SELECT to_char(at, 'HH24:MI:SS.MS') AS at, coalesce(from_state, '-') || ' -> ' || to_state AS change, reason
  FROM tide.backfill_event WHERE backfill_id = :bf ORDER BY event_id;
\echo '   the online pulse while the backfill ran: every fire ran (latest_start: the latest start after its fire)'
SELECT count(*) AS pulse_runs, max(r.started_at - r.fire_at) AS latest_start
  FROM tide.run r JOIN tide.task t USING (task_id), tide.backfill b
 WHERE t.name = 'pulse' AND b.backfill_id = :bf AND r.fire_at BETWEEN b.started_at AND b.finished_at;
SELECT tide.pause('pulse');

\echo
\echo '== Reconciliation (day 7 of the plan): every morning, the day''s payments against the bank'
\echo '   statement, in Berlin time; each difference classified by rules and compensated once'
CREATE TABLE payments (order_id int, amount numeric(12,2), paid_at timestamptz);
CREATE TABLE bank_lines (ref text, amount numeric(12,2), booked_on date);
CREATE TABLE bank_file (ref text, amount numeric(12,2), booked_on date);
INSERT INTO payments VALUES (1001, 25.00, '2026-11-28 09:15+01'), (1002, 40.00, '2026-11-28 11:02+01'),
                            (1003, 15.00, '2026-11-28 16:40+01'), (1004, 99.90, '2026-11-28 23:30+01');
-- The bank booked 1002 with 0.40 too much, cut 1004 short on import, never got 1003, and has a
-- line nobody knows (9001). Its file holds the right 1004.
INSERT INTO bank_lines VALUES ('1001', 25.00, '2026-11-28'), ('1002', 40.40, '2026-11-28'),
                              ('1004', 19.99, '2026-11-28'), ('9001', 12.00, '2026-11-28');
INSERT INTO bank_file VALUES ('1004', 99.90, '2026-11-28');
-- The compensations are ordinary tasks: each fix run gets the difference in tide.args().
SELECT tide.schedule('push_payment', '0 0 1 1 *', tz => 'Europe/Berlin',
    command => $$INSERT INTO bank_lines VALUES (tide.args()->>'key', (tide.args()->'left'->>'amount')::numeric, (tide.args()->>'biz_date')::date)$$);
SELECT tide.schedule('adjust_amount', '0 0 1 1 *', tz => 'Europe/Berlin',
    command => $$UPDATE bank_lines SET amount = (tide.args()->'left'->>'amount')::numeric WHERE ref = tide.args()->>'key'$$);
SELECT tide.schedule('bank_import', '0 5 * * *', tz => 'Europe/Berlin', biz_window => 'day',
    command => $$UPDATE bank_lines b SET amount = f.amount FROM bank_file f
                 WHERE f.ref = b.ref AND f.booked_on = b.booked_on AND b.booked_on = tide.biz_date()$$);
SELECT tide.reconcile('payments_vs_bank',
  schedule   => '0 6 * * *', tz => 'Europe/Berlin', biz_window => 'day',
  left_sql   => $$SELECT order_id::text AS key, amount FROM payments
                  WHERE paid_at >= tide.window_start() AND paid_at < tide.window_end()$$,
  right_sql  => $$SELECT ref AS key, amount FROM bank_lines WHERE booked_on = tide.biz_date()$$,
  amounts    => ARRAY['amount'],
  tolerance  => 0.01,
  rules      => '[{"kind": "missing_right", "class": "auto_fix", "fix_task": "push_payment"},
                  {"kind": "mismatch", "when": "abs(l.amount - r.amount) < 1",
                   "class": "auto_fix", "fix_task": "adjust_amount"},
                  {"kind": "mismatch", "class": "replay", "replay_task": "bank_import"},
                  {"kind": "missing_left", "class": "human", "severity": "critical"}]') AS recon_task;
\echo '   reconcile 2026-11-28 now (the schedule would at 06:00 on the 29th):'
SELECT tide.rerun('payments_vs_bank', biz_date => DATE '2026-11-28') AS recon_run \gset
CALL demo_wait(format($$(SELECT state = 'succeeded' FROM tide.run WHERE run_id = %s)$$, :recon_run));
\echo '   R7.1: counts and sums of each side; the differences by kind and class:'
SELECT biz_date, status, left_count AS l_rows, right_count AS r_rows, left_sums, right_sums
  FROM tide.recon_result WHERE run_id = :recon_run;
SELECT diff_id AS id, key, kind, class, "left"->>'amount' AS l_amount, "right"->>'amount' AS r_amount,
       action_run_id AS compensated_by
  FROM tide.recon_diff WHERE run_id = :recon_run ORDER BY diff_id;
\echo '   in 80 columns: the reconciliations, and the open differences (a person''s first):'
SELECT * FROM tide.recon_status;
SELECT * FROM tide.recon_open;
\echo '   the compensations run: two fix runs (their dedupe keys) and one replay of the import:'
CALL demo_wait($$(SELECT bool_and(r.state = 'succeeded') FROM tide.run r JOIN tide.recon_diff d ON d.action_run_id = r.run_id)$$);
SELECT t.name AS task, r.trigger, r.dedupe_key, r.state FROM tide.run r JOIN tide.task t USING (task_id)
 WHERE r.run_id IN (SELECT action_run_id FROM tide.recon_diff) ORDER BY r.run_id;
\echo '   reconciled twice more: what was compensated is fixed; nothing is compensated twice'
SELECT tide.rerun('payments_vs_bank', biz_date => DATE '2026-11-28', force => true) AS again \gset
CALL demo_wait(format($$(SELECT count(*) = 2 FROM tide.recon_result WHERE run_id = %s)$$, :recon_run));
CALL demo_wait(format($$(SELECT state = 'succeeded' FROM tide.run WHERE run_id = %s)$$, :recon_run));
SELECT tide.rerun('payments_vs_bank', biz_date => DATE '2026-11-28', force => true) AS again \gset
CALL demo_wait(format($$(SELECT count(*) = 3 FROM tide.recon_result WHERE run_id = %s)$$, :recon_run));
CALL demo_wait(format($$(SELECT state = 'succeeded' FROM tide.run WHERE run_id = %s)$$, :recon_run));
SELECT (SELECT count(*) FROM tide.run r JOIN tide.task t USING (task_id) WHERE t.name IN ('push_payment', 'adjust_amount')) AS fix_runs,
       (SELECT count(*) FROM tide.run_event e WHERE e.reason LIKE 'replay asked by reconciliation%') AS replays_asked;
\echo '   the unknown bank line needs a person: an alert (critical), until resolved from psql'
CALL demo_wait($$(SELECT count(*) > 0 FROM tide.alert WHERE subject = 'payments_vs_bank' AND kind = 'reconciliation' AND resolved_at IS NULL)$$);
SELECT tide.resolve_diff(max(diff_id), 'accept', 'refund of an October order, booked by hand')
  FROM tide.recon_diff WHERE key = '9001' AND status = 'open';
CALL demo_wait($$(SELECT count(*) = 0 FROM tide.alert WHERE subject = 'payments_vs_bank' AND kind = 'reconciliation' AND resolved_at IS NULL)$$);
\echo '   R7.4: the history of the date, nothing overwritten: every comparison and every difference'
SELECT result_id, to_char(checked_at, 'HH24:MI:SS') AS at, status, differences, by_class
  FROM tide.recon_result WHERE reconciliation = 'payments_vs_bank' ORDER BY result_id;
SELECT diff_id AS id, result_id AS res, key, kind, class, status, fixed_by_run AS fixed_by, resolved_by, left(note, 30) AS note
  FROM tide.recon_diff WHERE reconciliation = 'payments_vs_bank' ORDER BY diff_id;
\echo '   and what tide.explain tells of the reconciliation run:'
SELECT * FROM tide.explain(:recon_run);

\echo
\echo '== Monitoring: a partner import keeps failing; the tick opens an alert and pg_tide delivers it'
\echo '   no channel yet: the open alerts reach no one, and pg_tide says so (tide.untaken_alerts):'
SELECT alert_id, subject, kind, severity FROM tide.untaken_alerts();
\echo '   a channel: alerts of severity warning and up (the default) go to a webhook (Slack, Mattermost,'
\echo '   Discord or your own), signed with HMAC-SHA256; the demo started a receiver for it on 127.0.0.1'
SELECT tide.create_channel('ops', 'webhook', jsonb_build_object('url', :'hook_url', 'secret', :'hook_secret'));
\echo '   tested before relying on it: a test message through the delivery worker, and the receiver''s answer'
SELECT channel, status, took < interval '20 seconds' AS answered_in_time, error FROM tide.test_channel('ops');
SELECT count(*) AS alerts_no_channel_takes FROM tide.untaken_alerts();
SELECT tide.schedule('partner_import', '0 4 * * *', biz_window => 'day',
    command => $$SELECT tide.business_error('partner file for ' || tide.biz_date() || ' is malformed')$$);
SELECT tide.monitor('partner_import', severity => 'critical');
\echo '   a heartbeat check for a backup script that runs outside pg_tide, and its first beat:'
SELECT tide.create_check('offsite_backup', '1 day', grace => '2 hours');
SELECT tide.heartbeat_check('offsite_backup', message => 'rsync ok, 12 GB');
LISTEN pg_tide_alert;
SELECT tide.rerun('partner_import', biz_date => DATE '2026-11-01') AS run_id \gset
\echo '   the alert opens within pg_tide.monitor_interval (2 s here; 10 s by default) of the dead letter:'
CALL demo_wait($$(SELECT count(*) > 0 FROM tide.alert WHERE subject = 'partner_import' AND resolved_at IS NULL)$$);
\echo '   the story of the dead run:'
SELECT * FROM tide.explain(:run_id);
\echo '   the open alerts:'
SELECT alert_id, subject, kind, severity, to_char(opened_at, 'HH24:MI:SS') AS opened, details
  FROM tide.alert WHERE resolved_at IS NULL ORDER BY alert_id;
\echo '   the delivery worker sends it to the webhook within seconds (once per alert event, with a delivery id):'
CALL demo_wait($$(SELECT count(*) > 0 FROM tide.effect e JOIN tide.alert a ON e.payload->>'alert_id' = a.alert_id::text
                   WHERE a.subject = 'partner_import' AND e.channel = 'ops' AND e.state = 'delivered')$$);
SELECT e.dedupe_key AS delivery_id, e.state, e.attempts, to_char(e.delivered_at, 'HH24:MI:SS') AS delivered
  FROM tide.effect e WHERE e.channel = 'ops' AND e.payload->>'subject' = 'partner_import' ORDER BY e.effect_id;
\echo '   acknowledged from psql: no more reminders, no escalation (its resolution is still sent):'
SELECT tide.ack_alert(alert_id, 'partner says the file is fixed tomorrow') FROM tide.alert
 WHERE subject = 'partner_import' AND kind = 'dead_letter' AND resolved_at IS NULL;
\echo
\echo '== A run that cannot start: the nightly export''s queue was left paused. Its run waits; past its'
\echo '   start deadline (3 s here: tide.monitor(start_deadline => ...)) a late_start alert names the run, its'
\echo '   wait and why'
SELECT tide.create_queue('exports');
SELECT tide.pause_queue('exports');
SELECT tide.schedule('nightly_export', '0 2 * * *', queue => 'exports', command => $$SELECT 'exported'$$);
SELECT tide.monitor('nightly_export', start_deadline => '3 seconds');
SELECT tide.rerun('nightly_export') AS export_run \gset
CALL demo_wait($$(SELECT count(*) > 0 FROM tide.alert WHERE subject = 'nightly_export' AND kind = 'late_start' AND resolved_at IS NULL)$$);
SELECT subject, kind, severity, details->>'run_id' AS run_id, details->>'cause' AS cause
  FROM tide.alert WHERE subject = 'nightly_export' AND kind = 'late_start' AND resolved_at IS NULL;
\echo '   the queue resumed: the run starts, and the alert resolves'
SELECT tide.resume_queue('exports');
CALL demo_wait($$(SELECT state = 'succeeded' FROM tide.run WHERE run_id = $$ || :export_run || $$)$$);
CALL demo_wait($$(SELECT count(*) = 0 FROM tide.alert WHERE subject = 'nightly_export' AND kind = 'late_start' AND resolved_at IS NULL)$$);
SELECT subject, kind, resolved_at IS NOT NULL AS resolved FROM tide.alert WHERE subject = 'nightly_export' AND kind = 'late_start';
\echo
\echo '== Stop means stop: a top-level command (run by a command worker of its own) cancelled while it runs'
SELECT tide.schedule('slow_maintenance', '0 3 * * 0', top_level => true, command => 'SELECT pg_sleep(60)');
SELECT tide.rerun('slow_maintenance') AS slow_run \gset
CALL demo_wait($$(SELECT state = 'running' FROM tide.run WHERE run_id = $$ || :slow_run || $$)$$);
SELECT pg_sleep(0.5);
SELECT tide.cancel_run(:slow_run, 'maintenance window moved');
CALL demo_wait($$(SELECT state = 'cancelled' FROM tide.run WHERE run_id = $$ || :slow_run || $$)$$, 10);
SELECT run_id, state, finished_at - started_at AS ran_for, reason FROM tide.run WHERE run_id = :slow_run;
\echo
\echo '   heartbeats, pg_tide''s own tasks included (each success is a beat):'
SELECT kind, name, status, to_char(expected_at, 'YYYY-MM-DD HH24:MI') AS next_beat_by FROM tide.check_status
 WHERE kind = 'check' OR status <> 'new' ORDER BY kind, name;
\echo
\echo '== pg_tide watches itself (SELECT * FROM tide.self_health): its ticks, workers, backlog, deliveries'
\x on
SELECT * FROM tide.self_health;
\x off
\echo
\echo '== The dashboard, worst first (SELECT * FROM tide.dashboard)'
SELECT * FROM tide.dashboard;
-- The role the console's /metrics reads as (scripts/demo.sh): a member of tide_monitor only.
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'scraper') THEN CREATE ROLE scraper LOGIN; END IF;
END $$;
GRANT tide_monitor TO scraper;

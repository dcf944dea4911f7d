-- pg_tide 0.2.7 to 0.3.0: API 0.3 (CHANGELOG.md lists every change with its replacement).
-- Arguments named for what they name: tide.reconcile(task), tide.create_queue / drop_queue /
-- pause_queue / resume_queue(queue), tide.create_channel / drop_channel / test_channel(channel).
-- tide.ack is tide.ack_alert; tide.fail_effect takes kind ('transient' or 'business', as
-- tide.fail_run) for permanent; tide.claim_effects' lease defaults to NULL (one minute);
-- tide.run_now is folded into tide.rerun (no date: the latest fire's window); tide.create_check
-- returns the check's name and tide.create_emit_trigger text; tide.backoff_delay and
-- tide.error_kind_of are internal (tide._backoff_delay, tide._error_kind_of); a task's options
-- have their defaults in tide.schedule's signature only (the columns' are dropped).
-- tide.enqueue with a dedupe_key finds its runs by their keys, never by a sort of all the task's
-- runs (its generic plan's merge join: 60 ms at 60,000 runs).
-- Run by ALTER EXTENSION pg_tide UPDATE; the upgrade tier (pg_test/tests/upgrade.rs) checks that
-- the schema it leaves is the one a fresh CREATE EXTENSION makes. Changed functions are dropped
-- and created again (pgspot's PS002): no table or view depends on them.
\echo Use "ALTER EXTENSION pg_tide UPDATE TO '0.3.0'" to load this file. \quit
SET LOCAL search_path = pg_catalog, pg_temp;

-- Helpers made internal: renamed (their C symbols are unchanged).
ALTER FUNCTION tide.backoff_delay(integer, interval, double precision, interval, text, double precision) RENAME TO _backoff_delay;
COMMENT ON FUNCTION tide._backoff_delay(integer, interval, double precision, interval, text, double precision) IS
    'Internal: _backoff_delay(tries, base, factor, cap, jitter, unit): the retry delay after tries failed tries: min(cap, base * factor^(tries-1)), spread by jitter (full: [0, d]; equal: [d/2, d]; none: d) using unit in [0, 1).';
ALTER FUNCTION tide.error_kind_of(text) RENAME TO _error_kind_of;
COMMENT ON FUNCTION tide._error_kind_of(text) IS
    'Internal: _error_kind_of(sqlstate): how a command error is treated: transient (connection, serialization, deadlock, lock or statement timeout, resources, shutdown), not_ready (TDNR0) or business (everything else).';
COMMENT ON FUNCTION tide._error_kind(text, jsonb) IS
    'Internal: how a failed command''s SQLSTATE is treated under a task''s error_kinds: the helpers'' SQLSTATEs keep their kinds, then the exact SQLSTATE, its class, and the default list (tide._error_kind_of).';
COMMENT ON COLUMN tide.task.error_kinds IS 'SQLSTATEs (5 characters) or SQLSTATE classes (2) mapped to transient, business or not_ready, over the default list (tide._error_kind_of).';

-- tide.run_now folded into tide.rerun.
DROP FUNCTION tide.run_now(text, date, text, boolean);
COMMENT ON FUNCTION tide.rerun(text, date, timestamptz, text, boolean) IS
    'rerun(task, biz_date => NULL, window_start => NULL, version => NULL, force => false): runs one business window of a task by hand, through the same idempotency key as every run of that window: the window of biz_date, the one starting at window_start, or (neither) the window of the latest fire at or before now. A run of it already in line is left as it is; a succeeded one needs force => true; when the rules changed since, version => ''original'' or ''current'' must be chosen. Returns the run id.';
COMMENT ON FUNCTION tide._rerun(bigint, timestamptz, timestamptz, timestamptz, date, text, boolean, text, tide.run_trigger, text, text) IS
    'Internal: creates or reopens the run of one window (tide.rerun and backfills after the window is computed; p_function names the caller in errors; a backfill''s run goes to its queue, below every online run).';
COMMENT ON TYPE tide.run_trigger IS
    'What last put the run in line: scheduled fire, catch-up of a missed window, tide.rerun (manual), tide.replay_run, a backfill, an event, tide.enqueue, a reconciliation''s compensation or replay.';

-- A task's options: their defaults are tide.schedule's only.
ALTER TABLE tide.task
    ALTER COLUMN tz DROP DEFAULT,
    ALTER COLUMN biz_window DROP DEFAULT,
    ALTER COLUMN dst_gap DROP DEFAULT,
    ALTER COLUMN dst_overlap DROP DEFAULT,
    ALTER COLUMN queue DROP DEFAULT,
    ALTER COLUMN args DROP DEFAULT,
    ALTER COLUMN timeout DROP DEFAULT,
    ALTER COLUMN lease DROP DEFAULT,
    ALTER COLUMN priority DROP DEFAULT,
    ALTER COLUMN max_attempts DROP DEFAULT,
    ALTER COLUMN backoff_base DROP DEFAULT,
    ALTER COLUMN backoff_factor DROP DEFAULT,
    ALTER COLUMN backoff_cap DROP DEFAULT,
    ALTER COLUMN jitter DROP DEFAULT,
    ALTER COLUMN misfire DROP DEFAULT,
    ALTER COLUMN misfire_threshold DROP DEFAULT,
    ALTER COLUMN catch_up_max DROP DEFAULT,
    ALTER COLUMN recheck_interval DROP DEFAULT,
    ALTER COLUMN not_ready_policy DROP DEFAULT,
    ALTER COLUMN overlap DROP DEFAULT,
    ALTER COLUMN topics DROP DEFAULT,
    ALTER COLUMN long DROP DEFAULT,
    ALTER COLUMN top_level DROP DEFAULT,
    ALTER COLUMN rescan_previous DROP DEFAULT;

-- Functions whose arguments, defaults, return types or bodies change: dropped and created.
DROP FUNCTION tide.ack(bigint, text);
CREATE FUNCTION tide.ack_alert(alert_id bigint, note text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    a tide.alert;
BEGIN
    IF ack_alert.note IS NOT NULL THEN
        PERFORM tide._text_arg('note', ack_alert.note, 1000, 'say what you are doing about it');
    END IF;
    SELECT * INTO a FROM tide.alert x WHERE x.alert_id = ack_alert.alert_id AND tide._may_act(x.owner) FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no alert %', coalesce(ack_alert.alert_id::text, 'NULL') USING ERRCODE = 'undefined_object',
            HINT = 'open alerts: SELECT alert_id, subject, kind, severity FROM tide.alert WHERE resolved_at IS NULL';
    END IF;
    IF a.resolved_at IS NOT NULL THEN
        RAISE EXCEPTION 'alert % is resolved already (at %)', a.alert_id, a.resolved_at
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'only open alerts are acknowledged';
    END IF;
    UPDATE tide.alert x SET acked_at = now(), acked_by = tide._caller(), ack_note = ack_alert.note WHERE x.alert_id = a.alert_id;
    RETURN a.acked_at IS NULL;
END
$$;
COMMENT ON FUNCTION tide.ack_alert(bigint, text) IS
    'ack_alert(alert_id, note => NULL): acknowledges an open alert, with who and a note: no more reminders or escalation; its resolution is still notified. True if it was not acknowledged yet.';

DROP FUNCTION tide.test_channel(text);
CREATE  FUNCTION tide."test_channel"(
	"channel" TEXT /* Option < & str > */
) RETURNS TABLE (
	"channel" TEXT,  /* String */
	"status" TEXT,  /* String */
	"took" interval,  /* Option < pgrx :: datum :: Interval > */
	"error" TEXT  /* Option < String > */
)
VOLATILE  
SET search_path TO pg_catalog, pg_temp
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'test_channel_wrapper';
COMMENT ON FUNCTION tide.test_channel(text) IS
    'test_channel(name): sends a test message to one of your channels through pg_tide''s delivery worker, as an alert would go, and returns what the receiver answered: status (delivered, failed, refused, no answer), took, error (without secrets). Nothing is recorded. In the database pg_tide serves.';

DROP FUNCTION tide.reconcile(text, text, text, text, text, text, text[], numeric, text, integer, text, boolean);
CREATE FUNCTION tide.reconcile(task text, schedule text, tz text DEFAULT 'UTC', biz_window text DEFAULT 'fire',
                               left_sql text DEFAULT NULL, right_sql text DEFAULT NULL,
                               amounts text[] DEFAULT '{}', tolerance numeric DEFAULT 0, rules text DEFAULT '[]',
                               max_diffs integer DEFAULT 10000, work_mem text DEFAULT NULL,
                               replace boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    caller name := tide._caller();
    parsed jsonb;
    def jsonb;
    t tide.task;
BEGIN
    PERFORM tide._text_arg('task', reconcile.task, 200, 'name the reconciliation, such as ''payments_vs_bank''');
    IF reconcile.left_sql IS NULL OR reconcile.right_sql IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', CASE WHEN reconcile.left_sql IS NULL THEN 'left_sql' ELSE 'right_sql' END
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'each side is a query returning key (text) and the amount columns for the run''s window, such as SELECT order_id::text AS key, amount FROM payments WHERE paid_at >= tide.window_start() AND paid_at < tide.window_end()';
    END IF;
    IF reconcile.amounts IS NULL THEN
        RAISE EXCEPTION 'amounts must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'pass amounts => ARRAY[''amount''], or ARRAY[]::text[] to compare keys and counts only';
    END IF;
    BEGIN
        parsed := coalesce(reconcile.rules, '[]')::jsonb;
    EXCEPTION WHEN others THEN
        RAISE EXCEPTION 'rules is not valid JSON: %', tide._clip(reconcile.rules, 100)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass a JSON array such as ''[{"kind": "missing_right", "class": "auto_fix", "fix_task": "push_payment"}]''';
    END;
    def := tide._recon_valid(reconcile.task,
                             jsonb_build_object('left_sql', reconcile.left_sql, 'right_sql', reconcile.right_sql,
                                                'amounts', to_jsonb(reconcile.amounts), 'tolerance', reconcile.tolerance,
                                                'rules', parsed, 'max_diffs', reconcile.max_diffs, 'work_mem', reconcile.work_mem),
                             caller);
    SELECT * INTO t FROM tide.task x WHERE x.name = reconcile.task AND x.owner = caller;
    IF NOT FOUND THEN
        RETURN tide.schedule(reconcile.task, reconcile.schedule, command => tide._recon_command(), tz => reconcile.tz,
                             biz_window => reconcile.biz_window, reconcile => def);
    END IF;
    IF t.reconcile IS NULL THEN
        RAISE EXCEPTION 'task "%" already exists and is not a reconciliation', left(reconcile.task, 200)
            USING ERRCODE = 'duplicate_object',
                  HINT = 'choose another name, or remove the task first with tide.unschedule';
    END IF;
    IF t.reconcile = def AND t.schedule IS NOT DISTINCT FROM reconcile.schedule AND t.tz = reconcile.tz
       AND t.biz_window::text = lower(reconcile.biz_window) THEN
        -- The same definition: a deploy script may run it every time.
        RETURN t.task_id;
    END IF;
    IF NOT coalesce(reconcile.replace, false) THEN
        RAISE EXCEPTION 'reconciliation "%" already exists with another definition', left(reconcile.task, 200)
            USING ERRCODE = 'duplicate_object',
                  HINT = 'pass replace => true to make this its next rule version (its history stays)';
    END IF;
    PERFORM tide.alter(reconcile.task, schedule => reconcile.schedule, tz => reconcile.tz,
                       biz_window => reconcile.biz_window, reconcile => def);
    RETURN t.task_id;
END
$$;
COMMENT ON FUNCTION tide.reconcile(text, text, text, text, text, text, text[], numeric, text, integer, text, boolean) IS
    'reconcile(task, schedule, tz => ''UTC'', biz_window => ''fire'', left_sql, right_sql, amounts => ''{}'', tolerance => 0, rules => ''[]'', max_diffs => 10000, work_mem => NULL, replace => false): creates (or, with replace, changes) a reconciliation: a task whose runs compare the two sides for their window (each returns key and the amount columns), record counts, sums and differences (tide.recon_result, tide.recon_diff) and compensate them by rules: auto_fix (a run of fix_task per difference, once), replay (a rerun of replay_task''s window, once), human (an alert). Returns the task id.';

DROP FUNCTION tide.create_queue(text, integer, double precision, integer, interval);
CREATE FUNCTION tide.create_queue(queue text, max_concurrency integer DEFAULT NULL, rate double precision DEFAULT NULL,
                                  retry_budget integer DEFAULT NULL, retry_window interval DEFAULT '10 minutes')
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._queue_name(create_queue.queue);
    IF create_queue.max_concurrency IS NOT NULL AND create_queue.max_concurrency NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'max_concurrency must be between 1 and 10000, got %', create_queue.max_concurrency
            USING ERRCODE = 'invalid_parameter_value', HINT = 'NULL for no limit';
    END IF;
    IF create_queue.rate IS NOT NULL AND NOT (create_queue.rate > 0 AND create_queue.rate <= 10000) THEN
        RAISE EXCEPTION 'rate must be between 0 and 10000 starts per second, got %', create_queue.rate
            USING ERRCODE = 'invalid_parameter_value', HINT = 'rate => 0.5 starts a run every 2 seconds at most; NULL for no limit';
    END IF;
    IF create_queue.retry_budget IS NOT NULL AND create_queue.retry_budget NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'retry_budget must be between 1 and 100000, got %', create_queue.retry_budget
            USING ERRCODE = 'invalid_parameter_value', HINT = 'the transient failures allowed per retry_window; NULL for no budget';
    END IF;
    IF create_queue.retry_window IS NULL OR create_queue.retry_window < interval '1 minute'
       OR create_queue.retry_window > interval '1 day'
       -- One sign for its months, days and time, as every interval of pg_tide's
       -- ('1 day -1 hour' is refused, not read as 23 hours).
       OR extract(month FROM create_queue.retry_window) < 0 OR extract(day FROM create_queue.retry_window) < 0
       OR extract(epoch FROM create_queue.retry_window - date_trunc('day', create_queue.retry_window)) < 0 THEN
        RAISE EXCEPTION 'retry_window must be an interval of 1 minute to 1 day whose days and time have one sign, got %', coalesce(create_queue.retry_window::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass retry_window => ''10 minutes''';
    END IF;
    INSERT INTO tide.queue AS q (owner, name, max_concurrency, rate, retry_budget, retry_window, tokens, budget)
    VALUES (tide._caller(), create_queue.queue, create_queue.max_concurrency, create_queue.rate,
            create_queue.retry_budget, create_queue.retry_window,
            greatest(1, coalesce(create_queue.rate, 1)), coalesce(create_queue.retry_budget, 0))
    ON CONFLICT ON CONSTRAINT queue_pkey DO UPDATE
       SET max_concurrency = EXCLUDED.max_concurrency, rate = EXCLUDED.rate,
           retry_budget = EXCLUDED.retry_budget, retry_window = EXCLUDED.retry_window,
           tokens = least(q.tokens, EXCLUDED.tokens),
           budget = CASE WHEN q.retry_budget IS NULL THEN EXCLUDED.budget ELSE least(q.budget, EXCLUDED.budget) END,
           updated_at = now();
    PERFORM tide._queue_recount(tide._caller(), create_queue.queue);
    -- Runs waiting for a limit that is now higher (or gone) may go.
    PERFORM tide._wake_queue(tide._caller(), create_queue.queue);
    RETURN create_queue.queue;
END
$$;
COMMENT ON FUNCTION tide.create_queue(text, integer, double precision, integer, interval) IS
    'create_queue(queue, max_concurrency => NULL, rate => NULL, retry_budget => NULL, retry_window => ''10 minutes''): declares (or changes) the limits of one of the caller''s queues: at most max_concurrency of its runs running at once, at most rate starts per second, and at most retry_budget transient failures per retry_window before its retries wait. NULL: no such limit. Returns the name.';

DROP FUNCTION tide.drop_queue(text);
CREATE FUNCTION tide.drop_queue(queue text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._queue_name(drop_queue.queue);
    DELETE FROM tide.queue q WHERE q.owner = tide._caller() AND q.name = drop_queue.queue;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM tide._queue_forget(tide._caller(), drop_queue.queue);
    PERFORM tide._wake_queue(tide._caller(), drop_queue.queue);
    RETURN true;
END
$$;
COMMENT ON FUNCTION tide.drop_queue(text) IS
    'drop_queue(queue): removes the limits of one of the caller''s queues (its runs go on without limits); false if it had none.';

DROP FUNCTION tide.pause_queue(text);
CREATE FUNCTION tide.pause_queue(queue text) RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT tide._set_queue_paused(queue, true) $$;
COMMENT ON FUNCTION tide.pause_queue(text) IS
    'pause_queue(queue): no run of the caller''s queue starts until tide.resume_queue (running ones finish); false if it already was paused.';

DROP FUNCTION tide.resume_queue(text);
CREATE FUNCTION tide.resume_queue(queue text) RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT tide._set_queue_paused(queue, false) $$;
COMMENT ON FUNCTION tide.resume_queue(text) IS
    'resume_queue(queue): lets the runs of a paused queue start again; false if it was not paused.';

DROP FUNCTION tide.create_channel(text, text, jsonb, text);
CREATE FUNCTION tide.create_channel(channel text, kind text, config jsonb, alerts text DEFAULT 'warning') RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._channel(create_channel.channel);
    IF create_channel.kind IS NULL OR create_channel.kind NOT IN ('webhook', 'email') THEN
        RAISE EXCEPTION 'unknown channel kind %', coalesce(quote_literal(left(create_channel.kind, 40)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'kind is webhook (an HTTP POST of JSON: Slack, Mattermost, Discord or your own) or email (SMTP)';
    END IF;
    PERFORM tide._channel_config(create_channel.kind, create_channel.config);
    INSERT INTO tide.alert_channel AS c (name, kind, config, alerts, owner)
    VALUES (create_channel.channel, create_channel.kind, create_channel.config,
            CASE WHEN create_channel.alerts IS NOT NULL THEN tide._severity(create_channel.alerts, 'alerts') END, tide._caller())
    ON CONFLICT ON CONSTRAINT alert_channel_pkey DO UPDATE
       SET kind = EXCLUDED.kind, config = EXCLUDED.config, alerts = EXCLUDED.alerts, last_error = NULL, last_error_at = NULL;
    RETURN create_channel.channel;
END
$$;
COMMENT ON FUNCTION tide.create_channel(text, text, jsonb, text) IS
    'create_channel(channel, kind, config, alerts => ''warning''): a channel pg_tide''s delivery worker sends alerts to: kind webhook (config url, secret for an HMAC-SHA256 X-Tide-Signature, format chat or json) or email (config host, port, tls, username, password, from, to, ca_cert). alerts is the lowest severity routed to it (info, warning, critical; by default warning), NULL for none. Creating an existing name changes it.';

DROP FUNCTION tide.drop_channel(text);
CREATE FUNCTION tide.drop_channel(channel text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._channel(drop_channel.channel);
    DELETE FROM tide.alert_channel c WHERE c.name = drop_channel.channel AND c.owner = tide._caller();
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- What it had still to send is given up, visibly.
    UPDATE tide.effect e SET state = 'dead', last_error = 'the channel was dropped', lease_expires_at = NULL
     WHERE e.owner = tide._caller() AND e.channel = drop_channel.channel AND e.state IN ('pending', 'sending');
    RETURN true;
END
$$;
COMMENT ON FUNCTION tide.drop_channel(text) IS
    'drop_channel(channel): removes one of your channels (what it had still to send is marked dead); false if there was none.';

DROP FUNCTION tide.claim_effects(text, text, integer, interval);
CREATE FUNCTION tide.claim_effects(channel text, worker text DEFAULT NULL, n integer DEFAULT 10,
                                   lease interval DEFAULT NULL)
RETURNS TABLE (effect_id bigint, dedupe_key text, payload jsonb, attempt integer, lease_token bigint,
               lease_expires_at timestamptz, run_id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT, whatever the backlog (see tide._claim).
SET jit = off
AS $$
DECLARE
    ids bigint[];
    token bigint;
    only_owner name := CASE WHEN tide._caller_is_superuser() THEN NULL ELSE tide._caller() END;
    held_for interval;
BEGIN
    PERFORM tide._channel(claim_effects.channel);
    IF claim_effects.worker IS NOT NULL THEN
        PERFORM tide._text_arg('worker', claim_effects.worker, 200, 'name the worker, such as its host and pid');
    END IF;
    IF claim_effects.n IS NULL OR claim_effects.n NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'n must be between 1 and 1000, got %', coalesce(claim_effects.n::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'claim_effects(''sms'', worker => ''sender-1'', n => 10)';
    END IF;
    -- NULL (the default): one minute, as claim_runs' NULL is the task's own lease.
    held_for := coalesce(claim_effects.lease, interval '1 minute');
    PERFORM tide._bounded('lease', held_for, false);
    -- Candidates fixed first (a LIMIT subquery under SKIP LOCKED may be re-evaluated).
    SELECT array_agg(c.effect_id) INTO ids FROM (
        SELECT e.effect_id FROM tide.effect e
         WHERE e.state = 'pending' AND e.channel = claim_effects.channel AND e.available_at <= now()
           AND (only_owner IS NULL OR e.owner = only_owner)
           -- A channel of tide.create_channel is pg_tide's delivery worker's to send.
           AND NOT EXISTS (SELECT 1 FROM tide.alert_channel c WHERE c.owner = e.owner AND c.name = e.channel)
         ORDER BY e.available_at, e.effect_id
         LIMIT claim_effects.n FOR UPDATE SKIP LOCKED) c;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    token := nextval('tide.lease_token_seq');
    RETURN QUERY
        UPDATE tide.effect e
           SET state = 'sending', attempts = e.attempts + 1, worker = claim_effects.worker,
               lease_token = token, lease_expires_at = now() + held_for
         WHERE e.effect_id = ANY (ids)
        RETURNING e.effect_id, e.dedupe_key, e.payload, e.attempts, e.lease_token, e.lease_expires_at, e.run_id;
END
$$;
COMMENT ON FUNCTION tide.claim_effects(text, text, integer, interval) IS
    'claim_effects(channel, worker => NULL, n => 10, lease => NULL): hands up to n pending side effects of a channel (the caller''s; a superuser''s: any role''s) to a delivery worker (FOR UPDATE SKIP LOCKED, oldest first) with a fencing lease_token, held for lease (NULL: one minute). Pass dedupe_key to the provider as its idempotency key.';

DROP FUNCTION tide.fail_effect(bigint, bigint, text, boolean);
CREATE FUNCTION tide.fail_effect(effect_id bigint, lease_token bigint, error text, kind text DEFAULT 'transient')
RETURNS tide.effect_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    e tide.effect;
    next_state tide.effect_state;
BEGIN
    IF fail_effect.error IS NULL THEN
        RAISE EXCEPTION 'error must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'say what went wrong: tide.fail_effect(effect_id, lease_token, ''provider answered 503'')';
    END IF;
    -- The kinds of tide.fail_run that mean something for a delivery, spelled as fail_run takes
    -- them (any case, spaces around): a transient failure is tried again, a business one (the
    -- provider refused it for good) is dead at once.
    IF fail_effect.kind IS NULL OR lower(btrim(fail_effect.kind)) NOT IN ('transient', 'business') THEN
        RAISE EXCEPTION 'kind must be transient or business, got %', coalesce(quote_literal(left(fail_effect.kind, 40)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'transient: delivered again after a backoff; business: dead at once (replay it with tide.replay_effect)';
    END IF;
    e := tide._effect_held(fail_effect.effect_id, fail_effect.lease_token, 'tide.fail_effect');
    next_state := CASE WHEN lower(btrim(fail_effect.kind)) = 'business' OR e.attempts >= e.max_attempts
                       THEN 'dead' ELSE 'pending' END;
    -- Retries back off: 10 s, 20 s, 40 s ... at most an hour, fully jittered.
    UPDATE tide.effect x
       SET state = next_state, last_error = tide._clip(fail_effect.error, 10000), lease_expires_at = NULL,
           available_at = now() + tide._backoff_delay(e.attempts, interval '10 seconds', 2, interval '1 hour', 'full', random())
     WHERE x.effect_id = fail_effect.effect_id;
    RETURN next_state;
END
$$;
COMMENT ON FUNCTION tide.fail_effect(bigint, bigint, text, text) IS
    'fail_effect(effect_id, lease_token, error, kind => ''transient''): a failed delivery: a transient one is retried after a backoff (10 s doubling, at most 1 h, jittered) and is dead after max_attempts; a business one (refused for good) is dead at once. Returns the new state.';

DROP FUNCTION tide.create_check(text, text, interval, text, text);
CREATE FUNCTION tide.create_check(name text, schedule text, grace interval DEFAULT '1 hour', tz text DEFAULT 'UTC',
                           severity text DEFAULT 'warning')
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- CHECK is a reserved word: the parameters are used by position.
    c_name ALIAS FOR $1;
    c_schedule ALIAS FOR $2;
    c_grace ALIAS FOR $3;
    c_tz ALIAS FOR $4;
    c_severity ALIAS FOR $5;
    p interval;
    cron text;
    made text;
BEGIN
    IF c_name IS NULL OR c_name ~ '^[[:space:]]*$' THEN
        RAISE EXCEPTION 'check name must not be empty, got %', coalesce(quote_literal(left(c_name, 20)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'name the job the beats come from, such as ''nightly-backup''';
    END IF;
    PERFORM tide._text_arg('check name', c_name, 200, 'name the job the beats come from, such as ''nightly-backup''');
    IF c_schedule IS NULL OR c_grace IS NULL OR c_tz IS NULL OR c_severity IS NULL THEN
        RAISE EXCEPTION 'schedule, grace, tz and severity must not be NULL'
            USING ERRCODE = 'null_value_not_allowed', HINT = 'pass a period such as ''1 day'' or a cron schedule such as ''0 3 * * *''';
    END IF;
    IF c_grace < interval '0' THEN
        RAISE EXCEPTION 'grace must not be negative, got %', c_grace
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass grace => ''30 minutes''';
    END IF;
    PERFORM tide._bounded('grace', c_grace, true);
    PERFORM tide._text_arg('schedule', c_schedule, 500, 'pass a period such as ''1 day'' or a cron schedule such as ''0 3 * * *''');
    -- A period ('1 day', '6 hours') or else a cron schedule, checked like tide.schedule checks it.
    BEGIN
        p := c_schedule::interval;
    EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
        p := NULL;
    END;
    IF p IS NOT NULL AND p <= interval '0' THEN
        RAISE EXCEPTION 'period must be a positive interval, got %', c_schedule
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass a period such as ''1 day'' or a cron schedule such as ''0 3 * * *''';
    END IF;
    PERFORM tide._bounded('period', p, false);
    IF p IS NULL THEN
        cron := btrim(c_schedule);
        PERFORM tide._next_fire(cron, c_tz, now());
    ELSE
        PERFORM tide._next_fire('* * * * *', c_tz, now());  -- checks the time zone
    END IF;
    INSERT INTO tide.check AS c (name, period, schedule, tz, grace, severity, owner)
    VALUES (btrim(c_name), p, cron, c_tz, c_grace, tide._severity(c_severity, 'severity'), tide._caller())
    ON CONFLICT ON CONSTRAINT check_owner_name_key DO UPDATE
       SET period = EXCLUDED.period, schedule = EXCLUDED.schedule, tz = EXCLUDED.tz,
           grace = EXCLUDED.grace, severity = EXCLUDED.severity
    RETURNING c.name INTO made;
    RETURN made;
END
$$;
COMMENT ON FUNCTION tide.create_check(text, text, interval, text, text) IS
    'create_check(name, schedule, grace => ''1 hour'', tz => ''UTC'', severity => ''warning''): declares (or changes) one of the caller''s heartbeat checks (names are per role): a beat is expected every period (schedule = ''1 day'') or at each fire of a cron schedule (''0 3 * * *'' in tz), within grace. Returns its name (trimmed), which the other check functions take.';

DROP FUNCTION tide.create_emit_trigger(regclass, text, text);
CREATE FUNCTION tide.create_emit_trigger("table" regclass, topic text, key_column text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    trigger_name name;
BEGIN
    IF create_emit_trigger."table" IS NULL THEN
        RAISE EXCEPTION 'tide.create_emit_trigger: table must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'for example: SELECT tide.create_emit_trigger(''orders'', ''order.changed'', ''customer_id'')';
    END IF;
    PERFORM tide._check_topic(create_emit_trigger.topic, 'tide.create_emit_trigger');
    PERFORM tide._own_table(create_emit_trigger."table", 'tide.create_emit_trigger');
    IF create_emit_trigger.key_column IS NOT NULL THEN
        PERFORM tide._text_arg('key_column', create_emit_trigger.key_column, 63,
                               'pass the column whose value orders the events (runs of one key go one at a time), or NULL');
    END IF;
    IF create_emit_trigger.key_column IS NOT NULL AND NOT EXISTS (
           SELECT 1 FROM pg_attribute a
            WHERE a.attrelid = create_emit_trigger."table" AND a.attname = create_emit_trigger.key_column
              AND a.attnum > 0 AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'table % has no column %', create_emit_trigger."table", quote_ident(create_emit_trigger.key_column)
            USING ERRCODE = 'undefined_column',
                  HINT = 'pass the column whose value orders the events (runs of one key go one at a time), or NULL';
    END IF;
    trigger_name := tide._emit_trigger_name(create_emit_trigger.topic);
    EXECUTE format('CREATE OR REPLACE TRIGGER %I AFTER INSERT OR UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION tide._emit_row(%L, %L)',
                   trigger_name, create_emit_trigger."table", create_emit_trigger.topic, coalesce(create_emit_trigger.key_column, ''));
    RETURN trigger_name::text;
END
$$;
COMMENT ON FUNCTION tide.create_emit_trigger(regclass, text, text) IS
    'create_emit_trigger(table, topic, key_column => NULL): installs a trigger that emits each inserted or changed row ({op, table, row}) on the topic, keyed by key_column, in the writing transaction. Calling it again replaces it; tide.drop_emit_trigger removes it. Returns the trigger''s name.';

DROP FUNCTION tide._fail(bigint, text, tide.error_kind, text, tide.attempt_outcome, timestamptz);
CREATE FUNCTION tide._fail(p_run_id bigint, p_error text, p_kind tide.error_kind, p_sqlstate text,
                           p_outcome tide.attempt_outcome, p_now timestamptz)
RETURNS tide.run_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
    changed tide.run;
    rules jsonb;
    next_fire timestamptz;
    max_attempts integer;
    new_state tide.run_state;
    wait_until timestamptz;
    budget_hold timestamptz;
    why text;
    error_text text;
BEGIN
    SELECT * INTO r FROM tide.run WHERE run_id = p_run_id FOR UPDATE;
    SELECT v.rules INTO rules FROM tide.task_version v WHERE v.task_id = r.task_id AND v.version = r.version;
    max_attempts := (rules->>'max_attempts')::integer;
    -- Errors come from workers and commands: kept bounded.
    error_text := tide._clip(p_error, 10000);
    IF p_kind = 'business' THEN
        new_state := 'dead';
        why := format('business error: %s', error_text);
    ELSIF r.tries >= max_attempts THEN
        new_state := 'dead';
        why := format('gave up after %s of %s attempts: %s', r.tries, max_attempts, error_text);
    ELSIF p_kind = 'transient' THEN
        new_state := 'retry';
        wait_until := p_now + tide._backoff_delay(r.tries, (rules->>'backoff_base')::interval,
                                                 (rules->>'backoff_factor')::float8,
                                                 (rules->>'backoff_cap')::interval,
                                                 rules->>'jitter', random());
        -- The queue's retry budget (tide.queue): when it is spent, the retry waits for it.
        budget_hold := tide._spend_retry(r.owner, r.queue, p_now);
        IF budget_hold > wait_until THEN
            wait_until := budget_hold;
        END IF;
        why := format('attempt %s of %s failed, retry after %s%s: %s', r.tries, max_attempts,
                      to_char(wait_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS" UTC"'),
                      CASE WHEN budget_hold IS NOT NULL
                           THEN format(' (the retry budget of queue %s is spent)', r.queue) ELSE '' END,
                      error_text);
    ELSE
        -- Not ready: wait for the next window, never a tight loop.
        SELECT t.next_fire_at INTO next_fire FROM tide.task t WHERE t.task_id = r.task_id;
        wait_until := CASE WHEN next_fire > p_now THEN next_fire
                           ELSE p_now + (rules->>'recheck_interval')::interval END;
        new_state := 'waiting';
        why := format('not ready (attempt %s of %s), waits until %s: %s', r.tries, max_attempts,
                      to_char(wait_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS" UTC"'), error_text);
    END IF;
    -- Running to retry, dead or waiting: legal by construction; the history row, written here,
    -- carries the attempt this ends.
    PERFORM set_config('tide.history', 'written', true);
    UPDATE tide.run
       SET state = new_state,
           run_after = wait_until,
           ready_deadline = NULL,
           last_error = error_text,
           last_error_kind = p_kind,
           lease_expires_at = NULL,
           finished_at = CASE WHEN new_state = 'dead' THEN p_now END,
           updated_at = now(),
           reason = why
     WHERE run_id = p_run_id AND state = 'running'
    RETURNING * INTO changed;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % is %, not running: no attempt to end', p_run_id, r.state
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'only a claimed run can fail';
    END IF;
    PERFORM set_config('tide.history', '', true);
    PERFORM tide._sync_pending(changed, true);
    -- The history row with the attempt it ends, and what it counts: the task touched, and a
    -- dead letter among the outcomes of tide.metrics() (tide._write_history). A retry has no
    -- finished_at: its failed attempt ended at p_now, the hour it counts in.
    PERFORM tide._write_history(ARRAY[ROW(p_run_id, r.task_id, r.owner, 'running', new_state, why, p_now, r.attempts,
                                          r.lease_owner, r.lease_token, coalesce(r.claimed_at, p_now), p_outcome, p_kind,
                                          p_sqlstate, error_text, changed.attempts,
                                          coalesce(changed.finished_at, p_now), changed.started_at, changed.fire_at,
                                          changed.created_at)::tide.run_change],
                                true);
    IF new_state = 'retry' THEN
        PERFORM tide._wake(true);  -- the scheduler sleeps until the retry is due, not its next poll
    END IF;
    IF tide._log_on() THEN
        PERFORM tide._log_runs('failure', ARRAY[p_run_id], error_text);
    END IF;
    RETURN new_state;
END
$$;
COMMENT ON FUNCTION tide._fail(bigint, text, tide.error_kind, text, tide.attempt_outcome, timestamptz) IS
    'Internal: records a failed attempt and decides retry (with backoff), wait (not ready) or dead letter.';

DROP FUNCTION tide._delivery_done(bigint, bigint, text, boolean);
CREATE FUNCTION tide._delivery_done(p_effect_id bigint, p_token bigint, p_error text, p_permanent boolean) RETURNS tide.effect_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    e tide.effect;
    next_state tide.effect_state;
BEGIN
    SELECT * INTO e FROM tide.effect x WHERE x.effect_id = p_effect_id AND x.state = 'sending' AND x.lease_token = p_token FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF p_error IS NULL THEN
        next_state := tide.complete_effect(p_effect_id, p_token);
        UPDATE tide.alert_channel c SET last_sent_at = now() WHERE c.owner = e.owner AND c.name = e.channel;
    ELSE
        next_state := tide.fail_effect(p_effect_id, p_token, p_error, CASE WHEN p_permanent THEN 'business' ELSE 'transient' END);
        UPDATE tide.alert_channel c SET last_error = tide._clip(p_error, 1000), last_error_at = now()
         WHERE c.owner = e.owner AND c.name = e.channel;
        RAISE LOG 'pg_tide: delivery=% effect_id=% channel=% attempt=% error=%', next_state, p_effect_id,
            tide._logfmt(e.channel), e.attempts, tide._logfmt(p_error);
    END IF;
    INSERT INTO tide.delivery_count AS d (owner, channel, outcome, value)
    SELECT e.owner, e.channel, o.outcome, 1
      FROM unnest(CASE WHEN p_error IS NULL THEN ARRAY['sent']
                       WHEN next_state = 'dead' THEN ARRAY['failed', 'dead']
                       ELSE ARRAY['failed'] END) AS o(outcome)
    ON CONFLICT (owner, channel, outcome) DO UPDATE SET value = d.value + 1;
    RETURN next_state;
END
$$;
COMMENT ON FUNCTION tide._delivery_done(bigint, bigint, text, boolean) IS
    'Internal: records the outcome of one send by the delivery worker: delivered, or failed (retried after a backoff, dead after max_attempts or when permanent).';

DROP FUNCTION tide.enqueue(text, jsonb, timestamptz, integer, text);
CREATE FUNCTION tide.enqueue(task text, args jsonb DEFAULT '{}', run_at timestamptz DEFAULT NULL,
                             priority integer DEFAULT NULL, dedupe_key text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT, whatever the backlog (see tide._claim).
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    t tide.task;
    items jsonb;
    n integer;
    key_of text;
    one_key boolean;
    open_state tide.run_state;
    why text;
    exec_kind tide.executor;
    ids bigint[];
    prio integer;
    due timestamptz;
    rule record;
BEGIN
    PERFORM tide._text_arg('task', enqueue.task, 200, 'pass the name of one of your tasks');
    -- KEY SHARE: the task cannot be deleted under the new runs; changes of it may go on.
    -- The caller's task, a team's, or one granted to it (tide.grant('enqueue', ...)): the runs
    -- are its owner's.
    SELECT * INTO t FROM tide.task x WHERE x.task_id = tide._named_task(enqueue.task, 'enqueue') FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'task "%" does not exist', left(enqueue.task, 200) USING ERRCODE = 'undefined_object',
            HINT = 'list your tasks with: SELECT name FROM tide.task';
    END IF;
    IF enqueue.args IS NULL THEN
        RAISE EXCEPTION 'args must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'pass args => ''{}'' for none, an object for one run, or an array of objects for one run each';
    END IF;
    CASE jsonb_typeof(enqueue.args)
        WHEN 'object' THEN items := jsonb_build_array(enqueue.args);
        WHEN 'array' THEN items := enqueue.args;
        ELSE
            RAISE EXCEPTION 'args must be a JSON object or an array of objects, got %', left(enqueue.args::text, 100)
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'pass args => ''{"invoice_id": 7}'' for one run, or ''[{"invoice_id": 7}, {"invoice_id": 8}]'' for one run each';
    END CASE;
    n := jsonb_array_length(items);
    IF n > 100000 THEN
        RAISE EXCEPTION 'args has % elements, at most 100000 in one call', n USING ERRCODE = 'invalid_parameter_value',
            HINT = 'enqueue in several calls of up to 100000 runs';
    END IF;
    IF n > 1 THEN
        PERFORM tide._check_bulk(n, 'tide.enqueue');
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM jsonb_array_elements(items) WITH ORDINALITY AS e(v, i)
     WHERE CASE WHEN jsonb_typeof(e.v) <> 'object'
                THEN tide._refuse_element(e.i, e.v)
                ELSE NOT tide._args_ok(e.v) END;
    IF enqueue.priority IS NOT NULL AND enqueue.priority NOT BETWEEN -1000 AND 1000 THEN
        RAISE EXCEPTION 'priority must be between -1000 and 1000, got %', enqueue.priority
            USING ERRCODE = 'invalid_parameter_value', HINT = 'higher runs first; the task''s own priority is the default';
    END IF;
    prio := coalesce(enqueue.priority, t.priority);
    IF enqueue.run_at IS NOT NULL AND NOT isfinite(enqueue.run_at) THEN
        RAISE EXCEPTION 'run_at must be a finite instant, got %', enqueue.run_at USING ERRCODE = 'invalid_parameter_value',
            HINT = 'pass now() + interval ''1 hour'', or NULL to run at once';
    END IF;
    IF enqueue.run_at > now() + interval '3660 days' THEN
        RAISE EXCEPTION 'run_at % is more than 3660 days ahead', enqueue.run_at USING ERRCODE = 'invalid_parameter_value',
            HINT = 'schedule work that far ahead as a task with a schedule';
    END IF;
    due := CASE WHEN enqueue.run_at > now() THEN enqueue.run_at END;
    IF enqueue.dedupe_key IS NOT NULL THEN
        PERFORM tide._text_arg('dedupe_key', enqueue.dedupe_key, 1000,
                               'derive it from what the job is about, such as ''invoice:'' || invoice_id');
        IF enqueue.dedupe_key LIKE '#%' THEN
            RAISE EXCEPTION 'dedupe_key % is not valid', quote_literal(left(enqueue.dedupe_key, 100))
                USING ERRCODE = 'invalid_parameter_value', HINT = 'dedupe keys starting with # are pg_tide''s own';
        END IF;
        -- One run: the key itself. Several: the key and the element's position, so the same
        -- batch enqueued again creates nothing.
        one_key := jsonb_typeof(enqueue.args) = 'object';
        key_of := enqueue.dedupe_key || CASE WHEN one_key THEN '' ELSE ':' END;
    ELSE
        -- Keys of pg_tide's own, new to this call: no conflict is possible.
        one_key := false;
        key_of := '#q' || nextval('tide.job_seq') || ':';
    END IF;
    -- The same for every run of the call: worked out once.
    open_state := tide._open_state(jsonb_build_object('ready_dataset', t.ready_dataset, 'ready_check', t.ready_check,
                                                      'ready_watermark', t.ready_watermark));
    exec_kind := tide._executor_of(t.command);
    -- What the runs' gating reads of the task's rules, read once (tide._gating_by).
    SELECT v.rules->>'lock_key' AS lock_rule, v.rules->>'overlap' AS overlap, (v.rules->>'long')::boolean AS long,
           (v.rules->>'max_concurrency')::integer AS max_concurrency
      INTO STRICT rule
      FROM tide.task_version v WHERE v.task_id = t.task_id AND v.version = t.version;
    why := format('enqueued by %s%s', tide._caller(),
                  CASE WHEN due IS NOT NULL
                       THEN ' to run at ' || to_char(due AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS" UTC"') ELSE '' END);
    -- The runs, with their gating, made by the one creator (tide._create_runs): runs with keys of
    -- pg_tide's own are fresh; those with the caller's skip the keys seen before.
    WITH input AS (
        SELECT e.i, t.args || e.v AS args,
               CASE WHEN one_key THEN key_of ELSE key_of || e.i END AS dedupe_key
          FROM jsonb_array_elements(items) WITH ORDINALITY AS e(v, i)
    ), made AS (
        -- In the order of the elements (run ids follow it), with the fields of tide.new_run.
        SELECT t.task_id, 'enqueued'::tide.run_trigger AS trigger, t.version, open_state AS state, why AS reason,
               exec_kind AS executor, t.queue, prio AS priority, i.args, t.owner, NULL::timestamptz AS fire_at,
               NULL::timestamptz AS window_start, NULL::timestamptz AS window_end, NULL::date AS biz_date,
               i.dedupe_key, NULL::tide.skip_reason AS skip_reason, due AS run_after,
               NULL::timestamptz AS ready_deadline, NULL::text AS topic, NULL::text AS event_key,
               NULL::jsonb AS payload, g.gate, g.lock_key, g.gated
          FROM input i
         CROSS JOIN LATERAL tide._gating_by(rule.lock_rule, rule.overlap, rule.long, rule.max_concurrency, t.task_id,
                                            t.name, i.args, NULL, NULL, NULL, NULL) g
         ORDER BY i.i
    )
    SELECT tide._create_runs(array_agg(m::tide.new_run), enqueue.dedupe_key IS NULL) INTO ids FROM made m;
    -- The run of each element: with keys of pg_tide's own, all of them new, in the order of the
    -- elements (run ids are given in insertion order); with the caller's, created now or
    -- earlier with the same key: each looked up by its key (a lateral LIMIT 1 is never turned
    -- into a join, which a generic plan made a sort of all the task's runs: 60 ms at 60,000).
    IF enqueue.dedupe_key IS NULL THEN
        RETURN QUERY SELECT unnest(ids);
    ELSE
        RETURN QUERY
            SELECT r.run_id FROM generate_series(1, n) k(i)
             CROSS JOIN LATERAL (
                 SELECT x.run_id FROM tide.run x
                  WHERE x.task_id = t.task_id
                    AND x.dedupe_key = CASE WHEN one_key THEN key_of ELSE key_of || k.i END
                  LIMIT 1) r
             ORDER BY k.i;
    END IF;
END
$$;
COMMENT ON FUNCTION tide.enqueue(text, jsonb, timestamptz, integer, text) IS
    'enqueue(task, args => ''{}'', run_at => NULL, priority => NULL, dedupe_key => NULL): creates one run of the caller''s task (args an object, merged over the task''s args) or one run per element (args an array of objects, up to 100000), now or at run_at, with its own priority (default: the task''s). A dedupe_key makes it idempotent: a second enqueue with the same key creates nothing and returns the existing run (with an array, element n uses dedupe_key:n). Returns the run ids, in the order of the elements.';

DROP FUNCTION tide.start_step(text);
CREATE FUNCTION tide.start_step(name text) RETURNS TABLE (done boolean, output jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run := tide._command_run('tide.start_step');
BEGIN
    RETURN QUERY SELECT * FROM tide.start_step(r.run_id, r.lease_token, start_step.name);
END
$$;
COMMENT ON FUNCTION tide.start_step(text) IS
    'start_step(name), inside a task''s command: as start_step(run_id, lease_token, name) for the run being executed.';

DROP FUNCTION tide.complete_step(bigint, bigint, text, jsonb);
CREATE FUNCTION tide.complete_step(run_id bigint, lease_token bigint, name text, output jsonb DEFAULT NULL) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r tide.run;
BEGIN
    r := tide._held_run(complete_step.run_id, complete_step.lease_token, complete_step.name, 'tide.complete_step');
    PERFORM tide._jsonb_arg('output', complete_step.output, 1048576);
    INSERT INTO tide.step AS s (run_id, name, done, output, attempt, done_at, owner)
    VALUES (r.run_id, complete_step.name, true, complete_step.output, r.attempts, now(), r.owner)
    ON CONFLICT ON CONSTRAINT step_pkey DO UPDATE
       SET done = true, output = EXCLUDED.output, attempt = EXCLUDED.attempt, done_at = now()
     WHERE NOT s.done;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'step "%" of run % is already done', complete_step.name, complete_step.run_id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'call tide.start_step first: it says whether a step is done, with its output';
    END IF;
END
$$;
COMMENT ON FUNCTION tide.complete_step(bigint, bigint, text, jsonb) IS
    'complete_step(run_id, lease_token, name, output => NULL): records a step of a claimed run as done, with its output, in the same transaction as its work. A stale lease token is refused; a step already done is refused.';

-- Privileges, as a fresh install leaves them (src/comments.sql): internal functions that
-- change anything are pg_tide's own.
REVOKE EXECUTE ON FUNCTION tide._fail(bigint, text, tide.error_kind, text, tide.attempt_outcome, timestamptz) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION tide._delivery_done(bigint, bigint, text, boolean) FROM PUBLIC;

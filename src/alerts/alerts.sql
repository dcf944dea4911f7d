-- ---------------------------------------------------------------------------------------------
-- Alerts.
CREATE TYPE tide.alert_kind AS ENUM (
    'silence', 'down', 'consecutive_failures', 'dead_letter', 'need_check', 'repeated_skips', 'retries',
    'backlog', 'catch_up_limit', 'not_ready', 'schedule_error', 'retry_budget', 'events_lost', 'backfill',
    'reconciliation', 'held', 'delivery_failed', 'scheduler_down', 'undelivered', 'late_start', 'owner_gone'
);
COMMENT ON TYPE tide.alert_kind IS 'What an alert is about; see docs/operations.md, Alerts.';

-- pg_tide's own alert: no successful tick for pg_tide.alert_stalled_after (the scheduler is
-- gone, stuck, or every tick fails). Evaluated by the tick like the others and, since a
-- scheduler that is down cannot report itself, by the delivery worker (tide._evaluate_alerts(now, true)).
CREATE FUNCTION tide._self_causes(p_now timestamptz)
RETURNS TABLE (subject_type text, subject text, kind tide.alert_kind, severity tide.severity, details jsonb, owner name)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- pg_tide's health read once, for both conditions. The kinds are cast from text at run
    -- time: undelivered came in the same version as this function.
    SELECT 'pg_tide', 'pg_tide', c.kind::tide.alert_kind, c.severity::tide.severity, c.details, x.owner
      FROM tide._self(p_now) x
     CROSS JOIN LATERAL (VALUES
        ('scheduler_down', 'critical', x.status = 'down',
         jsonb_build_object('last_tick', x.last_tick, 'since_last_tick', x.since_last_tick, 'scheduler_alive', x.scheduler_alive,
                            'last_tick_error', x.last_tick_error, 'last_tick_error_at', x.last_tick_error_at)),
        -- Alerts that reach no person (no channel takes them): said once, as pg_tide's own
        -- warning, which a channel of a superuser or of tide_admin takes.
        ('undelivered', 'warning', x.alerts_untaken > 0,
         jsonb_build_object('alerts', x.alerts_untaken,
                            'message', format('%s open alerts reach no one: no channel takes them', x.alerts_untaken),
                            'hint', 'SELECT tide.create_channel(''ops'', ''webhook'', ''{"url": "https://..."}''); then SELECT * FROM tide.test_channel(''ops'');'))
     ) AS c(kind, severity, hit, details)
     WHERE c.hit
$$;
COMMENT ON FUNCTION tide._self_causes(timestamptz) IS 'Internal: pg_tide''s own alert conditions at an instant (scheduler_down, undelivered).';

CREATE TABLE tide.alert (
    alert_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject_type text NOT NULL CHECK (subject_type IN ('task', 'check', 'queue', 'backfill', 'channel', 'pg_tide')),
    subject      text NOT NULL,
    kind         tide.alert_kind NOT NULL,
    severity     tide.severity NOT NULL,
    opened_at    timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    resolved_at  timestamptz,
    count        integer NOT NULL DEFAULT 1,
    details      jsonb NOT NULL DEFAULT '{}',
    owner        name NOT NULL,
    -- Acknowledged (tide.ack_alert): no more reminders or escalation; its resolution is still sent.
    acked_at     timestamptz,
    acked_by     name,
    ack_note     text,
    -- Raised one severity by escalation (pg_tide.alert_escalate_after) from the cause's.
    escalated_at timestamptz,
    -- The latest notification sent (opening, escalation or reminder) and how many reminders.
    notified_at  timestamptz,
    reminders    integer NOT NULL DEFAULT 0
);
COMMENT ON TABLE tide.alert IS
    'Alerts opened and resolved by the tick: at most one open alert per owner, subject (task or check) and kind. count = evaluations that found the cause while open.';
-- One open alert per owner, subject and kind (names are per owner): the tick's upsert relies on it.
CREATE UNIQUE INDEX alert_open_key ON tide.alert (owner, subject_type, subject, kind) WHERE resolved_at IS NULL;
CREATE INDEX alert_resolved_idx ON tide.alert (resolved_at) WHERE resolved_at IS NOT NULL;

-- Open alerts that nobody takes: no channel of pg_tide's and no route of your own workers
-- receives them (tide._alert_takers), so they reach no person. pg_tide's own alert of them is
-- not one of them.
CREATE FUNCTION tide._untaken()
RETURNS TABLE (alert_id bigint, subject_type text, subject text, kind text, severity tide.severity,
               opened_at timestamptz, last_seen_at timestamptz, owner name)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT a.alert_id, a.subject_type, a.subject, a.kind::text, a.severity, a.opened_at, a.last_seen_at, a.owner
      FROM tide.alert a
     WHERE a.resolved_at IS NULL AND NOT (a.subject_type = 'pg_tide' AND a.kind::text = 'undelivered')
       AND NOT EXISTS (SELECT 1 FROM tide._alert_takers(a.owner, a.severity::text, a.kind::text, a.subject_type,
                                                         a.subject, false))
$$;
COMMENT ON FUNCTION tide._untaken() IS
    'Internal: the open alerts no channel or route takes (pg_tide''s undelivered alert aside).';

-- How many, for pg_tide's own health: only those seen by more than one evaluation (one opened
-- and resolved by the next would otherwise raise undelivered for a moment: the evaluation
-- counts the alerts open before it).
CREATE FUNCTION tide._alerts_untaken() RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(*)::integer FROM tide._untaken() u WHERE u.last_seen_at > u.opened_at
$$;
COMMENT ON FUNCTION tide._alerts_untaken() IS
    'Internal: how many open alerts, seen by more than one evaluation, no channel or route takes (pg_tide''s undelivered alert aside).';

-- The caller's own (its teams', every role's for tide_admin). Runs as the extension's owner
-- (volatile and public: see src/security/caller.rs), as the channels of pg_tide's owner that take every
-- role's alerts are not the caller's to read; tide._may_act keeps to the caller's alerts.
CREATE FUNCTION tide.untaken_alerts()
RETURNS TABLE (alert_id bigint, subject_type text, subject text, kind text, severity text, opened_at timestamptz, owner name)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT u.alert_id, u.subject_type, u.subject, u.kind, u.severity::text, u.opened_at, u.owner
      FROM tide._untaken() u
     WHERE tide._may_act(u.owner)
     ORDER BY u.severity DESC, u.opened_at
$$;
COMMENT ON FUNCTION tide.untaken_alerts() IS
    'Your open alerts (your own, your teams'', every role''s for tide_admin) that no channel or route takes, so they reach no person: alert_id, subject_type, subject, kind, severity, opened_at, owner. Create a channel (tide.create_channel) or a route (tide.create_alert_route) that takes them.';

-- Every condition that holds at an instant, as (subject, kind, details).
CREATE FUNCTION tide._alert_causes(p_now timestamptz)
RETURNS TABLE (subject_type text, subject text, kind tide.alert_kind, severity tide.severity, details jsonb, owner name)
-- PL/pgSQL, one RETURN QUERY, rather than SQL: an SQL function with SET clauses is never inlined
-- and plans its whole query at every call (about 4 ms of the tick's evaluation over 10,000
-- tasks); the session keeps this one's plan (measured over 10,000 idle tasks, three alternating
-- rounds: 7.0-10.7 ms per evaluation against 9.0-14.3).
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
RETURN QUERY
    WITH cfg AS MATERIALIZED (
        SELECT tide._setting('alert_failures', '3')::integer AS failures,
               tide._setting('alert_skips', '3')::integer AS skips,
               tide._setting('alert_retries', '10')::integer AS retries,
               tide._setting('alert_backlog', '1000')::integer AS backlog,
               tide._setting('alert_held_after', '1h')::interval AS held_after
    ), cand AS MATERIALIZED (
        -- The tasks that may have something to report, found from their kept figures and
        -- their schedule errors alone (each condition below, or a superset of it; the kept
        -- rows are narrow, the tasks' are not), and (by tide._health itself, from its one pass
        -- over tide.pending) every task with unfinished or unresolved runs (dead, need_check,
        -- held, backlog): health rows are made for those only, not for every task. A task whose kept figures do not hold (computed after
        -- p_now, expired, or a touch row: every task without kept figures has one) is always a
        -- candidate, as health computes it from its runs.
        SELECT ARRAY(
            SELECT s.task_id FROM cfg, tide.task_stat s
             WHERE s.computed_at > p_now OR s.valid_until <= p_now OR s.quiet_at <= p_now
                OR s.failures >= cfg.failures OR coalesce(s.skips, 0) > cfg.skips
                OR coalesce(s.retries, 0) >= cfg.retries OR s.catch_up_limited > 0 OR s.not_ready > 0
            UNION SELECT t.task_id FROM tide.task t WHERE t.tick_error IS NOT NULL
            UNION SELECT x.task_id FROM tide.task_touch x) AS ids
    ), h AS MATERIALIZED (
        -- Only the tasks with something to report (the details are built for those alone).
        SELECT h.*, CASE WHEN h.paused THEN 0 ELSE tide._silence_level(h.silence, h.max_silence) END AS level
          FROM cand, tide._health(p_now, cand.ids) h, cfg
         WHERE (NOT h.paused AND tide._silence_level(h.silence, h.max_silence) > 0)
            OR h.consecutive_failures >= cfg.failures OR h.dead > 0 OR h.need_check > 0
            OR h.consecutive_skips > cfg.skips OR h.retries_24h >= cfg.retries OR h.backlog >= cfg.backlog
            OR h.catch_up_limited_24h > 0 OR h.not_ready_24h > 0 OR h.tick_error IS NOT NULL
            OR h.held_since <= p_now - cfg.held_after
            -- A ready run waiting long enough to be late (each task's deadline is checked below).
            OR h.oldest_ready > interval '1 second'
    )
    SELECT 'task', h.task, c.kind, h.severity, c.details, h.owner
      FROM h CROSS JOIN cfg CROSS JOIN LATERAL (VALUES
        ('silence'::tide.alert_kind, h.level >= 1,
         jsonb_build_object('silence', h.silence, 'max_silence', h.max_silence, 'last_success', h.last_success)),
        ('down', h.level = 2,
         jsonb_build_object('silence', h.silence, 'max_silence', h.max_silence, 'last_success', h.last_success)),
        ('consecutive_failures', h.consecutive_failures >= cfg.failures,
         jsonb_build_object('consecutive_failures', h.consecutive_failures, 'last_state', h.last_state)),
        ('dead_letter', h.dead > 0, jsonb_build_object('dead', h.dead)),
        ('need_check', h.need_check > 0, jsonb_build_object('need_check', h.need_check)),
        ('repeated_skips', h.consecutive_skips > cfg.skips, jsonb_build_object('consecutive_skips', h.consecutive_skips)),
        ('retries', h.retries_24h >= cfg.retries, jsonb_build_object('retries_24h', h.retries_24h)),
        ('backlog', h.backlog >= cfg.backlog, jsonb_build_object('backlog', h.backlog, 'oldest_ready', h.oldest_ready)),
        ('catch_up_limit', h.catch_up_limited_24h > 0,
         jsonb_build_object('windows_skipped_24h', h.catch_up_limited_24h)),
        ('not_ready', h.not_ready_24h > 0, jsonb_build_object('not_ready_24h', h.not_ready_24h)),
        ('schedule_error', h.tick_error IS NOT NULL,
         jsonb_build_object('error', h.tick_error, 'since', h.tick_error_at, 'retry_at', h.tick_retry_at)),
        ('held', h.held_since <= p_now - cfg.held_after,
         jsonb_build_object('held', h.held, 'since', h.held_since,
                            'confirm', format('SELECT tide.confirm(%L, version)', h.task)))
      ) AS c(kind, hit, details)
     WHERE c.hit
    UNION ALL
    -- A ready run not started by its deadline (tide._start_deadline): its wait and, as far as
    -- pg_tide can tell, why. Resolves when it starts.
    SELECT 'task', h.task, 'late_start'::text::tide.alert_kind, h.severity,
           jsonb_build_object('run_id', l.run_id, 'waited', h.oldest_ready, 'start_deadline', l.deadline,
                              'cause', tide._late_cause(l.run_id)),
           h.owner
      FROM h JOIN tide.task t ON t.task_id = h.task_id
     CROSS JOIN LATERAL (SELECT r.run_id, tide._start_deadline(t.start_deadline, t.fire_gap, r.window_start IS NOT NULL) AS deadline
                           FROM tide.run r WHERE r.run_id = h.oldest_ready_id) l
     WHERE h.oldest_ready > l.deadline
    UNION ALL
    SELECT 'check', s.name, k.kind, s.severity,
           jsonb_build_object('status', s.status, 'last_beat', s.last_beat, 'expected_at', s.expected_at, 'message', s.message),
           s.owner
      FROM tide._checks(p_now) s
      CROSS JOIN LATERAL (VALUES ('silence'::tide.alert_kind, s.status IN ('late', 'down')),
                                 ('down'::tide.alert_kind, s.status = 'down')) AS k(kind, hit)
     WHERE k.hit
    UNION ALL
    -- A queue whose retry budget is spent: its downstream is probably down, and its retries
    -- wait for the budget to refill.
    SELECT 'queue', q.name, 'retry_budget', 'warning',
           jsonb_build_object('retry_budget', q.retry_budget, 'retry_window', q.retry_window,
                              'budget_left', round(b.left_now::numeric, 2),
                              'refilled_at', p_now + make_interval(secs => (1 - b.left_now) * extract(epoch FROM q.retry_window)::float8 / q.retry_budget)),
           q.owner
      FROM tide.queue q, LATERAL (SELECT tide._queue_budget(q, p_now) AS left_now) b
     WHERE q.retry_budget IS NOT NULL AND b.left_now < 1
    UNION ALL
    -- An event task whose latest fallback scan found events that were never emitted: events
    -- are being lost upstream (an emit forgotten on some path, a trigger dropped).
    SELECT 'task', t.name, 'events_lost', 'warning',
           jsonb_build_object('missing', (s.result->>'missing')::integer, 'scanned', (s.result->>'scanned')::integer,
                              'keys', s.result->'missing_keys', 'scan_run', s.run_id, 'scanned_at', s.finished_at),
           t.owner
      FROM tide.task t
     CROSS JOIN LATERAL (SELECT x.run_id, x.result, x.finished_at FROM tide.run x
                          WHERE x.task_id = t.task_id AND x.window_start IS NOT NULL AND x.state = 'succeeded'
                          ORDER BY x.window_start DESC LIMIT 1) s
     WHERE t.fallback IS NOT NULL AND (s.result->>'missing')::integer > 0
    UNION ALL
    -- A backfill that waits for a person: its canary or sample failed verification, windows of
    -- it failed, or it paused itself after more than max_failures failures (R9.5, R14.1).
    SELECT 'backfill', b.backfill_id::text, 'backfill', t.severity,
           jsonb_build_object('task', t.name, 'state', b.state, 'reason', b.reason, 'from_date', b.from_date,
                              'to_date', b.to_date, 'windows_failed', b.windows_failed),
           b.owner
      FROM tide.backfill b JOIN tide.task t ON t.task_id = b.task_id
     WHERE b.state IN ('verify_failed', 'needs_review') OR (b.state = 'paused' AND b.failure_pause)
    UNION ALL
    -- A reconciliation with differences for a person (R7.2): classed human, or escalated (a
    -- compensation that could not be made, or ran and the difference remains). The severity is
    -- the highest of their rules'; it resolves once none is open (fixed by a later run or
    -- resolved with tide.resolve_diff).
    SELECT 'task', t.name, 'reconciliation', max(x.severity),
           jsonb_build_object('open', count(DISTINCT (x.biz_date, x.key, x.kind)),
                              'biz_dates', to_jsonb(array_agg(DISTINCT x.biz_date)),
                              'diff_ids', to_jsonb((array_agg(x.diff_id ORDER BY x.diff_id DESC))[1:10])),
           t.owner
      FROM tide.recon_diff x JOIN tide.task t ON t.task_id = x.task_id
     WHERE x.status = 'open' AND (x.class = 'human' OR x.escalated)
     GROUP BY t.task_id, t.name, t.owner
    UNION ALL
    -- A channel of tide.create_channel that gave up on deliveries in the last 24 hours (they
    -- are dead: replay them with tide.replay_effect once the receiver is fixed).
    SELECT 'channel', c.name, 'delivery_failed', 'warning',
           jsonb_build_object('dead', d.n, 'last_error', c.last_error, 'last_error_at', c.last_error_at,
                              'effect_ids', to_jsonb(d.ids)),
           c.owner
      FROM tide.alert_channel c
     CROSS JOIN LATERAL (SELECT count(*) AS n, (array_agg(e.effect_id ORDER BY e.effect_id DESC))[1:10] AS ids
                           FROM tide.effect e
                          WHERE e.owner = c.owner AND e.channel = c.name AND e.state = 'dead'
                            AND e.created_at > p_now - interval '1 day') d
     WHERE d.n > 0
    UNION ALL
    -- A task whose owner no longer exists (paused by tide._pause_orphans): open until it is
    -- given to another role (tide.reassign_owned) or removed (tide.unschedule with owner,
    -- tide.drop_owned).
    SELECT 'task', t.name, 'owner_gone', 'critical',
           jsonb_build_object('owner', t.owner, 'paused_at', t.paused_at,
                              'message', format('the owner of task %s, role %s, no longer exists: the task is paused', t.name, t.owner),
                              'hint', format('give it to another role: SELECT tide.reassign_owned(%L, ''<role>''); or remove it: SELECT tide.unschedule(%L, owner => %L)',
                                             t.owner, t.name, t.owner)),
           t.owner
      FROM tide.task t
     WHERE t.paused AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = t.owner)
    UNION ALL
    SELECT * FROM tide._self_causes(p_now);
END
$$;
COMMENT ON FUNCTION tide._alert_causes(timestamptz) IS 'Internal: every alert condition that holds at an instant.';

-- Delivery: alerts routed to a side-effect channel (src/effects/effects.sql) are recorded there once per
-- opening (and resolution), with the dedupe key alert:<id>:<event>:<channel>, for a delivery
-- worker that posts to chat or sends mail.
CREATE TABLE tide.alert_route (
    channel      tide.channel NOT NULL,
    min_severity tide.severity NOT NULL DEFAULT 'warning',
    kinds        tide.alert_kind[],
    resolved     boolean NOT NULL DEFAULT true,
    owner        name NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT alert_route_pkey PRIMARY KEY (owner, channel)
);
COMMENT ON TABLE tide.alert_route IS
    'Where alerts are delivered: each opening (and, with resolved, each resolution) of an alert of at least min_severity (and of one of kinds, when set) becomes one side effect on the channel. A route receives its owner''s alerts (a superuser''s route receives all).';

CREATE FUNCTION tide.create_alert_route(channel text, min_severity text DEFAULT 'warning', kinds text[] DEFAULT NULL,
                                  resolved boolean DEFAULT true)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bad text;
BEGIN
    PERFORM tide._channel(create_alert_route.channel);
    IF cardinality(create_alert_route.kinds) > 100 THEN
        RAISE EXCEPTION 'kinds has % entries, at most 100', cardinality(create_alert_route.kinds)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'kinds are ' || array_to_string(enum_range(NULL::tide.alert_kind), ', ');
    END IF;
    SELECT string_agg(coalesce(quote_literal(left(x, 40)), 'NULL'), ', ') INTO bad FROM unnest(create_alert_route.kinds) x
     WHERE x IS NULL OR x NOT IN (SELECT e::text FROM unnest(enum_range(NULL::tide.alert_kind)) e);
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'unknown alert kind %', bad USING ERRCODE = 'invalid_parameter_value',
            HINT = 'kinds are ' || array_to_string(enum_range(NULL::tide.alert_kind), ', ');
    END IF;
    INSERT INTO tide.alert_route AS r (channel, min_severity, kinds, resolved, owner)
    VALUES (create_alert_route.channel, tide._severity(coalesce(create_alert_route.min_severity, 'warning'), 'min_severity'),
            create_alert_route.kinds::tide.alert_kind[], coalesce(create_alert_route.resolved, true), tide._caller())
    ON CONFLICT ON CONSTRAINT alert_route_pkey DO UPDATE
       SET min_severity = EXCLUDED.min_severity, kinds = EXCLUDED.kinds, resolved = EXCLUDED.resolved;
    RETURN create_alert_route.channel;
END
$$;
COMMENT ON FUNCTION tide.create_alert_route(text, text, text[], boolean) IS
    'create_alert_route(channel, min_severity => ''warning'', kinds => NULL (all), resolved => true): delivers alerts to a side-effect channel, once per opening (and resolution): a delivery worker takes them with tide.claim_effects(channel).';

CREATE FUNCTION tide.drop_alert_route(channel text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._channel(drop_alert_route.channel);
    DELETE FROM tide.alert_route r WHERE r.channel = drop_alert_route.channel AND r.owner = tide._caller();
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION tide.drop_alert_route(text) IS 'drop_alert_route(channel): stops delivering alerts to a channel; false if there was no route to it.';

-- Opens the alerts whose cause holds and resolves those whose cause is gone; escalates and
-- reminds of the open ones nobody acknowledged. NOTIFYs pg_tide_alert, writes a log line and
-- records the deliveries (tide._alert_deliver) of each opening, escalation, reminder and
-- resolution. p_only_self: pg_tide's own alert only (the delivery worker's watchdog). Returns
-- the counts.
CREATE FUNCTION tide._evaluate_alerts(p_now timestamptz, p_only_self boolean DEFAULT false) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    changes jsonb;
    c jsonb;
    opened integer := 0;
    resolved integer := 0;
    escalate_after interval := tide._setting('alert_escalate_after', '1h')::interval;
    renotify interval := tide._setting('alert_renotify_interval', '4h')::interval;
BEGIN
    WITH cause AS MATERIALIZED (
        SELECT * FROM tide._alert_causes(p_now) WHERE NOT p_only_self
        UNION ALL
        SELECT * FROM tide._self_causes(p_now) WHERE p_only_self
    ), upsert AS (
        INSERT INTO tide.alert AS a (subject_type, subject, kind, severity, opened_at, last_seen_at, details, owner, notified_at)
        SELECT c.subject_type, c.subject, c.kind, c.severity, p_now, p_now, c.details, c.owner, p_now FROM cause c
        ON CONFLICT (owner, subject_type, subject, kind) WHERE resolved_at IS NULL
        DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at, count = a.count + 1, details = EXCLUDED.details,
                      -- An escalated alert keeps its raised severity while its cause lasts.
                      severity = CASE WHEN a.escalated_at IS NULL THEN EXCLUDED.severity
                                      ELSE greatest(EXCLUDED.severity, a.severity) END
        RETURNING a.*, (a.xmax = 0) AS is_new
    ), gone AS (
        UPDATE tide.alert a SET resolved_at = p_now
         WHERE a.resolved_at IS NULL AND (NOT p_only_self OR a.subject_type = 'pg_tide')
           AND NOT EXISTS (SELECT 1 FROM cause c
                            WHERE c.owner = a.owner AND c.subject_type = a.subject_type AND c.subject = a.subject
                              AND c.kind = a.kind)
        RETURNING a.*
    )
    SELECT coalesce(jsonb_agg(x.payload ORDER BY x.alert_id), '[]') INTO changes
      FROM (SELECT u.alert_id, jsonb_build_object('event', 'opened', 'alert_id', u.alert_id, 'subject_type', u.subject_type,
                                     'subject', u.subject, 'kind', u.kind, 'severity', u.severity,
                                     'opened_at', u.opened_at, 'details', u.details) AS payload
              FROM upsert u WHERE u.is_new
            UNION ALL
            SELECT g.alert_id, jsonb_build_object('event', 'resolved', 'alert_id', g.alert_id, 'subject_type', g.subject_type,
                                     'subject', g.subject, 'kind', g.kind, 'severity', g.severity,
                                     'opened_at', g.opened_at, 'resolved_at', g.resolved_at, 'count', g.count,
                                     'acked_by', g.acked_by)
              FROM gone g) x;
    -- Open alerts nobody acknowledged: raised one severity once, after escalate_after; and a
    -- reminder every renotify interval after the latest notification.
    WITH esc AS (
        UPDATE tide.alert a
           SET severity = CASE a.severity WHEN 'info' THEN 'warning'::tide.severity ELSE 'critical' END,
               escalated_at = p_now, notified_at = p_now
         WHERE a.resolved_at IS NULL AND a.acked_at IS NULL AND a.escalated_at IS NULL AND a.severity < 'critical'
           AND escalate_after > interval '0' AND a.opened_at <= p_now - escalate_after
           AND (NOT p_only_self OR a.subject_type = 'pg_tide')
        RETURNING a.*
    ), remind AS (
        UPDATE tide.alert a SET reminders = a.reminders + 1, notified_at = p_now
         WHERE a.resolved_at IS NULL AND a.acked_at IS NULL AND renotify > interval '0'
           AND coalesce(a.notified_at, a.opened_at) <= p_now - renotify
           AND NOT EXISTS (SELECT 1 FROM esc WHERE esc.alert_id = a.alert_id)
           AND (NOT p_only_self OR a.subject_type = 'pg_tide')
        RETURNING a.*
    )
    SELECT changes || coalesce(jsonb_agg(x.payload ORDER BY x.alert_id), '[]') INTO changes
      FROM (SELECT e.alert_id, jsonb_build_object('event', 'escalated', 'alert_id', e.alert_id, 'subject_type', e.subject_type,
                                     'subject', e.subject, 'kind', e.kind, 'severity', e.severity,
                                     'opened_at', e.opened_at, 'details', e.details) AS payload
              FROM esc e
            UNION ALL
            SELECT m.alert_id, jsonb_build_object('event', 'renotify', 'reminder', m.reminders, 'alert_id', m.alert_id,
                                     'subject_type', m.subject_type, 'subject', m.subject, 'kind', m.kind,
                                     'severity', m.severity, 'opened_at', m.opened_at, 'details', m.details)
              FROM remind m) x;
    FOR c IN SELECT * FROM jsonb_array_elements(changes) LOOP
        -- Any role may LISTEN on any channel: the notification says what happened to which
        -- alert, and each role reads the alerts it may see from tide.alert (row security).
        PERFORM tide._notify('pg_tide_alert', jsonb_build_object('event', c->'event', 'alert_id', c->'alert_id')::text);
        PERFORM tide._alert_deliver(c);
        IF c->>'event' = 'opened' THEN
            opened := opened + 1;
        ELSIF c->>'event' = 'resolved' THEN
            resolved := resolved + 1;
        END IF;
        RAISE LOG 'pg_tide: alert=% alert_id=% subject_type=% subject=% kind=% severity=%', c->>'event',
            c->>'alert_id', c->>'subject_type', tide._logfmt(c->>'subject'), c->>'kind', c->>'severity';
    END LOOP;
    RETURN jsonb_build_object('alerts_opened', opened, 'alerts_resolved', resolved);
END
$$;
COMMENT ON FUNCTION tide._evaluate_alerts(timestamptz, boolean) IS
    'Internal: opens and resolves alerts at an instant (one open alert per subject and kind), escalates and reminds of unacknowledged ones, NOTIFYs pg_tide_alert with the event and the alert''s id (nothing of any role''s data: any role may LISTEN) and records the deliveries of each change.';

-- Row-level security and grants, as for the other tables: every role reads its own rows and
-- changes them only through the functions above.
ALTER TABLE tide.alert_route ENABLE ROW LEVEL SECURITY;
CREATE POLICY alert_route_owner ON tide.alert_route FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.alert_route TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.alert_route', '');
ALTER TABLE tide.alert ENABLE ROW LEVEL SECURITY;
CREATE POLICY alert_owner ON tide.alert FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.alert TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.alert', '');
SELECT pg_catalog.pg_extension_config_dump('tide.alert_alert_id_seq', '');

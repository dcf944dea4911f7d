-- Alert delivery by pg_tide itself: channels (tide.create_channel) of kind webhook or email,
-- delivered by pg_tide's delivery worker (src/alerts/delivery.rs) from the side-effect outbox
-- (src/effects/effects.sql): once per opening, escalation, reminder and resolution of an alert, retried
-- with backoff, dead after its attempts (the channel's delivery_failed alert, and
-- tide.self_health, show it), never recorded twice for one alert event.
--
-- Secrets (a webhook's URL and signing secret, an SMTP password) live in tide.alert_channel,
-- which only its owner (and superusers) can read; the outbox holds the alert only, and no error,
-- log line, explain line or metric names them.

CREATE TABLE tide.alert_channel (
    name          tide.channel NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('webhook', 'email')),
    config        jsonb NOT NULL,
    -- The lowest severity routed to it; NULL: none (the channel is kept, quiet).
    alerts        tide.severity,
    owner         name NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_sent_at  timestamptz,
    last_error    text,
    last_error_at timestamptz,
    CONSTRAINT alert_channel_pkey PRIMARY KEY (owner, name)
);
COMMENT ON TABLE tide.alert_channel IS
    'Channels alerts are delivered to by pg_tide''s delivery worker (tide.create_channel): each opening, escalation, reminder and resolution of an alert of at least severity alerts that its owner may see. config holds secrets: only the owner and superusers read it.';
-- Its owner alone: not even tide_admin reads another role's secrets.
ALTER TABLE tide.alert_channel ENABLE ROW LEVEL SECURITY;
CREATE POLICY alert_channel_owner ON tide.alert_channel FOR SELECT USING (owner = current_user);
GRANT SELECT ON tide.alert_channel TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.alert_channel', '');

-- Alert deliveries of each channel by outcome, counted as they happen (the outbox's rows are
-- pruned; these counters never go down): the pg_tide_deliveries_total of tide.metrics().
CREATE TABLE tide.delivery_count (
    owner   name NOT NULL,
    channel text NOT NULL,
    outcome text NOT NULL CHECK (outcome IN ('sent', 'failed', 'dead')),
    value   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, channel, outcome)
);
COMMENT ON TABLE tide.delivery_count IS
    'Alert deliveries of pg_tide''s channels by outcome: sent, failed attempts, dead (given up). Counters that never go down (tide.metrics(): pg_tide_deliveries_total).';
ALTER TABLE tide.delivery_count ENABLE ROW LEVEL SECURITY;
CREATE POLICY delivery_count_owner ON tide.delivery_count FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.delivery_count TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.delivery_count', '');

-- The keys each kind takes, for clear errors on typos.
CREATE FUNCTION tide._channel_config(p_kind text, p_config jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    allowed text[] := CASE p_kind WHEN 'webhook' THEN ARRAY['url', 'secret', 'format']
                                  ELSE ARRAY['host', 'port', 'tls', 'username', 'password', 'from', 'to', 'ca_cert'] END;
    hint text := CASE p_kind
        WHEN 'webhook' THEN '{"url": "https://hooks.slack.com/services/...", "secret": "for the X-Tide-Signature header (optional)", "format": "chat or json (optional)"}'
        ELSE '{"host": "smtp.example.com", "port": 587, "username": "...", "password": "...", "from": "pg_tide@example.com", "to": ["ops@example.com"]} (tls: starttls (default), tls or none; ca_cert: a PEM certificate to trust)' END;
    bad text;
    k text;
BEGIN
    IF p_config IS NULL OR jsonb_typeof(p_config) <> 'object' THEN
        RAISE EXCEPTION 'config of a % channel must be a JSON object, got %', p_kind, coalesce(jsonb_typeof(p_config), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = hint;
    END IF;
    PERFORM tide._jsonb_arg('config', p_config, 65536);
    SELECT string_agg(quote_literal(left(x, 40)), ', ') INTO bad FROM jsonb_object_keys(p_config) x WHERE x <> ALL (allowed);
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'unknown key % in the config of a % channel', bad, p_kind
            USING ERRCODE = 'invalid_parameter_value', HINT = 'the keys are ' || array_to_string(allowed, ', ') || ': ' || hint;
    END IF;
    -- Every value a string, but port; none names its value in an error (they may be secret).
    SELECT string_agg(x.key, ', ') INTO bad FROM jsonb_each(p_config) x
     WHERE CASE WHEN x.key = 'port' THEN jsonb_typeof(x.value) <> 'number'
                WHEN x.key = 'to' THEN jsonb_typeof(x.value) NOT IN ('string', 'array')
                ELSE jsonb_typeof(x.value) <> 'string' OR btrim(x.value #>> '{}') = '' END;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'config key % of a % channel has the wrong type or is empty', bad, p_kind
            USING ERRCODE = 'invalid_parameter_value', HINT = hint;
    END IF;
    IF p_kind = 'webhook' THEN
        k := p_config->>'url';
        IF k IS NULL OR k !~ '^https?://[^/\s]+(/\S*)?$' OR length(k) > 2000 THEN
            RAISE EXCEPTION 'config key url of a webhook channel must be an http:// or https:// URL of at most 2000 characters'
                USING ERRCODE = 'invalid_parameter_value', HINT = hint;
        END IF;
        IF coalesce(p_config->>'format', 'chat') NOT IN ('chat', 'json') THEN
            RAISE EXCEPTION 'config key format of a webhook channel must be chat or json, got %', quote_literal(left(p_config->>'format', 40))
                USING ERRCODE = 'invalid_parameter_value', HINT = 'chat: a body Slack, Mattermost and Discord accept; json: the alert as it is';
        END IF;
    ELSE
        IF p_config->>'host' IS NULL OR p_config->>'from' IS NULL OR p_config->'to' IS NULL THEN
            RAISE EXCEPTION 'an email channel needs config keys host, from and to'
                USING ERRCODE = 'invalid_parameter_value', HINT = hint;
        END IF;
        IF (p_config->>'port') IS NOT NULL AND ((p_config->>'port')::numeric NOT BETWEEN 1 AND 65535 OR (p_config->>'port')::numeric % 1 <> 0) THEN
            RAISE EXCEPTION 'config key port of an email channel must be between 1 and 65535, got %', p_config->>'port'
                USING ERRCODE = 'invalid_parameter_value', HINT = '587 for STARTTLS, 465 for tls';
        END IF;
        IF coalesce(p_config->>'tls', 'starttls') NOT IN ('starttls', 'tls', 'none') THEN
            RAISE EXCEPTION 'config key tls of an email channel must be starttls, tls or none, got %', quote_literal(left(p_config->>'tls', 40))
                USING ERRCODE = 'invalid_parameter_value', HINT = 'starttls (port 587, the default), tls (port 465), none (a relay on this machine only)';
        END IF;
        SELECT string_agg(quote_literal(left(a, 100)), ', ') INTO bad
          FROM (SELECT p_config->>'from' AS a
                UNION ALL SELECT x #>> '{}' FROM jsonb_array_elements(CASE jsonb_typeof(p_config->'to') WHEN 'array' THEN p_config->'to' ELSE jsonb_build_array(p_config->'to') END) x) y
         WHERE a IS NULL OR a !~ '^[^@\s<>]+@[^@\s<>]+$';
        IF bad IS NOT NULL OR jsonb_array_length(CASE jsonb_typeof(p_config->'to') WHEN 'array' THEN p_config->'to' ELSE '[1]' END) NOT BETWEEN 1 AND 100 THEN
            RAISE EXCEPTION 'from and to of an email channel must be 1 to 100 addresses like ops@example.com, got %', coalesce(bad, 'an empty list')
                USING ERRCODE = 'invalid_parameter_value', HINT = hint;
        END IF;
        IF p_config ? 'ca_cert' AND strpos(p_config->>'ca_cert', '-----BEGIN CERTIFICATE-----') = 0 THEN
            RAISE EXCEPTION 'config key ca_cert of an email channel must be a PEM certificate'
                USING ERRCODE = 'invalid_parameter_value', HINT = 'the text of the relay''s certificate (or its CA''s), from -----BEGIN CERTIFICATE----- to -----END CERTIFICATE-----';
        END IF;
        IF (p_config ? 'username') <> (p_config ? 'password') THEN
            RAISE EXCEPTION 'an email channel needs both username and password, or neither'
                USING ERRCODE = 'invalid_parameter_value', HINT = hint;
        END IF;
    END IF;
    RETURN p_config;
END
$$;
COMMENT ON FUNCTION tide._channel_config(text, jsonb) IS 'Internal: a channel''s config checked for its kind, else a clear error that never shows a secret.';

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

-- Whether a channel's owner receives an alert: its own, a role it is a member of (a team), or
-- every alert for a superuser or a member of tide_admin.
CREATE FUNCTION tide._routed(p_channel_owner name, p_alert_owner name) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p_channel_owner = p_alert_owner
        OR EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = p_channel_owner
                      AND (r.rolsuper OR tide._can_set_role(p_channel_owner, 'tide_admin')
                           OR tide._can_set_role(p_channel_owner, p_alert_owner)))
$$;
COMMENT ON FUNCTION tide._routed(name, name) IS
    'Internal: whether a role''s channels and routes receive another role''s alerts (its own, a role it is a member of, or all for a superuser or tide_admin).';

-- Who takes an alert: the routes (src/alerts/alerts.sql's tide.create_alert_route, taken by your own
-- workers) and the channels (sent by pg_tide) that receive its owner's alerts of its severity
-- (and kind), of its resolution when p_resolved. The one rule of tide._alert_deliver and of
-- pg_tide's undelivered alert (no one takes an open alert). The alert's type is defined later
-- (src/alerts/alerts.sql): its fields come as text.
CREATE FUNCTION tide._alert_takers(p_owner name, p_severity text, p_kind text, p_subject_type text, p_subject text,
                                   p_resolved boolean)
RETURNS TABLE (channel text, owner name)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
        SELECT r.channel::text, r.owner FROM tide.alert_route r
         WHERE tide._routed(r.owner, p_owner) AND p_severity::tide.severity >= r.min_severity
           AND (r.kinds IS NULL OR p_kind = ANY (r.kinds::text[]))
           AND (NOT p_resolved OR r.resolved)
        UNION
        SELECT c.name::text, c.owner FROM tide.alert_channel c
         WHERE c.alerts IS NOT NULL AND p_severity::tide.severity >= c.alerts AND tide._routed(c.owner, p_owner)
           -- A channel is not told that it is failing (it would fail again).
           AND NOT (p_kind = 'delivery_failed' AND p_subject_type = 'channel' AND p_subject = c.name
                    AND p_owner = c.owner);
END
$$;
COMMENT ON FUNCTION tide._alert_takers(name, text, text, text, text, boolean) IS
    'Internal: the routes and channels that take an alert of an owner, severity, kind and subject (of its resolution when p_resolved).';

-- Records the deliveries of one alert event (opened, escalated, renotify, resolved): one side
-- effect per route and channel that takes it (tide._alert_takers), keyed
-- alert:<id>:<event>:<channel>, so never twice.
CREATE FUNCTION tide._alert_deliver(p_event jsonb) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tag text := CASE p_event->>'event' WHEN 'renotify' THEN 'renotify' || (p_event->>'reminder') ELSE p_event->>'event' END;
    n integer;
BEGIN
    WITH delivery AS (
        INSERT INTO tide.effect (channel, dedupe_key, payload, owner)
        SELECT x.channel, format('alert:%s:%s:%s', a.alert_id, tag, x.channel), p_event, x.owner
          FROM tide.alert a
         CROSS JOIN LATERAL tide._alert_takers(a.owner, a.severity::text, a.kind::text, a.subject_type, a.subject,
                                               p_event->>'event' = 'resolved') x
         WHERE a.alert_id = (p_event->>'alert_id')::bigint
        ON CONFLICT ON CONSTRAINT effect_owner_dedupe_key_key DO NOTHING
        RETURNING channel
    )
    SELECT count(*) INTO n FROM delivery d;
    -- A hint for external delivery workers, as tide.create_effect gives.
    IF n > 0 THEN
        PERFORM tide._notify('pg_tide_effect', '');
    END IF;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._alert_deliver(jsonb) IS
    'Internal: records the deliveries of one alert event, once per route and channel that receives it (dedupe key alert:<id>:<event>:<channel>).';

-- The delivery worker's claim: pending side effects of the channels pg_tide sends, under a
-- lease of 2 minutes (a batch of 5 sends of at most 10 s each fits well within it).
CREATE FUNCTION tide._delivery_claim(p_n integer)
RETURNS TABLE (effect_id bigint, lease_token bigint, kind text, config jsonb, payload jsonb, dedupe_key text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ids bigint[];
    token bigint;
BEGIN
    SELECT array_agg(x.effect_id) INTO ids FROM (
        SELECT e.effect_id FROM tide.effect e
         WHERE e.state = 'pending' AND e.available_at <= now()
           AND EXISTS (SELECT 1 FROM tide.alert_channel c WHERE c.owner = e.owner AND c.name = e.channel)
         ORDER BY e.available_at, e.effect_id
         LIMIT p_n FOR UPDATE SKIP LOCKED) x;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    token := nextval('tide.lease_token_seq');
    RETURN QUERY
        WITH claimed AS (
            UPDATE tide.effect e
               SET state = 'sending', attempts = e.attempts + 1, worker = 'pg_tide delivery', lease_token = token,
                   lease_expires_at = now() + interval '2 minutes'
             WHERE e.effect_id = ANY (ids)
            RETURNING e.*
        )
        SELECT c.effect_id, c.lease_token, ch.kind, ch.config, c.payload, c.dedupe_key
          FROM claimed c JOIN tide.alert_channel ch ON ch.owner = c.owner AND ch.name = c.channel
         ORDER BY c.effect_id;
END
$$;
COMMENT ON FUNCTION tide._delivery_claim(integer) IS
    'Internal: the delivery worker takes up to n pending alert deliveries of pg_tide''s channels under a lease, with each channel''s kind and config.';

-- The outcome of one send. A token that no longer holds the effect (the lease expired and it was
-- taken back) changes nothing.
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

-- At its start, the delivery worker takes back what an earlier life of it held: sent at least
-- once more, now rather than when the lease expires.
CREATE FUNCTION tide._delivery_recover() RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    UPDATE tide.effect e SET state = 'pending', available_at = now(), lease_expires_at = NULL,
                             last_error = 'the delivery worker stopped while sending it'
     WHERE e.state = 'sending' AND e.worker = 'pg_tide delivery';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._delivery_recover() IS 'Internal: at its start, the delivery worker takes back the deliveries its earlier life held.';

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

-- tide.schedule and tide.alter warn when nothing would run the task: no scheduler serves this
-- database (it is not pg_tide.database, or the scheduler is not running), or pg_tide.enabled is
-- off. Quiet where pg_tide.allow_unscheduled says so (tests that drive tide.tick themselves).
CREATE FUNCTION tide._scheduler_warning() RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF tide._setting('allow_unscheduled', 'off') = 'on' THEN
        RETURN;
    END IF;
    -- This database's scheduler may be starting: the server started, or the scheduler last
    -- ticked, in the last 10 s (it was terminated or crashed: its restart time is one second). It
    -- connects within a second or two: only one still absent after three is worth a warning.
    -- One gone for longer is warned of at once (an import of many jobs does not wait for each).
    IF current_database() = tide._setting('database', 'postgres')
       AND (tide._watch()->>'alive_at')::float8 / 1000 > extract(epoch FROM clock_timestamp()) - 10 THEN
        FOR i IN 1..30 LOOP
            PERFORM pg_stat_clear_snapshot();
            EXIT WHEN EXISTS (SELECT 1 FROM pg_stat_activity a
                               WHERE a.backend_type = 'pg_tide scheduler' AND a.datname = current_database());
            PERFORM pg_sleep(0.1);
        END LOOP;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                    WHERE a.backend_type = 'pg_tide scheduler' AND a.datname = current_database()) THEN
        RAISE WARNING 'no pg_tide scheduler is running for database "%": the task will not fire', current_database()
            USING HINT = format('pg_tide serves the database pg_tide.database names (now "%s"); check that pg_tide is in shared_preload_libraries and see the server log',
                                tide._setting('database', 'postgres'));
    ELSIF tide._setting('enabled', 'on') = 'off' THEN
        RAISE WARNING 'pg_tide.enabled is off: the task will not fire until it is turned on'
            USING HINT = 'ALTER SYSTEM SET pg_tide.enabled = on; SELECT pg_reload_conf();';
    END IF;
END
$$;
COMMENT ON FUNCTION tide._scheduler_warning() IS
    'Internal: the WARNING tide.schedule and tide.alter give when no scheduler runs for this database (one that is starting, with the server or after a crash, is waited for, up to 3 s) or pg_tide.enabled is off.';

-- Deduplicated side effects (an outbox): messages to the world outside the database (SMS,
-- e-mail, push, webhooks, chat) recorded with a dedupe key in the same transaction as the work
-- that causes them, and handed to delivery workers by channel.
--
-- Recording is exactly once: the key is unique per owner, so however often the work reruns
-- (retry, replay, forced rerun, a racing worker), the message is recorded once, and a rolled-back
-- transaction records nothing. Hand-off is fenced like runs: a delivered message is never handed
-- out again; one whose worker died is handed out again after its lease, with the same dedupe key,
-- which the worker passes to the provider as its idempotency key.

CREATE TYPE tide.effect_state AS ENUM ('pending', 'sending', 'delivered', 'dead');
COMMENT ON TYPE tide.effect_state IS
    'pending = waiting for a delivery worker (or for its retry time); sending = handed to a worker under a lease; delivered; dead = gave up after max attempts or a permanent error.';

-- A delivery channel name ('sms', 'chat:ops'); alert routes use it too.
CREATE DOMAIN tide.channel AS text CHECK (VALUE ~ '^[A-Za-z0-9_.:-]{1,63}$');
COMMENT ON DOMAIN tide.channel IS 'A side-effect channel: 1 to 63 letters, digits, _ . : -.';

CREATE FUNCTION tide._channel(value text) RETURNS tide.channel
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF value IS NOT NULL THEN
        RETURN value::tide.channel;
    END IF;
    RAISE check_violation;
EXCEPTION WHEN check_violation THEN
    RAISE EXCEPTION 'invalid channel %', coalesce(quote_literal(left(value, 100)), 'NULL')
        USING ERRCODE = 'invalid_parameter_value',
              HINT = 'a channel is 1 to 63 letters, digits, _ . : -, such as ''sms'' or ''chat:ops''';
END
$$;
COMMENT ON FUNCTION tide._channel(text) IS 'Internal: a channel name, or a clear error naming the bad value.';

CREATE TABLE tide.effect (
    effect_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel          tide.channel NOT NULL,
    dedupe_key       text NOT NULL CHECK (btrim(dedupe_key) <> ''),
    payload          jsonb NOT NULL DEFAULT '{}',
    run_id           bigint,
    state            tide.effect_state NOT NULL DEFAULT 'pending',
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL DEFAULT 10 CHECK (max_attempts BETWEEN 1 AND 100),
    available_at     timestamptz NOT NULL DEFAULT now(),
    worker           text,
    lease_token      bigint,
    lease_expires_at timestamptz,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    owner            name NOT NULL,
    UNIQUE (owner, dedupe_key)
);
COMMENT ON TABLE tide.effect IS
    'Side effects recorded with tide.create_effect: one row per dedupe key (per owner), delivered by workers through tide.claim_effects / tide.complete_effect / tide.fail_effect.';
COMMENT ON COLUMN tide.effect.run_id IS 'The run whose command recorded it (inside an SQL command), or NULL.';
-- Delivery workers claim by channel; the tick takes back expired leases.
CREATE INDEX effect_claim_idx ON tide.effect (channel, available_at, effect_id) WHERE state = 'pending';
CREATE INDEX effect_sending_idx ON tide.effect (lease_expires_at) WHERE state = 'sending';
-- Retention prunes delivered effects by age (tide._prune).
CREATE INDEX effect_delivered_idx ON tide.effect (delivered_at) WHERE state = 'delivered';
-- Dead deliveries of a channel (its delivery_failed alert, tide.self_health).
CREATE INDEX effect_dead_idx ON tide.effect (owner, channel, created_at) WHERE state = 'dead';

CREATE FUNCTION tide.create_effect(channel text, dedupe_key text, payload jsonb DEFAULT '{}', max_attempts integer DEFAULT 10)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id bigint;
BEGIN
    PERFORM tide._channel(create_effect.channel);
    IF create_effect.dedupe_key IS NULL OR btrim(create_effect.dedupe_key) = '' THEN
        RAISE EXCEPTION 'dedupe_key must not be empty, got %', coalesce(quote_literal(left(create_effect.dedupe_key, 20)), 'NULL')
            USING ERRCODE = CASE WHEN create_effect.dedupe_key IS NULL THEN 'null_value_not_allowed' ELSE 'invalid_parameter_value' END,
                  HINT = 'derive it from what the message is about, such as ''invoice:'' || invoice_id || '':reminder''';
    END IF;
    PERFORM tide._text_arg('dedupe_key', create_effect.dedupe_key, 1000,
                           'derive it from what the message is about, such as ''invoice:'' || invoice_id || '':reminder''');
    PERFORM tide._jsonb_arg('payload', create_effect.payload, 1048576);
    IF create_effect.payload IS NULL OR create_effect.max_attempts IS NULL OR create_effect.max_attempts NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'payload must not be NULL and max_attempts must be between 1 and 100, got %',
            coalesce(create_effect.max_attempts::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass payload => ''{}'' and max_attempts => 10';
    END IF;
    INSERT INTO tide.effect (channel, dedupe_key, payload, run_id, max_attempts, owner)
    VALUES (create_effect.channel, create_effect.dedupe_key, create_effect.payload, tide.run_id(), create_effect.max_attempts, tide._caller())
    ON CONFLICT ON CONSTRAINT effect_owner_dedupe_key_key DO NOTHING
    RETURNING effect_id INTO id;
    IF id IS NOT NULL THEN
        -- A hint for waiting delivery workers, with no name in it (any role may LISTEN): one per
        -- transaction (PostgreSQL folds identical ones), none while the notification queue is
        -- half full (src/wake.rs).
        PERFORM tide._notify('pg_tide_effect', '');
        RETURN id;
    END IF;
    SELECT e.effect_id INTO id FROM tide.effect e
     WHERE e.owner = tide._caller() AND e.dedupe_key = create_effect.dedupe_key;
    RETURN id;
END
$$;
COMMENT ON FUNCTION tide.create_effect(text, text, jsonb, integer) IS
    'create_effect(channel, dedupe_key, payload => ''{}'', max_attempts => 10): records a side effect in the caller''s transaction, once per dedupe key (per role), and returns its effect_id; a key already recorded (a rerun) records nothing and returns the existing effect_id. Delivery workers take it with tide.claim_effects.';

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

-- A token that no longer holds the effect is refused, and nothing changes.
CREATE FUNCTION tide._effect_held(p_effect_id bigint, p_token bigint, p_function text) RETURNS tide.effect
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    e tide.effect;
BEGIN
    SELECT * INTO e FROM tide.effect x WHERE x.effect_id = p_effect_id AND tide._may_act(x.owner) FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no side effect %', coalesce(p_effect_id::text, 'NULL') USING ERRCODE = 'undefined_object',
            HINT = 'pass the effect_id tide.claim_effects returned';
    END IF;
    IF e.state <> 'sending' OR e.lease_token IS DISTINCT FROM p_token THEN
        RAISE EXCEPTION 'lease token % of side effect % is stale: it is now % (token %)', coalesce(p_token::text, 'NULL'),
            p_effect_id, e.state, coalesce(e.lease_token::text, 'none')
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('%s: this worker no longer holds it (its lease expired and it was handed out again, or it is settled)', p_function);
    END IF;
    RETURN e;
END
$$;
COMMENT ON FUNCTION tide._effect_held(bigint, bigint, text) IS 'Internal: the side effect, if the token still holds it; else a clear error.';

CREATE FUNCTION tide.complete_effect(effect_id bigint, lease_token bigint) RETURNS tide.effect_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM tide._effect_held(complete_effect.effect_id, complete_effect.lease_token, 'tide.complete_effect');
    UPDATE tide.effect e SET state = 'delivered', delivered_at = now(), lease_expires_at = NULL, last_error = NULL
     WHERE e.effect_id = complete_effect.effect_id;
    RETURN 'delivered';
END
$$;
COMMENT ON FUNCTION tide.complete_effect(bigint, bigint) IS
    'complete_effect(effect_id, lease_token): records that a side effect was delivered; it is never handed out again. A stale lease token is refused. Returns the new state (delivered).';

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

CREATE FUNCTION tide.replay_effect(effect_id bigint) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE tide.effect e SET state = 'pending', available_at = now(), attempts = 0, last_error = NULL
     WHERE e.effect_id = replay_effect.effect_id AND e.state = 'dead' AND tide._may_act(e.owner);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'side effect % is not dead', coalesce(replay_effect.effect_id::text, 'NULL')
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'only dead side effects are delivered again; a delivered one never is';
    END IF;
    RETURN replay_effect.effect_id;
END
$$;
COMMENT ON FUNCTION tide.replay_effect(bigint) IS
    'replay_effect(effect_id): puts a dead side effect back in line with a fresh attempt budget (a delivered one never goes out again); returns effect_id.';

-- The tick takes back side effects whose delivery worker's lease expired.
CREATE FUNCTION tide._tick_effects(p_now timestamptz) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n integer;
BEGIN
    UPDATE tide.effect e
       SET state = CASE WHEN e.attempts >= e.max_attempts THEN 'dead' ELSE 'pending' END::tide.effect_state,
           last_error = format('lease of %s (token %s) expired', coalesce(e.worker, 'a worker'), e.lease_token),
           lease_expires_at = NULL, available_at = least(p_now, now())
     WHERE e.effect_id IN (SELECT x.effect_id FROM tide.effect x
                            WHERE x.state = 'sending' AND x.lease_expires_at < p_now
                            FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
COMMENT ON FUNCTION tide._tick_effects(timestamptz) IS
    'Internal: the tick takes back side effects whose delivery lease expired (they are handed out again, with the same dedupe key).';

ALTER TABLE tide.effect ENABLE ROW LEVEL SECURITY;
CREATE POLICY effect_owner ON tide.effect FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.effect TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('tide.effect', '');
SELECT pg_catalog.pg_extension_config_dump('tide.effect_effect_id_seq', '');

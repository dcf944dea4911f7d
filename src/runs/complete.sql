-- Ending an attempt: tide.complete_run and tide.complete_runs (fenced by the lease token),
-- tide.fail_run and tide._fail (retry with backoff, or dead), every change an UPDATE of
-- tide.run recorded by tide._run_changed (src/runs/ledger.sql).

CREATE FUNCTION tide.complete_run(run_id bigint, lease_token bigint, result jsonb DEFAULT NULL,
                              expected bigint DEFAULT NULL, actual bigint DEFAULT NULL)
RETURNS tide.run_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT, whatever the backlog (see tide._claim).
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    short boolean := complete_run.actual < complete_run.expected;
    done tide.run_state;
    attempt_no integer;
    why text;
    who name;
    worker text;
    claimed timestamptz;
    finished timestamptz;
    task bigint;
    gated boolean;
    in_owner name;
    in_queue text;
    was_counted boolean;
    ignored text;
    -- Who may complete the run: its owner (the common case, compared without a call), a member
    -- of the owner's role, a superuser.
    caller name := tide._caller();
    any_owner boolean := tide._caller_is_superuser();
BEGIN
    IF complete_run.expected < 0 OR complete_run.actual < 0 THEN
        RAISE EXCEPTION 'expected and actual must not be negative, got expected %, actual %',
            complete_run.expected, complete_run.actual
            USING ERRCODE = 'invalid_parameter_value', HINT = 'pass the number of records the run should have and did process';
    END IF;
    PERFORM tide._jsonb_arg('result', complete_run.result, 1048576);
    -- The hot path of every worker: plain statements (cheaper here than data-modifying CTEs),
    -- and the history row written here rather than by the trigger.
    ignored := set_config('tide.history', 'written', true);
    UPDATE tide.run r
       SET state = CASE WHEN short THEN 'need_check' ELSE 'succeeded' END::tide.run_state,
           result = complete_run.result,
           expected = complete_run.expected,
           actual = complete_run.actual,
           -- The clock, not the transaction's start: an executor completes in the transaction
           -- that ran the command, so now() would leave the command out of the run's duration.
           finished_at = clock_timestamp(),
           updated_at = now(),
           lease_expires_at = NULL,
           control = NULL,
           reason = CASE WHEN short
                         THEN format('completed short: expected %s, actual %s', complete_run.expected, complete_run.actual)
                         ELSE format('completed by %s', coalesce(r.lease_owner, 'a worker')) END
     WHERE r.run_id = complete_run.run_id AND r.lease_token = complete_run.lease_token AND r.state = 'running'
       AND (any_owner OR r.owner = caller OR tide._may_work(r.owner, r.queue))
    RETURNING r.state, r.attempts, r.reason, r.owner, r.lease_owner, r.claimed_at, r.finished_at, r.task_id
         INTO done, attempt_no, why, who, worker, claimed, finished, task;
    ignored := set_config('tide.history', '', true);
    IF NOT FOUND THEN
        PERFORM tide._refuse_stale(complete_run.run_id, complete_run.lease_token, 'tide.complete_run');
    END IF;
    IF short THEN
        -- (counted is left as it was: it means something only while running.)
        UPDATE tide.pending p SET state = 'need_check', due_at = NULL WHERE p.run_id = complete_run.run_id
        RETURNING p.gated, p.owner, p.queue, p.counted INTO gated, in_owner, in_queue, was_counted;
    ELSE
        DELETE FROM tide.pending p WHERE p.run_id = complete_run.run_id
        RETURNING p.gated, p.owner, p.queue, p.counted INTO gated, in_owner, in_queue, was_counted;
    END IF;
    IF gated THEN
        PERFORM tide._release(ARRAY[complete_run.run_id]);
    END IF;
    IF was_counted THEN
        -- A run its queue's max_concurrency counted gives the room back (tide.queue).
        PERFORM tide._queue_ended(in_owner, in_queue, 1);
    END IF;
    -- The history row, and what it counts: the task touched, the outcome, and a success's
    -- duration (tide._write_history).
    PERFORM tide._write_history(ARRAY[ROW(complete_run.run_id, task, who, 'running', done, why, NULL, attempt_no, worker,
                                          complete_run.lease_token, claimed,
                                          CASE WHEN short THEN 'need_check' ELSE 'succeeded' END,
                                          NULL, NULL, NULL, attempt_no, finished, NULL, NULL, NULL)::tide.run_change],
                                true);
    IF tide._log_on() THEN
        PERFORM tide._log_runs(CASE WHEN short THEN 'need_check' ELSE 'success' END, ARRAY[complete_run.run_id]);
    END IF;
    RETURN done;
END
$$;
COMMENT ON FUNCTION tide.complete_run(bigint, bigint, jsonb, bigint, bigint) IS
    'complete_run(run_id, lease_token, result => NULL, expected => NULL, actual => NULL): finishes a claimed run: succeeded, or need_check when actual < expected. A stale lease token is refused and nothing changes.';

CREATE FUNCTION tide.complete_runs(run_ids bigint[], lease_tokens bigint[], results jsonb[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
-- No JIT, whatever the backlog (see tide._claim).
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    done_ids bigint[];
    gated_ids bigint[];
    ended_owners name[];
    ended_queues text[];
    ended_n integer[];
    stale record;
    ignored text;
    changes tide.run_change[];
    caller name := tide._caller();
    any_owner boolean := tide._caller_is_superuser();
BEGIN
    IF coalesce(cardinality(complete_runs.run_ids), 0) = 0
       AND coalesce(cardinality(complete_runs.lease_tokens), 0) = 0 THEN
        RETURN 0;  -- an empty claim: nothing to complete
    END IF;
    IF complete_runs.run_ids IS NULL OR complete_runs.lease_tokens IS NULL
       OR cardinality(complete_runs.run_ids) <> cardinality(complete_runs.lease_tokens)
       OR cardinality(complete_runs.results) <> cardinality(complete_runs.run_ids) THEN
        RAISE EXCEPTION 'run_ids, lease_tokens and results must be arrays of the same length, got %, % and %',
            coalesce(cardinality(complete_runs.run_ids)::text, 'NULL'), coalesce(cardinality(complete_runs.lease_tokens)::text, 'NULL'),
            coalesce(cardinality(complete_runs.results)::text, 'no results')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass the run_id and lease_token columns of tide.claim_runs as arrays, in the same order';
    END IF;
    IF cardinality(complete_runs.run_ids) > 1000 THEN
        RAISE EXCEPTION 'complete at most 1000 runs at a time, got %', cardinality(complete_runs.run_ids)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'tide.claim_runs hands out at most 1000 runs at a time';
    END IF;
    -- All runs and their history (with the attempts they end) in one statement: the batch path
    -- of a busy worker.
    ignored := set_config('tide.history', 'written', true);
    WITH input AS (
        SELECT i.run_id, i.token, complete_runs.results[i.n] AS result
          FROM unnest(complete_runs.run_ids, complete_runs.lease_tokens) WITH ORDINALITY AS i(run_id, token, n)
    ), done_run AS (
        UPDATE tide.run r
           SET state = 'succeeded', result = i.result, finished_at = now(), updated_at = now(),
               lease_expires_at = NULL, control = NULL,
               reason = format('completed by %s', coalesce(r.lease_owner, 'a worker'))
          FROM input i
         WHERE r.run_id = i.run_id AND r.lease_token = i.token AND r.state = 'running'
           AND (any_owner OR r.owner = caller OR tide._may_work(r.owner, r.queue))
        RETURNING r.run_id, r.attempts, r.reason, r.owner, r.lease_owner, r.lease_token, r.claimed_at,
                  r.gated, r.task_id, r.finished_at
    ), done_pending AS (
        DELETE FROM tide.pending p USING done_run d WHERE p.run_id = d.run_id
        RETURNING p.owner, p.queue, p.counted
    ), ended AS (
        -- Runs their queues' max_concurrency counted, by queue.
        SELECT e.owner, e.queue, count(*)::integer AS n FROM done_pending e WHERE e.counted
         GROUP BY e.owner, e.queue
    )
    SELECT array_agg(d.run_id), array_agg(d.run_id) FILTER (WHERE d.gated),
           (SELECT array_agg(e.owner) FROM ended e), (SELECT array_agg(e.queue) FROM ended e),
           (SELECT array_agg(e.n) FROM ended e),
           array_agg(ROW(d.run_id, d.task_id, d.owner, 'running', 'succeeded', d.reason, NULL, d.attempts, d.lease_owner,
                         d.lease_token, d.claimed_at, 'succeeded', NULL, NULL, NULL, d.attempts, d.finished_at, NULL, NULL,
                         NULL)::tide.run_change)
      INTO done_ids, gated_ids, ended_owners, ended_queues, ended_n, changes FROM done_run d;
    -- The history rows, and what they count: the tasks touched, the successes and their
    -- durations (tide._write_history).
    IF changes IS NOT NULL THEN
        PERFORM tide._write_history(changes, true);
    END IF;
    ignored := set_config('tide.history', '', true);
    IF coalesce(cardinality(done_ids), 0) < cardinality(complete_runs.run_ids) THEN
        -- All or nothing: raising undoes the completions above.
        SELECT i.run_id, i.token INTO stale
          FROM unnest(complete_runs.run_ids, complete_runs.lease_tokens) AS i(run_id, token)
         WHERE i.run_id <> ALL (coalesce(done_ids, '{}')) LIMIT 1;
        IF FOUND THEN
            PERFORM tide._refuse_stale(stale.run_id, stale.token, 'tide.complete_runs');
        END IF;
        RAISE EXCEPTION 'run_ids must not repeat a run' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'complete each claimed run once';
    END IF;
    IF gated_ids IS NOT NULL THEN
        PERFORM tide._release(gated_ids);
    END IF;
    IF ended_owners IS NOT NULL THEN
        -- Room their queues counted goes back (tide.queue).
        PERFORM tide._queue_ended(u.owner, u.queue, u.n)
           FROM unnest(ended_owners, ended_queues, ended_n) AS u(owner, queue, n);
    END IF;
    IF tide._log_on() THEN
        PERFORM tide._log_runs('success', done_ids);
    END IF;
    RETURN cardinality(done_ids);
END
$$;
COMMENT ON FUNCTION tide.complete_runs(bigint[], bigint[], jsonb[]) IS
    'complete_runs(run_ids, lease_tokens, results => NULL): completes a batch of claimed runs as succeeded in one call, all or nothing: one stale lease token refuses the whole batch. Returns how many (0 for empty arrays, as an empty claim aggregates to).';

-- The one failure path: a worker's tide.fail_run, an SQL command's error, a lost lease.
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

CREATE FUNCTION tide.fail_run(run_id bigint, lease_token bigint, error text, kind text DEFAULT 'transient')
RETURNS tide.run_state
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    k tide.error_kind;
BEGIN
    IF fail_run.run_id IS NULL OR fail_run.lease_token IS NULL OR fail_run.error IS NULL OR fail_run.kind IS NULL THEN
        RAISE EXCEPTION '% must not be NULL',
            CASE WHEN fail_run.run_id IS NULL THEN 'run_id' WHEN fail_run.lease_token IS NULL THEN 'lease_token'
                 WHEN fail_run.error IS NULL THEN 'error' ELSE 'kind' END
            USING ERRCODE = 'null_value_not_allowed', HINT = 'say what went wrong: tide.fail_run(run_id, lease_token, ''timeout calling the bank'')';
    END IF;
    k := tide._error_kind_from(tide._text_arg('kind', fail_run.kind, 20, 'use ''transient'', ''business'' or ''not_ready'''))::tide.error_kind;
    PERFORM 1 FROM tide.run r
     WHERE r.run_id = fail_run.run_id AND r.lease_token = fail_run.lease_token AND r.state = 'running'
       AND tide._may_work(r.owner, r.queue)
       FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM tide._refuse_stale(fail_run.run_id, fail_run.lease_token, 'tide.fail_run');
    END IF;
    RETURN tide._fail(fail_run.run_id, fail_run.error, k, NULL, 'failed', now());
END
$$;
COMMENT ON FUNCTION tide.fail_run(bigint, bigint, text, text) IS
    'fail_run(run_id, lease_token, error, kind => ''transient''): records a failed attempt. transient = retry with backoff up to max_attempts; business = dead letter at once; not_ready = wait for the next window. Returns the run''s new state.';

-- ---------------------------------------------------------------------------------------------
-- Run log lines: one per run start, skip, success and failure, key=value.
-- Inlined into its callers (on the hot paths of claims, emits and the tick), so it has no SET
-- clause, which would forbid inlining: its body names everything with its schema instead, so it
-- is safe under any search_path (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._logfmt(v text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    -- Runs for every run start and end: strpos rather than a regular expression, and STABLE
    -- like to_json, so that it is inlined into the caller's query (an IMMUTABLE function
    -- calling a STABLE one is not).
    SELECT CASE WHEN v IS NULL THEN '-'
                WHEN v OPERATOR(pg_catalog.<>) '' AND pg_catalog.strpos(v, ' ') OPERATOR(pg_catalog.=) 0
                     AND pg_catalog.strpos(v, '"') OPERATOR(pg_catalog.=) 0
                     AND pg_catalog.strpos(v, '=') OPERATOR(pg_catalog.=) 0
                     AND pg_catalog.strpos(v, E'\n') OPERATOR(pg_catalog.=) 0
                     AND pg_catalog.strpos(v, E'\t') OPERATOR(pg_catalog.=) 0
                     AND pg_catalog.strpos(v, '\') OPERATOR(pg_catalog.=) 0 THEN v
                ELSE pg_catalog.to_json(v)::pg_catalog.text END
$$;
COMMENT ON FUNCTION tide._logfmt(text) IS 'Internal: a value for a key=value log line (quoted when needed).';

-- Whether run log lines are on: the hot paths (claims, completions, failures) ask this before
-- calling tide._log_runs, whose call alone cost a claim + complete at batch 1 a twentieth with
-- pg_tide.log_runs = off. Inlined into its callers, so it has no SET clause, which would forbid
-- inlining: its body names everything with its schema instead, so it is safe under any
-- search_path (scripts/pgspot.sh lists it).
CREATE FUNCTION tide._log_on() RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT tide._setting('log_runs', 'log') OPERATOR(pg_catalog.<>) 'off'
$$;
COMMENT ON FUNCTION tide._log_on() IS 'Internal: whether pg_tide.log_runs writes run log lines (it is not off).';

CREATE FUNCTION tide._log_runs(p_event text, p_run_ids bigint[], p_error text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lvl text := tide._setting('log_runs', 'log');
    line text;
BEGIN
    IF lvl = 'off' THEN
        RETURN;
    END IF;
    FOR line IN
        SELECT 'pg_tide: event=' || p_event || ' task=' || tide._logfmt(t.name) || ' run_id=' || r.run_id
               || ' biz_date=' || coalesce(r.biz_date::text, '-')
               || ' trigger=' || CASE WHEN r.state = 'skipped' THEN 'skip:' || r.skip_reason ELSE r.trigger::text END
               || ' version=' || r.version || ' attempt=' || r.attempts || ' state=' || r.state
               || ' duration=' || CASE WHEN p_event IN ('success', 'need_check', 'failure') AND r.claimed_at IS NOT NULL
                                       THEN round(extract(epoch FROM clock_timestamp() - r.claimed_at)::numeric, 3) || 's'
                                       ELSE '-' END
               || ' error=' || tide._logfmt(coalesce(p_error, CASE WHEN p_event = 'failure' THEN r.last_error END))
          FROM tide.run r JOIN tide.task t ON t.task_id = r.task_id
         WHERE r.run_id = ANY (p_run_ids) ORDER BY r.run_id
    LOOP
        IF lvl = 'log' THEN
            RAISE LOG '%', line;
        ELSIF lvl = 'info' THEN
            RAISE INFO '%', line;
        ELSE
            RAISE DEBUG '%', line;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION tide._log_runs(text, bigint[], text) IS
    'Internal: writes one key=value server log line per run (event start, skip, success, need_check, failure) at pg_tide.log_runs.';

-- ---------------------------------------------------------------------------------------------
-- The whole story of one run, for psql.
CREATE FUNCTION tide.explain(run_id bigint) RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The lines, returned at the end (pgspot cannot parse RETURN NEXT of an expression).
    story text[] := '{}';
    r tide.run;
    t tide.task;
    e record;
    a record;
    n integer;
    first_cover timestamptz;
    last_cover timestamptz;
BEGIN
    SELECT * INTO r FROM tide.run x WHERE x.run_id = $1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run %', coalesce($1::text, 'NULL') USING ERRCODE = 'undefined_object',
            HINT = 'find runs with: SELECT run_id, biz_date, state FROM tide.run ORDER BY run_id DESC LIMIT 20';
    END IF;
    SELECT * INTO t FROM tide.task x WHERE x.task_id = r.task_id;
    story := story || format('run %s of task %s, rule version %s (task now at version %s)', r.run_id, t.name, r.version, t.version);
    IF r.window_start IS NOT NULL THEN
        story := story || format('window: %s to %s (%s), business date %s', r.window_start, r.window_end, t.tz, r.biz_date);
    ELSE
        story := story || format('event run on %s, dedupe key %s%s, payload %s', r.topic, r.dedupe_key,
                           coalesce(', key ' || r.event_key || ' (runs of this key go one at a time, in emit order)', ''),
                           r.payload);
    END IF;
    FOR e IN SELECT b.backfill_id, b.from_date, b.to_date, b.state, b.mode, b.queue, w.seq, b.windows_total, w.canary, w.sampled,
                    w.verify_note
               FROM tide.backfill_window w JOIN tide.backfill b ON b.backfill_id = w.backfill_id
              WHERE w.run_id = r.run_id ORDER BY b.backfill_id LOOP
        story := story || format('backfill %s (%s to %s, mode %s, now %s): window %s of %s%s, in queue %s%s',
                                 e.backfill_id, e.from_date, e.to_date, e.mode, e.state, e.seq, e.windows_total,
                                 CASE WHEN e.canary THEN ' (canary)' WHEN e.sampled THEN ' (sampled)' ELSE '' END, e.queue,
                                 coalesce('; verify: ' || e.verify_note, ''));
    END LOOP;
    -- A reconciliation's run: what each comparison found (R7.4); a compensation: what for.
    FOR e IN SELECT x.* FROM tide.recon_result x WHERE x.run_id = r.run_id ORDER BY x.result_id DESC LIMIT 5 LOOP
        story := story || format('reconciliation at %s: %s; left %s rows %s, right %s rows %s; %s differences %s, by class %s%s',
                                 e.checked_at, e.status, e.left_count, e.left_sums, e.right_count, e.right_sums,
                                 e.differences, e.by_kind, e.by_class,
                                 CASE WHEN e.truncated THEN ' (more than max_diffs: recorded the first, compensated none)' ELSE '' END);
        FOR a IN SELECT x.diff_id, x.kind, x.key, x.class, x.status, x.action_run_id, x.reason FROM tide.recon_diff x
                  WHERE x.result_id = e.result_id ORDER BY x.diff_id LIMIT 10 LOOP
            story := story || format('  difference %s: %s of key %s, %s, %s%s%s', a.diff_id, a.kind, a.key, a.class, a.status,
                                     coalesce(', compensated by run ' || a.action_run_id, ''), coalesce(' (' || a.reason || ')', ''));
        END LOOP;
    END LOOP;
    FOR e IN SELECT x.diff_id, x.reconciliation, x.biz_date, x.kind, x.key, x.status FROM tide.recon_diff x
              WHERE x.action_run_id = r.run_id ORDER BY x.diff_id LIMIT 5 LOOP
        story := story || format('compensates difference %s of reconciliation %s on %s: %s of key %s (%s)',
                                 e.diff_id, e.reconciliation, e.biz_date, e.kind, e.key, e.status);
    END LOOP;
    IF r.lock_key IS NOT NULL THEN
        story := story || format('lock key: %s%s', r.lock_key,
                           coalesce((SELECT format(' (held by run %s until %s)', l.run_id, l.expires_at)
                                       FROM tide.lock l WHERE l.owner = r.owner AND l.key = r.lock_key), ''));
    END IF;
    IF r.batches > 0 OR r.control IS NOT NULL THEN
        story := story || format('long run: %s batches done%s', r.batches,
                           coalesce(format(', %s asked (taken up before the next batch)', r.control), ''));
    END IF;
    IF r.watermark IS NOT NULL THEN
        story := story || format('watermark: %s, unchanged since %s (ready once unchanged for %s); its latest evaluations: %s',
                           coalesce(r.watermark->>'value', 'NULL'), r.watermark->>'since',
                           (SELECT v.rules->>'watermark_stable_for' FROM tide.task_version v
                             WHERE v.task_id = r.task_id AND v.version = r.version),
                           (SELECT string_agg(format('%s = %s', x.ev->>'at', coalesce(x.ev->>'value', 'NULL')), ', ' ORDER BY x.pos)
                              FROM jsonb_array_elements(r.watermark->'checks') WITH ORDINALITY AS x(ev, pos)
                             WHERE x.pos > jsonb_array_length(r.watermark->'checks') - 5));
    END IF;
    story := story || format('trigger: %s%s', r.trigger, CASE WHEN r.fire_at IS NOT NULL THEN format(', scheduled fire at %s', r.fire_at) ELSE '' END);
    story := story || format('state: %s%s: %s', r.state, CASE WHEN r.skip_reason IS NOT NULL THEN format(' (%s)', r.skip_reason) ELSE '' END, r.reason);
    IF r.covered_by IS NOT NULL THEN
        story := story || format('covered by run %s, which ran this window together with others', r.covered_by);
    END IF;
    SELECT count(*), min(x.window_start), max(x.window_end) INTO n, first_cover, last_cover
      FROM tide.run x WHERE x.covered_by = r.run_id;
    IF n > 0 THEN
        story := story || format('covers %s missed windows, %s to %s (misfire policy coalesce)', n, first_cover, last_cover);
    END IF;
    story := story || text 'history:';
    FOR e IN SELECT * FROM tide.run_event x WHERE x.run_id = r.run_id ORDER BY x.event_id LOOP
        story := story || format('  %s  %s -> %s  %s  (by %s)', to_char(e.at, 'YYYY-MM-DD HH24:MI:SS.MS TZ'),
                           coalesce(e.from_state::text, 'created'), e.to_state, e.reason, e.actor);
    END LOOP;
    SELECT count(*) INTO n FROM tide.attempt x WHERE x.run_id = r.run_id;
    story := story || format('attempts: %s%s', n, CASE WHEN r.state = 'running' THEN ' finished, one running' ELSE '' END);
    FOR a IN SELECT * FROM tide.attempt x WHERE x.run_id = r.run_id ORDER BY x.attempt LOOP
        story := story || format('  #%s by %s, claimed %s, %s after %s (lease token %s)%s', a.attempt, coalesce(a.worker, 'a worker'),
                           to_char(a.claimed_at, 'YYYY-MM-DD HH24:MI:SS TZ'), a.outcome, tide._short(a.finished_at - a.claimed_at),
                           a.lease_token,
                           CASE WHEN a.error IS NOT NULL
                                THEN format(': %s error%s: %s', a.error_kind, coalesce(' ' || a.sqlstate, ''), a.error) ELSE '' END);
    END LOOP;
    IF r.state = 'running' THEN
        story := story || format('  #%s by %s, claimed %s, running; lease token %s expires %s', r.attempts, coalesce(r.lease_owner, 'a worker'),
                           to_char(r.claimed_at, 'YYYY-MM-DD HH24:MI:SS TZ'), r.lease_token, r.lease_expires_at);
    END IF;
    FOR e IN SELECT * FROM tide.step x WHERE x.run_id = r.run_id ORDER BY x.started_at, x.name LOOP
        story := story || format('  step %s %s by attempt %s%s', e.name, CASE WHEN e.done THEN 'done' ELSE 'started' END,
                           e.attempt, coalesce(', output ' || e.output::text, ''));
    END LOOP;
    IF r.result IS NOT NULL OR r.expected IS NOT NULL OR r.actual IS NOT NULL THEN
        story := story || format('result: %s, expected %s, actual %s', coalesce(r.result::text, '-'),
                           coalesce(r.expected::text, '-'), coalesce(r.actual::text, '-'));
    END IF;
    IF r.checkpoint IS NOT NULL THEN
        story := story || format('checkpoint: %s', r.checkpoint);
    END IF;
    story := story || CASE r.state
        WHEN 'dead' THEN format('next: fix the cause, then SELECT tide.replay_run(%s)', r.run_id)
        WHEN 'need_check' THEN format('next: check the data, then SELECT tide.resolve_run(%s, ''accept'') or tide.resolve_run(%s, ''replay'')', r.run_id, r.run_id)
        WHEN 'retry' THEN format('next: retried after %s', r.run_after)
        WHEN 'waiting' THEN format('next: waits for readiness (deadline %s)', coalesce(r.ready_deadline::text, 'none'))
        WHEN 'held' THEN format('next: held until SELECT tide.confirm(%s, version)', quote_literal(t.name))
        WHEN 'paused' THEN format('next: paused until SELECT tide.resume_run(%s)', r.run_id)
        WHEN 'ready' THEN format('next: claimable%s', coalesce(' after ' || r.run_after, ''))
        WHEN 'running' THEN 'next: completes or fails; taken back when the lease expires'
        ELSE format('finished %s', coalesce(r.finished_at::text, '')) END;
    RETURN QUERY SELECT u.line FROM unnest(story) WITH ORDINALITY AS u(line, n) ORDER BY u.n;
END
$$;
COMMENT ON FUNCTION tide.explain(bigint) IS
    'explain(run_id): the story of one run, one line per row: why it was created (trigger, fire, misfire decision), its window and rule version, every state change with its reason, each attempt (worker, times, outcome, error), its result, and what comes next.';

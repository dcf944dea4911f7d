-- A reconciliation's run (see recon.sql): its comparison statement, the comparison itself,
-- whom a difference is blamed on, the recorded result and differences with their compensation,
-- tide.resolve_diff, and the status views.

-- The comparison statement of a definition, one row of jsonb: the counts and sums of each side,
-- the differences by kind, and the first max_diffs differences in kind and key order. w counts
-- rows: 1 per left row, 2^30 per right row (one by-value sum instead of two counts). Only the
-- keys that differ leave the grouping; the sort of those and the aggregate of the first
-- max_diffs bound the memory whatever their number.
CREATE FUNCTION tide._recon_query(p_def jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    amounts text[] := ARRAY(SELECT jsonb_array_elements_text(p_def->'amounts'));
    n integer := cardinality(amounts);
    tol text := quote_literal(p_def->>'tolerance') || '::numeric';
    lcols text := '';
    rcols text := '';
    aggs text := '';
    lobj text := '';
    robj text := '';
    differs text := 'false';
    cols text := '';
    i integer;
BEGIN
    FOR i IN 1..n LOOP
        lcols := lcols || format(', (s.%I)::numeric AS l%s, NULL::numeric AS r%s', amounts[i], i, i);
        rcols := rcols || format(', NULL::numeric, (s.%I)::numeric', amounts[i]);
        aggs := aggs || format(', tide._nsum(l%s) AS l%s, tide._nsum(r%s) AS r%s', i, i, i, i);
        lobj := lobj || format(', %L, l%s', amounts[i], i);
        robj := robj || format(', %L, r%s', amounts[i], i);
        differs := differs || format(' OR (l%1$s IS DISTINCT FROM r%1$s AND (l%1$s IS NULL OR r%1$s IS NULL OR abs(l%1$s - r%1$s) > %2$s))', i, tol);
        cols := cols || format(', CASE WHEN l%1$s IS DISTINCT FROM r%1$s AND (l%1$s IS NULL OR r%1$s IS NULL OR abs(l%1$s - r%1$s) > %2$s) THEN %3$L END', i, tol, amounts[i]);
    END LOOP;
    RETURN format($q$
WITH u AS (
    SELECT (s.key)::text AS key, 1 AS w%s FROM (%s) s
    UNION ALL
    SELECT (s.key)::text, 1073741824%s FROM (%s) s
), g AS (
    SELECT grouping(key) AS t, key, sum(w) AS w%s FROM u GROUP BY GROUPING SETS ((key), ())
), d AS (
    SELECT g.*, w %% 1073741824 AS nl, w / 1073741824 AS nr,
           CASE WHEN t = 1 THEN NULL
                WHEN key IS NULL THEN 'null_key'
                WHEN w %% 1073741824 = 0 THEN 'missing_left'
                WHEN w < 1073741824 THEN 'missing_right'
                WHEN w <> 1073741825 THEN 'duplicate'
                WHEN %s THEN 'mismatch' END AS kind
      FROM g
), x AS (
    SELECT t, kind, key, nl, nr,
           CASE WHEN nl > 0 OR t = 1 THEN jsonb_build_object('rows', nl%s) END AS lv,
           CASE WHEN nr > 0 OR t = 1 THEN jsonb_build_object('rows', nr%s) END AS rv,
           CASE WHEN kind = 'mismatch' THEN array_remove(ARRAY[NULL::text%s], NULL) END AS cols,
           row_number() OVER (PARTITION BY t, kind = 'null_key' ORDER BY kind, key COLLATE "C") AS rn
      FROM d
     WHERE t = 1 OR kind IS NOT NULL
)
SELECT jsonb_build_object(
    'left_count', coalesce(max(nl) FILTER (WHERE t = 1), 0), 'right_count', coalesce(max(nr) FILTER (WHERE t = 1), 0),
    'left_sums', coalesce(jsonb_agg(lv - 'rows') FILTER (WHERE t = 1) -> 0, '{}'),
    'right_sums', coalesce(jsonb_agg(rv - 'rows') FILTER (WHERE t = 1) -> 0, '{}'),
    'null_left', coalesce(max(nl) FILTER (WHERE kind = 'null_key'), 0), 'null_right', coalesce(max(nr) FILTER (WHERE kind = 'null_key'), 0),
    'differences', count(*) FILTER (WHERE t = 0 AND kind <> 'null_key'),
    'by_kind', jsonb_strip_nulls(jsonb_build_object(
        'missing_right', nullif(count(*) FILTER (WHERE kind = 'missing_right'), 0),
        'missing_left', nullif(count(*) FILTER (WHERE kind = 'missing_left'), 0),
        'mismatch', nullif(count(*) FILTER (WHERE kind = 'mismatch'), 0),
        'duplicate', nullif(count(*) FILTER (WHERE kind = 'duplicate'), 0))),
    'diffs', coalesce(jsonb_agg(jsonb_build_object('kind', kind, 'key', key, 'l', lv, 'r', rv, 'columns', to_jsonb(cols))
                                ORDER BY kind, key COLLATE "C")
                        FILTER (WHERE t = 0 AND kind <> 'null_key' AND rn <= %s), '[]'))
  FROM x$q$,
        lcols, p_def->>'left_sql', rcols, p_def->>'right_sql', aggs, differs, lobj, robj, cols,
        (p_def->>'max_diffs')::integer);
END
$$;
COMMENT ON FUNCTION tide._recon_query(jsonb) IS
    'Internal: the one statement that compares a reconciliation''s two sides (append, group by key with the totals as a grouping set; only differing keys leave it), returning counts, sums and the first max_diffs differences as jsonb.';

-- Runs the comparison (called by tide._execute sealed as the owner, read-only, with the run
-- context; user SQL runs under p_path, the search_path user code gets) and classifies the
-- differences by the rules (the first match wins; a when is evaluated over all the differences
-- of its kind in one statement). STABLE: it cannot write.
CREATE FUNCTION tide._recon_compare(p_def jsonb, p_path text) RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    amounts text[] := ARRAY(SELECT jsonb_array_elements_text(p_def->'amounts'));
    res jsonb;
    diffs jsonb[];
    rule jsonb;
    i integer := 0;
    hits integer[];
    ruled integer[];
    st text;
    msg text;
BEGIN
    PERFORM set_config('search_path', p_path, true);
    EXECUTE tide._recon_query(p_def) INTO res;
    PERFORM set_config('search_path', 'pg_catalog, pg_temp', true);
    IF (res->>'null_left')::bigint > 0 OR (res->>'null_right')::bigint > 0 THEN
        PERFORM tide.business_error(format('the %s side returned %s rows whose key is NULL: every row needs a key',
                                           CASE WHEN (res->>'null_left')::bigint > 0 THEN 'left' ELSE 'right' END,
                                           greatest((res->>'null_left')::bigint, (res->>'null_right')::bigint)));
    END IF;
    diffs := ARRAY(SELECT x FROM jsonb_array_elements(res->'diffs') x);
    ruled := array_fill(NULL::integer, ARRAY[cardinality(diffs)]);
    FOR rule IN SELECT x FROM jsonb_array_elements(p_def->'rules') x LOOP
        i := i + 1;
        IF rule ? 'when' THEN
            BEGIN
                PERFORM set_config('search_path', p_path, true);
                EXECUTE format($q$SELECT coalesce(array_agg(d.i::integer), '{}') FROM unnest($1, $3) WITH ORDINALITY AS d(x, rl, i)
                                   CROSS JOIN LATERAL jsonb_to_record(coalesce(d.x->'l', '{}') || jsonb_build_object('key', CASE WHEN d.x->'l' <> 'null' THEN d.x->'key' END)) AS l(%s)
                                   CROSS JOIN LATERAL jsonb_to_record(coalesce(d.x->'r', '{}') || jsonb_build_object('key', CASE WHEN d.x->'r' <> 'null' THEN d.x->'key' END)) AS r(%s)
                                  WHERE d.x->>'kind' = $2 AND d.rl IS NULL AND ((%s) IS NOT DISTINCT FROM true)$q$,
                               tide._recon_coldefs(amounts), tide._recon_coldefs(amounts), rule->>'when')
                   INTO hits USING diffs, rule->>'kind', ruled;
                PERFORM set_config('search_path', 'pg_catalog, pg_temp', true);
            EXCEPTION WHEN query_canceled THEN
                RAISE;
            WHEN others THEN
                GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
                PERFORM tide.business_error(format('rule %s''s when failed (%s): %s', i, st, tide._clip(msg, 500)));
            END;
        ELSE
            SELECT coalesce(array_agg(d.i::integer), '{}') INTO hits FROM unnest(diffs, ruled) WITH ORDINALITY AS d(x, rl, i)
             WHERE d.x->>'kind' = rule->>'kind' AND d.rl IS NULL;
        END IF;
        FOR j IN 1..coalesce(cardinality(hits), 0) LOOP
            ruled[hits[j]] := i;
        END LOOP;
    END LOOP;
    RETURN (res - 'diffs' - 'null_left' - 'null_right')
           || jsonb_build_object('truncated', (res->>'differences')::integer > (p_def->>'max_diffs')::integer,
                                 'diffs', coalesce((SELECT jsonb_agg(d.x || jsonb_build_object('rule', ruled[d.i]) ORDER BY d.i)
                                                      FROM unnest(diffs) WITH ORDINALITY AS d(x, i)), '[]'));
END
$$;
COMMENT ON FUNCTION tide._recon_compare(jsonb, text) IS
    'Internal: compares a reconciliation''s sides and classifies the differences (run sealed as the owner, read-only, user SQL under its search_path); returns counts, sums and the differences with their rule.';

-- Which side of a failed comparison fails on its own (run again alone, sealed and read-only):
-- 'left', 'right', or NULL when each side runs.
CREATE FUNCTION tide._recon_blame(p_def jsonb, p_run_id bigint, p_owner name, p_timeout_ms integer) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    side text;
    seal bigint;
    n bigint;
BEGIN
    FOREACH side IN ARRAY ARRAY['left', 'right'] LOOP
        BEGIN
            seal := tide._seal_begin(p_run_id, p_owner, p_timeout_ms);
            PERFORM set_config('transaction_read_only', 'on', true);
            -- Every column the comparison reads, each row evaluated (OFFSET 0 keeps the subquery whole).
            EXECUTE format('SELECT sum(length(x::text)) FROM (SELECT (s.key)::text%s FROM (%s) s OFFSET 0) x',
                           (SELECT string_agg(format(', (s.%I)::numeric', a), '') FROM jsonb_array_elements_text(p_def->'amounts') a),
                           p_def->>(side || '_sql')) INTO n;
            PERFORM tide._seal_end(seal);
        EXCEPTION WHEN query_canceled OR others THEN
            PERFORM tide._seal_abort(seal);
            RETURN side;
        END;
    END LOOP;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION tide._recon_blame(jsonb, bigint, name, integer) IS
    'Internal: after a reconciliation run failed, which side fails when run alone (left, right or NULL).';

-- Records what a reconciliation run found and compensates it (called by tide._execute after the
-- comparison, as pg_tide): the result row, one row per difference, earlier open differences of
-- the date it no longer sees marked fixed by this run, then per class: auto_fix makes one run
-- of fix_task per difference (dedupe key #recon:<reconciliation>:<date>:<kind>:<key>, so a
-- difference is compensated once however often the date is reconciled); replay reruns
-- replay_task's window of the date once per reconciliation and date; human, and a compensation
-- that could not be made or ran without fixing the difference (escalated), alert. Returns the
-- run's result.
CREATE FUNCTION tide._recon_record(r tide.run, def jsonb, p_found jsonb) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t tide.task;
    res_id bigint;
    d record;
    v_rule jsonb;
    cls text;
    prior tide.recon_diff;
    st text;
    action bigint;
    esc boolean;
    why text;
    ft tide.task;
    w record;
    dk text;
    truncated boolean := (p_found->>'truncated')::boolean;
    v_status text;
    v_by_class jsonb;
    counts record;
BEGIN
    SELECT * INTO t FROM tide.task x WHERE x.task_id = r.task_id;
    INSERT INTO tide.recon_result (reconciliation, biz_date, run_id, status, left_count, right_count, left_sums, right_sums,
                                   differences, by_kind, by_class, truncated, started_at, task_id, version, owner)
    VALUES (t.name, r.biz_date, r.run_id, 'balanced', (p_found->>'left_count')::bigint, (p_found->>'right_count')::bigint,
            p_found->'left_sums', p_found->'right_sums', (p_found->>'differences')::integer, p_found->'by_kind', '{}',
            truncated, (p_found->>'started_at')::timestamptz, r.task_id, r.version, r.owner)
    RETURNING result_id INTO res_id;
    -- Earlier open differences of this date that this run no longer sees are fixed (when this
    -- run saw every difference).
    IF NOT truncated THEN
        WITH seen AS MATERIALIZED (
            SELECT e->>'key' AS key, e->>'kind' AS kind FROM jsonb_array_elements(p_found->'diffs') e
        )
        UPDATE tide.recon_diff x
           SET status = 'fixed', fixed_by_run = r.run_id, resolved_at = now(),
               reason = concat_ws('; ', x.reason, format('no longer seen by run %s', r.run_id))
         WHERE x.task_id = r.task_id AND x.biz_date IS NOT DISTINCT FROM r.biz_date AND x.status = 'open'
           AND NOT EXISTS (SELECT 1 FROM seen WHERE seen.key = x.key AND seen.kind = x.kind);
    END IF;
    FOR d IN SELECT e->>'kind' AS kind, e->>'key' AS key, nullif(e->'l', 'null') AS l, nullif(e->'r', 'null') AS r,
                    ARRAY(SELECT jsonb_array_elements_text(nullif(e->'columns', 'null'))) AS cols, (e->>'rule')::integer AS rule_no
               FROM jsonb_array_elements(p_found->'diffs') e LOOP
        v_rule := CASE WHEN d.rule_no IS NOT NULL THEN def->'rules'->(d.rule_no - 1) END;
        cls := coalesce(v_rule->>'class', 'human');
        SELECT * INTO prior FROM tide.recon_diff x
         WHERE x.task_id = r.task_id AND x.biz_date IS NOT DISTINCT FROM r.biz_date AND x.key = d.key AND x.kind = d.kind
         ORDER BY x.diff_id DESC LIMIT 1;
        st := 'open';
        action := NULL;
        esc := false;
        why := NULL;
        IF prior.status = 'accepted' AND prior."left" IS NOT DISTINCT FROM d.l AND prior."right" IS NOT DISTINCT FROM d.r THEN
            -- A person accepted this very difference: it stays accepted.
            st := 'accepted';
            why := format('accepted by %s (difference %s)', prior.resolved_by, prior.diff_id);
        ELSIF truncated THEN
            why := format('not compensated: the run found %s differences, more than max_diffs %s', p_found->>'differences', def->>'max_diffs');
            esc := cls <> 'human';
        ELSIF cls = 'auto_fix' THEN
            -- KEY SHARE: the task cannot be deleted under its new run (tide.run has no foreign key).
            SELECT * INTO ft FROM tide.task x WHERE x.name = v_rule->>'fix_task' AND x.owner = r.owner FOR KEY SHARE;
            IF NOT FOUND THEN
                esc := true;
                why := format('fix_task %s does not exist', quote_literal(v_rule->>'fix_task'));
            ELSE
                dk := format('#recon:%s:%s:%s:%s', t.name, coalesce(r.biz_date::text, '-'), d.kind,
                             CASE WHEN length(d.key) > 400 THEN 'md5:' || md5(d.key) ELSE d.key END);
                SELECT x.run_id INTO action FROM tide.run x WHERE x.task_id = ft.task_id AND x.dedupe_key = dk;
                IF action IS NULL THEN
                    -- The compensating run, by the one creator (tide._create_runs); a run of the
                    -- same key made meanwhile is taken instead.
                    SELECT (tide._create_runs(ARRAY[ROW(
                               ft.task_id, 'reconcile', ft.version, tide._open_state(tide._task_rules(ft)),
                               format('compensation of a %s difference (key %s) found by reconciliation %s, run %s', d.kind, d.key, t.name, r.run_id),
                               tide._executor_of(ft.command), ft.queue, ft.priority, ft.args || p.payload, ft.owner,
                               NULL, NULL, NULL, NULL, dk, NULL, NULL, NULL, NULL, NULL, p.payload, g.gate, g.lock_key, g.gated
                           )::tide.new_run], false))[1]
                      INTO action
                      FROM (SELECT jsonb_build_object('reconciliation', t.name, 'biz_date', r.biz_date, 'key', d.key, 'kind', d.kind,
                                                      'left', d.l, 'right', d.r, 'columns', to_jsonb(d.cols)) AS payload) p
                     CROSS JOIN LATERAL tide._gating_of(ft.task_id, ft.version, ft.args || p.payload, p.payload, NULL, NULL, NULL) g;
                    IF action IS NULL THEN
                        SELECT x.run_id INTO action FROM tide.run x WHERE x.task_id = ft.task_id AND x.dedupe_key = dk;
                    END IF;
                ELSIF EXISTS (SELECT 1 FROM tide.run x WHERE x.run_id = action AND x.finished_at IS NOT NULL
                                                         AND x.finished_at < r.claimed_at) THEN
                    -- The fix ran before this comparison began, and the difference is still there.
                    esc := true;
                    why := format('fix run %s ended (%s) before this run and the difference remains', action,
                                  (SELECT x.state FROM tide.run x WHERE x.run_id = action));
                END IF;
            END IF;
        ELSIF cls = 'replay' THEN
            SELECT * INTO ft FROM tide.task x WHERE x.name = v_rule->>'replay_task' AND x.owner = r.owner;
            IF FOUND THEN
                -- One rerun per reconciliation, date and replay task: the one asked for earlier, if any.
                SELECT x.action_run_id INTO action FROM tide.recon_diff x JOIN tide.run y ON y.run_id = x.action_run_id
                 WHERE x.task_id = r.task_id AND x.biz_date IS NOT DISTINCT FROM r.biz_date AND x.class = 'replay'
                   AND y.task_id = ft.task_id
                 ORDER BY x.diff_id LIMIT 1;
            END IF;
            IF action IS NOT NULL THEN
                IF EXISTS (SELECT 1 FROM tide.run x WHERE x.run_id = action AND x.finished_at IS NOT NULL
                                                     AND x.finished_at < r.claimed_at
                                                     AND x.finished_at > (SELECT min(y.found_at) FROM tide.recon_diff y
                                                                           WHERE y.task_id = r.task_id AND y.action_run_id = action)) THEN
                    esc := true;
                    why := format('replay run %s of %s ended (%s) before this run and the difference remains', action,
                                  ft.name, (SELECT x.state FROM tide.run x WHERE x.run_id = action));
                END IF;
            ELSIF ft.task_id IS NULL THEN
                esc := true;
                why := format('replay_task %s does not exist', quote_literal(v_rule->>'replay_task'));
            ELSIF r.biz_date IS NULL THEN
                esc := true;
                why := 'this run has no business date to replay';
            ELSE
                BEGIN
                    SELECT * INTO w FROM tide._window_of_date(ft.task_id, r.biz_date);
                    IF w.window_end > now() THEN
                        esc := true;
                        why := format('the window of %s on %s has not ended yet', ft.name, r.biz_date);
                    ELSE
                        action := tide._rerun(ft.task_id, w.fire_at, w.window_start, w.window_end, r.biz_date, 'current', true,
                                              'tide.reconcile', 'reconcile', NULL,
                                              format('replay asked by reconciliation %s (run %s): %s difference of key %s',
                                                     t.name, r.run_id, d.kind, d.key));
                    END IF;
                EXCEPTION WHEN others THEN
                    esc := true;
                    GET STACKED DIAGNOSTICS why = MESSAGE_TEXT;
                    why := 'the replay could not be asked for: ' || tide._clip(why, 300);
                END;
            END IF;
        END IF;
        INSERT INTO tide.recon_diff (reconciliation, biz_date, key, kind, class, "left", "right", status, action_run_id,
                                     escalated, reason, columns, severity, rule, run_id, result_id, task_id, owner,
                                     resolved_by, resolved_at, note)
        VALUES (t.name, r.biz_date, d.key, d.kind, cls, d.l, d.r, st, action, esc, why,
                CASE WHEN d.kind = 'mismatch' THEN d.cols END,
                CASE WHEN cls = 'human' OR esc THEN coalesce((v_rule->>'severity')::tide.severity, t.severity) END,
                d.rule_no, r.run_id, res_id, r.task_id, r.owner,
                CASE WHEN st = 'accepted' THEN prior.resolved_by END, CASE WHEN st = 'accepted' THEN now() END,
                CASE WHEN st = 'accepted' THEN prior.note END);
    END LOOP;
    SELECT count(*) FILTER (WHERE x.status = 'open' AND (x.class = 'human' OR x.escalated)) AS human,
           count(*) FILTER (WHERE x.status = 'open' AND x.class = 'replay' AND NOT x.escalated) AS replay,
           count(*) FILTER (WHERE x.status = 'open' AND x.class = 'auto_fix' AND NOT x.escalated) AS auto_fix
      INTO counts FROM tide.recon_diff x WHERE x.result_id = res_id;
    SELECT coalesce(jsonb_object_agg(c.class, c.n), '{}') INTO v_by_class
      FROM (SELECT CASE WHEN x.status = 'accepted' THEN 'accepted' ELSE x.class END AS class, count(*) AS n
              FROM tide.recon_diff x WHERE x.result_id = res_id GROUP BY 1) c;
    v_status := CASE WHEN counts.human > 0 OR truncated THEN 'needs_human'
                   WHEN counts.replay > 0 THEN 'needs_replay'
                   WHEN counts.auto_fix > 0 THEN 'auto_fixed'
                   ELSE 'balanced' END;
    UPDATE tide.recon_result x SET status = v_status, by_class = v_by_class, checked_at = clock_timestamp()
     WHERE x.result_id = res_id;
    RETURN jsonb_build_object('status', v_status, 'left_count', (p_found->>'left_count')::bigint,
                              'right_count', (p_found->>'right_count')::bigint, 'differences', (p_found->>'differences')::integer,
                              'by_kind', p_found->'by_kind', 'by_class', v_by_class, 'result_id', res_id);
END
$$;
COMMENT ON FUNCTION tide._recon_record(tide.run, jsonb, jsonb) IS
    'Internal: records a reconciliation run''s result and differences, marks earlier ones it no longer sees fixed, and compensates by class (a fix run per difference, a replay per date, an alert); returns the run''s result.';

CREATE FUNCTION tide.resolve_diff(diff_id bigint, decision text, note text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    d tide.recon_diff;
    dec text := lower(btrim(resolve_diff.decision));
BEGIN
    IF resolve_diff.diff_id IS NULL THEN
        RAISE EXCEPTION 'diff_id must not be NULL' USING ERRCODE = 'null_value_not_allowed',
            HINT = 'find open differences with: SELECT diff_id, biz_date, key, kind FROM tide.recon_diff WHERE status = ''open''';
    END IF;
    IF dec IS NULL OR dec NOT IN ('accept', 'fixed') THEN
        RAISE EXCEPTION 'unknown decision %', coalesce(quote_literal(left(resolve_diff.decision, 40)), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'accept: the difference is right as it is (later runs that see the same values keep it accepted); fixed: you fixed it by hand';
    END IF;
    IF length(resolve_diff.note) > 2000 THEN
        RAISE EXCEPTION 'note is too long (% characters, at most 2000)', length(resolve_diff.note)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'say briefly why; link to the ticket for the rest';
    END IF;
    SELECT * INTO d FROM tide.recon_diff x WHERE x.diff_id = resolve_diff.diff_id AND tide._may_act(x.owner) FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'difference % does not exist', resolve_diff.diff_id USING ERRCODE = 'undefined_object',
            HINT = 'find open differences with: SELECT diff_id, biz_date, key, kind FROM tide.recon_diff WHERE status = ''open''';
    END IF;
    IF d.status <> 'open' THEN
        RAISE EXCEPTION 'difference % is already % (%)', d.diff_id, d.status, coalesce(d.resolved_by::text, 'by run ' || d.fixed_by_run)
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'only open differences are resolved';
    END IF;
    -- The difference, as every run saw it while open.
    UPDATE tide.recon_diff x
       SET status = CASE WHEN dec = 'accept' THEN 'accepted' ELSE 'fixed' END,
           resolved_by = tide._caller(), resolved_at = now(), note = resolve_diff.note
     WHERE x.task_id = d.task_id AND x.biz_date IS NOT DISTINCT FROM d.biz_date AND x.key = d.key AND x.kind = d.kind
       AND x.status = 'open';
    RETURN CASE WHEN dec = 'accept' THEN 'accepted' ELSE 'fixed' END;
END
$$;
COMMENT ON FUNCTION tide.resolve_diff(bigint, text, text) IS
    'resolve_diff(diff_id, decision, note => NULL): closes an open reconciliation difference by hand: accept (it is right as it is; later runs seeing the same values keep it accepted) or fixed. Its alert resolves at the next evaluation.';

-- In 80 columns: each reconciliation with its latest comparison and what is open (each open
-- difference once, however many runs saw it), those waiting for a person first.
CREATE VIEW tide.recon_status WITH (security_invoker = true) AS
SELECT left(t.name, 16) AS name, l.biz_date AS date, coalesce(l.status, 'never_ran') AS status,
       l.left_count AS "left", l.right_count AS "right", coalesce(o.open, 0) AS open, coalesce(o.person, 0) AS human
  FROM tide.task t
  LEFT JOIN LATERAL (SELECT x.biz_date, x.status, x.left_count, x.right_count FROM tide.recon_result x
                      WHERE x.task_id = t.task_id ORDER BY x.result_id DESC LIMIT 1) l ON true
  LEFT JOIN LATERAL (SELECT count(DISTINCT (d.biz_date, d.key, d.kind)) AS open,
                            count(DISTINCT (d.biz_date, d.key, d.kind)) FILTER (WHERE d.class = 'human' OR d.escalated) AS person
                       FROM tide.recon_diff d WHERE d.task_id = t.task_id AND d.status = 'open') o ON true
 WHERE t.reconcile IS NOT NULL
 ORDER BY coalesce(o.person, 0) DESC, coalesce(o.open, 0) DESC, t.name;
COMMENT ON VIEW tide.recon_status IS
    'In 80 columns: each reconciliation''s latest comparison (business date, status, rows of each side) and its open differences (all, and those for a person: human or escalated), those waiting for a person first.';
GRANT SELECT ON tide.recon_status TO PUBLIC;

-- In 80 columns: the open differences, the latest row of each (its values: tide.recon_diff).
CREATE VIEW tide.recon_open WITH (security_invoker = true) AS
SELECT d.diff_id AS id, left(d.reconciliation, 16) AS recon, d.biz_date AS date, left(d.key, 10) AS key, d.kind,
       CASE WHEN d.escalated THEN 'human!' ELSE d.class END AS class
  FROM (SELECT DISTINCT ON (x.task_id, x.biz_date, x.key, x.kind) x.*
          FROM tide.recon_diff x WHERE x.status = 'open'
         ORDER BY x.task_id, x.biz_date, x.key, x.kind, x.diff_id DESC) d
 ORDER BY (d.class = 'human' OR d.escalated) DESC, d.biz_date, d.reconciliation, d.key;
COMMENT ON VIEW tide.recon_open IS
    'In 80 columns: each open reconciliation difference once (its latest row; id is its diff_id for tide.resolve_diff), those for a person first (class human!, escalated: its compensation ran or could not be made and the difference remains).';
GRANT SELECT ON tide.recon_open TO PUBLIC;

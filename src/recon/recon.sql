-- Reconciliation and compensation (R7): tide.reconcile makes a task whose runs compare two
-- sides (left_sql and right_sql, each returning a text key and amount columns) for their
-- business window, keep the counts and sums of each side, record every difference, classify it
-- by the reconciliation's rules and compensate through pg_tide's idempotent paths: a fix run of
-- another task (one per difference, by dedupe key), a rerun of another task's window (one per
-- reconciliation and date), or an alert for a person.
--
-- The comparison is one read-only statement run as the owner with the run context: the two
-- sides, tagged, are appended and grouped by key (one hash aggregate, spilling to disk past
-- work_mem, so memory is bounded whatever the sizes), with the totals as one more grouping set.
-- Only the groups that differ (and the totals) leave the statement.

-- The sum of one side's amounts for a key: most keys have one row per side, so the first value
-- is the sum and nothing is added (the built-in sum keeps a larger state for every group).
CREATE AGGREGATE tide._nsum(numeric) (sfunc = pg_catalog.numeric_add, stype = numeric);
COMMENT ON AGGREGATE tide._nsum(numeric) IS
    'Internal: the exact sum of numerics, with a small state (a reconciliation''s per-key sums).';

CREATE TABLE tide.recon_result (
    result_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reconciliation text NOT NULL,
    biz_date       date,
    run_id         bigint NOT NULL,
    status         text NOT NULL CHECK (status IN ('balanced', 'auto_fixed', 'needs_replay', 'needs_human')),
    left_count     bigint NOT NULL,
    right_count    bigint NOT NULL,
    left_sums      jsonb NOT NULL,
    right_sums     jsonb NOT NULL,
    differences    integer NOT NULL,
    by_kind        jsonb NOT NULL,
    by_class       jsonb NOT NULL,
    truncated      boolean NOT NULL DEFAULT false,
    started_at     timestamptz,
    checked_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    task_id        bigint NOT NULL REFERENCES tide.task ON DELETE CASCADE,
    version        integer NOT NULL,
    owner          name NOT NULL
);
COMMENT ON TABLE tide.recon_result IS
    'One row per comparison of a reconciliation run (a run reopened by a rerun adds another; pruned after pg_tide.history_retention once none of its differences is open): the count and the sums of each side, the differences by kind and class, and the status (balanced, auto_fixed, needs_replay, needs_human).';
COMMENT ON COLUMN tide.recon_result.left_sums IS 'The sum of each amount column over the left side, by column name.';
COMMENT ON COLUMN tide.recon_result.by_kind IS 'Differences by kind: missing_right, missing_left, mismatch, duplicate.';
COMMENT ON COLUMN tide.recon_result.by_class IS 'Differences by class: auto_fix, replay, human (accepted ones as accepted).';
COMMENT ON COLUMN tide.recon_result.started_at IS 'When the comparison began; checked_at is when its result was recorded (both clock times: checked_at - started_at is what the comparison took).';
COMMENT ON COLUMN tide.recon_result.truncated IS 'More differences than max_diffs: the first max_diffs were recorded and nothing was compensated.';
CREATE INDEX recon_result_task_idx ON tide.recon_result (task_id, result_id);
CREATE INDEX recon_result_run_idx ON tide.recon_result (run_id);
CREATE INDEX recon_result_checked_idx ON tide.recon_result (checked_at);

CREATE TABLE tide.recon_diff (
    diff_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reconciliation text NOT NULL,
    biz_date       date,
    key            text NOT NULL,
    kind           text NOT NULL CHECK (kind IN ('missing_right', 'missing_left', 'mismatch', 'duplicate')),
    class          text NOT NULL CHECK (class IN ('auto_fix', 'replay', 'human')),
    "left"         jsonb,
    "right"        jsonb,
    status         text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'fixed', 'accepted')),
    action_run_id  bigint,
    escalated      boolean NOT NULL DEFAULT false,
    reason         text,
    columns        text[],
    severity       tide.severity,
    rule           integer,
    run_id         bigint NOT NULL,
    result_id      bigint NOT NULL REFERENCES tide.recon_result ON DELETE CASCADE,
    fixed_by_run   bigint,
    resolved_by    name,
    resolved_at    timestamptz,
    note           text,
    found_at       timestamptz NOT NULL DEFAULT now(),
    task_id        bigint NOT NULL,
    owner          name NOT NULL
);
COMMENT ON TABLE tide.recon_diff IS
    'One row per difference per reconciliation run: its kind and class, both sides'' values, the run of its compensation or replay, and its status: open, fixed (by a later run that no longer sees it, or by hand) or accepted (tide.resolve_diff). Rows are never rewritten, only closed.';
COMMENT ON COLUMN tide.recon_diff."left" IS 'The key''s values on the left side (rows and the sum of each amount column); NULL when the key is missing there.';
COMMENT ON COLUMN tide.recon_diff.columns IS 'mismatch: the amount columns that differ by more than the tolerance.';
COMMENT ON COLUMN tide.recon_diff.action_run_id IS 'The run that compensates it: the fix run (auto_fix) or the rerun of the replay task''s window (replay).';
COMMENT ON COLUMN tide.recon_diff.escalated IS 'The compensation could not be made, or ran and the difference remains: a person must look (it alerts like a human difference).';
COMMENT ON COLUMN tide.recon_diff.rule IS 'The position (from 1) of the rule that classified it; NULL: no rule matched (human).';
COMMENT ON COLUMN tide.recon_diff.fixed_by_run IS 'The reconciliation run that no longer saw the difference.';
CREATE INDEX recon_diff_identity_idx ON tide.recon_diff (task_id, biz_date, key, kind, diff_id);
CREATE INDEX recon_diff_open_idx ON tide.recon_diff (task_id, biz_date) WHERE status = 'open';
CREATE INDEX recon_diff_run_idx ON tide.recon_diff (run_id);
CREATE INDEX recon_diff_result_idx ON tide.recon_diff (result_id);
CREATE INDEX recon_diff_action_idx ON tide.recon_diff (action_run_id) WHERE action_run_id IS NOT NULL;

ALTER TABLE tide.recon_result ENABLE ROW LEVEL SECURITY;
ALTER TABLE tide.recon_diff ENABLE ROW LEVEL SECURITY;
CREATE POLICY recon_result_owner ON tide.recon_result FOR SELECT USING (tide._visible(owner));
CREATE POLICY recon_diff_owner ON tide.recon_diff FOR SELECT USING (tide._visible(owner));
GRANT SELECT ON tide.recon_result, tide.recon_diff TO PUBLIC;

-- The command of a reconciliation's task: never run (tide._execute compares the sides instead);
-- it says where the work is.
CREATE FUNCTION tide._recon_command() RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT '-- reconciliation: built in (tide.reconcile), compares left_sql with right_sql' $$;
COMMENT ON FUNCTION tide._recon_command() IS 'Internal: the command a reconciliation''s task shows (never run).';

-- Runs a probe query sealed as the owner, read-only: '=' and its first value (as text) when it
-- runs, else 'SQLSTATE: message'. Probes are built to read nothing (LIMIT 0 inside).
CREATE FUNCTION tide._recon_probe(p_query text, p_owner name) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    seal bigint;
    v text;
    st text;
    msg text;
BEGIN
    BEGIN
        seal := tide._seal_begin(0, p_owner, 10000);
        PERFORM set_config('transaction_read_only', 'on', true);
        EXECUTE p_query INTO v;
        PERFORM tide._seal_end(seal);
    EXCEPTION WHEN query_canceled OR others THEN
        GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
        PERFORM tide._seal_abort(seal);
        RETURN st || ': ' || tide._clip(msg, 500);
    END;
    RETURN '=' || coalesce(v, '');
END
$$;
COMMENT ON FUNCTION tide._recon_probe(text, name) IS
    'Internal: runs a probe of a reconciliation''s query (built to read nothing) as its owner, read-only; ''='' and its value, else the SQLSTATE and message.';

-- The record a rule's `when` sees as l or r: the key, the rows the key has on that side and
-- each amount column (the sum over those rows), all NULL when the key is missing there.
CREATE FUNCTION tide._recon_coldefs(p_amounts text[]) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'key text, rows bigint' || coalesce((SELECT string_agg(format(', %I numeric', a), '' ORDER BY i)
                                                  FROM unnest(p_amounts) WITH ORDINALITY AS x(a, i)), '')
$$;
COMMENT ON FUNCTION tide._recon_coldefs(text[]) IS 'Internal: the column list of the l and r records a reconciliation rule''s when sees.';

-- Checks a reconciliation's definition for a task of this owner and returns it in its stored
-- form; 22023 (22004 for a NULL side), the bad value named and a hint, before anything is written.
CREATE FUNCTION tide._recon_valid(p_task text, p_def jsonb, p_owner name) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    side text;
    q text;
    why text;
    amounts text[];
    a text;
    tol numeric;
    rules jsonb;
    rule jsonb;
    i integer := 0;
    k text;
    cls text;
    target text;
    tt tide.task;
    maxd integer;
    wm text;
BEGIN
    IF jsonb_typeof(p_def->'amounts') IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'amounts must be an array of column names' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'pass amounts => ARRAY[''amount''], or ARRAY[]::text[] to compare keys and counts only';
    END IF;
    amounts := ARRAY(SELECT jsonb_array_elements_text(p_def->'amounts'));
    IF cardinality(amounts) > 20 THEN
        RAISE EXCEPTION 'amounts has % columns, at most 20', cardinality(amounts) USING ERRCODE = 'invalid_parameter_value',
            HINT = 'compare the columns that carry money or quantities';
    END IF;
    FOREACH a IN ARRAY amounts LOOP
        IF a IS NULL OR a !~ '^[[:alnum:]_]{1,63}$' OR lower(a) IN ('key', 'rows') THEN
            RAISE EXCEPTION 'amount column % is not a usable column name', coalesce(quote_literal(left(a, 80)), 'NULL')
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'name a column both sides return, such as ''amount'' (letters, digits and _; not key or rows)';
        END IF;
    END LOOP;
    IF (SELECT count(DISTINCT x) <> count(*) FROM unnest(amounts) x) THEN
        RAISE EXCEPTION 'amounts names a column twice: %', array_to_string(amounts, ', ')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'name each amount column once';
    END IF;
    FOREACH side IN ARRAY ARRAY['left_sql', 'right_sql'] LOOP
        q := p_def->>side;
        PERFORM tide._text_arg(side, q, 20000,
                               'pass a query returning key (text) and the amount columns, such as SELECT order_id::text AS key, amount FROM payments WHERE paid_at >= tide.window_start() AND paid_at < tide.window_end()');
        why := tide._recon_probe(format('SELECT 1 FROM (%s) s LIMIT 0', q), p_owner);
        IF why NOT LIKE '=%' THEN
            RAISE EXCEPTION '% is not a query pg_tide can run as %: %', side, p_owner, why
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = format('%s must be one SELECT (no trailing semicolon) that role %s may run, returning key and the amount columns', side, p_owner);
        END IF;
        why := tide._recon_probe(format('SELECT (s.key)::text FROM (%s) s LIMIT 0', q), p_owner);
        IF why NOT LIKE '=%' THEN
            RAISE EXCEPTION '% has no usable column key: %', side, why USING ERRCODE = 'invalid_parameter_value',
                HINT = format('%s must return a column named key that casts to text, such as SELECT order_id::text AS key, ...', side);
        END IF;
        FOREACH a IN ARRAY amounts LOOP
            -- The column's type (a scalar subquery that reads no row keeps it), of category number.
            why := tide._recon_probe(format('SELECT t.typcategory::text FROM pg_catalog.pg_type t WHERE t.oid = pg_catalog.pg_typeof((SELECT s.%I FROM (%s) s LIMIT 0))', a, q), p_owner);
            IF why LIKE '42703%' THEN
                RAISE EXCEPTION '% has no amount column %: %', side, quote_ident(a), why USING ERRCODE = 'invalid_parameter_value',
                    HINT = format('both sides must return every column of amounts; %s returns the columns of its SELECT list', side);
            ELSIF why IS DISTINCT FROM '=N' THEN
                RAISE EXCEPTION 'amount column % of % is not a number (%)', quote_ident(a), side, CASE WHEN why LIKE '=%' THEN 'type category ' || substr(why, 2) ELSE why END
                    USING ERRCODE = 'invalid_parameter_value', HINT = 'amount columns must be numbers (integer, numeric, double precision, money); cast text with ::numeric in the side''s query';
            END IF;
        END LOOP;
    END LOOP;
    BEGIN
        tol := (p_def->>'tolerance')::numeric;
    EXCEPTION WHEN others THEN
        tol := NULL;
    END;
    IF tol IS NULL OR tol < 0 OR tol = 'NaN' THEN
        RAISE EXCEPTION 'tolerance must be a number of at least 0, got %', coalesce(p_def->>'tolerance', 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'amounts whose difference is at most the tolerance match: tolerance => 0.01 for cents, 0 for exact';
    END IF;
    maxd := (p_def->>'max_diffs')::integer;
    IF maxd IS NULL OR maxd NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'max_diffs must be between 1 and 1000000, got %', coalesce(p_def->>'max_diffs', 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'past max_diffs differences a run records the first ones and compensates none (a side is probably wrong); the default is 10000';
    END IF;
    wm := p_def->>'work_mem';
    IF wm IS NOT NULL THEN
        BEGIN
            IF pg_size_bytes(wm) NOT BETWEEN 65536 AND 2147483648 THEN
                wm := NULL;
            END IF;
        EXCEPTION WHEN others THEN
            wm := NULL;
        END;
        IF wm IS NULL THEN
            RAISE EXCEPTION 'work_mem must be a size between 64kB and 2GB, got %', quote_literal(left(p_def->>'work_mem', 40))
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'the comparison''s memory before it spills to disk, such as work_mem => ''256MB''; NULL uses the server''s work_mem';
        END IF;
    END IF;
    rules := p_def->'rules';
    IF jsonb_typeof(rules) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'rules must be a JSON array of rules, got %', left(coalesce(rules::text, 'NULL'), 100)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'pass rules => ''[{"kind": "missing_right", "class": "auto_fix", "fix_task": "push_payment"}]''; without rules every difference is for a person (human)';
    END IF;
    IF jsonb_array_length(rules) > 100 THEN
        RAISE EXCEPTION 'rules has % rules, at most 100', jsonb_array_length(rules) USING ERRCODE = 'invalid_parameter_value',
            HINT = 'the first matching rule classifies a difference: a few rules cover the cases';
    END IF;
    FOR rule IN SELECT x FROM jsonb_array_elements(rules) x LOOP
        i := i + 1;
        IF jsonb_typeof(rule) <> 'object' THEN
            RAISE EXCEPTION 'rule % must be a JSON object, got %', i, left(rule::text, 100) USING ERRCODE = 'invalid_parameter_value',
                HINT = 'a rule is {"kind": ..., "class": ..., ...}';
        END IF;
        SELECT string_agg(quote_literal(left(x, 40)), ', ') INTO k FROM jsonb_object_keys(rule) x
         WHERE x NOT IN ('kind', 'when', 'class', 'fix_task', 'replay_task', 'severity');
        IF k IS NOT NULL THEN
            RAISE EXCEPTION 'rule % has unknown field %', i, k USING ERRCODE = 'invalid_parameter_value',
                HINT = 'a rule''s fields are kind, when, class, fix_task, replay_task and severity';
        END IF;
        IF coalesce(rule->>'kind', '') NOT IN ('missing_right', 'missing_left', 'mismatch', 'duplicate') THEN
            RAISE EXCEPTION 'rule % has unknown kind %', i, coalesce(quote_literal(left(rule->>'kind', 40)), 'NULL')
                USING ERRCODE = 'invalid_parameter_value', HINT = 'kind is missing_right, missing_left, mismatch or duplicate';
        END IF;
        cls := rule->>'class';
        IF coalesce(cls, '') NOT IN ('auto_fix', 'replay', 'human') THEN
            RAISE EXCEPTION 'rule % has unknown class %', i, coalesce(quote_literal(left(cls, 40)), 'NULL')
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'class is auto_fix (with fix_task), replay (with replay_task) or human (with an optional severity)';
        END IF;
        IF rule ? 'severity' AND coalesce(rule->>'severity', '') NOT IN ('info', 'warning', 'critical') THEN
            RAISE EXCEPTION 'rule % has unknown severity %', i, left(rule->>'severity', 40) USING ERRCODE = 'invalid_parameter_value',
                HINT = 'severity is info, warning or critical';
        END IF;
        IF (cls = 'auto_fix') <> (rule ? 'fix_task') OR (cls = 'replay') <> (rule ? 'replay_task') THEN
            RAISE EXCEPTION 'rule % of class %: fix_task goes with auto_fix and replay_task with replay', i, cls
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = '{"kind": "missing_right", "class": "auto_fix", "fix_task": "push_payment"} or {"kind": "mismatch", "class": "replay", "replay_task": "bank_import"}';
        END IF;
        target := coalesce(rule->>'fix_task', rule->>'replay_task');
        IF target IS NOT NULL THEN
            SELECT * INTO tt FROM tide.task x WHERE x.name = target AND x.owner = p_owner;
            IF NOT FOUND OR target = p_task THEN
                RAISE EXCEPTION 'rule %: % % is not another task of role %', i, CASE WHEN cls = 'auto_fix' THEN 'fix_task' ELSE 'replay_task' END,
                    quote_literal(left(target, 200)), p_owner
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'create the task first (tide.schedule, or with topics for an event task); list yours with: SELECT name FROM tide.task';
            END IF;
            IF cls = 'replay' AND tt.schedule IS NULL THEN
                RAISE EXCEPTION 'rule %: replay_task % has no schedule, so no business windows to rerun', i, quote_literal(target)
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'replay reruns a scheduled task''s window of the business date; use auto_fix with fix_task for an event or job task';
            END IF;
        END IF;
        IF rule ? 'when' THEN
            PERFORM tide._text_arg(format('rule %s when', i), rule->>'when', 5000, 'an SQL boolean over l and r, such as abs(l.amount - r.amount) < 1');
            why := tide._recon_probe(format('SELECT 1 FROM jsonb_to_record(''{}'') AS l(%s), jsonb_to_record(''{}'') AS r(%s) WHERE (%s)::boolean LIMIT 0',
                                            tide._recon_coldefs(amounts), tide._recon_coldefs(amounts), rule->>'when'), p_owner);
            IF why NOT LIKE '=%' THEN
                RAISE EXCEPTION 'rule % when % is not a boolean over l and r: %', i, quote_literal(tide._clip(rule->>'when', 200)), why
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = format('l and r have the columns key, rows%s (NULL when the key is missing on that side)',
                                        coalesce(', ' || array_to_string(amounts, ', '), ''));
            END IF;
        END IF;
    END LOOP;
    RETURN jsonb_build_object('left_sql', p_def->>'left_sql', 'right_sql', p_def->>'right_sql', 'amounts', to_jsonb(amounts),
                              'tolerance', tol, 'rules', rules, 'max_diffs', maxd, 'work_mem', wm);
END
$$;
COMMENT ON FUNCTION tide._recon_valid(text, jsonb, name) IS
    'Internal: checks a reconciliation''s definition (both sides planned as the owner with key and amounts, tolerance, rules with their tasks and when, max_diffs, work_mem) and returns it as stored; 22023 otherwise.';

-- tide._check_task's part for reconciliations: the task keeps the shape tide.reconcile gave it.
CREATE FUNCTION tide._recon_check_task(t tide.task) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF t.reconcile IS NULL OR t.command IS DISTINCT FROM tide._recon_command() THEN
        RAISE EXCEPTION 'task "%" is a reconciliation: its command is built in', t.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'change what it compares with tide.reconcile(..., replace => true); remove it with tide.unschedule';
    END IF;
    IF t.schedule IS NULL OR cardinality(t.topics) > 0 OR t.long OR t.top_level OR t.fallback IS NOT NULL THEN
        RAISE EXCEPTION 'task "%" is a reconciliation: it runs on its schedule, not as an event, long or top_level task or with a fallback', t.name
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'other options (queue, timeout, max_attempts, misfire, ready_check, ...) work as for any task';
    END IF;
    PERFORM tide._recon_valid(t.name, t.reconcile, t.owner);
END
$$;
COMMENT ON FUNCTION tide._recon_check_task(tide.task) IS
    'Internal: refuses a reconciliation''s task without its definition or built-in command, or made an event, long or top-level task.';

CREATE FUNCTION tide.reconcile(name text, schedule text, tz text DEFAULT 'UTC', biz_window text DEFAULT 'fire',
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
    PERFORM tide._text_arg('name', reconcile.name, 200, 'name the reconciliation, such as ''payments_vs_bank''');
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
    def := tide._recon_valid(reconcile.name,
                             jsonb_build_object('left_sql', reconcile.left_sql, 'right_sql', reconcile.right_sql,
                                                'amounts', to_jsonb(reconcile.amounts), 'tolerance', reconcile.tolerance,
                                                'rules', parsed, 'max_diffs', reconcile.max_diffs, 'work_mem', reconcile.work_mem),
                             caller);
    SELECT * INTO t FROM tide.task x WHERE x.name = reconcile.name AND x.owner = caller;
    IF NOT FOUND THEN
        RETURN tide.schedule(reconcile.name, reconcile.schedule, command => tide._recon_command(), tz => reconcile.tz,
                             biz_window => reconcile.biz_window, reconcile => def);
    END IF;
    IF t.reconcile IS NULL THEN
        RAISE EXCEPTION 'task "%" already exists and is not a reconciliation', left(reconcile.name, 200)
            USING ERRCODE = 'duplicate_object',
                  HINT = 'choose another name, or remove the task first with tide.unschedule';
    END IF;
    IF t.reconcile = def AND t.schedule IS NOT DISTINCT FROM reconcile.schedule AND t.tz = reconcile.tz
       AND t.biz_window::text = lower(reconcile.biz_window) THEN
        -- The same definition: a deploy script may run it every time.
        RETURN t.task_id;
    END IF;
    IF NOT coalesce(reconcile.replace, false) THEN
        RAISE EXCEPTION 'reconciliation "%" already exists with another definition', left(reconcile.name, 200)
            USING ERRCODE = 'duplicate_object',
                  HINT = 'pass replace => true to make this its next rule version (its history stays)';
    END IF;
    PERFORM tide.alter(reconcile.name, schedule => reconcile.schedule, tz => reconcile.tz,
                       biz_window => reconcile.biz_window, reconcile => def);
    RETURN t.task_id;
END
$$;
COMMENT ON FUNCTION tide.reconcile(text, text, text, text, text, text, text[], numeric, text, integer, text, boolean) IS
    'reconcile(name, schedule, tz => ''UTC'', biz_window => ''fire'', left_sql, right_sql, amounts => ''{}'', tolerance => 0, rules => ''[]'', max_diffs => 10000, work_mem => NULL, replace => false): creates (or, with replace, changes) a reconciliation: a task whose runs compare the two sides for their window (each returns key and the amount columns), record counts, sums and differences (tide.recon_result, tide.recon_diff) and compensate them by rules: auto_fix (a run of fix_task per difference, once), replay (a rerun of replay_task''s window, once), human (an alert). Returns the task id.';

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
                    WITH created AS (
                        INSERT INTO tide.run (task_id, trigger, dedupe_key, version, state, reason, executor, queue, priority,
                                              args, owner, event_key, payload, gate, lock_key, gated)
                        SELECT ft.task_id, 'reconcile', dk, ft.version, tide._open_state(tide._task_rules(ft)),
                               format('compensation of a %s difference (key %s) found by reconciliation %s, run %s', d.kind, d.key, t.name, r.run_id),
                               tide._executor_of(ft.command), ft.queue, ft.priority, ft.args || p.payload, ft.owner, NULL, p.payload,
                               g.gate, g.lock_key, g.gated
                          FROM (SELECT jsonb_build_object('reconciliation', t.name, 'biz_date', r.biz_date, 'key', d.key, 'kind', d.kind,
                                                          'left', d.l, 'right', d.r, 'columns', to_jsonb(d.cols)) AS payload) p
                         CROSS JOIN LATERAL tide._gating_of(ft.task_id, ft.version, ft.args || p.payload, p.payload, NULL, NULL, NULL) g
                        ON CONFLICT (task_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
                        RETURNING run_id
                    )
                    SELECT c.run_id INTO action FROM created c;
                    IF action IS NOT NULL THEN
                        PERFORM tide._record_created(ARRAY[action]);
                    ELSE
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

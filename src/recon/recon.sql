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

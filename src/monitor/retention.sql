-- ---------------------------------------------------------------------------------------------
-- Retention: the tick prunes finished history older than pg_tide.history_retention, a bounded
-- batch at a time (every pg_tide.monitor_interval), walking tide.run by id. Kept always: the latest 10 runs of each task, runs
-- that are not finished or wait for a person (dead, need_check), the coalesced run of windows
-- still kept, and open alerts. (tide.monitor_state is pg_tide's own: no policy, no grant.)
CREATE TABLE tide.monitor_state (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    evaluated_at timestamptz,
    prune_cursor bigint NOT NULL DEFAULT 0
);
COMMENT ON TABLE tide.monitor_state IS 'Internal: when alerts were last evaluated, and where pruning goes on.';
INSERT INTO tide.monitor_state DEFAULT VALUES;

CREATE FUNCTION tide._prune(p_now timestamptz, p_limit integer) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET jit = off
AS $$
DECLARE
    cursor_at bigint;
    last_id bigint;
    scanned integer;
    victims bigint[];
    -- Settings with units read as '30d', '10s': valid interval input.
    cutoff timestamptz := p_now - tide._setting('history_retention', '30d')::interval;
    alerts integer;
    effects integer;
BEGIN
    SELECT m.prune_cursor INTO cursor_at FROM tide.monitor_state m FOR UPDATE;
    SELECT max(s.run_id), count(*),
           array_agg(s.run_id) FILTER (
               WHERE s.state IN ('succeeded', 'skipped', 'cancelled')
                 AND coalesce(s.finished_at, s.updated_at) < cutoff
                 AND NOT EXISTS (SELECT 1 FROM tide.run c WHERE c.covered_by = s.run_id)
                 AND s.run_id NOT IN (SELECT k.run_id FROM tide.run k
                                       WHERE k.task_id = s.task_id AND k.window_start IS NOT NULL
                                       ORDER BY k.window_start DESC LIMIT 10))
      INTO last_id, scanned, victims
      FROM (SELECT r.run_id, r.task_id, r.state, r.finished_at, r.updated_at FROM tide.run r
             WHERE r.run_id > cursor_at ORDER BY r.run_id LIMIT p_limit) s;
    IF victims IS NOT NULL THEN
        -- Runs a transaction holds right now are left for the next round.
        SELECT array_agg(v.run_id) INTO victims
          FROM (SELECT x.run_id FROM tide.run x WHERE x.run_id = ANY (victims) FOR UPDATE SKIP LOCKED) v;
    END IF;
    IF victims IS NOT NULL THEN
        -- R4.6: the windows that succeeded are remembered, merged into ranges, after their runs
        -- go (a rerun or backfill of them needs force).
        INSERT INTO tide.succeeded_window AS w (task_id, windows, owner)
        SELECT r.task_id, range_agg(tstzrange(r.window_start, r.window_end)), min(r.owner)
          FROM tide.run r
         WHERE r.run_id = ANY (victims) AND r.state = 'succeeded' AND r.window_start IS NOT NULL
         GROUP BY r.task_id
        ON CONFLICT (task_id) DO UPDATE SET windows = w.windows + EXCLUDED.windows;
        DELETE FROM tide.run r WHERE r.run_id = ANY (victims);
    END IF;
    -- What the fold kept for tasks deleted since (bounded, like the rest).
    DELETE FROM tide.task_stat s
     WHERE s.task_id IN (SELECT x.task_id FROM tide.task_stat x
                          WHERE NOT EXISTS (SELECT 1 FROM tide.task t WHERE t.task_id = x.task_id) LIMIT p_limit);
    DELETE FROM tide.run_count c
     WHERE c.task_id IN (SELECT x.task_id FROM tide.run_count x
                          WHERE NOT EXISTS (SELECT 1 FROM tide.task t WHERE t.task_id = x.task_id) LIMIT p_limit);
    -- The hourly counters of the charts, kept eight days (tide.run_hours reads at most 192 hours).
    DELETE FROM tide.run_hourly x
     WHERE (x.task_id, x.hour) IN (SELECT y.task_id, y.hour FROM tide.run_hourly y
                                    WHERE y.hour < date_trunc('hour', p_now) - interval '192 hours' LIMIT p_limit);
    DELETE FROM tide.owner_hourly x
     WHERE (x.owner, x.hour) IN (SELECT y.owner, y.hour FROM tide.owner_hourly y
                                  WHERE y.hour < date_trunc('hour', p_now) - interval '192 hours' LIMIT p_limit);
    -- At the end of the table, start over (runs kept then may be prunable later).
    UPDATE tide.monitor_state SET prune_cursor = CASE WHEN scanned < p_limit THEN 0 ELSE last_id END;
    DELETE FROM tide.alert a
     WHERE a.alert_id IN (SELECT x.alert_id FROM tide.alert x WHERE x.resolved_at < cutoff ORDER BY x.resolved_at LIMIT p_limit);
    GET DIAGNOSTICS alerts = ROW_COUNT;
    -- Side effects delivered before the cutoff (their dedupe keys are forgotten with them);
    -- pending, sending and dead ones stay. One held right now waits for the next round.
    DELETE FROM tide.effect e
     WHERE e.effect_id IN (SELECT x.effect_id FROM tide.effect x
                            WHERE x.state = 'delivered' AND x.delivered_at < cutoff
                            ORDER BY x.delivered_at LIMIT p_limit
                              FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS effects = ROW_COUNT;
    -- Backfills that ended before the cutoff, with their plan and history.
    DELETE FROM tide.backfill b
     WHERE b.backfill_id IN (SELECT x.backfill_id FROM tide.backfill x
                              WHERE x.finished_at < cutoff
                                AND NOT EXISTS (SELECT 1 FROM tide.backfill_window w
                                                 WHERE w.backfill_id = x.backfill_id AND w.state = 'released')
                              ORDER BY x.finished_at LIMIT 100
                                FOR UPDATE SKIP LOCKED);
    -- Reconciliation results checked before the cutoff, with their differences, once none of
    -- those is open (an open one keeps its result until it is fixed or resolved).
    DELETE FROM tide.recon_result x
     WHERE x.result_id IN (SELECT y.result_id FROM tide.recon_result y
                            WHERE y.checked_at < cutoff
                              AND NOT EXISTS (SELECT 1 FROM tide.recon_diff d WHERE d.result_id = y.result_id AND d.status = 'open')
                            ORDER BY y.checked_at LIMIT p_limit
                              FOR UPDATE SKIP LOCKED);
    RETURN jsonb_build_object('pruned_runs', coalesce(cardinality(victims), 0), 'pruned_alerts', alerts,
                              'pruned_effects', effects);
END
$$;
COMMENT ON FUNCTION tide._prune(timestamptz, integer) IS
    'Internal: prunes a bounded batch of finished history older than pg_tide.history_retention (with attempts and events), keeping the latest 10 runs of each task, unfinished and unresolved runs, and open alerts (succeeded windows are remembered in tide.succeeded_window); side effects delivered before the cutoff; backfills that ended before it; reconciliation results checked before it without an open difference.';

-- The tick's monitoring step, every pg_tide.monitor_interval: alerts, then a batch of pruning
-- (up to 5000 runs: a tick that has nothing to evaluate costs nothing here).
CREATE FUNCTION tide._monitor(p_now timestamptz) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    step interval := tide._setting('monitor_interval', '10s')::interval;
BEGIN
    -- Every tick: the kept health figures and counters take in what changed.
    PERFORM tide._fold(p_now);
    -- Claims the evaluation only when it is due: an idle tick reads one row and writes nothing,
    -- and a concurrent tick waits on the row lock, then finds it no longer due. Tests drive time
    -- backwards too: any move of at least the interval evaluates.
    UPDATE tide.monitor_state m SET evaluated_at = p_now
     WHERE m.evaluated_at IS NULL OR p_now >= m.evaluated_at + step OR p_now < m.evaluated_at;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM tide.monitor_state) THEN
            RETURN jsonb_build_object('alerts_opened', 0, 'alerts_resolved', 0, 'pruned_runs', 0, 'pruned_alerts', 0,
                                      'pruned_effects', 0);
        END IF;
        INSERT INTO tide.monitor_state (evaluated_at) VALUES (p_now);  -- the row was deleted
    END IF;
    -- Task health reads kept figures only for tasks that have them or a touch row (see
    -- tide._health). Both are pg_tide's own rows, but should a task lack both (its kept row
    -- deleted by hand), it is noted again here, before the alerts are evaluated.
    INSERT INTO tide.task_touch (task_id, owner)
    SELECT t.task_id, t.owner FROM tide.task t
     WHERE NOT EXISTS (SELECT 1 FROM tide.task_stat s WHERE s.task_id = t.task_id)
       AND NOT EXISTS (SELECT 1 FROM tide.task_touch u WHERE u.task_id = t.task_id);
    -- Runs left of deleted tasks (see tide.task_gone).
    PERFORM tide._sweep_gone();
    -- Tasks whose owner was dropped (from another database: sql/roles.sql), event tasks among
    -- them, stop; the alert owner_gone says why.
    PERFORM tide._pause_orphans(p_now);
    RETURN tide._evaluate_alerts(p_now) || tide._prune(p_now, 5000);
END
$$;
COMMENT ON FUNCTION tide._monitor(timestamptz) IS
    'Internal: the tick''s monitoring: every pg_tide.monitor_interval, notes again any task without kept health figures or a touch row, deletes runs left of deleted tasks, evaluates alerts and prunes a batch of old history.';

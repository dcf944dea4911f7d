-- How long a worker may sleep: until the next delayed run, readiness re-check or fire.

-- Milliseconds from now until an instant, for a worker's sleep: at most p_cap_ms; NULL (nothing
-- due) gives p_cap_ms. An instant already past (a task skipped by this tick: its row was locked)
-- gives 100 ms, not a busy loop; one a few ms past (reached while the caller worked), 1 ms.
CREATE FUNCTION tide._sleep_ms(p_at timestamptz, p_cap_ms integer) RETURNS integer
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    -- (Compared as numbers before the cast: a yearly task's next fire is billions of ms away.)
    SELECT CASE WHEN l.ms IS NULL THEN p_cap_ms
                WHEN l.ms > 0 THEN least(p_cap_ms::numeric, ceil(l.ms) + 1)::integer
                WHEN l.ms > -50 THEN 1
                ELSE least(p_cap_ms, 100) END
      FROM (SELECT extract(epoch FROM (p_at - clock_timestamp())) * 1000 AS ms) l
$$;
COMMENT ON FUNCTION tide._sleep_ms(timestamptz, integer) IS
    'Internal: milliseconds a worker may sleep until an instant, at most p_cap_ms (100 ms for an instant long past).';

-- How long the scheduler may sleep after a tick (ms, at most p_cap_ms): until the next fire of a
-- task or the next retry that comes due, so that it ticks on time rather than at its next poll.
CREATE FUNCTION tide._next_wake(p_cap_ms integer) RETURNS integer
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT tide._sleep_ms(
        least((SELECT min(greatest(f.next_fire_at, f.tick_retry_at))
                 FROM (SELECT t.next_fire_at, t.tick_retry_at FROM tide.task t
                        WHERE NOT t.paused AND t.next_fire_at IS NOT NULL
                        ORDER BY t.next_fire_at LIMIT 20) f),
              (SELECT min(p.due_at) FROM tide.pending p WHERE p.state = 'retry')),
        p_cap_ms)
$$;
COMMENT ON FUNCTION tide._next_wake(integer) IS
    'Internal: milliseconds the scheduler may sleep after a tick: until the next fire or due retry, at most p_cap_ms.';

-- How long an idle SQL executor may sleep (ms, at most p_cap_ms): until the next SQL run
-- enqueued for later comes due, or the next readiness re-check of a waiting run, so that both
-- start on time rather than at the executor's next poll. (Runs made ready now wake it at once,
-- src/scheduler/wake.rs.)
CREATE FUNCTION tide._executor_wake(p_cap_ms integer) RETURNS integer
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT tide._sleep_ms(
        least((SELECT min(p.due_at) FROM tide.pending p
                WHERE p.state = 'ready' AND p.due_at > now() AND NOT p.parked AND p.executor = 'sql'),
              (SELECT min(p.due_at) FROM tide.pending p WHERE p.state = 'waiting' AND p.due_at > now())),
        p_cap_ms)
$$;
COMMENT ON FUNCTION tide._executor_wake(integer) IS
    'Internal: milliseconds an idle SQL executor may sleep: until the next delayed SQL run or readiness re-check comes due, at most p_cap_ms.';

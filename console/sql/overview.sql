-- pg_tide-console's overview: the tasks worst first (the order of tide.dashboard), with the
-- last 30 business windows of each (an event task: its last 30 runs), oldest first, as a JSON
-- array of [state, label, run_id], and the next fire in the task's own zone. $1 limit, $2 offset.
-- Every column is text. bench/bench.sh runs this file from psql beside the console. An event
-- task's runs newest first are ORDER BY -run_id, the order of run_event_task_idx (sql/ledger.sql).
WITH h AS (
    SELECT h.task, h.owner, h.status, h.severity, h.silence, h.consecutive_failures, h.backlog,
           h.dead, h.next_fire_at, t.task_id, t.tz, t.paused, h.rank
      FROM (SELECT h.*, row_number() OVER (ORDER BY h.status_rank, h.severity DESC,
                                                    h.silence DESC NULLS LAST, h.task) AS rank
              -- The sort keys first: the sort reads them from rows stored in this order
              -- (after the varying-length columns, every read walked those again).
              FROM (SELECT tide._status_rank(h.status) AS status_rank, h.severity, h.silence, h.task,
                           h.owner, h.status, h.consecutive_failures, h.backlog, h.dead, h.next_fire_at
                      FROM tide.health h) h) h
      LEFT JOIN tide.task t ON t.name = h.task AND t.owner = h.owner
     ORDER BY h.rank
     LIMIT $1 OFFSET $2
)
SELECT h.task_id::text, h.task, h.owner::text, h.status, h.severity::text,
       extract(epoch FROM h.silence)::text, h.consecutive_failures::text, h.backlog::text,
       h.dead::text,
       to_char(h.next_fire_at AT TIME ZONE h.tz, 'YYYY-MM-DD HH24:MI:SS'),
       to_char(h.next_fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),
       h.tz,
       coalesce(
           (SELECT jsonb_agg(jsonb_build_array(w.state, coalesce(w.biz_date::text, ''), w.run_id) ORDER BY w.window_start)::text
              FROM (SELECT r.run_id, r.state, r.biz_date, r.window_start
                      FROM tide.run r
                     WHERE r.task_id = h.task_id AND r.window_start IS NOT NULL
                     ORDER BY r.window_start DESC LIMIT 30) w),
           (SELECT jsonb_agg(jsonb_build_array(e.state, coalesce(e.event_key, 'run ' || e.run_id), e.run_id)
                             ORDER BY e.run_id)::text
              FROM (SELECT r.run_id, r.state, r.event_key
                      FROM tide.run r
                     WHERE r.task_id = h.task_id AND r.window_start IS NULL
                     ORDER BY -r.run_id LIMIT 30) e),
           '[]'),
       h.paused::text
  FROM h
 ORDER BY h.rank;

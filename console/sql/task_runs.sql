-- The runs of one task on its console page, newest first, filtered by state ($2), business
-- date ($3) and trigger ($4), as the signed-in role (RLS), $5 of them after the first $6
-- (paging: run ids order them, newest first). The runs with a window are read from
-- run_window_key and then sorted (`run_id + 0` keeps the planner from walking the primary key
-- back through every task's runs, expecting this task's soon), those without by ORDER BY
-- -run_id, the order of run_event_task_idx: each part reads this task's own index range. With
-- one busy task in the history, a plain ORDER BY run_id over all the task's runs scanned
-- tide.run whole for a quiet task (1,160,000 runs: 135,000 pages, 15 s). The monitor tier
-- counts the pages it reads.
SELECT r.run_id::text, r.state::text, r.trigger::text, r.biz_date::text,
       to_char(coalesce(r.window_start, r.created_at) AT TIME ZONE t.tz, 'YYYY-MM-DD HH24:MI:SS'),
       to_char(coalesce(r.window_start, r.created_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'),
       r.attempts::text, left(r.last_error, 160), r.event_key
  FROM ((SELECT * FROM tide.run r
          WHERE r.task_id = $1 AND r.window_start IS NOT NULL
            AND ($2::text IS NULL OR r.state::text = $2)
            AND ($3::text IS NULL OR r.biz_date = $3::text::date)
            AND ($4::text IS NULL OR r.trigger::text = $4)
          ORDER BY r.run_id + 0 DESC LIMIT $5::bigint + $6::bigint)
        UNION ALL
        (SELECT * FROM tide.run r
          WHERE r.task_id = $1 AND r.window_start IS NULL
            AND ($2::text IS NULL OR r.state::text = $2)
            AND ($3::text IS NULL OR r.biz_date = $3::text::date)
            AND ($4::text IS NULL OR r.trigger::text = $4)
          ORDER BY -r.run_id LIMIT $5::bigint + $6::bigint)) r
  JOIN tide.task t ON t.task_id = r.task_id
 ORDER BY r.run_id DESC LIMIT $5::bigint OFFSET $6::bigint

-- CREATE EXTENSION refuses where pg_tide can never work (not preloaded, or a database no
-- scheduler serves), with a HINT: everything above is undone.
SELECT tide._install_check();

-- Comments on the functions generated from Rust, so \df+ tide.* documents them, and their privileges.
COMMENT ON FUNCTION tide._install_check() IS
    'Internal: refuses CREATE EXTENSION in a database other than pg_tide.database (unless pg_tide.allow_unscheduled); without pg_tide in shared_preload_libraries, loading the library refuses already.';
COMMENT ON FUNCTION tide._watch() IS
    'Internal: what pg_tide''s workers noted in shared memory (the scheduler''s ticks, the delivery worker, the ping), as epoch milliseconds.';
COMMENT ON FUNCTION tide.next_fires(text, text, timestamptz, integer, text, text) IS
    'next_fires(schedule, tz => ''UTC'', after => now(), n => 5, dst_gap => ''shift'', dst_overlap => ''once''): the next n fire instants of a cron expression in a time zone, strictly after "after".';
COMMENT ON FUNCTION tide.preview(text, integer, timestamptz, text) IS
    'preview(task, n => 5, after => now(), owner => NULL): the next n fires of a task with their local time, business window and biz_date. owner names another role''s task of that name (a team''s, or any role''s for tide_admin).';
COMMENT ON FUNCTION tide.schedule(text, text, text, text, text, text, jsonb, text, text, interval, interval, integer, integer, interval, double precision, interval, text, text, interval, integer, interval, text, text, interval, interval, text, text, integer, text, text[], boolean, boolean, double precision, interval, jsonb, text, interval, text, boolean, jsonb, boolean, text, text) IS
    'schedule(task, schedule, command => NULL, tz => ''UTC'', biz_window => ''fire'', queue => ''default'', args => ''{}'', dst_gap => ''shift'', dst_overlap => ''once'', timeout => ''1 hour'' (''0'': none, the owner''s statement_timeout applies), lease => ''5 minutes'', priority => 0, max_attempts => 5, backoff_base => ''10 seconds'', backoff_factor => 2, backoff_cap => ''1 hour'', jitter => ''full'', misfire => ''catch_up'', misfire_threshold => ''60 seconds'', catch_up_max => 100, source_retention => NULL, ready_dataset => NULL, ready_check => NULL, ready_timeout => NULL, recheck_interval => ''1 minute'', not_ready_policy => ''next_window'', overlap => ''queue'', max_concurrency => NULL, lock_key => NULL, topics => ''{}'', long => false, top_level => false, batch_rate => NULL, batch_pause => NULL, error_kinds => NULL, ready_watermark => NULL, watermark_stable_for => NULL, fallback => NULL, rescan_previous => false, reconcile => NULL (a reconciliation''s definition, written by tide.reconcile), replace => false, pending => ''hold'', database => NULL (another database of the cluster the command runs in, as pg_cron''s schedule_in_database; NULL: this one)): creates a task (schedule NULL: an event task that runs only on tide.emit of its topics); returns its task_id. A command that does not parse, or (without top_level) holds a statement that refuses a transaction block, such as VACUUM, is refused. On a name the caller already has: the same definition is a no-op returning the same task_id; a different one is refused (23505) unless replace => true, which makes it the task''s next rule version (unstarted runs follow pending, as in tide.alter).';
COMMENT ON FUNCTION tide.alter(text, text, text, text, text, text, jsonb, text, text, interval, interval, integer, integer, interval, double precision, interval, text, text, interval, integer, interval, text, text, interval, interval, text, text, text, integer, text, text[], boolean, boolean, double precision, interval, jsonb, text, interval, text, boolean, jsonb, text) IS
    'alter(task, ..., pending => ''hold''): changes only the options given (schedule, command, ready_dataset, ready_check or lock_key => '''' removes it; max_concurrency, batch_rate => 0 and batch_pause => ''0'' remove the limit; error_kinds => ''{}'' removes the mapping; ready_watermark => '''' with watermark_stable_for => ''0'' removes the watermark; fallback => '''' removes the scan; database => '''' runs the command in pg_tide''s database again; timeout => ''0'' leaves runs without a timeout of pg_tide''s); returns the rule version, one higher if any rule changed. Unstarted runs of older versions are held for tide.confirm (pending => ''hold''), take the new rules (''adopt'') or keep theirs (''keep'').';
COMMENT ON FUNCTION tide.unschedule(text, text) IS
    'unschedule(task, owner => caller): deletes a task and its rule versions; false if there is no task of that name. owner names another role''s task: a team''s the caller is a member of, or, for a superuser or tide_admin, any role''s (one that no longer exists included).';
COMMENT ON FUNCTION tide.pause(text) IS
    'pause(task): stops a task firing (no new rule version); false if it was already paused.';
COMMENT ON FUNCTION tide.resume(text) IS
    'resume(task): lets a paused task fire again from the next fire after now, without catching up the paused time; false if it was not paused.';
COMMENT ON FUNCTION tide.tick(timestamptz) IS
    'tick(now => now()): the scheduler''s whole job at instant now, in one transaction: creates due runs (applying misfire policies to missed windows), moves due retries, takes back expired leases, releases ready runs, evaluates health and alerts. Returns counts. The scheduler worker does the same in several transactions (tide._fire for each due task, then tide._tick_steps).';
COMMENT ON FUNCTION tide._fire(timestamptz, integer) IS
    'Internal: the firing part of tide.tick for at most max_tasks due tasks (the scheduler: one per transaction, so each task''s runs are committed at once). Returns the counts of firing.';
COMMENT ON FUNCTION tide._tick_steps(timestamptz) IS
    'Internal: the part of tide.tick after firing: retries, leases, lost runs, readiness, health, alerts, retention.';
COMMENT ON FUNCTION tide.rerun(text, date, timestamptz, text, boolean) IS
    'rerun(task, biz_date => NULL, window_start => NULL, version => NULL, force => false): runs one business window of a task by hand, through the same idempotency key as every run of that window: the window of biz_date, the one starting at window_start, or (neither) the window of the latest fire at or before now. A run of it already in line is left as it is; a succeeded one needs force => true; when the rules changed since, version => ''original'' or ''current'' must be chosen. Returns the run id.';
COMMENT ON FUNCTION tide._error_kind(text, jsonb) IS
    'Internal: how a failed command''s SQLSTATE is treated under a task''s error_kinds: the helpers'' SQLSTATEs keep their kinds, then the exact SQLSTATE, its class, and the default list (tide._error_kind_of).';
COMMENT ON FUNCTION tide._queue_reserve(text, text, integer, integer) IS
    'Internal: reserves room for up to n runs in a queue''s running count (shared memory) within its limit; returns how many, or -1 when the count must be counted again first.';
COMMENT ON FUNCTION tide._queue_count_again(text, text) IS
    'Internal: counts a queue''s counted running runs again (latest snapshot, under the queue''s lock held exclusively) into its shared count; false when this transaction changed the count itself.';
COMMENT ON FUNCTION tide._queue_unreserve(text, text, integer) IS
    'Internal: gives back at once room this transaction reserved in a queue''s running count and will not use.';
COMMENT ON FUNCTION tide._queue_release(text, text, integer) IS
    'Internal: counted runs of a queue stopped running: their room in its running count goes back when this transaction commits.';
COMMENT ON FUNCTION tide._queue_forget(text, text) IS
    'Internal: a queue''s running count must be counted again once this transaction commits (its limits changed).';
COMMENT ON FUNCTION tide._queue_running(text, text) IS
    'Internal: a queue''s running count as this transaction sees it (less what it gives back at commit); NULL while it must be counted again.';
COMMENT ON FUNCTION tide._needs_top_level(text) IS
    'Internal (tide.import_pg_cron): whether an imported pg_cron job must run at top level: a statement PostgreSQL refuses in a transaction block or a function, or one CALL (several ordinary statements run as one transaction, as in pg_cron).';
COMMENT ON FUNCTION tide._import_task(text, text, text, text, text, boolean, boolean, text, integer, text, interval, interval) IS
    'Internal (tide.import_pg_cron): creates one imported task through tide.schedule, called as the pg_cron job''s role, with the import''s settings, paused when the job was inactive.';
COMMENT ON FUNCTION tide._statement_count(text) IS
    'Internal: how many statements a command holds, as PostgreSQL''s parser reads it.';
COMMENT ON FUNCTION tide._check_command(text, text, boolean) IS
    'Internal (tide._check_task): refuses a command that does not parse (42601) or, unless top-level, holds a statement PostgreSQL refuses inside a transaction block, naming it (22023, hint top_level => true).';
COMMENT ON FUNCTION tide.test_channel(text) IS
    'test_channel(name): sends a test message to one of your channels through pg_tide''s delivery worker, as an alert would go, and returns what the receiver answered: status (delivered, failed, refused, no answer), took, error (without secrets). Nothing is recorded. In the database pg_tide serves.';
COMMENT ON FUNCTION tide._queue_claimed(text) IS
    'Internal (tide._claim): notes in shared memory that an external worker claimed from a queue now, for the cause of a late start.';
COMMENT ON FUNCTION tide._queue_claimed_at(text) IS
    'Internal: when an external worker last claimed from a queue of this database since the server started (NULL: not since, or forgotten).';
COMMENT ON FUNCTION tide._command_runs() IS
    'Internal: the runs whose commands a command worker runs or has run and whose outcome is not recorded yet (the tick leaves them to it).';
COMMENT ON FUNCTION tide._command_workers() IS
    'Internal (superusers and tide_admin): the busy command workers (top-level commands, commands in other databases) at this instant: run_id, database, state (launching, running, done, collecting), the worker''s pid, since when.';
COMMENT ON FUNCTION tide._args_ok(jsonb) IS
    'Internal: checks one run''s args given to tide.enqueue (a JSON object within the limits of a task''s args); true or a 22023 error.';
COMMENT ON FUNCTION tide._backoff_delay(integer, interval, double precision, interval, text, double precision) IS
    'Internal: _backoff_delay(tries, base, factor, cap, jitter, unit): the retry delay after tries failed tries: min(cap, base * factor^(tries-1)), spread by jitter (full: [0, d]; equal: [d/2, d]; none: d) using unit in [0, 1).';
COMMENT ON FUNCTION tide._error_kind_of(text) IS
    'Internal: _error_kind_of(sqlstate): how a command error is treated: transient (connection, serialization, deadlock, lock or statement timeout, resources, shutdown), not_ready (TDNR0) or business (everything else).';
COMMENT ON FUNCTION tide._error_kind_from(text) IS
    'Internal (tide.fail_run): checks an error kind given to tide.fail_run; returns its canonical spelling.';

COMMENT ON FUNCTION tide.run_id() IS
    'Inside a task''s command or readiness check: the id of the run being executed (set by pg_tide''s executor, not by any setting); NULL elsewhere.';
COMMENT ON FUNCTION tide.report(bigint, bigint) IS
    'report(expected, actual): inside a task''s command, the counts its completion is checked against; actual < expected ends the run in need_check.';
COMMENT ON FUNCTION tide._seal_begin(bigint, text, integer) IS
    'Internal: starts running a run''s command or readiness check sealed as its owner (a security-restricted operation in a GUC nest level reset to the session''s defaults); returns the key tide._seal_end needs. Only pg_tide''s executors (a superuser) call it.';
COMMENT ON FUNCTION tide._seal_end(bigint) IS
    'Internal: ends a sealed run (its settings undone, the user switched back, session state it left dropped) given the key tide._seal_begin returned; returns what the command passed to tide.report.';
COMMENT ON FUNCTION tide._seal_abort(bigint) IS
    'Internal: ends a sealed run whose code failed, after its subtransaction''s abort.';
COMMENT ON FUNCTION tide._caller() IS
    'Internal: the role pg_tide acts for: the caller of the public function running (public functions run as the extension''s owner), else the current user.';
COMMENT ON FUNCTION tide._may_act(text) IS
    'Internal: whether the caller may act on what a role owns: it is that role, a member of it, or a superuser.';
COMMENT ON FUNCTION tide._caller_is_superuser() IS
    'Internal: whether the caller is a superuser (who sees and claims every role''s runs).';
COMMENT ON FUNCTION tide._bounded(text, interval, boolean) IS
    'Internal: an interval argument checked with tide.schedule''s rules (one sign, within the documented maximum), else 22023.';
COMMENT ON FUNCTION tide._counts_of(text, integer, timestamptz, timestamptz, timestamptz, timestamptz, timestamptz) IS
    'Internal: what a history row that brings a run to a state adds to the counters of tide.metrics() and to the hourly counters of tide.run_hours (metric, label, value).';
COMMENT ON FUNCTION tide._le(double precision) IS
    'Internal: the histogram bucket (its upper bound, the le label) of a duration or wait in seconds; NULL above 21600 (+Inf only).';
COMMENT ON FUNCTION tide._backend_start() IS
    'Internal: when this backend process started (pg_stat_activity.backend_start): with its pid, how a run names the executor running it.';

-- Privileges. Internal functions that change anything are pg_tide's own: the public functions
-- (running as the extension's owner) and pg_tide's workers call them; roles may not. Internal
-- functions that only read stay callable, as the views that run as their caller use them. tide.tick
-- moves time for every task: only the scheduler (and superusers, such as tests driving time
-- with explicit instants) may call it.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'tide'::regnamespace AND p.provolatile = 'v'
                AND p.prorettype <> 'trigger'::regtype
                AND (p.proname LIKE '\_%' OR p.proname = 'tick')
              ORDER BY 1 LOOP
        EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
-- Called while a command runs as its owner, to switch back: useless without the key that only
-- the executor's frame holds.
GRANT EXECUTE ON FUNCTION tide._seal_end(bigint) TO PUBLIC;
-- pg_tide's own state (the scheduler's last error among it) is for superusers and tide_admin, who
-- read it through tide.self_health.
REVOKE EXECUTE ON FUNCTION tide._watch() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tide._watch() TO tide_admin;
-- The command workers name every role's runs and databases: the same.
GRANT EXECUTE ON FUNCTION tide._command_workers() TO tide_admin;
COMMENT ON FUNCTION tide._shortest_gap(text, text, text, text) IS
    'Internal: the shortest gap between two consecutive fires of a schedule, over the next 1000 fires or 400 days, whichever ends first (a role''s limit fastest_schedule is checked against it).';
COMMENT ON FUNCTION tide._share_lock(boolean) IS
    'Internal: the executors'' choice lock, until the end of the transaction (without wait, only if free at once): whose run an executor takes next is chosen and claimed under it (sql/share.sql). No SQL advisory lock function can take it.';
COMMENT ON FUNCTION tide._notify(text, text) IS
    'Internal: pg_notify(channel, payload) unless PostgreSQL''s notification queue is half full or more (then nothing: a notification of pg_tide''s is a hint, never a dependency); true if it notified.';
COMMENT ON FUNCTION tide._fire_gap(text, text, text, text) IS
    'Internal: the longest gap between two consecutive fires of a schedule, over the next 1000 fires or 400 days, whichever ends first (the base of a task''s derived max_silence).';
COMMENT ON FUNCTION tide._next_fire(text, text, timestamptz) IS
    'Internal: the first fire of a cron schedule in a time zone after an instant (when a heartbeat check expects its next beat).';
COMMENT ON FUNCTION tide._lock_key(text, text, jsonb, jsonb, text, text) IS
    'Internal: a run''s lock key from its task''s lock_key template (placeholders {args.NAME}, {payload.NAME}, {key}, {biz_date}, {task}; a missing field renders empty).';
COMMENT ON FUNCTION tide._backfill_windows(text, date, date) IS
    'Internal: the ended windows of the caller''s task whose business date lies in a range, oldest first, with their fires (what tide.backfill plans; at most 100000 windows over at most 3660 days).';
COMMENT ON FUNCTION tide._window_of_date(bigint, date) IS
    'Internal: the window (with its fire) of a task, of any owner, whose business date is a date: what a reconciliation''s replay reruns.';
COMMENT ON FUNCTION tide._wake(boolean) IS
    'Internal: at the commit of this transaction, sets the latches of the executors (a ready SQL run) or of the scheduler (true: a schedule changed); nothing on abort.';
COMMENT ON FUNCTION tide._ready(text[]) IS
    'Internal: runs of these queues were made ready: at the commit of this transaction their waiting workers get NOTIFY pg_tide_ready (payload: the queue), sent by pg_tide''s notifier worker in the database it serves (a NOTIFY in the committing transaction would make notifying transactions commit one at a time), and in the caller''s transaction elsewhere; nothing on abort.';
COMMENT ON FUNCTION tide._history_unwritten() IS
    'Internal: the WHEN clause of the trigger run_touched_update: whether the transaction-local setting tide.history is not ''written'' (the hot paths note their tasks with their own history rows).';
COMMENT ON FUNCTION tide.metrics() IS
    'metrics(): Prometheus text exposition of the caller''s tasks and checks (a superuser''s: every role''s), labelled by owner and name: runs by task and outcome (counters), duration and queue wait (histograms, with 24-hour percentiles as gauges), backlog, silence, failures, unresolved runs, task and check status, open alerts (gauges).';
COMMENT ON FUNCTION tide._metric_samples() IS
    'Internal: the samples of tide.metrics() read back as rows (what the view tide.metric shows): family, kind, metric, owner, task, the other labels, value.';

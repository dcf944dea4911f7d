-- Comments on the functions generated from Rust, so \df+ tide.* documents them.
COMMENT ON FUNCTION tide.next_fires(text, text, timestamptz, integer, text, text) IS
    'next_fires(schedule, tz => ''UTC'', after => now(), n => 5, dst_gap => ''shift'', dst_overlap => ''once''): the next n fire instants of a cron expression in a time zone, strictly after "after".';
COMMENT ON FUNCTION tide.preview(text, integer, timestamptz) IS
    'preview(task, n => 5, after => now()): the next n fires of a task with their local time, business window and biz_date.';
COMMENT ON FUNCTION tide.schedule(text, text, text, text, text, text, jsonb, text, text) IS
    'schedule(name, schedule, command => NULL, tz => ''UTC'', biz_window => ''fire'', queue => ''default'', args => ''{}'', dst_gap => ''shift'', dst_overlap => ''once''): creates a task; returns its task_id.';
COMMENT ON FUNCTION tide.alter(text, text, text, text, text, text, jsonb, text, text) IS
    'alter(name, ...): changes only the options given (command => '''' removes the command); returns the rule version, one higher if any rule changed.';
COMMENT ON FUNCTION tide.unschedule(text) IS
    'unschedule(name): deletes a task and its rule versions.';
COMMENT ON FUNCTION tide.pause(text) IS
    'pause(name): stops a task firing (no new rule version); false if it was already paused.';
COMMENT ON FUNCTION tide.resume(text) IS
    'resume(name): lets a paused task fire again from the next fire after now, without catching up the paused time; false if it was not paused.';

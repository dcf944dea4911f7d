// The graphile-worker reference for bench/bench.sh: works off the no-op jobs already queued
// (task identifier "noop") with 4 concurrent jobs in one worker, the way graphile-worker is run,
// fetching one job at a time (batch 1) or a local queue of 50 with batched completions
// (batch 50), and prints the jobs per second from start to the last completion.
//
//   node graphile_drain.js <connection string> <jobs> <batch>
"use strict";
const { run, Logger } = require("graphile-worker");

async function main() {
  const [connectionString, jobsArg, batchArg] = process.argv.slice(2);
  const jobs = Number(jobsArg);
  const batch = Number(batchArg);
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const started = process.hrtime.bigint();
  const runner = await run({
    connectionString,
    concurrency: 4,
    maxPoolSize: 6,
    pollInterval: 50,
    noHandleSignals: true,
    logger: new Logger(() => () => {}),
    preset: {
      worker:
        batch > 1
          ? { localQueue: { size: batch }, completeJobBatchDelay: 0 }
          : {},
    },
    taskList: {
      noop: async () => {
        done += 1;
        if (done === jobs) finish();
      },
    },
  });
  // A deadline, so that a stuck run ends the benchmark with a message rather than hangs it.
  const deadline = setTimeout(() => finish(), 600000);
  await finished;
  clearTimeout(deadline);
  // Stopping flushes the completions still batched: they count.
  await runner.stop();
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  if (done < jobs) {
    console.error(`graphile-worker finished ${done} of ${jobs} jobs in 600 s`);
    process.exit(1);
  }
  console.log(Math.round(jobs / seconds));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

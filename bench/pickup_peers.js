// The pickup references for bench/bench.sh: a worker that waits, idle, for jobs that the bench
// then adds one at a time (50 ms apart, each in a transaction of its own), and records when each
// was claimed; the bench reads the figures from the database (the server's clock on both ends).
//
//   node pickup_peers.js tide <connection string> <queue> <jobs>
//     an external pg_tide worker as docs/guide.md writes it in Node (pg): LISTEN pg_tide_ready,
//     claim with tide.claim_runs on each notification (and a slow poll), complete each run.
//     The claim's instant is the run's claimed_at.
//   node pickup_peers.js graphile <connection string> <jobs>
//     graphile-worker's own worker (one job at a time; it LISTENs for new jobs): the task
//     "probe" copies its job's created_at and locked_at into bench_gw_probe.
//
// Prints "ready" once it listens, then exits when <jobs> jobs are done (or after 120 s, with a
// message and status 1).
"use strict";

const [mode, connectionString, ...rest] = process.argv.slice(2);
const DEADLINE_MS = 120000;

function ready() {
  process.stdout.write("ready\n");
}

async function tideWorker(queue, jobs) {
  const { Client } = require("pg");
  const db = new Client({ connectionString });
  await db.connect();
  let done = 0;
  let current = null;
  let stopping = false;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  async function work() {
    while (!stopping) {
      const { rows } = await db.query(
        "SELECT run_id, lease_token FROM tide.claim_runs($1, 'bench-listen', 10)", [queue]);
      if (rows.length === 0) return;
      for (const r of rows) {
        await db.query("SELECT tide.complete_run($1, $2)", [r.run_id, r.lease_token]);
        done += 1;
      }
      if (done >= jobs) finish();
    }
  }
  let again = false;
  function drain() {
    // One drain at a time; a notification that comes during one makes it claim once more (its
    // last claim may have looked before the new run was committed).
    if (stopping) return current;
    if (current !== null) {
      again = true;
      return current;
    }
    current = (async () => {
      do {
        again = false;
        await work();
      } while (again && !stopping);
    })()
      .catch(fail)
      .finally(() => (current = null));
    return current;
  }
  db.on("notification", drain);
  await db.query("LISTEN pg_tide_ready");
  const poll = setInterval(drain, 5000);
  await drain();
  ready();
  const deadline = setTimeout(finish, DEADLINE_MS);
  await finished;
  stopping = true;
  clearInterval(poll);
  clearTimeout(deadline);
  await current;
  await db.end();
  return done;
}

async function graphileWorker(jobs) {
  const { run, Logger } = require("graphile-worker");
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const runner = await run({
    connectionString,
    concurrency: 1,
    noHandleSignals: true,
    logger: new Logger(() => () => {}),
    taskList: {
      probe: async (_payload, helpers) => {
        await helpers.query(
          "INSERT INTO bench_gw_probe SELECT id, created_at, locked_at FROM graphile_worker.jobs WHERE id = $1",
          [helpers.job.id]);
        done += 1;
        if (done >= jobs) finish();
      },
    },
  });
  // The worker has connected and listens once run() resolves.
  ready();
  const deadline = setTimeout(finish, DEADLINE_MS);
  await finished;
  clearTimeout(deadline);
  await runner.stop();
  return done;
}

function fail(e) {
  console.error(e);
  process.exit(1);
}

async function main() {
  let jobs;
  let done;
  if (mode === "tide") {
    jobs = Number(rest[1]);
    done = await tideWorker(rest[0], jobs);
  } else if (mode === "graphile") {
    jobs = Number(rest[0]);
    done = await graphileWorker(jobs);
  } else {
    throw new Error(`unknown mode ${mode}: pass tide or graphile`);
  }
  if (done < jobs) {
    console.error(`${mode}: ${done} of ${jobs} jobs done in ${DEADLINE_MS / 1000} s`);
    process.exit(1);
  }
}

main().catch(fail);

// A pg_tide external worker in Node (pg): see examples/README.md.
"use strict";
const os = require("os");
const { Client } = require("pg");

const QUEUE = process.env.QUEUE || "default";
const WORKER = `node-${os.hostname()}-${process.pid}`;

class BusinessError extends Error {}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Does what the payload asks for; returns n squared.
async function work(db, run) {
  const payload = run.payload || {};
  const n = Number(payload.n || 0);
  if (n < 0) throw new BusinessError(`n must not be negative, got ${n}`);
  if (payload.flaky && run.attempt === 1) throw new Error("flaky: fails its first attempt");
  for (let doneMs = 250; doneMs <= Number(payload.slow_ms || 0); doneMs += 250) {
    await sleep(250);
    // Keeps the lease and records progress (the run's checkpoint).
    await db.query("SELECT tide.heartbeat_run($1, $2, $3)", [run.run_id, run.lease_token, { done_ms: doneMs }]);
  }
  return n * n;
}

async function runOne(db, run) {
  let square;
  try {
    square = await work(db, run);
  } catch (e) {
    const kind = e instanceof BusinessError ? "business" : "transient";
    await db.query("SELECT tide.fail_run($1, $2, $3, $4)", [run.run_id, run.lease_token, e.message, kind]);
    return;
  }
  // The result and the completion commit together: a stale lease token rolls both back.
  await db.query("BEGIN");
  try {
    await db.query(
      "INSERT INTO example_result (key, n, square, worker) VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING",
      [run.dedupe_key, run.payload.n, square, WORKER]);
    await db.query("SELECT tide.complete_run($1, $2)", [run.run_id, run.lease_token]);
    await db.query("COMMIT");
  } catch (e) {
    await db.query("ROLLBACK");
    throw e;
  }
}

// Where to LISTEN for wake-ups: DATABASE_URL by default. Through a transaction pooler
// (pgbouncer's pool_mode = transaction), LISTEN does not work: give the server's own address in
// LISTEN_URL, or "none" to poll every 2 seconds. (pg sends unnamed statements unless a query is
// given a name: none is here, so nothing is prepared on a connection the pooler may swap.)
const DATABASE_URL = process.env.DATABASE_URL;
const LISTEN_URL = process.env.LISTEN_URL || DATABASE_URL;

async function main() {
  const db = new Client({ connectionString: DATABASE_URL });
  await db.connect();
  let listener = null;
  if (LISTEN_URL !== "none") {
    listener = LISTEN_URL === DATABASE_URL ? db : new Client({ connectionString: LISTEN_URL });
    if (listener !== db) await listener.connect();
  }
  let stopping = false;
  let wake = null; // resolves the idle wait early
  const stop = () => { stopping = true; if (wake) wake(); };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  if (listener) {
    listener.on("notification", () => { if (wake) wake(); });
    await listener.query("LISTEN pg_tide_ready");
  }
  console.log(`${WORKER}: claiming from queue ${QUEUE}`);
  while (!stopping) {
    const { rows } = await db.query(
      "SELECT run_id, lease_token, attempt, dedupe_key, payload FROM tide.claim_runs($1, $2, n => 10, lease => interval '30 seconds')",
      [QUEUE, WORKER]);
    for (const run of rows) {
      await runOne(db, run); // the run in hand is finished even when stopping
      if (stopping) break;
    }
    if (rows.length === 0 && !stopping) {
      // Wake on a notification, or after 2 seconds (one can be missed).
      await new Promise((resolve) => { wake = resolve; setTimeout(resolve, 2000); });
      wake = null;
    }
  }
  if (listener && listener !== db) await listener.end();
  await db.end();
  console.log(`${WORKER}: stopped`);
}

main().catch((e) => { console.error(e); process.exit(1); });

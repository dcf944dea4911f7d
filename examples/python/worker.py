"""A pg_tide external worker in Python (psycopg 3): see examples/README.md."""

import os
import signal
import socket
import time

import psycopg
from psycopg.types.json import Jsonb

DATABASE_URL = os.environ.get("DATABASE_URL", "postgres:///postgres")
# Where to LISTEN for wake-ups: DATABASE_URL by default. Through a transaction pooler
# (pgbouncer's pool_mode = transaction), LISTEN does not work: give the server's own address
# here, or "none" to poll every 2 seconds.
LISTEN_URL = os.environ.get("LISTEN_URL", DATABASE_URL)
QUEUE = os.environ.get("QUEUE", "default")
WORKER = f"python-{socket.gethostname()}-{os.getpid()}"

stopping = False


def stop(signum, frame):
    global stopping
    stopping = True


class BusinessError(Exception):
    """Retrying cannot help: the run goes to the dead letters."""


class TransientError(Exception):
    """Worth another attempt after the backoff."""


def work(conn, run_id, lease_token, attempt, payload):
    """Does what the payload asks for; returns n squared."""
    n = int(payload.get("n", 0))
    if n < 0:
        raise BusinessError(f"n must not be negative, got {n}")
    if payload.get("flaky") and attempt == 1:
        raise TransientError("flaky: fails its first attempt")
    done_ms = 0
    while done_ms < int(payload.get("slow_ms", 0)):
        time.sleep(0.25)
        done_ms += 250
        # Keeps the lease and records progress (the run's checkpoint).
        conn.execute(
            "SELECT tide.heartbeat_run(%s, %s, %s)",
            (run_id, lease_token, Jsonb({"done_ms": done_ms})),
        )
    return n * n


def run_one(conn, run):
    run_id, lease_token, attempt, key, payload = run
    try:
        square = work(conn, run_id, lease_token, attempt, payload or {})
    except BusinessError as e:
        conn.execute("SELECT tide.fail_run(%s, %s, %s, 'business')", (run_id, lease_token, str(e)))
        return
    except Exception as e:  # anything else may pass: transient
        conn.execute("SELECT tide.fail_run(%s, %s, %s)", (run_id, lease_token, str(e)))
        return
    # The result and the completion commit together: a stale lease token rolls both back.
    with conn.transaction():
        conn.execute(
            "INSERT INTO example_result (key, n, square, worker) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (key) DO NOTHING",
            (key, payload.get("n"), square, WORKER),
        )
        conn.execute("SELECT tide.complete_run(%s, %s)", (run_id, lease_token))


def main():
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # prepare_threshold=None: no named prepared statements, which a transaction pooler
    # (pgbouncer before 1.21) may send to another server connection than the one that prepared
    # them.
    with psycopg.connect(DATABASE_URL, autocommit=True, prepare_threshold=None) as conn:
        listener = None
        if LISTEN_URL != "none":
            listener = conn if LISTEN_URL == DATABASE_URL else psycopg.connect(LISTEN_URL, autocommit=True)
            listener.execute("LISTEN pg_tide_ready")
        print(f"{WORKER}: claiming from queue {QUEUE}", flush=True)
        while not stopping:
            runs = conn.execute(
                "SELECT run_id, lease_token, attempt, dedupe_key, payload"
                "  FROM tide.claim_runs(%s, %s, n => 10, lease => interval '30 seconds')",
                (QUEUE, WORKER),
            ).fetchall()
            for run in runs:
                run_one(conn, run)  # the run in hand is finished even when stopping
                if stopping:
                    break
            if not runs:
                # Wake on a notification, or after 2 seconds (one can be missed).
                if listener is None:
                    time.sleep(2)
                else:
                    for _ in listener.notifies(timeout=2, stop_after=1):
                        pass
        if listener is not None and listener is not conn:
            listener.close()
    print(f"{WORKER}: stopped", flush=True)


if __name__ == "__main__":
    main()

"""``python -m workers [--until-idle]``: the real Huey consumer, one worker thread.

Signals: SIGTERM is the *graceful* stop (Huey's ``graceful_signal='TERM'``,
the same as ``huey_consumer -g TERM``), because it is what supervisord and
systemd send by default: the running job finishes its batch or abandons it
between batches (nothing is half-written; the swap is one transaction), then
the process exits well within ``stopwaitsecs``. SIGINT stops at once; an
interrupted job simply leaves its outbox row for the next start.

On start the queue is flushed and every ``queued`` mark cleared: the outbox is
the truth, so the startup sweep re-enqueues exactly one job per pending item.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

import structlog

from rinwa_index import outbox
from rinwa_index.db import connect
from rinwa_index.errors import RinwaError
from rinwa_index.lock import take_worker_lock
from rinwa_index.logs import configure_logging

from .app import CONFIG, STOP, enqueue_sweep, huey
from .jobs import WorkerState, is_idle

log = structlog.get_logger("rinwa_index.worker")

SWEEP_INTERVAL_S = 2.0
WAKE_POLL_S = 0.2


def sweeper(state: WorkerState, stop: threading.Event, until_idle: bool) -> None:
    """Sweep every couple of seconds, at once when the wake file is touched."""
    seen, last, idle_rounds = _mtime(), 0.0, 0
    while not stop.is_set():
        mtime = _mtime()
        if mtime != seen or time.monotonic() - last >= SWEEP_INTERVAL_S:
            seen, last = mtime, time.monotonic()
            try:
                enqueued = enqueue_sweep(state)
                idle = (
                    enqueued == 0
                    and huey.pending_count() == 0
                    and is_idle(state.conn, now=time.time())
                )
            except Exception as exc:  # never let the sweeper die; the periodic task backs it up
                log.warning("sweep.failed", error=type(exc).__name__)
                idle = False
            idle_rounds = idle_rounds + 1 if idle else 0
            if until_idle and idle_rounds >= 2:
                os.kill(os.getpid(), signal.SIGTERM)  # the graceful path
                return
        stop.wait(WAKE_POLL_S)


def _mtime() -> float:
    try:
        return CONFIG.wake_file.stat().st_mtime
    except OSError:
        return 0.0


def main(argv: list[str] | None = None) -> int:
    """Start the consumer; return its exit status."""
    parser = argparse.ArgumentParser(prog="python -m workers", description=__doc__)
    parser.add_argument("--until-idle", action="store_true", help="exit when nothing is pending")
    args = parser.parse_args(argv)
    configure_logging()
    lock = take_worker_lock(CONFIG)
    if lock is None:
        print(
            "Another worker is already running for this database (its queue is locked); "
            "stop it first, or point RINWA_DB at another database.",
            file=sys.stderr,
        )
        return 1
    try:
        conn = connect(CONFIG.db_path, busy_timeout_ms=CONFIG.busy_timeout_ms, must_exist=True)
    except RinwaError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    huey.flush()  # the outbox is the truth; stale queue rows would be duplicates
    outbox.reset_queued(conn)
    conn.close()
    consumer = huey.create_consumer(
        workers=1, worker_type="thread", graceful_signal="TERM", check_worker_health=True,
        periodic=True, flush_locks=True, max_delay=1.0,
    )  # fmt: skip
    global_stop = consumer.stop_flag
    threading.Thread(target=_link_stop, args=(global_stop,), daemon=True).start()
    sweep_state = WorkerState(CONFIG)
    thread = threading.Thread(
        target=sweeper, args=(sweep_state, global_stop, args.until_idle), daemon=True,
        name="sweeper",
    )  # fmt: skip
    thread.start()
    consumer.run()
    return 0


def _link_stop(flag: threading.Event) -> None:
    """Mirror the consumer's stop flag into the jobs' ``STOP`` event."""
    flag.wait()
    STOP.set()


if __name__ == "__main__":
    sys.exit(main())

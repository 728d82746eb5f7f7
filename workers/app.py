"""The Huey application the consumer runs: the queue and the task declarations.

Run it with ``python -m workers`` (what ``rinwa-index worker`` and
supervisord start). Configuration comes from ``RINWA_*`` variables: this is
an entry point. Results are off: tasks report through logs and the outbox.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from huey import SqliteHuey, crontab

from rinwa_index.config import Config

from .jobs import (
    ThreadStates,
    WorkerState,
    group_by_priority,
    release_all,
    run_group,
    sweep,
)

CONFIG = Config.from_env(os.environ)

huey = SqliteHuey(
    "rinwa-index",
    filename=str(CONFIG.queue_file),
    results=False,
    utc=True,
    timeout=CONFIG.busy_timeout_ms / 1000,
)

#: Set by ``workers.__main__`` to the consumer's stop flag, so a job can
#: abandon its batch when a stop signal arrives.
STOP = threading.Event()


def _fault_swap_delay() -> Callable[[int], None] | None:
    """Fault injection for the restart tests; never set in production.

    ``RINWA_FAULT_SWAP_DELAY_S`` holds each swap transaction open that long, and
    ``RINWA_FAULT_SWAP_MARK`` names a file touched on entering it, so a test can
    SIGKILL the worker exactly inside the transaction.
    """
    delay = float(os.environ.get("RINWA_FAULT_SWAP_DELAY_S") or 0)
    mark = os.environ.get("RINWA_FAULT_SWAP_MARK")
    if delay <= 0:
        return None

    def hold(_item_id: int) -> None:
        if mark:
            Path(mark).touch()
        time.sleep(delay)

    return hold


states = ThreadStates(
    lambda: WorkerState(CONFIG, should_stop=STOP.is_set, in_swap=_fault_swap_delay())
)


@huey.on_startup()
def open_resources() -> None:
    """The worker opens its connection and, with dense on, its model once, at start."""
    states.get().warm()


@huey.task()
def index_items(item_ids: list[int]) -> None:
    """Make a few items current, sharing embedding batches (or record why not)."""
    state = states.get()
    ids = [int(i) for i in item_ids]
    try:
        run_group(state, ids)
    except Exception:
        # Even recording the outcome failed (say, the disk is full): give the rows
        # back to the sweep so they are not left marked as queued.
        release_all(state, ids)
        raise


@huey.periodic_task(crontab(minute="*"))
def periodic_sweep() -> None:
    """Once a minute, even if the sweeper thread is stuck: enqueue due and stale items."""
    enqueue_sweep(states.get())


def enqueue_sweep(state: WorkerState) -> int:
    """Run a sweep and put each claimed item on the queue; return how many."""
    depth = huey.pending_count() * state.config.job_items
    result = sweep(state.conn, state.config, queue_depth=depth, now=state.now())
    for item_ids, priority in group_by_priority(result.enqueued, state.config.job_items):
        index_items(item_ids, priority=priority)
    return len(result.enqueued)

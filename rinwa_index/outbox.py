"""The outbox: durable "item N needs work" rows, and the sweep that turns them into jobs.

The host writes a row inside its own transaction (:func:`record_item_changed`),
so the request commits or rolls back with the item. Only the swap that makes
the item current deletes the row, and only if no newer change arrived
meanwhile (``seq``). Huey deletes a task when it starts it, so the queue is a
hint, never the truth: ``queued`` marks rows with a pending job (at most one
per item); a worker start clears every mark and sweeps again.

Row life: due → claimed (``queued=1``) → deleted by the swap, or released
(``queued=0``, re-claimed at once), parked (backoff with jitter after a
transient failure, ``attempts`` and ``last_error`` kept) or failed
(``failed=1``, permanent, left alone until ``retry-failed``).
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass

from .config import Config
from .db import atomic
from .source import SOURCE_KEY_SQL

#: Host changes go before the backfill and signature reconciliation.
PRIORITY_CHANGE = 10
PRIORITY_BACKFILL = 0

_UPSERT = """
INSERT INTO index_outbox (item_id, op, seq, priority, requested_at, next_attempt_at)
VALUES (?, ?, 1, ?, ?, 0)
ON CONFLICT(item_id) DO UPDATE SET
    op = excluded.op, seq = seq + 1, requested_at = excluded.requested_at,
    priority = MAX(priority, excluded.priority), attempts = 0, next_attempt_at = 0,
    last_error = NULL, failed = 0
"""


def record_item_changed(
    conn: sqlite3.Connection, item_id: int, *, now: float | None = None
) -> None:
    """Record that ``item_id`` changed, inside the caller's transaction (no commit)."""
    conn.execute(_UPSERT, (int(item_id), "changed", PRIORITY_CHANGE, now or time.time()))


def record_item_deleted(
    conn: sqlite3.Connection, item_id: int, *, now: float | None = None
) -> None:
    """Record that ``item_id`` was deleted, inside the caller's transaction (no commit)."""
    conn.execute(_UPSERT, (int(item_id), "deleted", PRIORITY_CHANGE, now or time.time()))


def wake_worker(config: Config) -> None:
    """Best effort: touch the wake file so a running worker sweeps now, not in a minute."""
    with contextlib.suppress(OSError):  # the periodic sweep still finds the row
        config.wake_file.touch()


def claim_due(conn: sqlite3.Connection, *, limit: int, now: float) -> list[tuple[int, int]]:
    """Mark up to ``limit`` due rows as queued; return their ``(item_id, priority)``."""
    with atomic(conn):
        rows = conn.execute(
            """SELECT item_id, priority FROM index_outbox
               WHERE failed = 0 AND queued = 0 AND next_attempt_at <= ?
               ORDER BY priority DESC, requested_at, item_id LIMIT ?""",
            (now, limit),
        ).fetchall()
        conn.executemany(
            "UPDATE index_outbox SET queued = 1, queued_at = ? WHERE item_id = ?",
            [(now, r[0]) for r in rows],
        )
    return [(int(r[0]), int(r[1])) for r in rows]


def reconcile(
    conn: sqlite3.Connection, signature: str, dense: bool, *, limit: int, now: float
) -> int:
    """Add outbox rows for up to ``limit`` items that are not current; return how many.

    An item is current when its ``item_index_state`` matches the selector's
    source, the active signature and (dense on) has vectors. Items that vanished
    without a recorded delete (a view-backed host) get a ``deleted`` row.
    """
    with atomic(conn):
        stale = conn.execute(
            f"""SELECT i.id FROM items i
                LEFT JOIN item_index_state s ON s.item_id = i.id
                WHERE NOT EXISTS (SELECT 1 FROM index_outbox o WHERE o.item_id = i.id)
                  AND (s.item_id IS NULL OR s.signature != ? OR (? AND s.dense = 0)
                       OR s.source_kind || ':' || s.source_hash != {SOURCE_KEY_SQL})
                ORDER BY i.id LIMIT ?""",
            (signature, int(dense), limit),
        ).fetchall()
        gone = conn.execute(
            """SELECT s.item_id FROM item_index_state s
               WHERE NOT EXISTS (SELECT 1 FROM items i WHERE i.id = s.item_id)
                 AND NOT EXISTS (SELECT 1 FROM index_outbox o WHERE o.item_id = s.item_id)
               LIMIT ?""",
            (limit,),
        ).fetchall()
        conn.executemany(_UPSERT, [(r[0], "changed", PRIORITY_BACKFILL, now) for r in stale])
        conn.executemany(_UPSERT, [(r[0], "deleted", PRIORITY_BACKFILL, now) for r in gone])
    return len(stale) + len(gone)


def outbox_seq(conn: sqlite3.Connection, item_id: int) -> int | None:
    """The row's change counter, or None when the item has no outbox row."""
    row = conn.execute("SELECT seq FROM index_outbox WHERE item_id = ?", (item_id,)).fetchone()
    return None if row is None else int(row[0])


def complete(conn: sqlite3.Connection, item_id: int, seq: int | None) -> bool:
    """Inside the swap: delete the row unless a newer change arrived; else release it."""
    if seq is not None:
        deleted = conn.execute(
            "DELETE FROM index_outbox WHERE item_id = ? AND seq = ?", (item_id, seq)
        ).rowcount
        if deleted:
            return True
    conn.execute("UPDATE index_outbox SET queued = 0 WHERE item_id = ?", (item_id,))
    return False


def release(conn: sqlite3.Connection, item_id: int, *, now: float) -> None:
    """Give the row back to the sweep, due now (something changed under the job)."""
    with atomic(conn):
        conn.execute(
            """INSERT INTO index_outbox (item_id, requested_at) VALUES (?, ?)
               ON CONFLICT(item_id) DO UPDATE SET queued = 0, next_attempt_at = 0""",
            (item_id, now),
        )


def backoff_delay(attempts: int, config: Config, rng: Callable[[], float]) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2**attempts)]."""
    ceiling = min(config.backoff_cap_s, config.backoff_base_s * 2 ** min(attempts, 30))
    return max(1.0, ceiling * rng())


def park(
    conn: sqlite3.Connection,
    item_id: int,
    error_class: str,
    config: Config,
    *,
    now: float,
    rng: Callable[[], float] = random.random,
) -> float:
    """After retries ran out: count the attempt, set the next time, keep the error class."""
    with atomic(conn):
        row = conn.execute(
            "SELECT attempts FROM index_outbox WHERE item_id = ?", (item_id,)
        ).fetchone()
        attempts = (int(row[0]) if row else 0) + 1
        due = now + backoff_delay(attempts, config, rng)
        conn.execute(
            """INSERT INTO index_outbox
                 (item_id, requested_at, attempts, next_attempt_at, last_error)
               VALUES (?, ?, ?, ?, ?)
               ON CONFLICT(item_id) DO UPDATE SET attempts = excluded.attempts, queued = 0,
                 next_attempt_at = excluded.next_attempt_at, last_error = excluded.last_error""",
            (item_id, now, attempts, due, error_class),
        )
    return due


def fail(conn: sqlite3.Connection, item_id: int, error_class: str, *, now: float) -> None:
    """A permanent failure (bad input): recorded and left alone, never looped."""
    with atomic(conn):
        conn.execute(
            """INSERT INTO index_outbox (item_id, requested_at, failed, last_error, attempts)
               VALUES (?, ?, 1, ?, 1)
               ON CONFLICT(item_id) DO UPDATE SET failed = 1, queued = 0,
                 attempts = attempts + 1, last_error = excluded.last_error""",
            (item_id, now, error_class),
        )


def force_reindex(
    conn: sqlite3.Connection, item_ids: list[int] | None, *, now: float | None = None
) -> int:
    """Forget what items were indexed from, so the worker rebuilds them.

    Named items get a host-priority outbox row; ``None`` means every item, left
    to the sweep's throttled backfill. Current rows stay searchable until their
    replacement commits.
    """
    with atomic(conn):
        if item_ids is None:
            conn.execute("DELETE FROM item_index_state")
            return int(conn.execute("SELECT COUNT(*) FROM items").fetchone()[0])
        for item_id in item_ids:
            conn.execute("DELETE FROM item_index_state WHERE item_id = ?", (item_id,))
            record_item_changed(conn, item_id, now=now)
        return len(item_ids)


def retry_failed(conn: sqlite3.Connection) -> int:
    """Make every failed or parked row due again; return how many."""
    with atomic(conn):
        return conn.execute(
            """UPDATE index_outbox SET failed = 0, attempts = 0, next_attempt_at = 0, queued = 0
               WHERE failed = 1 OR attempts > 0"""
        ).rowcount


def reset_queued(conn: sqlite3.Connection, *, older_than: float | None = None) -> int:
    """Clear queued marks (all at worker start, or those older than a time)."""
    with atomic(conn):
        if older_than is None:
            return conn.execute("UPDATE index_outbox SET queued = 0 WHERE queued = 1").rowcount
        return conn.execute(
            "UPDATE index_outbox SET queued = 0 WHERE queued = 1 AND queued_at < ?",
            (older_than,),
        ).rowcount


@dataclass(frozen=True)
class OutboxCounts:
    """Outbox rows by state, for ``status``."""

    pending: int
    queued: int
    parked: int
    failed: int
    errors: dict[str, int]


def counts(conn: sqlite3.Connection, *, now: float) -> OutboxCounts:
    """How many items wait, are queued, parked for a retry, or failed (by error class)."""
    row = conn.execute(
        """SELECT COUNT(*) FILTER (WHERE failed = 0),
                  COUNT(*) FILTER (WHERE failed = 0 AND queued = 1),
                  COUNT(*) FILTER (WHERE failed = 0 AND next_attempt_at > ?),
                  COUNT(*) FILTER (WHERE failed = 1)
           FROM index_outbox""",
        (now,),
    ).fetchone()
    errors = dict(
        conn.execute(
            """SELECT last_error, COUNT(*) FROM index_outbox
               WHERE last_error IS NOT NULL GROUP BY last_error"""
        ).fetchall()
    )
    return OutboxCounts(int(row[0]), int(row[1]), int(row[2]), int(row[3]), errors)

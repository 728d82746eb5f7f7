"""What the consumer does, independent of Huey: per-thread state, one job, the sweep.

Kept apart from ``app.py`` (the Huey instance and task declarations) so the
job logic can be exercised in-process with an injected clock, sleep and rng.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from rinwa_index import outbox
from rinwa_index.config import Config
from rinwa_index.db import connect
from rinwa_index.errors import (
    ChecksumMismatchError,
    ChunkingError,
    EmbeddingError,
    InputTooLongError,
    ItemError,
    ModelNotInstalledError,
    VectorError,
)
from rinwa_index.indexer import Cancelled, Indexer, IndexResult, collect_garbage
from rinwa_index.models import Manifest
from rinwa_index.settings import active_signature, get_settings

log = structlog.get_logger("rinwa_index.worker")

#: Bad input: retrying cannot help, so the failure is recorded, not looped.
PERMANENT: tuple[type[BaseException], ...] = (
    ChunkingError,
    InputTooLongError,
    EmbeddingError,
    ItemError,
    VectorError,
    UnicodeError,
)
#: Operator problems: no quick retry, park with backoff until someone fixes it.
OPERATOR: tuple[type[BaseException], ...] = (ModelNotInstalledError, ChecksumMismatchError)


def is_transient(exc: BaseException) -> bool:
    """Worth a quick retry: a locked database, an inference hiccup, an I/O error."""
    return not isinstance(exc, (*PERMANENT, *OPERATOR, Cancelled))


def retry_policy(config: Config, *, sleep: Callable[[float], None] = time.sleep) -> Retrying:
    """tenacity: full-jitter exponential backoff, bounded attempts, the original error re-raised."""
    return Retrying(
        retry=retry_if_exception(is_transient),
        wait=wait_random_exponential(multiplier=0.2, max=5),
        stop=stop_after_attempt(config.retry_attempts),
        sleep=sleep,
        reraise=True,
    )


@dataclass
class WorkerState:
    """One thread's database connection, indexer and embedding runtime."""

    config: Config
    should_stop: Callable[[], bool] = lambda: False
    now: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    rng: Callable[[], float] = random.random
    embedder_loader: Callable[[Manifest, Config], object] | None = None
    in_swap: Callable[[int], None] | None = None  # fault injection (tests only)
    conn: sqlite3.Connection = field(init=False)
    indexer: Indexer = field(init=False)
    _embedders: dict[str, object] = field(default_factory=dict)  # cache: the active model only

    def __post_init__(self) -> None:
        self.conn = connect(self.config.db_path, busy_timeout_ms=self.config.busy_timeout_ms)
        self.indexer = Indexer(
            self.conn,
            self.config,
            embedder_for=self.embedder_for,  # type: ignore[arg-type]
            should_stop=lambda: self.should_stop(),
            in_swap=self.in_swap,
        )

    def embedder_for(self, manifest: Manifest) -> object:
        """Load the model once; a model switch disposes the previous one."""
        if manifest.name not in self._embedders:
            self._dispose()
            loader = self.embedder_loader or _load_embedder
            self._embedders[manifest.name] = loader(manifest, self.config)
        return self._embedders[manifest.name]

    def warm(self) -> None:
        """At startup with dense on: load the model now, not on the first job."""
        settings = get_settings(self.conn)
        if settings.enabled:
            from rinwa_index.models import get_manifest

            try:
                self.embedder_for(get_manifest(settings.model, self.config.model_dir))
            except Exception as exc:  # the jobs will park and report it
                log.warning("model.unavailable", error=type(exc).__name__)

    def close(self) -> None:
        """Release the connection and the model."""
        self._dispose()
        self.conn.close()

    def _dispose(self) -> None:
        """Drop the loaded model (its ONNX session) before another one is loaded."""
        for embedder in self._embedders.values():
            close = getattr(embedder, "close", None)
            if close is not None:
                close()
        self._embedders.clear()


def _load_embedder(manifest: Manifest, config: Config) -> object:
    from rinwa_index import embedder

    return embedder.load(manifest.name, model_dir=config.model_dir, threads=config.intra_op_threads)


def run_job(state: WorkerState, item_id: int) -> IndexResult | None:
    """Index one item with retries; failures are recorded in the outbox, never raised."""
    try:
        for attempt in retry_policy(state.config, sleep=state.sleep):
            with attempt:
                result = state.indexer.index_item(item_id)
    except Cancelled as exc:
        outbox.release(state.conn, item_id, now=state.now())
        log.info("item.requeued", item_id=item_id, reason=_cancel_reason(exc))
        return None
    except PERMANENT as exc:
        outbox.fail(state.conn, item_id, type(exc).__name__, now=state.now())
        log.error("item.failed", item_id=item_id, error=type(exc).__name__, permanent=True)
        return None
    except Exception as exc:  # transient after retries, or an operator problem: park it
        due = outbox.park(
            state.conn, item_id, type(exc).__name__, state.config, now=state.now(), rng=state.rng
        )
        log.warning(
            "item.failed", item_id=item_id, error=type(exc).__name__, permanent=False,
            retry_in_s=round(due - state.now(), 1),
        )  # fmt: skip
        return None
    _log_result(result)
    return result


def run_group(state: WorkerState, item_ids: list[int]) -> list[IndexResult | None]:
    """Index several items with shared embedding batches (the fast path).

    Any error of the shared part sends the items through :func:`run_job` one
    by one, so a bad item is found, recorded alone, and the others still land.
    """
    if len(item_ids) == 1:
        return [run_job(state, item_ids[0])]
    try:
        outcomes = state.indexer.index_items(item_ids)
    except Cancelled as exc:
        for item_id in item_ids:
            outbox.release(state.conn, item_id, now=state.now())
        log.info("group.requeued", items=len(item_ids), reason=_cancel_reason(exc))
        return [None] * len(item_ids)
    except Exception as exc:
        log.info("group.split", items=len(item_ids), error=type(exc).__name__)
        return [run_job(state, item_id) for item_id in item_ids]
    results: list[IndexResult | None] = []
    for item_id, outcome in zip(item_ids, outcomes, strict=True):
        if isinstance(outcome, Exception):
            results.append(run_job(state, item_id))  # records the failure with the usual policy
        else:
            _log_result(outcome)
            results.append(outcome)
    return results


def release_all(state: WorkerState, item_ids: list[int]) -> None:
    """Best effort: clear the queued marks of ``item_ids`` (the sweep retries them)."""
    for item_id in item_ids:
        try:
            outbox.release(state.conn, item_id, now=state.now())
        except Exception as exc:  # the stale-mark reset in the sweep is the last resort
            log.warning("item.release_failed", item_id=item_id, error=type(exc).__name__)


def group_by_priority(claimed: list[tuple[int, int]], size: int) -> list[tuple[list[int], int]]:
    """Split claimed ``(item_id, priority)`` pairs into jobs of at most ``size`` items."""
    jobs: list[tuple[list[int], int]] = []
    for item_id, priority in claimed:
        if jobs and jobs[-1][1] == priority and len(jobs[-1][0]) < size:
            jobs[-1][0].append(item_id)
        else:
            jobs.append(([item_id], priority))
    return jobs


def _cancel_reason(exc: Cancelled) -> str:
    return "stopping" if "stopping" in str(exc) else "settings_changed"


def _log_result(result: IndexResult) -> None:
    if result.outcome == "indexed":
        log.info(
            "item.indexed", item_id=result.item_id, chunks=result.chunks,
            embedded=result.embedded, reused=result.reused, ms=result.ms,
        )  # fmt: skip
    elif result.outcome == "requeued":
        log.info("item.requeued", item_id=result.item_id, reason=result.reason)
    elif result.outcome == "deleted":
        log.info("item.deleted", item_id=result.item_id, chunks=result.chunks)
    else:
        log.info("item.skipped", item_id=result.item_id, reason=result.reason)


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did."""

    reconciled: int
    enqueued: list[tuple[int, int]]


def sweep(conn: sqlite3.Connection, config: Config, *, queue_depth: int, now: float) -> SweepResult:
    """Claim due outbox rows (host changes first) and top up the backfill, bounded.

    Reconciliation (items whose chunks are stale for the current source or
    signature, or lack vectors with dense on) only adds rows while the queue is
    short, so a backfill proceeds in bounded batches and fresh changes, which
    have a higher priority, never wait behind it.
    """
    outbox.reset_queued(conn, older_than=now - config.requeue_stale_s)
    room = max(0, config.sweep_batch - queue_depth)
    reconciled = 0
    if queue_depth < config.backfill_batch:
        settings = get_settings(conn)
        signature = active_signature(conn, config.chunk, config.model_dir)
        reconciled = outbox.reconcile(
            conn, signature.hash, settings.enabled, limit=config.backfill_batch, now=now
        )
    claimed = outbox.claim_due(conn, limit=room, now=now) if room else []
    if reconciled or claimed:
        log.info("sweep.done", reconciled=reconciled, enqueued=len(claimed), depth=queue_depth)
    collect_garbage(conn, config.cache_max_rows)
    return SweepResult(reconciled, claimed)


def is_idle(conn: sqlite3.Connection, *, now: float) -> bool:
    """No outbox row is due or queued (parked retries and failures do not count)."""
    row = conn.execute(
        "SELECT COUNT(*) FROM index_outbox"
        " WHERE failed = 0 AND (queued = 1 OR next_attempt_at <= ?)",
        (now,),
    ).fetchone()
    return int(row[0]) == 0


class ThreadStates:
    """One :class:`WorkerState` per thread (sqlite connections stay in their thread)."""

    def __init__(self, factory: Callable[[], WorkerState]) -> None:
        self._factory = factory
        self._local = threading.local()

    def get(self) -> WorkerState:
        """This thread's state, created on first use."""
        state = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = self._factory()
        return state

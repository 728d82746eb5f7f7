"""The worker's job logic in-process: retries, parking, permanent failures, the sweep."""

from __future__ import annotations

import sqlite3

import pytest

from rinwa_index import outbox
from rinwa_index.config import Config
from rinwa_index.embedder import FakeEmbedder
from rinwa_index.errors import EmbeddingError, InferenceError, InputTooLongError
from rinwa_index.models import MINILM
from rinwa_index.settings import update_settings
from workers.jobs import (
    WorkerState,
    group_by_priority,
    is_idle,
    is_transient,
    release_all,
    run_group,
    run_job,
    sweep,
)


class Flaky:
    """An embedder that fails ``failures`` times, then works."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0
        self.inner = FakeEmbedder(manifest=MINILM)

    def on_batch(self, _batch: list[str]) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error


def state_with(config: Config, flaky: Flaky, sleeps: list[float]) -> WorkerState:
    flaky.inner.on_batch = flaky.on_batch
    return WorkerState(
        config,
        sleep=sleeps.append,
        now=lambda: 1000.0,
        rng=lambda: 0.5,
        embedder_loader=lambda _m, _c: flaky.inner,
    )


@pytest.fixture
def dense_item(db: sqlite3.Connection) -> sqlite3.Connection:
    update_settings(db, enabled=True)
    db.execute("INSERT INTO items (id, content) VALUES (1, 'A note about herons and egrets.')")
    outbox.record_item_changed(db, 1)
    return db


def outbox_row(db: sqlite3.Connection) -> tuple[object, ...] | None:
    row = db.execute(
        "SELECT attempts, next_attempt_at, last_error, failed FROM index_outbox"
    ).fetchone()
    return None if row is None else tuple(row)


def test_transient_errors_are_retried_with_backoff(
    dense_item: sqlite3.Connection, config: Config
) -> None:
    sleeps: list[float] = []
    flaky = Flaky(2, RuntimeError("onnx hiccup"))
    result = run_job(state_with(config, flaky, sleeps), 1)
    assert result is not None and result.outcome == "indexed"
    assert len(sleeps) == 2 and all(0 <= s <= 5 for s in sleeps)
    assert outbox_row(dense_item) is None


def test_exhausted_retries_park_the_item(dense_item: sqlite3.Connection, config: Config) -> None:
    sleeps: list[float] = []
    flaky = Flaky(99, sqlite3.OperationalError("database is locked"))
    assert run_job(state_with(config, flaky, sleeps), 1) is None
    assert len(sleeps) == config.retry_attempts - 1
    attempts, due, error, failed = outbox_row(dense_item)  # type: ignore[misc]
    assert (attempts, error, failed) == (1, "OperationalError", 0)
    assert due == 1000.0 + config.backoff_base_s * 2 * 0.5
    assert outbox.claim_due(dense_item, limit=5, now=1000.0) == []


def test_permanent_failure_is_recorded_not_looped(
    dense_item: sqlite3.Connection, config: Config
) -> None:
    sleeps: list[float] = []
    flaky = Flaky(99, InputTooLongError("too long"))
    assert run_job(state_with(config, flaky, sleeps), 1) is None
    assert sleeps == [] and flaky.calls == 1
    assert outbox_row(dense_item)[2:] == ("InputTooLongError", 1)  # type: ignore[index]
    assert outbox.claim_due(dense_item, limit=5, now=1e12) == []
    assert is_idle(dense_item, now=1e12)


def test_classification() -> None:
    assert is_transient(sqlite3.OperationalError("database is locked"))
    assert is_transient(RuntimeError("inference"))
    assert is_transient(InferenceError("onnxruntime failed"))
    assert not is_transient(InputTooLongError("x"))
    assert not is_transient(EmbeddingError("zero vector"))


def test_sweep_enqueues_due_and_backfill_once(db: sqlite3.Connection, config: Config) -> None:
    db.executemany("INSERT INTO items (id, content) VALUES (?, 'x')", [(i,) for i in range(1, 6)])
    outbox.record_item_changed(db, 5)
    first = sweep(db, config, queue_depth=0, now=10.0)
    assert first.reconciled == 4
    assert first.enqueued[0] == (5, outbox.PRIORITY_CHANGE)
    assert {i for i, _ in first.enqueued} == {1, 2, 3, 4, 5}
    again = sweep(db, config, queue_depth=5, now=11.0)
    assert again.enqueued == [] and again.reconciled == 0


def test_sweep_is_bounded_by_queue_depth(db: sqlite3.Connection, config: Config) -> None:
    config = config.replace(sweep_batch=3, backfill_batch=2)
    db.executemany("INSERT INTO items (id, content) VALUES (?, 'x')", [(i,) for i in range(1, 11)])
    result = sweep(db, config, queue_depth=0, now=1.0)
    assert result.reconciled == 2 and len(result.enqueued) == 2
    assert sweep(db, config, queue_depth=2, now=2.0).reconciled == 0


def test_group_by_priority_keeps_order_and_bounds() -> None:
    claimed = [(1, 10), (2, 10), (3, 10), (4, 0), (5, 0)]
    assert group_by_priority(claimed, 2) == [([1, 2], 10), ([3], 10), ([4, 5], 0)]


def test_group_shares_batches_and_isolates_a_bad_item(
    db: sqlite3.Connection, config: Config
) -> None:
    update_settings(db, enabled=True)
    for item_id, text in ((1, "Herons wade."), (2, "Poison pill."), (3, "Egrets fly.")):
        db.execute("INSERT INTO items (id, content) VALUES (?, ?)", (item_id, text))
        outbox.record_item_changed(db, item_id)

    def reject(batch: list[str]) -> None:
        if any("Poison" in text for text in batch):
            raise InputTooLongError("rejected")

    embedder = FakeEmbedder(manifest=MINILM, on_batch=reject)
    state = WorkerState(config, sleep=lambda _s: None, embedder_loader=lambda _m, _c: embedder)
    results = run_group(state, [1, 2, 3])
    assert [r.outcome if r else None for r in results] == ["indexed", None, "indexed"]
    failed = db.execute("SELECT item_id, last_error FROM index_outbox WHERE failed = 1").fetchall()
    assert [tuple(r) for r in failed] == [(2, "InputTooLongError")]


def test_group_embeds_in_shared_batches(db: sqlite3.Connection, config: Config) -> None:
    update_settings(db, enabled=True)
    for item_id in range(1, 5):
        db.execute("INSERT INTO items (id, content) VALUES (?, ?)", (item_id, f"Note {item_id}."))
    embedder = FakeEmbedder(manifest=MINILM)
    state = WorkerState(config, embedder_loader=lambda _m, _c: embedder)
    results = run_group(state, [1, 2, 3, 4])
    assert all(r is not None and r.outcome == "indexed" for r in results)
    assert len(embedder.batches) == 1 and len(embedder.batches[0]) == 4


def test_switching_model_disposes_the_old_one(config: Config) -> None:
    from rinwa_index.embedder import fake_manifest

    loaded: list[FakeEmbedder] = []

    def loader(manifest: object, _config: Config) -> FakeEmbedder:
        loaded.append(FakeEmbedder(manifest=manifest))  # type: ignore[arg-type]
        return loaded[-1]

    state = WorkerState(config, embedder_loader=loader)
    first = state.embedder_for(MINILM)
    assert state.embedder_for(MINILM) is first and len(loaded) == 1
    state.embedder_for(fake_manifest(8))
    assert first.closed and len(loaded) == 2
    state.close()
    assert loaded[-1].closed


def test_release_all_clears_queued_marks(db: sqlite3.Connection, config: Config) -> None:
    for item_id in (1, 2):
        outbox.record_item_changed(db, item_id)
    outbox.claim_due(db, limit=5, now=1.0)
    state = WorkerState(config)
    release_all(state, [1, 2])
    assert db.execute("SELECT SUM(queued) FROM index_outbox").fetchone()[0] == 0

"""The outbox: host-transaction writes, claiming, parking, failing, reconciling."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from rinwa_index import outbox
from rinwa_index.config import Config
from rinwa_index.db import atomic
from rinwa_index.source import read_source

from .conftest import open_db


def add_item(db: sqlite3.Connection, item_id: int, text: str = "hello") -> None:
    db.execute("INSERT OR REPLACE INTO items (id, content) VALUES (?, ?)", (item_id, text))


def current_source(db: sqlite3.Connection, item_id: int) -> tuple[str, str]:
    """The selector's (kind, hash) for an item, as the sweep computes it."""
    chosen = read_source(db, item_id)
    assert chosen is not None
    return chosen.kind, chosen.hash


def rows(db: sqlite3.Connection) -> list[tuple[object, ...]]:
    return [
        tuple(r)
        for r in db.execute(
            "SELECT item_id, op, seq, attempts, failed, queued, last_error FROM index_outbox"
            " ORDER BY item_id"
        )
    ]


def test_change_commits_with_the_host_transaction(db: sqlite3.Connection) -> None:
    with atomic(db):
        add_item(db, 1)
        outbox.record_item_changed(db, 1)
    assert rows(db) == [(1, "changed", 1, 0, 0, 0, None)]


def test_change_rolls_back_with_the_host_transaction(db: sqlite3.Connection) -> None:
    with pytest.raises(RuntimeError), atomic(db):
        add_item(db, 1)
        outbox.record_item_changed(db, 1)
        raise RuntimeError("host failed")
    assert rows(db) == []
    assert db.execute("SELECT COUNT(*) FROM items").fetchone()[0] == 0


def test_change_is_visible_to_another_connection_only_after_commit(config: Config) -> None:
    host, worker = open_db(config.db_path), open_db(config.db_path)
    host.execute("BEGIN IMMEDIATE")
    add_item(host, 1)
    outbox.record_item_changed(host, 1)
    assert rows(worker) == []
    host.execute("COMMIT")
    assert len(rows(worker)) == 1


def test_repeated_changes_bump_seq_and_clear_failure(db: sqlite3.Connection) -> None:
    outbox.record_item_changed(db, 1)
    outbox.fail(db, 1, "ChunkingError", now=1.0)
    outbox.record_item_changed(db, 1)
    outbox.record_item_deleted(db, 1)
    assert rows(db) == [(1, "deleted", 3, 0, 0, 0, None)]


def test_claim_due_marks_queued_and_dedupes(db: sqlite3.Connection) -> None:
    for item_id in (1, 2, 3):
        outbox.record_item_changed(db, item_id, now=float(item_id))
    first = outbox.claim_due(db, limit=2, now=10.0)
    assert [item for item, _ in first] == [1, 2]
    second = outbox.claim_due(db, limit=10, now=10.0)
    assert [item for item, _ in second] == [3]
    assert outbox.claim_due(db, limit=10, now=10.0) == []


def test_host_changes_are_claimed_before_backfill(db: sqlite3.Connection, config: Config) -> None:
    for item_id in (1, 2):
        add_item(db, item_id)
    assert outbox.reconcile(db, "sig", False, limit=10, now=1.0) == 2
    outbox.record_item_changed(db, 3, now=5.0)
    claimed = outbox.claim_due(db, limit=10, now=10.0)
    assert claimed[0] == (3, outbox.PRIORITY_CHANGE)
    assert {item for item, p in claimed[1:]} == {1, 2}


def test_complete_deletes_only_the_seq_it_saw(db: sqlite3.Connection) -> None:
    outbox.record_item_changed(db, 1)
    seen = outbox.outbox_seq(db, 1)
    outbox.record_item_changed(db, 1)  # a newer change arrives during the job
    assert outbox.complete(db, 1, seen) is False
    assert rows(db)[0][2] == 2
    assert outbox.complete(db, 1, outbox.outbox_seq(db, 1)) is True
    assert rows(db) == []


def test_park_backs_off_with_jitter_and_keeps_the_error(
    db: sqlite3.Connection, config: Config
) -> None:
    outbox.record_item_changed(db, 1)
    outbox.claim_due(db, limit=1, now=0.0)
    due1 = outbox.park(db, 1, "OperationalError", config, now=100.0, rng=lambda: 1.0)
    due2 = outbox.park(db, 1, "OperationalError", config, now=100.0, rng=lambda: 1.0)
    due_low = outbox.park(db, 1, "OperationalError", config, now=100.0, rng=lambda: 0.0)
    assert due1 == 100.0 + config.backoff_base_s * 2
    assert due2 == 100.0 + config.backoff_base_s * 4
    assert due_low == 101.0  # full jitter, floored at one second
    assert rows(db) == [(1, "changed", 1, 3, 0, 0, "OperationalError")]
    assert outbox.claim_due(db, limit=1, now=100.5) == []
    assert outbox.claim_due(db, limit=1, now=101.0) == [(1, outbox.PRIORITY_CHANGE)]


def test_backoff_is_capped(config: Config) -> None:
    assert outbox.backoff_delay(40, config, lambda: 1.0) == config.backoff_cap_s


def test_failed_rows_are_not_claimed_until_retry_failed(db: sqlite3.Connection) -> None:
    outbox.record_item_changed(db, 1)
    outbox.fail(db, 1, "ChunkingError", now=1.0)
    assert outbox.claim_due(db, limit=5, now=1e12) == []
    counts = outbox.counts(db, now=2.0)
    assert (counts.failed, counts.errors) == (1, {"ChunkingError": 1})
    assert outbox.retry_failed(db) == 1
    assert outbox.claim_due(db, limit=5, now=3.0) == [(1, outbox.PRIORITY_CHANGE)]


def test_reconcile_finds_stale_and_vanished_items(db: sqlite3.Connection) -> None:
    add_item(db, 1, "one")
    add_item(db, 2, "two")
    add_item(db, 3, "three")
    kind, digest = current_source(db, 1)
    state = "INSERT INTO item_index_state VALUES (?, ?, ?, ?, ?, 1, 0)"
    db.execute(state, (1, kind, digest, "sig", 1))  # current
    db.execute(state, (2, kind, digest, "sig", 1))  # source changed since
    db.execute("PRAGMA foreign_keys = OFF")
    db.execute(state, (9, kind, digest, "sig", 1))  # item vanished without a delete record
    db.execute("PRAGMA foreign_keys = ON")
    assert outbox.reconcile(db, "sig", True, limit=10, now=1.0) == 3
    assert [(r[0], r[1]) for r in rows(db)] == [(2, "changed"), (3, "changed"), (9, "deleted")]
    # a second sweep adds nothing: at most one row per item
    assert outbox.reconcile(db, "sig", True, limit=10, now=2.0) == 0


def test_reconcile_sees_signature_and_dense_changes(db: sqlite3.Connection) -> None:
    add_item(db, 1, "one")
    kind, digest = current_source(db, 1)
    db.execute("INSERT INTO item_index_state VALUES (1, ?, ?, 'sig', 0, 1, 0)", (kind, digest))
    assert outbox.reconcile(db, "sig", False, limit=10, now=1.0) == 0
    assert outbox.reconcile(db, "other", False, limit=10, now=1.0) == 1
    db.execute("DELETE FROM index_outbox")
    assert outbox.reconcile(db, "sig", True, limit=10, now=1.0) == 1


def test_reset_queued_clears_marks(db: sqlite3.Connection) -> None:
    outbox.record_item_changed(db, 1)
    outbox.claim_due(db, limit=1, now=5.0)
    assert outbox.reset_queued(db, older_than=1.0) == 0
    assert outbox.reset_queued(db, older_than=10.0) == 1


def test_wake_worker_touches_the_wake_file(tmp_path: Path) -> None:
    config = Config(db_path=tmp_path / "x.db")
    outbox.wake_worker(config)
    assert config.wake_file.exists()
    outbox.wake_worker(Config(db_path=tmp_path / "missing-dir" / "x.db"))  # best effort


def test_force_reindex_named_and_all(db: sqlite3.Connection) -> None:
    add_item(db, 1)
    add_item(db, 2)
    db.execute("INSERT INTO item_index_state VALUES (1, 'feed', 'h', 'sig', 0, 1, 0)")
    db.execute("INSERT INTO item_index_state VALUES (2, 'feed', 'h', 'sig', 0, 1, 0)")
    assert outbox.force_reindex(db, [1]) == 1
    assert [r[0] for r in rows(db)] == [1]
    assert db.execute("SELECT item_id FROM item_index_state").fetchall()[0][0] == 2
    assert outbox.force_reindex(db, None) == 2
    assert db.execute("SELECT COUNT(*) FROM item_index_state").fetchone()[0] == 0


def test_index_item_changed_and_deleted(config: Config) -> None:
    from rinwa_index import Index

    with Index(config, dense_warmup=False) as index:
        index.conn.execute("INSERT INTO items (id, content) VALUES (5, 'x')")
        index.item_changed(5)
        assert rows(index.conn) == [(5, "changed", 1, 0, 0, 0, None)]
        index.item_deleted(5)
        assert rows(index.conn)[0][1:3] == ("deleted", 2)
    assert config.wake_file.exists()

"""One item job: chunk, reuse, embed outside the transaction, recheck, swap."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import numpy as np
import pytest

from rinwa_index import codec, outbox
from rinwa_index.config import ChunkParams, Config
from rinwa_index.embedder import FakeEmbedder
from rinwa_index.errors import ModelError, RinwaError
from rinwa_index.indexer import Cancelled, Indexer, collect_garbage, index_item
from rinwa_index.models import MINILM
from rinwa_index.settings import active_signature, update_settings

from .conftest import open_db

PARAGRAPHS = [
    f"Paragraph {n} talks about topic {n} with several words of content. "
    f"It has a second sentence about subject {n * 7} so the chunk has some body."
    for n in range(40)
]
LONG_TEXT = "\n\n".join(PARAGRAPHS)


def put(db: sqlite3.Connection, item_id: int, text: str) -> None:
    db.execute(
        "INSERT INTO items (id, content) VALUES (?, ?)"
        " ON CONFLICT(id) DO UPDATE SET content = excluded.content",
        (item_id, text),
    )
    outbox.record_item_changed(db, item_id)


def fake(on_batch: Callable[[list[str]], None] | None = None) -> FakeEmbedder:
    return FakeEmbedder(manifest=MINILM, on_batch=on_batch)


def small_chunks(config: Config) -> Config:
    return config.replace(chunk=ChunkParams(target=40, minimum=8, maximum=64, overlap=0))


def chunk_rows(db: sqlite3.Connection, item_id: int) -> list[sqlite3.Row]:
    return db.execute(
        "SELECT * FROM item_chunks WHERE item_id = ? ORDER BY ord", (item_id,)
    ).fetchall()


def fts_consistent(db: sqlite3.Connection) -> bool:
    chunk_ids = {r[0] for r in db.execute("SELECT id FROM item_chunks")}
    fts_ids = {r[0] for r in db.execute("SELECT rowid FROM chunks_fts")}
    return chunk_ids == fts_ids


def test_dense_off_writes_chunks_and_fts_without_vectors(
    db: sqlite3.Connection, config: Config
) -> None:
    put(db, 1, LONG_TEXT)
    result = index_item(db, 1, config=config)
    assert result.outcome == "indexed" and result.chunks > 1 and result.embedded == 0
    rows = chunk_rows(db, 1)
    assert all(r["embedding"] is None and r["dim"] == 0 for r in rows)
    assert fts_consistent(db)
    assert db.execute("SELECT COUNT(*) FROM index_outbox").fetchone()[0] == 0
    hits = db.execute("SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH 'subject'").fetchall()
    assert hits


def test_dense_on_stores_valid_vectors_and_cache(db: sqlite3.Connection, config: Config) -> None:
    update_settings(db, enabled=True)
    put(db, 1, LONG_TEXT)
    result = index_item(db, 1, config=config, embedder=fake())
    signature = active_signature(db, config.chunk).hash
    rows = chunk_rows(db, 1)
    assert result.embedded == len(rows) > 1
    for row in rows:
        vector = codec.decode(row["embedding"], row["dim"])
        assert row["index_signature"] == signature and abs(np.linalg.norm(vector) - 1) < 1e-5
    cached = db.execute("SELECT COUNT(*) FROM embedding_cache").fetchone()[0]
    assert cached == len({r["text_hash"] for r in rows})


def test_citation_offsets_match_the_source(db: sqlite3.Connection, config: Config) -> None:
    put(db, 1, "# Title\n\n" + LONG_TEXT)
    index_item(db, 1, config=small_chunks(config))
    for row in chunk_rows(db, 1):
        assert ("# Title\n\n" + LONG_TEXT)[row["char_start"] : row["char_end"]] == row["text"]


def test_editing_one_paragraph_embeds_only_changed_chunks(
    db: sqlite3.Connection, config: Config
) -> None:
    config = small_chunks(config)
    update_settings(db, enabled=True)
    put(db, 1, LONG_TEXT)
    first = index_item(db, 1, config=config, embedder=fake())
    assert first.chunks >= 40
    edited = PARAGRAPHS.copy()
    edited[17] = "This paragraph was rewritten by the editor with entirely new words."
    put(db, 1, "\n\n".join(edited))
    second = index_item(db, 1, config=config, embedder=fake())
    assert second.outcome == "indexed"
    assert second.embedded <= 2 and second.reused >= second.chunks - 2


def test_unchanged_item_is_skipped(db: sqlite3.Connection, config: Config) -> None:
    put(db, 1, LONG_TEXT)
    index_item(db, 1, config=config)
    outbox.record_item_changed(db, 1)  # a title-only change, say
    result = index_item(db, 1, config=config)
    assert result.outcome == "skipped"
    assert db.execute("SELECT COUNT(*) FROM index_outbox").fetchone()[0] == 0


def test_edit_during_embedding_is_discarded_and_requeued(
    db: sqlite3.Connection, config: Config
) -> None:
    update_settings(db, enabled=True)
    put(db, 1, "The original text about rivers and mountains.")
    host = open_db(config.db_path)

    def edit(_batch: list[str]) -> None:
        put(host, 1, "The edited text about deserts and oceans.")

    result = index_item(db, 1, config=config, embedder=fake(edit))
    assert result.outcome == "requeued"
    assert chunk_rows(db, 1) == []
    assert db.execute("SELECT queued FROM index_outbox WHERE item_id = 1").fetchone()[0] == 0
    final = index_item(db, 1, config=config, embedder=fake())
    assert final.outcome == "indexed"
    assert "deserts" in chunk_rows(db, 1)[0]["text"]


def test_previous_index_stays_visible_until_commit(db: sqlite3.Connection, config: Config) -> None:
    """A slow re-index (here: dense search just enabled) keeps the old passages searchable."""
    from rinwa_index.search import search

    put(db, 1, "Old passage about lighthouses.")
    index_item(db, 1, config=config)
    old_key = chunk_rows(db, 1)[0]["chunk_key"]
    update_settings(db, enabled=True)
    outbox.record_item_changed(db, 1)
    reader = open_db(config.db_path)
    seen: list[str] = []

    def look(_batch: list[str]) -> None:  # a search while the re-index is under way
        seen.extend(p.chunk_key for p in search(reader, "lighthouses", mode="sparse").passages)

    index_item(db, 1, config=config, embedder=fake(look))
    assert seen == [old_key]
    assert chunk_rows(db, 1)[0]["embedding"] is not None


def test_failed_inference_leaves_previous_rows(db: sqlite3.Connection, config: Config) -> None:
    from rinwa_index.search import search

    put(db, 1, "Old passage about lighthouses.")
    index_item(db, 1, config=config)
    before = [tuple(r) for r in chunk_rows(db, 1)]
    update_settings(db, enabled=True)
    outbox.record_item_changed(db, 1)

    def boom(_batch: list[str]) -> None:
        raise RuntimeError("inference failed")

    with pytest.raises(RuntimeError):
        index_item(db, 1, config=config, embedder=fake(boom))
    assert [tuple(r) for r in chunk_rows(db, 1)] == before
    assert fts_consistent(db)
    assert db.execute("SELECT COUNT(*) FROM index_outbox").fetchone()[0] == 1
    found = search(db, "lighthouses", mode="sparse").passages
    assert [p.text for p in found] == ["Old passage about lighthouses."]


def test_stale_rows_are_not_served_while_an_edit_waits(
    db: sqlite3.Connection, config: Config
) -> None:
    from rinwa_index.search import search

    put(db, 1, "Old passage about lighthouses.")
    index_item(db, 1, config=config)
    put(db, 1, "New passage about windmills.")  # recorded, not yet indexed
    assert search(db, "lighthouses", mode="sparse").passages == []


def test_disabling_mid_embedding_cancels(db: sqlite3.Connection, config: Config) -> None:
    config = small_chunks(config)
    update_settings(db, enabled=True)
    put(db, 1, LONG_TEXT)
    operator = open_db(config.db_path)
    calls: list[int] = []

    def disable_after_first(_batch: list[str]) -> None:
        calls.append(1)
        update_settings(operator, enabled=False)

    embedder = FakeEmbedder(manifest=MINILM, on_batch=disable_after_first)
    indexer = Indexer(db, config.replace(embed_batch_size=4), embedder_for=lambda _m: embedder)
    with pytest.raises(Cancelled, match="settings changed"):
        indexer.index_item(1)
    assert len(calls) == 1 and chunk_rows(db, 1) == []


def test_stop_request_cancels_between_batches(db: sqlite3.Connection, config: Config) -> None:
    update_settings(db, enabled=True)
    put(db, 1, LONG_TEXT)
    indexer = Indexer(db, config, embedder_for=lambda _m: fake(), should_stop=lambda: True)
    with pytest.raises(Cancelled, match="stopping"):
        indexer.index_item(1)
    assert db.execute("SELECT COUNT(*) FROM index_outbox").fetchone()[0] == 1


def test_newer_change_keeps_the_outbox_row(db: sqlite3.Connection, config: Config) -> None:
    update_settings(db, enabled=True)
    put(db, 1, "Some passage.")
    host = open_db(config.db_path)

    def touch(_batch: list[str]) -> None:
        outbox.record_item_changed(host, 1)  # same text, newer change record

    result = index_item(db, 1, config=config, embedder=fake(touch))
    assert result.outcome == "indexed"
    assert db.execute("SELECT seq, queued FROM index_outbox").fetchone()[:] == (2, 0)


def test_deleted_item_loses_chunks_fts_and_state(db: sqlite3.Connection, config: Config) -> None:
    put(db, 1, LONG_TEXT)
    index_item(db, 1, config=config)
    db.execute("PRAGMA foreign_keys = OFF")  # as with a view-backed host: no cascade
    db.execute("DELETE FROM items WHERE id = 1")
    db.execute("PRAGMA foreign_keys = ON")
    outbox.record_item_deleted(db, 1)
    result = index_item(db, 1, config=config)
    assert result.outcome == "deleted" and result.chunks > 0
    for table in ("item_chunks", "chunks_fts", "item_index_state", "index_outbox"):
        assert db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0


def test_empty_item_is_current_with_no_chunks(db: sqlite3.Connection, config: Config) -> None:
    put(db, 1, "   \n\n  ")
    assert index_item(db, 1, config=config).outcome == "indexed"
    assert chunk_rows(db, 1) == []
    outbox.record_item_changed(db, 1)
    assert index_item(db, 1, config=config).outcome == "skipped"


def test_dense_on_without_a_model_is_an_error(db: sqlite3.Connection, config: Config) -> None:
    update_settings(db, enabled=True)
    put(db, 1, "text")
    with pytest.raises(ModelError):
        index_item(db, 1, config=config)


def test_switching_back_reuses_the_cache(db: sqlite3.Connection, config: Config) -> None:
    update_settings(db, enabled=True)
    put(db, 1, LONG_TEXT)
    first = index_item(db, 1, config=config, embedder=fake())
    other = config.replace(chunk=ChunkParams(target=60, minimum=8, maximum=128, overlap=0))
    assert index_item(db, 1, config=other, embedder=fake()).embedded > 0
    back = index_item(db, 1, config=config, embedder=fake())
    assert back.outcome == "indexed" and back.embedded == 0 and back.reused == first.chunks


def test_cache_garbage_collection_keeps_the_newest(db: sqlite3.Connection) -> None:
    blob = codec.encode(np.ones(2, dtype=np.float32), 2)
    db.executemany(
        "INSERT INTO embedding_cache VALUES (?, 's', ?, 2, '', ?)",
        [(f"h{i}", blob, float(i)) for i in range(10)],
    )
    assert collect_garbage(db, 4) == 6
    kept = [r[0] for r in db.execute("SELECT text_hash FROM embedding_cache ORDER BY text_hash")]
    assert kept == ["h6", "h7", "h8", "h9"]


def test_invalid_utf8_from_the_host_is_indexed_not_fatal(
    db: sqlite3.Connection, config: Config
) -> None:
    from rinwa_index.search import search

    db.execute(
        "INSERT INTO items (id, content) VALUES (1, CAST(x'48656c6c6fff206865726f6e73' AS TEXT))"
    )  # "Hello\xff herons": not UTF-8
    outbox.record_item_changed(db, 1)
    assert index_item(db, 1, config=config).outcome == "indexed"
    assert "\ufffd" in chunk_rows(db, 1)[0]["text"]
    assert [p.item_id for p in search(db, "herons", mode="sparse").passages] == [1]
    assert outbox.reconcile(db, active_signature(db, config.chunk).hash, False, limit=5, now=1) == 0


HOSTILE = [
    "",
    " \n\t ",
    "\x00\x01\x02 nul and control \x1b[31m characters \x7f",
    "x" * 1_000_000,
    "👩‍👩‍👧‍👦 family " * 2000,
    "مرحبا بالعالم، هذا نص عربي من اليمين إلى اليسار. " * 200,
    "混合 Chinese 和 English 的文本。" * 500,
    "# only a heading",
    "\n\n\n".join(["word"] * 20000),
    "SELECT * FROM items; DROP TABLE items; -- ' \" NEAR( AND OR NOT *",
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_text_is_indexed_or_recorded_never_half_written(
    db: sqlite3.Connection, config: Config, text: str
) -> None:
    update_settings(db, enabled=True)
    put(db, 1, text)
    try:
        result = index_item(db, 1, config=config, embedder=fake())
    except RinwaError:  # a typed, recordable error is acceptable; nothing may be written
        assert chunk_rows(db, 1) == []
        return
    assert result.outcome == "indexed"
    rows = chunk_rows(db, 1)
    assert all(text[r["char_start"] : r["char_end"]] == r["text"] for r in rows)
    assert all(r["token_count"] <= MINILM.max_tokens and r["embedding"] for r in rows)
    assert fts_consistent(db)
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'items'").fetchone()

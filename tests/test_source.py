"""The canonical source selector."""

from __future__ import annotations

import sqlite3

from rinwa_index.source import read_source, select_source, text_hash


def put(
    db: sqlite3.Connection, content: str, source: str = "", c_hash: str = "", s_hash: str = ""
) -> None:
    db.execute(
        "INSERT OR REPLACE INTO items (id, content, content_hash, source_content, source_content_hash)"
        " VALUES (1, ?, ?, ?, ?)",
        (content, c_hash, source, s_hash),
    )


def test_feed_to_extracted_transition_changes_kind_and_hash(db: sqlite3.Connection) -> None:
    put(db, "feed body", c_hash="h-feed")
    feed = read_source(db, 1)
    put(db, "feed body", "full article body", c_hash="h-feed", s_hash="h-ext")
    extracted = read_source(db, 1)
    assert feed is not None and extracted is not None
    assert (feed.kind, feed.text, feed.hash) == ("feed", "feed body", "h-feed")
    assert (extracted.kind, extracted.text, extracted.hash) == (
        "extracted",
        "full article body",
        "h-ext",
    )


def test_whitespace_only_source_content_falls_back_to_feed() -> None:
    chosen = select_source(1, "feed body", "h", " \n\t ", "hs")
    assert (chosen.kind, chosen.text, chosen.hash) == ("feed", "feed body", "h")


def test_empty_host_hash_is_computed() -> None:
    chosen = select_source(1, "feed body", "", None, None)
    assert chosen.hash == text_hash("feed body")
    extracted = select_source(1, "", "", "article", "")
    assert extracted.hash == text_hash("article")


def test_missing_item_is_none(db: sqlite3.Connection) -> None:
    assert read_source(db, 404) is None


def test_null_and_blob_columns_do_not_crash(db: sqlite3.Connection) -> None:
    db.execute(
        "INSERT INTO items (id, content, source_content) VALUES (2, ?, ?)", (b"\xff\xfebin", "  ")
    )
    chosen = read_source(db, 2)
    assert chosen is not None and chosen.kind == "feed" and "bin" in chosen.text


def test_lone_surrogate_text_hashes() -> None:
    assert len(text_hash("a\ud800b")) == 64


def test_sql_selector_agrees_with_python(db: sqlite3.Connection) -> None:
    put(db, "feed", " \u3000 ", c_hash="")
    key = db.execute("SELECT rinwa_source_key(content, content_hash, source_content,"
                     " source_content_hash) FROM items WHERE id = 1").fetchone()[0]  # fmt: skip
    chosen = read_source(db, 1)
    assert (
        chosen is not None and key == f"{chosen.kind}:{chosen.hash}" == f"feed:{text_hash('feed')}"
    )

"""Schema and connections: migrations, pragmas, cascades, rollback."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from rinwa_index import db as dbmod
from rinwa_index.errors import DatabaseError, MigrationError

from .conftest import open_db

TABLES = {
    "items",
    "item_chunks",
    "chunks_fts",
    "embedding_cache",
    "index_outbox",
    "embedding_settings",
    "index_signatures",
    "rinwa_schema_version",
    "item_index_state",
}


def table_names(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def dump(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
    return [
        tuple(r) for r in conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name")
    ]


def add_chunk(conn: sqlite3.Connection, item_id: int, ord_: int, key: str) -> int:
    cur = conn.execute(
        "INSERT INTO item_chunks (chunk_key, item_id, ord, text, created_at) VALUES (?, ?, ?, ?, '')",
        (key, item_id, ord_, f"chunk {key}"),
    )
    conn.execute("INSERT INTO chunks_fts (rowid, body) VALUES (?, ?)", (cur.lastrowid, key))
    return int(cur.lastrowid or 0)


def test_blank_database_gets_every_table(db: sqlite3.Connection) -> None:
    assert table_names(db) >= TABLES
    assert dbmod.schema_version(db) == len(dbmod.MIGRATIONS)


def test_connection_pragmas(db: sqlite3.Connection) -> None:
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert db.execute("PRAGMA busy_timeout").fetchone()[0] == 5000


def test_host_database_with_items_stays_readable(tmp_path: Path) -> None:
    path = tmp_path / "host.db"
    host = sqlite3.connect(path)
    host.execute(
        "CREATE TABLE items (id INTEGER PRIMARY KEY, title TEXT, content TEXT, content_hash TEXT,"
        " source_content TEXT, source_content_hash TEXT, updated_at TEXT, extra TEXT)"
    )
    rows = [(i, f"t{i}", f"body {i}", "", "", "", "2026", "keep") for i in range(1, 6)]
    host.executemany("INSERT INTO items VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    host.commit()
    host.close()
    conn = open_db(path)
    assert table_names(conn) >= TABLES
    assert [tuple(r) for r in conn.execute("SELECT * FROM items ORDER BY id")] == rows


def test_reopen_is_a_noop(config) -> None:  # type: ignore[no-untyped-def]
    first = open_db(config.db_path)
    before = dump(first)
    versions = first.execute("SELECT * FROM rinwa_schema_version").fetchall()
    second = open_db(config.db_path)
    assert dbmod.apply_migrations(second) == []
    assert dump(second) == before
    assert second.execute("SELECT * FROM rinwa_schema_version").fetchall() == versions


def test_unique_item_ord(db: sqlite3.Connection) -> None:
    db.execute("INSERT INTO items (id, content) VALUES (1, 'x')")
    add_chunk(db, 1, 0, "a")
    with pytest.raises(sqlite3.IntegrityError):
        add_chunk(db, 1, 0, "b")


def test_deleting_item_cascades_to_chunks_and_fts(db: sqlite3.Connection) -> None:
    db.execute("INSERT INTO items (id, content) VALUES (1, 'x'), (2, 'y')")
    add_chunk(db, 1, 0, "a")
    add_chunk(db, 1, 1, "b")
    keep = add_chunk(db, 2, 0, "c")
    db.execute("DELETE FROM items WHERE id = 1")
    assert [r[0] for r in db.execute("SELECT item_id FROM item_chunks")] == [2]
    assert [r[0] for r in db.execute("SELECT rowid FROM chunks_fts")] == [keep]
    orphans = db.execute(
        "SELECT COUNT(*) FROM chunks_fts WHERE rowid NOT IN (SELECT id FROM item_chunks)"
    ).fetchone()[0]
    assert orphans == 0


def test_failing_migration_leaves_database_as_it_was(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "m.db")
    before = dump(conn)

    def m008_half_done(c: sqlite3.Connection) -> None:
        c.execute("CREATE TABLE half_done (x)")
        c.execute("ALTER TABLE item_chunks ADD COLUMN extra TEXT")
        c.execute("THIS IS NOT SQL")

    with pytest.raises(MigrationError, match="m008_half_done"):
        dbmod.apply_migrations(conn, [*dbmod.MIGRATIONS, m008_half_done])
    assert dump(conn) == before
    assert dbmod.schema_version(conn) == len(dbmod.MIGRATIONS)


def test_atomic_rolls_back_on_error(db: sqlite3.Connection) -> None:
    with pytest.raises(RuntimeError), dbmod.atomic(db):
        db.execute("INSERT INTO items (id, content) VALUES (9, 'x')")
        raise RuntimeError("boom")
    assert db.execute("SELECT COUNT(*) FROM items").fetchone()[0] == 0
    assert not db.in_transaction


def test_missing_database_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="does not exist"):
        dbmod.connect(tmp_path / "nope.db", must_exist=True)


def test_unwritable_database_is_a_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "host.db"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.close()
    uri = f"file:{path}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        dbmod.apply_migrations(conn)
    conn.close()


def test_items_view_gets_chunks_without_cascade(tmp_path: Path) -> None:
    path = tmp_path / "view.db"
    host = sqlite3.connect(path)
    host.execute("CREATE TABLE articles (pk INTEGER PRIMARY KEY, body TEXT)")
    host.execute(
        "CREATE VIEW items AS SELECT pk AS id, '' AS title, body AS content, '' AS content_hash,"
        " '' AS source_content, '' AS source_content_hash, '' AS updated_at FROM articles"
    )
    host.execute("INSERT INTO articles VALUES (1, 'hello')")
    host.commit()
    host.close()
    conn = open_db(path)
    add_chunk(conn, 1, 0, "v")
    assert conn.execute("SELECT COUNT(*) FROM item_chunks").fetchone()[0] == 1

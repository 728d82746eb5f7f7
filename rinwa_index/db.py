"""Connections and the schema: pragmas, ``atomic()``, numbered additive migrations.

Every table rinwa-index adds lives next to the host's own tables in the host
database. Migrations are tiny functions applied in order when a database is
opened, each in one transaction together with its ``rinwa_schema_version``
row, so a failing step leaves the database exactly as it was. Released
migrations are never edited; new ones are appended.

The host's ``items`` table (created here when absent) has the columns
``id INTEGER PRIMARY KEY, title, content, content_hash, source_content,
source_content_hash, updated_at``. A host with another schema can expose a
view with these columns named ``items``; chunks of a view-backed host are then
cleaned up by ``record_item_deleted`` rather than by a foreign-key cascade.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from .errors import DatabaseError, MigrationError

Migration = Callable[[sqlite3.Connection], None]


def utcnow() -> str:
    """An ISO-8601 UTC timestamp for ``created_at``-style columns."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def connect(
    path: str | Path,
    *,
    busy_timeout_ms: int = 5000,
    migrate: bool = True,
    must_exist: bool = False,
) -> sqlite3.Connection:
    """Open ``path`` with WAL, a busy timeout and foreign keys on; migrate it.

    The connection is in autocommit mode (``isolation_level=None``): every
    write goes through :func:`atomic`, which issues ``BEGIN IMMEDIATE``.
    """
    path = Path(path)
    if must_exist and not path.exists():
        raise DatabaseError(
            f"The database {path.name} does not exist; run `rinwa-index init` or check --db."
        )
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        register_functions(conn)
    except sqlite3.Error as exc:
        raise DatabaseError(
            f"Cannot open the database {path.name} ({exc}); check the path and its permissions."
        ) from exc
    if migrate:
        try:
            apply_migrations(conn)
        except sqlite3.OperationalError as exc:
            conn.close()
            if "readonly" in str(exc) or "read-only" in str(exc):
                raise DatabaseError(
                    f"The database {path.name} is not writable; fix its permissions "
                    "(the file and its folder)."
                ) from exc
            raise DatabaseError(f"Cannot prepare the database {path.name}: {exc}.") from exc
    return conn


def register_functions(conn: sqlite3.Connection) -> None:
    """SQL functions the library's queries use: ``rinwa_source_key(content,
    content_hash, source_content, source_content_hash)`` is the canonical source
    selector's ``kind:hash`` (so SQL and Python can never disagree about it)."""
    from .source import source_key

    conn.create_function("rinwa_source_key", 4, source_key, deterministic=True)


@contextmanager
def atomic(conn: sqlite3.Connection, *, immediate: bool = True) -> Iterator[sqlite3.Connection]:
    """One transaction: commit on success, roll back on any exception.

    Nested use joins the outer transaction (a host that already began one
    keeps control of commit and rollback).
    """
    if conn.in_transaction:
        yield conn
        return
    conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
    try:
        yield conn
    except BaseException:
        conn.rollback()
        raise
    else:
        conn.commit()


# --- migrations -------------------------------------------------------------


def m001_create_items(conn: sqlite3.Connection) -> None:
    """The host's items table, when the host has none (standalone use, the demo)."""
    conn.execute(
        """CREATE TABLE IF NOT EXISTS items (
            id                  INTEGER PRIMARY KEY,
            title               TEXT NOT NULL DEFAULT '',
            content             TEXT NOT NULL DEFAULT '',
            content_hash        TEXT NOT NULL DEFAULT '',
            source_content      TEXT NOT NULL DEFAULT '',
            source_content_hash TEXT NOT NULL DEFAULT '',
            updated_at          TEXT NOT NULL DEFAULT ''
        )"""
    )


def _items_is_table(conn: sqlite3.Connection) -> bool:
    row = conn.execute("SELECT type FROM sqlite_master WHERE name = 'items'").fetchone()
    return row is not None and row[0] == "table"


def m002_create_item_chunks(conn: sqlite3.Connection) -> None:
    """Chunk rows (Rinwa §3 plus ``text_hash``); cascade from items when it is a table."""
    fk = (
        "FOREIGN KEY(item_id) REFERENCES items(id) ON DELETE CASCADE,"
        if _items_is_table(conn)
        else ""
    )
    conn.execute(
        f"""CREATE TABLE item_chunks (
            id                INTEGER PRIMARY KEY AUTOINCREMENT,
            chunk_key         TEXT NOT NULL UNIQUE,
            item_id           INTEGER NOT NULL,
            ord               INTEGER NOT NULL,
            text              TEXT NOT NULL DEFAULT '',
            text_hash         TEXT NOT NULL DEFAULT '',
            token_count       INTEGER NOT NULL DEFAULT 0,
            source_kind       TEXT NOT NULL DEFAULT '',
            source_hash       TEXT NOT NULL DEFAULT '',
            index_signature   TEXT NOT NULL DEFAULT '',
            paragraph_start   INTEGER NOT NULL DEFAULT 0,
            paragraph_end     INTEGER NOT NULL DEFAULT 0,
            char_start        INTEGER NOT NULL DEFAULT 0,
            char_end          INTEGER NOT NULL DEFAULT 0,
            heading_path_json TEXT NOT NULL DEFAULT '[]',
            embedding         BLOB,
            dim               INTEGER NOT NULL DEFAULT 0,
            created_at        TEXT NOT NULL,
            {fk}
            UNIQUE(item_id, ord)
        )"""
    )
    conn.execute("CREATE INDEX idx_item_chunks_item ON item_chunks(item_id)")
    conn.execute(
        "CREATE INDEX idx_item_chunks_current"
        " ON item_chunks(item_id, source_kind, source_hash, index_signature)"
    )


def m003_create_chunks_fts(conn: sqlite3.Connection) -> None:
    """A standalone FTS5 table keyed by ``item_chunks.id``.

    Rows are inserted by the indexer in the same transaction as their chunk
    (the indexed text is CJK-segmented in Python, see :mod:`rinwa_index.fts`).
    Deletion is the one trigger: a chunk can disappear through the items
    foreign-key cascade, which no code of ours sees, and an orphan FTS row
    must never survive it.
    """
    conn.execute(
        "CREATE VIRTUAL TABLE chunks_fts USING fts5("
        "body, tokenize = 'unicode61 remove_diacritics 2')"
    )
    conn.execute(
        """CREATE TRIGGER item_chunks_fts_delete AFTER DELETE ON item_chunks BEGIN
             DELETE FROM chunks_fts WHERE rowid = old.id;
           END"""
    )


def m004_create_embedding_cache(conn: sqlite3.Connection) -> None:
    """Content-addressed vectors: an unchanged chunk text is never embedded twice."""
    conn.execute(
        """CREATE TABLE embedding_cache (
            text_hash    TEXT NOT NULL,
            signature    TEXT NOT NULL,
            embedding    BLOB NOT NULL,
            dim          INTEGER NOT NULL,
            created_at   TEXT NOT NULL,
            last_used_at REAL NOT NULL,
            PRIMARY KEY (text_hash, signature)
        ) WITHOUT ROWID"""
    )
    conn.execute("CREATE INDEX idx_embedding_cache_used ON embedding_cache(last_used_at)")


def m005_create_index_outbox(conn: sqlite3.Connection) -> None:
    """Durable "item N needs work" rows, written in the host's own transaction."""
    conn.execute(
        """CREATE TABLE index_outbox (
            item_id         INTEGER PRIMARY KEY,
            op              TEXT NOT NULL DEFAULT 'changed' CHECK (op IN ('changed', 'deleted')),
            seq             INTEGER NOT NULL DEFAULT 1,
            requested_at    REAL NOT NULL,
            attempts        INTEGER NOT NULL DEFAULT 0,
            next_attempt_at REAL NOT NULL DEFAULT 0,
            last_error      TEXT,
            failed          INTEGER NOT NULL DEFAULT 0,
            priority        INTEGER NOT NULL DEFAULT 10,
            queued          INTEGER NOT NULL DEFAULT 0,
            queued_at       REAL NOT NULL DEFAULT 0
        )"""
    )
    conn.execute(
        "CREATE INDEX idx_index_outbox_due ON index_outbox(failed, queued, next_attempt_at)"
    )


def m006_create_embedding_settings(conn: sqlite3.Connection) -> None:
    """The user-owned singleton: local provider only, dense search off by default."""
    conn.execute(
        """CREATE TABLE embedding_settings (
            id             INTEGER PRIMARY KEY CHECK (id = 1),
            provider       TEXT NOT NULL DEFAULT 'local' CHECK (provider = 'local'),
            model          TEXT NOT NULL,
            model_revision TEXT NOT NULL DEFAULT '',
            enabled        INTEGER NOT NULL DEFAULT 0 CHECK (enabled IN (0, 1)),
            updated_at     TEXT NOT NULL
        )"""
    )


def m007_create_index_signatures(conn: sqlite3.Connection) -> None:
    """Signature hash → canonical JSON, for diagnostics."""
    conn.execute(
        """CREATE TABLE index_signatures (
            signature  TEXT PRIMARY KEY,
            json       TEXT NOT NULL,
            created_at TEXT NOT NULL
        )"""
    )


def m008_create_item_index_state(conn: sqlite3.Connection) -> None:
    """What each item was last indexed from: source, signature, whether it has vectors.

    Written in the same transaction as the item's chunks. It makes an item with
    no text (zero chunks) current too, and lets the sweep find stale items with
    one join instead of scanning chunks.
    """
    fk = "REFERENCES items(id) ON DELETE CASCADE" if _items_is_table(conn) else ""
    conn.execute(
        f"""CREATE TABLE item_index_state (
            item_id     INTEGER PRIMARY KEY {fk},
            source_kind TEXT NOT NULL,
            source_hash TEXT NOT NULL,
            signature   TEXT NOT NULL,
            dense       INTEGER NOT NULL DEFAULT 0,
            chunks      INTEGER NOT NULL DEFAULT 0,
            indexed_at  REAL NOT NULL
        )"""
    )


MIGRATIONS: list[Migration] = [
    m001_create_items,
    m002_create_item_chunks,
    m003_create_chunks_fts,
    m004_create_embedding_cache,
    m005_create_index_outbox,
    m006_create_embedding_settings,
    m007_create_index_signatures,
    m008_create_item_index_state,
]


def schema_version(conn: sqlite3.Connection) -> int:
    """The number of the last applied migration (0 for a database we never touched)."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'rinwa_schema_version'"
    ).fetchone()
    if not exists:
        return 0
    row = conn.execute("SELECT MAX(version) FROM rinwa_schema_version").fetchone()
    return int(row[0] or 0)


def apply_migrations(
    conn: sqlite3.Connection, migrations: list[Migration] | None = None
) -> list[str]:
    """Apply every pending migration, each atomically with its bookkeeping row."""
    migrations = MIGRATIONS if migrations is None else migrations
    if schema_version(conn) >= len(migrations):
        return []  # the common case: one cheap read, no write lock
    applied: list[str] = []
    with atomic(conn):
        conn.execute(
            """CREATE TABLE IF NOT EXISTS rinwa_schema_version (
                version    INTEGER PRIMARY KEY,
                name       TEXT NOT NULL,
                applied_at TEXT NOT NULL
            )"""
        )
    for number, migration in enumerate(migrations, start=1):
        try:
            with atomic(conn):
                # Re-checked under the write lock: two processes may open at once.
                if schema_version(conn) >= number:
                    continue
                migration(conn)
                conn.execute(
                    "INSERT INTO rinwa_schema_version (version, name, applied_at) VALUES (?, ?, ?)",
                    (number, migration.__name__, utcnow()),
                )
        except sqlite3.OperationalError as exc:
            if "readonly" in str(exc) or "locked" in str(exc):
                raise
            raise MigrationError(f"Migration {migration.__name__} failed: {exc}.") from exc
        except sqlite3.Error as exc:
            raise MigrationError(f"Migration {migration.__name__} failed: {exc}.") from exc
        applied.append(migration.__name__)
    return applied

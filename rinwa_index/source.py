"""The canonical source selector: which text of an item is indexed.

``source_content`` (the extracted article body) when it holds anything but
white space, else ``content`` (the feed body) — the same choice as SQL's
``COALESCE(NULLIF(TRIM(source_content), ''), content)``. The kind and hash
travel with the text; a chunk is current only while both still match.

When the host left the matching hash empty, the hash is computed here as the
SHA-256 hex digest of the UTF-8 text, so hosts without hashes still get exact
staleness checks.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from typing import Literal

SourceKind = Literal["extracted", "feed"]


@dataclass(frozen=True)
class Source:
    """The text an item is indexed from, with its kind and hash."""

    item_id: int
    kind: SourceKind
    text: str
    hash: str


def text_hash(text: str) -> str:
    """SHA-256 hex of ``text`` as UTF-8 (lone surrogates are escaped, never fatal)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def select_source(
    item_id: int,
    content: str | None,
    content_hash: str | None,
    source_content: str | None,
    source_content_hash: str | None,
) -> Source:
    """Choose the indexed text from an item's columns (pure; no database)."""
    extracted = source_content or ""
    if extracted.strip():
        return Source(item_id, "extracted", extracted, source_content_hash or text_hash(extracted))
    feed = content or ""
    return Source(item_id, "feed", feed, content_hash or text_hash(feed))


def source_key(
    content: object, content_hash: object, source_content: object, source_content_hash: object
) -> str:
    """``kind:hash`` of the selected source, for SQL (registered as ``rinwa_source_key``)."""
    chosen = select_source(
        0, _as_text(content), _as_text(content_hash),
        _as_text(source_content), _as_text(source_content_hash),
    )  # fmt: skip
    return f"{chosen.kind}:{chosen.hash}"


#: The selector as SQL over an ``items`` row aliased ``i``.
SOURCE_KEY_SQL = (
    "rinwa_source_key(CAST(i.content AS BLOB), CAST(i.content_hash AS BLOB),"
    " CAST(i.source_content AS BLOB), CAST(i.source_content_hash AS BLOB))"
)


def read_source(conn: sqlite3.Connection, item_id: int) -> Source | None:
    """The current source of ``item_id``, or None when the item does not exist."""
    row = conn.execute(
        # As bytes: a host may have stored invalid UTF-8, which must be indexed (with
        # U+FFFD), not crash the job; SOURCE_KEY_SQL reads the columns the same way.
        "SELECT CAST(content AS BLOB), CAST(content_hash AS BLOB), CAST(source_content AS BLOB),"
        " CAST(source_content_hash AS BLOB) FROM items WHERE id = ?",
        (item_id,),
    ).fetchone()
    if row is None:
        return None
    return select_source(item_id, *(_as_text(value) for value in row))


def _as_text(value: object) -> str | None:
    """Host columns may hold BLOBs or numbers; index them as text, never crash."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)

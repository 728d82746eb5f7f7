"""A host stand-in: upsert items from JSONL and record each change in the same transaction."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

from .db import atomic, utcnow
from .errors import RinwaError
from .outbox import record_item_changed
from .source import text_hash


class IngestError(RinwaError):
    """A line of an ingest file is not a valid item."""


@dataclass(frozen=True)
class NewItem:
    """One item to upsert."""

    id: int | None
    title: str
    content: str
    source_content: str


def parse_items(lines: Iterable[str]) -> list[NewItem]:
    """Parse and check every line first, so a bad line changes nothing."""
    items = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            items.append(_parse_line(line, number))
    return items


def _parse_line(line: str, number: int) -> NewItem:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise IngestError(
            f"Line {number} is not valid JSON ({exc.msg}); fix it and retry."
        ) from None
    if not isinstance(data, dict):
        raise IngestError(f"Line {number} must be a JSON object; fix it and retry.")
    item_id = data.get("id")
    if item_id is not None and (isinstance(item_id, bool) or not isinstance(item_id, int)):
        raise IngestError(f"Line {number}: id must be a whole number; fix it and retry.")
    fields = {}
    for name in ("title", "content", "source_content"):
        value = data.get(name, "")
        if not isinstance(value, str):
            raise IngestError(f"Line {number}: {name} must be a string; fix it and retry.")
        fields[name] = value.replace("\x00", "")  # SQLite text with NUL confuses most hosts
    if not (fields["content"].strip() or fields["source_content"].strip()):
        raise IngestError(f"Line {number} has neither content nor source_content.")
    return NewItem(item_id, fields["title"], fields["content"], fields["source_content"])


def ingest_items(conn: sqlite3.Connection, items: list[NewItem], *, batch: int = 500) -> int:
    """Upsert ``items`` and record their changes, one transaction per batch."""
    for start in range(0, len(items), batch):
        with atomic(conn):
            for item in items[start : start + batch]:
                item_id = _upsert(conn, item)
                record_item_changed(conn, item_id)
    return len(items)


def _upsert(conn: sqlite3.Connection, item: NewItem) -> int:
    row = conn.execute(
        """INSERT INTO items (id, title, content, content_hash, source_content,
                              source_content_hash, updated_at)
           VALUES (?, ?, ?, ?, ?, ?, ?)
           ON CONFLICT(id) DO UPDATE SET title = excluded.title, content = excluded.content,
             content_hash = excluded.content_hash, source_content = excluded.source_content,
             source_content_hash = excluded.source_content_hash, updated_at = excluded.updated_at
           RETURNING id""",
        (
            item.id, item.title, item.content, text_hash(item.content), item.source_content,
            text_hash(item.source_content) if item.source_content else "", utcnow(),
        ),
    ).fetchone()  # fmt: skip
    return int(row[0])

"""The ``embedding_settings`` singleton and the active index signature.

Local provider only: anything else is rejected, here and by a CHECK
constraint. Dense search is off until an operator enables it. The settings
row is user data (it is backed up); everything the indexer derives is not.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from .config import ChunkParams
from .db import atomic, utcnow
from .errors import SettingsError
from .models import DEFAULT_MODEL, get_manifest
from .signature import Signature, build_signature

PROVIDERS = ("local",)

#: Tables a backup must keep. Chunks, FTS rows, the vector cache, the outbox
#: and signatures are derived and rebuilt by the worker.
USER_TABLES: tuple[str, ...] = ("items", "embedding_settings")
DERIVED_TABLES: tuple[str, ...] = (
    "item_chunks",
    "chunks_fts",
    "embedding_cache",
    "index_outbox",
    "index_signatures",
    "item_index_state",
)


@dataclass(frozen=True)
class EmbeddingSettings:
    """The operator's choice: provider, model and revision, enabled or not."""

    provider: str
    model: str
    model_revision: str
    enabled: bool
    updated_at: str


def get_settings(conn: sqlite3.Connection) -> EmbeddingSettings:
    """The current settings; the defaults (dense off, default model) when never set."""
    row = conn.execute(
        "SELECT provider, model, model_revision, enabled, updated_at"
        " FROM embedding_settings WHERE id = 1"
    ).fetchone()
    if row is None:
        manifest = get_manifest(DEFAULT_MODEL)
        return EmbeddingSettings("local", manifest.name, manifest.revision, False, "")
    return EmbeddingSettings(row[0], row[1], row[2], bool(row[3]), row[4])


def update_settings(
    conn: sqlite3.Connection,
    *,
    enabled: bool | None = None,
    model: str | None = None,
    provider: str | None = None,
    model_dir: Path | None = None,
) -> EmbeddingSettings:
    """Change some settings atomically and return the result."""
    if provider is not None and provider not in PROVIDERS:
        raise SettingsError(
            f"Provider {provider!r} is not supported: only 'local' embeddings exist, "
            "so no text ever leaves this machine."
        )
    with atomic(conn):
        current = get_settings(conn)
        manifest = get_manifest(model or current.model, model_dir)
        conn.execute(
            """INSERT INTO embedding_settings (id, provider, model, model_revision, enabled, updated_at)
               VALUES (1, 'local', ?, ?, ?, ?)
               ON CONFLICT(id) DO UPDATE SET model = excluded.model,
                 model_revision = excluded.model_revision, enabled = excluded.enabled,
                 updated_at = excluded.updated_at""",
            (
                manifest.name,
                manifest.revision,
                int(current.enabled if enabled is None else enabled),
                utcnow(),
            ),
        )
        return get_settings(conn)


def active_signature(
    conn: sqlite3.Connection, chunk: ChunkParams, model_dir: Path | None = None
) -> Signature:
    """The signature of the configured model, recorded in ``index_signatures``."""
    settings = get_settings(conn)
    manifest = get_manifest(settings.model, model_dir)
    signature = build_signature(manifest, chunk, settings.provider)
    record_signature(conn, signature)
    return signature


def record_signature(conn: sqlite3.Connection, signature: Signature) -> None:
    """Keep the signature's JSON for diagnostics (idempotent)."""
    exists = conn.execute(
        "SELECT 1 FROM index_signatures WHERE signature = ?", (signature.hash,)
    ).fetchone()
    if exists:
        return
    with atomic(conn):
        conn.execute(
            "INSERT OR IGNORE INTO index_signatures (signature, json, created_at) VALUES (?, ?, ?)",
            (signature.hash, signature.canonical_json(), utcnow()),
        )

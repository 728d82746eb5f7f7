"""The embedding_settings singleton and the backup table lists."""

from __future__ import annotations

import sqlite3

import pytest

from rinwa_index.config import ChunkParams
from rinwa_index.errors import ModelError, SettingsError
from rinwa_index.models import DEFAULT_MODEL
from rinwa_index.settings import (
    DERIVED_TABLES,
    USER_TABLES,
    active_signature,
    get_settings,
    update_settings,
)


def test_defaults_local_default_model_disabled(db: sqlite3.Connection) -> None:
    settings = get_settings(db)
    assert (settings.provider, settings.model, settings.enabled) == ("local", DEFAULT_MODEL, False)


def test_enable_and_disable_round_trip(db: sqlite3.Connection) -> None:
    assert update_settings(db, enabled=True).enabled is True
    assert get_settings(db).enabled is True
    assert update_settings(db, enabled=False).enabled is False
    assert get_settings(db).updated_at


@pytest.mark.parametrize("provider", ["openai", "ollama", "", "LOCAL"])
def test_non_local_provider_rejected(db: sqlite3.Connection, provider: str) -> None:
    with pytest.raises(SettingsError, match="only 'local'"):
        update_settings(db, provider=provider)
    assert db.execute("SELECT COUNT(*) FROM embedding_settings").fetchone()[0] == 0


def test_database_constraint_rejects_other_provider(db: sqlite3.Connection) -> None:
    update_settings(db, enabled=True)
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("UPDATE embedding_settings SET provider = 'openai'")


def test_unknown_model_rejected(db: sqlite3.Connection) -> None:
    with pytest.raises(ModelError, match="Unknown model"):
        update_settings(db, model="no-such-model")


def test_backup_lists_keep_settings_and_exclude_derived(db: sqlite3.Connection) -> None:
    assert "embedding_settings" in USER_TABLES
    for derived in ("item_chunks", "chunks_fts", "embedding_cache", "index_outbox"):
        assert derived in DERIVED_TABLES
        assert derived not in USER_TABLES
    existing = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert set(USER_TABLES) | set(DERIVED_TABLES) <= existing


def test_active_signature_is_recorded(db: sqlite3.Connection) -> None:
    signature = active_signature(db, ChunkParams())
    row = db.execute(
        "SELECT json FROM index_signatures WHERE signature = ?", (signature.hash,)
    ).fetchone()
    assert row[0] == signature.canonical_json()

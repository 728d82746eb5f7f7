"""Shared fixtures: a fresh database under tmp_path, closed after each test."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from rinwa_index.config import Config
from rinwa_index.db import connect

REPO = Path(__file__).resolve().parent.parent
EVAL_DIR = REPO.parent / "shared" / "eval"

_open: list[sqlite3.Connection] = []


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    """Close every connection a test opened through ``open_db``."""
    yield
    while _open:
        _open.pop().close()


def open_db(path: Path) -> sqlite3.Connection:
    """Open (and migrate) a database; closed automatically after the test."""
    conn = connect(path)
    _open.append(conn)
    return conn


@pytest.fixture
def config(tmp_path: Path) -> Config:
    """A Config whose database, queue and model cache live under tmp_path."""
    return Config(db_path=tmp_path / "library.db", model_dir=tmp_path / "models")


@pytest.fixture
def db(config: Config) -> sqlite3.Connection:
    """A fresh, migrated database connection."""
    return open_db(config.db_path)

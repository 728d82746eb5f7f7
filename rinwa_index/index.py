"""The host-facing :class:`Index` handle: record changes, search, warm the dense side."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from . import outbox
from .config import Config
from .db import atomic, connect
from .dense import DenseSide, EmbedderLoader
from .search import Mode, SearchOptions, SearchResult, dense_target, search
from .settings import get_settings


class Index:
    """A search handle on one database: its own connection and dense side.

    ``Index(config_or_path)`` opens (and migrates) the database. With dense
    search enabled and ``dense_warmup`` true, the query embedder and vector
    matrix start loading in the background at once; otherwise the first
    search that wants dense starts it (and reports ``not_ready`` meanwhile).
    Safe to share between threads: each thread gets its own connection, so
    concurrent searches do not queue behind one another.
    """

    def __init__(
        self,
        config_or_path: Config | str | Path,
        *,
        dense_warmup: bool = True,
        embedder_loader: EmbedderLoader | None = None,
        options: SearchOptions | None = None,
    ) -> None:
        """Open the database; start warming the dense side when it is enabled."""
        if isinstance(config_or_path, Config):
            self.config = config_or_path
        else:
            self.config = Config(db_path=Path(config_or_path))
        self.options = options or SearchOptions()
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        _ = self.conn  # open (and migrate) now: a bad path fails here, not at a search
        self.dense = DenseSide(
            self.config.db_path,
            config=self.config,
            options=self.options,
            embedder_loader=embedder_loader,
        )
        if dense_warmup:
            self.warm_up()

    def warm_up(self, *, wait: bool = False, timeout: float | None = None) -> bool:
        """Start loading the dense side if enabled; with ``wait``, block until done.

        Returns True when dense search is ready. Hosts never need to wait; the
        one-shot CLI does, so its first query is hybrid.
        """
        settings = get_settings(self.conn)
        if not settings.enabled:
            return False
        target = dense_target(settings, self.config)
        future = self.dense.warm_up(settings.model, target.signature, target.manifest.dim)
        if wait:
            try:
                future.result(timeout=timeout)
            except Exception:
                return False
        return self.dense.is_warm(settings.model, target.signature)

    def search(
        self,
        query: str,
        item_id: int | None = None,
        limit: int = 10,
        deadline_ms: float = 250,
        mode: Mode = "hybrid",
    ) -> SearchResult:
        """Ranked passages for ``query``; see :func:`rinwa_index.search.search`."""
        result = search(
            self.conn,
            query,
            item_id=item_id,
            limit=limit,
            deadline_ms=deadline_ms,
            mode=mode,
            dense=self.dense,
            config=self.config,
            options=self.options,
        )
        if result.reason == "disabled":
            self.dense.release()  # hundreds of MB a switched-off feature should not hold
        return result

    def item_changed(self, item_id: int) -> None:
        """Record that ``item_id`` changed (in its own transaction) and wake the worker.

        Hosts that write items in their own transactions should call
        :func:`rinwa_index.outbox.record_item_changed` inside them instead.
        """
        with atomic(self.conn):
            outbox.record_item_changed(self.conn, item_id)
        outbox.wake_worker(self.config)

    def item_deleted(self, item_id: int) -> None:
        """Record that ``item_id`` was deleted and wake the worker."""
        with atomic(self.conn):
            outbox.record_item_deleted(self.conn, item_id)
        outbox.wake_worker(self.config)

    @property
    def conn(self) -> sqlite3.Connection:
        """The calling thread's connection to the database (opened on first use)."""
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.config.db_path, busy_timeout_ms=self.config.busy_timeout_ms)
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def close(self) -> None:
        """Release the connections, the model and the scan threads."""
        self.dense.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""What an operator sees: counts of current, pending and failed items, model state, queue."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import outbox
from .config import Config
from .errors import ChecksumMismatchError, ModelError, ModelNotInstalledError
from .lock import worker_running
from .models import Manifest, file_path, get_manifest, verify_model
from .settings import active_signature, get_settings
from .source import SOURCE_KEY_SQL


@dataclass(frozen=True)
class Status:
    """``status --json``: counts are items, not chunks."""

    enabled: bool
    model: str
    model_state: str
    items: int
    sparse_current: int
    dense_current: int
    pending: int
    parked: int
    failed: int
    errors: dict[str, int]
    queue_depth: int
    worker_running: bool
    chunks: int
    rate_items_per_s: float | None
    eta_s: float | None

    def as_json(self) -> dict[str, object]:
        """A JSON-able dict."""
        return asdict(self)

    def as_text(self) -> str:
        """The at-a-glance block ``rinwa-index status`` prints."""
        errors = ", ".join(f"{name} ×{n}" for name, n in sorted(self.errors.items())) or "none"
        eta = f"~{self.eta_s} s at {self.rate_items_per_s} items/s" if self.eta_s else "-"
        return "\n".join(
            [
                f"dense search   {'on' if self.enabled else 'off'}",
                f"worker         {'running' if self.worker_running else 'not running'}",
                f"model          {self.model} ({self.model_state})",
                f"items          {self.items}",
                f"sparse-current {self.sparse_current}",
                f"dense-current  {self.dense_current}",
                f"pending        {self.pending} (parked for retry: {self.parked}, "
                f"queued jobs: {self.queue_depth})",
                f"failed         {self.failed} (errors: {errors})",
                f"time left      {eta}",
            ]
        )

    @property
    def caught_up(self) -> bool:
        """Every item current for the settings in force, nothing pending."""
        target = self.dense_current if self.enabled else self.sparse_current
        return target >= self.items and self.pending == 0

    @property
    def stalled(self) -> bool:
        """Work is pending but no worker runs to do it."""
        return self.pending > 0 and not self.worker_running


#: A cache: hashing a large model on every ``status --watch`` refresh would cost
#: seconds, so a result is kept while every file's size and mtime stay the same.
_STATES: dict[tuple[object, ...], str] = {}


def model_state(config: Config, model: str) -> str:
    """``ready``, ``not_installed``, ``checksum_mismatch`` or ``unknown``."""
    try:
        manifest = get_manifest(model, config.model_dir)
        key = (model, *(_stamp(file_path(manifest, f, config.model_dir)) for f in manifest.files))
    except ModelError:
        return "unknown"
    if key not in _STATES:
        _STATES[key] = _verify(manifest, config)
    return _STATES[key]


def _stamp(path: Path) -> tuple[str, int, int]:
    try:
        stat = path.stat()
    except OSError:
        return (str(path), -1, -1)
    return (str(path), stat.st_size, stat.st_mtime_ns)


def _verify(manifest: Manifest, config: Config) -> str:
    try:
        verify_model(manifest, config.model_dir)
    except ModelNotInstalledError:
        return "not_installed"
    except ChecksumMismatchError:
        return "checksum_mismatch"
    except ModelError:
        return "unknown"
    return "ready"


def queue_depth(queue_file: Path) -> int:
    """Jobs waiting in the Huey queue, read without creating the file."""
    if not queue_file.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{queue_file}?mode=ro", uri=True) as queue:
            return int(queue.execute("SELECT COUNT(*) FROM task").fetchone()[0])
    except sqlite3.Error:
        return 0


def current_counts(conn: sqlite3.Connection, signature: str) -> tuple[int, int, int]:
    """Items, sparse-current items and dense-current items."""
    row = conn.execute(
        f"""SELECT COUNT(*),
                   COUNT(s.item_id) FILTER (WHERE s.source_kind || ':' || s.source_hash
                                            = {SOURCE_KEY_SQL}),
                   COUNT(s.item_id) FILTER (WHERE s.source_kind || ':' || s.source_hash
                                            = {SOURCE_KEY_SQL}
                                            AND s.signature = ? AND s.dense = 1)
            FROM items i LEFT JOIN item_index_state s ON s.item_id = i.id""",
        (signature,),
    ).fetchone()
    return int(row[0]), int(row[1]), int(row[2])


def recent_rate(conn: sqlite3.Connection, *, now: float, window_s: float = 300.0) -> float | None:
    """Items indexed per second over the last few minutes (None when idle)."""
    row = conn.execute(
        "SELECT COUNT(*), MIN(indexed_at) FROM item_index_state WHERE indexed_at >= ?",
        (now - window_s,),
    ).fetchone()
    count, first = int(row[0]), row[1]
    if count < 2 or first is None or now - first <= 0:
        return None
    return count / (now - first)


def collect(conn: sqlite3.Connection, config: Config, *, now: float | None = None) -> Status:
    """Everything ``status`` shows, in one pass."""
    now = time.time() if now is None else now
    settings = get_settings(conn)
    signature = active_signature(conn, config.chunk, config.model_dir)
    items, sparse, dense = current_counts(conn, signature.hash)
    box = outbox.counts(conn, now=now)
    chunks = int(conn.execute("SELECT COUNT(*) FROM item_chunks").fetchone()[0])
    target = dense if settings.enabled else sparse
    rate = recent_rate(conn, now=now)
    eta = (items - target) / rate if rate and items > target else None
    return Status(
        enabled=settings.enabled,
        model=settings.model,
        model_state=model_state(config, settings.model),
        items=items,
        sparse_current=sparse,
        dense_current=dense,
        pending=box.pending,
        parked=box.parked,
        failed=box.failed,
        errors=box.errors,
        queue_depth=queue_depth(config.queue_file),
        worker_running=worker_running(config),
        chunks=chunks,
        rate_items_per_s=None if rate is None else round(rate, 2),
        eta_s=None if eta is None else round(eta),
    )

"""Helpers for tests that run the real worker: start, wait, kill, check invariants."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from rinwa_index.config import Config
from rinwa_index.db import connect
from rinwa_index.ingest import NewItem, ingest_items
from rinwa_index.settings import active_signature, get_settings
from rinwa_index.status import collect

SENTINEL = "Zqxsentinel"
WORDS = [
    "river",
    "mountain",
    "archive",
    "lantern",
    "orchard",
    "harbor",
    "signal",
    "meadow",
    "copper",
    "violin",
    "glacier",
    "library",
    "compass",
    "thunder",
    "garden",
    "ember",
    "canyon",
    "whisper",
    "marble",
    "falcon",
    "pepper",
    "ledger",
    "quartz",
    "saddle",
    "timber",
    "velvet",
    "walnut",
    "anchor",
    "beacon",
    "cedar",
    "dune",
    "fjord",
    "granite",
    "hazel",
]


def article(rng: random.Random, paragraphs: int) -> str:
    """A plausible article: a heading, paragraphs of sentences, the privacy sentinel."""
    parts = [f"# {rng.choice(WORDS).title()} notes"]
    for _ in range(paragraphs):
        sentences = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16))).capitalize() + "."
            for _ in range(rng.randint(2, 6))
        ]
        parts.append(" ".join(sentences))
    parts.append(f"Marker {SENTINEL} ends here.")
    return "\n\n".join(parts)


def make_library(config: Config, count: int, *, seed: int = 7, dense: bool = True) -> None:
    """Ingest ``count`` items (host changes recorded) and set dense on or off."""
    from rinwa_index.settings import update_settings

    rng = random.Random(seed)
    conn = connect(config.db_path)
    items = [NewItem(None, f"Item {n}", article(rng, rng.randint(1, 6)), "") for n in range(count)]
    ingest_items(conn, items)
    update_settings(conn, enabled=dense)
    conn.close()


def worker_env(config: Config, **extra: str) -> dict[str, str]:
    """The environment a worker process gets: paths, offline hub, small sweeps."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINWA_")}
    env.update(
        RINWA_DB=str(config.db_path),
        RINWA_QUEUE=str(config.queue_file),
        RINWA_MODEL_DIR=str(config.model_dir),
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def start_worker(
    config: Config, log: Path, *, until_idle: bool = False, **extra: str
) -> subprocess.Popen[bytes]:
    """Start ``python -m workers`` with its log appended to ``log``."""
    args = [sys.executable, "-m", "workers", *(["--until-idle"] if until_idle else [])]
    handle = log.open("ab")
    return subprocess.Popen(
        args, env=worker_env(config, **extra), stdout=handle, stderr=subprocess.STDOUT
    )


def done(config: Config) -> bool:
    """Every item current for the active settings and nothing pending."""
    conn = connect(config.db_path)
    try:
        status = collect(conn, config)
    finally:
        conn.close()
    target = status.dense_current if status.enabled else status.sparse_current
    return target == status.items and status.pending == 0


def wait_until(predicate, timeout: float, interval: float = 0.25) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def kill(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` and reap the process."""
    if proc.poll() is None:
        proc.send_signal(sig)
    proc.wait(timeout=60)


def anomalies(config: Config) -> list[str]:
    """Everything that must never be true of the index, at any moment."""
    conn = connect(config.db_path)
    try:
        return _anomalies(conn, config)
    finally:
        conn.close()


def _anomalies(conn: sqlite3.Connection, config: Config) -> list[str]:
    found: list[str] = []
    dup = conn.execute(
        "SELECT COUNT(*) FROM (SELECT item_id, ord FROM item_chunks GROUP BY 1, 2 HAVING COUNT(*) > 1)"
    ).fetchone()[0]
    if dup:
        found.append(f"{dup} duplicate ordinals")
    chunk_ids = {r[0] for r in conn.execute("SELECT id FROM item_chunks")}
    fts_ids = {r[0] for r in conn.execute("SELECT rowid FROM chunks_fts")}
    if chunk_ids != fts_ids:
        found.append(f"FTS rows differ from chunk rows ({len(fts_ids ^ chunk_ids)})")
    signature = active_signature(conn, config.chunk, config.model_dir)
    state_rows = conn.execute(
        "SELECT s.item_id, s.signature, s.chunks, "
        " (SELECT COUNT(*) FROM item_chunks c WHERE c.item_id = s.item_id),"
        " (SELECT COUNT(DISTINCT index_signature) FROM item_chunks c WHERE c.item_id = s.item_id)"
        " FROM item_index_state s"
    ).fetchall()
    for item_id, _sig, expected, actual, signatures in state_rows:
        if expected != actual or signatures > 1:
            found.append(
                f"item {item_id}: state says {expected} chunks, has {actual} ({signatures} sigs)"
            )
    if get_settings(conn).enabled:
        bad = conn.execute(
            "SELECT COUNT(*) FROM item_chunks c JOIN item_index_state s ON s.item_id = c.item_id"
            " WHERE s.dense = 1 AND s.signature = ? AND (c.index_signature != ? OR c.embedding IS NULL"
            " OR length(c.embedding) != c.dim * 4)",
            (signature.hash, signature.hash),
        ).fetchone()[0]
        if bad:
            found.append(f"{bad} dense-current chunks with another signature or a bad vector")
    return found


def log_events(log: Path) -> list[dict[str, object]]:
    """The JSON log lines of a worker log (non-JSON lines are kept as text)."""
    events = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            events.append({"raw": line})
    return events

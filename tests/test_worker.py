"""The real worker: a Huey consumer subprocess on the real model and real SQLite files."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rinwa_index.config import Config
from rinwa_index.db import connect
from rinwa_index.ingest import NewItem, ingest_items
from rinwa_index.outbox import wake_worker

from .procs import (
    SENTINEL,
    anomalies,
    done,
    kill,
    log_events,
    make_library,
    start_worker,
    wait_until,
)


def run_until_idle(config: Config, log: Path, timeout: float = 300, **extra: str) -> int:
    proc = start_worker(config, log, until_idle=True, **extra)
    try:
        return proc.wait(timeout=timeout)
    finally:
        kill(proc)


def test_until_idle_indexes_everything_and_logs_no_text(config: Config, tmp_path: Path) -> None:
    make_library(config, 25, dense=True)
    log = tmp_path / "worker.log"
    assert run_until_idle(config, log) == 0
    assert done(config), log.read_text()[-3000:]
    assert anomalies(config) == []
    events = log_events(log)
    indexed = [e for e in events if e.get("event") == "item.indexed"]
    assert len(indexed) == 25
    assert all({"item_id", "chunks", "embedded", "reused", "ms"} <= set(e) for e in indexed)
    text = log.read_text()
    assert SENTINEL.lower() not in text.lower()
    assert str(config.model_dir) not in text and "river" not in text


def test_a_running_worker_picks_up_host_changes_at_once(config: Config, tmp_path: Path) -> None:
    make_library(config, 3, dense=False)
    log = tmp_path / "worker.log"
    proc = start_worker(config, log)
    try:
        assert wait_until(lambda: done(config), 60), log.read_text()[-3000:]
        conn = connect(config.db_path)
        ingest_items(conn, [NewItem(None, "new", "A brand new note about walruses.", "")])
        conn.close()
        wake_worker(config)
        assert wait_until(lambda: done(config), 30), log.read_text()[-3000:]
    finally:
        kill(proc, signal.SIGTERM)
    assert proc.returncode == 0


@pytest.mark.slow
@pytest.mark.stress
def test_sigkill_at_random_moments_loses_nothing(config: Config, tmp_path: Path) -> None:
    """Kill -9 the consumer again and again: first while the library is indexed, then
    while edited items are re-indexed; every third kill lands inside a swap transaction
    on purpose. The index never breaks, and a final run completes the work."""
    make_library(config, 300, dense=True)
    log, mark = tmp_path / "worker.log", tmp_path / "in-swap"
    rng = random.Random(2026)
    kills, in_swap, edits, found = 0, 0, 0, []
    for round_ in range(16):
        if round_ == 4:  # from here on every job replaces rows that exist
            assert run_until_idle(config, log, timeout=600) == 0
        if round_ >= 4:
            edits += edit_some(config, rng, 12)
        if round_ % 3 == 2:
            mark.unlink(missing_ok=True)
            proc = start_worker(
                config, log, RINWA_FAULT_SWAP_DELAY_S="2", RINWA_FAULT_SWAP_MARK=str(mark)
            )
            assert wait_until(mark.exists, 60, interval=0.02), log.read_text()[-2000:]
            in_swap += 1
        else:
            proc = start_worker(config, log)
            time.sleep(rng.uniform(0.5, 4.0))
        kill(proc)
        kills += 1
        found += anomalies(config)
    assert run_until_idle(config, log, timeout=600) == 0
    found += anomalies(config)
    print(
        f"\nfault injection: {kills} SIGKILLs ({in_swap} inside the swap transaction), "
        f"300 items, {edits} edits, anomalies: {found or 'none'}"
    )
    assert found == []
    assert done(config)


def edit_some(config: Config, rng: random.Random, count: int) -> int:
    """Host edits to items that already have chunks: their next swap replaces rows."""
    conn = connect(config.db_path)
    ids = [r[0] for r in conn.execute("SELECT item_id FROM item_index_state")]
    chosen = rng.sample(ids, min(count, len(ids)))
    ingest_items(
        conn,
        [NewItem(item_id, "edited", f"Edited note {rng.random()} about harbors.", "")
         for item_id in chosen],
    )  # fmt: skip
    conn.close()
    return len(chosen)


@pytest.mark.slow
def test_sigterm_is_graceful(config: Config, tmp_path: Path) -> None:
    make_library(config, 60, dense=True)
    log = tmp_path / "worker.log"
    proc = start_worker(config, log)
    assert wait_until(lambda: "item.indexed" in log.read_text(), 60)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert time.monotonic() - started < 30
    assert anomalies(config) == []
    assert run_until_idle(config, log) == 0 and done(config)


def test_cli_worker_until_idle(config: Config, tmp_path: Path) -> None:
    make_library(config, 5, dense=False)
    env = {"RINWA_DB": str(config.db_path), "RINWA_MODEL_DIR": str(config.model_dir)}
    result = subprocess.run(
        [sys.executable, "-m", "rinwa_index", "worker", "--until-idle"],
        env={**__import__("os").environ, **env}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert done(config)


@pytest.mark.slow
def test_disabling_mid_backfill_cancels_and_enabling_resumes(
    config: Config, tmp_path: Path
) -> None:
    from rinwa_index.settings import update_settings
    from rinwa_index.status import collect

    make_library(config, 150, dense=True)
    log = tmp_path / "worker.log"
    proc = start_worker(config, log)
    conn = connect(config.db_path)
    try:
        assert wait_until(lambda: collect(conn, config).dense_current >= 10, 120)
        update_settings(conn, enabled=False)
        wake_worker(config)
        assert wait_until(lambda: done(config), 120), log.read_text()[-3000:]
        paused = collect(conn, config)
        assert paused.sparse_current == 150 and paused.dense_current < 150
        update_settings(conn, enabled=True)
        wake_worker(config)
        assert wait_until(lambda: done(config), 300), log.read_text()[-3000:]
        assert collect(conn, config).dense_current == 150
    finally:
        conn.close()
        kill(proc, signal.SIGTERM)
    assert anomalies(config) == []

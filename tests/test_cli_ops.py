"""Operator commands: ingest, status, enable/disable, reindex, retry-failed, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from rinwa_index import outbox
from rinwa_index.cli import cli
from rinwa_index.config import Config
from rinwa_index.db import connect


def run(config: Config, *args: str) -> Result:
    env = {"RINWA_MODEL_DIR": str(config.model_dir)}
    return CliRunner().invoke(cli, ["--db", str(config.db_path), *args], env=env)


def write_jsonl(path: Path, lines: list[object]) -> Path:
    path.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n")
    return path


def test_ingest_upserts_items_and_records_changes(config: Config, tmp_path: Path) -> None:
    src = write_jsonl(
        tmp_path / "a.jsonl",
        [{"title": "a", "content": "alpha"}, {"id": 7, "title": "b", "content": "beta"}],
    )
    result = run(config, "ingest", str(src))
    assert result.exit_code == 0, result.output
    conn = connect(config.db_path)
    assert [tuple(r) for r in conn.execute("SELECT id, content FROM items ORDER BY id")] == [
        (1, "alpha"),
        (7, "beta"),
    ]
    assert conn.execute("SELECT COUNT(*) FROM index_outbox").fetchone()[0] == 2
    conn.close()
    assert config.wake_file.exists()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "Line 2 is not valid JSON"),
        ('["a"]', "Line 2 must be a JSON object"),
        ('{"id": "x", "content": "c"}', "id must be a whole number"),
        ('{"content": 5}', "content must be a string"),
        ('{"title": "only"}', "neither content nor source_content"),
    ],
)
def test_ingest_rejects_bad_lines_and_changes_nothing(
    config: Config, tmp_path: Path, line: str, message: str
) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text('{"content": "fine"}\n' + line + "\n")
    result = run(config, "ingest", str(src))
    assert result.exit_code == 1 and message in result.output
    conn = connect(config.db_path)
    assert conn.execute("SELECT COUNT(*) FROM items").fetchone()[0] == 0
    conn.close()


def test_ingest_binary_file_is_a_clear_error(config: Config, tmp_path: Path) -> None:
    src = tmp_path / "bin.jsonl"
    src.write_bytes(b"\xff\xfe\x00\x01garbage")
    result = run(config, "ingest", str(src))
    assert result.exit_code != 0 and "Traceback" not in result.output


def test_status_json_fields(config: Config, tmp_path: Path) -> None:
    run(config, "ingest", str(write_jsonl(tmp_path / "a.jsonl", [{"content": "alpha"}])))
    result = run(config, "status", "--json")
    data = json.loads(result.stdout)
    for key in (
        "enabled", "model", "model_state", "items", "sparse_current", "dense_current",
        "pending", "failed", "queue_depth",
    ):  # fmt: skip
        assert key in data
    assert (data["items"], data["pending"], data["enabled"]) == (1, 1, False)
    assert data["model_state"] == "ready" and data["worker_running"] is False
    # work is pending and no worker runs: one sentence saying what to do, status 1
    assert result.exit_code == 1
    assert "no worker is running" in result.stderr and "rinwa-index worker" in result.stderr


def test_status_is_clean_when_nothing_is_pending(config: Config) -> None:
    connect(config.db_path).close()
    result = run(config, "status", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["pending"] == 0


def test_a_running_worker_is_seen_and_a_second_one_refused(config: Config, tmp_path: Path) -> None:
    import subprocess
    import sys

    from rinwa_index.lock import take_worker_lock, worker_running

    connect(config.db_path).close()
    held = take_worker_lock(config)
    assert held is not None and worker_running(config)
    env = {"RINWA_DB": str(config.db_path), "PATH": ""}
    second = subprocess.run(
        [sys.executable, "-m", "workers"], env=env, capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 1 and "already running" in second.stderr
    held.close()
    assert not worker_running(config)


def test_unwritable_database_is_one_sentence(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    import rinwa_index.settings as settings

    connect(config.db_path).close()

    def readonly(*_a: object, **_k: object) -> None:
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(settings, "update_settings", readonly)
    result = run(config, "disable")
    assert result.exit_code == 1
    assert "not writable" in result.output and "Traceback" not in result.output


def test_status_text_shows_failures_by_class(config: Config) -> None:
    conn = connect(config.db_path)
    outbox.fail(conn, 3, "ChunkingError", now=1.0)
    conn.close()
    result = run(config, "status")
    assert result.exit_code == 0
    assert "ChunkingError ×1" in result.output and "dense search   off" in result.output


def test_enable_and_disable(config: Config) -> None:
    connect(config.db_path).close()
    assert run(config, "enable").exit_code == 0
    assert json.loads(run(config, "status", "--json").stdout)["enabled"] is True
    assert run(config, "disable").exit_code == 0
    assert json.loads(run(config, "status", "--json").stdout)["enabled"] is False


def test_enable_a_model_that_is_not_installed(config: Config) -> None:
    connect(config.db_path).close()
    result = run(config, "enable", "--model", "embeddinggemma-300m")
    assert result.exit_code == 1
    assert "is not installed" in result.output and "model fetch" in result.output


def test_missing_database_is_one_clear_sentence(tmp_path: Path) -> None:
    config = Config(db_path=tmp_path / "nope.db", model_dir=tmp_path)
    for command in (["status"], ["enable"], ["disable"], ["reindex", "--all"], ["retry-failed"]):
        result = run(config, *command)
        assert result.exit_code == 1
        assert "does not exist" in result.output and "Traceback" not in result.output


def test_reindex_and_retry_failed(config: Config, tmp_path: Path) -> None:
    run(config, "ingest", str(write_jsonl(tmp_path / "a.jsonl", [{"content": "alpha"}])))
    conn = connect(config.db_path)
    outbox.fail(conn, 1, "ChunkingError", now=1.0)
    conn.close()
    assert "Re-queued 1 items" in run(config, "retry-failed").output
    assert "Queued 1 items" in run(config, "reindex", "1").output
    assert run(config, "reindex").exit_code == 2


def test_enable_a_tampered_model_names_the_checksum(config: Config, tmp_path: Path) -> None:
    from rinwa_index.models import install_from_dir

    from .tinymodel import write_model_dir

    install_from_dir(write_model_dir(tmp_path / "src"), config.model_dir)
    connect(config.db_path).close()
    onnx_file = next(config.model_dir.glob("tiny-768/*.onnx"))
    onnx_file.write_bytes(onnx_file.read_bytes() + b"tampered")
    result = run(config, "enable", "--model", "tiny-768")
    assert result.exit_code == 1
    assert "does not match its pinned checksums" in result.output
    assert json.loads(run(config, "status", "--json").stdout)["enabled"] is False

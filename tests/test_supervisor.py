"""The worker under real supervisord, configured from the shipped supervisord.conf."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rinwa_index.config import Config

from .conftest import REPO
from .procs import anomalies, done, make_library, wait_until, worker_env

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(
    not (BIN / "supervisord").exists(), reason="supervisor is part of the test extra"
)


class Supervisor:
    """supervisord -n with a socket under a short temporary folder."""

    def __init__(self, config: Config, home: Path) -> None:
        self.home = home
        self.conf = home / "supervisord.conf"
        text = (REPO / "supervisord.conf").read_text()
        self.conf.write_text(text)  # the shipped file, unchanged: paths come from the env
        self.env = worker_env(config, RINWA_HOME=str(home), RINWA_PYTHON=sys.executable)
        self.proc = subprocess.Popen(
            [str(BIN / "supervisord"), "-c", str(self.conf), "-n"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def ctl(self, *args: str) -> str:
        result = subprocess.run(
            [str(BIN / "supervisorctl"), "-c", str(self.conf), *args],
            env=self.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return result.stdout + result.stderr

    def worker_pid(self) -> int:
        out = self.ctl("pid", "rinwa-worker").strip()
        return int(out) if out.isdigit() else 0

    def log(self) -> str:
        path = self.home / "worker.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        self.ctl("shutdown")
        try:
            self.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def supervisor(config: Config) -> Iterator[Supervisor]:
    home = Path(os.path.realpath("/tmp")) / f"rinwa-sv-{os.getpid()}-{time.monotonic_ns()}"
    home.mkdir()
    sv = Supervisor(config, home)
    try:
        yield sv
    finally:
        sv.close()
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.slow
def test_supervisord_restarts_a_killed_worker_and_stops_it_gracefully(
    config: Config, supervisor: Supervisor
) -> None:
    make_library(config, 120, dense=True)
    supervisor_start = time.monotonic()
    assert wait_until(lambda: supervisor.worker_pid() > 0, 30), supervisor.ctl("status")
    assert wait_until(lambda: "item.indexed" in supervisor.log(), 60), supervisor.log()[-2000:]
    first = supervisor.worker_pid()
    os.kill(first, signal.SIGKILL)
    assert wait_until(lambda: supervisor.worker_pid() not in (0, first), 30)
    assert wait_until(lambda: done(config), 400), supervisor.log()[-3000:]
    assert anomalies(config) == []

    # A graceful stop while work is under way: the job finishes or abandons its batch.
    from rinwa_index.db import connect
    from rinwa_index.outbox import force_reindex

    conn = connect(config.db_path)
    force_reindex(conn, None)
    conn.execute("DELETE FROM embedding_cache")  # make the re-index really embed
    conn.close()
    assert wait_until(lambda: supervisor.log().count("item.indexed") > 125, 60)
    started = time.monotonic()
    out = supervisor.ctl("stop", "rinwa-worker")
    assert "stopped" in out, out
    assert time.monotonic() - started < 30
    assert re.search(r"RUNNING|STARTING", supervisor.ctl("status", "rinwa-worker")) is None
    assert "Shutting down gracefully" in supervisor.log() or "exiting" in supervisor.log()
    assert anomalies(config) == []
    print(f"\nsupervisord scenario took {time.monotonic() - supervisor_start:.1f}s")

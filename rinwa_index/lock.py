"""One worker per database: an exclusive lock file the worker holds while it runs.

The kernel drops the lock when the process dies, however it dies, so a
SIGKILL never leaves a stale lock behind. ``status`` and the CLI's waiting
commands use the same lock to tell whether a worker is running.
"""

from __future__ import annotations

import fcntl
import os
from typing import IO

from .config import Config


def take_worker_lock(config: Config) -> IO[bytes] | None:
    """Hold the database's worker lock; None when another process holds it."""
    handle = open(config.lock_file, "ab")  # noqa: SIM115 — held for the process's life
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    handle.truncate(0)
    handle.write(f"{os.getpid()}\n".encode())
    handle.flush()
    return handle


def worker_running(config: Config) -> bool:
    """Whether some process holds the worker lock right now."""
    if not config.lock_file.exists():
        return False
    handle = take_worker_lock(config)
    if handle is None:
        return True
    handle.close()  # closing releases the lock we just took
    return False

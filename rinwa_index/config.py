"""One frozen :class:`Config` passed down from the entry points.

Only entry points (the CLI and ``workers/``) call :meth:`Config.from_env`;
library code receives the object and never reads the environment itself.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

DEFAULT_DB = "rinwa.db"


def default_model_dir(env: Mapping[str, str]) -> Path:
    """The per-user cache directory for fetched or installed models."""
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".cache")
    return Path(base) / "rinwa-index" / "models"


@dataclass(frozen=True)
class ChunkParams:
    """Chunk sizes in tokens of the formatted input; part of the index signature."""

    target: int = 160
    minimum: int = 24
    maximum: int = 256
    overlap: int = 24

    def __post_init__(self) -> None:
        if not 0 < self.minimum <= self.target <= self.maximum:
            raise ConfigError("Chunk sizes must satisfy 0 < minimum <= target <= maximum.")
        if not 0 <= self.overlap < self.target:
            raise ConfigError("Chunk overlap must be at least 0 and below the target size.")


@dataclass(frozen=True)
class Config:
    """Paths, limits and tuning for one database; immutable once built."""

    db_path: Path = Path(DEFAULT_DB)
    queue_path: Path | None = None
    model_dir: Path = field(default_factory=lambda: default_model_dir(os.environ))
    chunk: ChunkParams = ChunkParams()
    intra_op_threads: int = 2
    embed_batch_size: int = 16
    embed_batch_tokens: int = 2048
    sweep_batch: int = 200
    job_items: int = 8
    backfill_batch: int = 50
    retry_attempts: int = 3
    max_attempts: int = 8
    busy_timeout_ms: int = 5000
    backoff_base_s: float = 5.0
    backoff_cap_s: float = 3600.0
    requeue_stale_s: float = 900.0
    cache_max_rows: int = 500_000

    @property
    def queue_file(self) -> Path:
        """The Huey queue file: explicit, else a sibling of the database."""
        if self.queue_path is not None:
            return self.queue_path
        return self.db_path.with_name(self.db_path.name + ".queue")

    @property
    def wake_file(self) -> Path:
        """Touched by hosts after they record a change, so the worker sweeps at once."""
        return self.db_path.with_name(self.db_path.name + ".wake")

    @property
    def lock_file(self) -> Path:
        """Held by the running worker: one worker per database."""
        return self.db_path.with_name(self.db_path.name + ".worker.lock")

    def replace(self, **changes: object) -> Config:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: object) -> Config:
        """Build from ``RINWA_*`` variables; explicit ``overrides`` win (None is ignored)."""
        values: dict[str, object] = {}
        if env.get("RINWA_DB"):
            values["db_path"] = Path(env["RINWA_DB"])
        if env.get("RINWA_QUEUE"):
            values["queue_path"] = Path(env["RINWA_QUEUE"])
        values["model_dir"] = (
            Path(env["RINWA_MODEL_DIR"]) if env.get("RINWA_MODEL_DIR") else default_model_dir(env)
        )
        if env.get("RINWA_THREADS"):
            values["intra_op_threads"] = _positive_int(env["RINWA_THREADS"], "RINWA_THREADS")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]


def _positive_int(raw: str, name: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, not {raw!r}.") from None
    if value < 1:
        raise ConfigError(f"{name} must be at least 1.")
    return value

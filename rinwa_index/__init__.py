"""rinwa-index: private, on-device hybrid search for SQLite applications."""

from .config import ChunkParams, Config
from .errors import (
    ChecksumMismatchError,
    ChunkingError,
    ConfigError,
    DatabaseError,
    EmbeddingError,
    InputTooLongError,
    ItemError,
    MigrationError,
    ModelError,
    ModelNotInstalledError,
    RinwaError,
    SettingsError,
    VectorError,
)

__version__ = "0.1.0"

__all__ = [
    "ChecksumMismatchError",
    "ChunkParams",
    "ChunkingError",
    "Config",
    "ConfigError",
    "DatabaseError",
    "EmbeddingError",
    "InputTooLongError",
    "ItemError",
    "MigrationError",
    "ModelError",
    "ModelNotInstalledError",
    "RinwaError",
    "SettingsError",
    "VectorError",
    "__version__",
]

"""rinwa-index: private, on-device hybrid search for SQLite applications."""

from .config import ChunkParams, Config
from .errors import (
    ChecksumMismatchError,
    ChunkingError,
    ConfigError,
    DatabaseError,
    EmbeddingError,
    InferenceError,
    InputTooLongError,
    ItemError,
    MigrationError,
    ModelError,
    ModelNotInstalledError,
    RinwaError,
    SettingsError,
    VectorError,
)
from .index import Index
from .outbox import record_item_changed, record_item_deleted, wake_worker
from .search import Passage, SearchOptions, SearchResult, search

__version__ = "0.1.0"

__all__ = [
    "ChecksumMismatchError",
    "ChunkParams",
    "ChunkingError",
    "Config",
    "ConfigError",
    "DatabaseError",
    "EmbeddingError",
    "Index",
    "InferenceError",
    "InputTooLongError",
    "ItemError",
    "MigrationError",
    "ModelError",
    "ModelNotInstalledError",
    "Passage",
    "RinwaError",
    "SearchOptions",
    "SearchResult",
    "SettingsError",
    "VectorError",
    "__version__",
    "record_item_changed",
    "record_item_deleted",
    "search",
    "wake_worker",
]

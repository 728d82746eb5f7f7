"""The error hierarchy: one base class, each error says what to do next.

The CLI turns any :class:`RinwaError` into one sentence on stderr and exit
status 1; library callers can catch the base class or a precise subclass.
"""

from __future__ import annotations


class RinwaError(Exception):
    """Base class of every error rinwa-index raises on purpose."""


class ConfigError(RinwaError):
    """A setting is missing or invalid."""


class DatabaseError(RinwaError):
    """The database is missing, unreadable, not writable or not migratable."""


class MigrationError(DatabaseError):
    """A schema migration failed; the database was left as it was."""


class SettingsError(RinwaError):
    """An embedding setting was rejected (for example a non-local provider)."""


class ChunkingError(RinwaError):
    """A text could not be chunked within the model's hard token limit."""


class VectorError(RinwaError):
    """A vector or vector BLOB is malformed (wrong size, NaN/Inf, zero)."""


class ModelError(RinwaError):
    """The embedding model is unknown, not installed or failed to run."""


class ModelNotInstalledError(ModelError):
    """The model's files are not on this machine."""


class ChecksumMismatchError(ModelError):
    """A model file's SHA-256 differs from the pinned value; it is never loaded."""


class InputTooLongError(ModelError):
    """An input exceeds the model's hard token limit (nothing is truncated silently)."""


class EmbeddingError(ModelError):
    """Inference produced no usable vector (zero or non-finite)."""


class InferenceError(ModelError):
    """The model failed while running; usually transient, so the worker retries it."""


class ItemError(RinwaError):
    """An item's content cannot be indexed (a permanent, recorded failure)."""

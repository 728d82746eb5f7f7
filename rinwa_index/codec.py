"""Vectors ⇄ little-endian float32 BLOBs, validated both ways.

``len(blob) == dim * 4`` exactly; NaN, ±Inf and all-zero vectors are
rejected. Decoding copies through ``numpy.frombuffer`` with an explicit
``'<f4'`` dtype, which neither assumes alignment nor the host's byte order.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .errors import VectorError

DTYPE = np.dtype("<f4")


def validate(vector: npt.NDArray[np.floating], dim: int) -> npt.NDArray[np.float32]:
    """Return ``vector`` as float32 of length ``dim`` or raise :class:`VectorError`."""
    array = np.asarray(vector, dtype=np.float32)
    if array.ndim != 1 or array.shape[0] != dim:
        raise VectorError(f"Expected a vector of {dim} dimensions, got shape {array.shape}.")
    if not np.all(np.isfinite(array)):
        raise VectorError("The vector holds NaN or infinite values.")
    if not np.any(array):
        raise VectorError("The vector is all zeros and has no direction.")
    return array


def encode(vector: npt.NDArray[np.floating], dim: int) -> bytes:
    """A validated vector as ``dim * 4`` little-endian float32 bytes."""
    return validate(vector, dim).astype(DTYPE, copy=False).tobytes()


def decode(blob: bytes | bytearray | memoryview | None, dim: int) -> npt.NDArray[np.float32]:
    """A BLOB back to a float32 vector, rejecting any malformed BLOB."""
    if blob is None:
        raise VectorError("The vector BLOB is missing.")
    if dim <= 0:
        raise VectorError(f"The stored dimension {dim} is not positive.")
    if len(blob) != dim * 4:
        raise VectorError(f"The vector BLOB holds {len(blob)} bytes, expected {dim * 4}.")
    array = np.frombuffer(bytes(blob), dtype=DTYPE).astype(np.float32)
    return validate(array, dim)

"""The vector codec: exact little-endian float32, validated both ways."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from rinwa_index import codec
from rinwa_index.errors import VectorError

finite = st.floats(allow_nan=False, allow_infinity=False, width=32).filter(lambda x: x != 0)


@given(arrays(np.float32, st.integers(1, 64), elements=finite))
def test_round_trip(vector: np.ndarray) -> None:
    blob = codec.encode(vector, len(vector))
    assert len(blob) == len(vector) * 4
    assert np.array_equal(codec.decode(blob, len(vector)), vector)


def test_little_endian_bytes() -> None:
    assert codec.encode(np.array([1.0], dtype=np.float32), 1) == b"\x00\x00\x80\x3f"


def test_decode_from_unaligned_memoryview() -> None:
    vector = np.array([0.5, -2.0, 3.25], dtype=np.float32)
    buffer = b"x" + codec.encode(vector, 3) + b"yy"
    view = memoryview(buffer)[1:13]
    assert np.array_equal(codec.decode(view, 3), vector)


@pytest.mark.parametrize("size", [0, 11, 13, 16])
def test_wrong_length_rejected(size: int) -> None:
    with pytest.raises(VectorError, match="bytes"):
        codec.decode(b"\x00" * size, 3)


def test_wrong_dimension_rejected_on_encode() -> None:
    with pytest.raises(VectorError, match="dimensions"):
        codec.encode(np.ones(4, dtype=np.float32), 3)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_rejected(bad: float) -> None:
    vector = np.array([1.0, bad], dtype=np.float32)
    with pytest.raises(VectorError, match="NaN"):
        codec.encode(vector, 2)
    with pytest.raises(VectorError, match="NaN"):
        codec.decode(vector.astype("<f4").tobytes(), 2)


def test_zero_vector_rejected() -> None:
    with pytest.raises(VectorError, match="zeros"):
        codec.encode(np.zeros(3, dtype=np.float32), 3)


def test_missing_blob_and_bad_dim_rejected() -> None:
    with pytest.raises(VectorError):
        codec.decode(None, 3)
    with pytest.raises(VectorError):
        codec.decode(b"", 0)

"""The index signature: every field counts, and it is stable across processes."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from rinwa_index.config import ChunkParams
from rinwa_index.models import MINILM
from rinwa_index.signature import Signature, build_signature

BASE = build_signature(MINILM, ChunkParams())


def altered(field: dataclasses.Field) -> object:  # type: ignore[type-arg]
    value = getattr(BASE, field.name)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, tuple):
        return (*value, ("extra.bin", "0" * 64))
    raise AssertionError(f"no alteration for {field.name}")


@pytest.mark.parametrize("field", dataclasses.fields(Signature), ids=lambda f: f.name)
def test_changing_any_field_changes_the_hash(field: dataclasses.Field) -> None:  # type: ignore[type-arg]
    changed = dataclasses.replace(BASE, **{field.name: altered(field)})
    assert changed.hash != BASE.hash


def test_signature_covers_every_field_the_issue_names() -> None:
    names = {f.name for f in dataclasses.fields(Signature)}
    assert {
        "pipeline_version", "provider", "model_id", "model_revision", "model_files", "raw_dim",
        "dim", "tokenizer_id", "tokenizer_sha256", "max_tokens", "chunk_target", "chunk_min",
        "chunk_max", "chunk_overlap", "output", "pooling", "normalization", "runtime_dtype",
        "stored_dtype", "doc_prefix", "query_prefix",
    } <= names  # fmt: skip


def test_chunk_params_feed_the_signature() -> None:
    other = build_signature(MINILM, ChunkParams(target=100))
    assert other.hash != BASE.hash


def test_same_inputs_same_hash_in_another_process() -> None:
    code = (
        "from rinwa_index.signature import build_signature;"
        "from rinwa_index.models import MINILM;"
        "from rinwa_index.config import ChunkParams;"
        "print(build_signature(MINILM, ChunkParams()).hash)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    )  # fmt: skip
    assert out.stdout.strip() == BASE.hash


def test_canonical_json_has_sorted_keys() -> None:
    text = BASE.canonical_json()
    assert text.startswith('{"chunk_max":')
    assert " " not in text.split('"doc_prefix"')[0]

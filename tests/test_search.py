"""search and index: sparse, dense, RRF, fallbacks, citations, currency, the matrix."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog

from rinwa_index import codec
from rinwa_index.config import ChunkParams, Config
from rinwa_index.db import connect
from rinwa_index.dense import DenseSide, VectorMatrix
from rinwa_index.embedder import FakeEmbedder, fake_manifest, load
from rinwa_index.index import Index
from rinwa_index.indexer import index_item
from rinwa_index.models import MINILM
from rinwa_index.search import (
    DenseHits,
    SearchOptions,
    SearchResult,
    _Row,
    dense_ranking,
    dense_target,
    dense_trust,
    fuse,
    script_coverage,
    search,
)
from rinwa_index.settings import get_settings, update_settings
from rinwa_index.source import read_source

from .conftest import open_db

DOCS = {
    1: "The physician prescribed antibiotics for the bacterial infection.",
    2: "Stock markets fell sharply after the central bank raised interest rates.",
    3: "Serial code XQ7731 identifies the replacement valve for the boiler.",
    4: "Our garden has tomatoes, basil and a small lemon tree.",
    5: "The cat sat on the warm windowsill all afternoon.",
    6: "# Rivers\n\n"
    "Paragraph one of a longer report about rivers, their sources high in the mountains, "
    "the lakes they fill and the towns that grew along their banks over many centuries.\n\n"
    "## Floods\n\n"
    "Paragraph two describes how floods reshape river valleys, moving gravel and silt, "
    "cutting new channels and leaving fertile plains behind when the water recedes.",
    7: "القاهرة هي عاصمة مصر وأكبر مدنها.",
}
PARAPHRASE = "doctor gave medicine to treat germs"  # shares no word with DOCS[1]


class Shared:
    """Wraps the session's real embedder so an Index closing it does not unload it."""

    def __init__(self, inner: Any, on_query: Callable[[str], None] | None = None) -> None:
        self.inner, self.dim, self.on_query = inner, inner.dim, on_query
        self.calls = 0

    def embed_query(self, text: str) -> Any:
        self.calls += 1
        if self.on_query is not None and text != "warm-up":
            self.on_query(text)
        return self.inner.embed_query(text)

    def close(self) -> None:
        pass


@pytest.fixture
def config(tmp_path: Path) -> Config:
    """This module's tests use small chunks."""
    return small_chunks(tmp_path / "library.db")


@pytest.fixture(scope="session")
def model() -> Iterator[Any]:
    """The real default model, loaded once for the whole session."""
    embedder = load(threads=2)
    yield embedder
    embedder.close()


def put(db: Any, item_id: int, text: str, config: Config, embedder: Any = None) -> None:
    """Insert or replace an item and index it the way the worker does."""
    db.execute(
        "INSERT INTO items (id, content) VALUES (?, ?)"
        " ON CONFLICT(id) DO UPDATE SET content = excluded.content",
        (item_id, text),
    )
    result = index_item(db, item_id, config=config, embedder=embedder)
    assert result.outcome == "indexed", result


def build_library(config: Config, model: Any) -> Path:
    """DOCS indexed with dense on and the real model, checkpointed into one file."""
    db = connect(config.db_path)
    update_settings(db, enabled=True)
    for item_id, text in DOCS.items():
        put(db, item_id, text, config, model)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return config.db_path


def small_chunks(db_path: Path) -> Config:
    """Small chunks, so a short document still makes several (citations, item scope)."""
    return Config(
        db_path=db_path,
        model_dir=db_path.parent / "models",
        chunk=ChunkParams(target=40, minimum=8, maximum=64, overlap=0),
    )


@pytest.fixture(scope="module")
def library_file(tmp_path_factory: pytest.TempPathFactory, model: Any) -> Path:
    """Indexed once per module; each test gets a copy (indexing is the slow part)."""
    return build_library(small_chunks(tmp_path_factory.mktemp("lib") / "library.db"), model)


@pytest.fixture
def library(library_file: Path, config: Config) -> Any:
    """A private copy of the indexed library, open."""
    shutil.copy(library_file, config.db_path)
    return open_db(config.db_path)


def open_index(
    config: Config, model: Any, *, on_query: Callable[[str], None] | None = None, **kw: Any
) -> Index:
    """An Index over ``config`` whose query embedder is the session model, warmed up."""
    shared = Shared(model, on_query)
    index = Index(config, embedder_loader=lambda _name: shared, **kw)
    index.warm_up(wait=True, timeout=60)
    return index


@pytest.fixture
def index(library: Any, config: Config, model: Any) -> Iterator[Index]:
    handle = open_index(config, model)
    yield handle
    handle.close()


def keys(result: SearchResult) -> list[str]:
    return [p.chunk_key for p in result.passages]


# --- rankings -------------------------------------------------------------------


def test_dense_only_paraphrase_is_found_with_the_real_model(index: Index) -> None:
    assert [p.item_id for p in index.search(PARAPHRASE, mode="sparse").passages] != [1]
    result = index.search(PARAPHRASE, deadline_ms=5000)
    assert (result.mode, result.reason) == ("hybrid", None)
    top = result.passages[0]
    assert top.item_id == 1 and top.origin == "dense"
    assert top.sparse_rank is None and top.dense_rank == 1
    assert all(p.item_id != 1 for p in index.search(PARAPHRASE, mode="sparse").passages)


def test_keyword_only_match_still_ranks_with_dense_on(index: Index) -> None:
    result = index.search("XQ7731", deadline_ms=5000)
    assert result.mode == "hybrid"
    top = result.passages[0]
    assert top.item_id == 3 and top.sparse_rank == 1 and top.origin in ("sparse", "both")


def test_union_is_deduplicated_by_chunk_key(index: Index) -> None:
    query = "bank interest rates"
    sparse = keys(index.search(query, mode="sparse", limit=50))
    dense = keys(index.search(query, mode="dense", limit=50, deadline_ms=5000))
    hybrid = index.search(query, limit=50, deadline_ms=5000)
    assert len(keys(hybrid)) == len(set(keys(hybrid)))
    assert set(keys(hybrid)) == set(sparse) | set(dense)
    both = [p for p in hybrid.passages if p.origin == "both"]
    assert both and both[0].item_id == 2


def test_origin_ranks_and_scores_agree(index: Index) -> None:
    options = SearchOptions()
    result = index.search("river floods", limit=50, deadline_ms=5000)
    assert result.dense_weight is not None and 0 < result.dense_weight <= options.dense_weight
    sparse = keys(index.search("river floods", mode="sparse", limit=50))
    dense = keys(index.search("river floods", mode="dense", limit=50, deadline_ms=5000))
    for p in result.passages:
        assert p.sparse_rank == (sparse.index(p.chunk_key) + 1 if p.chunk_key in sparse else None)
        assert p.dense_rank == (dense.index(p.chunk_key) + 1 if p.chunk_key in dense else None)
        expected = sum(
            w / (options.rrf_k + r)
            for w, r in (
                (options.sparse_weight, p.sparse_rank),
                (options.dense_weight, p.dense_rank),
            )
            if r is not None
        )
        assert p.score == pytest.approx(expected, abs=1e-7)
        assert (
            p.origin
            == {(True, True): "both", (True, False): "sparse", (False, True): "dense"}[
                (p.sparse_rank is not None, p.dense_rank is not None)
            ]
        )
    assert [p.score for p in result.passages] == sorted(
        (p.score for p in result.passages), reverse=True
    )


def row(key: str, item_id: int, ord_: int) -> _Row:
    return _Row(0, key, item_id, ord_, "", 0, 0, 0, 0, "[]", "feed:x", "sig")


def test_ties_break_by_best_rank_then_item_then_ordinal() -> None:
    a, b, c, d = row("a", 9, 0), row("b", 2, 1), row("c", 2, 0), row("d", 1, 0)
    # a and c: sparse #1 / dense #1 (equal score, equal best rank) → lower item id first.
    # b (sparse #2 + dense #3) vs d (dense #2 + sparse #3): equal score, equal best rank 2
    # → item 1 before item 2.
    fused = fuse([a, b, d], [c, d, b], k=60)
    assert [e.row.chunk_key for e in fused] == ["d", "b", "c", "a"]
    same_item = fuse([row("x", 5, 3)], [row("y", 5, 1)], k=60)
    assert [e.row.chunk_key for e in same_item] == ["y", "x"]


def test_search_is_deterministic(index: Index) -> None:
    first = index.search("the", limit=20, deadline_ms=5000)
    assert all(index.search("the", limit=20, deadline_ms=5000) == first for _ in range(3))


def test_citations_point_into_the_item_source(index: Index, library: Any) -> None:
    result = index.search("river valleys floods report", limit=20, deadline_ms=5000)
    assert len([p for p in result.passages if p.item_id == 6]) > 1
    for p in result.passages:
        source = read_source(library, p.item_id)
        assert source is not None
        assert source.text[p.char_start : p.char_end] == p.text


def test_item_scope_limits_both_sides(index: Index) -> None:
    result = index.search(PARAPHRASE, item_id=6, deadline_ms=5000)
    assert result.mode == "hybrid" and result.passages
    assert {p.item_id for p in result.passages} == {6}
    assert index.search("XQ7731", item_id=4, mode="sparse").passages == []


# --- fallbacks: each reason for real, always the sparse ranking, never raising ---------


def assert_sparse_fallback(result: SearchResult, reason: str, index: Index, query: str) -> None:
    assert (result.mode, result.reason) == ("sparse", reason)
    assert keys(result) == keys(index.search(query, mode="sparse"))
    assert result.passages, "the keyword side still answers"


def test_dense_disabled(index: Index, library: Any) -> None:
    assert index.dense.matrix is not None
    update_settings(library, enabled=False)
    assert_sparse_fallback(index.search("cat windowsill"), "disabled", index, "cat windowsill")
    assert index.dense.matrix is None  # the model and vectors are let go
    update_settings(library, enabled=True)
    assert index.search("cat windowsill").reason == "not_ready"  # and come back on demand
    assert index.warm_up(wait=True, timeout=30)


def test_not_ready_until_warm(library: Any, config: Config, model: Any) -> None:
    gate = threading.Event()

    def slow_loader(_name: str) -> Shared:
        gate.wait(30)
        return Shared(model)

    with Index(config, embedder_loader=slow_loader) as index:
        assert_sparse_fallback(index.search("cat windowsill"), "not_ready", index, "cat windowsill")
        gate.set()
        assert index.warm_up(wait=True, timeout=30)
        assert index.search("cat windowsill", deadline_ms=5000).mode == "hybrid"


def test_warm_up_starts_on_first_search_when_not_at_open(
    library: Any, config: Config, model: Any
) -> None:
    calls: list[str] = []

    def loader(name: str) -> Shared:
        calls.append(name)
        return Shared(model)

    with Index(config, dense_warmup=False, embedder_loader=loader) as index:
        assert index.search("cat", mode="sparse").reason is None and calls == []
        assert index.search("cat").reason == "not_ready"
        assert index.warm_up(wait=True, timeout=30) and calls == ["minilm-l6-int8"]


def test_model_error_at_load_and_at_query(library: Any, config: Config, model: Any) -> None:
    def broken(_name: str) -> Shared:
        raise RuntimeError("no model")

    with Index(config, embedder_loader=broken) as index:
        index.warm_up(wait=True, timeout=30)
        assert_sparse_fallback(
            index.search("cat windowsill"), "model_error", index, "cat windowsill"
        )

    def explode(_text: str) -> None:
        raise RuntimeError("inference failed")

    with open_index(config, model, on_query=explode) as index:
        assert_sparse_fallback(
            index.search("cat windowsill"), "model_error", index, "cat windowsill"
        )


def test_timeout_for_zero_deadline_and_a_stalled_scan(
    library: Any, config: Config, model: Any
) -> None:
    gate, embedded = threading.Event(), []

    def stall(text: str) -> None:
        embedded.append(text)
        gate.wait(30)

    with open_index(config, model, on_query=stall) as index:
        assert_sparse_fallback(index.search("cat", deadline_ms=0), "timeout", index, "cat")
        assert embedded == []  # no time at all: the work is not even started
        assert_sparse_fallback(index.search("cat", deadline_ms=50), "timeout", index, "cat")
        assert embedded == ["cat"]
        gate.set()


def test_saturated_scan_threads_answer_timeout_at_once(
    library: Any, config: Config, model: Any
) -> None:
    gate, embedded = threading.Event(), []
    results: list[SearchResult] = []

    def stall(text: str) -> None:
        embedded.append(text)
        gate.wait(30)

    with open_index(config, model, on_query=stall) as index:
        limit = 2 * index.options.scan_threads  # jobs allowed in flight
        threads = [
            threading.Thread(target=lambda: results.append(index.search("cat", deadline_ms=20_000)))
            for _ in range(limit + 3)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        while len(results) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)  # the rejected ones return without waiting for the gate
        gate.set()
        for thread in threads:
            thread.join(30)
    assert sorted(str(r.reason) for r in results) == ["None"] * limit + ["timeout"] * 3
    assert len(embedded) == limit


def test_dense_candidates_of_another_signature_are_dropped(library: Any) -> None:
    ids = [r[0] for r in library.execute("SELECT id FROM item_chunks")]
    hits = DenseHits(ids, [0.5] * len(ids))
    assert dense_ranking(library, hits, signature="another", pool=100)[0] == []


def test_over_budget_when_the_scan_ceiling_is_exceeded(
    library: Any, config: Config, model: Any
) -> None:
    with open_index(config, model, options=SearchOptions(scan_max_chunks=2)) as index:
        assert_sparse_fallback(
            index.search("cat windowsill"), "over_budget", index, "cat windowsill"
        )
        scoped = index.search("cat windowsill", item_id=5, deadline_ms=5000)
        assert scoped.mode == "hybrid"  # one item's chunks are within the ceiling
    ceiling = count_chunks(library, 6) - 1
    with open_index(config, model, options=SearchOptions(scan_max_chunks=ceiling)) as index:
        scoped = index.search("river floods", item_id=6, deadline_ms=5000)
        assert_sparse_fallback_scoped = scoped.mode, scoped.reason
        assert assert_sparse_fallback_scoped == ("sparse", "over_budget")


@pytest.mark.parametrize(
    "blob", [b"\x00\x01\x02", codec.DTYPE.type(np.nan).tobytes() * MINILM.dim], ids=["short", "nan"]
)
def test_malformed_blob_is_skipped_and_reported(
    library: Any, config: Config, model: Any, blob: bytes
) -> None:
    library.execute("UPDATE item_chunks SET embedding = ? WHERE item_id = 5", (blob,))
    with open_index(config, model) as index:
        result = index.search("cat windowsill", deadline_ms=5000)
        assert (result.mode, result.reason, result.malformed_vectors) == ("hybrid", None, 1)
        assert all(p.dense_rank is None for p in result.passages if p.item_id == 5)
        assert [p.sparse_rank for p in result.passages if p.item_id == 5] == [1]  # keywords
        scoped = index.search("cat windowsill", item_id=5, deadline_ms=5000)
        assert_sparse_fallback(scoped, "malformed_vectors", index, "cat windowsill")
        assert keys(scoped) == keys(index.search("cat windowsill", item_id=5, mode="sparse"))


def test_dense_mode_skips_fts_and_falls_back_when_dense_is_off(index: Index, library: Any) -> None:
    result = index.search("XQ7731", mode="dense", deadline_ms=5000)
    assert result.mode == "dense" and {p.origin for p in result.passages} == {"dense"}
    update_settings(library, enabled=False)
    fallback = index.search("XQ7731", mode="dense")
    assert (fallback.mode, fallback.reason) == ("sparse", "disabled")
    assert fallback.passages[0].item_id == 3


def test_function_form_without_dense_side(library: Any, config: Config) -> None:
    result = search(library, "cat", config=config)
    assert (result.mode, result.reason) == ("sparse", "not_ready")
    assert result.passages[0].item_id == 5


# --- currency ------------------------------------------------------------------------


def test_stale_chunks_are_never_returned(index: Index, library: Any) -> None:
    assert index.search(PARAPHRASE, deadline_ms=5000).passages[0].item_id == 1
    library.execute("UPDATE items SET content = 'Something else entirely.' WHERE id = 1")
    for mode in ("hybrid", "sparse", "dense"):
        query = "physician antibiotics " + PARAPHRASE
        result = index.search(query, mode=mode, deadline_ms=5000)  # type: ignore[arg-type]
        assert all(p.item_id != 1 for p in result.passages), mode


def test_host_hashes_decide_currency(
    index: Index, library: Any, config: Config, model: Any
) -> None:
    library.execute("UPDATE items SET content_hash = 'v1' WHERE id = 5")
    put(library, 5, DOCS[5], config, model)
    assert index.search("windowsill", mode="sparse").passages[0].item_id == 5
    library.execute("UPDATE items SET content_hash = 'v2' WHERE id = 5")  # text unchanged
    assert index.search("windowsill", mode="sparse").passages == []


def test_extracted_source_replaces_the_feed_body(index: Index, library: Any) -> None:
    library.execute("UPDATE items SET source_content = 'Full article text.' WHERE id = 5")
    assert index.search("windowsill", mode="sparse").passages == []
    library.execute("UPDATE items SET source_content = ' \u3000\n' WHERE id = 5")  # blank
    assert index.search("windowsill", mode="sparse").passages[0].item_id == 5


# --- the vector matrix ------------------------------------------------------------------


def test_matrix_follows_inserts_replacements_and_deletions(
    index: Index, library: Any, config: Config, model: Any
) -> None:
    matrix = index.dense.matrix
    chunks = count_chunks(library)
    assert matrix is not None and matrix.size == chunks and count_chunks(library, 6) > 1
    put(library, 8, "Volcanic eruptions spread ash over nearby towns.", config, model)
    result = index.search("volcano ash cloud", mode="dense", deadline_ms=5000)
    assert result.passages[0].item_id == 8 and matrix.size == chunks + 1
    put(library, 6, "A single short paragraph now.", config, model)  # several chunks become one
    index.search("x", mode="dense", deadline_ms=5000)
    assert matrix.size == count_chunks(library)
    library.execute("DELETE FROM items WHERE id = 2")  # cascade: a deletion with no insert
    index.search("x", mode="dense", deadline_ms=5000)
    assert matrix.size == count_chunks(library)
    fresh = VectorMatrix(matrix.signature, matrix.dim)
    fresh.refresh(index.dense._connection())
    assert fresh.size == matrix.size and fresh.malformed() == matrix.malformed() == 0


def count_chunks(db: Any, item_id: int | None = None) -> int:
    where, params = ("WHERE item_id = ?", (item_id,)) if item_id else ("", ())
    return int(db.execute(f"SELECT COUNT(*) FROM item_chunks {where}", params).fetchone()[0])


def test_a_failed_refresh_reloads_instead_of_half_applying(
    index: Index, library: Any, config: Config, model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    matrix = index.dense.matrix
    assert matrix is not None

    def broken(_self: VectorMatrix, _conn: Any) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(VectorMatrix, "_apply_changes", broken)
    put(library, 8, "Volcanic eruptions spread ash over nearby towns.", config, model)
    result = index.search("volcano ash", deadline_ms=5000)
    assert (result.mode, result.reason) == ("sparse", "not_ready") and matrix.size == 0
    monkeypatch.undo()
    assert index.search("volcano ash", deadline_ms=5000).passages[0].item_id == 8
    assert matrix.size == count_chunks(library)


def test_matrix_refresh_is_free_when_nothing_changed(index: Index) -> None:
    matrix = index.dense.matrix
    assert matrix is not None
    assert matrix.refresh(index.dense._connection()) is False


def test_matrix_never_mixes_signatures(index: Index, library: Any, config: Config) -> None:
    library.execute("UPDATE item_chunks SET index_signature = 'old' WHERE item_id = 1")
    matrix = VectorMatrix(dense_target(get_settings(library), config).signature, MINILM.dim)
    matrix.refresh(index.dense._connection())
    assert matrix.size == count_chunks(library) - count_chunks(library, 1)


def test_fake_embedder_side_by_side(db: Any, config: Config) -> None:
    """The dense side with the deterministic fake: a cheap check of the whole path."""
    update_settings(db, enabled=True)
    fake = FakeEmbedder(manifest=MINILM)
    for item_id, text in DOCS.items():
        put(db, item_id, text, config, fake)
    side = DenseSide(config.db_path, config=config, embedder_loader=lambda _n: fake)
    result = search(db, "windowsill", dense=side, config=config, deadline_ms=5000)
    assert result.reason == "not_ready"
    target = dense_target(get_settings(db), config)
    side.warm_up("minilm-l6-int8", target.signature, MINILM.dim).result(timeout=30)
    result = search(db, "windowsill", dense=side, config=config, deadline_ms=5000)
    assert result.mode == "hybrid" and result.passages[0].origin == "both"
    side.close()


# --- signals, privacy, imports ------------------------------------------------------------


def test_script_coverage() -> None:
    latin = frozenset({"LATIN"})
    assert script_coverage("what is a kitten", latin) == 1.0
    assert script_coverage("ما هي عاصمة مصر", latin) == 0.0
    assert script_coverage("Python编程", latin) == pytest.approx(6 / 8)
    assert script_coverage("1234 ?!", latin) == 1.0
    assert script_coverage("ما هي", None) == 1.0


def test_dense_trust_follows_script_and_top_score() -> None:
    assert dense_trust("how long to boil an egg", MINILM, 0.71) == 1.0
    assert dense_trust("XQ7731", MINILM, 0.23) == 0.0  # a flat, low list: no idea
    assert dense_trust("1709 thermometer", MINILM, 0.45) == pytest.approx(0.5)
    assert dense_trust("ما هي عاصمة مصر", MINILM, 0.85) == 0.0  # sure, but cannot read it
    assert dense_trust("ما هي", fake_manifest(), 0.1) == 1.0  # unknown models: full trust


def test_a_query_the_model_cannot_read_keeps_the_keyword_order(index: Index) -> None:
    query = "ما هي عاصمة مصر"
    result = index.search(query, limit=50, deadline_ms=5000)
    assert (result.mode, result.dense_weight) == ("hybrid", 0.0)
    sparse = keys(index.search(query, mode="sparse", limit=50))
    assert sparse and keys(result)[: len(sparse)] == sparse
    dense = index.search(query, mode="dense", deadline_ms=5000)
    assert dense.dense_weight == SearchOptions().dense_weight  # trust only weighs a fusion
    assert all(p.score > 0 for p in dense.passages)


def test_logs_never_contain_the_query(index: Index) -> None:
    secret = "zebracorn-unique-secret"
    with structlog.testing.capture_logs() as logs:
        index.search(secret, deadline_ms=5000)
        index.search(secret, mode="sparse")
    assert secret not in repr(logs)


def test_searching_with_dense_off_imports_no_onnxruntime(tmp_path: Path) -> None:
    code = f"""
import sys
from rinwa_index.index import Index
from rinwa_index.search import search
with Index({str(tmp_path / "x.db")!r}) as index:
    index.conn.execute("INSERT INTO items (id, content) VALUES (1, 'hello world')")
    index.search("hello")
    search(index.conn, "hello")
print('onnxruntime' in sys.modules, 'rinwa_index.embedder' in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_bad_mode_is_a_usage_error(db: Any) -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        search(db, "x", mode="fuzzy")  # type: ignore[arg-type]


def test_nothing_to_match_is_empty_not_an_error(db: Any) -> None:
    assert search(db, '"*^()"').passages == []


# --- the command line ------------------------------------------------------------------


def cli(db_path: Path, *args: str, code: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``rinwa-index --db DB ARGS`` in a fresh process (``code`` runs after it)."""
    script = (
        "import sys\nfrom rinwa_index.cli import main\n"
        f"sys.argv = ['rinwa-index', '--db', {str(db_path)!r}, *{list(args)!r}]\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    status = exc.code\n"
        f"else:\n    status = 0\n{code}\n"
        "sys.exit(status)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def cli_db(tmp_path_factory: pytest.TempPathFactory, model: Any) -> Path:
    """DOCS indexed with the default chunk sizes: the CLI builds its Config from defaults.

    Shared by the CLI tests, which only read it.
    """
    path = tmp_path_factory.mktemp("cli") / "cli.db"
    return build_library(Config(db_path=path, model_dir=path.parent / "models"), model)


def test_cli_search_json_hybrid(cli_db: Path) -> None:
    out = cli(cli_db, "search", PARAPHRASE, "--json", "--limit", "3")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) == {"query", "mode", "reason", "results"}
    assert (data["query"], data["mode"], data["reason"]) == (PARAPHRASE, "hybrid", None)
    assert len(data["results"]) == 3 and data["results"][0]["item_id"] == 1
    assert set(data["results"][0]) == {
        "item_id", "chunk_key", "ord", "text", "score", "origin", "sparse_rank", "dense_rank",
        "char_start", "char_end", "heading_path",
    }  # fmt: skip


def test_cli_sparse_mode_never_loads_the_model(cli_db: Path) -> None:
    probe = "print('onnxruntime' in sys.modules, file=sys.stderr)"
    out = cli(cli_db, "search", "windowsill", "--mode", "sparse", "--json", code=probe)
    assert out.returncode == 0 and out.stderr.strip().endswith("False"), out.stderr
    data = json.loads(out.stdout)
    assert (data["mode"], data["reason"], data["results"][0]["item_id"]) == ("sparse", None, 5)


def test_cli_queries_file_and_explain(cli_db: Path, tmp_path: Path) -> None:
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": "a", "text": "windowsill"}\n\n{"id": 7, "text": "boiler valve"}\n')
    out = cli(cli_db, "search", "--queries", str(queries), "--mode", "dense", "--json")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(d["id"], d["mode"]) for d in lines] == [("a", "dense"), (7, "dense")]
    assert "query" not in lines[0] and lines[1]["results"][0]["item_id"] == 3
    text = cli(cli_db, "search", "windowsill", "--explain", "--mode", "sparse")
    assert "origin=sparse sparse_rank=1 dense_rank=None" in text.stdout


def test_cli_errors(config: Config, tmp_path: Path) -> None:
    assert cli(config.db_path, "search").returncode == 2  # neither QUERY nor --queries
    missing = cli(tmp_path / "nope.db", "search", "x")
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    open_db(config.db_path)
    out = cli(config.db_path, "search", "--queries", str(bad), "--json")
    assert out.returncode == 1 and 'Line 1 of the queries file needs a "text"' in out.stderr

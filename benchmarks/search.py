"""Search latency and memory on synthetic libraries, against baselines from the same run.

    .venv/bin/python benchmarks/search.py [--sizes 10000,100000] [--queries 40] [--json]

For each size a fresh database is filled directly (``executemany``): chunks of
40 words drawn from a Zipf distribution over a 50 000-word vocabulary (so bm25
sees realistic posting lists), 10 chunks per item, and a random unit vector
per chunk under the active signature. Then, warm:

* ``sparse``, ``dense``, ``hybrid`` — :meth:`Index.search` p50/p95 (the query
  embedder is the real default model; the deadline is lifted so slow scans are
  measured, not cut off);
* the parts, measured alone on the same data: query embedding, a plain numpy
  scan (``matrix @ q`` + ``argpartition``) over an identical matrix, and the
  bare FTS5 query (``MATCH … ORDER BY rank LIMIT 100``);
* matrix memory against the raw ``n × dim × 4`` bytes;
* refreshing the matrix after one item is re-indexed (delete + insert) against
  a full reload.

The three default sizes take about 3 minutes on 2 cores and 3.5 GB of RAM
at the peak (the million-chunk matrix twice, for the full-reload timing);
``--sizes 10000,100000`` takes one. On a small shared machine OpenBLAS's
spinning threads distort every timing: ``OPENBLAS_NUM_THREADS=1`` gives
steadier numbers (the value in effect is printed). The last line is one JSON
object keyed by size.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rinwa_index.config import Config  # noqa: E402
from rinwa_index.db import atomic, connect, utcnow  # noqa: E402
from rinwa_index.dense import VectorMatrix  # noqa: E402
from rinwa_index.fts import index_text, match_query  # noqa: E402
from rinwa_index.index import Index  # noqa: E402
from rinwa_index.logs import configure_logging  # noqa: E402
from rinwa_index.search import SearchOptions, dense_target  # noqa: E402
from rinwa_index.settings import get_settings, update_settings  # noqa: E402
from rinwa_index.source import text_hash  # noqa: E402

VOCABULARY = 50_000
WORDS_PER_CHUNK = 40
CHUNKS_PER_ITEM = 10
DIM = 384
BATCH = 20_000


def words(rng: np.random.Generator) -> list[str]:
    """A pronounceable-ish vocabulary; rank 0 is the most frequent word."""
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "de", "po", "an", "el"]
    out = []
    for n in range(VOCABULARY):
        parts, m = [], n + 1
        while m:
            parts.append(syllables[m % len(syllables)])
            m //= len(syllables)
        out.append("".join(parts))
    return out


def zipf_ids(rng: np.random.Generator, size: int) -> np.ndarray:
    """Word ranks with a Zipf(1.1) law, truncated to the vocabulary."""
    ranks = rng.zipf(1.1, size=size * 2)
    ranks = ranks[ranks <= VOCABULARY][:size]
    while len(ranks) < size:  # the tail cut can leave us short
        more = rng.zipf(1.1, size=size)
        ranks = np.concatenate([ranks, more[more <= VOCABULARY]])[:size]
    return ranks - 1


def build(
    path: Path, chunks: int, rng: np.random.Generator, vocab: list[str]
) -> tuple[Config, str]:
    """A database of ``chunks`` sparse- and dense-current chunks; returns its signature."""
    config = Config(db_path=path)
    conn = connect(path)
    update_settings(conn, enabled=True)
    signature = dense_target(get_settings(conn), config).signature
    items = chunks // CHUNKS_PER_ITEM
    with atomic(conn):
        conn.executemany(
            "INSERT INTO items (id, content, content_hash) VALUES (?, ?, ?)",
            [(i, "", f"h{i}") for i in range(1, items + 1)],
        )
    for start in range(0, chunks, BATCH):
        _insert_batch(conn, start, min(BATCH, chunks - start), signature, rng, vocab)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return config, signature


def _insert_batch(
    conn: Any, start: int, count: int, signature: str, rng: np.random.Generator, vocab: list[str]
) -> None:
    ids = zipf_ids(rng, count * WORDS_PER_CHUNK).reshape(count, WORDS_PER_CHUNK)
    vectors = rng.standard_normal((count, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    created = utcnow()
    rows, bodies = [], []
    for n in range(count):
        chunk_id = start + n + 1
        item, ord_ = divmod(start + n, CHUNKS_PER_ITEM)
        text = " ".join(vocab[w] for w in ids[n])
        blob = vectors[n].astype("<f4").tobytes()
        rows.append(
            (chunk_id, f"k{chunk_id}", item + 1, ord_, text, text_hash(text), "feed",
             f"h{item + 1}", signature, blob, DIM, created)
        )  # fmt: skip
        bodies.append((chunk_id, index_text(text)))
    with atomic(conn):
        conn.executemany(
            """INSERT INTO item_chunks (id, chunk_key, item_id, ord, text, text_hash, source_kind,
               source_hash, index_signature, embedding, dim, created_at)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            rows,
        )
        conn.executemany("INSERT INTO chunks_fts (rowid, body) VALUES (?, ?)", bodies)


def queries(rng: np.random.Generator, vocab: list[str], n: int) -> list[str]:
    """Two to four words from ranks 50–5000: neither stop words nor hapaxes."""
    return [
        " ".join(vocab[w] for w in rng.integers(50, 5000, rng.integers(2, 5))) for _ in range(n)
    ]


def timed(fn: Callable[[], Any], runs: list[float]) -> Any:
    """Call ``fn``, append its duration in ms to ``runs``, return its value."""
    start = time.perf_counter()
    value = fn()
    runs.append((time.perf_counter() - start) * 1000)
    return value


def pct(runs: list[float]) -> dict[str, float]:
    """p50 and p95 in milliseconds."""
    ordered = sorted(runs)
    return {
        "p50": round(statistics.median(ordered), 2),
        "p95": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 2),
    }


def measure(size: int, work: Path, n_queries: int, embedder: Any) -> dict[str, Any]:
    """Build one library and measure everything listed in the module docstring."""
    rng = np.random.default_rng(size)
    vocab = words(rng)
    start = time.perf_counter()
    config, signature = build(work / f"lib{size}.db", size, rng, vocab)
    build_s = time.perf_counter() - start
    options = SearchOptions(scan_max_chunks=size + 1)
    qs = queries(rng, vocab, n_queries)
    out: dict[str, Any] = {"chunks": size, "build_s": round(build_s, 1)}
    with Index(config, embedder_loader=lambda _name: embedder, options=options) as index:
        start = time.perf_counter()
        index.warm_up(wait=True, timeout=3600)
        out["warm_up_s"] = round(time.perf_counter() - start, 2)
        matrix = index.dense.matrix
        assert matrix is not None and matrix.size == size
        out.update(_latencies(index, qs, matrix, embedder))
        out["matrix_mb"] = round(matrix.nbytes / 2**20, 1)
        out["raw_vectors_mb"] = round(size * DIM * 4 / 2**20, 1)
        out.update(_refresh(index, signature, rng))
    return out


def _latencies(index: Index, qs: list[str], matrix: VectorMatrix, embedder: Any) -> dict[str, Any]:
    parts = ("sparse", "dense", "hybrid", "embed", "numpy_scan", "fts")
    runs: dict[str, list[float]] = {k: [] for k in parts}
    plain = np.ascontiguousarray(matrix._vecs[: matrix.size])  # the same vectors, no masks
    reasons: set[str | None] = set()
    for q in qs * 2:  # the first pass warms caches; only the second is kept
        for mode in ("sparse", "dense", "hybrid"):
            result = timed(partial(index.search, q, mode=mode, deadline_ms=60_000), runs[mode])
            reasons.add(result.reason)
        vector = timed(lambda q=q: embedder.embed_query(q), runs["embed"])
        timed(lambda v=vector: np.argpartition(-(plain @ v), 100)[:100], runs["numpy_scan"])
        expression = match_query(q)
        timed(
            lambda e=expression: index.conn.execute(
                "SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY rank LIMIT 100",
                (e,),
            ).fetchall(),
            runs["fts"],
        )
    half = {k: v[len(v) // 2 :] for k, v in runs.items()}
    return {**{k: pct(v) for k, v in half.items()}, "reasons": sorted(map(str, reasons))}


def _refresh(index: Index, signature: str, rng: np.random.Generator) -> dict[str, float]:
    """Re-index one item (delete + insert, new ids) and time the incremental refresh."""
    conn, matrix = index.conn, index.dense.matrix
    assert matrix is not None
    rows = conn.execute("SELECT * FROM item_chunks WHERE item_id = 1 ORDER BY ord").fetchall()
    with atomic(conn):
        conn.execute("DELETE FROM item_chunks WHERE item_id = 1")
        for row in rows:
            vector = rng.standard_normal(DIM).astype("<f4")
            values = dict(row) | {"id": None, "chunk_key": row["chunk_key"] + "'"}
            values["embedding"] = (vector / np.linalg.norm(vector)).astype("<f4").tobytes()
            cols = [c for c in values if c != "id"]
            marks = ", ".join("?" * len(cols))
            cur = conn.execute(
                f"INSERT INTO item_chunks ({', '.join(cols)}) VALUES ({marks})",
                [values[c] for c in cols],
            )
            conn.execute("INSERT INTO chunks_fts (rowid, body) VALUES (?, ?)", (cur.lastrowid, ""))
    dense_conn = index.dense._connection()
    start = time.perf_counter()
    changed = matrix.refresh(dense_conn)
    incremental = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    unchanged = matrix.refresh(dense_conn)
    noop = (time.perf_counter() - start) * 1000
    fresh = VectorMatrix(signature, DIM)
    start = time.perf_counter()
    fresh.refresh(dense_conn)
    full = (time.perf_counter() - start) * 1000
    assert changed and not unchanged and fresh.size == matrix.size
    return {"refresh_one_item_ms": round(incremental, 2), "refresh_nothing_ms": round(noop, 3),
            "full_reload_ms": round(full, 1)}  # fmt: skip


class KeepOpen:
    """The one real embedder, shared by every size's Index (which would close it)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.dim = inner, inner.dim

    def embed_query(self, text: str) -> Any:
        return self.inner.embed_query(text)

    def close(self) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    """Measure each size, print a table, then the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    configure_logging(logging.WARNING)
    from rinwa_index.embedder import load

    embedder = KeepOpen(load(threads=2))
    if not args.json:
        print(f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rinwa-search-bench-") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            results[str(size)] = measure(size, Path(tmp), args.queries, embedder)
            if not args.json:
                print_size(results[str(size)])
    print(json.dumps(results, sort_keys=True))
    return 0


def print_size(r: dict[str, Any]) -> None:
    """A human summary of one size, with the ratios that matter."""
    print(f"\n{r['chunks']:,} chunks (built in {r['build_s']} s, warm-up {r['warm_up_s']} s)")
    for key in ("sparse", "dense", "hybrid", "embed", "numpy_scan", "fts"):
        print(f"  {key:<11} p50 {r[key]['p50']:>8.2f} ms   p95 {r[key]['p95']:>8.2f} ms")
    base = r["embed"]["p50"] + r["numpy_scan"]["p50"]
    print(f"  dense p50 / (embed + numpy scan) p50 = {r['dense']['p50'] / base:.2f}")
    print(f"  sparse p50 / bare FTS p50 = {r['sparse']['p50'] / r['fts']['p50']:.2f}")
    print(f"  matrix {r['matrix_mb']} MB for {r['raw_vectors_mb']} MB of raw vectors")
    print(f"  refresh after one item changed {r['refresh_one_item_ms']} ms, nothing changed "
          f"{r['refresh_nothing_ms']} ms, full reload {r['full_reload_ms']} ms")  # fmt: skip
    print(f"  dense reasons seen: {r['reasons']}")


if __name__ == "__main__":
    raise SystemExit(main())

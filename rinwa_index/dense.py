"""The dense side of search: the in-memory vector matrix and its background warm-up.

:class:`VectorMatrix` keeps the vectors of one index signature in memory as a
float32 matrix, so a query never re-reads BLOBs from SQLite. It is refreshed
incrementally, relying on how chunk rows change — the indexer replaces an
item's rows by DELETE + INSERT, and ``item_chunks.id`` is AUTOINCREMENT, so
ids are never reused and every new row has an id above all older ones:

* ``PRAGMA data_version`` (on the matrix's own, read-only connection) is
  unchanged when no other connection committed: a refresh then costs one
  pragma.
* Rows with ``id > max_id`` are the inserts. The items they belong to were
  (re)written: their ids in the table are re-read (by the ``item_id`` index)
  and matrix rows no longer there are dropped.
* Pure deletions (an item deleted, an item emptied) insert nothing: they are
  caught by ``COUNT(*)`` differing from the tracked per-item counts, and then
  a ``GROUP BY item_id`` finds the items to re-read.

Rows updated in place are not seen (the indexer never does that); correctness
does not depend on the matrix anyway, because :func:`rinwa_index.search.search`
re-reads every dense candidate and drops those that are not current. A refresh
that fails half-way clears the matrix, so the next one is a full load.

Measured by ``benchmarks/search.py`` (10k / 100k / 1M chunks of 384
dimensions): nothing changed 0.01 ms; one item re-indexed 0.7 / 1.3 / 17 ms;
a full load 0.13 / 0.8 / 8.8 s; memory 1.07× the raw vectors.

:class:`DenseSide` loads the query embedder and the matrix in a background
thread (never on a request), and runs query embedding + scan on a small
thread pool so the caller can stop waiting at its deadline.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import structlog

from .config import Config
from .db import connect
from .search import (
    DenseHits,
    DenseUnavailable,
    Reason,
    SearchOptions,
)

log = structlog.get_logger("rinwa_index.dense")

Vector = npt.NDArray[np.float32]


class QueryEmbedder(Protocol):
    """What the query path needs of an embedder (``rinwa_index.embedder`` provides it)."""

    dim: int

    def embed_query(self, text: str) -> Vector:
        """One L2-normalised ``(dim,)`` vector for a query."""
        ...

    def close(self) -> None:
        """Release the model."""
        ...


EmbedderLoader = Callable[[str], QueryEmbedder]

_LOAD_BATCH = 20_000  # rows per fetch when loading, bounding the decode's peak memory
_IN_CHUNK = 500  # ids per IN (...) list


class VectorMatrix:
    """The valid vectors of one signature with their chunk and item ids.

    ``ids`` are ascending (rows are appended in id order and compaction keeps
    order), so an id's row is found with :func:`numpy.searchsorted`. Deleted
    rows are masked dead and compacted away once they are a quarter of the rows.
    """

    def __init__(self, signature: str, dim: int) -> None:
        """An empty matrix; call :meth:`refresh` to fill it."""
        self.signature, self.dim = signature, dim
        self._lock = threading.Lock()
        self._clear()

    def _clear(self) -> None:
        """Forget everything: the next refresh is a full load."""
        dim = self.dim
        self._vecs = np.zeros((0, dim), dtype=np.float32)
        self._ids = np.zeros(0, dtype=np.int64)
        self._items = np.zeros(0, dtype=np.int64)
        self._alive = np.zeros(0, dtype=bool)
        self._n = self._live = 0
        self._malformed: dict[int, set[int]] = {}  # item → chunk ids with a bad BLOB
        self._counts: dict[int, int] = {}  # item → item_chunks rows of any signature
        self._total = 0  # sum of _counts: COUNT(*) differing from it means a deletion
        self._max_id = 0
        self._version: int | None = None

    @property
    def size(self) -> int:
        """Valid vectors held."""
        return self._live

    @property
    def nbytes(self) -> int:
        """Memory held by the arrays (capacity included)."""
        return sum(a.nbytes for a in (self._vecs, self._ids, self._items, self._alive))

    def malformed(self, item_id: int | None = None) -> int:
        """Skipped BLOBs in the library, or in one item."""
        if item_id is not None:
            return len(self._malformed.get(item_id, ()))
        return sum(len(ids) for ids in self._malformed.values())

    # --- refresh -----------------------------------------------------------------

    def refresh(self, conn: sqlite3.Connection) -> bool:
        """Bring the matrix up to date with the database; False when nothing changed."""
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        with self._lock:
            if version == self._version:
                return False
            conn.execute("BEGIN")  # one snapshot for every read below
            try:
                if self._version is None:
                    self._load_all(conn)
                else:
                    self._apply_changes(conn)
            except BaseException:
                self._clear()  # a half-applied change must not survive: reload next time
                raise
            finally:
                conn.execute("COMMIT")
            self._version = version
            self._compact_if_sparse()
        return True

    def _load_all(self, conn: sqlite3.Connection) -> None:
        self._counts = dict(conn.execute("SELECT item_id, COUNT(*) FROM item_chunks GROUP BY 1"))
        self._total = sum(self._counts.values())
        self._max_id = conn.execute("SELECT COALESCE(MAX(id), 0) FROM item_chunks").fetchone()[0]
        where = "WHERE index_signature = ? AND embedding IS NOT NULL"
        expected = conn.execute(f"SELECT COUNT(*) FROM item_chunks {where}", (self.signature,))
        count = expected.fetchone()[0]  # cheap: the BLOBs' overflow pages are not read
        self._resize(np.arange(self._n), count + max(1024, count // 16))  # room to change
        cursor = conn.execute(
            f"SELECT id, item_id, dim, embedding FROM item_chunks {where} ORDER BY id",
            (self.signature,),
        )
        while batch := cursor.fetchmany(_LOAD_BATCH):
            self._append(batch)

    def _apply_changes(self, conn: sqlite3.Connection) -> None:
        cursor = conn.execute(
            "SELECT id, item_id, dim, CASE WHEN index_signature = ? THEN embedding END"
            " FROM item_chunks WHERE id > ? ORDER BY id",
            (self.signature, self._max_id),
        )
        while new := cursor.fetchmany(_LOAD_BATCH):  # inserts: their items were rewritten
            self._max_id = new[-1][0]
            self._reconcile(conn, {row[1] for row in new})
            self._append([row for row in new if row[3] is not None])
        total = conn.execute("SELECT COUNT(*) FROM item_chunks").fetchone()[0]
        if total != self._total:  # a deletion that inserted nothing (an item deleted)
            counts = dict(conn.execute("SELECT item_id, COUNT(*) FROM item_chunks GROUP BY 1"))
            everyone = self._counts.keys() | counts.keys()
            self._reconcile(conn, {i for i in everyone if counts.get(i) != self._counts.get(i)})

    def _reconcile(self, conn: sqlite3.Connection, items: Iterable[int]) -> None:
        """Re-read which chunk ids ``items`` have and drop matrix rows that are gone."""
        items = sorted(items)
        present: set[int] = set()
        for start in range(0, len(items), _IN_CHUNK):
            part = items[start : start + _IN_CHUNK]
            marks = ",".join("?" * len(part))
            rows = conn.execute(
                f"SELECT item_id, id FROM item_chunks WHERE item_id IN ({marks})", part
            ).fetchall()
            present.update(chunk_id for _, chunk_id in rows)
            for item in part:
                self._total -= self._counts.pop(item, 0)
            for item, _ in rows:
                self._counts[item] = self._counts.get(item, 0) + 1
            self._total += len(rows)
        n = self._n
        held = np.flatnonzero(np.isin(self._items[:n], items) & self._alive[:n])
        gone = held[~np.isin(self._ids[held], np.fromiter(present, np.int64, len(present)))]
        self._alive[gone] = False
        self._live -= len(gone)
        for item in items:
            bad = self._malformed.pop(item, set()) & present
            if bad:
                self._malformed[item] = bad

    def _append(self, rows: list[Any]) -> None:
        """Decode and append ``(id, item_id, dim, blob)`` rows; bad BLOBs are counted."""
        size = self.dim * 4
        fits = [r for r in rows if r[2] == self.dim and r[3] is not None and len(r[3]) == size]
        for r in rows:
            if not (r[2] == self.dim and r[3] is not None and len(r[3]) == size):
                self._malformed.setdefault(r[1], set()).add(r[0])
        if not fits:
            return
        vecs = np.frombuffer(b"".join(r[3] for r in fits), dtype="<f4").reshape(-1, self.dim)
        vecs = vecs.astype(np.float32)
        norms = np.linalg.norm(vecs, axis=1)
        good = np.isfinite(vecs).all(axis=1) & np.isfinite(norms) & (norms > 0)
        for r, ok in zip(fits, good, strict=True):
            if not ok:
                self._malformed.setdefault(r[1], set()).add(r[0])
        ids = np.array([r[0] for r, ok in zip(fits, good, strict=True) if ok], dtype=np.int64)
        items = np.array([r[1] for r, ok in zip(fits, good, strict=True) if ok], dtype=np.int64)
        self._grow(len(ids))
        n, m = self._n, len(ids)
        self._vecs[n : n + m] = vecs[good] / norms[good, None]
        self._ids[n : n + m], self._items[n : n + m] = ids, items
        self._alive[n : n + m] = True
        self._n, self._live = n + m, self._live + m

    def _grow(self, extra: int) -> None:
        """Ensure room for ``extra`` rows; new arrays, so running scans keep theirs intact."""
        if self._n + extra <= len(self._ids):
            return
        capacity = max(self._n + extra, int(len(self._ids) * 1.5) + 1024)
        self._resize(np.arange(self._n), capacity)

    def _compact_if_sparse(self) -> None:
        dead = self._n - self._live
        if dead > 1024 and dead * 4 > self._n:
            self._resize(np.flatnonzero(self._alive[: self._n]), self._live + 1024)

    def _resize(self, keep: npt.NDArray[np.intp], capacity: int) -> None:
        vecs = np.zeros((capacity, self.dim), dtype=np.float32)
        ids = np.zeros(capacity, dtype=np.int64)
        items = np.zeros(capacity, dtype=np.int64)
        alive = np.zeros(capacity, dtype=bool)
        m = len(keep)
        vecs[:m], ids[:m], items[:m], alive[:m] = (
            self._vecs[keep], self._ids[keep], self._items[keep], self._alive[keep]
        )  # fmt: skip
        self._vecs, self._ids, self._items, self._alive = vecs, ids, items, alive
        self._n = m

    # --- scan ------------------------------------------------------------------

    def scan(self, query: Vector, *, item_id: int | None, want: int, max_chunks: int) -> DenseHits:
        """The ``want`` best chunk ids by cosine, over every valid vector in scope."""
        with self._lock:  # a consistent snapshot; the scan itself runs unlocked
            n, vecs, ids, alive = self._n, self._vecs, self._ids, self._alive
            rows = None
            if item_id is not None:
                rows = np.flatnonzero((self._items[:n] == item_id) & alive[:n])
            count = self._live if rows is None else len(rows)
            malformed = self.malformed(item_id)
        if count > max_chunks:
            raise DenseUnavailable("over_budget")
        if count == 0:
            raise DenseUnavailable("malformed_vectors" if malformed else "not_ready")
        if rows is None:
            scores = vecs[:n] @ query
            scores[~alive[:n]] = -np.inf
            chunk_ids = ids[:n]
        else:
            scores, chunk_ids = vecs[rows] @ query, ids[rows]
        top = _top(scores, chunk_ids, min(want, count))
        return DenseHits(
            chunk_ids[top].tolist(), scores[top].tolist(), scanned=count, malformed=malformed
        )


def _top(scores: Vector, ids: npt.NDArray[np.int64], k: int) -> npt.NDArray[np.intp]:
    """Indices of the ``k`` best finite scores, best first; ties by lower chunk id."""
    if k <= 0:
        return np.zeros(0, dtype=np.intp)
    part = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    order = part[np.lexsort((ids[part], -scores[part]))]
    return order[np.isfinite(scores[order])]


class DenseSide:
    """The warm query embedder, the vector matrix and the scan threads of one database.

    Nothing here blocks a request: loading happens on a background thread
    (:meth:`warm_up`), and :meth:`submit` either hands back a future or a
    reason (``not_ready`` while loading, ``model_error`` for a while after a
    failed load, ``timeout`` when the scan threads are saturated).
    """

    def __init__(
        self,
        db_path: str | Path,
        *,
        config: Config,
        options: SearchOptions | None = None,
        embedder_loader: EmbedderLoader | None = None,
        retry_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Nothing is loaded yet; see :meth:`warm_up`."""
        self.db_path, self.config = Path(db_path), config
        self.options = options or SearchOptions()
        self._loader = embedder_loader or _default_loader(config)
        self._retry_after_s, self._clock = retry_after_s, clock
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._conn_lock = threading.Lock()
        self._embedder: tuple[str, QueryEmbedder] | None = None
        self._matrix: VectorMatrix | None = None
        self._warming: Future[None] | None = None
        self._failed: tuple[str, float] | None = None
        self._inflight = 0
        self._pool = ThreadPoolExecutor(self.options.scan_threads, thread_name_prefix="rinwa-scan")

    @property
    def matrix(self) -> VectorMatrix | None:
        """The loaded matrix (None before warm-up), for diagnostics and benchmarks."""
        return self._matrix

    def is_warm(self, model: str, signature: str) -> bool:
        """True when the embedder of ``model`` and the matrix of ``signature`` are loaded."""
        emb, matrix = self._embedder, self._matrix
        loaded = emb is not None and emb[0] == model
        return loaded and matrix is not None and matrix.signature == signature

    def warm_up(self, model: str, signature: str, dim: int) -> Future[None]:
        """Load what is missing on a background thread (single flight); returns its future."""
        with self._lock:
            if self._warming is not None and not self._warming.done():
                return self._warming
            self._failed = None
            future: Future[None] = Future()
            self._warming = future
        thread = threading.Thread(
            target=self._warm, args=(model, signature, dim, future), name="rinwa-warm", daemon=True
        )
        thread.start()
        return future

    def _warm(self, model: str, signature: str, dim: int, future: Future[None]) -> None:
        start = time.perf_counter()
        try:
            if self._embedder is None or self._embedder[0] != model:
                self._swap_embedder(None)
                embedder = self._loader(model)
                embedder.embed_query("warm-up")  # the first run allocates; pay it here
                self._swap_embedder((model, embedder))
            if self._matrix is None or self._matrix.signature != signature:
                matrix = VectorMatrix(signature, dim)
                with self._conn_lock:
                    matrix.refresh(self._connection())
                self._matrix = matrix
        except Exception as exc:
            with self._lock:
                self._failed = (model, self._clock())
            log.warning("dense.warm_failed", error=type(exc).__name__)
            future.set_exception(exc)
            return
        log.info("dense.warm", vectors=self._matrix.size if self._matrix else 0, ms=_ms(start))
        future.set_result(None)

    def _swap_embedder(self, new: tuple[str, QueryEmbedder] | None) -> None:
        with self._lock:
            old, self._embedder = self._embedder, new
        if old is not None:
            old[1].close()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = connect(self.db_path, busy_timeout_ms=self.config.busy_timeout_ms)
        return self._conn

    def submit(
        self, query: str, *, model: str, signature: str, dim: int, item_id: int | None, want: int
    ) -> Future[DenseHits] | Reason:
        """Start the dense job for ``query``, or return why dense cannot answer now."""
        with self._lock:
            failed = self._failed
        recent = failed is not None and self._clock() - failed[1] < self._retry_after_s
        if recent and failed is not None and failed[0] == model:
            return "model_error"
        if not self.is_warm(model, signature):
            self.warm_up(model, signature, dim)
            return "not_ready"
        matrix, embedder = self._matrix, self._embedder
        assert matrix is not None and embedder is not None  # is_warm checked both
        if item_id is None and matrix.size > self.options.scan_max_chunks:
            return "over_budget"  # known before any work
        with self._lock:
            if self._inflight >= 2 * self.options.scan_threads:
                return "timeout"  # earlier scans are still running: this one would be late
            self._inflight += 1
        future = self._pool.submit(self._job, query, embedder[1], matrix, item_id, want)
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future: Future[DenseHits]) -> None:
        with self._lock:
            self._inflight -= 1

    def _job(
        self,
        query: str,
        embedder: QueryEmbedder,
        matrix: VectorMatrix,
        item_id: int | None,
        want: int,
    ) -> DenseHits:
        try:
            vector = np.asarray(embedder.embed_query(query), dtype=np.float32)
        except Exception as exc:
            log.warning("dense.embed_failed", error=type(exc).__name__)
            raise DenseUnavailable("model_error") from exc
        norm = float(np.linalg.norm(vector)) if vector.shape == (matrix.dim,) else 0.0
        if not np.isfinite(norm) or norm == 0:
            raise DenseUnavailable("model_error")
        try:
            with self._conn_lock:
                matrix.refresh(self._connection())
        except sqlite3.Error as exc:  # rows are re-checked at fetch: a lagging matrix is safe
            log.warning("dense.refresh_failed", error=type(exc).__name__)
        return matrix.scan(
            vector / norm, item_id=item_id, want=want, max_chunks=self.options.scan_max_chunks
        )

    def release(self) -> None:
        """Drop the model and the matrix (dense was disabled); a later warm-up reloads them."""
        if self._embedder is not None or self._matrix is not None:
            self._swap_embedder(None)
            self._matrix = None
            log.info("dense.released")

    def close(self) -> None:
        """Stop the scan threads and release the model and the connection."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._swap_embedder(None)
        with self._conn_lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _default_loader(config: Config) -> EmbedderLoader:
    def load(model: str) -> QueryEmbedder:
        from .embedder import load as load_embedder  # ONNX Runtime only once dense is on

        return load_embedder(model, model_dir=config.model_dir, threads=config.intra_op_threads)

    return load


def _ms(start: float) -> int:
    return int((time.perf_counter() - start) * 1000)

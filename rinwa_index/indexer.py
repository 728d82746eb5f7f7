"""Index one item: select → chunk → reuse cached vectors → embed the rest → recheck → swap.

The expensive part (embedding) runs outside any transaction, in bounded
batches, asking ``should_stop`` between batches. Then one ``BEGIN IMMEDIATE``
transaction re-reads the item's source and the active settings: if anything
changed, nothing is written and the item is released for another pass;
otherwise the item's chunk rows, FTS rows, cache rows and state row are
replaced and its outbox row deleted, all at once. Until that commit the
previous index stays visible, and any failure leaves it intact.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from . import codec, fts, outbox
from .config import Config
from .db import atomic, utcnow
from .errors import ChunkingError, ItemError, ModelError, RinwaError
from .models import Manifest, get_manifest
from .settings import get_settings
from .signature import Signature, build_signature
from .source import Source, read_source, text_hash

if TYPE_CHECKING:
    from .chunking import Chunk, Chunker
    from .embedder import Embedder

Outcome = Literal["indexed", "skipped", "deleted", "requeued"]


class Cancelled(RinwaError):
    """The job stopped between batches: the worker is stopping or settings changed."""


@dataclass(frozen=True)
class IndexResult:
    """What one job did, for logs, tests and benchmarks."""

    item_id: int
    outcome: Outcome
    chunks: int = 0
    embedded: int = 0
    reused: int = 0
    ms: int = 0
    reason: str = ""


@dataclass(frozen=True)
class Plan:
    """The inputs a job read before its slow part; the recheck compares them."""

    source: Source
    manifest: Manifest
    signature: Signature
    dense: bool
    seq: int | None


@dataclass
class _Work:
    """One item between its plan and its swap."""

    plan: Plan
    chunks: list[Chunk]
    hashes: list[str]
    cached: dict[str, bytes]
    seconds: float  # time spent on this item so far (its share of shared embedding included)
    embedded: dict[str, bytes] = field(default_factory=dict)

    def fill(self, blobs: dict[str, bytes], seconds: float) -> None:
        """Take this item's newly embedded vectors and its share of the embedding time."""
        for digest in self.embedded:
            self.embedded[digest] = blobs[digest]
        self.seconds += seconds

    def vectors(self) -> list[bytes | None]:
        """One BLOB per chunk (None with dense off)."""
        if not self.plan.dense:
            return [None] * len(self.chunks)
        found = {**self.cached, **self.embedded}
        return [found.get(digest) for digest in self.hashes]

    def ms(self, since: float) -> int:
        """Milliseconds this item cost: its own work plus its share of the batches."""
        return int((self.seconds + time.perf_counter() - since) * 1000)


@dataclass
class Indexer:
    """Indexes items of one database; keeps one chunker per signature.

    ``embedder_for(manifest)`` supplies the embedding runtime for the active
    model (the worker loads it once); with dense search off it is never called.
    """

    conn: sqlite3.Connection
    config: Config
    embedder_for: Callable[[Manifest], Embedder] | None = None
    should_stop: Callable[[], bool] = lambda: False
    #: Fault-injection seam: called inside the swap transaction, after the writes.
    in_swap: Callable[[int], None] | None = None
    _chunkers: dict[str, Chunker] = field(default_factory=dict)  # cache: one per signature

    def plan(self, item_id: int) -> Plan | None:
        """Read the source, the active signature and the outbox seq (None: item gone)."""
        source = read_source(self.conn, item_id)
        if source is None:
            return None
        settings = get_settings(self.conn)
        manifest = get_manifest(settings.model, self.config.model_dir)
        signature = build_signature(manifest, self.config.chunk)
        seq = outbox.outbox_seq(self.conn, item_id)
        return Plan(source, manifest, signature, settings.enabled, seq)

    def index_item(self, item_id: int) -> IndexResult:
        """Make ``item_id`` current, or report why not; raises on failures."""
        outcome = self.index_items([item_id])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def index_items(self, item_ids: Sequence[int]) -> list[IndexResult | Exception]:
        """Index several items, embedding their missing chunks in shared batches.

        Each item is still swapped in its own transaction after its own
        recheck. A per-item error (bad input while chunking) is returned in
        that item's place; an error of the shared embedding raises, and the
        worker then retries the items one by one to find the culprit.
        """
        outcomes: dict[int, IndexResult | Exception] = {}
        work: list[_Work] = []
        for item_id in item_ids:
            start = time.perf_counter()
            try:
                prepared = self._prepare(item_id, start)
            except (ChunkingError, ItemError, UnicodeError) as exc:
                outcomes[item_id] = exc
                continue
            if isinstance(prepared, IndexResult):
                outcomes[item_id] = prepared
            else:
                work.append(prepared)
        self._embed_missing(work)
        for job in work:
            outcomes[job.plan.source.item_id] = self._finish(job)
        return [outcomes[item_id] for item_id in item_ids]

    def _prepare(self, item_id: int, start: float) -> _Work | IndexResult:
        """Plan and chunk one item, taking what the vector cache already has."""
        plan = self.plan(item_id)
        if plan is None:
            return self._delete(item_id, start)
        if self._is_current(plan):
            with atomic(self.conn):
                outbox.complete(self.conn, item_id, plan.seq)
            return IndexResult(item_id, "skipped", ms=_ms(start), reason="current")
        chunks = self._chunker(plan).chunk(plan.source.text)
        hashes = [text_hash(c.text) for c in chunks]
        cached = self._cached(plan.signature.hash, hashes, plan.signature.dim) if plan.dense else {}
        return _Work(plan, chunks, hashes, cached, time.perf_counter() - start)

    def _finish(self, job: _Work) -> IndexResult:
        """Swap one prepared item in (or release it when something changed)."""
        start = time.perf_counter()
        item_id, count = job.plan.source.item_id, len(job.chunks)
        vectors = job.vectors()
        if job.plan.dense and None in vectors:  # planned under other settings than its group
            outbox.release(self.conn, item_id, now=time.time())
            return IndexResult(item_id, "requeued", ms=job.ms(start), reason="settings_changed")
        if not self._swap(job.plan, job.chunks, vectors, job.embedded):
            outbox.release(self.conn, item_id, now=time.time())
            return IndexResult(item_id, "requeued", ms=job.ms(start), reason="changed")
        reused = count - len(job.embedded) if job.plan.dense else 0
        return IndexResult(item_id, "indexed", count, len(job.embedded), reused, job.ms(start))

    # --- reading -------------------------------------------------------------

    def _is_current(self, plan: Plan) -> bool:
        row = self.conn.execute(
            "SELECT source_kind, source_hash, signature, dense FROM item_index_state"
            " WHERE item_id = ?",
            (plan.source.item_id,),
        ).fetchone()
        return row is not None and tuple(row) == (
            plan.source.kind,
            plan.source.hash,
            plan.signature.hash,
            int(plan.dense),
        )

    def _chunker(self, plan: Plan) -> Chunker:
        from .chunking import chunker_for

        key = plan.signature.hash
        if key not in self._chunkers:
            self._chunkers[key] = chunker_for(
                plan.manifest, self.config.chunk, self.config.model_dir
            )
        return self._chunkers[key]

    def _cached(self, signature: str, hashes: Sequence[str], dim: int) -> dict[str, bytes]:
        """Valid cached vectors by text hash (a malformed cache row is re-embedded)."""
        found: dict[str, bytes] = {}
        unique = sorted(set(hashes))
        for start in range(0, len(unique), 500):
            part = unique[start : start + 500]
            marks = ",".join("?" * len(part))
            for digest, blob in self.conn.execute(
                f"SELECT text_hash, embedding FROM embedding_cache"
                f" WHERE signature = ? AND text_hash IN ({marks})",
                (signature, *part),
            ):
                try:
                    codec.decode(blob, dim)
                except RinwaError:
                    continue
                found[digest] = bytes(blob)
        return found

    # --- embedding (outside any transaction) ---------------------------------

    def _embed_missing(self, work: list[_Work]) -> None:
        """Embed every chunk no cache holds, once per distinct text, in shared batches."""
        dense = [job for job in work if job.plan.dense]
        if not dense:
            return
        plan = dense[0].plan
        todo: dict[str, Chunk] = {}
        for job in dense:
            if job.plan.signature.hash != plan.signature.hash:
                continue  # settings changed between plans: its recheck will release it
            for digest, chunk in zip(job.hashes, job.chunks, strict=True):
                if digest not in job.cached and digest not in todo:
                    todo[digest] = chunk
                    job.embedded[digest] = b""  # this item pays for (and logs) the embedding
        if not todo:
            return
        start = time.perf_counter()
        blobs = self._embed(plan, list(todo.items()))
        seconds = time.perf_counter() - start
        for job in dense:
            job.fill(blobs, seconds * len(job.embedded) / len(todo))

    def _embed(self, plan: Plan, todo: list[tuple[str, Chunk]]) -> dict[str, bytes]:
        if self.embedder_for is None:
            raise ModelError("Dense search is on but this indexer has no embedding model.")
        embedder = self.embedder_for(plan.manifest)
        out: dict[str, bytes] = {}
        size = min(plan.manifest.batch_size, self.config.embed_batch_size)
        budget = min(plan.manifest.batch_tokens, self.config.embed_batch_tokens)
        for batch in _batches(todo, size, budget):
            self._check_still_wanted(plan)
            vectors = embedder.embed_documents([c.text for _, c in batch])
            for (digest, _), vector in zip(batch, vectors, strict=True):
                out[digest] = codec.encode(vector, plan.signature.dim)
        return out

    def _check_still_wanted(self, plan: Plan) -> None:
        """Between batches: stop for a worker shutdown or a settings change."""
        if self.should_stop():
            raise Cancelled("The worker is stopping; the item stays in the outbox.")
        settings = get_settings(self.conn)
        if not settings.enabled or settings.model != plan.manifest.name:
            raise Cancelled("Dense settings changed while embedding; results discarded.")

    # --- the swap ------------------------------------------------------------

    def _swap(
        self,
        plan: Plan,
        chunks: list[Chunk],
        vectors: list[bytes | None],
        embedded: dict[str, bytes],
    ) -> bool:
        """Recheck fingerprints and replace the item's rows in one transaction."""
        item_id = plan.source.item_id
        with atomic(self.conn):
            current = self.plan(item_id)
            if current is None or (current.source, current.signature.hash, current.dense) != (
                plan.source,
                plan.signature.hash,
                plan.dense,
            ):
                return False
            self.conn.execute("DELETE FROM item_chunks WHERE item_id = ?", (item_id,))
            self._insert_chunks(plan, chunks, vectors)
            self._store_cache(plan, embedded, vectors)
            self._store_state(plan, len(chunks))
            outbox.complete(self.conn, item_id, plan.seq)
            if self.in_swap is not None:
                self.in_swap(item_id)  # every write done, nothing committed yet
        return True

    def _insert_chunks(self, plan: Plan, chunks: list[Chunk], vectors: list[bytes | None]) -> None:
        from .chunking import chunk_key

        source, signature, created = plan.source, plan.signature, utcnow()
        for chunk, blob in zip(chunks, vectors, strict=True):
            cursor = self.conn.execute(
                """INSERT INTO item_chunks (chunk_key, item_id, ord, text, text_hash,
                     token_count, source_kind, source_hash, index_signature, paragraph_start,
                     paragraph_end, char_start, char_end, heading_path_json, embedding, dim,
                     created_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (
                    chunk_key(source.item_id, source.kind, source.hash, signature.hash, chunk.ord),
                    source.item_id, chunk.ord, chunk.text, text_hash(chunk.text),
                    chunk.token_count, source.kind, source.hash, signature.hash,
                    chunk.paragraph_start, chunk.paragraph_end, chunk.char_start, chunk.char_end,
                    json.dumps(list(chunk.heading_path), ensure_ascii=False), blob,
                    signature.dim if blob is not None else 0, created,
                ),
            )  # fmt: skip
            self.conn.execute(
                "INSERT INTO chunks_fts (rowid, body) VALUES (?, ?)",
                (cursor.lastrowid, fts.index_text(chunk.text)),
            )

    def _store_cache(
        self, plan: Plan, embedded: dict[str, bytes], vectors: list[bytes | None]
    ) -> None:
        now, created, signature = time.time(), utcnow(), plan.signature
        self.conn.executemany(
            """INSERT OR REPLACE INTO embedding_cache
               (text_hash, signature, embedding, dim, created_at, last_used_at)
               VALUES (?, ?, ?, ?, ?, ?)""",
            [(h, signature.hash, b, signature.dim, created, now) for h, b in embedded.items()],
        )
        if any(v is not None for v in vectors):
            self.conn.execute(
                """UPDATE embedding_cache SET last_used_at = ?
                   WHERE signature = ? AND text_hash IN
                     (SELECT text_hash FROM item_chunks WHERE item_id = ?)""",
                (now, signature.hash, plan.source.item_id),
            )

    def _store_state(self, plan: Plan, count: int) -> None:
        self.conn.execute(
            """INSERT OR REPLACE INTO item_index_state
               (item_id, source_kind, source_hash, signature, dense, chunks, indexed_at)
               VALUES (?, ?, ?, ?, ?, ?, ?)""",
            (
                plan.source.item_id, plan.source.kind, plan.source.hash, plan.signature.hash,
                int(plan.dense), count, time.time(),
            ),
        )  # fmt: skip

    def _delete(self, item_id: int, start: float) -> IndexResult:
        """The item is gone: drop its chunks, FTS rows (trigger), state and outbox row."""
        with atomic(self.conn):
            if read_source(self.conn, item_id) is not None:  # re-created meanwhile
                outbox.complete(self.conn, item_id, None)
                return IndexResult(item_id, "requeued", ms=_ms(start), reason="recreated")
            removed = self.conn.execute(
                "DELETE FROM item_chunks WHERE item_id = ?", (item_id,)
            ).rowcount
            self.conn.execute("DELETE FROM item_index_state WHERE item_id = ?", (item_id,))
            self.conn.execute("DELETE FROM index_outbox WHERE item_id = ?", (item_id,))
        return IndexResult(item_id, "deleted", chunks=removed, ms=_ms(start))


def collect_garbage(conn: sqlite3.Connection, max_rows: int) -> int:
    """Bound the vector cache: drop the least recently used rows beyond ``max_rows``."""
    total = conn.execute("SELECT COUNT(*) FROM embedding_cache").fetchone()[0]
    if total <= max_rows:
        return 0
    with atomic(conn):
        return conn.execute(
            """DELETE FROM embedding_cache WHERE (text_hash, signature) IN (
                 SELECT text_hash, signature FROM embedding_cache
                 ORDER BY last_used_at LIMIT ?)""",
            (total - max_rows,),
        ).rowcount


def index_item(
    conn: sqlite3.Connection, item_id: int, *, config: Config, embedder: Embedder | None = None
) -> IndexResult:
    """Index one item now (tests, tools); the worker uses a long-lived :class:`Indexer`."""
    provider = None if embedder is None else (lambda _manifest: embedder)
    return Indexer(conn, config, embedder_for=provider).index_item(item_id)


def _batches(
    todo: list[tuple[str, Chunk]], size: int, token_budget: int
) -> list[list[tuple[str, Chunk]]]:
    """Length-sorted batches bounded by count and padded tokens (the embedder's own plan)."""
    from .embedder import plan_batches

    lengths = [max(chunk.token_count, 1) for _, chunk in todo]
    return [[todo[i] for i in batch] for batch in plan_batches(lengths, size, token_budget)]


def _ms(start: float) -> int:
    return int((time.perf_counter() - start) * 1000)

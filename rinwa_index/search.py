"""The query module: sparse (FTS5/bm25) and dense (cosine) rankings fused with RRF.

:func:`search` ranks the passages of the current index for a query, in the
whole library or in one item:

1. **Sparse** — FTS5 over chunks whose ``source_kind``/``source_hash`` equal
   the item's canonical source right now (stale chunks are never returned);
   the query only reaches MATCH through :func:`rinwa_index.fts.match_query`.
2. **Dense** — only when dense search is enabled and the query embedder is
   already warm: a :class:`DenseSide` (see :mod:`rinwa_index.dense`) embeds
   the query and scans *all* current vectors in scope in a worker thread,
   never just the FTS candidates. The request thread waits at most until the
   deadline.
3. **Fusion** — reciprocal rank fusion keyed by ``chunk_key``, with the
   weights of :class:`SearchOptions` (why those values: see its docstring).
4. Any trouble on the dense side returns the sparse ranking with a ``reason``.
   Search never raises because of the embedding side.

This module imports no ONNX code, nor the indexer, outbox or worker (an
import-linter contract in ``pyproject.toml`` checks it).
"""

from __future__ import annotations

import json
import sqlite3
import time
import unicodedata
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol

import structlog

from . import fts
from .config import ChunkParams, Config
from .db import register_functions
from .errors import RinwaError
from .models import Manifest, get_manifest
from .settings import EmbeddingSettings, get_settings
from .signature import build_signature
from .source import SOURCE_KEY_SQL

Mode = Literal["hybrid", "sparse", "dense"]
Origin = Literal["sparse", "dense", "both"]
Reason = Literal[
    "disabled", "not_ready", "model_error", "timeout", "over_budget", "malformed_vectors"
]
MODES: tuple[str, ...] = ("hybrid", "sparse", "dense")

log = structlog.get_logger("rinwa_index.search")


@dataclass(frozen=True)
class ModelTrust:
    """What is known about when a model's dense ranking deserves weight.

    ``scripts``: the Unicode scripts its training covered (None: all).
    ``unsure``/``sure``: top cosine scores between which trust ramps from 0
    to 1 — a model that finds nothing close to the query (an identifier, a
    part number, a word it never saw) returns a flat, low list.
    """

    scripts: frozenset[str] | None = None
    unsure: float = -1.0
    sure: float = -1.0


#: all-MiniLM-L6-v2 was trained on English only: an Arabic query gets a
#: near-random vector (arcd: dense nDCG@10 0.06 against bm25 0.70), yet its
#: top cosines look confident (0.66–0.88), so the script is the signal there.
#: Its top cosine over msmarco's 5000 passages was 0.58–0.91 for the 43 judged
#: natural-language questions, but 0.19–0.38 for identifiers ("XQ7731",
#: "B00KX2ZT4Q", "SQLITE_BUSY", "ISO 8601"). Unlisted models are trusted fully.
MODEL_TRUST: dict[str, ModelTrust] = {
    "minilm-l6-int8": ModelTrust(frozenset({"LATIN"}), unsure=0.35, sure=0.55),
}


@dataclass(frozen=True)
class SearchOptions:
    """How rankings are produced and fused; the defaults are the tuned configuration.

    Fusion is weighted RRF: Σ wᵢ / (k + rankᵢ) over lists cut at ``pool``,
    with w_sparse = ``sparse_weight`` and w_dense = ``dense_weight`` × the
    query's :func:`dense_trust` (script coverage × top-score confidence).

    Measured with ``benchmarks/quality.py`` (items indexed by the real
    chunker and model; nDCG@10, 43 msmarco / 50 arcd queries):

    =================================  =======  =====
    configuration                      msmarco  arcd
    =================================  =======  =====
    sparse alone                       0.689    0.704
    dense alone                        0.798    0.064
    plain RRF, k=60, lists of 100      0.782    0.407
    plain RRF, k=60, lists of 20       0.775    0.531
    dense ×2, k=20, no trust signal    0.795    0.212
    the same + trust (these defaults)  0.795    0.704
    =================================  =======  =====

    Plain RRF loses to the better ranker on both sets: on msmarco bm25 drags
    dense's better order down, on arcd a useless dense list halves bm25's.
    Weighting dense ×2 with k=20 keeps msmarco within 0.003 of dense (the
    neighbourhood k∈[15,30], w∈[2,3] scored 0.792–0.804, so this is not a
    lucky point); the script coverage gives arcd's Arabic queries exactly
    bm25's order (hybrid = sparse, Recall@100 0.90 for both). The top-score
    confidence changes no query of either set (every msmarco question has a
    top cosine ≥ 0.58); it is there for identifiers, whose dense lists are
    noise. arcd's bm25 is below the 0.755 of whole-document bm25 because a
    document is ranked by its best chunk (3.4 chunks per document there).
    k=20 rather than 60 keeps a keyword-only first hit (a serial number)
    above every dense hit below rank 22 even when trust is full.
    """

    rrf_k: int = 20
    pool: int = 100
    dense_weight: float = 2.0
    sparse_weight: float = 1.0
    #: A dense scan over more chunks than this is skipped ('over_budget').
    scan_max_chunks: int = 500_000
    #: Worker threads for query embedding and scans.
    scan_threads: int = 2
    #: Dense candidates fetched beyond ``pool``, to replace stale rows dropped at fetch.
    dense_slack: int = 32
    max_limit: int = 1000


@dataclass(frozen=True)
class Passage:
    """One ranked chunk with its citation data and where its rank came from."""

    chunk_key: str
    item_id: int
    ord: int
    text: str
    char_start: int
    char_end: int
    paragraph_start: int
    paragraph_end: int
    heading_path: list[str]
    score: float
    origin: Origin
    sparse_rank: int | None
    dense_rank: int | None

    def as_json(self) -> dict[str, Any]:
        """The ``search --json`` shape of one result."""
        return {
            "item_id": self.item_id,
            "chunk_key": self.chunk_key,
            "ord": self.ord,
            "text": self.text,
            "score": self.score,
            "origin": self.origin,
            "sparse_rank": self.sparse_rank,
            "dense_rank": self.dense_rank,
            "char_start": self.char_start,
            "char_end": self.char_end,
            "heading_path": self.heading_path,
        }


@dataclass(frozen=True)
class SearchResult:
    """Ranked passages, the mode actually used and why dense was skipped (if it was)."""

    passages: list[Passage]
    mode: Mode
    reason: Reason | None = None
    #: In-scope vectors skipped because their BLOB is malformed (dense still answered).
    malformed_vectors: int = 0
    #: The dense list's weight in the fusion after :func:`dense_trust` (None: no dense list).
    dense_weight: float | None = None

    def as_json(self, query: str | None = None) -> dict[str, Any]:
        """The ``search --json`` shape (``query`` omitted when None)."""
        head: dict[str, Any] = {} if query is None else {"query": query}
        return {
            **head,
            "mode": self.mode,
            "reason": self.reason,
            "results": [p.as_json() for p in self.passages],
        }


@dataclass(frozen=True)
class DenseHits:
    """A dense scan's answer: chunk ids by descending cosine, best first."""

    ids: list[int]
    scores: list[float]
    scanned: int = 0
    malformed: int = 0


class DenseUnavailable(RinwaError):
    """The dense side could not answer this query; ``reason`` says why."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(f"Dense search unavailable: {reason}.")
        self.reason: Reason = reason


class DenseSide(Protocol):
    """The dense half as :func:`search` sees it (implemented by ``index.DenseSide``)."""

    def submit(
        self, query: str, *, model: str, signature: str, dim: int, item_id: int | None, want: int
    ) -> Future[DenseHits] | Reason:
        """Start embedding + scanning off the caller's thread, or say why not at once.

        The future raises :class:`DenseUnavailable` for failures found while
        running; it must never block the caller.
        """
        ...


# --- rows ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Row:
    """A chunk as read for ranking and citation."""

    id: int
    chunk_key: str
    item_id: int
    ord: int
    text: str
    char_start: int
    char_end: int
    paragraph_start: int
    paragraph_end: int
    heading_path_json: str
    source_key: str
    index_signature: str


_ROW_SQL = """SELECT c.id, c.chunk_key, c.item_id, c.ord, c.text, c.char_start, c.char_end,
    c.paragraph_start, c.paragraph_end, c.heading_path_json,
    c.source_kind || ':' || c.source_hash, c.index_signature
    FROM item_chunks c WHERE c.id IN ({marks})"""


def _current_rows(conn: sqlite3.Connection, ids: Sequence[int]) -> dict[int, _Row]:
    """The rows of ``ids`` that are sparse-current (their item's source is unchanged).

    The source rule is :func:`rinwa_index.source.source_key`, evaluated once
    per distinct item in SQL (``rinwa_source_key``), so a host with empty hash
    columns gets the same SHA-256 answer as the indexer.
    """
    if not ids:
        return {}
    rows = [
        _Row(*r) for r in conn.execute(_ROW_SQL.format(marks=",".join("?" * len(ids))), tuple(ids))
    ]
    items = sorted({row.item_id for row in rows})
    keys = dict(
        conn.execute(
            f"SELECT i.id, {SOURCE_KEY_SQL} FROM items i"
            f" WHERE i.id IN ({','.join('?' * len(items))})",
            items,
        ).fetchall()
    )
    return {row.id: row for row in rows if keys.get(row.item_id) == row.source_key}


# --- sparse ----------------------------------------------------------------------

_FTS_LIBRARY = "SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY rank"
_FTS_ITEM = (
    "SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ?"
    " AND rowid IN (SELECT id FROM item_chunks WHERE item_id = ?) ORDER BY rank"
)


def sparse_ranking(
    conn: sqlite3.Connection, query: str, *, item_id: int | None, pool: int
) -> list[_Row]:
    """The best ``pool`` sparse-current chunks for ``query`` by bm25, best first.

    FTS5 ranks every match once (``ORDER BY rank``); rows are then read in
    growing batches until ``pool`` current ones are found, so stale chunks
    never take a place and the join costs only what is returned.
    """
    expression = fts.match_query(query)
    if expression is None:
        return []
    params: tuple[object, ...] = (expression,) if item_id is None else (expression, item_id)
    cursor = conn.execute(_FTS_LIBRARY if item_id is None else _FTS_ITEM, params)
    ranked: list[_Row] = []
    batch = pool + 8
    while len(ranked) < pool:
        ids = [r[0] for r in cursor.fetchmany(batch)]
        if not ids:
            break
        current = _current_rows(conn, ids)
        ranked.extend(current[i] for i in ids if i in current)
        batch *= 2
    cursor.close()
    return ranked[:pool]


# --- dense -----------------------------------------------------------------------


def dense_ranking(
    conn: sqlite3.Connection, hits: DenseHits, *, signature: str, pool: int
) -> tuple[list[_Row], list[float]]:
    """The scan's candidates that are still dense-current, best first, cut at ``pool``.

    The vector matrix may lag a commit behind; rereading the candidates here
    (currency and signature) is what guarantees no stale chunk is returned.
    """
    current = _current_rows(conn, hits.ids)
    rows: list[_Row] = []
    scores: list[float] = []
    for chunk_id, score in zip(hits.ids, hits.scores, strict=True):
        row = current.get(chunk_id)
        if row is not None and row.index_signature == signature:
            rows.append(row)
            scores.append(score)
    return rows[:pool], scores[:pool]


def script_coverage(query: str, scripts: frozenset[str] | None) -> float:
    """The share of the query's letters written in ``scripts`` (1.0: all, or no letters).

    The script is the first word of the character's Unicode name (LATIN,
    ARABIC, CJK, HIRAGANA…), which is exact enough for this decision.
    """
    letters = [ch for ch in query[: fts.MAX_QUERY_CHARS] if ch.isalpha()]
    if scripts is None or not letters:
        return 1.0
    known = sum(1 for ch in letters if unicodedata.name(ch, "?").split(" ", 1)[0] in scripts)
    return known / len(letters)


def dense_trust(query: str, manifest: Manifest, top_score: float) -> float:
    """How much of ``dense_weight`` this query's dense ranking gets, in [0, 1]."""
    trust = MODEL_TRUST.get(manifest.name, ModelTrust())
    coverage = script_coverage(query, trust.scripts)
    if trust.sure <= trust.unsure:
        return coverage
    confidence = (top_score - trust.unsure) / (trust.sure - trust.unsure)
    return coverage * min(1.0, max(0.0, confidence))


# --- fusion ----------------------------------------------------------------------


@dataclass
class _Fused:
    row: _Row
    score: float = 0.0
    sparse_rank: int | None = None
    dense_rank: int | None = None
    ranks: list[int] = field(default_factory=list)


def fuse(
    sparse: Sequence[_Row],
    dense: Sequence[_Row],
    *,
    k: int,
    sparse_weight: float = 1.0,
    dense_weight: float = 1.0,
) -> list[_Fused]:
    """Weighted RRF over the union keyed by ``chunk_key``: Σ wᵢ / (k + rankᵢ).

    Ties go to the best single rank, then the lower item id, then the lower
    ordinal, so equal inputs always give the same order.
    """
    fused: dict[str, _Fused] = {}
    lists = ((sparse_weight, sparse, "sparse_rank"), (dense_weight, dense, "dense_rank"))
    for weight, rows, attr in lists:
        for rank, row in enumerate(rows, start=1):
            entry = fused.setdefault(row.chunk_key, _Fused(row))
            if getattr(entry, attr) is None:
                setattr(entry, attr, rank)
                entry.score += weight / (k + rank)
                entry.ranks.append(rank)
    return sorted(
        fused.values(),
        key=lambda e: (-e.score, min(e.ranks), e.row.item_id, e.row.ord),
    )


def _passage(entry: _Fused) -> Passage:
    origin: Origin = (
        "both"
        if entry.sparse_rank is not None and entry.dense_rank is not None
        else "sparse"
        if entry.sparse_rank is not None
        else "dense"
    )
    row = entry.row
    return Passage(
        chunk_key=row.chunk_key,
        item_id=row.item_id,
        ord=row.ord,
        text=row.text,
        char_start=row.char_start,
        char_end=row.char_end,
        paragraph_start=row.paragraph_start,
        paragraph_end=row.paragraph_end,
        heading_path=_heading_path(row.heading_path_json),
        score=round(entry.score, 8),
        origin=origin,
        sparse_rank=entry.sparse_rank,
        dense_rank=entry.dense_rank,
    )


def _heading_path(raw: str) -> list[str]:
    try:
        value = json.loads(raw or "[]")
    except ValueError:
        return []
    return [str(part) for part in value] if isinstance(value, list) else []


# --- the search ------------------------------------------------------------------


@dataclass(frozen=True)
class _DenseTarget:
    """What a dense scan must match: the active model and signature."""

    manifest: Manifest
    signature: str


def dense_target(settings: EmbeddingSettings, config: Config) -> _DenseTarget:
    """The active manifest and signature hash, computed like the indexer does.

    ``settings.active_signature`` would also record the signature, a write
    that has no place on the request path; this is the same value, read-only.
    """
    return _target(settings.model, settings.provider, config.chunk, config.model_dir)


@lru_cache(maxsize=16)  # a cache: building a signature hashes its JSON, ~1 ms per query
def _target(model: str, provider: str, chunk: ChunkParams, model_dir: Path) -> _DenseTarget:
    manifest = get_manifest(model, model_dir)
    return _DenseTarget(manifest, build_signature(manifest, chunk, provider).hash)


def search(
    conn: sqlite3.Connection,
    query: str,
    *,
    item_id: int | None = None,
    limit: int = 10,
    deadline_ms: float = 250,
    mode: Mode = "hybrid",
    dense: DenseSide | None = None,
    config: Config | None = None,
    options: SearchOptions | None = None,
) -> SearchResult:
    """Rank passages for ``query`` (in item ``item_id`` only, when given).

    ``conn`` is any connection to the database (the host's own is fine);
    ``dense`` supplies the warm query embedder and vector matrix — without
    one, dense is reported ``not_ready`` (or ``disabled``). Never raises
    because of the dense side.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    start = time.monotonic()
    config = config or Config()
    options = options or SearchOptions()
    limit = max(0, min(limit, options.max_limit))
    pool = max(options.pool, limit)
    register_functions(conn)  # rinwa_source_key, on hosts' own connections too
    job, reason, target = _start_dense(
        conn, query, item_id, mode, dense, config, options, pool, deadline_ms
    )
    sparse = (
        []
        if mode == "dense" and job is not None
        else sparse_ranking(conn, query, item_id=item_id, pool=pool)
    )
    hits, reason = _await_dense(job, reason, start, deadline_ms)
    dense_rows: list[_Row] = []
    weight = options.dense_weight
    if hits is not None and target is not None:
        dense_rows, scores = dense_ranking(conn, hits, signature=target.signature, pool=pool)
        if mode == "hybrid":  # trust weighs one list against the other; alone it is moot
            weight *= dense_trust(query, target.manifest, scores[0] if scores else 0.0)
    if mode == "dense" and hits is None and not sparse:
        sparse = sparse_ranking(conn, query, item_id=item_id, pool=pool)  # the fallback
    used: Mode = "sparse" if hits is None else ("dense" if mode == "dense" else "hybrid")
    fused = fuse(
        sparse,
        dense_rows,
        k=options.rrf_k,
        sparse_weight=options.sparse_weight,
        dense_weight=weight,
    )
    return SearchResult(
        [_passage(e) for e in fused[:limit]],
        used,
        reason,
        malformed_vectors=hits.malformed if hits else 0,
        dense_weight=weight if hits is not None else None,
    )


def _start_dense(
    conn: sqlite3.Connection,
    query: str,
    item_id: int | None,
    mode: Mode,
    dense: DenseSide | None,
    config: Config,
    options: SearchOptions,
    pool: int,
    deadline_ms: float,
) -> tuple[Future[DenseHits] | None, Reason | None, _DenseTarget | None]:
    """Submit the dense job before the sparse query runs, so the two overlap."""
    if mode == "sparse":
        return None, None, None
    settings = get_settings(conn)
    if not settings.enabled:
        return None, "disabled", None
    if dense is None:
        return None, "not_ready", None
    if deadline_ms <= 0:
        return None, "timeout", None  # no time at all: do not even start the work
    try:
        target = dense_target(settings, config)
    except RinwaError:
        return None, "model_error", None  # the configured model is unknown here
    submitted = dense.submit(
        query,
        model=settings.model,
        signature=target.signature,
        dim=target.manifest.dim,
        item_id=item_id,
        want=pool + options.dense_slack,
    )
    if isinstance(submitted, str):
        return None, submitted, None
    return submitted, None, target


def _await_dense(
    job: Future[DenseHits] | None, reason: Reason | None, start: float, deadline_ms: float
) -> tuple[DenseHits | None, Reason | None]:
    """Wait for the dense job until the deadline; a late or failed job becomes a reason."""
    if job is None:
        return None, reason
    remaining = deadline_ms / 1000 - (time.monotonic() - start)
    try:
        if remaining <= 0 and not job.done():
            raise FutureTimeout
        return job.result(timeout=max(remaining, 0)), None
    except FutureTimeout:
        job.cancel()  # a job still queued never runs; a running one finishes unseen
        return None, "timeout"
    except DenseUnavailable as exc:
        return None, exc.reason
    except Exception as exc:  # the dense side must never break a search
        log.warning("search.dense_failed", error=type(exc).__name__)
        return None, "model_error"

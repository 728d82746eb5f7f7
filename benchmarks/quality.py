"""Retrieval quality of sparse, dense and hybrid search on the shared eval sets.

    .venv/bin/python benchmarks/quality.py [--eval-dir DIR] [--sets msmarco,arcd] [--json]

Each corpus record becomes one item (title + text), indexed through
``indexer.index_item`` with the default model exactly as the worker would;
queries run through :class:`rinwa_index.index.Index` in each mode with a
generous deadline (this measures ranking, not latency). Chunk hits become
item hits by best rank. Prints nDCG@10 (linear graded gain), Recall@100 and
MRR@10 per set and mode; the last line is one JSON object keyed by dataset
and mode. Only queries with at least one relevant document are scored.

Indexing msmarco (5000 passages) takes a few minutes on 2 cores; the index
lives in a temporary directory unless ``--work-dir`` keeps it for reruns.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rinwa_index.config import Config  # noqa: E402
from rinwa_index.db import atomic, connect  # noqa: E402
from rinwa_index.index import Index  # noqa: E402
from rinwa_index.logs import configure_logging  # noqa: E402
from rinwa_index.search import MODES, SearchOptions  # noqa: E402
from rinwa_index.settings import update_settings  # noqa: E402

DEFAULT_EVAL = REPO.parent / "shared" / "eval"
SETS = ("msmarco", "arcd")
DEADLINE_MS = 60_000  # ranking quality, not latency: never let a slow scan decide


@dataclass
class EvalSet:
    """A BEIR-format set: documents, queries and graded judgements."""

    name: str
    docs: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def load_set(folder: Path) -> EvalSet:
    """Read ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/test.tsv`` (header optional)."""
    docs: dict[str, str] = {}
    for line in (folder / "corpus.jsonl").open(encoding="utf-8"):
        record = json.loads(line)
        title = (record.get("title") or "").strip()
        docs[str(record["_id"])] = f"{title}\n\n{record['text']}" if title else record["text"]
    queries = {
        str(r["_id"]): r["text"]
        for r in map(json.loads, (folder / "queries.jsonl").open(encoding="utf-8"))
    }
    qrels: dict[str, dict[str, int]] = {}
    for line in (folder / "qrels" / "test.tsv").open(encoding="utf-8"):
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
            continue  # the header line of arcd
        qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    judged = {q for q, rels in qrels.items() if any(s > 0 for s in rels.values())}
    return EvalSet(folder.name, docs, {q: t for q, t in queries.items() if q in judged}, qrels)


def build_index(data: EvalSet, config: Config) -> dict[int, str]:
    """Insert one item per document and index it with the real model; item id → doc id."""
    from rinwa_index.embedder import load
    from rinwa_index.indexer import index_item

    conn = connect(config.db_path)
    update_settings(conn, enabled=True)
    ids = {n: doc for n, doc in enumerate(sorted(data.docs), start=1)}
    fresh = conn.execute("SELECT COUNT(*) FROM item_chunks").fetchone()[0] == 0
    if fresh:
        with atomic(conn):
            conn.executemany(
                "INSERT OR REPLACE INTO items (id, content) VALUES (?, ?)",
                [(n, data.docs[doc]) for n, doc in ids.items()],
            )
        embedder = load(threads=config.intra_op_threads)
        start = time.perf_counter()
        for n in ids:
            index_item(conn, n, config=config, embedder=embedder)
        embedder.close()
        print(f"  indexed {len(ids)} items in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    conn.close()
    return ids


def item_ranking(passages: Iterable[Any], ids: dict[int, str]) -> list[str]:
    """Documents in order of their best-ranked chunk."""
    seen: dict[str, None] = {}
    for passage in passages:
        seen.setdefault(ids[passage.item_id], None)
    return list(seen)


def ndcg_at(ranked: list[str], rels: dict[str, int], k: int = 10) -> float:
    """nDCG@k with linear gain (as BEIR's pytrec_eval)."""
    dcg = sum(rels.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]))
    ideal = sorted((r for r in rels.values() if r > 0), reverse=True)[:k]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranked: list[str], rels: dict[str, int], k: int = 100) -> float:
    """Share of the relevant documents found in the top ``k``."""
    relevant = {doc for doc, r in rels.items() if r > 0}
    return len(relevant & set(ranked[:k])) / len(relevant)


def mrr_at(ranked: list[str], rels: dict[str, int], k: int = 10) -> float:
    """Reciprocal rank of the first relevant document in the top ``k``."""
    for i, doc in enumerate(ranked[:k]):
        if rels.get(doc, 0) > 0:
            return 1 / (i + 1)
    return 0.0


def evaluate(
    data: EvalSet, index: Index, ids: dict[int, str], mode: str
) -> tuple[dict[str, float], dict[str, int]]:
    """Mean metrics over the judged queries, and how often each fallback reason occurred."""
    totals = {"ndcg@10": 0.0, "recall@100": 0.0, "mrr@10": 0.0}
    reasons: dict[str, int] = {}
    for qid, text in data.queries.items():
        result = index.search(text, limit=100, deadline_ms=DEADLINE_MS, mode=mode)  # type: ignore
        if result.reason:
            reasons[result.reason] = reasons.get(result.reason, 0) + 1
        ranked = item_ranking(result.passages, ids)
        rels = data.qrels[qid]
        totals["ndcg@10"] += ndcg_at(ranked, rels)
        totals["recall@100"] += recall_at(ranked, rels)
        totals["mrr@10"] += mrr_at(ranked, rels)
    return {k: round(v / len(data.queries), 4) for k, v in totals.items()}, reasons


def run_set(data: EvalSet, work: Path, options: SearchOptions) -> dict[str, dict[str, float]]:
    """Index one set under ``work`` and score every mode."""
    config = Config(db_path=work / f"{data.name}.db", model_dir=work / "models")
    ids = build_index(data, config)
    out: dict[str, dict[str, float]] = {}
    with Index(config, options=options) as index:
        if not index.warm_up(wait=True, timeout=600):
            raise SystemExit("The query embedder did not load; see the log above.")
        for mode in MODES:
            metrics, reasons = evaluate(data, index, ids, mode)
            out[mode] = metrics
            if reasons:
                print(f"  {data.name}/{mode}: dense skipped {reasons}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, measure each available set, print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eval-dir", type=Path, default=DEFAULT_EVAL)
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--work-dir", type=Path, help="keep the indexed databases here")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    configure_logging(logging.WARNING)
    present = [s for s in args.sets.split(",") if (args.eval_dir / s / "corpus.jsonl").is_file()]
    if not present:
        print(f"Skipped: no eval sets under {args.eval_dir} (see --eval-dir).")
        print(json.dumps({}))
        return 0
    print(f"Measuring {', '.join(present)} from {args.eval_dir}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="rinwa-quality-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = {
            name: run_set(load_set(args.eval_dir / name), work, SearchOptions()) for name in present
        }
    if not args.json:
        print_table(results)
    print(json.dumps(results, sort_keys=True))
    return 0


def print_table(results: dict[str, dict[str, dict[str, float]]]) -> None:
    """One row per set and mode."""
    print(f"{'set':<10}{'mode':<8}{'nDCG@10':>9}{'R@100':>8}{'MRR@10':>8}")
    for name, modes in results.items():
        for mode, m in modes.items():
            print(
                f"{name:<10}{mode:<8}{m['ndcg@10']:>9.3f}{m['recall@100']:>8.3f}{m['mrr@10']:>8.3f}"
            )
        best = max(modes["sparse"]["ndcg@10"], modes["dense"]["ndcg@10"])
        print(f"{'':<10}hybrid − best single ranker: {modes['hybrid']['ndcg@10'] - best:+.3f}")


if __name__ == "__main__":
    raise SystemExit(main())

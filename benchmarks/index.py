"""End-to-end indexing benchmark: the real worker against the raw model on the same chunks.

    python benchmarks/index.py [--json] [--items N]

* Worker: N generated articles (mixed lengths, fixed seed) are ingested with
  dense search on, and ``python -m workers --until-idle`` (the real Huey
  consumer) indexes them. Throughput counts from the first ``item.indexed`` to
  the last (model load and the idle check excluded) and, separately, the whole
  run.
* Raw: the very chunk texts the worker stored, embedded by a plain ONNX Runtime
  loop written here (same model file, same threads, ONNX Runtime's default
  session options, batches of 16 padded per batch), as ``benchmarks/embed.py``
  does: in input order (``ratio_vs_raw``), and also length-sorted over the
  whole corpus (``ratio_vs_sorted_raw``), the best the bare model can do when
  it sees every chunk at once — which a worker indexing items as they change
  never does.
* Incremental edit: one paragraph of a 40-chunk article changes; the worker's
  ``item.indexed`` event says how many chunks it embedded.
* Peak worker RSS, sampled every 50 ms with psutil.

Targets (figures, not assertions): ratio >= 0.90, edit embeds <= 2 chunks,
worker peak RSS <= 400 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from rinwa_index.config import Config
from rinwa_index.db import connect
from rinwa_index.ingest import NewItem, ingest_items
from rinwa_index.models import MINILM, load_tokenizer, verified_path
from rinwa_index.settings import update_settings

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "one",
    "all",
    "we",
    "their",
    "its",
    "been",
    "has",
    "more",
    "if",
    "will",
    "river",
    "station",
    "library",
    "contract",
    "galaxy",
    "mountain",
    "storage",
    "backup",
    "patient",
    "treatment",
    "recipe",
    "committee",
    "report",
    "migration",
    "cluster",
    "schedule",
    "snapshot",
    "window",
    "spring",
    "melt",
    "mill",
    "surge",
    "dough",
]


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24))).capitalize() + "."


def article(rng: random.Random, paragraphs: int) -> str:
    return "\n\n".join(
        " ".join(sentence(rng) for _ in range(rng.randint(2, 8))) for _ in range(paragraphs)
    )


def run_worker(config: Config, log: Path) -> tuple[float, float]:
    """Run the consumer until idle; return (wall seconds, peak RSS MB)."""
    env = {
        **os.environ,
        "RINWA_DB": str(config.db_path),
        "RINWA_MODEL_DIR": str(config.model_dir),
        "HF_HUB_OFFLINE": "1",
    }
    start, peak = time.perf_counter(), 0
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers", "--until-idle"], env=env, stdout=out, stderr=out
        )
        handle = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                peak = max(peak, handle.memory_info().rss)
            except psutil.Error:
                break
            time.sleep(0.05)
    if proc.returncode != 0:
        raise SystemExit(f"worker failed, see {log}")
    return time.perf_counter() - start, peak / 2**20


def indexed_events(log: Path) -> list[dict[str, Any]]:
    events = []
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == "item.indexed":
            events.append(event)
    return events


def active_seconds(events: list[dict[str, Any]]) -> float:
    """From the start of the first indexed item to the end of the last."""
    stamps = [datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")) for e in events]
    first_ms = events[0]["ms"] / 1000
    return (max(stamps) - min(stamps)).total_seconds() + first_ms


def raw_throughput(texts: list[str], threads: int, *, sort: bool) -> float:
    """Chunks/s of a plain onnxruntime loop over batches of 16 (input order or sorted)."""
    import onnxruntime as ort

    tokenizer = load_tokenizer(MINILM, Path("."))
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(
        str(verified_path(MINILM, "model", Path("."))), options, providers=["CPUExecutionProvider"]
    )
    encoded = [e.ids for e in tokenizer.encode_batch(texts)]
    if sort:
        encoded.sort(key=len)
    start = time.perf_counter()
    for i in range(0, len(encoded), 16):
        batch = encoded[i : i + 16]
        width = max(len(ids) for ids in batch)
        ids = np.zeros((len(batch), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)], mask[row, : len(seq)] = seq, 1
        hidden = session.run(None, {"input_ids": ids, "attention_mask": mask,
                                    "token_type_ids": np.zeros_like(ids)})[0]  # fmt: skip
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
    return len(texts) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--items", type=int, default=150)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    rng = random.Random(11)
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(db_path=Path(tmp) / "bench.db", model_dir=Path(tmp) / "models")
        conn = connect(config.db_path)
        items = [NewItem(None, "", article(rng, rng.randint(1, 5)), "") for _ in range(args.items)]
        long_paragraphs = [article(rng, 1) for _ in range(40)]
        items.append(NewItem(None, "long", "\n\n".join(long_paragraphs), ""))
        ingest_items(conn, items)
        update_settings(conn, enabled=True)
        log = Path(tmp) / "worker.log"
        wall, peak_mb = run_worker(config, log)
        events = indexed_events(log)
        chunks = sum(e["chunks"] for e in events)
        active = active_seconds(events)
        texts = [r[0] for r in conn.execute("SELECT text FROM item_chunks")]
        raw = raw_throughput(texts, args.threads, sort=False)
        best = raw_throughput(texts, args.threads, sort=True)

        long_id = conn.execute("SELECT MAX(id) FROM items").fetchone()[0]
        long_chunks = conn.execute(
            "SELECT COUNT(*) FROM item_chunks WHERE item_id = ?", (long_id,)
        ).fetchone()[0]
        long_paragraphs[17] = "An editor rewrote this paragraph with completely different words."
        ingest_items(conn, [NewItem(long_id, "long", "\n\n".join(long_paragraphs), "")])
        edit_log = Path(tmp) / "edit.log"
        run_worker(config, edit_log)
        edit = indexed_events(edit_log)[-1]
        conn.close()

    worker_rate = chunks / active
    result = {
        "items": len(items),
        "chunks": chunks,
        "worker_chunks_per_s": round(worker_rate, 1),
        "worker_chunks_per_s_whole_run": round(chunks / wall, 1),
        "raw_chunks_per_s": round(raw, 1),
        "ratio_vs_raw": round(worker_rate / raw, 3),
        "raw_sorted_chunks_per_s": round(best, 1),
        "ratio_vs_sorted_raw": round(worker_rate / best, 3),
        "overhead_ms_per_item": round((active - chunks / best) * 1000 / len(items), 2),
        "edit_item_chunks": long_chunks,
        "edit_embedded": edit["embedded"],
        "edit_reused": edit["reused"],
        "worker_peak_rss_mb": round(peak_mb, 1),
    }
    print(f"items {result['items']}, chunks {chunks}")
    print(f"worker {worker_rate:.1f} chunks/s (whole run incl. start-up: {chunks / wall:.1f})")
    print(
        f"raw model {raw:.1f} chunks/s  ->  ratio_vs_raw {result['ratio_vs_raw']} (target >= 0.90)"
    )
    print(
        f"raw model, whole corpus length-sorted {best:.1f} chunks/s  ->  "
        f"ratio_vs_sorted_raw {result['ratio_vs_sorted_raw']}"
    )
    print(
        f"overhead per item {result['overhead_ms_per_item']} ms (chunking, queue, outbox, SQLite)"
    )
    print(f"edit one paragraph of a {long_chunks}-chunk item: embedded {edit['embedded']}, "
          f"reused {edit['reused']} (target <= 2)")  # fmt: skip
    print(f"worker peak RSS {peak_mb:.0f} MB (target <= 400)")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()

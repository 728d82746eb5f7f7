"""Chunker throughput against the tokenizer's own ``encode_batch``, and peak memory.

    .venv/bin/python benchmarks/chunking.py [--json] [--mb 2] [--rounds 3]

Generates ~2 MB of English and ~2 MB of Chinese Markdown-like text (headings,
paragraphs, sentences) with a fixed seed, then measures in the same run:

* the chunker's MB/s (``Chunker.chunk`` on the whole text, default MiniLM);
* the tokenizer's MB/s for ``encode_batch`` over the same text split by paragraph
  (the floor any tokenizer-based chunker pays), and the ratio of the two;
* peak memory while chunking 10 MB (Python heap via tracemalloc, and the growth
  of the process's peak RSS, which includes the Rust tokenizer's buffers).

MB means 10^6 characters of source text. With ``--json`` the last line is one
JSON object. This is a measurement, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from rinwa_index.chunking import Chunker, chunker_for
from rinwa_index.config import ChunkParams
from rinwa_index.models import MINILM

SEED = 20240611

ENGLISH_WORDS = """
the of and to in is that for it as was with be by on not he this are or his from at which
but have an they you were her she there been one all we their has would when if so what no
more out up into do any about time can said only new some could these two may first then
other like people year way day man thing woman life child world school state family student
group country problem hand part place case week company system program question work
government number night point home water room mother area money story fact month lot right
study book eye job word business issue side kind head house service friend father power hour
game line end member law car city community name president team minute idea kid body
information back parent face others level office door health person art war history party
result change morning reason research girl guy moment air teacher force education index search
model vector database chunk token sentence paragraph heading document library query worker
quickly slowly carefully often never always usually however therefore meanwhile although
because unless whereas local private durable background embedding retrieval ranking fusion
""".split()  # noqa: SIM905 - a word list reads better as text

NAMES = ["Alice", "Bob", "Carol", "Dmitri", "Eun-ji", "Fatima", "Gustavo", "Hiroshi", "Ingrid"]

CHINESE_CHARS = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下"
    "过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两"
    "体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线"
    "内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并"
    "提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见"
    "计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七"
    "海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场"
    "检索向量数据库分块模型句子段落标题文档本地私有后台嵌入排序融合"
)
CHINESE_ENDS = "。。。。！？；"


def english_text(size: int, rng: random.Random) -> str:
    """Markdown-like English: sections with ATX headings, paragraphs of 1-9 sentences."""
    parts: list[str] = []
    total = chapter = 0
    while total < size:
        if not parts or rng.random() < 0.12:
            chapter += 1
            title = " ".join(rng.choice(ENGLISH_WORDS) for _ in range(rng.randint(2, 5)))
            parts.append(f"{'#' * rng.randint(1, 3)} {chapter}. {title.title()}")
        sentences = [_english_sentence(rng) for _ in range(rng.randint(1, 9))]
        parts.append(" ".join(sentences))
        total += len(parts[-1]) + 2
    return "\n\n".join(parts)


def _english_sentence(rng: random.Random) -> str:
    words: list[str] = []
    count = rng.randint(5, 28)
    for index in range(count):
        roll = rng.random()
        if roll < 0.04:
            words.append(rng.choice(NAMES))
        elif roll < 0.06:
            words.append(str(rng.randint(2, 2025)))
        else:
            # Squaring the draw skews towards the frequent words at the front of the list.
            words.append(ENGLISH_WORDS[int(rng.random() ** 2 * len(ENGLISH_WORDS))])
        if index < count - 1 and rng.random() < 0.07:
            words[-1] += ","
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice("....!?")


def chinese_text(size: int, rng: random.Random) -> str:
    """Chinese: sections with ATX headings, paragraphs of 1-8 unspaced sentences."""
    parts: list[str] = []
    total = chapter = 0
    while total < size:
        if not parts or rng.random() < 0.12:
            chapter += 1
            parts.append(f"## 第{chapter}章 {_chinese_clause(rng, 3, 8)}")
        sentences = [_chinese_sentence(rng) for _ in range(rng.randint(1, 8))]
        parts.append("".join(sentences))
        total += len(parts[-1]) + 2
    return "\n\n".join(parts)


def _chinese_clause(rng: random.Random, low: int, high: int) -> str:
    return "".join(rng.choice(CHINESE_CHARS) for _ in range(rng.randint(low, high)))


def _chinese_sentence(rng: random.Random) -> str:
    clauses = [_chinese_clause(rng, 4, 16) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.15:
        clauses[-1] += rng.choice(["SQLite", "ONNX", "MiniLM", " 2024 ", "FTS5"])
    return "，".join(clauses) + rng.choice(CHINESE_ENDS)


def best_seconds(funcs: list[Callable[[], object]], rounds: int) -> list[float]:
    """The fastest of ``rounds`` runs of each function, interleaved so load swings hit all."""
    best = [float("inf")] * len(funcs)
    for _ in range(rounds):
        for index, func in enumerate(funcs):
            gc.collect()
            started = time.perf_counter()
            func()
            best[index] = min(best[index], time.perf_counter() - started)
    return best


def throughput(chunker: Chunker, text: str, rounds: int) -> dict[str, float]:
    """Chunker and tokenizer MB/s on the same text, and their ratio."""
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    tokenizer = chunker.tokenizer
    tok_s, chunk_s = best_seconds(
        [
            lambda: tokenizer.encode_batch(paragraphs, add_special_tokens=False),
            lambda: chunker.chunk(text),
        ],
        rounds,
    )
    mb = len(text) / 1e6
    return {
        "mb": round(mb, 3),
        "chunks": len(chunker.chunk(text)),
        "chunker_mb_s": round(mb / chunk_s, 3),
        "tokenizer_mb_s": round(mb / tok_s, 3),
        "ratio": round(tok_s / chunk_s, 3),
    }


def peak_memory(chunker: Chunker, text: str) -> dict[str, float]:
    """Peak RSS growth and Python heap peak while chunking ``text``."""
    gc.collect()
    before = _max_rss_mb()
    chunks = chunker.chunk(text)
    rss_growth = _max_rss_mb() - before
    del chunks
    gc.collect()
    tracemalloc.start()
    chunks = chunker.chunk(text)
    _, heap_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    output = sum(len(c.text) for c in chunks) / 1e6
    return {
        "text_mb": round(len(text) / 1e6, 2),
        "output_text_mb": round(output, 2),
        "heap_peak_mb": round(heap_peak / 1e6, 1),
        "rss_peak_growth_mb": round(rss_growth, 1),
    }


def _max_rss_mb() -> float:
    scale = 1e6 if sys.platform == "darwin" else 1e3  # bytes on macOS, KiB elsewhere
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale


def main() -> None:
    """Run the benchmark and print a report (and one JSON line with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--mb", type=float, default=2.0, help="MB of text per language")
    parser.add_argument("--rounds", type=int, default=3, help="runs per measurement (best)")
    args = parser.parse_args()
    chunker = chunker_for(MINILM, ChunkParams(), Path(tempfile.gettempdir()))
    size = int(args.mb * 1e6)
    # The memory run goes first, so earlier runs do not hide its RSS high-water mark.
    ten = english_text(5_000_000, random.Random(SEED)) + "\n\n"
    ten += chinese_text(5_000_000, random.Random(SEED + 1))
    memory = peak_memory(chunker, ten)
    del ten
    result = {
        "english": throughput(chunker, english_text(size, random.Random(SEED)), args.rounds),
        "chinese": throughput(chunker, chinese_text(size, random.Random(SEED)), args.rounds),
        "peak_mb_10mb": memory["rss_peak_growth_mb"],
        "memory_10mb": memory,
    }
    for name in ("english", "chinese"):
        row = result[name]
        print(
            f"{name:8} {row['mb']:.2f} MB, {row['chunks']} chunks: chunker "
            f"{row['chunker_mb_s']:.2f} MB/s, tokenizer encode_batch {row['tokenizer_mb_s']:.2f} "
            f"MB/s, ratio {row['ratio']:.2f}"
        )
    print(
        f"10 MB mixed text: peak RSS growth {memory['rss_peak_growth_mb']} MB, Python heap "
        f"peak {memory['heap_peak_mb']} MB (chunk texts alone {memory['output_text_mb']} MB)"
    )
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()

"""``rinwa-index demo``: the whole product on a sample library, in a couple of minutes.

It ingests the articles shipped in ``rinwa_index/data/`` (English and Chinese,
some with Markdown headings, one long), enables dense search on the bundled
default model, runs the real worker (the Huey consumer, as supervisord would)
with visible progress, and then runs searches that show each side at work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from .config import Config
from .db import connect
from .ingest import ingest_items, parse_items
from .progress import Progress
from .search import SearchResult
from .settings import update_settings
from .status import collect

Echo = Callable[[str], None]


def sample_library() -> str:
    """The sample articles as JSONL text."""
    return resources.files("rinwa_index.data").joinpath("sample_library.jsonl").read_text("utf-8")


def demo_queries() -> dict[str, object]:
    """The demo's queries and the item each should find."""
    raw = resources.files("rinwa_index.data").joinpath("demo_queries.json").read_text("utf-8")
    return json.loads(raw)  # type: ignore[no-any-return]


def run_demo(directory: Path, config: Config, echo: Echo) -> None:
    """Build the demo database in ``directory`` and show searches over it."""
    directory.mkdir(parents=True, exist_ok=True)
    config = config.replace(db_path=directory / "library.db", queue_path=None)
    echo(f"1. Database: {config.db_path}")
    conn = connect(config.db_path)
    items = parse_items(sample_library().splitlines())
    ingest_items(conn, items)
    echo(f"2. Ingested {len(items)} sample articles (English and Chinese); changes recorded.")
    update_settings(conn, enabled=True)
    echo("3. Dense search enabled on the bundled model (minilm-l6-int8, offline).")
    conn.close()
    echo("4. Running the worker (the real Huey consumer) until the library is indexed:")
    run_worker(config, directory / "worker.log", echo)
    show_searches(config, echo)


def run_worker(config: Config, log: Path, echo: Echo) -> None:
    """Start ``python -m workers --until-idle`` and show progress until it exits."""
    env = {
        **os.environ,
        "RINWA_DB": str(config.db_path.resolve()),
        "RINWA_MODEL_DIR": str(config.model_dir),
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    conn = connect(config.db_path)
    total = collect(conn, config).items
    with log.open("ab") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers", "--until-idle"],
            env=env, stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip
        with Progress(total, "items indexed", echo=echo) as bar:
            while proc.poll() is None:
                bar.update(collect(conn, config).dense_current)
                time.sleep(0.3)
            bar.update(collect(conn, config).dense_current)
    conn.close()
    if proc.returncode != 0:
        raise RuntimeError(f"The worker exited with status {proc.returncode}; see {log}.")
    echo(f"   Worker finished; its JSON log is in {log.name} (ids and counts, never text).")


def show_searches(config: Config, echo: Echo) -> None:
    """The searches: keyword, paraphrase (dense only), Chinese, then dense off."""
    from .index import Index

    queries = demo_queries()
    index = Index(config)
    index.warm_up(wait=True, timeout=60)
    titles = dict(index.conn.execute("SELECT id, title FROM items").fetchall())
    keyword = queries["keyword"]["query"]  # type: ignore[index]
    _show(echo, "5. A keyword hit", keyword, index.search(keyword, limit=3), titles)
    for pair in queries["paraphrase"]:  # type: ignore[attr-defined]
        query = pair["query"]
        sparse = index.search(query, limit=3, mode="sparse")
        echo(f"\n   Keyword search alone for {query!r}: {len(sparse.passages)} results.")
        _show(
            echo,
            "6. A paraphrase only the dense side finds",
            query,
            index.search(query, limit=3),
            titles,
        )
    chinese = queries["chinese"]["query"]  # type: ignore[index]
    _show(
        echo,
        "7. A Chinese query (CJK bigrams in FTS5)",
        chinese,
        index.search(chinese, limit=3),
        titles,
    )
    update_settings(index.conn, enabled=False)  # what `rinwa-index disable` does
    first = queries["paraphrase"][0]["query"]  # type: ignore[index]
    title = "8. Dense search off: keyword results only, and the reason"
    _show(echo, title, keyword, index.search(keyword, limit=3), titles)
    _show(echo, title, first, index.search(first, limit=3), titles)
    update_settings(index.conn, enabled=True)
    index.close()
    echo("\nDense search is on again. Try: rinwa-index --db "
         f"{config.db_path} search 'your question' --explain")  # fmt: skip


def _show(echo: Echo, title: str, query: str, result: SearchResult, titles: dict[int, str]) -> None:
    reason = f", dense skipped: {result.reason}" if result.reason else ""
    echo(f"\n{title}: {query!r}  [mode {result.mode}{reason}]")
    if not result.passages:
        echo("   (no results)")
    for n, passage in enumerate(result.passages, start=1):
        ranks = f"sparse #{passage.sparse_rank or '-'}, dense #{passage.dense_rank or '-'}"
        snippet = " ".join(passage.text.split())[:70]
        echo(f"   {n}. [{passage.origin:6}] {titles.get(passage.item_id, '?')} ({ranks})")
        echo(f"      {snippet}…")

"""Privacy: no network without an explicit fetch, and no text or query in any log line."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from rinwa_index.config import Config

SCRIPT = r"""
import socket, sys
attempts = []
real_connect = socket.socket.connect
def refuse(self, address):
    attempts.append(address)
    raise OSError("network disabled by the test")
socket.socket.connect = refuse
socket.create_connection = lambda *a, **k: refuse(None, a[0] if a else None)

from pathlib import Path
from rinwa_index.config import Config
from rinwa_index.db import connect
from rinwa_index.embedder import load
from rinwa_index.index import Index
from rinwa_index.indexer import Indexer
from rinwa_index.ingest import NewItem, ingest_items
from rinwa_index.settings import update_settings

config = Config(db_path=Path(sys.argv[1]), model_dir=Path(sys.argv[2]))
conn = connect(config.db_path)
ingest_items(conn, [NewItem(None, "t", "Herons wade in the shallow marsh at dawn.", "")])
update_settings(conn, enabled=True)
embedder = load(model_dir=config.model_dir)
Indexer(conn, config, embedder_for=lambda _m: embedder).index_item(1)
with Index(config) as index:
    assert index.warm_up(wait=True, timeout=60)
    result = index.search("birds standing in water")
    assert result.mode == "hybrid" and result.passages, result
print("attempts", len(attempts))
"""


def test_indexing_and_search_never_touch_the_network(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "p.db"), str(tmp_path / "models")],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "attempts 0" in out.stdout


def test_search_logs_carry_no_query_or_text(config: Config) -> None:
    from rinwa_index.db import connect
    from rinwa_index.embedder import FakeEmbedder
    from rinwa_index.index import Index
    from rinwa_index.indexer import index_item
    from rinwa_index.ingest import NewItem, ingest_items
    from rinwa_index.logs import configure_logging
    from rinwa_index.models import MINILM
    from rinwa_index.settings import update_settings

    stream = io.StringIO()
    configure_logging(stream=stream, level=10)
    conn = connect(config.db_path)
    ingest_items(conn, [NewItem(None, "t", "Secretword passage Qvxzq about herons.", "")])
    update_settings(conn, enabled=True)
    fake = FakeEmbedder(manifest=MINILM)
    index_item(conn, 1, config=config, embedder=fake)
    with Index(config, embedder_loader=lambda _name: fake) as index:
        index.warm_up(wait=True, timeout=30)
        for mode in ("hybrid", "sparse", "dense"):
            index.search("Qvxzq herons private question", mode=mode)  # type: ignore[arg-type]
        index.search("Qvxzq", deadline_ms=0)
    conn.close()
    logged = stream.getvalue()
    assert logged, "the search path logs events"
    for secret in ("Qvxzq", "herons", "private question", str(config.model_dir)):
        assert secret.lower() not in logged.lower()

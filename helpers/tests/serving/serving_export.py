"""A small exported model with the layout notebook 05 writes, built without TensorFlow.

`serving.json`, an HPS JSON, a `key` / `emb_vector` sparse model (random vectors for 3 slots)
and an ONNX MLP (Gemm-Relu-Gemm) made with onnx.helper. Used by the serving tests' fixtures.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SLOTS = 3
VOCAB_PER_SLOT = 500
DIM = 8
MAX_BATCH = 64
DEFAULT_VALUE = 0.5


def write_onnx_mlp(path: Path, width: int, hidden, rng) -> None:
    """An ONNX MLP [batch, width] -> Gemm+Relu per hidden size -> Gemm -> [batch, 1]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    inits, nodes, x, fan_in = [], [], "input_1", width
    for i, h in enumerate(list(hidden) + [1]):
        w = (rng.standard_normal((fan_in, h)) / np.sqrt(fan_in)).astype(np.float32)
        b = (rng.standard_normal(h) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(hidden)
        y = "output_1" if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [y]))
        if not last:
            nodes.append(helper.make_node("Relu", [y], [f"r{i}"]))
            y = f"r{i}"
        x, fan_in = y, h
    graph = helper.make_graph(
        nodes, "dense_mlp",
        [helper.make_tensor_value_info("input_1", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("output_1", TensorProto.FLOAT, ["batch", 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())


def hps_json(model_name: str, sparse_dir: Path, volatile_db: dict | None = None,
             persistent_db: dict | None = None, max_batch: int = MAX_BATCH, dim: int = DIM) -> dict:
    """HugeCTR's HPS JSON for one table (the fields embedlab.hps reads)."""
    cfg = {
        "supportlonglong": True,
        "models": [{
            "model": model_name,
            "sparse_files": [str(sparse_dir)],
            "embedding_table_names": ["sparse_embedding1"],
            "embedding_vecsize_per_table": [dim],
            "maxnum_catfeature_query_per_table_per_sample": [SLOTS],
            "default_value_for_each_table": [DEFAULT_VALUE],
            "deployed_device_list": [0],
            "max_batch_size": max_batch,
            "gpucache": True,
            "gpucacheper": 0.5,
            "hit_rate_threshold": 1.0,
        }],
    }
    if volatile_db is not None:
        cfg["volatile_db"] = volatile_db
    if persistent_db is not None:
        cfg["persistent_db"] = persistent_db
    return cfg


def make_export(root: Path, seed: int = 7, model_name: str = "served_dnn", dim: int = DIM,
                vocab_per_slot: int = VOCAB_PER_SLOT, hidden=(32,), **hps_kw) -> Path:
    """A complete small export under `root` (serving.json + files); returns `root`."""
    from embedlab.sparse_model import write_sparse_model
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    keys = np.arange(SLOTS * vocab_per_slot, dtype=np.int64)
    vectors = rng.standard_normal((keys.size, dim)).astype(np.float32)
    sparse = root / f"{model_name}_sparse.model"
    write_sparse_model(sparse, keys, vectors)
    ps = root / f"{model_name}.json"
    ps.write_text(json.dumps(hps_json(model_name, sparse, dim=dim, **hps_kw), indent=2))
    onnx_file = root / "dense.onnx"
    write_onnx_mlp(onnx_file, SLOTS * dim, hidden, rng)
    manifest = {"model_name": model_name, "ps_config_file": str(ps), "table_id": 0,
                "emb_vec_size": dim, "slot_num": SLOTS, "keys_per_sample": SLOTS,
                "onnx_file": str(onnx_file), "onnx_input": "input_1", "onnx_output": "output_1",
                "dense_savedmodel": "", "inference_savedmodel": ""}
    (root / "serving.json").write_text(json.dumps(manifest, indent=2))
    return seal_export(root)


def seal_export(root: Path) -> Path:
    """Records the size and SHA-256 of the export's files in its `serving.json` (as
    `embedlab.hps.export.write_manifest` does): after writing it, or after re-pointing a copy's
    JSON files at the copy. Returns `root`."""
    from embedlab.hps.export import record_files
    raw = json.loads((root / "serving.json").read_text())
    cfg = json.loads(Path(raw["ps_config_file"]).read_text())
    sparse = [p for m in cfg["models"] for p in m["sparse_files"]]
    raw.update(record_files(root, [raw["ps_config_file"], raw["onnx_file"], *sparse]))
    (root / "serving.json").write_text(json.dumps(raw, indent=2))
    return root


def random_keys(rng, batch: int, unknown: bool = True) -> np.ndarray:
    """Keys like HugeCTR's sample (slot s in [s*V, (s+1)*V)), with duplicates and some keys
    that exist nowhere (they get the table's default value)."""
    keys = np.stack([rng.integers(s * VOCAB_PER_SLOT, (s + 1) * VOCAB_PER_SLOT, batch)
                     for s in range(SLOTS)], axis=1).astype(np.int64)
    if batch > 1:
        keys[batch // 2] = keys[0]                               # a duplicate sample
    if unknown and batch > 2:
        keys[1, 1] = SLOTS * VOCAB_PER_SLOT + 12345              # a key not in the table
    return keys

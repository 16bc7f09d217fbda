"""Helpers of notebook 03 and the Session benchmark: the W&D data recipe, a memory probe, and
the same Wide & Deep written by hand in Keras (native `Embedding`, TFRecord input, Keras Adam).

None of this is needed to use the Session; it keeps the notebook to the story.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

__all__ = ["rss_mb", "peak_rss_mb", "prepare_wdl_data", "WDL_SLOTS", "set_capacity", "keras_wdl",
           "keras_wdl_dataset", "time_keras_fit", "time_session_train"]

# criteo2hugectr's W&D layout: the wide slot (the two crosses, 2 keys) first, then C1..C26.
WDL_SLOTS = [["C1_C2", "C3_C4"]] + [f"C{i}" for i in range(1, 27)]


def rss_mb() -> float:
    """Resident set size of this process, MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import os
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (VmHWM), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def prepare_wdl_data(out_dir, rows: int, n_lists: int = 5, seed: int = 0, files_per_list: int = 2,
                     progress: bool = False, freq_threshold: int = 6) -> dict:
    """HugeCTR's W&D data steps at any size: generate Criteo rows, preprocess with
    `normalize_dense` and `feature_cross`, split 36,672,493 : 9,168,124 (train : val+test, the
    latter halved), and write Norm files in `n_lists` training file lists with keysets plus an
    evaluation list (the validation split). Reuses `out_dir` when it is already complete.
    `freq_threshold` is the preprocessing's (HugeCTR's 6 by default: rarer categories share
    id 0); a lower one keeps more of the ids, a larger vocabulary from fewer generated rows.

    Returns:
        dict: lists, keysets, eval_list, parquet (train/val folders), slot_size_array, vocabulary
        (total distinct ids), keys_per_list, rows.
    """
    from ..data import criteo, formats
    out = Path(out_dir)
    meta_path = out / "wdl_meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if (meta.get("rows") == rows and meta.get("n_lists") == n_lists
                and meta.get("freq_threshold", 6) == freq_threshold):
            return meta
    out.mkdir(parents=True, exist_ok=True)
    txt = criteo.generate(out / "day.txt", rows=rows, seed=seed, progress=progress)
    res = criteo.preprocess(txt, out / "parquet", normalize_dense=True, feature_cross=True,
                            freq_threshold=freq_threshold, split=criteo.KAGGLE_SPLIT, progress=progress)
    n_train = res.rows["train"]
    samples_per_file = max(64, math.ceil(n_train / (n_lists * files_per_list)))
    lists = formats.parquet_to_norm(out / "parquet" / "train", out / "norm_train", samples_per_file=samples_per_file,
                                    files_per_list=files_per_list, slots=WDL_SLOTS, progress=progress)
    ev = formats.parquet_to_norm(out / "parquet" / "val", out / "norm_eval", samples_per_file=samples_per_file,
                                 slots=WDL_SLOTS, progress=progress)
    keysets = [str(l.with_suffix(".keyset")) for l in lists]
    sizes = list(res.slot_size_array)
    meta = {"rows": rows, "n_lists": n_lists, "freq_threshold": freq_threshold, "lists": [str(l) for l in lists], "keysets": keysets,
            "eval_list": str(ev[0]), "parquet": {"train": str(out / "parquet" / "train"),
                                                 "val": str(out / "parquet" / "val")},
            "slot_size_array": sizes, "columns": list(res.columns), "vocabulary": int(sum(sizes)),
            "keys_per_list": [int(len(formats.read_keyset(k))) for k in keysets],
            "split_rows": dict(res.rows), "samples_per_file": samples_per_file}
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


def set_capacity(json_path, capacity: int, out_path=None, hidden: int | None = None) -> str:
    """A copy of a W&D JSON with every embedding's `max_vocabulary_size_per_gpu` set to `capacity`
    (and, optionally, the hidden layers' width). Returns the path written."""
    j = json.loads(Path(json_path).read_text())
    for l in j["layers"]:
        hp = l.get("sparse_embedding_hparam")
        if hp is not None and "max_vocabulary_size_per_gpu" in hp:
            hp["max_vocabulary_size_per_gpu"] = int(capacity)
        if hidden and l.get("fc_param", {}).get("num_output", 1) > 1:
            l["fc_param"]["num_output"] = int(hidden)
    out = Path(out_path or json_path)
    out.write_text(json.dumps(j, indent=2))
    return str(out)


def keras_wdl(vocabulary: int, hidden: int = 1024, deep_dim: int = 16, dropout: float = 0.5, lr: float = 1e-3):
    """The W&D of HugeCTR's JSON written by hand in Keras: one `Embedding(vocabulary, 16)` over the
    26 deep ids, one `Embedding(vocabulary, 1)` summed over the 2 cross ids (the wide part),
    dense features concatenated, `hidden`-`hidden`-1 ReLU MLP with dropout, Keras Adam."""
    import keras
    import tensorflow as tf
    cats = [f"C{i}" for i in range(1, 27)]
    inputs = {"dense": keras.Input((13,), name="dense")}
    for c in cats + ["C1_C2", "C3_C4"]:
        inputs[c] = keras.Input((), dtype="int64", name=c)
    deep_ids = keras.ops.stack([inputs[c] for c in cats], axis=1)
    wide_ids = keras.ops.stack([inputs["C1_C2"], inputs["C3_C4"]], axis=1)
    deep = keras.layers.Reshape((26 * deep_dim,))(keras.layers.Embedding(vocabulary, deep_dim, name="deep")(deep_ids))
    wide = keras.ops.sum(keras.layers.Embedding(vocabulary, 1, name="wide")(wide_ids), axis=1)
    x = keras.layers.Concatenate()([deep, inputs["dense"]])
    for i in (1, 2):
        x = keras.layers.Dense(hidden, activation="relu", name=f"fc{i}")(x)
        x = keras.layers.Dropout(dropout, name=f"dropout{i}")(x)
    logit = keras.layers.Add(name="add1")([keras.layers.Dense(1, name="fc4")(x), wide])
    model = keras.Model(inputs, logit)
    model.compile(optimizer=keras.optimizers.Adam(lr), loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[keras.metrics.AUC(from_logits=True, name="auc")])
    del tf
    return model


def keras_wdl_dataset(tfrecord, batch: int):
    """`tf.data` over the TFRecord file (batch, `parse_example`, prefetch): the baseline input."""
    from ..data import formats
    from ..data.criteo import CAT_COLUMNS, INT_COLUMNS
    cols = ([("label", "float")] + [(c, "float") for c in INT_COLUMNS]
            + [(c, "int") for c in CAT_COLUMNS + ["C1_C2", "C3_C4"]])
    return formats.tfrecord_dataset(tfrecord, batch, columns=cols)


def time_keras_fit(model, ds, warmup_steps: int = 2):
    """(samples/s of one epoch of `model.fit` after a short warm-up fit that traces it, history)."""
    model.fit(ds.take(warmup_steps), epochs=1, verbose=0)
    n = 0
    for _, y in ds:
        n += int(y.shape[0])
    t = time.perf_counter()
    h = model.fit(ds, epochs=1, verbose=0)
    return n / (time.perf_counter() - t), h


def time_session_train(sess, lists, keysets=None):
    """(samples/s of `train()` over the lists, after one traced warm-up iteration; iterations)."""
    r = sess.get_data_reader_train()
    n, it, t = 0, 0, None
    for i, fl in enumerate(lists):
        r.set_file_list_source(fl)
        if keysets is not None:
            sess.get_model_oversubscriber().update(keysets[i])
        while sess.train():
            it += 1
            if t is None:
                sess.get_current_loss()
                t = time.perf_counter()
                continue
            n += sess.last_batch_size
    sess.get_current_loss()
    return n / (time.perf_counter() - t), it

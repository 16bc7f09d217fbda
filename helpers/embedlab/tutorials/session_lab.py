"""Helpers of notebook 03 and the Session benchmark: the W&D data recipe, HugeCTR's training loop
over (file list, keyset) pairs, memory probes, and the same Wide & Deep written by hand in Keras
(native `Embedding`, TFRecord input, Keras Adam).

None of this is needed to use the Session; it keeps the notebook to the story.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

__all__ = ["rss_mb", "peak_rss_mb", "memory_mb", "prepare_wdl_data", "WDL_SLOTS", "WDL_TABLES", "set_capacity",
           "train_passes", "format_metrics", "keras_wdl", "keras_wdl_dataset", "time_keras_fit", "time_session_train",
           "time_keras_and_session"]

# criteo2hugectr's W&D layout: the wide slot (the two crosses, 2 keys) first, then C1..C26.
WDL_SLOTS = [["C1_C2", "C3_C4"]] + [f"C{i}" for i in range(1, 27)]
# Which columns' keys each table of the W&D model holds: the wide embedding reads the wide slot,
# the deep one the 26 deep slots.
WDL_TABLES = {"wide": ["C1_C2", "C3_C4"], "deep": [f"C{i}" for i in range(1, 27)]}


def rss_mb() -> float:
    """Resident set size of this process, MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import os
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


_MALLINFO2 = []


def _mallinfo2():
    """glibc's mallinfo2() (all arenas), or None where it does not exist."""
    if not _MALLINFO2:
        import ctypes

        class Info(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                         "fsmblks", "uordblks", "fordblks", "keepcost")]
        try:
            fn = ctypes.CDLL("libc.so.6").mallinfo2
            fn.restype = Info
        except (OSError, AttributeError):
            fn = None
        _MALLINFO2.append(fn)
    return None if _MALLINFO2[0] is None else _MALLINFO2[0]()


def memory_mb(mapped_under=None) -> dict:
    """This process's resident memory, MiB, split as Linux accounts it (/proc/self/status).

    Returns:
        dict: `rss` (all resident pages), `anon` (heap, stacks, anonymous mappings: Python,
        NumPy, TensorFlow's tensors and runtime), `file` (pages of mapped files: shared
        libraries, memory-mapped data); with glibc, `malloc_in_use` (bytes in chunks that
        malloc handed out and that are not freed yet, NumPy's and TensorFlow's buffers among
        them) and `malloc_free` (freed chunks that malloc keeps in its arenas for reuse: resident
        where they have been touched, until `malloc_trim` or reuse); and, with `mapped_under` (a
        folder), `mapped`: the resident pages of the mappings of files under that folder (from
        /proc/self/smaps), e.g. the Session's host store under `temp_embedding_dir`.
    """
    import os
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[{"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file"}[key]] = int(value.split()[0]) / 1024
    info = _mallinfo2()
    if info is not None:
        out["malloc_in_use"] = (info.uordblks + info.hblkhd) / 2**20
        out["malloc_free"] = info.fordblks / 2**20
    if mapped_under is not None:
        root = os.path.realpath(mapped_under) + os.sep
        kib, inside = 0, False
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 5)
                if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):   # a mapping's first line
                    inside = len(head) == 6 and head[5].strip().startswith(root)
                elif inside and line.startswith("Rss:"):
                    kib += int(line.split()[1])
        out["mapped"] = kib / 1024
    return out


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
        (total distinct ids), keys_per_list (keys of each list's keyset, both tables together),
        table_keys_per_list and table_vocabulary ({"wide", "deep"}: the same per table of the
        W&D model, `WDL_TABLES`: what each table's working capacity and host store must hold),
        rows.
    """
    from ..data import criteo, formats
    out = Path(out_dir)
    meta_path = out / "wdl_meta.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if (meta.get("rows") == rows and meta.get("n_lists") == n_lists
                and meta.get("freq_threshold", 6) == freq_threshold and "table_keys_per_list" in meta):
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
    # A key is a global id: column j owns [offsets[j], offsets[j] + sizes[j]).
    col_of = {c: j for j, c in enumerate(res.columns)}
    ranges = {t: [(res.offsets[col_of[c]], res.offsets[col_of[c]] + sizes[col_of[c]]) for c in cols]
              for t, cols in WDL_TABLES.items()}

    def per_table(keys):
        return {t: int(sum(np.count_nonzero((keys >= lo) & (keys < hi)) for lo, hi in r)) for t, r in ranges.items()}

    in_lists = [per_table(formats.read_keyset(k).astype(np.int64)) for k in keysets]
    meta = {"rows": rows, "n_lists": n_lists, "freq_threshold": freq_threshold, "lists": [str(l) for l in lists], "keysets": keysets,
            "eval_list": str(ev[0]), "parquet": {"train": str(out / "parquet" / "train"),
                                                 "val": str(out / "parquet" / "val")},
            "slot_size_array": sizes, "columns": list(res.columns), "vocabulary": int(sum(sizes)),
            "keys_per_list": [int(len(formats.read_keyset(k))) for k in keysets],
            "table_keys_per_list": {t: [n[t] for n in in_lists] for t in WDL_TABLES},
            "table_vocabulary": {t: int(sum(hi - lo for lo, hi in r)) for t, r in ranges.items()},
            "split_rows": dict(res.rows), "samples_per_file": samples_per_file}
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


def set_capacity(json_path, capacity, out_path=None, hidden: int | None = None) -> str:
    """A copy of a HugeCTR JSON with the embeddings' `max_vocabulary_size_per_gpu` set (and,
    optionally, the hidden layers' width). Returns the path written.

    Args:
        capacity: one int for every embedding, or {embedding layer name: rows} naming each of
            them (a name the file lacks, or an embedding left out, is an error).
    """
    j = json.loads(Path(json_path).read_text())
    embeddings = [l for l in j["layers"] if "max_vocabulary_size_per_gpu" in l.get("sparse_embedding_hparam", {})]
    if isinstance(capacity, dict):
        names = [l["name"] for l in embeddings]
        if sorted(capacity) != sorted(names):
            raise ValueError(f"set_capacity: capacity names {sorted(capacity)}, but {json_path} has the "
                             f"embeddings {sorted(names)}")
        rows = {n: capacity[n] for n in names}
    else:
        rows = {l["name"]: capacity for l in embeddings}
    for n, r in rows.items():
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 1:
            raise ValueError(f"set_capacity: the capacity of {n!r} must be an integer >= 1, got {r!r}")
    for l in embeddings:
        l["sparse_embedding_hparam"]["max_vocabulary_size_per_gpu"] = int(rows[l["name"]])
    for l in j["layers"]:
        if hidden and l.get("fc_param", {}).get("num_output", 1) > 1:
            l["fc_param"]["num_output"] = int(hidden)
    out = Path(out_path or json_path)
    out.write_text(json.dumps(j, indent=2))
    return str(out)


def format_metrics(metrics, digits: int = 4) -> str:
    """HugeCTR's evaluation metrics `[("AUC", 0.4591060...)]` as 'AUC 0.4591'.

    Args:
        metrics: (name, value) pairs, as `Session.evaluation()` returns them.
        digits: decimals shown (an AUC from a few evaluation batches is not known better).

    Example:
        >>> format_metrics([("AUC", 0.45910608612814496)])
        'AUC 0.4591'
    """
    return ", ".join(f"{name} {float(value):.{digits}f}" for name, value in metrics)


def train_passes(sess, dataset, eval_list, *, eval_every: int, start: int = 0, history: list | None = None,
                 log: str = "eval") -> int:
    """HugeCTR's training loop (`wdl_from_scratch.py`, `wdl_from_stored.py`) on a Session built
    with model oversubscription: for each (file list, keyset file) of `dataset`, point the
    training reader at the list, `update` the model oversubscriber with the keyset, and `train()`
    until the list is exhausted, evaluating on `eval_list` every `eval_every` iterations.
    Iterations are counted from `start`.

    Args:
        history: if given, one dict per evaluation is appended: iteration, loss (the training
            loss of that iteration), auc, store_keys (keys in the host stores of all
            embeddings), and `memory_mb` of the process with `mapped` taken under the Session's
            host-store folder.
        log: "eval" prints HugeCTR's log lines (one per evaluation, metrics to 4 decimals, and
            one per file list); "pass" prints one line per file list, with its iterations and
            the evaluations made during it; None prints nothing.

    Returns:
        int: the iteration count after the last list (pass it to `download_params_to_files`).

    Example, on a Session built as notebook 03 builds it,
    `train_passes(sess, list(zip(lists, keysets)), eval_list, eval_every=10, log="pass")` prints
    lines such as `[EMBEDLAB][INFO] file_list.0.txt: iterations 0-11, evaluated at 0 (AUC 0.4591),
    10 (AUC 0.5873)`.
    """
    if isinstance(eval_every, bool) or not isinstance(eval_every, (int, np.integer)) or eval_every < 1:
        raise ValueError(f"train_passes: eval_every must be an integer >= 1, got {eval_every!r}")
    if log not in ("eval", "pass", None):
        raise ValueError(f"train_passes: log must be 'eval', 'pass' or None, got {log!r}")
    store_dir = sess.temp_embedding_dir or None
    data_reader_train = sess.get_data_reader_train()
    data_reader_eval = sess.get_data_reader_eval()
    data_reader_eval.set_file_list_source(eval_list)
    model_oversubscriber = sess.get_model_oversubscriber()
    iteration = start
    for file_list, keyset_file in dataset:
        data_reader_train.set_file_list_source(file_list)
        model_oversubscriber.update(keyset_file)
        first, evals = iteration, []
        while sess.train():
            if iteration % eval_every == 0:
                metrics = sess.evaluation()
                if history is not None:
                    history.append({"iteration": iteration, "loss": sess.get_current_loss(), "auc": metrics[0][1],
                                    "store_keys": sum(len(e.store) for e in sess.embeddings if e.store is not None),
                                    **memory_mb(store_dir)})
                evals.append(f"{iteration} ({format_metrics(metrics)})")
                if log == "eval":
                    print("[EMBEDLAB][INFO] iter: {}, metrics: {}".format(iteration, format_metrics(metrics)))
            iteration += 1
        if log == "eval":
            print("[EMBEDLAB][INFO] trained with data in {}".format(Path(file_list).name))
        elif log == "pass":
            print("[EMBEDLAB][INFO] {}: iterations {}-{}{}".format(
                Path(file_list).name, first, iteration - 1,
                ", evaluated at " + ", ".join(evals) if evals else ", no evaluation"))
    return iteration


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


def keras_wdl_dataset(tfrecord, batch: int, rows: int | None = None):
    """`tf.data` over the TFRecord file (batch, `parse_example`, prefetch): the baseline input.

    With `rows` (the records in the file) the dataset knows its length, ceil(rows / batch)
    batches, as Keras expects of an epoch (a dataset of unknown length makes `fit` and
    `evaluate` warn that the input "ran out of data"); reading a different count is an error.
    """
    from ..data import formats
    from ..data.criteo import CAT_COLUMNS, INT_COLUMNS
    cols = ([("label", "float")] + [(c, "float") for c in INT_COLUMNS]
            + [(c, "int") for c in CAT_COLUMNS + ["C1_C2", "C3_C4"]])
    ds = formats.tfrecord_dataset(tfrecord, batch, columns=cols)
    if rows is not None:
        import tensorflow as tf
        if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
            raise ValueError(f"keras_wdl_dataset: rows must be an integer >= 1, got {rows!r}")
        ds = ds.apply(tf.data.experimental.assert_cardinality(-(-int(rows) // int(batch))))
    return ds


def time_keras_fit(model, ds, warmup_steps: int = 2):
    """(samples/s of one epoch of `model.fit` after a short warm-up fit that traces it, history).

    The dataset's order is used as it is (`shuffle=False`: Keras cannot shuffle a `tf.data`
    dataset and warns when asked to)."""
    model.fit(ds.take(warmup_steps), epochs=1, verbose=0, shuffle=False)
    n = 0
    for _, y in ds:
        n += int(y.shape[0])
    t = time.perf_counter()
    h = model.fit(ds, epochs=1, verbose=0, shuffle=False)
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


def time_keras_and_session(model, ds, sess, lists, rounds: int = 3) -> dict:
    """Samples/s of one epoch of the Keras model and of the Session, in turn, `rounds` times.

    Each round times one `model.fit` epoch over `ds`, then one Session pass over `lists`, so a
    slow phase of a shared machine hits both alike; the first round is preceded by a short
    warm-up fit that traces Keras' step (the Session's first iteration of each pass is its
    warm-up, see `time_session_train`). Both models go on training from round to round.

    Args:
        model: a compiled Keras model. ds: its `tf.data` dataset (known length).
        sess: a Session. lists: its training file lists.
        rounds: timed rounds (>= 1).

    Returns:
        {"keras": float array, "session": float array} of samples/s per round, paired by round
        (compare them with `embedlab.timing.compare(..., higher_is_better=True)`).

    Example, with notebook 03's model, dataset, Session and lists:
    `sps = time_keras_and_session(model, ds, sess, lists, rounds=3)`, then
    `embedlab.timing.compare(sps["session"], sps["keras"], "Session", "Keras", higher_is_better=True).sentence()`.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise ValueError(f"time_keras_and_session: rounds must be an integer >= 1, got {rounds!r}")
    model.fit(ds.take(2), epochs=1, verbose=0, shuffle=False)          # traces the train step
    n = sum(int(y.shape[0]) for _, y in ds)
    out = {"keras": [], "session": []}
    for _ in range(rounds):
        t = time.perf_counter()
        model.fit(ds, epochs=1, verbose=0, shuffle=False)
        out["keras"].append(n / (time.perf_counter() - t))
        out["session"].append(time_session_train(sess, lists)[0])
    return {k: np.asarray(v) for k, v in out.items()}

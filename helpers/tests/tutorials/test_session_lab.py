"""embedlab.tutorials.session_lab, the helpers of notebook 03: per-table key counts against the Norm files
read back, per-embedding capacities, HugeCTR's training loop, memory probes, and the Keras
baseline's input (known length, no Keras warnings)."""
from __future__ import annotations

import json
import math
import mmap
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from embedlab.data import formats
from embedlab.session import Session, solver_parser_helper
from embedlab.tutorials import session_lab as lab

from session.sessionlib import dump, wdl_json, write_lists     # tests/session's helpers (tests/ is on sys.path)


@pytest.fixture(scope="module")
def wdl_meta(tmp_path_factory):
    d = tmp_path_factory.mktemp("wdl_data")
    return lab.prepare_wdl_data(d, 6_000, n_lists=4, freq_threshold=1)


def test_table_keys_per_list_match_the_norm_files(wdl_meta):
    """Each list's keys per table, counted from the keyset by id range, equal the distinct keys
    of the wide slot (slot 0) and of the 26 deep slots read back from the list's Norm files."""
    meta = wdl_meta
    assert len(meta["lists"]) == 4 and set(meta["table_keys_per_list"]) == {"wide", "deep"}
    for i, fl in enumerate(meta["lists"]):
        wide, deep = [], []
        for f in formats.read_file_list(fl):
            rec = formats.read_norm(f)
            wide.append(rec.slots[0][1])
            deep += [s[1] for s in rec.slots[1:]]
        n_wide, n_deep = len(np.unique(np.concatenate(wide))), len(np.unique(np.concatenate(deep)))
        assert meta["table_keys_per_list"]["wide"][i] == n_wide
        assert meta["table_keys_per_list"]["deep"][i] == n_deep
        assert n_wide + n_deep == meta["keys_per_list"][i]
    sizes = dict(zip(meta["columns"], meta["slot_size_array"]))
    assert meta["table_vocabulary"]["wide"] == sizes["C1_C2"] + sizes["C3_C4"]
    assert meta["table_vocabulary"]["deep"] == sum(sizes[f"C{i}"] for i in range(1, 27))
    # every category kept and 4 lists: one list holds a part of each table's keys
    for t in ("wide", "deep"):
        assert max(meta["table_keys_per_list"][t]) < meta["table_vocabulary"][t]


def test_prepare_wdl_data_reuses_only_matching_data(tmp_path):
    a = lab.prepare_wdl_data(tmp_path, 3_000, n_lists=2, freq_threshold=1)
    mtime = Path(a["lists"][0]).stat().st_mtime_ns
    assert lab.prepare_wdl_data(tmp_path, 3_000, n_lists=2, freq_threshold=1) == a
    assert Path(a["lists"][0]).stat().st_mtime_ns == mtime
    b = lab.prepare_wdl_data(tmp_path, 3_000, n_lists=3, freq_threshold=1)
    assert len(b["lists"]) == 3 and len(b["table_keys_per_list"]["deep"]) == 3


def _capacities(path):
    j = json.loads(Path(path).read_text())
    return {l["name"]: l["sparse_embedding_hparam"]["max_vocabulary_size_per_gpu"] for l in j["layers"]
            if "sparse_embedding_hparam" in l}


def test_set_capacity_per_embedding(tmp_path):
    src = dump(tmp_path / "m.json", wdl_json(capacity=99, hidden=8))
    one = lab.set_capacity(src, 123, tmp_path / "one.json")
    assert _capacities(one) == {"sparse_embedding2": 123, "sparse_embedding1": 123}
    per = lab.set_capacity(src, {"sparse_embedding2": 10, "sparse_embedding1": 20}, tmp_path / "per.json", hidden=5)
    assert _capacities(per) == {"sparse_embedding2": 10, "sparse_embedding1": 20}
    fc = {l["name"]: l["fc_param"]["num_output"] for l in json.loads(Path(per).read_text())["layers"] if "fc_param" in l}
    assert fc == {"fc1": 5, "fc4": 1}
    assert _capacities(src) == {"sparse_embedding2": 99, "sparse_embedding1": 99}     # the source is untouched
    with pytest.raises(ValueError, match="embeddings"):
        lab.set_capacity(src, {"sparse_embedding2": 10}, tmp_path / "x.json")
    with pytest.raises(ValueError, match="embeddings"):
        lab.set_capacity(src, {"sparse_embedding2": 10, "sparse_embedding1": 20, "other": 3}, tmp_path / "x.json")
    with pytest.raises(ValueError, match="sparse_embedding1"):
        lab.set_capacity(src, {"sparse_embedding2": 10, "sparse_embedding1": 0}, tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def test_train_passes_runs_hugectrs_loop(tmp_path, rng, capsys):
    lists, keysets, ev = write_lists(tmp_path / "d", rng, [(1, 2), (4, 1)], n_lists=3, files_per_list=2,
                                     per_file=64, vocab=30)
    js = dump(tmp_path / "m.json", wdl_json(capacity=400, hidden=8))
    sess = Session(solver_parser_helper(batchsize=32, batchsize_eval=32, max_eval_batches=2), js, True,
                   str(tmp_path / "store"))
    history = []
    end = lab.train_passes(sess, list(zip(lists, keysets)), ev, eval_every=3, start=5, history=history)
    assert end == 5 + 3 * 2 * 64 // 32                         # every batch of every list
    assert [h["iteration"] for h in history] == [i for i in range(5, end) if i % 3 == 0]
    for h in history:
        assert 0 <= h["auc"] <= 1 and np.isfinite(h["loss"]) and h["rss"] > 0 and h["mapped"] >= 0
    keys = [h["store_keys"] for h in history]
    assert keys == sorted(keys) and 0 < keys[-1] <= sum(len(e.store) for e in sess.embeddings)
    assert len(sess.get_model_oversubscriber().switches) == 3
    with pytest.raises(ValueError, match="eval_every"):
        lab.train_passes(sess, list(zip(lists, keysets)), ev, eval_every=0)
    out = capsys.readouterr().out
    assert out.count("[EMBEDLAB][INFO] iter:") == len(history)
    assert [l.split()[-1] for l in out.splitlines() if "trained with data in" in l] == [Path(l).name for l in lists]
    # Metrics to 4 decimals, not float repr's 17 digits.
    for line in (l for l in out.splitlines() if "iter:" in l):
        assert re.fullmatch(r"\[EMBEDLAB\]\[INFO\] iter: \d+, metrics: AUC \d\.\d{4}", line), line
    # One line per file list, naming its iterations and evaluations.
    history2 = []
    end2 = lab.train_passes(sess, list(zip(lists, keysets)), ev, eval_every=3, start=end, history=history2, log="pass")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(lists) and all(Path(l).name in line for l, line in zip(lists, lines))
    assert lines[0].startswith(f"[EMBEDLAB][INFO] file_list.0.txt: iterations {end}-")
    assert sum(line.count("(AUC ") for line in lines) == len(history2) and end2 > end
    lab.train_passes(sess, list(zip(lists, keysets)), ev, eval_every=100, log=None)
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="log"):
        lab.train_passes(sess, list(zip(lists, keysets)), ev, eval_every=3, log="all")


def test_format_metrics():
    assert lab.format_metrics([("AUC", 0.45910608612814496)]) == "AUC 0.4591"
    assert lab.format_metrics([("AUC", 1), ("loss", 0.123456)], digits=2) == "AUC 1.00, loss 0.12"


def test_memory_mb_sees_mapped_pages_come_and_go(tmp_path):
    other = lab.memory_mb()
    assert {"rss", "anon", "file"} <= set(other) and "mapped" not in other
    assert other["rss"] >= other["anon"] > 0
    if "malloc_in_use" in other:                              # glibc
        before = other["malloc_in_use"]
        block = np.ones(64 << 20, np.uint8)                   # 64 MiB from malloc, in use
        assert lab.memory_mb()["malloc_in_use"] >= before + 60
        del block
        assert lab.memory_mb()["malloc_in_use"] < before + 4
    path = tmp_path / "store" / "values.f32"
    path.parent.mkdir()
    n = 8 << 20
    path.write_bytes(b"\0" * n)
    m = np.memmap(path, dtype=np.uint8, mode="r+", shape=(n,))
    assert lab.memory_mb(tmp_path / "store")["mapped"] < 1
    m[::4096] = 1                                             # touch every page
    assert lab.memory_mb(tmp_path / "store")["mapped"] >= 7.9
    assert lab.memory_mb(tmp_path / "elsewhere")["mapped"] == 0
    m._mmap.madvise(mmap.MADV_DONTNEED)
    assert lab.memory_mb(tmp_path / "store")["mapped"] < 1
    del m


def test_keras_dataset_has_its_length_and_fit_does_not_warn(tmp_path, wdl_meta):
    meta = wdl_meta
    tfr = tmp_path / "train.tfrecord"
    formats.parquet_to_tfrecord(meta["parquet"]["train"], tfr)
    rows, batch = meta["split_rows"]["train"], 512
    ds = lab.keras_wdl_dataset(tfr, batch, rows=rows)
    assert int(ds.cardinality()) == math.ceil(rows / batch)
    model = lab.keras_wdl(meta["vocabulary"], hidden=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sps, _ = lab.time_keras_fit(model, ds)
        model.evaluate(ds, verbose=0)
    assert sps > 0
    assert not [str(w.message) for w in caught if "keras" in w.filename], [str(w.message) for w in caught]
    with pytest.raises(Exception, match="expected to contain"):
        for _ in lab.keras_wdl_dataset(tfr, batch, rows=rows - batch):
            pass
    with pytest.raises(ValueError, match="rows"):
        lab.keras_wdl_dataset(tfr, batch, rows=0)


def test_time_keras_and_session_pairs_the_rounds(tmp_path, wdl_meta):
    meta = wdl_meta
    tfr = tmp_path / "train.tfrecord"
    formats.parquet_to_tfrecord(meta["parquet"]["train"], tfr)
    ds = lab.keras_wdl_dataset(tfr, 512, rows=meta["split_rows"]["train"])
    model = lab.keras_wdl(meta["vocabulary"], hidden=8)
    js = dump(tmp_path / "m.json", wdl_json(capacity=meta["vocabulary"] + 16, deep_slots=26, hidden=8))
    sess = Session(solver_parser_helper(batchsize=512, batchsize_eval=512), js)
    steps_before = int(model.optimizer.iterations.numpy())
    sps = lab.time_keras_and_session(model, ds, sess, meta["lists"], rounds=2)
    assert set(sps) == {"keras", "session"} and all(len(v) == 2 and (v > 0).all() for v in sps.values())
    # Warm-up (2 steps) and two whole epochs of Keras; the Session trained on too.
    assert int(model.optimizer.iterations.numpy()) - steps_before == 2 + 2 * int(ds.cardinality())
    with pytest.raises(ValueError, match="rounds"):
        lab.time_keras_and_session(model, ds, sess, meta["lists"], rounds=0)

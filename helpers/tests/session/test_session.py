"""Session: training against NumPy oracles, stored models read back independently,
oversubscription == whole table in memory, resume == uninterrupted, and bad input."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embedlab.session import (DenseModelError, EmbeddingKeyError, FormatError, Session, auc,
                              solver_parser_helper)
from embedlab.session.step import StepInputs

from sessionlib import dump, wdl_json, write_lists

DATA = Path(__file__).parent / "data"


def read_sparse(path, vec):
    """Independent reader of a sparse model folder (raw files, no embedlab code)."""
    keys = np.fromfile(Path(path) / "key", dtype="<i8")
    vals = np.fromfile(Path(path) / "emb_vector", dtype="<f4").reshape(-1, vec)
    assert len(keys) == len(vals) == len(np.unique(keys))
    return dict(zip(keys.tolist(), vals))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def train_lists(sess, lists, keysets=None, evaluate_every=0):
    r = sess.get_data_reader_train()
    it, aucs = 0, []
    for i, fl in enumerate(lists):
        r.set_file_list_source(fl)
        if keysets is not None:
            sess.get_model_oversubscriber().update(keysets[i])
        while sess.train():
            it += 1
            if evaluate_every and it % evaluate_every == 0:
                aucs.append(sess.evaluation()[0][1])
    return it, aucs


@pytest.fixture(scope="module")
def wd_data(tmp_path_factory):
    rng = np.random.default_rng(7)
    d = tmp_path_factory.mktemp("wd")
    return write_lists(d, rng, [(1, 2), (4, 1)], n_lists=4, files_per_list=2, per_file=96, vocab=60)


def test_sgd_step_matches_numpy(tmp_path, wd_data):
    """One SGD step on a linear W&D (mean combiner, multi-hot wide slot): the downloaded tables and
    dense weights equal a NumPy forward + backward + update from the initial ones."""
    lists, _, _ = wd_data
    j = wdl_json(combiner=1, hidden=3, optimizer={"type": "SGD", "sgd_hparam": {"learning_rate": 0.5}})
    # linear: drop the ReLU so the oracle stays short
    j["layers"] = [l for l in j["layers"] if l["type"] != "ReLU"]
    j["layers"][[l["name"] for l in j["layers"]].index("fc4")]["bottom"] = "fc1"
    sess = Session(solver_parser_helper(batchsize=64, seed=3), dump(tmp_path / "m.json", j))
    r = sess.get_data_reader_train()
    r.set_file_list_source(lists[0])
    sess.download_params_to_files(str(tmp_path / "a"), 0)      # the initial state (no key yet)
    from embedlab.session.reader import read_norm_block
    batch = read_norm_block(Path(open(lists[0]).read().split()[1]), sess.spec.data, False).slice(0, 64)
    w1, b1, w4, b4 = [v.numpy() for v in sess.dense.weights()]
    assert sess.train()
    sess.download_params_to_files(str(tmp_path / "b"), 1)
    wide, deep = read_sparse(tmp_path / "b0_sparse_1.model", 1), read_sparse(tmp_path / "b1_sparse_1.model", 4)
    from embedlab.session.embedding import init_values

    def init(keys, vec, e):
        return {k: v for k, v in zip(keys, init_values(np.array(keys), vec, 3, e))}
    (ws, wk), (ds, dk) = batch.sparse
    wide0, deep0 = init(sorted(set(wk.tolist())), 1, 0), init(sorted(set(dk.tolist())), 4, 1)
    B = 64
    wide_out = np.array([np.mean([wide0[k] for k in wk[ws[b]:ws[b + 1]]], axis=0) for b in range(B)])
    deep_out = np.stack([np.mean([deep0[k] for k in dk[ds[r]:ds[r + 1]]], axis=0) for r in range(B * 4)])
    x = np.concatenate([deep_out.reshape(B, 16), batch.dense], 1)
    h = x @ w1 + b1
    logit = h @ w4 + b4 + wide_out
    g = (sigmoid(logit) - batch.label) / B                                   # dL/dlogit
    gh = g @ w4.T
    gx = gh @ w1.T
    lr = 0.5
    dense_new = [w1 - lr * x.T @ gh, b1 - lr * gh.sum(0), w4 - lr * h.T @ g, b4 - lr * g.sum(0)]
    got = np.fromfile(tmp_path / "b_dense_1.model", dtype="<f4")
    np.testing.assert_allclose(got, np.concatenate([a.ravel() for a in dense_new]), rtol=2e-5, atol=2e-6)
    gw, gd = {}, {}
    for b in range(B):
        ks = wk[ws[b]:ws[b + 1]]
        for k in ks:
            gw[k] = gw.get(k, 0) + g[b] / len(ks)
        for s in range(4):
            r_ = b * 4 + s
            ks = dk[ds[r_]:ds[r_ + 1]]
            for k in ks:
                gd[k] = gd.get(k, 0) + gx[b, 4 * s:4 * s + 4] / len(ks)
    assert set(wide) == set(gw) and set(deep) == set(gd)
    for k in gw:
        np.testing.assert_allclose(wide[k], wide0[k] - lr * gw[k], rtol=1e-5, atol=1e-6)
    for k in gd:
        np.testing.assert_allclose(deep[k], deep0[k] - lr * gd[k], rtol=1e-5, atol=1e-6)


def test_train_eval_download_numpy_forward(tmp_path, wd_data):
    """Training (Adam, dropout), evaluation AUC, and the stored files: a NumPy forward from the
    files read independently gives the Session's evaluation predictions."""
    lists, _, ev = wd_data
    sess = Session(solver_parser_helper(batchsize=64, batchsize_eval=50, max_eval_batches=2),
                   dump(tmp_path / "m.json", wdl_json(dropout=0.5, hidden=8)))
    sess.get_data_reader_eval().set_file_list_source(ev)
    losses = []
    r = sess.get_data_reader_train()
    r.set_file_list_source(lists[0])
    while sess.train():
        losses.append(sess.get_current_loss())
    assert len(losses) == 3 and all(np.isfinite(losses))
    (name, value), = sess.evaluation()
    assert name == "AUC" and 0.0 <= value <= 1.0
    sess.download_params_to_files(str(tmp_path / "m"), 3)
    wide, deep = read_sparse(tmp_path / "m0_sparse_3.model", 1), read_sparse(tmp_path / "m1_sparse_3.model", 4)
    assert not (tmp_path / "m1_sparse_3.model" / "slot_id").exists()
    flat = np.fromfile(tmp_path / "m_dense_3.model", dtype="<f4")
    assert flat.size == (29 * 8 + 8 + 8 + 1)
    w1, b1 = flat[:232].reshape(29, 8), flat[232:240]
    w4, b4 = flat[240:248].reshape(8, 1), flat[248:]
    from embedlab.session.reader import read_norm_block
    blk = read_norm_block(Path(ev).parent / "eval_0.data", sess.spec.data, False).slice(0, 50)
    (ws, wk), (ds, dk) = blk.sparse
    z1, z4 = np.zeros(1, np.float32), np.zeros(4, np.float32)
    wide_out = np.array([sum((wide.get(k, z1) for k in wk[ws[b]:ws[b + 1]]), z1) for b in range(50)])
    deep_out = np.stack([sum((deep.get(k, z4) for k in dk[ds[r_]:ds[r_ + 1]]), z4) for r_ in range(200)])
    x = np.concatenate([deep_out.reshape(50, 16), blk.dense], 1)
    pred = sigmoid(np.maximum(x @ w1 + b1, 0) @ w4 + b4 + wide_out)
    rows = [e.translate_eval(keys) for e, (_, keys) in zip(sess.embeddings, blk.sparse)]
    got = sess._eval_fn(StepInputs.eval(blk, blk.sparse, rows))[0].numpy()
    np.testing.assert_allclose(got, pred, rtol=1e-5, atol=1e-6)


def test_auc_oracle(rng):
    y = (rng.random(500) > 0.6).astype(np.float32)
    s = np.round(rng.random(500) + y * 0.3, 1)            # ties included
    pos, neg = s[y == 1], s[y == 0]
    ref = ((pos[:, None] > neg[None]).sum() + 0.5 * (pos[:, None] == neg[None]).sum()) / (len(pos) * len(neg))
    assert auc(y, s) == pytest.approx(ref)


@pytest.mark.parametrize("optimizer", ["Adam", "SGD"])
def test_oversubscription_equals_in_memory(tmp_path, wd_data, optimizer):
    """Same seed, same data order: the oversubscribed run (working tables smaller than the
    model) ends with the same tables and dense weights as the run with everything in memory.
    Per row, both runs sum the same gradient contributions in the same order (rows differ,
    keys don't), so the results agree to the bit; the tolerance only allows for a different
    float summation order (<= 1e-6 relative)."""
    lists, keysets, _ = wd_data
    opt = None if optimizer == "Adam" else {"type": "SGD", "sgd_hparam": {"learning_rate": 0.2}}
    deep = [(lambda k: k[k >= 4000])(np.fromfile(k, "<u4")) for k in keysets]     # slots 1.. of the data
    cap = max(len(k) for k in deep) + 5
    assert cap < len(np.unique(np.concatenate(deep)))   # really oversubscribed: the deep table does not fit
    outs = []
    for over in (False, True):
        j = wdl_json(capacity=cap if over else 4 * cap, dropout=0.3, optimizer=opt)
        sess = Session(solver_parser_helper(batchsize=64, seed=11), dump(tmp_path / f"m{over}.json", j),
                       over, str(tmp_path / "tmp_emb") if over else "")
        train_lists(sess, lists, keysets if over else None)
        sess.download_params_to_files(str(tmp_path / f"o{over}"), 0)
        outs.append(tmp_path / f"o{over}")
        if over:
            sw = sess.get_model_oversubscriber().switches
            assert len(sw) == 4 and all(s["bytes"] > 0 for s in sw[1:])
            assert len(sess.embeddings[1].store) > cap
    for i, vec in ((0, 1), (1, 4)):
        a, b = read_sparse(f"{outs[0]}{i}_sparse_0.model", vec), read_sparse(f"{outs[1]}{i}_sparse_0.model", vec)
        assert set(a) == set(b)
        ka = sorted(a)
        np.testing.assert_allclose(np.stack([a[k] for k in ka]), np.stack([b[k] for k in ka]), rtol=1e-6, atol=1e-7)
    da = np.fromfile(f"{outs[0]}_dense_0.model", "<f4")
    db = np.fromfile(f"{outs[1]}_dense_0.model", "<f4")
    np.testing.assert_allclose(da, db, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("oversubscribe", [False, True])
def test_deferred_global_adam_equals_full_pass_to_the_bit(tmp_path, wd_data, monkeypatch, oversubscribe):
    """Global Adam with deferred rows (each row replays the zero-gradient steps it missed when it
    is read, every row at least every GLOBAL_SYNC_EVERY steps) against the full pass over every
    row at every step: same losses, stored tables and dense weights, bit for bit, across
    evaluations, pass switches and a sync interval shorter than the run.

    (Under oversubscription the reader thread may hand out rows in another order after a pass
    switch, so there the stored models are compared key by key, and the evaluation AUCs, which
    count only rows initialized so far, are not compared.)"""
    from embedlab.session.embedding import Embedding
    lists, keysets, ev = wd_data
    monkeypatch.setattr(Embedding, "GLOBAL_SYNC_EVERY", 5)
    deep = [(lambda k: k[k >= 4000])(np.fromfile(k, "<u4")) for k in keysets]
    cap = max(len(k) for k in deep) + 5
    runs = []
    for defer in (True, False):
        monkeypatch.setattr(Embedding, "DEFER_GLOBAL", defer)
        j = wdl_json(capacity=cap if oversubscribe else 4 * cap, dropout=0.3, update="Global")
        sess = Session(solver_parser_helper(batchsize=24, batchsize_eval=50, max_eval_batches=2, seed=3),
                       dump(tmp_path / f"m{defer}.json", j), oversubscribe,
                       str(tmp_path / f"store{defer}") if oversubscribe else "")
        assert all(e.deferred_global == defer for e in sess.embeddings)
        sess.get_data_reader_eval().set_file_list_source(ev)
        losses, aucs = [], []
        r = sess.get_data_reader_train()
        for i, fl in enumerate(lists):
            r.set_file_list_source(fl)
            if oversubscribe:
                sess.get_model_oversubscriber().update(keysets[i])
            while sess.train():
                losses.append(sess.get_current_loss())
                if len(losses) % 7 == 0:
                    aucs.append(sess.evaluation()[0][1])
        assert len(losses) == 32 and len(aucs) == 4         # 6 syncs, 4 evaluations
        sess.download_params_to_files(str(tmp_path / f"o{defer}"), 0)
        runs.append((losses, aucs, tmp_path / f"o{defer}"))
    (la, aa, oa), (lb, ab, ob) = runs
    assert la == lb
    if not oversubscribe:
        assert aa == ab
    for i, vec in ((0, 1), (1, 4)):
        a, b = read_sparse(f"{oa}{i}_sparse_0.model", vec), read_sparse(f"{ob}{i}_sparse_0.model", vec)
        assert set(a) == set(b)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    assert Path(f"{oa}_dense_0.model").read_bytes() == Path(f"{ob}_dense_0.model").read_bytes()


def test_resume_from_stored_model_sgd_exact(tmp_path, wd_data):
    """Lists 0-1, download, load (model_file + embedding_files), list 2 == lists 0-2 in one go."""
    lists, _, _ = wd_data
    j = dump(tmp_path / "m.json", wdl_json(optimizer={"type": "SGD", "sgd_hparam": {"learning_rate": 0.3}}))
    full = Session(solver_parser_helper(batchsize=64, seed=5), j)
    train_lists(full, lists[:3])
    full.download_params_to_files(str(tmp_path / "full"), 9)
    first = Session(solver_parser_helper(batchsize=64, seed=5), j)
    n, _ = train_lists(first, lists[:2])
    first.download_params_to_files(str(tmp_path / "half"), n)
    resumed = Session(solver_parser_helper(batchsize=64, seed=5, model_file=f"{tmp_path}/half_dense_{n}.model",
                                           embedding_files=[f"{tmp_path}/half0_sparse_{n}.model",
                                                            f"{tmp_path}/half1_sparse_{n}.model"]), j)
    train_lists(resumed, lists[2:3])
    resumed.download_params_to_files(str(tmp_path / "res"), 9)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "full_dense_9.model", "<f4"),
                                  np.fromfile(tmp_path / "res_dense_9.model", "<f4"))
    for i, vec in ((0, 1), (1, 4)):
        a, b = read_sparse(tmp_path / f"full{i}_sparse_9.model", vec), read_sparse(tmp_path / f"res{i}_sparse_9.model", vec)
        assert set(a) == set(b)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


# ---- bad input -------------------------------------------------------------------------

def test_capacity_overflow_names_key_and_trains_nothing(tmp_path, wd_data):
    lists, _, _ = wd_data
    sess = Session(solver_parser_helper(batchsize=64), dump(tmp_path / "m.json", wdl_json(capacity=30)))
    r = sess.get_data_reader_train()
    r.set_file_list_source(lists[0])
    before = [v.numpy().copy() for v in sess.dense.weights()]
    size0 = sess.embeddings[1].keys_table.size()
    with pytest.raises(EmbeddingKeyError, match=r"embedding 'sparse_embedding[12]': key \d+ of slot \d .*"
                                                r"file list .*file_list.0.txt does not fit.*max_vocabulary_size_per_gpu is 30"):
        while sess.train():
            pass
    assert sess.iteration <= 1
    if sess.iteration == 0:
        for a, v in zip(before, sess.dense.weights()):
            np.testing.assert_array_equal(a, v.numpy())
    assert sess.embeddings[1].keys_table.size() <= 30 and sess.embeddings[1].keys_table.size() >= size0


def test_keyset_lacking_a_key(tmp_path, wd_data):
    lists, keysets, _ = wd_data
    ks = np.fromfile(keysets[0], "<u4")
    from embedlab.session.reader import read_norm_block
    sess = Session(solver_parser_helper(batchsize=64), dump(tmp_path / "m.json", wdl_json(capacity=500)), True,
                   str(tmp_path / "tmp"))
    first = Path(open(lists[0]).read().split()[1])
    deep_keys = read_norm_block(first, sess.spec.data, False).sparse[1][1]
    missing = int(deep_keys[0])
    (tmp_path / "short.keyset").write_bytes(ks[ks != missing].astype("<u4").tobytes())
    sess.get_data_reader_train().set_file_list_source(lists[0])
    sess.get_model_oversubscriber().update(str(tmp_path / "short.keyset"))
    table0 = sess.embeddings[1].table.numpy().copy()
    with pytest.raises(EmbeddingKeyError, match=rf"key {missing} of slot 0 .*record 0\) in file list "
                                                r".*file_list.0.txt is not in the loaded keysets"):
        sess.train()
    assert sess.iteration == 0
    np.testing.assert_array_equal(table0, sess.embeddings[1].table.numpy())
    # a keyset larger than the working tables
    small = Session(solver_parser_helper(batchsize=64), dump(tmp_path / "s.json", wdl_json(capacity=10)), True,
                    str(tmp_path / "tmp2"))
    with pytest.raises(EmbeddingKeyError, match="more than the working tables hold"):
        small.get_model_oversubscriber().update(keysets[0])


def test_model_file_and_embedding_files_errors(tmp_path, wd_data):
    lists, _, _ = wd_data
    j = dump(tmp_path / "m.json", wdl_json())
    sess = Session(solver_parser_helper(batchsize=64), j)
    sess.download_params_to_files(str(tmp_path / "x"), 0)
    raw = (tmp_path / "x_dense_0.model").read_bytes()
    (tmp_path / "short.model").write_bytes(raw[:-4])
    with pytest.raises(DenseModelError, match=r"short.model: \d+ bytes, but the JSON's dense weights take 249"):
        Session(solver_parser_helper(batchsize=64, model_file=str(tmp_path / "short.model")), j)
    with pytest.raises(ValueError, match="embedding_files lists 1 sparse models but .* has 2 embeddings"):
        Session(solver_parser_helper(batchsize=64, embedding_files=[str(tmp_path / "x0_sparse_0.model")]), j)
    with pytest.raises(ValueError, match="vvgpu"):
        Session(solver_parser_helper(vvgpu=[[0, 1]]), j)
    with pytest.raises(RuntimeError, match="oversubscription is off"):
        sess.get_model_oversubscriber()


def test_one_hot_key_out_of_range(tmp_path, rng):
    j = json.loads((DATA / "dcn.json").read_text())
    j["layers"][0]["sparse"][0]["type"] = "LocalizedSlot"
    j["layers"][0]["sparse"][0]["slot_num"] = 3
    j["layers"][1]["type"] = "LocalizedSlotSparseEmbeddingOneHot"
    j["layers"][1]["sparse_embedding_hparam"] = {"slot_size_array": [40, 40, 40], "embedding_vec_size": 16,
                                                 "combiner": 0}
    j["layers"][2]["leading_dim"] = 48
    for l in j["layers"]:
        if l["name"] == "slice1":
            l["ranges"] = [[0, 61], [0, 61]]
        if l.get("fc_param", {}).get("num_output") == 1024:
            l["fc_param"]["num_output"] = 8
    lists, _, _ = write_lists(tmp_path / "d", rng, [(3, 1)], n_lists=1, files_per_list=1, per_file=40,
                              vocab=40, one_hot=True)
    sess = Session(solver_parser_helper(batchsize=20), dump(tmp_path / "m.json", j))
    sess.get_data_reader_train().set_file_list_source(lists[0])
    # slot s of this data draws keys in [0, 40): only slot 0's keys lie in slot 0's range [0, 40)
    with pytest.raises(EmbeddingKeyError, match=r"key \d+ of slot [12] .* outside the slot's slot_size_array range"):
        sess.train()


@pytest.mark.parametrize("name", ["wdl.json", "deepfm.json", "dcn.json", "dcn_localized_embedding.json",
                                  "criteo.json"])
def test_hugectr_samples_train_unchanged(tmp_path, rng, name):
    """HugeCTR v2.3's sample model files, unchanged, train and evaluate on data of their layout."""
    from embedlab.session.spec import parse_model
    spec = parse_model(DATA / name)
    d = spec.data
    # one key per slot; a single-slot input (W&D's wide slot, the Criteo MLP) gets two
    inputs = [(s.slot_num, 2 if s.slot_num == 1 else 1) for s in d.sparse]
    lists, _, ev = write_lists(tmp_path / "d", rng, inputs, dense_dim=d.dense_dim, n_lists=1, files_per_list=1,
                               per_file=48, vocab=30)
    sess = Session(solver_parser_helper(batchsize=16, batchsize_eval=24, max_eval_batches=2), DATA / name)
    sess.get_data_reader_train().set_file_list_source(lists[0])
    sess.get_data_reader_eval().set_file_list_source(ev)
    n = 0
    while sess.train():
        n += 1
    assert n == 3 and np.isfinite(sess.get_current_loss())
    assert 0 <= sess.evaluation()[0][1] <= 1
    out = sess.download_params_to_files(str(tmp_path / "o"), n)
    if name == "dcn_localized_embedding.json":
        slots = np.fromfile(out[1] / "slot_id", "<i8")
        assert slots.min() >= 0 and slots.max() < 26 and len(np.unique(slots)) == 26
    text = sess.summary()
    assert "use_cuda_graph=True" in text and "change nothing here" in text
    sess.check_overflow()

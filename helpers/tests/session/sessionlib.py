"""Data and model-file builders of the Session tests (random Norm file lists with keysets, a small W&D JSON)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from embedlab.data import formats


def write_lists(out, rng, inputs, dense_dim=13, n_lists=3, files_per_list=2, per_file=96, vocab=40,
                key_type="uint32", check=True, eval_files=1, one_hot=False):
    """Random Norm data: `inputs` = [(slot_num, keys per slot)]; slot s draws from its own key range
    (vocab keys starting at 1000 * (s + 1) ** 2, so slots are disjoint and keys are sparse). Returns
    (train file lists, keysets, eval file list)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    slot_num = sum(s for s, _ in inputs)
    per_slot = [k for s, k in inputs for _ in range(s)]

    def one_file(path):
        n = per_file
        label = (rng.random(n) < 0.3).astype(np.float32)
        dense = rng.random((n, dense_dim)).astype(np.float32)
        slots, keys = [], []
        for s in range(slot_num):
            k = per_slot[s]
            base = 0 if one_hot else 1000 * (s + 1) ** 2
            v = base + rng.zipf(1.3, n * k) % vocab
            slots.append((np.arange(n + 1) * k, v) if k != 1 else v)
            keys.append(v)
        # make the label depend on the keys a little, so that training has something to learn
        label = np.where((keys[0][:n] if per_slot[0] == 1 else keys[0][::per_slot[0]]) % 3 == 0, 1.0,
                         label).astype(np.float32)
        formats.write_norm(path, label, dense, slots, error_check=check, key_type=key_type)
        return np.concatenate(keys)

    lists, keysets, idx = [], [], 0
    for l in range(n_lists):
        files, ks = [], []
        for _ in range(files_per_list):
            f = out / f"part_{idx}.data"
            idx += 1
            ks.append(one_file(f))
            files.append(f)
        formats.write_file_list(out / f"file_list.{l}.txt", files)
        formats.write_keyset(out / f"file_list.{l}.keyset", np.unique(np.concatenate(ks)), key_type=key_type)
        lists.append(str(out / f"file_list.{l}.txt"))
        keysets.append(str(out / f"file_list.{l}.keyset"))
    ev = []
    for e in range(eval_files):
        f = out / f"eval_{e}.data"
        one_file(f)
        ev.append(f)
    formats.write_file_list(out / "file_list.eval.txt", ev)
    return lists, keysets, str(out / "file_list.eval.txt")


def wdl_json(capacity=2000, deep_slots=4, vec=4, hidden=8, optimizer=None, update="Local", dropout=0.0,
             combiner=0, wide_keys=2, dense_dim=13):
    """A small Wide & Deep in HugeCTR's JSON (the sample's structure, narrow)."""
    opt = optimizer or {"type": "Adam", "update_type": update,
                        "adam_hparam": {"learning_rate": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7}}
    layers = [
        {"name": "data", "type": "Data", "source": "", "eval_source": "", "check": "Sum",
         "label": {"top": "label", "label_dim": 1}, "dense": {"top": "dense", "dense_dim": dense_dim},
         "sparse": [{"top": "wide_data", "type": "DistributedSlot", "max_feature_num_per_sample": wide_keys,
                     "slot_num": 1},
                    {"top": "deep_data", "type": "DistributedSlot", "max_feature_num_per_sample": 30,
                     "slot_num": deep_slots}]},
        {"name": "sparse_embedding2", "type": "DistributedSlotSparseEmbeddingHash", "bottom": "wide_data",
         "top": "sparse_embedding2", "sparse_embedding_hparam": {
             "max_vocabulary_size_per_gpu": capacity, "embedding_vec_size": 1, "combiner": combiner}},
        {"name": "sparse_embedding1", "type": "DistributedSlotSparseEmbeddingHash", "bottom": "deep_data",
         "top": "sparse_embedding1", "sparse_embedding_hparam": {
             "max_vocabulary_size_per_gpu": capacity, "embedding_vec_size": vec, "combiner": combiner}},
        {"name": "reshape1", "type": "Reshape", "bottom": "sparse_embedding1", "top": "reshape1",
         "leading_dim": deep_slots * vec},
        {"name": "reshape2", "type": "Reshape", "bottom": "sparse_embedding2", "top": "reshape2", "leading_dim": 1},
        {"name": "concat1", "type": "Concat", "bottom": ["reshape1", "dense"], "top": "concat1"},
        {"name": "fc1", "type": "InnerProduct", "bottom": "concat1", "top": "fc1", "fc_param": {"num_output": hidden}},
        {"name": "relu1", "type": "ReLU", "bottom": "fc1", "top": "relu1"},
    ]
    last = "relu1"
    if dropout:
        layers.append({"name": "dropout1", "type": "Dropout", "rate": dropout, "bottom": "relu1", "top": "dropout1"})
        last = "dropout1"
    layers += [
        {"name": "fc4", "type": "InnerProduct", "bottom": last, "top": "fc4", "fc_param": {"num_output": 1}},
        {"name": "add1", "type": "Add", "bottom": ["fc4", "reshape2"], "top": "add1"},
        {"name": "loss", "type": "BinaryCrossEntropyLoss", "bottom": ["add1", "label"], "top": "loss"}]
    return {"optimizer": opt, "layers": layers}


def dump(path, j):
    Path(path).write_text(json.dumps(j, indent=1))
    return str(path)

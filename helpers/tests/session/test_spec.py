"""The HugeCTR JSON parser: HugeCTR v2.3's sample files as they are, and every error case."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from embedlab.session.spec import LAYER_TYPES, ModelError, T2, T3, parse_model

DATA = Path(__file__).parent / "data"
SAMPLES = ["wdl.json", "deepfm.json", "dcn.json", "dcn_localized_embedding.json", "criteo.json"]


def load(name):
    return json.loads((DATA / name).read_text())


@pytest.mark.parametrize("name", SAMPLES)
def test_samples_parse(name):
    spec = parse_model(DATA / name)
    assert spec.loss.type == "BinaryCrossEntropyLoss"
    assert spec.solver is not None and spec.data.check == "Sum"
    for e in spec.embeddings:
        assert e.capacity > 0 and e.vec > 0


def test_wdl_shapes():
    spec = parse_model(DATA / "wdl.json")
    wide, deep = spec.embeddings
    assert (wide.name, wide.vec, wide.input.slot_num, wide.capacity) == ("sparse_embedding2", 1, 1, 2322444)
    assert (deep.vec, deep.input.slot_num, deep.input.first_slot) == (16, 26, 1)
    shapes = {t: s for l in spec.layers for t, s in zip(l.tops, l.out_shapes)}
    assert shapes["reshape1"] == T2(1, 416) and shapes["concat1"] == T2(1, 429)
    assert shapes["fc1"] == T2(1, 1024) and shapes["add1"] == T2(1, 1)
    assert spec.optimizer.type == "Adam" and spec.optimizer.update_type == "Global"


def test_deepfm_batch_factor_shapes():
    spec = parse_model(DATA / "deepfm.json")
    shapes = {t: s for l in spec.layers for t, s in zip(l.tops, l.out_shapes)}
    assert shapes["reshape1"] == T2(26, 11)          # [26 b, 11]
    assert shapes["slice11"] == T2(26, 10) and shapes["reshape2"] == T2(1, 260)
    assert shapes["multiply1"] == T2(1, 130) and shapes["concat1"] == T2(1, 390)
    assert shapes["fmorder2"] == T2(1, 10) and shapes["reducesum1"] == T2(1, 1)


def test_dcn_localized():
    spec = parse_model(DATA / "dcn_localized_embedding.json")
    e = spec.embeddings[0]
    assert e.localized and not e.one_hot and e.input.type == "LocalizedSlot"
    mc = [l for l in spec.layers if l.type == "MultiCross"][0]
    assert mc.params["num_layers"] == 6 and mc.out_shapes == [T2(1, 429)]


def test_per_embedding_optimizer_and_update_types():
    j = load("dcn.json")
    j["layers"][1]["optimizer"] = {"type": "MomentumSGD", "update_type": "LazyGlobal",
                                   "momentum_sgd_hparam": {"learning_rate": 0.1, "momentum_factor": 0.9}}
    j["optimizer"] = {"type": "SGD", "sgd_hparam": {"learning_rate": 2.0, "warmup_steps": 5,
                                                    "decay_start": 10, "decay_steps": 4}}
    spec = parse_model(j)
    assert spec.optimizer.update_type == "Local"      # HugeCTR's default
    eo = spec.embeddings[0].optimizer
    assert (eo.type, eo.update_type, eo.momentum_factor) == ("MomentumSGD", "LazyGlobal", 0.9)
    from embedlab.session.optimizer import lr_at
    lrs = [lr_at(spec.optimizer, s) for s in range(1, 17)]
    assert lrs[:5] == pytest.approx([0.4, 0.8, 1.2, 1.6, 2.0])
    assert lrs[9] == 2.0 and lrs[10] == pytest.approx(2.0 * (3 / 4) ** 2) and lrs[14] == 0.0


def test_one_hot_embedding():
    j = load("dcn.json")
    j["layers"][0]["sparse"][0]["type"] = "LocalizedSlot"
    j["layers"][1]["type"] = "LocalizedSlotSparseEmbeddingOneHot"
    j["layers"][1]["sparse_embedding_hparam"] = {"slot_size_array": [10] * 26, "embedding_vec_size": 16,
                                                 "combiner": 0}
    e = parse_model(j).embeddings[0]
    assert e.one_hot and e.capacity == 260


# ---- errors --------------------------------------------------------------------------

def _err(j, *needles):
    with pytest.raises(ModelError) as ei:
        parse_model(j)
    msg = str(ei.value)
    for n in needles:
        assert n in msg, msg
    return msg


def test_unknown_layer_type_lists_known():
    j = load("wdl.json")
    j["layers"][5]["type"] = "Conv2D"
    msg = _err(j, "layers[5]", "'concat1'", "unknown layer type 'Conv2D'")
    for t in LAYER_TYPES:
        assert t in msg


def test_bottom_names_no_earlier_top():
    j = load("wdl.json")
    j["layers"][6]["bottom"] = "concat9"
    _err(j, "'fc1'", "bottom 'concat9' names no earlier top")
    j = load("wdl.json")
    # a bottom produced only by a LATER layer
    j["layers"][3]["bottom"] = "fc1"
    _err(j, "'reshape1'", "bottom 'fc1'")


def test_reshape_leading_dim_must_divide():
    j = load("wdl.json")
    j["layers"][3]["leading_dim"] = 400
    _err(j, "'reshape1'", "field 'leading_dim' 400", "416")


def test_concat_mismatched_batches():
    j = load("deepfm.json")
    # reshape1 is [26 b, 11]; concatenating it with dense [b, 13] mixes batch counts
    j["layers"][9]["bottom"] = ["reshape1", "multiply1"]
    _err(j, "'concat1'", "different batch", "'reshape1'")


def test_slice_out_of_range():
    j = load("dcn.json")
    j["layers"][4]["ranges"] = [[0, 429], [400, 430]]
    _err(j, "'slice1'", "range [400, 430]", "429 columns")


def test_other_errors():
    j = load("wdl.json")
    j["layers"][1]["sparse_embedding_hparam"]["combiner"] = 2
    _err(j, "sparse_embedding2", "'combiner'")
    j = load("wdl.json")
    del j["layers"][2]["sparse_embedding_hparam"]["embedding_vec_size"]
    _err(j, "sparse_embedding1", "missing field 'embedding_vec_size'")
    j = load("wdl.json")
    j["layers"][1]["type"] = "LocalizedSlotSparseEmbeddingHash"
    _err(j, "sparse_embedding2", "'DistributedSlot'", "must match")
    j = load("wdl.json")
    j["optimizer"]["type"] = "RMSProp"
    _err(j, "optimizer", "RMSProp", "Adam, MomentumSGD, Nesterov, SGD")
    j = load("wdl.json")
    j["optimizer"]["update_type"] = "Eager"
    _err(j, "update_type 'Eager'")
    j = load("wdl.json")
    j["layers"][-1]["regularizer"] = "L3"
    _err(j, "'loss'", "'regularizer'")
    j = load("wdl.json")
    j["layers"][-1]["regularizer"] = "L2"
    _err(j, "'loss'", "missing field 'lambda'")
    j = load("wdl.json")
    j["layers"] = j["layers"][1:]
    _err(j, "layers[0] must be the 'Data' layer")
    j = load("wdl.json")
    j["layers"] = j["layers"][:-1]
    _err(j, "no BinaryCrossEntropyLoss")
    j = load("wdl.json")
    j["layers"][5]["top"] = "reshape1"
    _err(j, "'concat1'", "top 'reshape1' is already")
    j = load("wdl.json")
    j["layers"].insert(2, {"name": "fc0", "type": "InnerProduct", "bottom": "dense", "top": "fc0",
                           "fc_param": {"num_output": 4}})
    j["layers"][3]["name"] = "late_embedding"
    _err(j, "'late_embedding'", "embeddings must come before the dense layers")


def test_bad_json_file(tmp_path):
    p = tmp_path / "m.json"
    p.write_text("{ not json")
    _err(p, str(p), "not valid JSON")
    _err(tmp_path / "missing.json", "cannot read")

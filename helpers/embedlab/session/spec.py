"""HugeCTR v2.3 JSON model files: parsing, validation and shape inference.

`parse_model(path_or_dict)` reads the `solver` (optional), `optimizer` and `layers` clauses and
returns a `ModelSpec`: the Data layer, the embeddings and the dense layers in file order, each
with the shapes of its inputs and outputs already worked out. Every error is a `ModelError`
naming the file, the layer (by name and position) and the field, so that nothing is built from
a file that cannot run.

Shapes follow HugeCTR: an embedding gives `[batch, slot_num, vec]` (3-D); every other tensor is
2-D `[rows, cols]`, where `rows` is the batch times a whole factor (`Reshape` of `[b, 26, 11]`
with `leading_dim` 11 gives `[26 b, 11]`, as DeepFM uses).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ._schema import T2, T3, LayerSpec, ModelError, names as _names, need as _need
from .layers import DENSE_TYPES, LAYERS

__all__ = ["ModelError", "ModelSpec", "parse_model", "LAYER_TYPES", "EMBEDDING_TYPES",
           "OPTIMIZER_TYPES", "UPDATE_TYPES"]


EMBEDDING_TYPES = ("DistributedSlotSparseEmbeddingHash", "LocalizedSlotSparseEmbeddingHash",
                   "LocalizedSlotSparseEmbeddingOneHot")
LAYER_TYPES = ("Data",) + EMBEDDING_TYPES + DENSE_TYPES
OPTIMIZER_TYPES = ("Adam", "MomentumSGD", "Nesterov", "SGD")
UPDATE_TYPES = ("Local", "Global", "LazyGlobal")
_HPARAM_KEY = {"Adam": "adam_hparam", "MomentumSGD": "momentum_sgd_hparam",
               "Nesterov": "nesterov_hparam", "SGD": "sgd_hparam"}


@dataclass
class SparseInput:
    top: str
    type: str                 # "DistributedSlot" | "LocalizedSlot"
    max_feature_num_per_sample: int
    slot_num: int
    first_slot: int           # index of its first slot among all slots of the data files


@dataclass
class DataSpec:
    name: str
    format: str               # "Norm" | "Raw" | "Parquet"
    source: str
    eval_source: str
    check: str                # "Sum" | "None"
    label_top: str
    label_dim: int
    dense_top: str
    dense_dim: int
    sparse: list
    num_samples: int = 0
    eval_num_samples: int = 0
    slot_size_array: list | None = None
    float_label_dense: bool = False

    @property
    def slot_num(self) -> int:
        return sum(s.slot_num for s in self.sparse)


@dataclass
class OptimizerSpec:
    type: str
    update_type: str
    learning_rate: float
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-7
    momentum_factor: float = 0.0
    warmup_steps: int = 1
    decay_start: int = 0
    decay_steps: int = 1
    decay_power: float = 2.0
    end_lr: float = 0.0


@dataclass
class EmbeddingSpec:
    index: int                # position among the embeddings (the i of {prefix}{i}_sparse)
    name: str
    type: str
    bottom: str
    top: str
    input: SparseInput
    vec: int
    combiner: str             # "sum" | "mean"
    capacity: int             # max_vocabulary_size_per_gpu (hash) or sum(slot_size_array) (one-hot)
    slot_size_array: list | None
    optimizer: OptimizerSpec

    @property
    def localized(self) -> bool:
        return self.type.startswith("Localized")

    @property
    def one_hot(self) -> bool:
        return self.type.endswith("OneHot")


@dataclass
class ModelSpec:
    path: str
    solver: dict | None
    optimizer: OptimizerSpec
    data: DataSpec
    embeddings: list
    layers: list               # dense layers in file order, the loss last
    loss: LayerSpec
    raw: dict


def _where(path, i, layer):
    name = layer.get("name", "?") if isinstance(layer, dict) else "?"
    return f"{path}: layers[{i}] ({name!r}"


def parse_optimizer(j, where) -> OptimizerSpec:
    t = _need(j, "type", where, str)
    if t not in OPTIMIZER_TYPES:
        raise ModelError(f"{where}: unknown optimizer type {t!r}; known: {', '.join(OPTIMIZER_TYPES)}")
    upd = j.get("update_type")
    if upd is None and "global_update" in j:
        upd = "Global" if j["global_update"] else "Local"
    upd = upd or "Local"
    if upd not in UPDATE_TYPES:
        raise ModelError(f"{where}: unknown update_type {upd!r}; known: {', '.join(UPDATE_TYPES)}")
    hk = _HPARAM_KEY[t]
    hp = _need(j, hk, where)
    w = f"{where}.{hk}"
    spec = OptimizerSpec(type=t, update_type=upd, learning_rate=_need(hp, "learning_rate", w, float))
    if t == "Adam":
        spec.beta1 = _need(hp, "beta1", w, float)
        spec.beta2 = _need(hp, "beta2", w, float)
        spec.epsilon = _need(hp, "epsilon", w, float)
    elif t in ("MomentumSGD", "Nesterov"):
        spec.momentum_factor = _need(hp, "momentum_factor", w, float)
    else:
        spec.warmup_steps = int(hp.get("warmup_steps", 1))
        spec.decay_start = int(hp.get("decay_start", 0))
        spec.decay_steps = int(hp.get("decay_steps", 1))
        spec.decay_power = float(hp.get("decay_power", 2.0))
        spec.end_lr = float(hp.get("end_lr", 0.0))
        if spec.warmup_steps < 1 or spec.decay_steps < 1 or spec.decay_power < 1 or spec.end_lr < 0:
            raise ModelError(f"{w}: need warmup_steps >= 1, decay_steps >= 1, decay_power >= 1 and "
                             f"end_lr >= 0, got {hp}")
    if spec.learning_rate < 0:
        raise ModelError(f"{w}: learning_rate must be >= 0, got {spec.learning_rate}")
    return spec


def _parse_data(path, i, j) -> DataSpec:
    where = _where(path, i, j) + ", type 'Data')"
    fmt = j.get("format", "Norm")
    if fmt not in ("Norm", "Raw", "Parquet"):
        raise ModelError(f"{where}: field 'format' must be 'Norm', 'Raw' or 'Parquet', got {fmt!r}")
    check = j.get("check", "Sum")
    if check not in ("Sum", "None"):
        raise ModelError(f"{where}: field 'check' must be 'Sum' or 'None', got {check!r}")
    label = _need(j, "label", where)
    dense = _need(j, "dense", where)
    spec = DataSpec(name=j.get("name", "data"), format=fmt, source=str(j.get("source", "")),
                    eval_source=str(j.get("eval_source", "")), check=check,
                    label_top=_need(label, "top", where + ".label", str),
                    label_dim=_need(label, "label_dim", where + ".label", int),
                    dense_top=_need(dense, "top", where + ".dense", str),
                    dense_dim=_need(dense, "dense_dim", where + ".dense", int), sparse=[])
    if spec.label_dim < 1 or spec.dense_dim < 0:
        raise ModelError(f"{where}: label_dim must be >= 1 and dense_dim >= 0")
    sparse = _need(j, "sparse", where)
    if not isinstance(sparse, list):
        raise ModelError(f"{where}: field 'sparse' must be a list")
    first = 0
    for k, s in enumerate(sparse):
        w = f"{where}.sparse[{k}]"
        t = _need(s, "type", w, str)
        if t not in ("DistributedSlot", "LocalizedSlot"):
            raise ModelError(f"{w}: field 'type' must be 'DistributedSlot' or 'LocalizedSlot', got {t!r}")
        si = SparseInput(top=_need(s, "top", w, str), type=t,
                         max_feature_num_per_sample=_need(s, "max_feature_num_per_sample", w, int),
                         slot_num=_need(s, "slot_num", w, int), first_slot=first)
        if si.slot_num < 1 or si.max_feature_num_per_sample < 1:
            raise ModelError(f"{w}: slot_num and max_feature_num_per_sample must be >= 1")
        first += si.slot_num
        spec.sparse.append(si)
    if fmt == "Raw":
        spec.num_samples = _need(j, "num_samples", where, int)
        spec.eval_num_samples = _need(j, "eval_num_samples", where, int)
        spec.float_label_dense = bool(j.get("float_label_dense", False))
    if fmt in ("Raw", "Parquet"):
        ssa = _need(j, "slot_size_array", where)
        if not isinstance(ssa, list) or len(ssa) != spec.slot_num or any(
                not isinstance(x, int) or x < 1 for x in ssa):
            raise ModelError(f"{where}: field 'slot_size_array' must list {spec.slot_num} positive "
                             f"integers (one per slot), got {ssa!r}")
        spec.slot_size_array = list(ssa)
        if fmt == "Raw" and any(s.max_feature_num_per_sample != s.slot_num for s in spec.sparse):
            pass  # Raw data is one-hot: one key per slot whatever max_feature_num_per_sample says
    return spec


def parse_model(src, *, solver_override: bool = True) -> ModelSpec:
    """Parse and validate a HugeCTR JSON model file (a path, or the already-loaded dict).

    Returns:
        `ModelSpec`.

    Raises:
        ModelError: naming the file, the layer (name and position) and the field; e.g. an
            unknown layer type (the message lists the known ones), a `bottom` that names no
            earlier `top`, a `Reshape` whose `leading_dim` does not divide, a `Concat` of tensors
            with different row counts, a `Slice` range outside its input.

    Example (the dict a JSON file holds; `parse_model("wdl.json")` reads one from a file):
        >>> data = {"name": "data", "type": "Data", "label": {"top": "label", "label_dim": 1},
        ...         "dense": {"top": "dense", "dense_dim": 3},
        ...         "sparse": [{"top": "s", "type": "DistributedSlot", "slot_num": 2,
        ...                     "max_feature_num_per_sample": 2}]}
        >>> emb = {"name": "emb", "type": "DistributedSlotSparseEmbeddingHash", "bottom": "s", "top": "e",
        ...        "sparse_embedding_hparam": {"max_vocabulary_size_per_gpu": 1000, "embedding_vec_size": 4,
        ...                                    "combiner": 0}}
        >>> dense = [{"name": "r", "type": "Reshape", "bottom": "e", "top": "r", "leading_dim": 8},
        ...          {"name": "c", "type": "Concat", "bottom": ["r", "dense"], "top": "c"},
        ...          {"name": "fc", "type": "InnerProduct", "bottom": "c", "top": "fc", "fc_param": {"num_output": 1}},
        ...          {"name": "loss", "type": "BinaryCrossEntropyLoss", "bottom": ["fc", "label"], "top": "loss"}]
        >>> spec = parse_model({"optimizer": {"type": "SGD", "sgd_hparam": {"learning_rate": 0.1}},
        ...                     "layers": [data, emb] + dense})
        >>> [(e.name, e.capacity, e.vec) for e in spec.embeddings]
        [('emb', 1000, 4)]
        >>> [(l.name, l.out_shapes) for l in spec.layers]      # doctest: +NORMALIZE_WHITESPACE
        [('r', [T2(rows=1, cols=8)]), ('c', [T2(rows=1, cols=11)]), ('fc', [T2(rows=1, cols=1)]),
         ('loss', [T2(rows=0, cols=1)])]
    """
    if isinstance(src, dict):
        path, raw = "<dict>", src
    else:
        path = str(src)
        try:
            text = Path(src).read_text()
        except OSError as e:
            raise ModelError(f"{path}: cannot read the model file: {e}") from None
        except UnicodeDecodeError as e:
            raise ModelError(f"{path}: not valid JSON: byte {e.start} ({e.object[e.start:e.start + 1]!r}) is not "
                             "UTF-8") from None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ModelError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ModelError(f"{path}: the top level must be an object with 'optimizer' and 'layers'")
    opt = parse_optimizer(_need(raw, "optimizer", path), f"{path}: optimizer")
    layers = _need(raw, "layers", path)
    if not isinstance(layers, list) or not layers:
        raise ModelError(f"{path}: field 'layers' must be a non-empty list")
    first = layers[0]
    if not isinstance(first, dict) or first.get("type") != "Data":
        raise ModelError(f"{path}: layers[0] must be the 'Data' layer, got type "
                         f"{first.get('type') if isinstance(first, dict) else first!r}")
    data = _parse_data(path, 0, first)
    shapes: dict = {data.label_top: T2(1, data.label_dim), data.dense_top: T2(1, data.dense_dim)}
    sparse_by_top = {s.top: s for s in data.sparse}
    for s in data.sparse:
        shapes[s.top] = s
    embeddings, dense, used_inputs = [], [], set()
    loss = None
    for i, j in enumerate(layers[1:], start=1):
        if not isinstance(j, dict):
            raise ModelError(f"{path}: layers[{i}] must be an object, got {j!r}")
        t = j.get("type")
        where = _where(path, i, j) + f", type {t!r})"
        if t not in LAYER_TYPES:
            raise ModelError(f"{where}: unknown layer type {t!r}; known types: {', '.join(LAYER_TYPES)}")
        if t == "Data":
            raise ModelError(f"{where}: only one Data layer is allowed, and it comes first")
        if loss is not None:
            raise ModelError(f"{where}: layers after the loss layer {loss.name!r}")
        name = _need(j, "name", where, str)
        bottoms = _names(_need(j, "bottom", where), where, "bottom")
        tops = _names(_need(j, "top", where), where, "top")
        for b in bottoms:
            if b not in shapes:
                raise ModelError(f"{where}: bottom {b!r} names no earlier top (known: {', '.join(shapes)})")
        for tp in tops:
            if tp in shapes:
                raise ModelError(f"{where}: top {tp!r} is already the top of an earlier layer")
        if t in EMBEDDING_TYPES:
            if dense:
                raise ModelError(f"{where}: embeddings must come before the dense layers "
                                 f"(dense layer {dense[0].name!r} comes earlier)")
            emb = _parse_embedding(where, j, t, name, bottoms, tops, sparse_by_top, opt, data,
                                   len(embeddings), used_inputs)
            embeddings.append(emb)
            shapes[emb.top] = T3(emb.input.slot_num, emb.vec)
            continue
        ins = [shapes[b] for b in bottoms]
        for b, s in zip(bottoms, ins):
            if isinstance(s, SparseInput):
                raise ModelError(f"{where}: bottom {b!r} is a sparse input; only an embedding layer "
                                 "can read it")
        spec = LayerSpec(name=name, type=t, bottoms=bottoms, tops=tops, in_shapes=ins, out_shapes=[])
        spec.out_shapes = LAYERS[t].infer(where, spec, j, data)
        if len(spec.out_shapes) != len(tops):
            raise ModelError(f"{where}: field 'top' names {len(tops)} tensors, the layer makes "
                             f"{len(spec.out_shapes)}")
        for tp, s in zip(tops, spec.out_shapes):
            shapes[tp] = s
        dense.append(spec)
        if t == "BinaryCrossEntropyLoss":
            loss = spec
    if loss is None:
        raise ModelError(f"{path}: no BinaryCrossEntropyLoss layer")
    for s in data.sparse:
        if s.top not in used_inputs:
            raise ModelError(f"{path}: sparse input {s.top!r} of the Data layer feeds no embedding")
    return ModelSpec(path=path, solver=raw.get("solver"), optimizer=opt, data=data,
                     embeddings=embeddings, layers=dense, loss=loss, raw=raw)


def _parse_embedding(where, j, t, name, bottoms, tops, sparse_by_top, opt, data, index, used):
    if len(bottoms) != 1 or len(tops) != 1:
        raise ModelError(f"{where}: an embedding has one bottom and one top")
    if bottoms[0] not in sparse_by_top:
        raise ModelError(f"{where}: bottom {bottoms[0]!r} is not a sparse input of the Data layer "
                         f"(sparse inputs: {', '.join(sparse_by_top)})")
    if bottoms[0] in used:
        raise ModelError(f"{where}: sparse input {bottoms[0]!r} already feeds another embedding")
    used.add(bottoms[0])
    inp = sparse_by_top[bottoms[0]]
    want = "LocalizedSlot" if t.startswith("Localized") else "DistributedSlot"
    if inp.type != want:
        raise ModelError(f"{where}: sparse input {inp.top!r} has type {inp.type!r} but a {t} needs "
                         f"{want!r} (the Data layer's sparse type must match the embedding's)")
    hp = _need(j, "sparse_embedding_hparam", where)
    w = f"{where}.sparse_embedding_hparam"
    vec = _need(hp, "embedding_vec_size", w, int)
    comb = _need(hp, "combiner", w, int)
    if comb not in (0, 1):
        raise ModelError(f"{w}: field 'combiner' must be 0 (sum) or 1 (mean), got {comb}")
    if vec < 1:
        raise ModelError(f"{w}: embedding_vec_size must be >= 1, got {vec}")
    ssa = None
    if t.endswith("OneHot"):
        ssa = _need(hp, "slot_size_array", w)
        if not isinstance(ssa, list) or len(ssa) != inp.slot_num or any(
                not isinstance(x, int) or x < 1 for x in ssa):
            raise ModelError(f"{w}: field 'slot_size_array' must list {inp.slot_num} positive integers "
                             f"(one per slot of {inp.top!r}), got {ssa!r}")
        capacity = sum(ssa)
    elif "max_vocabulary_size_per_gpu" in hp:
        capacity = _need(hp, "max_vocabulary_size_per_gpu", w, int)
    elif "vocabulary_size" in hp:   # older files: vocabulary_size / load_factor
        capacity = int(_need(hp, "vocabulary_size", w, int) / float(hp.get("load_factor", 1.0)))
    else:
        raise ModelError(f"{w}: missing field 'max_vocabulary_size_per_gpu'")
    if capacity < 1:
        raise ModelError(f"{w}: max_vocabulary_size_per_gpu must be >= 1, got {capacity}")
    eopt = parse_optimizer(j["optimizer"], f"{where}.optimizer") if "optimizer" in j else opt
    return EmbeddingSpec(index=index, name=name, type=t, bottom=bottoms[0], top=tops[0], input=inp,
                         vec=vec, combiner="sum" if comb == 0 else "mean", capacity=capacity,
                         slot_size_array=ssa, optimizer=eopt)

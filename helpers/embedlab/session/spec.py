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
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ModelError", "ModelSpec", "parse_model", "LAYER_TYPES", "EMBEDDING_TYPES",
           "OPTIMIZER_TYPES", "UPDATE_TYPES"]


class ModelError(ValueError):
    """A JSON model file that cannot be built; the message names the layer and the field."""


EMBEDDING_TYPES = ("DistributedSlotSparseEmbeddingHash", "LocalizedSlotSparseEmbeddingHash",
                   "LocalizedSlotSparseEmbeddingOneHot")
DENSE_TYPES = ("Reshape", "Concat", "Slice", "InnerProduct", "FusedInnerProduct", "ReLU", "ELU",
               "Dropout", "MultiCross", "FmOrder2", "Multiply", "ReduceSum", "Add", "Interaction",
               "BatchNorm", "BinaryCrossEntropyLoss")
LAYER_TYPES = ("Data",) + EMBEDDING_TYPES + DENSE_TYPES
OPTIMIZER_TYPES = ("Adam", "MomentumSGD", "Nesterov", "SGD")
UPDATE_TYPES = ("Local", "Global", "LazyGlobal")
_HPARAM_KEY = {"Adam": "adam_hparam", "MomentumSGD": "momentum_sgd_hparam",
               "Nesterov": "nesterov_hparam", "SGD": "sgd_hparam"}


@dataclass(frozen=True)
class T2:
    """A 2-D tensor [batch * rows, cols]."""
    rows: int
    cols: int


@dataclass(frozen=True)
class T3:
    """A 3-D tensor [batch, slots, vec] (embedding output)."""
    slots: int
    vec: int


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
class LayerSpec:
    name: str
    type: str
    bottoms: list
    tops: list
    in_shapes: list
    out_shapes: list
    params: dict = field(default_factory=dict)


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


def _need(d, key, where, kind=None):
    if not isinstance(d, dict) or key not in d:
        raise ModelError(f"{where}: missing field {key!r}")
    v = d[key]
    if kind is int:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
            raise ModelError(f"{where}: field {key!r} must be an integer, got {v!r}")
        return int(v)
    if kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelError(f"{where}: field {key!r} must be a number, got {v!r}")
        return float(v)
    if kind is str and not isinstance(v, str):
        raise ModelError(f"{where}: field {key!r} must be a string, got {v!r}")
    return v


def _names(v, where, field_name):
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
        return list(v)
    raise ModelError(f"{where}: field {field_name!r} must be a name or a list of names, got {v!r}")


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
        ModelError naming the file, the layer (name and position) and the field; e.g. an
        unknown layer type (the message lists the known ones), a `bottom` that names no earlier
        `top`, a `Reshape` whose `leading_dim` does not divide, a `Concat` of tensors with
        different row counts, a `Slice` range outside its input.

    Example:
        >>> spec = parse_model("wdl.json")                               # doctest: +SKIP
        >>> [e.name for e in spec.embeddings], spec.loss.bottoms
        (['sparse_embedding2', 'sparse_embedding1'], ['add1', 'label'])
    """
    if isinstance(src, dict):
        path, raw = "<dict>", src
    else:
        path = str(src)
        try:
            text = Path(src).read_text()
        except OSError as e:
            raise ModelError(f"{path}: cannot read the model file: {e}") from None
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
        spec.out_shapes = _infer(where, spec, j, data)
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


def _one_2d(where, spec):
    if len(spec.in_shapes) != 1:
        raise ModelError(f"{where}: takes one bottom, got {len(spec.in_shapes)}")
    s = spec.in_shapes[0]
    if not isinstance(s, T2):
        raise ModelError(f"{where}: bottom {spec.bottoms[0]!r} is 3-D [batch, {s.slots}, {s.vec}]; "
                         "put a Reshape in front of it")
    return s


def _infer(where, spec, j, data):
    t, ins = spec.type, spec.in_shapes
    p = spec.params
    if t == "Reshape":
        if len(ins) != 1:
            raise ModelError(f"{where}: takes one bottom")
        s = ins[0]
        ld = _need(j, "leading_dim", where, int)
        last, per_sample = (s.vec, s.slots * s.vec) if isinstance(s, T3) else (s.cols, s.rows * s.cols)
        if ld < last or ld % last or per_sample % ld:
            raise ModelError(f"{where}: field 'leading_dim' {ld} does not fit bottom {spec.bottoms[0]!r} "
                             f"({per_sample} values per sample, last dimension {last}): it must be a "
                             f"multiple of {last} that divides {per_sample}")
        p["leading_dim"] = ld
        return [T2(per_sample // ld, ld)]
    if t == "Concat":
        if not 1 <= len(ins) <= 5:
            raise ModelError(f"{where}: Concat joins 1 to 5 tensors, got {len(ins)}")
        for b, s in zip(spec.bottoms, ins):
            if not isinstance(s, T2):
                raise ModelError(f"{where}: bottom {b!r} is 3-D; Concat joins 2-D tensors")
        rows = {s.rows for s in ins}
        if len(rows) != 1:
            desc = ", ".join(f"{b!r}: [{s.rows} x batch, {s.cols}]" for b, s in zip(spec.bottoms, ins))
            raise ModelError(f"{where}: bottoms have different batch (row) counts: {desc}")
        return [T2(ins[0].rows, sum(s.cols for s in ins))]
    if t == "Slice":
        s = _one_2d(where, spec)
        ranges = _need(j, "ranges", where)
        if not isinstance(ranges, list) or not ranges:
            raise ModelError(f"{where}: field 'ranges' must be a list of [begin, end) pairs")
        out = []
        for r in ranges:
            if (not isinstance(r, list) or len(r) != 2 or not all(isinstance(x, int) for x in r)
                    or not 0 <= r[0] < r[1] <= s.cols):
                raise ModelError(f"{where}: range {r!r} in field 'ranges' is out of range for bottom "
                                 f"{spec.bottoms[0]!r} of {s.cols} columns (need 0 <= begin < end <= {s.cols})")
            out.append(T2(s.rows, r[1] - r[0]))
        p["ranges"] = [list(r) for r in ranges]
        return out
    if t in ("InnerProduct", "FusedInnerProduct"):
        s = _one_2d(where, spec)
        n = _need(_need(j, "fc_param", where), "num_output", where + ".fc_param", int)
        if n < 1:
            raise ModelError(f"{where}: fc_param.num_output must be >= 1")
        p["num_output"] = n
        return [T2(s.rows, n)]
    if t in ("ReLU", "Dropout", "ELU"):
        s = _one_2d(where, spec)
        if t == "Dropout":
            rate = _need(j, "rate", where, float)
            if not 0 <= rate < 1:
                raise ModelError(f"{where}: field 'rate' must be in [0, 1), got {rate}")
            p["rate"] = rate
        if t == "ELU":
            p["alpha"] = _need(_need(j, "elu_param", where), "alpha", where + ".elu_param", float)
        return [s]
    if t == "BatchNorm":
        s = _one_2d(where, spec)
        bn = _need(j, "bn_param", where)
        p["factor"] = _need(bn, "factor", where + ".bn_param", float)
        p["eps"] = _need(bn, "eps", where + ".bn_param", float)
        return [s]
    if t == "MultiCross":
        s = _one_2d(where, spec)
        n = _need(_need(j, "mc_param", where), "num_layers", where + ".mc_param", int)
        if n < 1:
            raise ModelError(f"{where}: mc_param.num_layers must be >= 1")
        p["num_layers"] = n
        return [s]
    if t == "FmOrder2":
        s = _one_2d(where, spec)
        k = _need(j, "out_dim", where, int)
        if k < 1 or s.cols % k:
            raise ModelError(f"{where}: field 'out_dim' {k} must divide the {s.cols} columns of bottom "
                             f"{spec.bottoms[0]!r} (slots x vec)")
        p["out_dim"] = k
        return [T2(s.rows, k)]
    if t == "Multiply":
        s = _one_2d(where, spec)
        wd = _need(j, "weight_dims", where)
        if (not isinstance(wd, list) or len(wd) != 2 or not all(isinstance(x, int) and x > 0 for x in wd)
                or wd[0] != s.cols):
            raise ModelError(f"{where}: field 'weight_dims' {wd!r} must be [{s.cols}, k] (the bottom has "
                             f"{s.cols} columns)")
        p["weight_dims"] = list(wd)
        return [T2(s.rows, wd[0] * wd[1])]
    if t == "ReduceSum":
        s = _one_2d(where, spec)
        axis = _need(j, "axis", where, int)
        if axis != 1:
            raise ModelError(f"{where}: field 'axis' must be 1 for a 2-D bottom, got {axis}")
        p["axis"] = axis
        return [T2(s.rows, 1)]
    if t == "Add":
        if len(ins) < 2:
            raise ModelError(f"{where}: Add needs at least two bottoms")
        if any(not isinstance(s, T2) or s != ins[0] for s in ins):
            desc = ", ".join(f"{b!r}: {s}" for b, s in zip(spec.bottoms, ins))
            raise ModelError(f"{where}: Add needs bottoms of one shape, got {desc}")
        return [ins[0]]
    if t == "Interaction":
        if len(ins) != 2 or not isinstance(ins[0], T2) or not isinstance(ins[1], T3):
            raise ModelError(f"{where}: Interaction takes [2-D bottom MLP output, 3-D embedding]")
        if ins[0].rows != 1 or ins[0].cols != ins[1].vec:
            raise ModelError(f"{where}: the bottom MLP output has {ins[0].cols} columns but the "
                             f"embedding vectors have {ins[1].vec}")
        n = ins[1].slots + 1
        return [T2(1, ins[0].cols + n * (n - 1) // 2 + 1)]
    if t == "BinaryCrossEntropyLoss":
        if len(ins) != 2:
            raise ModelError(f"{where}: takes two bottoms [logit, label]")
        if spec.bottoms[1] != data.label_top:
            raise ModelError(f"{where}: the second bottom must be the label {data.label_top!r}, got "
                             f"{spec.bottoms[1]!r}")
        if not isinstance(ins[0], T2) or ins[0] != T2(1, 1) or data.label_dim != 1:
            raise ModelError(f"{where}: bottom {spec.bottoms[0]!r} must be [batch, 1] (got {ins[0]}) "
                             f"and label_dim 1 (got {data.label_dim})")
        reg = j.get("regularizer")
        if reg is not None:
            if reg not in ("L1", "L2"):
                raise ModelError(f"{where}: field 'regularizer' must be 'L1' or 'L2', got {reg!r}")
            p["regularizer"] = reg
            p["lambda"] = _need(j, "lambda", where, float)
        return [T2(0, 1)]
    raise ModelError(f"{where}: layer type {t!r} is not supported here")  # pragma: no cover

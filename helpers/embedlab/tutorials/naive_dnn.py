"""Notebook 05's model: a naive TF DNN on mock data from a learnable click model, trained and
exported for the HPS and Triton (HugeCTR's "HPS + Triton ensemble, 01 model training" workflow,
``hugectr_backend:hps_backend/samples/hps-triton-ensemble/01_model_training.ipynb``).

1. mock data in HPS's input format: ``slot_num`` keys per sample, slot ``s`` drawing from
   ``vocabulary_range_per_slot[s]`` with Zipf popularity, and a 0/1 label drawn from a hidden
   click model (:class:`ClickModel`: every key carries an effect on the click logit), so the
   model has something to learn and its AUC says how much it learned (:func:`evaluate`);
2. a native TF DNN (``tf.nn.embedding_lookup`` on one table, fc 256 / 128 / 1) trained with Adam
   (:func:`train_naive_dnn`);
3. the export, with :mod:`embedlab.hps.export`'s steps: the dense part as SavedModels and ONNX,
   the table as a sparse model, the HPS JSON, the inference model over ``hps.LookupLayer``.

:func:`export_for_serving` does all of it into ``DATA_DIR / "hps_triton"`` and writes the
manifest ``serving.json`` (:func:`write_manifest`) that the serving notebook reads.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import config as _config
from .._io import atomic_file
from ..hps.export import (MODEL_NAME, build_inference_model, check_onnx, compare_with_trained, dense_part,
                          export_onnx, save_dense_savedmodels, serving_tiers, write_embedding, write_hps_json)

__all__ = ["DemoArgs", "demo_args", "ClickModel", "generate_samples", "evaluate", "train_naive_dnn",
           "write_manifest", "export_for_serving"]


@dataclass
class DemoArgs:
    """The sizes of the demo (HugeCTR's sample: 3 slots of 10,000 keys, dim 16) and of its data.

    ``key_zipf_alpha``: key popularity within a slot (rank r drawn with probability ~ r^-alpha);
    ``key_effect_std``: spread of the hidden per-key effects on the click logit (0: coin flips).
    """
    embed_vec_size: int = 16
    slot_num: int = 3
    vocabulary_range_per_slot: list = field(default_factory=lambda: [[0, 10000], [10000, 20000], [20000, 30000]])
    global_batch_size: int = 1024
    iter_num: int = 10
    learning_rate: float = 0.01
    seed: int = 0
    key_zipf_alpha: float = 1.05
    key_effect_std: float = 1.0

    @property
    def max_vocabulary_size(self) -> int:
        return int(self.vocabulary_range_per_slot[-1][1])


def demo_args(scale=None) -> DemoArgs:
    """DemoArgs for ``embedlab.config.SCALE`` (ci: 20 steps of 1,024; small: 40 of 4,096; full: 40 of 65,536)."""
    scale = scale or _config.SCALE
    if scale.name == "ci":
        return DemoArgs(global_batch_size=1024, iter_num=20)
    if scale.name == "small":
        return DemoArgs(global_batch_size=4096, iter_num=40)
    return DemoArgs(global_batch_size=65536, iter_num=40)


class ClickModel:
    """The hidden truth behind the mock data: which keys are popular, and what each key does.

    Slot ``s`` draws its key from ``vocabulary_range_per_slot[s]``, the key of popularity rank r
    with probability proportional to r^-``key_zipf_alpha`` (a random order of the range decides
    the ranks). Every key carries an effect drawn from N(0, ``key_effect_std``); a sample's
    click logit is the sum of its keys' effects, and its label is drawn from
    sigmoid(logit), so even the true model cannot predict every label: :meth:`sample` returns
    the true logits, whose AUC is the ceiling a trained model can approach.

    Everything follows from ``spec()`` (the seed and the sizes), which the export's manifest
    records so the serving side can draw labelled requests from the same distribution.
    """

    def __init__(self, vocabulary_range_per_slot, zipf_alpha: float = 1.05, effect_std: float = 1.0,
                 seed: int = 0):
        ranges = [[int(lo), int(hi)] for lo, hi in vocabulary_range_per_slot]
        if not ranges or any(hi <= lo for lo, hi in ranges):
            raise ValueError(f"ClickModel: vocabulary_range_per_slot must be non-empty [lo, hi) ranges, got {ranges}")
        if zipf_alpha < 0 or effect_std < 0:
            raise ValueError(f"ClickModel: zipf_alpha and effect_std must be >= 0, got {zipf_alpha}, {effect_std}")
        self.ranges, self.zipf_alpha, self.effect_std, self.seed = ranges, float(zipf_alpha), float(effect_std), int(seed)
        rng = np.random.default_rng([self.seed, 0xC11C])
        self._slots = []
        for lo, hi in ranges:
            n = hi - lo
            p = np.arange(1, n + 1, dtype=np.float64) ** -self.zipf_alpha
            self._slots.append((lo + rng.permutation(n), np.cumsum(p / p.sum())))
        self._lo = min(lo for lo, _ in ranges)
        self._effects = rng.normal(0.0, self.effect_std, max(hi for _, hi in ranges) - self._lo)

    @classmethod
    def from_args(cls, args: "DemoArgs") -> "ClickModel":
        return cls(args.vocabulary_range_per_slot, args.key_zipf_alpha, args.key_effect_std, args.seed)

    def spec(self) -> dict:
        return {"vocabulary_range_per_slot": self.ranges, "zipf_alpha": self.zipf_alpha,
                "effect_std": self.effect_std, "seed": self.seed}

    @classmethod
    def from_spec(cls, spec: dict) -> "ClickModel":
        try:
            return cls(spec["vocabulary_range_per_slot"], spec["zipf_alpha"], spec["effect_std"], spec["seed"])
        except (KeyError, TypeError) as e:
            raise ValueError(f"ClickModel.from_spec: not a click-model spec ({e}): {spec!r}") from None

    def sample(self, num_samples: int, rng=None):
        """``(keys int64 [n, slot_num], labels float32 [n, 1], true_logits float64 [n])``."""
        rng = np.random.default_rng(rng)
        keys = np.stack([order[np.minimum(np.searchsorted(cdf, rng.random(num_samples)), len(order) - 1)]
                         for order, cdf in self._slots], axis=1).astype(np.int64)
        logits = self._effects[keys - self._lo].sum(axis=1)
        labels = (rng.random(num_samples) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)[:, None]
        return keys, labels, logits


def generate_samples(num_samples: int, args: "DemoArgs", rng=None):
    """keys int64 ``[num_samples, slot_num]`` and labels float32 ``[num_samples, 1]`` drawn from
    the demo's :class:`ClickModel`."""
    keys, labels, _ = ClickModel.from_args(args).sample(num_samples, rng)
    return keys, labels


def evaluate(model, args: "DemoArgs", num_samples: int = 20000, seed: int = 12345) -> dict:
    """The trained model on fresh samples of the click model (never trained on).

    Returns:
        ``{"auc": the model's AUC, "auc_ceiling": the true logits' AUC (the best any model can
        reach on these labels), "loss": its binary cross-entropy, "loss_floor": the true model's,
        "samples": num_samples}``.
    """
    tf = _tf()
    from ..session import auc
    keys, labels, true_logits = ClickModel.from_args(args).sample(num_samples, np.random.default_rng([args.seed, seed]))
    logits = model(tf.constant(keys))[0].numpy().reshape(-1)
    y = labels.reshape(-1)

    def bce(z):
        return float(np.mean(np.logaddexp(0.0, z) - y * z))
    return {"auc": auc(y, logits), "auc_ceiling": auc(y, true_logits), "loss": bce(logits.astype(np.float64)),
            "loss_floor": bce(true_logits), "samples": int(num_samples)}


def _tf():
    import tensorflow as tf
    return tf


def _naive_dnn_class():
    tf = _tf()

    class NaiveDNN(tf.keras.Model):
        """``tf.nn.embedding_lookup`` on one table, then fc 256 (relu) / 128 (relu) / 1 (logit)."""

        def __init__(self, init_table, slot_num, embed_vec_size, seed=0, **kwargs):
            super().__init__(**kwargs)
            self.slot_num, self.embed_vec_size = slot_num, embed_vec_size
            self.params = tf.Variable(init_table, name="embedding_table")
            init = tf.keras.initializers.GlorotUniform
            self.fc_1 = tf.keras.layers.Dense(256, activation="relu", kernel_initializer=init(seed), name="fc_1")
            self.fc_2 = tf.keras.layers.Dense(128, activation="relu", kernel_initializer=init(seed + 1), name="fc_2")
            self.fc_3 = tf.keras.layers.Dense(1, activation=None, kernel_initializer=init(seed + 2), name="fc_3")

        def call(self, inputs):
            emb = tf.nn.embedding_lookup(params=self.params, ids=inputs)
            emb = tf.reshape(emb, [-1, self.slot_num * self.embed_vec_size])
            return self.fc_3(self.fc_2(self.fc_1(emb))), emb

    return NaiveDNN


def train_naive_dnn(args: DemoArgs, log_every: int = 1):
    """Trains the DNN with Adam on the click model's samples; returns ``(model, losses, (keys, labels))``."""
    tf = _tf()
    tf.keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    init = rng.uniform(-0.05, 0.05, (args.max_vocabulary_size, args.embed_vec_size)).astype(np.float32)
    model = _naive_dnn_class()(init, args.slot_num, args.embed_vec_size, seed=args.seed)
    opt = tf.keras.optimizers.Adam(learning_rate=args.learning_rate)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)
    keys, labels = generate_samples(args.global_batch_size * args.iter_num, args, rng)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            logit, _ = model(x)
            loss = loss_fn(y, logit)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    losses = []
    b = args.global_batch_size
    for i in range(args.iter_num):
        loss = float(step(tf.constant(keys[i * b:(i + 1) * b]), tf.constant(labels[i * b:(i + 1) * b])))
        losses.append(loss)
        if log_every and (i % log_every == 0 or i == args.iter_num - 1):
            print(f"step {i:4d}  loss {loss:.5f}")
    return model, losses, (keys, labels)


def write_manifest(out_dir, args: DemoArgs, onnx_names: dict, checks: dict, tiers: dict) -> dict:
    """Writes ``serving.json`` (absolute paths of the files :func:`export_for_serving` lays out,
    and ``data``: the :class:`ClickModel` spec the training data came from)."""
    out = Path(out_dir).resolve()
    manifest = {
        "model_name": MODEL_NAME,
        "ps_config_file": str(out / "hps_demo.json"),
        "table_id": 0,
        "emb_vec_size": args.embed_vec_size,
        "slot_num": args.slot_num,
        "keys_per_sample": args.slot_num,
        "onnx_file": str(out / "dense.onnx"),
        "onnx_input": onnx_names["input"],
        "onnx_output": onnx_names["output"],
        "dense_savedmodel": str(out / "naive_dnn_dense.model"),
        "inference_savedmodel": str(out / "naive_dnn_inference.model"),
        "reshape_dense_savedmodel": str(out / "naive_dnn_reshape_dense.model"),
        "sparse_model": str(out / "naive_dnn_sparse.model"),
        "vocabulary_range_per_slot": args.vocabulary_range_per_slot,
        "data": ClickModel.from_args(args).spec(),
        "tiers": {"gpucache": tiers["gpucache"], "volatile_db": tiers["volatile_db"]["type"],
                  "persistent_db": tiers["persistent_db"]["type"]},
        "checks": checks,
    }
    for k in ("ps_config_file", "onnx_file", "dense_savedmodel", "inference_savedmodel", "sparse_model"):
        if not Path(manifest[k]).exists():
            raise FileNotFoundError(f"write_manifest: {k} {manifest[k]} does not exist; export it first")
    with atomic_file(out / "serving.json") as tmp:
        Path(tmp).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def export_for_serving(out_dir=None, args: DemoArgs | None = None, *, native_tiers: bool | None = None,
                       trained=None, verbose: bool = True) -> dict:
    """Trains (unless ``trained=(model, losses)`` is given) and writes everything serving needs.

    Writes into ``out_dir`` (default ``embedlab.config.DATA_DIR / "hps_triton"``):

    * ``naive_dnn_sparse.model/`` (``key`` / ``emb_vector``) and ``hps_demo.json`` (absolute paths);
    * ``dense.onnx`` (input ``dense_input`` ``[batch, slot_num * dim]``);
    * ``naive_dnn_dense.model/`` (dense SavedModel), ``naive_dnn_reshape_dense.model/`` (the reshaping
      wrapper), ``naive_dnn_inference.model/`` (``hps.LookupLayer`` + dense, keys ``[batch, slot_num]``);
    * ``serving.json``, the manifest: ``model_name``, ``ps_config_file``, ``table_id``, ``emb_vec_size``,
      ``slot_num``, ``keys_per_sample``, ``onnx_file``, ``onnx_input``, ``onnx_output``,
      ``dense_savedmodel``, ``inference_savedmodel`` (absolute paths), plus
      ``reshape_dense_savedmodel``, ``checks`` (ONNX max abs diff, inference MSEs, held-out AUC and
      its ceiling), ``data`` (the click model's spec) and ``tiers``.

    Args:
        native_tiers: use the compiled embedding cache and ``parallel_hash_map`` in ``hps_demo.json``
            (True), or the ``rocks_db`` tier alone (False). None: the compiled tiers when this build
            has them (logged, and recorded in the manifest's ``tiers``).

    Returns:
        The manifest dict.
    """
    tf = _tf()
    from ..hps._registry import shutdown
    out = Path(out_dir or (_config.DATA_DIR / "hps_triton")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    args = args or demo_args()
    if trained is None:
        model, losses, _ = train_naive_dnn(args, log_every=0 if not verbose else max(1, args.iter_num // 5))
    else:
        model, losses = trained
    sparse = out / "naive_dnn_sparse.model"
    write_embedding(model, sparse)
    dense = dense_part(model, args)
    dense_sm, reshape_sm = out / "naive_dnn_dense.model", out / "naive_dnn_reshape_dense.model"
    save_dense_savedmodels(dense, args, dense_sm, reshape_sm)
    onnx_file = out / "dense.onnx"
    names = export_onnx(dense, args, onnx_file)
    onnx_diff = check_onnx(onnx_file, dense, args, model.params.numpy())
    hps_json = out / "hps_demo.json"
    tiers = serving_tiers(out, sparse, args, native_tiers)
    write_hps_json(hps_json, sparse, args, **tiers)
    shutdown(str(hps_json))
    infer_sm = out / "naive_dnn_inference.model"
    infer = build_inference_model(str(hps_json), dense, args, path=infer_sm)
    keys, _ = generate_samples(512, args, np.random.default_rng(args.seed + 7))
    checks = compare_with_trained(model, infer, keys)
    checks.update(evaluate(model, args))
    shutdown(str(hps_json))   # release the server (and its RocksDB) for the serving processes
    checks["onnx_max_abs_diff"] = onnx_diff
    checks["final_loss"] = float(losses[-1]) if losses else None
    manifest = write_manifest(out, args, names, checks, tiers)
    if verbose:
        print(f"wrote {out / 'serving.json'}: onnx max|diff| {onnx_diff:.2e}, logits MSE {checks['logits_mse']:.2e}, "
              f"held-out AUC {checks['auc']:.3f} (ceiling {checks['auc_ceiling']:.3f})")
    return manifest

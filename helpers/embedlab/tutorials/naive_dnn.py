"""Notebook 05's model: a naive TF DNN on mock data from a learnable click model, trained and
exported for the HPS and Triton (HugeCTR's "HPS + Triton ensemble, 01 model training" workflow,
``hugectr_backend:hps_backend/samples/hps-triton-ensemble/01_model_training.ipynb``).

1. mock data in HPS's input format: ``slot_num`` keys per sample, slot ``s`` drawing from
   ``vocabulary_range_per_slot[s]`` with Zipf popularity, and a 0/1 label drawn from a hidden
   click model (:class:`ClickModel`: every key carries an effect on the click logit), so the
   model has something to learn and its AUC says how much it learned (:func:`evaluate`);
2. a native TF DNN (``tf.nn.embedding_lookup`` on one table, fc 256 / 128 / 1) trained with Adam
   (:func:`train_naive_dnn`);
3. the export, with :mod:`embedlab.hps.export`'s steps given this model's layers, table and sizes
   (:func:`dense_part`, :func:`save_dense_savedmodels`, :func:`write_embedding`, :func:`export_onnx`,
   :func:`check_onnx`, :func:`serving_tiers`, :func:`write_hps_json`, :func:`build_inference_model`).

:func:`export_for_serving` does all of it into ``DATA_DIR / "hps_triton"`` and writes the
manifest ``serving.json`` (:func:`write_manifest`) that the serving notebook reads;
:func:`labeled_samples` draws labelled requests from the click model the manifest records.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import config as _config
from ..hps import export as _export

__all__ = ["DemoArgs", "demo_args", "ClickModel", "generate_samples", "evaluate", "train_naive_dnn",
           "dense_part", "save_dense_savedmodels", "write_embedding", "export_onnx", "check_onnx",
           "serving_tiers", "write_hps_json", "build_inference_model", "write_manifest", "export_for_serving",
           "labeled_samples", "MODEL_NAME", "PS_CONFIG_NAME"]

MODEL_NAME = "naive_dnn"
PS_CONFIG_NAME = "hps_demo.json"


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


def _width(args: DemoArgs) -> int:
    return args.slot_num * args.embed_vec_size


def _sizes(args: DemoArgs, model_name: str = MODEL_NAME, max_batch_size: int | None = None) -> dict:
    """The demo's one table as :mod:`embedlab.hps.export` takes it."""
    return dict(model_name=model_name, emb_vec_sizes=[args.embed_vec_size], keys_per_sample=[args.slot_num],
                max_batch_size=int(max_batch_size or args.global_batch_size))


def dense_part(model, args: DemoArgs):
    """The trained fc layers as their own Keras model: ``[batch, slot_num * dim]`` -> ``[batch, 1]``."""
    return _export.dense_model([model.fc_1, model.fc_2, model.fc_3], _width(args))


def save_dense_savedmodels(dense, args: DemoArgs, dense_path, reshape_path) -> None:
    """:func:`embedlab.hps.export.save_dense_savedmodels` for the demo's sizes."""
    _export.save_dense_savedmodels(dense, _width(args), dense_path, reshape_path)


def export_onnx(dense, args: DemoArgs, path, opset: int = 13) -> dict:
    """:func:`embedlab.hps.export.export_onnx` for the demo's sizes; returns input/output names."""
    return _export.export_onnx(dense, _width(args), path, opset)


def check_onnx(path, dense, args: DemoArgs, table, batch: int = 257, seed: int = 1) -> float:
    """:func:`embedlab.hps.export.check_onnx` on what the served dense model receives: the rows of
    ``table`` (the trained embedding, ``[vocabulary, dim]``) for the keys of ``batch`` samples drawn
    uniformly from every slot's range, concatenated per sample. Returns the max abs difference."""
    rng = np.random.default_rng(seed)
    keys = np.stack([rng.integers(lo, hi, batch) for lo, hi in args.vocabulary_range_per_slot], axis=1)
    return _export.check_onnx(path, dense, np.asarray(table, np.float32)[keys].reshape(batch, -1))


def write_embedding(model, path) -> Path:
    """The trained table as ``key`` (0..V-1) / ``emb_vector``."""
    table = model.params.numpy()
    return _export.write_embedding(path, np.arange(table.shape[0], dtype=np.int64), table)


def write_hps_json(path, sparse_dir, args: DemoArgs, *, model_name: str = MODEL_NAME,
                   max_batch_size: int | None = None, **kw) -> Path:
    """:func:`embedlab.hps.export.write_hps_json` for the demo's table (``kw``: tiers, cache)."""
    return _export.write_hps_json(path, sparse_files=[sparse_dir], **_sizes(args, model_name, max_batch_size), **kw)


def serving_tiers(out_dir, sparse_dir, args: DemoArgs, native_tiers: bool | None = None) -> dict:
    """:func:`embedlab.hps.export.serving_tiers` for the demo's table: keyword arguments for
    :func:`write_hps_json`."""
    return _export.serving_tiers(out_dir, sparse_files=[sparse_dir], native_tiers=native_tiers, **_sizes(args))


def build_inference_model(ps_config_file, dense, args: DemoArgs, path=None, model_name: str = MODEL_NAME):
    """:func:`embedlab.hps.export.build_inference_model` for the demo's table."""
    return _export.build_inference_model(ps_config_file, dense, model_name=model_name,
                                         emb_vec_size=args.embed_vec_size, keys_per_sample=args.slot_num,
                                         global_batch_size=args.global_batch_size, path=path)


def write_manifest(out_dir, args: DemoArgs, onnx_names: dict, checks: dict, tiers: dict) -> dict:
    """Writes ``serving.json`` (:func:`embedlab.hps.export.write_manifest`: absolute paths of the
    files :func:`export_for_serving` lays out), plus ``vocabulary_range_per_slot`` and ``data``:
    the :class:`ClickModel` spec the training data came from."""
    return _export.write_manifest(out_dir, model_name=MODEL_NAME, emb_vec_size=args.embed_vec_size,
                                  keys_per_sample=args.slot_num, onnx_names=onnx_names, checks=checks,
                                  tiers=tiers, ps_config_name=PS_CONFIG_NAME, extra=_manifest_extra(args))


def _manifest_extra(args: DemoArgs) -> dict:
    return {"vocabulary_range_per_slot": args.vocabulary_range_per_slot, "data": ClickModel.from_args(args).spec()}


def export_for_serving(out_dir=None, args: DemoArgs | None = None, *, native_tiers: bool | None = None,
                       trained=None, verbose: bool = True) -> dict:
    """Trains (unless ``trained=(model, losses)`` is given) and writes everything serving needs,
    with :func:`embedlab.hps.export.export_model`.

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
    out = Path(out_dir or (_config.DATA_DIR / "hps_triton")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    args = args or demo_args()
    if trained is None:
        model, losses, _ = train_naive_dnn(args, log_every=0 if not verbose else max(1, args.iter_num // 5))
    else:
        model, losses = trained
    table = model.params.numpy()
    keys, _ = generate_samples(512, args, np.random.default_rng(args.seed + 7))
    checks = evaluate(model, args)
    checks["final_loss"] = float(losses[-1]) if losses else None
    manifest = _export.export_model(
        out, dense_part(model, args), np.arange(table.shape[0], dtype=np.int64), table, model_name=MODEL_NAME,
        keys_per_sample=args.slot_num, max_batch_size=args.global_batch_size, ps_config_name=PS_CONFIG_NAME,
        native_tiers=native_tiers, check_keys=keys, trained=model, checks=checks, extra=_manifest_extra(args))
    if verbose:
        c = manifest["checks"]
        print(f"wrote {out / 'serving.json'}: onnx max|diff| {c['onnx_max_abs_diff']:.2e}, logits MSE "
              f"{c['logits_mse']:.2e}, held-out AUC {c['auc']:.3f} (ceiling {c['auc_ceiling']:.3f})")
    return manifest


def labeled_samples(manifest, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of the training data's distribution: keys int64 [n, keys_per_sample] and
    labels float32 [n, 1], drawn from the :class:`ClickModel` recorded in the manifest's ``data``,
    for scoring the served model (AUC): :func:`embedlab.serving.reference.labeled_samples` with it."""
    from ..serving.reference import labeled_samples as _labeled

    def sample(spec, count, gen):
        keys, labels, _ = ClickModel.from_spec(spec).sample(count, gen)
        return keys, labels
    return _labeled(manifest, n, rng, sample)

"""A `TableConfig`'s optimizer as one of `embedlab.optimizers`' fused optimizers.

Keras-RS lets each table name its optimizer: a string (`"sgd"`, `"adagrad"`, `"adam"`,
`"ftrl"`), a Keras optimizer (`keras.optimizers.SGD`, `Adagrad`, `Adam`, `Ftrl`, or a
subclass such as EmbedLab's own) or a `tf.tpu.experimental.embedding` optimizer (`SGD`,
`Adagrad`, `Adam`, `FTRL`). `to_embedlab` turns each into the `embedlab.optimizers` instance that
`DistributedEmbedding` applies to the touched rows inside the lookup's backward.

Honoured, per optimizer (everything else is rejected with an error naming the table and option):

* all: `learning_rate` (a float, or a `keras.optimizers.schedules.LearningRateSchedule`, which is
  evaluated at the optimizer's own step counter, advanced once per training step).
* SGD: nothing more (momentum / nesterov are rejected).
* Adagrad: `initial_accumulator_value`, `epsilon` (Keras: `w -= lr g / sqrt(acc + eps)`; the TPU
  optimizer has no epsilon and maps to epsilon 0).
* Adam: `beta_1`, `beta_2`, `epsilon`, lazy (only touched rows' moments move: TPU's
  `lazy_adam=True`, Keras' Adam on rows touched every step). Rejected: `amsgrad`, and the TPU
  options `lazy_adam=False` and `sum_inside_sqrt=True` (the TPU default: pass
  `sum_inside_sqrt=False`, which is Keras' formula).
* FTRL: `learning_rate_power`, `initial_accumulator_value`, `l1_regularization_strength`,
  `l2_regularization_strength`, `l2_shrinkage_regularization_strength`, `beta` (Keras' FTRL on
  the touched rows). Rejected: the TPU-only `multiply_linear_by_learning_rate=True`,
  `allow_zero_accumulator=True`, `initial_linear_value != 0`.
* Rejected for every Keras optimizer: `weight_decay`, `clipnorm`, `clipvalue`,
  `global_clipnorm`, `use_ema`, `loss_scale_factor`, `gradient_accumulation_steps`, a learning
  rate given as a plain callable; for every TPU optimizer: `clip_weight_min/max`,
  `clip_gradient_min/max`, `weight_decay_factor`, a callable learning rate.
  (`use_gradient_accumulation`, a TPU precision switch, has no meaning here and is ignored.)
"""
from __future__ import annotations

import json

import keras
import tensorflow as tf

from .. import optimizers as _el

__all__ = ["to_embedlab", "optimizer_key"]

_STRINGS = {"sgd": _el.SGD, "adagrad": _el.Adagrad, "adam": _el.Adam, "ftrl": _el.Ftrl}
_FTRL_KEYS = ("learning_rate_power", "initial_accumulator_value", "l1_regularization_strength",
              "l2_regularization_strength", "l2_shrinkage_regularization_strength", "beta")


def _tpu_classes():
    e = tf.tpu.experimental.embedding
    return e.SGD, e.Adagrad, e.Adam, e.FTRL


def _learning_rate(opt, where):
    lr = opt._learning_rate  # the schedule object or the variable Keras keeps
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
        return lr
    if callable(lr) and not isinstance(lr, (keras.Variable, tf.Variable)):
        raise ValueError(f"{where}: a learning_rate given as a callable is not supported; use a float or a "
                         "keras.optimizers.schedules.LearningRateSchedule")
    return float(opt.get_config()["learning_rate"])


def _from_keras(opt, where):
    for attr in ("weight_decay", "clipnorm", "clipvalue", "global_clipnorm", "loss_scale_factor",
                 "gradient_accumulation_steps"):
        value = getattr(opt, attr, None)
        if value is not None:
            raise ValueError(f"{where}: optimizer option {attr}={value!r} is not supported by the fused "
                             "optimizers (leave it unset)")
    if getattr(opt, "use_ema", False):
        raise ValueError(f"{where}: optimizer option use_ema=True is not supported by the fused optimizers")
    lr = _learning_rate(opt, where)
    if isinstance(opt, keras.optimizers.Ftrl):
        return _el.Ftrl(learning_rate=lr, **{k: float(getattr(opt, k)) for k in _FTRL_KEYS})
    if isinstance(opt, keras.optimizers.Adam):
        if opt.amsgrad:
            raise ValueError(f"{where}: optimizer option amsgrad=True is not supported (lazy Adam only)")
        return _el.Adam(learning_rate=lr, beta_1=float(opt.beta_1), beta_2=float(opt.beta_2),
                        epsilon=float(opt.epsilon))
    if isinstance(opt, keras.optimizers.Adagrad):
        return _el.Adagrad(learning_rate=lr, initial_accumulator_value=float(opt.initial_accumulator_value),
                           epsilon=float(opt.epsilon))
    if isinstance(opt, keras.optimizers.SGD):
        if opt.momentum or opt.nesterov:
            raise ValueError(f"{where}: optimizer options momentum={opt.momentum!r} / nesterov={opt.nesterov!r} "
                             "are not supported (plain SGD only)")
        return _el.SGD(learning_rate=lr)
    raise ValueError(f"{where}: optimizer {type(opt).__name__} is not supported; use SGD, Adagrad, Adam or Ftrl "
                     "(the four Keras-RS supports)")


def _from_tpu(opt, where):
    for attr in ("clip_weight_min", "clip_weight_max", "clip_gradient_min", "clip_gradient_max",
                 "weight_decay_factor"):
        value = getattr(opt, attr, None)
        if value is not None:
            raise ValueError(f"{where}: TPU optimizer option {attr}={value!r} is not supported (leave it unset)")
    lr = opt.learning_rate
    if callable(lr):
        raise ValueError(f"{where}: a TPU optimizer's learning_rate given as a callable is not supported; "
                         "use a float, or a Keras optimizer with a LearningRateSchedule")
    lr = float(lr)
    sgd, adagrad, adam, ftrl = _tpu_classes()
    if isinstance(opt, ftrl):
        for attr, ok in (("multiply_linear_by_learning_rate", False), ("allow_zero_accumulator", False),
                         ("initial_linear_value", 0.0)):
            value = getattr(opt, attr, ok)
            if value != ok:
                raise ValueError(f"{where}: TPU FTRL option {attr}={value!r} is TPU-only and not supported "
                                 f"(use {ok!r})")
        return _el.Ftrl(learning_rate=lr, learning_rate_power=float(opt.learning_rate_power),
                        initial_accumulator_value=float(opt.initial_accumulator_value),
                        l1_regularization_strength=float(opt.l1_regularization_strength),
                        l2_regularization_strength=float(opt.l2_regularization_strength), beta=float(opt.beta))
    if isinstance(opt, adam):
        if not opt.lazy_adam:
            raise ValueError(f"{where}: TPU Adam option lazy_adam=False is not supported (the fused Adam is lazy)")
        if opt.sum_inside_sqrt:
            raise ValueError(f"{where}: TPU Adam option sum_inside_sqrt=True (its default: w -= lr m / sqrt(v + eps)) "
                             "is not supported; pass sum_inside_sqrt=False (Keras' w -= lr m / (sqrt(v) + eps)) "
                             "or a keras.optimizers.Adam")
        return _el.Adam(learning_rate=lr, beta_1=float(opt.beta_1), beta_2=float(opt.beta_2),
                        epsilon=float(opt.epsilon))
    if isinstance(opt, adagrad):
        return _el.Adagrad(learning_rate=lr, initial_accumulator_value=float(opt.initial_accumulator_value),
                           epsilon=0.0)
    if isinstance(opt, sgd):
        return _el.SGD(learning_rate=lr)
    raise ValueError(f"{where}: TPU optimizer {type(opt).__name__} is not supported; use SGD, Adagrad, Adam or FTRL")


def to_embedlab(optimizer, where: str = "TableConfig"):
    """A new `embedlab.optimizers` instance equivalent to a table's optimizer.

    Args:
        optimizer: a string ("sgd", "adagrad", "adam", "ftrl"; any case), a Keras optimizer of
            one of those four kinds, or a `tf.tpu.experimental.embedding` SGD/Adagrad/Adam/FTRL.
        where: names the table in error messages.

    Returns:
        An `embedlab.optimizers.SGD`/`Adagrad`/`Adam`/`Ftrl` (fresh: its state is its own).

    Raises:
        ValueError: an unsupported optimizer or option (the module docstring lists them).

    Example:
        >>> type(to_embedlab("adagrad")).__name__
        'Adagrad'
        >>> to_embedlab(keras.optimizers.SGD(momentum=0.9))
        Traceback (most recent call last):
        ValueError: TableConfig: optimizer options momentum=0.9 / nesterov=False are not supported (plain SGD only)
    """
    if isinstance(optimizer, str):
        cls = _STRINGS.get(optimizer.lower())
        if cls is None:
            raise ValueError(f"{where}: unknown optimizer name {optimizer!r}; use one of {sorted(_STRINGS)}")
        return cls()
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return _from_keras(optimizer, where)
    if isinstance(optimizer, _tpu_classes()):
        return _from_tpu(optimizer, where)
    raise ValueError(f"{where}: optimizer must be a name, a Keras optimizer or a tf.tpu.experimental.embedding "
                     f"optimizer, got {type(optimizer).__name__}")


def optimizer_key(optimizer) -> str:
    """A string equal for two `embedlab.optimizers` instances that update tables identically
    (same class and hyperparameters): tables whose optimizers share a key share one instance,
    so that one fused op updates them all.

    Example:
        >>> optimizer_key(to_embedlab("sgd")) == optimizer_key(to_embedlab(keras.optimizers.SGD()))
        True
    """
    cfg = dict(keras.optimizers.serialize(optimizer))
    inner = dict(cfg.get("config", {}))
    inner.pop("name", None)
    cfg["config"] = inner
    return json.dumps(cfg, sort_keys=True, default=str)

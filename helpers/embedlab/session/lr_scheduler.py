"""HugeCTR v2.3's learning-rate schedule: `LearningRateScheduler` and `get_learning_rate_scheduler`.

A training script drives it, one step per iteration, and hands the rate to the Session::

    from embedlab.session import Session, get_learning_rate_scheduler
    lr_sch = get_learning_rate_scheduler("wdl.json")
    while True:
        sess.set_learning_rate(lr_sch.get_next())
        if not sess.train():
            break

The schedule: over the first `warmup_steps` steps the rate climbs linearly to `base_lr`
(step * base_lr / warmup_steps); it stays at `base_lr` until step `decay_start` (0: forever);
over the next `decay_steps` steps it falls as base_lr * ((decay_start + decay_steps - step) /
decay_steps) ** decay_power, never below `end_lr`; after that it is `end_lr`. The arithmetic is
float32, HugeCTR's.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .spec import ModelError

__all__ = ["LearningRateScheduler", "get_learning_rate_scheduler"]

# optimizer type -> the clause holding its learning_rate (and the schedule's fields)
_HPARAM = {"Adam": "adam_hparam", "MomentumSGD": "momentum_sgd_hparam", "Nesterov": "nesterov_hparam",
           "SGD": "sgd_hparam"}
_F32 = np.float32


def _integer(name, v, lo):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"LearningRateScheduler: {name} must be an integer >= {lo}, got {v!r}")
    return int(v)


def _number(name, v, lo):
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not v >= lo:
        raise ValueError(f"LearningRateScheduler: {name} must be a number >= {lo}, got {v!r}")
    return float(v)


class LearningRateScheduler:
    """HugeCTR's `LearningRateScheduler`: warm-up, constant, polynomial decay, end rate.

    Args:
        base_lr: the rate after warm-up (>= 0).
        warmup_steps: steps of the linear warm-up (>= 1; 1 = none).
        decay_start: the last step at `base_lr` before the decay (0 = no decay).
        decay_steps: steps of the decay (>= 1).
        decay_power: the decay polynomial's power (>= 1).
        end_lr: the floor of the decay and the rate after it (>= 0).

    Example:
        >>> s = LearningRateScheduler(0.8, warmup_steps=4, decay_start=6, decay_steps=2, decay_power=1.0)
        >>> [round(s.get_next(), 6) for _ in range(9)]
        [0.2, 0.4, 0.6, 0.8, 0.8, 0.8, 0.4, 0.0, 0.0]
    """

    def __init__(self, base_lr: float, warmup_steps: int = 1, decay_start: int = 0, decay_steps: int = 1,
                 decay_power: float = 2.0, end_lr: float = 0.0):
        self.base_lr = _number("base_lr", base_lr, 0)
        self.warmup_steps = _integer("warmup_steps", warmup_steps, 1)
        self.decay_start = _integer("decay_start", decay_start, 0)
        self.decay_steps = _integer("decay_steps", decay_steps, 1)
        self.decay_power = _number("decay_power", decay_power, 1)
        self.end_lr = _number("end_lr", end_lr, 0)
        self._step = 0
        self._lr = 0.0

    def _at(self, step: int) -> float:
        base, end = _F32(self.base_lr), _F32(self.end_lr)
        if step <= self.warmup_steps:
            return float(_F32(step) * base / _F32(self.warmup_steps))
        if self.decay_start == 0 or step <= self.decay_start:
            return float(base)
        if step <= self.decay_start + self.decay_steps:
            frac = _F32(self.decay_start + self.decay_steps - step) / _F32(self.decay_steps)
            lr = base * np.power(frac, _F32(self.decay_power))
            return float(lr if lr > end else end)
        return float(end)

    def get_next(self) -> float:
        """Advances one step and returns that step's rate (the first call gives step 1's)."""
        self._step += 1
        self._lr = self._at(self._step)
        return self._lr

    def get_lr(self) -> float:
        """The rate `get_next` returned last (0.0 before the first call)."""
        return self._lr

    def get_step(self) -> int:
        """How many times `get_next` has been called."""
        return self._step

    def __repr__(self):
        return (f"LearningRateScheduler(base_lr={self.base_lr}, warmup_steps={self.warmup_steps}, "
                f"decay_start={self.decay_start}, decay_steps={self.decay_steps}, "
                f"decay_power={self.decay_power}, end_lr={self.end_lr}; step {self._step})")


def get_learning_rate_scheduler(configure_file) -> LearningRateScheduler:
    """The schedule of a HugeCTR JSON model file, as HugeCTR v2.3's `hugectr` module reads it.

    From the `optimizer` clause: `type` (Adam, MomentumSGD, Nesterov or SGD) names the hparam
    object (`adam_hparam`, `momentum_sgd_hparam`, `nesterov_hparam`, `sgd_hparam`), whose
    `learning_rate` is `base_lr` and whose optional `warmup_steps` (1), `decay_start` (0),
    `decay_steps` (1), `decay_power` (2.0) and `end_lr` (0.0) shape the schedule, whatever the
    optimizer.

    Args:
        configure_file: the JSON model file (the one the Session reads).

    Returns:
        A fresh `LearningRateScheduler` (step 0).

    Raises:
        FileNotFoundError: no such file.
        ModelError: not JSON, or a clause or field missing or of the wrong kind (named).
        ValueError: a value out of range (named).
    """
    path = Path(configure_file)
    if not path.is_file():
        raise FileNotFoundError(f"get_learning_rate_scheduler: no such file: {path}")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelError(f"get_learning_rate_scheduler: {path} is not valid JSON: {e}") from e
    except UnicodeDecodeError as e:
        raise ModelError(f"get_learning_rate_scheduler: {path} is not valid JSON: byte {e.start} "
                         f"({e.object[e.start:e.start + 1]!r}) is not UTF-8") from e
    opt = cfg.get("optimizer") if isinstance(cfg, dict) else None
    if not isinstance(opt, dict):
        raise ModelError(f"get_learning_rate_scheduler: {path} has no 'optimizer' clause")
    kind = opt.get("type")
    if kind not in _HPARAM:
        raise ModelError(f"get_learning_rate_scheduler: {path}: optimizer type {kind!r} is not one of "
                         f"{', '.join(_HPARAM)}")
    key = _HPARAM[kind]
    hp = opt.get(key)
    if not isinstance(hp, dict):
        raise ModelError(f"get_learning_rate_scheduler: {path}: optimizer type {kind} needs the clause {key!r}")
    where = f"{path}: optimizer.{key}"
    if "learning_rate" not in hp:
        raise ModelError(f"get_learning_rate_scheduler: {where} has no 'learning_rate'")
    fields = {"warmup_steps": (1, int), "decay_start": (0, int), "decay_steps": (1, int),
              "decay_power": (2.0, float), "end_lr": (0.0, float)}
    args = {}
    for name, (default, kind_) in fields.items():
        v = hp.get(name, default)
        ok = (isinstance(v, int) and not isinstance(v, bool)) if kind_ is int else \
             (isinstance(v, (int, float)) and not isinstance(v, bool))
        if not ok:
            raise ModelError(f"get_learning_rate_scheduler: {where}.{name} must be "
                             f"{'an integer' if kind_ is int else 'a number'}, got {v!r}")
        args[name] = v
    lr = hp["learning_rate"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)):
        raise ModelError(f"get_learning_rate_scheduler: {where}.learning_rate must be a number, got {lr!r}")
    try:
        return LearningRateScheduler(lr, **args)
    except ValueError as e:
        raise ValueError(f"get_learning_rate_scheduler: {where}: {e}") from e

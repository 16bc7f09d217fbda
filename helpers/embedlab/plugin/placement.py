"""Where an EmbeddingLayer's rows live: the devices `init` sets, and which keys each device holds.

* "distributed": key k lives on device k % n as local row k // n (:func:`distributed_owner`, the
  rule of ``RouteMode::kDistributed`` in csrc/core/routing.h that SOK's exchange routes with).
* "localized": slot s lives on device s % n (:func:`localized_device`); with `slot_size_array`
  a device holds only its slots' key ranges, one after the other in slot order, without it a
  full table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import tensorflow as tf

__all__ = ["PluginConfig", "init", "current", "split_cpu", "distributed_owner", "localized_device",
           "slot_offsets", "shard_keys", "device_keys", "local_rows"]


@dataclass(frozen=True)
class PluginConfig:
    """What `init` set: the devices later layers shard over, and the initializer seed."""
    devices: tuple
    seed: int


_STATE: dict = {"config": None}


def _canonical(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device)
    for d in tf.config.list_logical_devices():
        ds = tf.DeviceSpec.from_string(d.name)
        if ds.device_type == (spec.device_type or "").upper() and ds.device_index == (spec.device_index or 0):
            return d.name
    names = [d.name for d in tf.config.list_logical_devices()]
    raise ValueError(f"embedlab.plugin.init: device {device!r} is not a logical device of this process "
                     f"(have {names}); split the CPU with embedlab.plugin.split_cpu(n) before TensorFlow starts")


def init(devices: Sequence[str] | str | None = None, seed: int = 0) -> PluginConfig:
    """Sets the devices and the seed for the EmbeddingLayers created afterwards.

    Unlike HugeCTR's `init`, this can be called again at any time (no `reset()` needed);
    layers already created keep the devices and seed they were created with.

    Args:
        devices: device strings such as `["/CPU:0", "/CPU:1"]` or `"/GPU:0"`; default: every
            logical CPU device (see `split_cpu`).
        seed: initializer seed (an int >= 0). A key's initial row depends on (seed, key) only.

    Returns:
        The `PluginConfig` now in force.

    Example:
        >>> cfg = init(["/CPU:0"], seed=1)
        >>> cfg.devices
        ('/device:CPU:0',)
    """
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"embedlab.plugin.init: seed must be a non-negative int, got {seed!r}")
    if devices is None:
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    elif isinstance(devices, str):
        devices = [devices]
    devices = [_canonical(d) for d in devices]
    if not devices:
        raise ValueError("embedlab.plugin.init: devices must not be empty")
    if len(set(devices)) != len(devices):
        raise ValueError(f"embedlab.plugin.init: devices must be distinct, got {devices}")
    cfg = PluginConfig(tuple(devices), int(seed))
    _STATE["config"] = cfg
    return cfg


def current() -> PluginConfig:
    """The configuration `init` set last (calls `init()` with its defaults if it never ran)."""
    if _STATE["config"] is None:
        init()
    return _STATE["config"]


def split_cpu(n: int) -> list:
    """Splits the physical CPU into `n` logical devices; must run before TensorFlow starts.

    Call it at the top of a program or notebook, before any TensorFlow op or device query
    (afterwards TensorFlow refuses to change devices). Calling it again with the same `n` is
    a no-op.

    Args:
        n: number of logical CPU devices (>= 1).

    Returns:
        The logical CPU device names.

    Example (the first line +SKIP: it must run before TensorFlow starts, in a fresh process):
        >>> split_cpu(4)        # doctest: +SKIP
        ['/device:CPU:0', '/device:CPU:1', '/device:CPU:2', '/device:CPU:3']
        >>> n = len(tf.config.list_logical_devices("CPU"))
        >>> split_cpu(n) == [d.name for d in tf.config.list_logical_devices("CPU")]   # the same n again: a no-op
        True
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    want = [tf.config.LogicalDeviceConfiguration() for _ in range(int(n))]
    try:
        tf.config.set_logical_device_configuration(cpu, want)
    except RuntimeError as e:
        have = tf.config.list_logical_devices("CPU")
        if len(have) != n:
            raise RuntimeError(f"embedlab.plugin.split_cpu({n}): TensorFlow is already initialized with "
                               f"{len(have)} logical CPU device(s); call split_cpu before any TensorFlow op "
                               f"(e.g. first thing in the notebook's Setup cell) ({e})") from e
    return [d.name for d in tf.config.list_logical_devices("CPU")]


# --------------------------------------------------------------------------------------------
# Which keys each device holds
# --------------------------------------------------------------------------------------------

def distributed_owner(keys, n: int):
    """(owner device, local row) of keys >= 0 in a "distributed" table over `n` devices.

    Owner ``key % n``, local row ``key // n``: ``RouteMode::kDistributed`` of csrc/core/routing.h
    (``route_one``). NumPy arrays and TensorFlow tensors alike (``%`` and ``//`` floor in both,
    which equals C++'s ``%`` and ``/`` for keys >= 0).

    Example:
        >>> [a.tolist() for a in distributed_owner(np.array([0, 5, 6]), 4)]
        [[0, 1, 2], [0, 1, 1]]
    """
    return keys % n, keys // n


def localized_device(slot, n: int):
    """The device of slot `slot` in a "localized" table over `n` devices: ``slot % n``."""
    return slot % n


def slot_offsets(slot_size_array) -> np.ndarray:
    """The first key of each slot: the running sum of `slot_size_array` (int64, starts at 0)."""
    ssa = np.asarray(slot_size_array, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(ssa)[:-1]]).astype(np.int64)


def shard_keys(vocabulary_size: int, n: int, embedding_type: str, slot_size_array=None) -> list:
    """For each of `n` devices, the global keys its table holds, in local-row order (int64 arrays).

    Example:
        >>> [k.tolist() for k in shard_keys(5, 2, "distributed")]
        [[0, 2, 4], [1, 3]]
        >>> [k.tolist() for k in shard_keys(5, 2, "localized", [2, 1, 2])]
        [[0, 1, 3, 4], [2]]
    """
    return [device_keys(i, vocabulary_size, n, embedding_type, slot_size_array) for i in range(n)]


def device_keys(i: int, vocabulary_size: int, n: int, embedding_type: str, slot_size_array=None) -> np.ndarray:
    """The global keys device `i` of `n` holds, in local-row order: ``shard_keys(...)[i]``, built
    without the other devices' keys.

    Example:
        >>> device_keys(1, 5, 2, "distributed").tolist()
        [1, 3]
    """
    V = int(vocabulary_size)
    if n == 1:
        return np.arange(V, dtype=np.int64)
    if embedding_type == "distributed":
        # The keys k with distributed_owner(k, n) == (i, row), row = 0, 1, ...
        return np.arange(i, V, n, dtype=np.int64)
    if slot_size_array is None:
        return np.arange(V, dtype=np.int64)
    offsets = slot_offsets(slot_size_array)
    slots = [s for s in range(len(slot_size_array)) if localized_device(s, n) == i]
    if not slots:
        return np.zeros([0], np.int64)
    return np.concatenate([np.arange(offsets[s], offsets[s] + slot_size_array[s], dtype=np.int64)
                           for s in slots])


def local_rows(i: int, n: int, keys, embedding_type: str, slot=None, slot_size_array=None):
    """Device i's local row for each key of the int64 tensor `keys`, -1 where device i does not
    own the key (padding -1 included); the inverse of :func:`shard_keys`.

    Args:
        i, n: the device and the device count.
        keys: int64 tensor of global keys (-1 = padding).
        embedding_type: "distributed" or "localized".
        slot: ("localized" only) int64 tensor, the slot of each key.
        slot_size_array: ("localized" only) the layer's per-slot key counts, or None.
    """
    valid = keys >= 0
    if embedding_type == "distributed":
        owner, local = distributed_owner(keys, n)
        own = tf.logical_and(valid, owner == i)
    else:
        own = tf.logical_and(valid, localized_device(slot, n) == i)
        if slot_size_array is None:
            local = keys
        else:
            # local row = (rows of this device's earlier slots) + (key - slot offset)
            S = len(slot_size_array)
            base = np.zeros(S, np.int64)
            for j in range(n):
                acc = 0
                for s in range(S):
                    if localized_device(s, n) == j:
                        base[s] = acc
                        acc += slot_size_array[s]
            local = keys - tf.gather(tf.constant(slot_offsets(slot_size_array) - base), slot)
    return tf.where(own, local, tf.constant(-1, tf.int64))

"""Who this worker is, the strategy it runs under, and the collective keys it uses.

`init()` finds the strategy: the one whose scope is active, else a
`tf.distribute.MultiWorkerMirroredStrategy` when `TF_CONFIG` names a cluster (as the launcher
sets it), else one worker in this process. One replica per worker process: every worker owns
its shards of the tables.
"""
from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass

import tensorflow as tf

# SOK's `sok.tf_version`: TensorFlow's version as integers, e.g. [2, 21, 0]
tf_version = [int(x) for x in re.findall(r"\d+", tf.__version__)[:3]]

# Our collectives use their own group key, apart from the ones the strategy allocates (1, 2, ...).
GROUP_KEY = 0x50C5


@dataclass
class Context:
    strategy: tf.distribute.Strategy
    rank: int
    world_size: int
    device: str            # the worker's own device, where collectives and shards live
    timeout: float         # seconds a collective waits for the peers


_ctx: Context | None = None
_lock = threading.Lock()


def _timeout_default() -> float:
    return float(os.environ.get("EMBEDLAB_SOK_TIMEOUT", "60"))


def _make_strategy(timeout: float):
    cfg = os.environ.get("TF_CONFIG")
    if cfg and len(json.loads(cfg).get("cluster", {}).get("worker", [])) > 0:
        opts = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=opts)
    return tf.distribute.get_strategy()


def init(comm_tool="horovod", use_legacy_optimizer=True, strategy: tf.distribute.Strategy | None = None,
         timeout: float | None = None) -> Context:
    """Sets up embedlab.sok for this process (idempotent) and returns its context.

    Args:
        comm_tool: SOK's argument. "horovod" (SOK's default and only tool): the workers of the
            job, i.e. the strategy below. Any other string (SOK's tests pass "single"): no
            communication, one worker in this process, whatever TF_CONFIG says. A
            `tf.distribute.Strategy` here is taken as `strategy`.
        use_legacy_optimizer: SOK's argument; Keras 3 has no legacy optimizers, so it changes
            nothing (as in SOK, whose switch to them does nothing under Keras 3).
        strategy: the strategy to run under. Default: the one whose scope is active, else a
            MultiWorkerMirroredStrategy built from TF_CONFIG, else the default (one worker).
        timeout: seconds one collective waits for the other workers before failing
            (default: EMBEDLAB_SOK_TIMEOUT, set by the launcher, else 60).

    Returns:
        the Context (rank, world_size, strategy, device).
    """
    global _ctx
    if isinstance(comm_tool, tf.distribute.Strategy):
        comm_tool, strategy = "horovod", comm_tool
    if not isinstance(comm_tool, str):
        raise ValueError(f"embedlab.sok.init: comm_tool must be a string (e.g. 'horovod') or a strategy, "
                         f"got {comm_tool!r}")
    if comm_tool != "horovod" and strategy is None and _ctx is None:
        strategy = tf.distribute.get_strategy()
    with _lock:
        timeout = _timeout_default() if timeout is None else float(timeout)
        if strategy is None:
            if _ctx is not None:
                return _ctx
            strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else _make_strategy(timeout)
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            resolver = strategy.cluster_resolver
            world = len(resolver.cluster_spec().as_dict().get("worker", [])) or 1
            rank = int(resolver.task_id or 0)
            devices = strategy.extended.worker_devices
            if strategy.num_replicas_in_sync != world or len(devices) != 1:
                raise ValueError(
                    f"embedlab.sok.init: one replica per worker process is supported, but the strategy has "
                    f"{strategy.num_replicas_in_sync} replicas over {world} workers; make one device visible per "
                    f"process (e.g. CUDA_VISIBLE_DEVICES) and start one process per GPU")
            device = devices[0]
        elif strategy.num_replicas_in_sync == 1:
            rank, world, device = 0, 1, "/device:CPU:0"
            gpus = tf.config.list_logical_devices("GPU")
            if gpus:
                device = gpus[0].name
        else:
            raise ValueError(f"embedlab.sok.init: {type(strategy).__name__} with {strategy.num_replicas_in_sync} "
                             f"replicas in one process is not supported; use MultiWorkerMirroredStrategy with one "
                             f"process per device (python -m embedlab.sok.launch -n N script.py)")
        _ctx = Context(strategy, rank, world, device, timeout)
        return _ctx


def context() -> Context:
    """The context, initialising with the defaults on first use."""
    return _ctx if _ctx is not None else init()


def rank() -> int:
    return context().rank


def num_workers() -> int:
    return context().world_size


# ---- instance keys ---------------------------------------------------------------------------
# A collective instance remembers the shape it first ran with, so every call needs fresh keys.
# One int32 counter per process hands out a block of keys per exchange. Workers trace the same
# program, so they draw blocks in the same order as long as draws are chained in program order
# (each draw depends on the previous one in the same graph).
KEYS_PER_CALL = 8
_counter = None
_last_draw: dict = {}


def _counter_var():
    global _counter
    if _counter is None:
        with tf.init_scope(), tf.device("/device:CPU:0"):
            from tensorflow.python.ops import resource_variable_ops
            _counter = resource_variable_ops.ResourceVariable(1000, dtype=tf.int32, trainable=False,
                                                              name="embedlab_sok_instance_keys")
    return _counter


def draw_keys() -> tf.Tensor:
    """The first of KEYS_PER_CALL fresh instance keys (an int32 scalar tensor)."""
    c = _counter_var()
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    prev = _last_draw.get(id(graph)) if graph is not None else None
    deps = [prev] if prev is not None and prev.graph is graph else []
    with tf.control_dependencies(deps), tf.device("/device:CPU:0"):
        base = c.assign_add(KEYS_PER_CALL, read_value=True) - KEYS_PER_CALL
    if graph is not None:
        _last_draw[id(graph)] = base
    return base

"""embedlab.hps: HugeCTR's Hierarchical Parameter Server, on the CPU, with real Redis and RocksDB.

* :func:`Init` (alias :func:`init`) reads HugeCTR's HPS JSON, starts the :class:`ParameterServer`
  for it (embedding cache -> ``hash_map`` / ``parallel_hash_map`` / ``redis_cluster`` ->
  ``rocks_db`` -> default value) and returns ``"OK"``, as HugeCTR's; :func:`get_server` returns
  the server.
* :class:`LookupLayer` / :class:`SparseLookupLayer`: Keras layers over the TensorFlow op
  ``EmbedLabHpsLookup``; a SavedModel holding them initialises its server from
  ``ps_config_file`` on first call in a fresh process (after ``import embedlab.hps``).
* :func:`write_sparse_model` / :func:`read_sparse_model`: the ``key`` / ``emb_vector`` folder
  (the package's one implementation, :mod:`embedlab.sparse_model`).
* :mod:`embedlab.hps.export`: a trained dense Keras model and its tables as the files the HPS and
  Triton serve (sparse model, HPS JSON, SavedModels, ONNX).

A local Redis for the volatile tier (one node or a cluster) is started by
:mod:`embedlab.services.redis_server`.

Importing this package does not import TensorFlow. When TensorFlow is already imported, the op
library's lookup callback is registered at once (so ``tf.saved_model.load`` of a model with HPS
layers works right after ``import embedlab.hps``); otherwise on first use of the layers, or
through :func:`register_tf_callback`.
"""
from __future__ import annotations

import sys

from ..sparse_model import read_sparse_model, write_sparse_model
from .config import HPSConfig, HPSConfigError, load_config
from .server import HPSLookupError, HPSUnavailableError, ParameterServer
from .tiers import TierError, TierUnavailable
from ._registry import Init, get_server, init, servers, shutdown

__all__ = ["Init", "init", "shutdown", "get_server", "servers", "ParameterServer", "HPSConfig", "HPSConfigError",
           "HPSLookupError", "HPSUnavailableError", "TierError", "TierUnavailable", "load_config", "LookupLayer",
           "SparseLookupLayer",
           "write_sparse_model", "read_sparse_model", "register_tf_callback"]


def register_tf_callback() -> None:
    """Loads EmbedLab's TensorFlow op library and registers the lookup callbacks (imports TF).

    Registers the host kernel's callback and, for the GPU kernel of CUDA builds, the device
    callback (:mod:`embedlab.hps.layers`). Idempotent.

    Example:
        >>> import tensorflow as tf, embedlab.hps as hps     # doctest: +SKIP
        >>> hps.register_tf_callback()                        # doctest: +SKIP
    """
    from . import layers  # noqa: F401  (registers at import)


def __getattr__(name):
    if name in ("LookupLayer", "SparseLookupLayer"):
        from . import layers
        return getattr(layers, name)
    if name in ("export", "layers", "tiers"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'embedlab.hps' has no attribute {name!r}")


if "tensorflow" in sys.modules:
    from .._native import NativeLibraryError
    try:
        register_tf_callback()
    except NativeLibraryError as _e:
        # The server works without the op library; the layers raise this error when used.
        import logging
        logging.getLogger("embedlab.hps").warning("HPS layers unavailable in this process: %s", _e)

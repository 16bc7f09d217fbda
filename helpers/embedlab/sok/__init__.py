"""SparseOperationKit on TensorFlow's own distributed engine (`MultiWorkerMirroredStrategy`).

Embedding tables are sharded over worker processes (model parallel) while dense layers stay
data parallel; keys travel to the worker that owns their row and come back as vectors, with
EmbedLab's compiled kernels doing the routing and the lookups.

The recommended API: `init`, `Variable`, `DynamicVariable`, `lookup_sparse`,
`all2all_dense_embedding`, `OptimizerWrapper`, `SGD`, `filter_variables`, `export` / `assign`,
`dump` / `load`, `tf_version`. The first-generation API (SOK's getting-started guide): `Init`,
`DistributedEmbedding`, `All2AllDenseEmbedding`, `split_embedding_variable_from_others`,
`OptimizerScope`, `Saver`, `get_embedding`. Start N local workers with
`python -m embedlab.sok.launch -n N script.py`.

`embedlab.sok.compat` is the compatibility wing: the first-generation API (`compat.v1`), SOK v1's
module paths (`compat.embeddings`, `.core`, `.optimizers`, `.saver`) and SOK's Horovod calls
(`compat.horovod`). The paths code imported them by (`embedlab.sok.embeddings...`,
`embedlab.sok.horovod`, ...) are registered by the wing when this package is imported.

Names are loaded on first use: `import embedlab.sok` alone does not import TensorFlow, so the
launcher (`embedlab.sok.launch`, which needs none) starts in a fraction of a second; the first
`sok.<name>` imports TensorFlow (through `embedlab.import_tensorflow`, without its banner).
"""
from __future__ import annotations

import importlib as _importlib

from . import compat as _compat

_compat.install()                        # SOK v1's module paths -> the wing (imports nothing yet)

# public name -> the submodule that defines it
_NAMES = {
    "context": "_context", "init": "_context", "num_workers": "_context", "rank": "_context", "tf_version": "_context",
    "assign": "checkpoint", "dump": "checkpoint", "export": "checkpoint", "gather": "checkpoint", "load": "checkpoint",
    "DynamicVariable": "dynamic",
    "All2AllDenseEmbedding": "compat.v1", "DistributedEmbedding": "compat.v1", "Init": "compat.v1",
    "OptimizerScope": "compat.v1", "Saver": "compat.v1", "split_embedding_variable_from_others": "compat.v1",
    "get_embedding": "compat.v1",
    "all2all_dense_embedding": "lookup", "lookup_sparse": "lookup", "sparse_read_and_evict": "lookup",
    "incremental_model_dump": "lookup",
    "OptimizerWrapper": "optimizer", "SGD": "optimizer", "filter_variables": "optimizer",
    "Variable": "variable",
}

__all__ = ["init", "context", "rank", "num_workers", "Variable", "DynamicVariable", "lookup_sparse",
           "all2all_dense_embedding", "OptimizerWrapper", "SGD", "filter_variables", "tf_version", "dump", "load", "export", "assign", "gather", "exchange",
           "Init", "DistributedEmbedding", "All2AllDenseEmbedding", "split_embedding_variable_from_others",
           "OptimizerScope", "Saver", "sparse_read_and_evict", "incremental_model_dump", "get_embedding"]


# submodules reached as attributes, e.g. SOK's module paths `sok.embeddings.tf_distributed_embedding`
# (old paths, imported through the wing's finder)
_SUBMODULES = ("exchange", "embeddings", "core", "optimizers", "saver")


def __getattr__(name):
    if name not in _NAMES and name not in _SUBMODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .._tfstart import import_tensorflow
    import_tensorflow()                  # once: TensorFlow without its start-up banner
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    value = getattr(_importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    globals()[name] = value              # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

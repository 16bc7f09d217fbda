"""SparseOperationKit on TensorFlow's own distributed engine (`MultiWorkerMirroredStrategy`).

Embedding tables are sharded over worker processes (model parallel) while dense layers stay
data parallel; keys travel to the worker that owns their row and come back as vectors, with
EmbedLab's compiled kernels doing the routing and the lookups.

The recommended API: `init`, `Variable`, `DynamicVariable`, `lookup_sparse`,
`all2all_dense_embedding`, `OptimizerWrapper`, `export` / `assign`, `dump` / `load`.
The first-generation API (SOK's getting-started guide): `Init`, `DistributedEmbedding`,
`All2AllDenseEmbedding`, `split_embedding_variable_from_others`, `OptimizerScope`, `Saver`.
Start N local workers with `python -m embedlab.sok.launch -n N script.py`.
"""
from __future__ import annotations

from ._context import context, init, num_workers, rank
from . import exchange
from .dump import assign, dump, export, gather, load
from .dynamic import DynamicVariable
from .legacy import (All2AllDenseEmbedding, DistributedEmbedding, Init, OptimizerScope, Saver,
                     split_embedding_variable_from_others)
from .lookup import all2all_dense_embedding, lookup_sparse
from .optimizer import OptimizerWrapper
from .variable import Variable

__all__ = ["init", "context", "rank", "num_workers", "Variable", "DynamicVariable", "lookup_sparse",
           "all2all_dense_embedding", "OptimizerWrapper", "dump", "load", "export", "assign", "gather", "exchange",
           "Init", "DistributedEmbedding", "All2AllDenseEmbedding", "split_embedding_variable_from_others",
           "OptimizerScope", "Saver"]

"""SOK's `sparse_operation_kit.embeddings` package path (as of HugeCTR v23.09.00), for code that
imports its layers by their module path, e.g.
`from embedlab.sok.compat.embeddings.tf_distributed_embedding import TFDistributedEmbedding`.

Modules: `distributed_embedding` (DistributedEmbedding), `all2all_dense_embedding`
(All2AllDenseEmbedding), `get_embedding_op` (get_embedding): the layers of `embedlab.sok`
under SOK's module names; `tf_distributed_embedding` (TFDistributedEmbedding): SOK's
TensorFlow-only reference layer.
"""
from . import all2all_dense_embedding, distributed_embedding, get_embedding_op  # noqa: F401  (as SOK's package import)

__all__: list = []

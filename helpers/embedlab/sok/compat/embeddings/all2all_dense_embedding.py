"""SOK's module path `sparse_operation_kit.embeddings.all2all_dense_embedding`: the layer is
`embedlab.sok.All2AllDenseEmbedding` (see `embedlab.sok.compat.v1`)."""
from ...._tfstart import import_tensorflow

import_tensorflow()                      # TensorFlow without its start-up banner, before v1 imports it

from ..v1 import All2AllDenseEmbedding  # noqa: E402

__all__ = ["All2AllDenseEmbedding"]

"""SOK's module path `sparse_operation_kit.embeddings.all2all_dense_embedding`: the layer is
`embedlab.sok.All2AllDenseEmbedding` (see `embedlab.sok.legacy`)."""
from ..._tfstart import import_tensorflow

import_tensorflow()                      # TensorFlow without its start-up banner, before legacy imports it

from ..legacy import All2AllDenseEmbedding  # noqa: E402

__all__ = ["All2AllDenseEmbedding"]

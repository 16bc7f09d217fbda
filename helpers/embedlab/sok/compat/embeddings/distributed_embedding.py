"""SOK's module path `sparse_operation_kit.embeddings.distributed_embedding`: the layer is
`embedlab.sok.DistributedEmbedding` (see `embedlab.sok.compat.v1`)."""
from ...._tfstart import import_tensorflow

import_tensorflow()                      # TensorFlow without its start-up banner, before v1 imports it

from ..v1 import DistributedEmbedding  # noqa: E402

__all__ = ["DistributedEmbedding"]

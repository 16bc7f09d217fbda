"""SOK's module path `sparse_operation_kit.embeddings.distributed_embedding`: the layer is
`embedlab.sok.DistributedEmbedding` (see `embedlab.sok.legacy`)."""
from ..._tfstart import import_tensorflow

import_tensorflow()                      # TensorFlow without its start-up banner, before legacy imports it

from ..legacy import DistributedEmbedding  # noqa: E402

__all__ = ["DistributedEmbedding"]

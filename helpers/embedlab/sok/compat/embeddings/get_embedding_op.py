"""SOK's module path `sparse_operation_kit.embeddings.get_embedding_op`: `embedlab.sok.get_embedding`."""
from ...._tfstart import import_tensorflow

import_tensorflow()                      # TensorFlow without its start-up banner, before v1 imports it

from ..v1 import get_embedding  # noqa: E402

__all__ = ["get_embedding"]

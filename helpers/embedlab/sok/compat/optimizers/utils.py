"""SOK's module path `sparse_operation_kit.optimizers.utils`: `split_embedding_variable_from_others`."""
from ...._tfstart import import_tensorflow

import_tensorflow()                      # TensorFlow without its start-up banner, before v1 imports it

from ..v1 import split_embedding_variable_from_others  # noqa: E402

__all__ = ["split_embedding_variable_from_others"]

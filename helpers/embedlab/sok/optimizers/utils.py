"""SOK's module path `sparse_operation_kit.optimizers.utils`: `split_embedding_variable_from_others`."""
from ..._tfstart import import_tensorflow

import_tensorflow()                      # TensorFlow without its start-up banner, before legacy imports it

from ..legacy import split_embedding_variable_from_others  # noqa: E402

__all__ = ["split_embedding_variable_from_others"]

"""SOK's module path `sparse_operation_kit.core.context_scope`: `embedlab.sok.OptimizerScope`."""
from ..._tfstart import import_tensorflow

import_tensorflow()                      # TensorFlow without its start-up banner, before legacy imports it

from ..legacy import OptimizerScope  # noqa: E402

__all__ = ["OptimizerScope"]

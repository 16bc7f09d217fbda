"""SOK's module path `sparse_operation_kit.core.context_scope`: `embedlab.sok.OptimizerScope`."""
from ...._tfstart import import_tensorflow

import_tensorflow()                      # TensorFlow without its start-up banner, before v1 imports it

from ..v1 import OptimizerScope  # noqa: E402

__all__ = ["OptimizerScope"]

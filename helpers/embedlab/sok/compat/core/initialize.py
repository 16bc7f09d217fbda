"""SOK's module path `sparse_operation_kit.core.initialize`: `embedlab.sok.Init`."""
from ...._tfstart import import_tensorflow

import_tensorflow()                      # TensorFlow without its start-up banner, before v1 imports it

from ..v1 import Init  # noqa: E402

__all__ = ["Init"]

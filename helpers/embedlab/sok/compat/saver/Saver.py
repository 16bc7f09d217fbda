"""SOK's module path `sparse_operation_kit.saver.Saver`: the class is `embedlab.sok.Saver`."""
from ...._tfstart import import_tensorflow

import_tensorflow()                      # TensorFlow without its start-up banner, before v1 imports it

from ..v1 import Saver  # noqa: E402

__all__ = ["Saver"]

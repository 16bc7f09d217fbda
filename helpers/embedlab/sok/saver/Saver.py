"""SOK's module path `sparse_operation_kit.saver.Saver`: the class is `embedlab.sok.Saver`."""
from ..._tfstart import import_tensorflow

import_tensorflow()                      # TensorFlow without its start-up banner, before legacy imports it

from ..legacy import Saver  # noqa: E402

__all__ = ["Saver"]

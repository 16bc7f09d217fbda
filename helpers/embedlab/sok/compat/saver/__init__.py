"""SOK's `sparse_operation_kit.saver` package path (as of HugeCTR v23.09.00): `saver.Saver.Saver`
is `embedlab.sok.Saver`."""
from . import Saver  # noqa: F401  (the module, as in SOK; the class is Saver.Saver)

__all__: list = []

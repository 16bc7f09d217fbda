"""SOK's `sparse_operation_kit.core` package path (as of HugeCTR v23.09.00): `initialize` (Init)
and `context_scope` (OptimizerScope), the names of `embedlab.sok` under SOK's module names."""
from . import context_scope, initialize  # noqa: F401  (as SOK's package import)

__all__ = ["initialize", "context_scope"]

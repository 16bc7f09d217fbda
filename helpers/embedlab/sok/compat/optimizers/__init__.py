"""SOK's `sparse_operation_kit.optimizers` package path (as of HugeCTR v23.09.00).

`split_embedding_variable_from_others` (also in `optimizers.utils`) is `embedlab.sok`'s. SOK's
`optimizers.Adam`, its compiled GPU Adam for embedding variables, is not provided: asking for it
raises an `AttributeError` that names the replacement (a Keras optimizer under
`sok.OptimizerScope`, or `sok.OptimizerWrapper` over one of `embedlab.optimizers`).
"""
from .utils import split_embedding_variable_from_others

__all__ = ["split_embedding_variable_from_others"]


def __getattr__(name):
    if name == "Adam":
        raise AttributeError(
            "embedlab.sok.compat.optimizers.Adam: SOK's compiled GPU Adam is not provided; update embedding variables "
            "with a Keras optimizer under sok.OptimizerScope(embedding_variables) (e.g. "
            "tf.keras.optimizers.Adam), or sok.OptimizerWrapper over one of embedlab.optimizers")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

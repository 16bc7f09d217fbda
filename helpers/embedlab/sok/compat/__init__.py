"""SOK's compatibility wing: SparseOperationKit v1's API, module paths and Horovod calls, for code
written against NVIDIA's SOK (its getting-started guide, HugeCTR's tests and demo models).

Its modules::

    v1            the first-generation API: Init, DistributedEmbedding, All2AllDenseEmbedding,
                  split_embedding_variable_from_others, OptimizerScope, Saver, get_embedding
                  (exported by `embedlab.sok` itself, e.g. `sok.DistributedEmbedding`)
    core/ embeddings/ optimizers/ saver/
                  SOK v1's package layout (`sparse_operation_kit.embeddings.tf_distributed_embedding`,
                  `sparse_operation_kit.core.initialize`, ...): the names of `v1` under SOK's
                  module names, plus SOK's TensorFlow-only `TFDistributedEmbedding`
    horovod       the few `horovod.tensorflow` calls SOK's code makes, over `embedlab.sok`'s collectives

The module paths that code imported these by, directly under `embedlab.sok`, are registered here
and only here (`OLD_PATHS`): `embedlab.sok.embeddings`, `.core`, `.optimizers`, `.saver`,
`.horovod` and `.legacy`, with every submodule under them, import the wing's module of the same
relative name; the old and the new name are bound to the same module object. `embedlab.sok`
calls `install()` when it is imported; nothing of the wing is imported before a path is used.

    >>> import embedlab.sok.compat as compat
    >>> compat.target("embedlab.sok.embeddings.tf_distributed_embedding")
    'embedlab.sok.compat.embeddings.tf_distributed_embedding'
    >>> compat.target("embedlab.sok.lookup") is None
    True
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__all__ = ["OLD_PATHS", "target", "install"]

# old module path -> its module in the wing; a submodule of an old path maps to the same
# submodule of the wing's module
OLD_PATHS = {
    "embedlab.sok.core": "embedlab.sok.compat.core",
    "embedlab.sok.embeddings": "embedlab.sok.compat.embeddings",
    "embedlab.sok.optimizers": "embedlab.sok.compat.optimizers",
    "embedlab.sok.saver": "embedlab.sok.compat.saver",
    "embedlab.sok.horovod": "embedlab.sok.compat.horovod",
    "embedlab.sok.legacy": "embedlab.sok.compat.v1",
}


def target(fullname: str) -> str | None:
    """The wing's module name for an old module path, or None when `fullname` is not one.

    Args:
        fullname: a dotted module name, e.g. "embedlab.sok.saver.Saver".

    Returns:
        The module of the wing it names ("embedlab.sok.compat.saver.Saver"), or None.

    Example:
        >>> target("embedlab.sok.horovod")
        'embedlab.sok.compat.horovod'
    """
    for old, new in OLD_PATHS.items():
        if fullname == old or fullname.startswith(old + "."):
            return new + fullname[len(old):]
    return None


class _OldPathLoader(importlib.abc.Loader):
    """Loads an old path as the wing's module (the same object, the wing's `__spec__` kept)."""

    def __init__(self, new: str):
        self.new = new
        self._spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self._spec        # the import system set the old path's spec on it


class _OldPathFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target_module=None):
        new = target(fullname)
        if new is None:
            return None
        spec = importlib.util.find_spec(new)
        if spec is None:
            return None                     # no such module in the wing: the usual ModuleNotFoundError
        return importlib.util.spec_from_loader(fullname, _OldPathLoader(new), origin=spec.origin,
                                               is_package=spec.submodule_search_locations is not None)


def install() -> None:
    """Puts the finder of the old paths first on `sys.meta_path` (once).

    First, because an old package path is bound to the wing's package, whose `__path__` would
    otherwise let the path finder load its submodules a second time under the old names.

    Returns:
        None.

    Example:
        >>> install()
        >>> import embedlab.sok.saver.Saver as old, embedlab.sok.compat.saver.Saver as new
        >>> old is new
        True
    """
    if not any(isinstance(f, _OldPathFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldPathFinder())

"""Module paths that name another module: the notebooks' helpers live in `embedlab.tutorials`,
and the paths users imported them by keep working.

`install()` (run by `embedlab/__init__`) puts one finder at the end of `sys.meta_path`. Importing
an old path (`import embedlab.sok.demo`, `from embedlab.hps import demo`, `python -m
embedlab.sok.demo`) imports the module it names, on first use, and binds the same module object
to both names; nothing is imported before it is asked for.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

ALIASES = {
    "embedlab.models.training": "embedlab.tutorials.training",
    "embedlab.session.lab": "embedlab.tutorials.session_lab",
    "embedlab.sok.demo": "embedlab.tutorials.sok_demo",
    "embedlab.sok.demo_guide": "embedlab.tutorials.sok_guide",
    "embedlab.hps.demo": "embedlab.tutorials.hps_demo",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an alias as the module it names (the same object, its own `__spec__` kept)."""

    def __init__(self, target: str):
        self.target = target
        self._spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self._spec        # the import system set the alias's spec on it

    def is_package(self, fullname):
        return False

    def get_code(self, fullname):
        """The target's code, for `python -m <alias>` (runpy)."""
        spec = importlib.util.find_spec(self.target)
        return spec.loader.get_code(self.target)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in ALIASES:
            return None
        target_spec = importlib.util.find_spec(ALIASES[fullname])     # imports embedlab.tutorials only
        return importlib.util.spec_from_loader(fullname, _AliasLoader(ALIASES[fullname]), origin=target_spec.origin)


def install() -> None:
    """Adds the finder to `sys.meta_path` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())

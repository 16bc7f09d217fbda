"""Sphinx configuration of EmbedLab's documentation site (`make docs` builds it into build/docs/).

Three inputs come from outside docs/ and are prepared when the build starts:
- the executed notebooks of `make run` (build/notebooks/, or the folder EMBEDLAB_NOTEBOOKS_DIR names), copied
  into docs/notebooks/ and rendered as they are (MyST-NB, execution off);
- the benchmark JSON of docs/benchmarks/results/, turned into tables and plots by docs/benchmarks/generate.py;
- the `embedlab` package that autodoc imports: the installed one under `make docs`, or helpers/ on PYTHONPATH.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path.insert(0, str(DOCS / "benchmarks"))

project = "EmbedLab"
author = "EmbedLab contributors"
copyright = "EmbedLab contributors, Apache License 2.0"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinxcontrib.mermaid",
]

html_theme = "furo"
html_title = "EmbedLab"
templates_path = ["_templates"]
exclude_patterns = ["_build", "_templates", "benchmarks/_generated", "benchmarks/results", "**.ipynb_checkpoints",
                    "notebooks/*.kernel.log"]

# MyST (Markdown) and MyST-NB (notebooks): the notebooks are the executed copies of `make run`, never re-run here.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
myst_fence_as_directive = ["mermaid"]
nb_execution_mode = "off"
nb_merge_streams = True
# Notebook cells print ANSI-coloured tracebacks and progress bars; rendered as text, not re-interpreted.
nb_render_text_lexer = "none"

# API reference: one page per public module (every module or package whose dotted name has no part starting with
# `_`), generated from the docstrings (Google style); a page describes the names of its module's `__all__` (or, with
# no `__all__`, the public names the module defines).
#
# One owner per object. Packages re-export the names of their submodules (`embedlab.hps.HPSConfig` is
# `embedlab.hps.config.HPSConfig`), and a few objects are exported by two packages (`FormatError` by
# `embedlab.data.formats` and `embedlab.session`). Each object is described once, on the page of its owner: the
# exporting module with the shortest dotted name (the name users import), the first in alphabetical order on a tie.
# Every other page that exports it lists it under "Also exported here" with a link to the owner's description. So
# every public module has a page to link to (`:mod:`embedlab.hps.export``), no object is described twice, and a
# reference to an object's defining module and name (what type hints give) resolves through autodoc's canonical name.
def _api_layout() -> tuple[dict, dict, dict]:
    """(submodules, own, elsewhere) per public module: its public submodules, the names its page describes, and
    [(name, owner's dotted name)] of the names it exports that another page describes."""
    import importlib
    import inspect
    import pkgutil

    modules, submodules = {}, {}

    def walk(name: str) -> None:
        mod = importlib.import_module(name)
        modules[name] = mod
        subs = [f"{name}.{m.name}" for m in pkgutil.iter_modules(getattr(mod, "__path__", []))
                if not m.name.startswith("_")]
        submodules[name] = subs
        for sub in subs:
            walk(sub)

    walk("embedlab")

    def exported(name: str, mod) -> list[str]:
        if hasattr(mod, "__all__"):
            return [n for n in mod.__all__ if not inspect.ismodule(getattr(mod, n, None))]
        return [n for n, v in vars(mod).items() if not n.startswith("_") and getattr(v, "__module__", None) == name
                and (inspect.isclass(v) or inspect.isfunction(v))]

    exports = {name: exported(name, mod) for name, mod in modules.items()}
    # Objects that are values (strings, numbers) are compared by their exporting name only: two modules exporting
    # the same constant each describe it.
    owner = {}
    for name in sorted(modules, key=lambda n: (n.count("."), n)):
        for n in exports[name]:
            obj = getattr(modules[name], n, None)
            if inspect.isclass(obj) or inspect.isroutine(obj):
                owner.setdefault(id(obj), f"{name}.{n}")
    own, elsewhere = {}, {}
    for name, mod in modules.items():
        own[name], elsewhere[name] = [], []
        for n in exports[name]:
            obj = getattr(mod, n, None)
            first = owner.get(id(obj)) if (inspect.isclass(obj) or inspect.isroutine(obj)) else None
            if first is None or first == f"{name}.{n}" or first.rsplit(".", 1)[0] == name:
                own[name].append(n)
            else:
                elsewhere[name].append((n, first))
    return submodules, own, elsewhere


_API_SUBMODULES, _API_OWN, _API_ELSEWHERE = _api_layout()
autosummary_context = {"api_submodules": _API_SUBMODULES, "api_own": _API_OWN, "api_elsewhere": _API_ELSEWHERE}
autosummary_generate = True
autosummary_ignore_module_all = False
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# Cross-references are checked (`make docs` runs with -n). The inventories of third-party packages would need the
# network, so references into these packages (type hints such as numpy.ndarray, tf.Tensor, pathlib.Path) are not
# checked; every reference into embedlab is.
_EXTERNAL = ("numpy", "np", "pathlib", "tensorflow", "tf", "keras", "os", "typing", "collections", "concurrent",
             "datetime", "subprocess", "threading", "multiprocessing", "socket", "io", "json", "enum", "dataclasses",
             "distributed", "dask", "pandas", "pyarrow", "redis", "onnx", "onnxruntime", "tritonclient", "rocksdict",
             "fsspec", "contextlib", "types", "abc", "logging", "torch", "keras_rs")
nitpick_ignore_regex = [(r"py:.*", rf"({'|'.join(_EXTERNAL)})(\..+)?")]

# The notebooks' folder and whether its absence is an error (the docs build renders notebooks, it never runs them).
NOTEBOOKS_DIR = Path(os.environ.get("EMBEDLAB_NOTEBOOKS_DIR", REPO / "build" / "notebooks"))
NOTEBOOK_SOURCES = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _stage_notebooks(app) -> None:
    """Copy the executed notebooks into docs/notebooks/ (git-ignored); a missing one is an error naming `make run`."""
    missing = [n for n in NOTEBOOK_SOURCES if not (NOTEBOOKS_DIR / n).is_file()]
    if missing:
        raise RuntimeError(
            f"executed notebooks missing in {NOTEBOOKS_DIR}: {', '.join(missing)}. The documentation renders the "
            "copies that `make run` writes there; run `make run` first (or set EMBEDLAB_NOTEBOOKS_DIR to a folder "
            "of executed copies made by ci/run_notebooks.py).")
    dst = DOCS / "notebooks"
    dst.mkdir(exist_ok=True)
    for old in dst.glob("*.ipynb"):
        if old.name not in NOTEBOOK_SOURCES:
            old.unlink()
    for name in NOTEBOOK_SOURCES:
        src = NOTEBOOKS_DIR / name
        if not (dst / name).exists() or (dst / name).read_bytes() != src.read_bytes():
            shutil.copyfile(src, dst / name)


def _generate_benchmarks(app) -> None:
    import generate
    generate.main(["--out", str(DOCS / "benchmarks" / "_generated")])


def _public_bases(app, name, obj, options, bases) -> None:
    """Show-inheritance lists public base classes only: a private mixin has no page to link to."""
    bases[:] = [b for b in bases if not getattr(b, "__name__", "").startswith("_")]


def setup(app):
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("builder-inited", _stage_notebooks)
    app.connect("builder-inited", _generate_benchmarks)
    return {"parallel_read_safe": True}

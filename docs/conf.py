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
# `_`), generated from the docstrings (Google style); a page describes the names of its module's `__all__` and the
# public classes the module defines that `__all__` leaves out (the types its signatures name), or, with no `__all__`,
# the public classes and functions the module defines or exports on first use.
#
# One owner per object. Packages re-export the names of their submodules (`embedlab.hps.HPSConfig` is
# `embedlab.hps.config.HPSConfig`), and a few objects are exported by two packages (`FormatError` by
# `embedlab.data.formats` and `embedlab.session`). Each object is described once, on the page of its owner: the
# exporting module with the fewest dots (the name users import); on a tie the module that defines it, else the first
# in alphabetical order. Every other page that exports it lists it under "Also exported here" with a link to that
# description, and a reference to any other public name of the object (the defining module's name, which type hints
# give, or a package's) resolves to it (`_resolve_by_owner`). So every public module has a page to link to
# (:mod:`embedlab.hps.export`), and no object is described twice.
def _api_layout() -> tuple[dict, dict, dict]:
    """(submodules, explicit, elsewhere) per public module: its public submodules, [(name, autodoc directive)] of
    the names its page describes that `automodule` does not find by itself, and [(name, owner's dotted name)] of the
    names it exports that another page describes."""
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
            # Its __all__, and the public classes it defines that __all__ leaves out: they are the types of its API
            # (`ModelSpec` holds `DataSpec`s), which its signatures name.
            return [n for n in mod.__all__ if not inspect.ismodule(getattr(mod, n, None))] + [
                n for n, v in vars(mod).items() if not n.startswith("_") and n not in mod.__all__
                and inspect.isclass(v) and v.__module__ == name]
        # No __all__: the classes and functions the module defines, and those it exports on first use (a module
        # __getattr__ whose names its __dir__ lists, as `embedlab.core`).
        names = [n for n in dir(mod) if not n.startswith("_") and not inspect.ismodule(getattr(mod, n, None))]
        return [n for n in names if (inspect.isclass(getattr(mod, n)) or inspect.isroutine(getattr(mod, n)))
                and (getattr(getattr(mod, n), "__module__", None) == name or n not in vars(mod))]

    def found_by_automodule(name: str, mod, n: str) -> bool:
        """Whether `automodule` documents `n` by itself: it looks only at the module's attributes (not at names
        a module __getattr__ makes on first use) and, without __all__, only at what the module defines."""
        if n not in vars(mod):
            return False
        if hasattr(mod, "__all__"):
            return n in mod.__all__
        return getattr(vars(mod)[n], "__module__", None) == name

    def kind(obj) -> str:
        if inspect.isclass(obj):
            return "exception" if issubclass(obj, BaseException) else "class"
        return "function" if inspect.isroutine(obj) else "data"

    exports = {name: exported(name, mod) for name, mod in modules.items()}
    # Objects that are values (strings, numbers) are compared by their exporting name only: two modules exporting
    # the same constant each describe it.
    exporters = {}
    for name in modules:
        for n in exports[name]:
            obj = getattr(modules[name], n, None)
            if inspect.isclass(obj) or inspect.isroutine(obj):
                exporters.setdefault(id(obj), []).append((name.count("."), obj.__module__ != name, name, n))
    owner = {key: "{2}.{3}".format(*min(names)) for key, names in exporters.items()}
    _OWNER.update(owner)
    explicit, elsewhere = {}, {}
    for name, mod in modules.items():
        explicit[name], elsewhere[name] = [], []
        for n in exports[name]:
            obj = getattr(mod, n, None)
            first = owner.get(id(obj)) if (inspect.isclass(obj) or inspect.isroutine(obj)) else None
            if first is None or first == f"{name}.{n}" or first.rsplit(".", 1)[0] == name:
                if not found_by_automodule(name, mod, n):
                    explicit[name].append((n, kind(obj)))
            else:
                elsewhere[name].append((n, first))
    return submodules, explicit, elsewhere


_OWNER: dict[int, str] = {}      # id(class or function) -> the dotted name of its one description
_API_SUBMODULES, _API_EXPLICIT, _API_ELSEWHERE = _api_layout()


def _object_at(dotted: str):
    """The object a dotted name denotes (a module's attribute, or an attribute of one), or None."""
    import importlib
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _resolve_by_owner(app, env, node, contnode):
    """A reference to another public name of a described object (the defining module's name, as type hints and
    docstrings of submodules give it, or a package's) resolves to the object's one description (above)."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    mod, cls = node.get("py:module"), node.get("py:class")
    candidates = [target] + ([f"{mod}.{cls}.{target}"] if mod and cls else []) + ([f"{mod}.{target}"] if mod else [])
    domain = env.get_domain("py")
    for cand in candidates:
        if not cand.startswith("embedlab."):
            continue
        parts = cand.split(".")
        # The longest prefix that is a described object; the rest (a method, an attribute) follows its owner.
        for i in range(len(parts), 1, -1):
            owner = _OWNER.get(id(_object_at(".".join(parts[:i])))) if _object_at(".".join(parts[:i])) is not None \
                else None
            if owner:
                # Resolved as "obj": the owner's description may be of another kind than the role asked for (an
                # exception exported under an alias is described as the alias).
                found = domain.resolve_xref(env, node["refdoc"], app.builder, "obj", ".".join([owner] + parts[i:]),
                                            node, contnode)
                if found is not None:
                    return found
                break
    return None
autosummary_context = {"api_submodules": _API_SUBMODULES, "api_explicit": _API_EXPLICIT,
                       "api_elsewhere": _API_ELSEWHERE}
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
nitpick_ignore_regex = [(r"py:.*", rf"({'|'.join(_EXTERNAL)})(\..+)?"),
                        # A type hint of a public function may name a private class (`embedlab.sok._context.Context`,
                        # a name with a part starting with `_`): it has no page, so it shows as plain text. Only class
                        # references (what type hints give); docstrings refer to public names only, and a docstring's
                        # :func:/:mod:/:meth: reference to a private name still fails the build.
                        (r"py:class", r"embedlab(\.\w+)*\._\w+(\.\w+)*")]

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
    app.connect("missing-reference", _resolve_by_owner)
    app.connect("builder-inited", _stage_notebooks)
    app.connect("builder-inited", _generate_benchmarks)
    return {"parallel_read_safe": True}

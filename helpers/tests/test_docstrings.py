"""The `>>>` examples in the package's docstrings, run as doctests on the installed package.

One test per module that has examples (the files of the installed `embedlab`, found without
importing them). Each runs in a fresh temporary working directory, so an example that writes files
leaves nothing behind, with ELLIPSIS and NORMALIZE_WHITESPACE. An example marked
`# doctest: +SKIP` is not run: it needs what a test run does not have (a running Triton server
or Redis, a GPU, a process where TensorFlow has not started yet), and says so in its module; a
module whose examples are all marked so is reported as skipped, with that reason. Examples that
need data or a model export make a small one themselves (the whole file takes seconds).
"""
from __future__ import annotations

import doctest
import importlib
import os
from pathlib import Path

import pytest

import embedlab

_PKG = Path(embedlab.__file__).resolve().parent


def _modules_with_examples() -> list[str]:
    names = []
    for path in sorted(_PKG.rglob("*.py")):
        if path.name == "__main__.py":
            continue
        text = path.read_text(encoding="utf-8")
        if ">>>" not in text:
            continue
        parts = path.relative_to(_PKG.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules_with_examples()


def test_the_package_has_examples_to_run():
    assert len(MODULES) >= 20, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(name)
    assert module.__name__ == name and Path(module.__file__).resolve().is_relative_to(_PKG), module
    tests = [t for t in doctest.DocTestFinder().find(module, name) if t.examples]
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    for t in tests:
        runner.run(t, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(report)
    if result.attempted == 0:
        pytest.skip(f"{name}: every example is marked +SKIP (it needs a service, data or a process a test "
                    "run does not have)")
    print(f"{name}: {result.attempted} examples ran ({os.path.basename(module.__file__)})")

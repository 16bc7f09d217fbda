"""The notebooks as committed: no outputs, and metadata that JupyterLab does not rewrite on open.

JupyterLab sets a notebook's `kernelspec` and `language_info` from its kernel when the kernel
connects, and marks the notebook modified when they differ from the file's: a notebook with an
incomplete `language_info` asks to be saved although the learner changed nothing.
ci/normalize_notebooks.py puts notebooks in this form (`.venv/bin/python ci/normalize_notebooks.py`);
these tests fail when a tracked notebook is not in it, and check the script on notebooks of their own.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[3]
NORMALIZE = ROOT / "ci" / "normalize_notebooks.py"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
pytestmark = pytest.mark.skipif(not NORMALIZE.is_file() or not NOTEBOOKS,
                                reason="needs the repository checkout (ci/normalize_notebooks.py, notebooks/)")
FIX = f"run `.venv/bin/python ci/normalize_notebooks.py` in {ROOT}"


def _normalize_module():
    sys.path.insert(0, str(NORMALIZE.parent))
    try:
        import normalize_notebooks
    finally:
        sys.path.remove(str(NORMALIZE.parent))
    return normalize_notebooks


@pytest.fixture(scope="module")
def kernel():
    """The metadata that JupyterLab writes from ipykernel's python3 kernel of this interpreter."""
    return _normalize_module().kernel_metadata()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_tracked_notebook_has_no_outputs(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    dirty = [i + 1 for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} hold outputs or execution counts; {FIX}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_tracked_notebook_metadata_is_what_the_kernel_reports(path, kernel):
    meta = json.loads(path.read_text(encoding="utf-8"))["metadata"]
    assert meta.get("kernelspec") == kernel["kernelspec"], f"{path.name}: kernelspec {meta.get('kernelspec')}; {FIX}"
    info = meta.get("language_info", {})
    assert set(info) == set(kernel["language_info"]), (
        f"{path.name}: language_info has {sorted(info)}, the kernel reports {sorted(kernel['language_info'])}; {FIX}")
    # The Python version is the one of the interpreter that normalized it: the lab's working copies
    # get the lab's own (ci/lab_notebooks.py). Everything else is the kernel's.
    assert re.fullmatch(r"3\.\d+\.\d+", str(info["version"])), f"{path.name}: language_info.version {info['version']!r}"
    others = {k: v for k, v in info.items() if k != "version"}
    assert others == {k: v for k, v in kernel["language_info"].items() if k != "version"}, f"{path.name}; {FIX}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_tracked_notebook_is_in_normalized_form(path, kernel):
    """Byte for byte what the script writes (with the file's own Python version): no run-time cell
    metadata, nbformat's layout."""
    mod = _normalize_module()
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    meta = json.loads(json.dumps(kernel))
    meta["language_info"]["version"] = nb.metadata.get("language_info", {}).get("version")
    assert mod.notebook_text(mod.normalized(nb, meta)) == text, f"{path.name} is not in normalized form; {FIX}"


def _dirty_notebook(path):
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("print(6 * 7)", execution_count=4,
                                     outputs=[nbformat.v4.new_output("stream", name="stdout", text="42\n")])
    code.metadata["execution"] = {"iopub.status.busy": "2026-01-01T00:00:00Z"}
    code.metadata["tags"] = ["keep-me"]
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), code]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)


def test_normalize_strips_outputs_and_completes_metadata(tmp_path, kernel):
    path = tmp_path / "01_dirty.ipynb"
    _dirty_notebook(path)
    check = subprocess.run([sys.executable, str(NORMALIZE), "--check", str(path)], capture_output=True, text=True)
    assert check.returncode == 1 and f"not normalized: {path}" in check.stdout, check.stdout + check.stderr
    before = path.read_text()
    r = subprocess.run([sys.executable, str(NORMALIZE), str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert path.read_text() != before
    nb = nbformat.read(path, as_version=4)
    code = nb.cells[1]
    assert code.outputs == [] and code.execution_count is None
    assert "execution" not in code.metadata and code.metadata["tags"] == ["keep-me"]  # author metadata stays
    assert nb.cells[0].source == "# Title" and code.source == "print(6 * 7)"
    assert nb.metadata["language_info"] == kernel["language_info"]
    assert nb.metadata["kernelspec"] == kernel["kernelspec"]
    # Idempotent: a second run changes nothing (not even the file's time), and --check passes.
    mtime = path.stat().st_mtime_ns
    r = subprocess.run([sys.executable, str(NORMALIZE), str(path)], capture_output=True, text=True)
    assert r.returncode == 0 and "0 of 1" in r.stdout and path.stat().st_mtime_ns == mtime, r.stdout
    check = subprocess.run([sys.executable, str(NORMALIZE), "--check", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert not list(tmp_path.glob(".*.tmp")), "a temporary file was left behind"


def test_normalize_refuses_a_broken_notebook(tmp_path):
    path = tmp_path / "01_broken.ipynb"
    path.write_text("{not json")
    r = subprocess.run([sys.executable, str(NORMALIZE), str(path)], capture_output=True, text=True)
    assert r.returncode == 2 and str(path) in r.stderr, r.stdout + r.stderr
    assert path.read_text() == "{not json"

"""`make run` (ci/run_notebooks.py) as a user meets it when a notebook fails: the executed copy is still written,
with its error, the run stops with a non-zero exit before the next notebook, and the message names the notebook,
the cell and the error. Runs the real `make run` on two small notebooks (NOTEBOOKS and RUN_DIR overridden)."""
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(shutil.which("make") is None or not (ROOT / "ci" / "run_notebooks.py").is_file(),
                                reason="needs make and the repository checkout (ci/run_notebooks.py)")


def _notebook(path, cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(c) if c.startswith("#") else nbformat.v4.new_code_cell(c)
                for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def _make_run(notebooks, out):
    return subprocess.run(["make", "--no-print-directory", "run", f"NOTEBOOKS={' '.join(map(str, notebooks))}",
                           f"RUN_DIR={out}"], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_failing_notebook_is_written_with_its_error_and_stops_the_run(tmp_path):
    good, bad, never = tmp_path / "01_good.ipynb", tmp_path / "02_bad.ipynb", tmp_path / "03_never.ipynb"
    _notebook(good, ["# Good",  "x = 6 * 7", "print(x)"])
    _notebook(bad, ["# Setup", "total = 1", "## Check the total", "print('before')",
                    "assert total == 2, f'total is {total}'", "print('after')"])
    _notebook(never, ["print('should not run')"])
    out = tmp_path / "out"
    r = _make_run([good, bad, never], out)
    text = r.stdout + r.stderr
    assert r.returncode != 0, text
    assert "01_good" in text and "ok in" in text
    assert "02_bad.ipynb FAILED at cell 5 (code cell 3) in section 'Check the total'" in text, text
    assert "AssertionError" in text and "total is 1" in text
    assert f"{out}/02_bad.ipynb" in text
    assert not (out / "03_never.ipynb").exists()
    written = nbformat.read(out / "02_bad.ipynb", as_version=4)
    outputs = [c.get("outputs", []) for c in written.cells if c.cell_type == "code"]
    assert outputs[1][0]["text"] == "before\n"
    assert outputs[2][0]["output_type"] == "error" and outputs[2][0]["ename"] == "AssertionError"
    assert outputs[3] == [] and written.cells[-1].get("execution_count") is None
    assert nbformat.read(out / "01_good.ipynb", as_version=4).cells[2].outputs[0]["text"] == "42\n"
    assert not list(out.glob(".*.tmp")), "a temporary file was left behind"


def test_all_notebooks_passing_exits_zero(tmp_path):
    nb = tmp_path / "01_only.ipynb"
    _notebook(nb, ["import os; print(os.environ['EMBEDLAB_SCALE'])"])
    r = _make_run([nb], tmp_path / "out")
    assert r.returncode == 0, r.stdout + r.stderr
    written = nbformat.read(tmp_path / "out" / "01_only.ipynb", as_version=4)
    assert written.cells[0].outputs[0]["text"].strip() in {"ci", "small", "full"}

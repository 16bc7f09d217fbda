"""The lab's working copies (ci/lab_notebooks.py, run by `make lab` at each start) and its save guard.

A learner's saved copy is never overwritten without being kept; copies of an unchanged lesson stay
as the learner left them; a changed lesson replaces a copy; the copies carry the lab kernel's
metadata; a save into notebooks/ is refused with HTTP 403. The browser test (`make lab-test`) runs
all of it in a real lab.
"""
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "ci" / "lab_notebooks.py"
pytestmark = pytest.mark.skipif(not SCRIPT.is_file(), reason="needs the repository checkout (ci/lab_notebooks.py)")


@pytest.fixture(scope="module")
def lab():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import lab_notebooks
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return lab_notebooks


def _source(path, text):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(text)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)


def _saved_by_learner(copy):
    nb = nbformat.read(copy, as_version=4)
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="mine\n")]
    nb.cells[0].execution_count = 1
    nbformat.write(nb, copy)
    return copy.read_text()


def test_sync_copies_keeps_and_updates(tmp_path, lab):
    src_dir, dest = tmp_path / "notebooks", tmp_path / "build" / "lab"
    src_dir.mkdir()
    one, two = src_dir / "01_a.ipynb", src_dir / "02_b.ipynb"
    _source(one, "x = 1")
    _source(two, "y = 2")
    meta = {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
            "language_info": {"name": "python", "version": "3.11.7", "mimetype": "text/x-python"}}

    report = lab.sync([one, two], dest, metadata=meta, now="T1")
    assert [(n, w) for n, w, _ in report] == [("01_a.ipynb", "new copy"), ("02_b.ipynb", "new copy")]
    copy_one, copy_two = dest / "notebooks" / "01_a.ipynb", dest / "notebooks" / "02_b.ipynb"
    nb = nbformat.read(copy_one, as_version=4)
    assert nb.cells[0].source == "x = 1" and nb.metadata["language_info"] == meta["language_info"]
    assert "language_info" in one.read_text() and '"version"' not in one.read_text()  # the source is untouched

    # The learner saves 01 with outputs; the lessons do not change: both copies stay as they are.
    mine = _saved_by_learner(copy_one)
    report = lab.sync([one, two], dest, metadata=meta, now="T2")
    assert [(n, w) for n, w, _ in report] == [("01_a.ipynb", "your saved copy"), ("02_b.ipynb", "up to date")]
    assert copy_one.read_text() == mine

    # Both lessons change (a git pull): 02 was never saved and is replaced; 01 is replaced and the
    # learner's saved copy is kept under kept/.
    _source(one, "x = 10")
    _source(two, "y = 20")
    report = lab.sync([one, two], dest, metadata=meta, now="T3")
    assert [(n, w) for n, w, _ in report] == [("01_a.ipynb", "updated to the changed lesson"),
                                               ("02_b.ipynb", "updated to the changed lesson")]
    kept = report[0][2]
    assert kept == dest / "kept" / "01_a.T3.ipynb" and kept.read_text() == mine and report[1][2] is None
    assert nbformat.read(copy_one, as_version=4).cells[0].source == "x = 10"
    assert nbformat.read(copy_two, as_version=4).cells[0].source == "y = 20"
    assert sorted(p.name for p in (dest / "kept").iterdir()) == ["01_a.T3.ipynb"]

    # Another interpreter (a new Python version): unsaved copies get its metadata, saved ones stay.
    _saved_by_learner(copy_two)
    meta2 = json.loads(json.dumps(meta))
    meta2["language_info"]["version"] = "3.12.1"
    report = lab.sync([one, two], dest, metadata=meta2, now="T4")
    assert [(n, w) for n, w, _ in report] == [("01_a.ipynb", "kernel metadata refreshed"),
                                               ("02_b.ipynb", "your saved copy")]
    assert nbformat.read(copy_one, as_version=4).metadata["language_info"]["version"] == "3.12.1"
    assert nbformat.read(copy_two, as_version=4).metadata["language_info"]["version"] == "3.11.7"

    # A copy with no record (the record lost) that differs from its lesson is kept, never overwritten.
    (dest / "sources.json").unlink()
    before = copy_two.read_text()
    report = lab.sync([one, two], dest, metadata=meta2, now="T5")
    assert report[1][2] == dest / "kept" / "02_b.T5.ipynb" and report[1][2].read_text() == before
    assert not list(dest.rglob(".*.tmp")), "a temporary file was left behind"


def test_sync_refuses_a_corrupt_record(tmp_path, lab):
    src = tmp_path / "01_a.ipynb"
    _source(src, "x = 1")
    dest = tmp_path / "lab"
    dest.mkdir()
    (dest / "sources.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="sources.json"):
        lab.sync([src], dest, metadata={"kernelspec": {}, "language_info": {}})


def test_save_guard_refuses_notebooks_folder_only(lab):
    from tornado.web import HTTPError

    for path in ("notebooks/01_embedding_plugin.ipynb", "/notebooks/new.ipynb", "notebooks/sub/x.txt"):
        with pytest.raises(HTTPError) as e:
            lab.refuse_lesson_sources(model={}, path=path, contents_manager=None, working_dir="build/lab/notebooks")
        assert e.value.status_code == 403 and "build/lab/notebooks/" in e.value.log_message, path
    for path in ("build/lab/notebooks/01_embedding_plugin.ipynb", "notebooks", "scratch.ipynb", "docs/notebooks/x"):
        lab.refuse_lesson_sources(model={}, path=path, contents_manager=None)


def test_script_reports_what_it_did(tmp_path):
    dest = tmp_path / "lab"
    r = subprocess.run([sys.executable, str(SCRIPT), "--dest", str(dest)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    n = len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    assert f"working copies in {dest}/notebooks: {n} new copy" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, str(SCRIPT), "--dest", str(dest)], capture_output=True, text=True, cwd=ROOT)
    assert f"{n} up to date" in r.stdout, r.stdout

"""Put notebooks in the form they are committed in: no outputs, complete and stable metadata.

    python ci/normalize_notebooks.py                 # notebooks/NN_*.ipynb, rewritten in place
    python ci/normalize_notebooks.py --check         # exit 1 and name the notebooks that are not
    python ci/normalize_notebooks.py PATH.ipynb ...  # these notebooks instead

What it does to each notebook:
- code cells lose their outputs and execution counts, and the run-time cell metadata that
  JupyterLab records (`execution` timings, `ExecuteTime`);
- the notebook's `kernelspec` and `language_info` become exactly what JupyterLab writes into a
  notebook when its kernel (ipykernel's `python3`) connects: the kernel's spec and the
  `language_info` of its kernel_info reply. JupyterLab compares these with what the file holds and
  marks the notebook modified when they differ, so a notebook with an incomplete `language_info`
  asks to be saved although nothing was changed;
- the file is written in nbformat's own layout (what Jupyter writes on save), and only when its
  text changes.

`language_info["version"]` is the Python version of the interpreter that runs this script: run it
with the project's interpreter (`.venv/bin/python`). The lab's working copies
(ci/lab_notebooks.py) get the version of the lab's own interpreter.
"""
import argparse
import copy
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
KERNEL_NAME = "python3"
# Cell metadata written by a run, not by an author.
RUN_CELL_METADATA = ("execution", "ExecuteTime")


def kernel_metadata():
    """The notebook metadata that JupyterLab sets from ipykernel's `python3` kernel.

    Returns:
        dict with "kernelspec" (name, display_name, language) and "language_info" (ipykernel's
        kernel_info reply for this interpreter).

    Example:
        >>> kernel_metadata()["language_info"]["name"]
        'python'
    """
    from ipykernel.ipkernel import IPythonKernel
    from ipykernel.kernelspec import get_kernel_dict

    spec = get_kernel_dict()
    return {
        "kernelspec": {"name": KERNEL_NAME, "display_name": spec["display_name"], "language": spec["language"]},
        "language_info": copy.deepcopy(IPythonKernel.language_info),
    }


def normalized(nb, metadata=None):
    """A copy of notebook `nb` (an nbformat v4 NotebookNode) in its committed form.

    Args:
        nb: the notebook, as `nbformat.read(path, as_version=4)` returns it.
        metadata: the kernel metadata to set (default: `kernel_metadata()`).

    Returns:
        a new NotebookNode: code cells without outputs, execution counts or run-time metadata;
        `kernelspec` and `language_info` set from `metadata`.

    Example:
        >>> nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1", execution_count=3)])
        >>> normalized(nb).cells[0].execution_count is None
        True
    """
    out = copy.deepcopy(nb)
    metadata = kernel_metadata() if metadata is None else metadata
    for cell in out.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        for key in RUN_CELL_METADATA:
            cell.metadata.pop(key, None)
    out.metadata["kernelspec"] = nbformat.from_dict(copy.deepcopy(metadata["kernelspec"]))
    out.metadata["language_info"] = nbformat.from_dict(copy.deepcopy(metadata["language_info"]))
    return out


def notebook_text(nb):
    """The file text nbformat writes for `nb` (the layout of a Jupyter save, newline-terminated)."""
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def normalize_file(path, check=False, metadata=None):
    """Normalizes the notebook file `path` in place (unless `check`).

    Args:
        path: an .ipynb file.
        check: only report; the file is never written.
        metadata: the kernel metadata to set (default: `kernel_metadata()`).

    Returns:
        True when the file was (or, with check, would be) changed.

    Raises:
        ValueError: `path` is not a readable, valid notebook (the message names it).

    Example:
        >>> normalize_file(Path("notebooks/01_embedding_plugin.ipynb"), check=True)  # doctest: +SKIP
        False
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
    except (OSError, ValueError, nbformat.ValidationError) as e:
        raise ValueError(f"{path}: not a readable nbformat-4 notebook: {e}") from None
    new = notebook_text(normalized(nb, metadata))
    if new == text:
        return False
    if not check:
        # A temporary name in the same folder, renamed into place: never a half-written notebook.
        tmp = path.with_name(f".{path.name}.normalize.tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(path)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path,
                    help="notebooks to normalize (default: notebooks/NN_*.ipynb of this checkout)")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when a notebook is not normalized")
    args = ap.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        ap.error(f"no notebooks given and none in {ROOT / 'notebooks'}")
    for p in paths:
        if p.suffix != ".ipynb" or not p.is_file():
            ap.error(f"{p} is not an .ipynb file")
    metadata = kernel_metadata()
    changed = []
    for p in paths:
        try:
            if normalize_file(p, check=args.check, metadata=metadata):
                changed.append(p)
        except ValueError as e:
            print(f"normalize_notebooks: {e}", file=sys.stderr)
            return 2
    verb = "not normalized" if args.check else "normalized"
    for p in changed:
        print(f"{verb}: {p}")
    print(f"normalize_notebooks: {len(changed)} of {len(paths)} notebooks {verb} "
          f"(kernel {metadata['kernelspec']['name']}, Python {metadata['language_info']['version']})")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())

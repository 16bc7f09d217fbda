"""Execute notebooks in order for `make run`, writing each executed copy (with its figures) to an output folder.

A notebook that fails is still written, with its outputs up to and including the error, so the learner can open
it; the run then stops with exit status 1 and names the notebook, the cell (its number and the heading above it)
and the error. Each copy is written to a temporary name and renamed into place: no half-written notebook is left.
The kernel process's own output (its start-up warnings, a crash) goes to NAME.kernel.log in the log folder
(--log-dir, default: `logs/<output folder's name>` beside the output folder, build/logs/notebooks for `make run`),
so that the output folder holds only notebooks (a learner opens it in the lab).

    python ci/run_notebooks.py --output-dir build/notebooks notebooks/01_*.ipynb ...
"""
import argparse
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from embedlab._io import atomic_file
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _write_atomic(nb, path: Path) -> None:
    with atomic_file(path) as tmp:
        nbformat.write(nb, str(tmp))


def _heading_above(cells, index: int) -> str:
    """The last markdown heading at or before cell `index`, to say where in the lesson a cell is."""
    for cell in reversed(cells[: index + 1]):
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.lstrip().startswith("#"):
                    return line.lstrip("# ").strip()
    return "(no heading above it)"


def _failed_cell(nb):
    """(index, cell) of the first code cell with an error output, else the first cell that never ran."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return i, cell
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and cell.source.strip() and cell.get("execution_count") is None:
            return i, cell
    return None, None


def default_log_dir(out_dir: Path) -> Path:
    """Where the kernels' logs of a run into `out_dir` go: build/notebooks -> build/logs/notebooks."""
    out_dir = Path(out_dir)
    return out_dir.parent / "logs" / out_dir.name


def run_one(path: Path, out_dir: Path, timeout: int, log_dir: Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    # The kernel process's own messages (its start-up warnings, a crash) go to a log in the log folder, not into
    # the run's output; what the cells print is in the notebook.
    log = log_dir / f"{path.stem}.kernel.log"
    error = None
    with open(log, "w") as kernel_log:
        try:
            client.execute(stderr=kernel_log, stdout=kernel_log)
        except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
            error = e
    out = out_dir / path.name
    _write_atomic(nb, out)
    if error is None:
        return True
    index, cell = _failed_cell(nb)
    where = "an unknown cell"
    if index is not None:
        code_number = sum(1 for c in nb.cells[: index + 1] if c.cell_type == "code")
        first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
        where = (f"cell {index + 1} (code cell {code_number}) in section '{_heading_above(nb.cells, index)}', "
                 f"starting: {first[:100]}")
    outputs = cell.get("outputs", []) if cell is not None else []
    err = next((o for o in outputs if o.get("output_type") == "error"), None)
    if err is not None:
        detail = _ANSI.sub("", "\n".join(err.get("traceback", [])) or f"{err['ename']}: {err['evalue']}")
    else:
        detail = f"{type(error).__name__}: {error}"
    print(f"\n== {path} FAILED at {where}", flush=True)
    print("\n".join(detail.strip().splitlines()[-25:]), flush=True)
    print(f"== the executed notebook, with its error, is {out} (the kernel's own log: {log})", flush=True)
    return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--output-dir", type=Path, default=Path("build/notebooks"))
    ap.add_argument("--log-dir", type=Path, default=None,
                    help="folder for the kernels' logs (default: logs/<output folder's name> beside the output folder)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds one cell may run (default 3600)")
    args = ap.parse_args(argv)
    log_dir = args.log_dir or default_log_dir(args.output_dir)
    if log_dir.resolve() == args.output_dir.resolve():
        ap.error(f"--log-dir {log_dir} is the output folder: the logs are kept apart from the notebooks")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    scale = os.environ.get("EMBEDLAB_SCALE", "small")
    print(f"== executing {len(args.notebooks)} notebooks (EMBEDLAB_SCALE={scale}) into {args.output_dir}/", flush=True)
    total = time.monotonic()
    for path in args.notebooks:
        t0 = time.monotonic()
        print(f"   {path.stem:<36} ", end="", flush=True)
        ok = run_one(path, args.output_dir, args.timeout, log_dir)
        if not ok:
            print(f"   {path.stem}: FAILED after {time.monotonic() - t0:.0f} s; later notebooks were not run", flush=True)
            return 1
        print(f"ok in {time.monotonic() - t0:.0f} s", flush=True)
    print(f"Executed notebooks (with their figures) are in {args.output_dir}/ ({time.monotonic() - total:.0f} s in all); "
          f"the kernels' logs in {log_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Runs HugeCTR's own SparseOperationKit tests and examples against embedlab.sok.

    python ci/hugectr_compat.py --repo /path/to/HugeCTR              # a git clone (or bare mirror)
    python ci/hugectr_compat.py --repo R --suite function -k dump_load --timeout 300
    python ci/hugectr_compat.py --repo R --list                         # what would run, and the edits
    python ci/hugectr_compat.py --checkout /path/to/HugeCTR/work/tree   # one version, the files as they are

Suites (from the repository's tags, read with `git show`, nothing checked out):

* `function`: `sparse_operation_kit/.../test/function_test/tf2/**.py` at every tag from v23.02.00
  to v25.03.00 (`--tags`); a file identical at several tags (same git blob) runs once, labelled
  with the tags that hold it.
* `examples`: `sparse_operation_kit/sparse_operation_kit/experiment/examples/**.py` at v23.09.00.
* `unit`: the commands of `sparse_operation_kit/unit_test/test_scripts/tf2/script.sh` at v23.09.00
  (SOK's first-generation API), each run in a copy of that folder.

Each test is copied into a fresh temporary folder and changed by exactly the substitutions in
`SUBSTITUTIONS` (imports -> embedlab.sok, SOK's module paths such as
`sparse_operation_kit.embeddings.tf_distributed_embedding` -> the same path under
embedlab.sok.compat (the compatibility wing), `horovod.tensorflow` -> `embedlab.sok.compat.horovod`,
GPU sizes -> CPU sizes; every one applied is
printed with its file and line, so anyone can audit that no assertion was touched), then run with
`python -m embedlab.sok.launch -n N` in place of `horovodrun -np N` / `mpiexec -np N` (N =
`--workers`, 2 by default; how each function test is started follows the tag's run_*.sh: `python
x.py` runs as one plain process, `-np 1` as one worker, `-np ${task_num}` with `--workers`; a file
no script names runs as one process). A
`pip` that refuses comes first on the tests' PATH: some of the scripts pip-install what they
miss (cupy, horovod). The result is a table: test, tags, PASS / FAIL / TIMEOUT and
the last error line, and for the unit suite why the test is expected to fail here
(`UNIT_EXPECTED`: none of it can pass on a CPU; a result that differs is reported); `--json`
writes it, `--logs` keeps every test's output.

This is not part of CI: CI has no HugeCTR copy (fetch one with
`git clone https://github.com/NVIDIA-Merlin/HugeCTR`). Run it with the project's virtualenv
(`.venv/bin/python ci/hugectr_compat.py ...`) after `make setup`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOK = "sparse_operation_kit"
FUNCTION_RE = re.compile(r"^sparse_operation_kit/sparse_operation_kit/(experiment/)?test/function_test/tf2/(.+\.py)$")
EXAMPLES_RE = re.compile(r"^sparse_operation_kit/sparse_operation_kit/experiment/examples/(.+\.py)$")
UNIT_DIR = "sparse_operation_kit/unit_test/test_scripts/tf2/"
# what the unit scripts import through relative sys.path entries (prepare_dataset.py, the mpi/hvd tests)
UNIT_EXTRA = "sparse_operation_kit/documents/tutorials/DenseDemo/"
UNIT_EXTRA_FILES = ("sparse_operation_kit/documents/tutorials/utility.py",)
DEFAULT_TAGS = "v23.02.00..v25.03.00"
ONE_TAG = "v23.09.00"

# (pattern, replacement, why). Patterns match whole lines (re.M) or script.sh arguments; they
# name imports, the launcher and sizes only. Assertions and the code between are never edited.
SUBSTITUTIONS = [
    # imports
    (r"^(\s*)import sparse_operation_kit as sok\s*$", r"\1import embedlab.sok as sok", "import"),
    (r"^(\s*)from sparse_operation_kit import experiment as sok\s*$", r"\1import embedlab.sok as sok", "import"),
    (r"^(\s*)import sparse_operation_kit\.experiment as sok\s*$", r"\1import embedlab.sok as sok", "import"),
    # SOK's first-generation module paths (HugeCTR's DenseDemo models.py imports
    # sparse_operation_kit.embeddings.tf_distributed_embedding): the same paths in embedlab.sok's
    # compatibility wing, embedlab.sok.compat
    (r"^(\s*)from sparse_operation_kit\.((?:embeddings|core|optimizers|saver)(?:\.\w+)*) import (.+)$",
     r"\1from embedlab.sok.compat.\2 import \3", "import"),
    (r"^(\s*)import horovod\.tensorflow as hvd\s*$", r"\1import embedlab.sok.compat.horovod as hvd",
     "import (horovod shim)"),
    # GPU sizes -> CPU sizes (2 cores): fewer steps, smaller batches and tables
    (r"^(\s*)iters = 100\s*$", r"\1iters = 10", "CPU size"),
    (r"^(\s*)batch_size = 8192\s*$", r"\1batch_size = 1024", "CPU size"),
    (r"^(\s*)batch_size = 65536\s*$", r"\1batch_size = 4096", "CPU size"),
    (r"^(\s*)rows = \[65536 \* 10, 65536\]\s*$", r"\1rows = [8192 * 10, 8192]", "CPU size"),
    (r"^(\s*)row = 65536 \* 10\s*$", r"\1row = 8192 * 10", "CPU size"),
    (r"^(\s*)rows = \[65536\] \* gpu_num\s*$", r"\1rows = [8192] * gpu_num", "CPU size"),
    (r"^(\s*)rows = \[819200 \* 5 \* 10, 8192\]\s*$", r"\1rows = [8192 * 5 * 10, 8192]", "CPU size"),
    (r"^(\s*)rows = \[8192 \* 2048, 8192 \* 8192\]\s*$", r"\1rows = [8192 * 2, 8192 * 8]", "CPU size"),
    (r"^(\s*)vocab_size = 1023 \* 1024 \* 2\s*$", r"\1vocab_size = 1023 * 16 * 2", "CPU size"),
    (r"^(\s*)(init|max)_capacity=1024 \* 1024,\s*$", r"\1\2_capacity=1024 * 64,", "CPU size"),
    (r"^(\s*)for i in range\(100\):\s*$", r"\1for i in range(10):", "CPU size (steps)"),
    (r"^(\s*)batch = 8192\s*$", r"\1batch = 1024", "CPU size"),
    (r"init_capacity=1024 \* 512, max_capacity=1024 \* 512", "init_capacity=1024 * 256, max_capacity=1024 * 256",
     "CPU size"),
]
# script.sh arguments of the unit suite (GPU sizes -> CPU sizes)
ARG_SUBSTITUTIONS = [
    (r"^--iter_num=\d+$", "--iter_num=10", "CPU size"),
    (r"^--global_batch_size=65536$", "--global_batch_size=1024", "CPU size"),
    (r"^--gpu_num=\d+$", "--gpu_num=1", "one CPU device per process"),
    (r"^--local_gpu_num=\d+$", "--local_gpu_num=1", "one CPU device per process"),
]


# The unit suite's expected results here (v23.09.00) and why, read from the tests' code and
# checked by running them: script -> why it fails first. No test of this suite can pass on a CPU
# with the substitutions above. `expected_unit` adds what fails next, seen in a diagnostic run
# whose data were made with NumPy instead of CUDA (an edit of HugeCTR's utils.py that this runner
# does not make). The table prints the expectation beside each result and counts the results that
# differ from it; it changes nothing in how a test runs.
_CUDA_DATA = ("CUDA: HugeCTR's utils.py makes the data (generate_random_samples) and sorts the dumped table "
              "(sort_embedding_variables_by_key) with CUDA C kernels through cupy.RawKernel; no NumPy-backed "
              "cupy can run them, so this is not an import swap")
# an embedlab.sok defect: its Keras variable's dtype is a string, autocast to float16 under the
# policy, and lookup_sparse's float32 check fails while writing its own message
_MIXED = ("embedlab.sok's first-generation layers under the mixed_float16 policy: AttributeError "
          "'str' object has no attribute 'name' from lookup_sparse's dtype check (an embedlab.sok defect)")
UNIT_EXPECTED = {
    "test_all_gather_dispatcher.py": "imports sok_unit_test_lib: SOK's compiled test ops over its internal GPU "
                                     "dispatchers (libsok_unit_test.so); nothing here corresponds to them",
    "test_csr_conversion_distributed.py": "imports sok_unit_test_lib (as test_all_gather_dispatcher.py)",
    "test_reduce_scatter_dispatcher.py": "imports sok_unit_test_lib (as test_all_gather_dispatcher.py)",
    "test_sparse_emb_demo_model_single_worker.py": _CUDA_DATA,
    "test_sparse_emb_demo_model_multi_worker.py": _CUDA_DATA,
    "test_dense_emb_demo_model_single_worker.py": _CUDA_DATA,
    "test_dense_emb_demo_model_multi_worker.py": _CUDA_DATA,
    "prepare_dataset.py": _CUDA_DATA + " (with NumPy data it passes)",
    "test_multi_dense_emb_demo_model_mpi.py": "an MPI job: reads OMPI_COMM_WORLD_SIZE / _RANK (set by mpiexec, not by "
                                              "the launcher) and barriers through mpi4py; and prepare_dataset.py's data",
    "test_multi_dense_emb_demo_model_mpi_use_tf_set_device.py": "an MPI job (as test_multi_dense_emb_demo_model_mpi.py); "
                                                                "then it indexes the list of GPUs",
    "test_multi_dense_emb_demo_model_hvd.py": "no data: prepare_dataset.py's data_<rank>.file (made with CUDA)",
    "test_multi_dense_emb_demo_model_hvd_use_tf_set_device.py": "GPU only: tf.config.set_visible_devices("
                                                                "gpus[hvd.local_rank()], 'GPU') indexes the list of "
                                                                "GPUs (IndexError without one)",
}


def expected_unit(case) -> str:
    """Why this unit test fails here: UNIT_EXPECTED, then what fails next with NumPy data."""
    script = Path(case.script).name
    why = UNIT_EXPECTED.get(script)
    if why is None:
        return ""
    args = set(case.args)
    nxt = ""
    if script.startswith(("test_sparse_emb", "test_dense_emb")):
        if "--restore_params=1" in args:
            nxt = "the table files a save run writes (those runs fail)"
        elif "--optimizer=plugin_adam" in args:
            nxt = "sok.optimizers.Adam, SOK's compiled GPU Adam (not provided)"
        elif "--functional_api=1" in args:
            nxt = "tf.keras.Input(type_spec=...) (Keras 2 only)"
        elif "--mixed_precision=1" in args:
            nxt = _MIXED
        else:
            nxt = ("the dumped table's check: utils.sort_embedding_variables_by_key, a CUDA C kernel through "
                   "cupy.RawKernel (after reading embedding_variable.values[0].m_var_name's files)")
    elif script == "test_multi_dense_emb_demo_model_hvd.py":
        nxt = (_MIXED if "--mixed_precision=1" in args else "dense_opt.variables() (Keras 2: a Keras 3 optimizer's "
                                                     "variables is a list)")
    return why + (f"; next, with NumPy data: {nxt}" if nxt else "")


@dataclasses.dataclass
class Case:
    suite: str
    name: str                  # path inside the suite
    tags: list                 # tags holding this version
    files: dict                # relative path -> text (everything copied into the folder)
    script: str                # the file to run
    args: list = dataclasses.field(default_factory=list)
    workers: int | None = None  # None: --workers; 0: a plain `python x.py`, no launcher; n: launch -n n
    note: str = ""
    edits: list = dataclasses.field(default_factory=list)
    result: str = ""
    reason: str = ""
    seconds: float = 0.0

    @property
    def label(self):
        return f"{self.suite}/{self.name}" + (f" {' '.join(self.args)}" if self.args else "")


def _git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _tags(repo, spec):
    all_tags = sorted((t for t in _git(repo, "tag").split() if re.fullmatch(r"v\d+\.\d+\.\d+", t)),
                      key=lambda t: tuple(int(x) for x in t[1:].split(".")))
    if ".." in spec:
        lo, hi = spec.split("..")
        key = lambda t: tuple(int(x) for x in t[1:].split("."))  # noqa: E731
        out = [t for t in all_tags if key(lo) <= key(t) <= key(hi)]
    else:
        out = [t for t in spec.split(",") if t]
    missing = [t for t in out if t not in all_tags]
    if missing or not out:
        raise SystemExit(f"hugectr_compat: tags {missing or spec} not in {repo} (it has {', '.join(all_tags)})")
    return out


def _tree(repo, tag):
    """[(blob sha, path)] of a tag."""
    rows = []
    for line in _git(repo, "ls-tree", "-r", tag).splitlines():
        meta, path = line.split("\t", 1)
        _, kind, sha = meta.split()
        if kind == "blob":
            rows.append((sha, path))
    return rows


def _blob(repo, sha) -> str:
    return _git(repo, "cat-file", "-p", sha)


def _span(tags, order):
    """'v23.02.00..v23.08.00 (5 tags)' or the list when not consecutive."""
    idx = sorted(order.index(t) for t in tags)
    if idx == list(range(idx[0], idx[-1] + 1)) and len(idx) > 2:
        return f"{order[idx[0]]}..{order[idx[-1]]}"
    return ",".join(order[i] for i in idx)


RUN_SCRIPT_RE = re.compile(r"^sparse_operation_kit/sparse_operation_kit/(experiment/)?test/function_test/run_[^/]*\.sh$")


def _run_modes(repo, tag, tree):
    """{'lookup/x.py': (commented out, workers)} from the tag's function_test/run_*.sh."""
    return _modes_of([_blob(repo, sha) for sha, path in tree if RUN_SCRIPT_RE.match(path)])


def _modes_of(scripts):
    """From run scripts: `python x.py` -> 0 (a plain process, no launcher), `horovodrun -np 1`
    -> 1, `horovodrun -np ${task_num}` -> None (--workers)."""
    modes = {}
    for text in scripts:
        cwd = ""
        for line in text.splitlines():
            line = line.strip()
            commented = line.startswith("#")
            line = line.lstrip("#").strip()
            m = re.match(r"^cd\s+(\S+)", line)
            if m and m.group(1) not in ("tf1", "tf2", ".."):
                cwd = m.group(1)
                continue
            m = re.search(r"(?:horovodrun\s+-np\s+(\S+)\s+)?python3?\s+(\S+\.py)", line)
            if m and cwd:
                np_ = m.group(1)
                mode = 0 if np_ is None else (1 if np_ == "1" else None)
                modes.setdefault(f"{cwd}/{m.group(2)}", []).append((commented, mode))
    # a live line wins over a commented-out one
    return {k: sorted(v, key=lambda x: x[0])[0] for k, v in modes.items()}


def discover_function(repo, tags):
    versions = {}   # sha -> Case
    for tag in tags:
        tree = _tree(repo, tag)
        modes = _run_modes(repo, tag, tree)
        for sha, path in tree:
            m = FUNCTION_RE.match(path)
            if not m:
                continue
            rel = m.group(2)
            c = versions.get(sha)
            if c is None:
                c = versions[sha] = Case("function", rel, [tag], {Path(rel).name: _blob(repo, sha)}, Path(rel).name)
                if rel in modes:
                    commented, c.workers = modes[rel]
                    if commented:
                        c.note = f"commented out in {tag}'s run scripts"
                else:   # one process, as their task_num's default, through the launcher if it uses Horovod
                    c.workers = 1 if "hvd.init()" in c.files[c.script] else 0
                    c.note = f"not in {tag}'s run scripts"
            else:
                c.tags.append(tag)
    return sorted(versions.values(), key=lambda c: (c.name, tags.index(c.tags[0])))


def discover_examples(repo, tag):
    seen = {}
    for sha, path in _tree(repo, tag):
        m = EXAMPLES_RE.match(path)
        if not m:
            continue
        if sha in seen:                   # examples/examples/ holds copies of the same files
            seen[sha].name += f" (= {m.group(1)})"
            continue
        text = _blob(repo, sha)
        # run with --workers when it joins a Horovod job, else as one plain process
        seen[sha] = Case("examples", m.group(1), [tag], {Path(path).name: text}, Path(path).name,
                         workers=None if "hvd.init()" in text else 0)
    return sorted(seen.values(), key=lambda c: c.name)


def _script_commands(text):
    """The commands of script.sh, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\s*\n", " ", text)
    cmds = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        toks = shlex.split(line)
        if "python3" in toks or "python" in toks:
            cmds.append(toks)
    return cmds


def discover_unit(repo, tag):
    """script.sh's commands; the files keep HugeCTR's layout (paths relative to the repository
    root: the scripts reach sibling folders through relative sys.path entries)."""
    files = {}
    for sha, path in _tree(repo, tag):
        rest = path[len(UNIT_DIR):]
        if (path.startswith(UNIT_DIR) and "/" not in rest) or path in UNIT_EXTRA_FILES or \
                (path.startswith(UNIT_EXTRA) and path.endswith(".py") and "/" not in path[len(UNIT_EXTRA):]):
            files[path] = _blob(repo, sha)
    cases = []
    for toks in _script_commands(files.get(UNIT_DIR + "script.sh", "")):
        i = toks.index("python3") if "python3" in toks else toks.index("python")
        launcher, script, args = toks[:i], toks[i + 1], toks[i + 2:]
        if script.startswith("-c") or not script.endswith(".py"):
            continue
        multi = any(t in ("horovodrun", "mpiexec", "mpirun") for t in launcher)
        cases.append(Case("unit", script, [tag], files, UNIT_DIR + script, list(args), None if multi else 0))
    return cases


def discover_checkout(tree: Path):
    cases = []
    base = tree / SOK / SOK
    for sub in ("test/function_test", "experiment/test/function_test"):
        modes = _modes_of([f.read_text() for f in sorted((base / sub).glob("run_*.sh"))])
        for p in sorted((base / sub / "tf2").rglob("*.py")):
            rel = str(p.relative_to(base / sub / "tf2"))
            c = Case("function", rel, ["checkout"], {p.name: p.read_text()}, p.name)
            if rel in modes:
                commented, c.workers = modes[rel]
                c.note = "commented out in its run scripts" if commented else ""
            else:
                c.workers = 1 if "hvd.init()" in c.files[c.script] else 0
                c.note = "not in its run scripts"
            cases.append(c)
    if not cases:
        raise SystemExit(f"hugectr_compat: no function tests under {base}")
    return cases


def substitute(case):
    """Applies SUBSTITUTIONS to every .py file of the case; records each edit."""
    for fname, text in list(case.files.items()):
        if not fname.endswith(".py"):
            continue
        lines = text.splitlines(keepends=True)
        for n, line in enumerate(lines):
            body = line.rstrip("\n")
            for pat, rep, why in SUBSTITUTIONS:
                new = re.sub(pat, rep, body)
                if new != body:
                    case.edits.append((fname, n + 1, body.strip(), new.strip(), why))
                    body = new
            lines[n] = body + ("\n" if line.endswith("\n") else "")
        case.files[fname] = "".join(lines)
    args = []
    for a in case.args:
        new = a
        for pat, rep, why in ARG_SUBSTITUTIONS:
            if re.match(pat, new):
                case.edits.append(("script.sh", 0, a, rep, why))
                new = rep
        args.append(new)
    case.args = args


# Some of HugeCTR's scripts `os.system("pip install ...")` what they miss (cupy-cuda*, horovod):
# a `pip` / `pip3` first on their PATH refuses, so a test run never changes the environment.
_PIP_GUARD = """#!/bin/sh
echo "hugectr_compat: refused: pip $* (a test may not install packages)" >&2
exit 1
"""


def _guarded_env(bin_dir: Path) -> dict:
    for name in ("pip", "pip3"):
        f = bin_dir / name
        f.write_text(_PIP_GUARD)
        f.chmod(0o755)
    return dict(os.environ, PYTHONUNBUFFERED="1", PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


def run_case(case, workers, timeout, python, logs: Path | None, index: int, shared: Path | None = None):
    """Runs one case in a fresh temporary folder, or in `shared` (the unit suite: script.sh's
    commands share their folder, e.g. prepare_dataset.py's data and saved parameters)."""
    with tempfile.TemporaryDirectory(prefix="hugectr_compat_") as tmp, \
            tempfile.TemporaryDirectory(prefix="hugectr_compat_bin_") as bin_dir:
        where = Path(shared or tmp)
        for fname, text in case.files.items():
            (where / fname).parent.mkdir(parents=True, exist_ok=True)
            (where / fname).write_text(text)
        cwd = where / Path(case.script).parent
        cmd = _command(case, workers, timeout, python)
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout + 30,
                               env=_guarded_env(Path(bin_dir)))
            out, code = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out, code = (e.stdout or "") + (e.stderr or ""), None
            out = out.decode() if isinstance(out, bytes) else out
        case.seconds = time.monotonic() - t0
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{case.suite}_{case.name}_{case.tags[0]}")
        (logs / f"{index + 1:03d}_{safe}.log").write_text(f"$ {' '.join(cmd)}\n{out}")
    # A few scripts start their workers with multiprocessing and exit 0 whatever became of them:
    # a traceback anywhere in the output is a failure.
    crashed = re.search(r"^(\[rank \d+\] )?Traceback \(most recent call last\):", out, re.M)
    if code == 0 and not crashed:
        case.result = "PASS"
    elif code == 0:
        case.result, case.reason = "FAIL", "exit 0, but a traceback in its output: " + _reason(out)
    elif code is None or code == 3 and "job timeout" in out:
        case.result, case.reason = "TIMEOUT", f"over {timeout:g} s"
    else:
        case.result = "FAIL"
        case.reason = _reason(out)


def _command(case, workers, timeout, python):
    script = Path(case.script).name          # run from its own folder
    if case.workers == 0:
        return [python, script, *case.args]
    n = workers if case.workers is None else case.workers
    return [python, "-m", "embedlab.sok.launch", "-n", str(n), "--timeout", str(timeout), script, *case.args]


def _how(case, workers):
    if case.workers == 0:
        return "python (one process, no launcher)"
    return f"launch -n {workers if case.workers is None else case.workers}"


def _reason(out: str) -> str:
    """The error line that explains a failure (the last exception line of any rank)."""
    pat = re.compile(r"^(\[rank \d+\] )?(\w+(\.\w+)*(Error|Exception|Exit)\b.*|AssertionError.*)$")
    lines = [ln.strip() for ln in out.splitlines()]
    hits = [ln for ln in lines if pat.match(ln.replace("    ", "").strip())]
    if hits:
        return re.sub(r"^\[rank \d+\] ", "", hits[-1])[:300]
    tail = [ln for ln in lines if ln]
    return (tail[-1] if tail else "no output")[:300]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--repo", help="a HugeCTR git clone or bare mirror (its tags are read)")
    src.add_argument("--checkout", help="a HugeCTR work tree: its function tests as they are")
    ap.add_argument("--suite", default="function,examples,unit", help="function, examples, unit (comma-separated)")
    ap.add_argument("--tags", default=DEFAULT_TAGS, help=f"function suite tags: A..B or a list (default {DEFAULT_TAGS})")
    ap.add_argument("--tag", default=ONE_TAG, help=f"examples and unit suite tag (default {ONE_TAG})")
    ap.add_argument("-k", dest="pattern", help="only tests whose label contains this")
    ap.add_argument("--workers", type=int, default=2, help="workers per multi-process test (default 2)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per test (default 600)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter with embedlab installed")
    ap.add_argument("--list", action="store_true", help="print the tests and their edits; run nothing")
    ap.add_argument("--logs", help="folder for every test's output")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)

    suites = [s.strip() for s in a.suite.split(",") if s.strip()]
    bad = [s for s in suites if s not in ("function", "examples", "unit")]
    if bad:
        ap.error(f"unknown suite(s) {bad}")
    cases = []
    if a.checkout:
        cases = discover_checkout(Path(a.checkout))
        order = ["checkout"]
    else:
        repo = Path(a.repo)
        if not (repo / ".git").exists() and not (repo / "HEAD").exists():
            ap.error(f"{repo} is not a git repository")
        order = _tags(repo, a.tags)
        if "function" in suites:
            cases += discover_function(repo, order)
        if "examples" in suites:
            cases += discover_examples(repo, a.tag)
        if "unit" in suites:
            cases += discover_unit(repo, a.tag)
        order = sorted(set(order) | {a.tag}, key=lambda t: tuple(int(x) for x in t[1:].split(".")))
    if a.pattern:
        cases = [c for c in cases if a.pattern in c.label]
    if not cases:
        raise SystemExit("hugectr_compat: no tests matched")

    for c in cases:
        substitute(c)
    print(f"{len(cases)} tests. Substitutions (file:line  old  ->  new  [why]):")
    for c in cases:
        print(f"== {c.label}  [{_span(c.tags, order)}]  run: {_how(c, a.workers)}{'  (' + c.note + ')' if c.note else ''}")
        for f, n, old, new, why in c.edits:
            print(f"   {f}:{n}  {old}  ->  {new}  [{why}]")
    if a.list:
        return 0

    logs = Path(a.logs) if a.logs else None
    with tempfile.TemporaryDirectory(prefix="hugectr_compat_unit_") as unit_dir:
        for i, c in enumerate(cases):
            print(f"[{i + 1}/{len(cases)}] {c.label} [{_span(c.tags, order)}] ...", end=" ", flush=True)
            run_case(c, a.workers, a.timeout, a.python, logs, i, Path(unit_dir) if c.suite == "unit" else None)
            print(f"{c.result} ({c.seconds:.0f} s){' ' + c.reason if c.reason else ''}", flush=True)

    print("\n| test | tags | run | result | reason | expected here |\n|---|---|---|---|---|---|")
    unexpected = []
    for c in cases:
        how = "python" if c.workers == 0 else f"-n {a.workers if c.workers is None else c.workers}"
        expect = expected_unit(c) if c.suite == "unit" else ""
        if expect and c.result != "FAIL":
            unexpected.append(c)
        print(f"| {c.label} | {_span(c.tags, order)} | {how} | {c.result} | {c.reason.replace('|', '/')} | "
              f"{('FAIL: ' + expect) if expect else ''} |")
    counts = {r: sum(c.result == r for c in cases) for r in ("PASS", "FAIL", "TIMEOUT")}
    print(f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['TIMEOUT']} timed out, of {len(cases)}")
    if unexpected:
        print(f"{len(unexpected)} unit test(s) expected to fail did not (UNIT_EXPECTED is out of date): "
              + ", ".join(c.label for c in unexpected))
    if a.json:
        Path(a.json).write_text(json.dumps([{"suite": c.suite, "test": c.name, "args": c.args, "tags": c.tags,
                                             "run": _how(c, a.workers), "note": c.note, "result": c.result, "reason": c.reason,
                                             "expected": expected_unit(c) if c.suite == "unit" else "", "seconds": round(c.seconds, 1),
                                             "edits": c.edits} for c in cases], indent=1))
    return 0 if counts["PASS"] == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Runs Keras-RS's own embedding tests against embedlab.keras_rs.

    python ci/keras_rs_compat.py --repo /path/to/keras-rs            # a git clone or bare mirror (tag v0.4.0)
    python ci/keras_rs_compat.py --checkout /path/to/keras-rs/tree    # a work tree, the files as they are
    python ci/keras_rs_compat.py --repo R -k correctness --json out.json

The files (read with `git show <tag>:<path>` from a repository, or from a work tree; nothing is
fetched, nothing checked out): `keras_rs/src/layers/embedding/distributed_embedding_test.py`,
`keras_rs/src/layers/embedding/embed_reduce_test.py`, and the test helpers they import that the
`keras-rs` wheel does not ship (`keras_rs/src/testing/`). Each test file is copied into a
temporary folder and changed by exactly the substitutions in `SUBSTITUTIONS` (the import of
`DistributedEmbedding`'s module, and of `EmbedReduce`, become embedlab.keras_rs's); each one
applied is printed with its file and line. The helpers are made importable as
`keras_rs.src.testing` by a `conftest.py` that appends their folder to `keras_rs.src.__path__`.
Then pytest runs them with `KERAS_BACKEND=tensorflow` on the CPU (`CUDA_VISIBLE_DEVICES=`).
`--variant model` runs the same tests with `optimizer_in_backward=False` (Keras-RS's CPU
behaviour: trainable tables trained by the model's optimizer) instead of the default.

The result is a table, one line per test: PASS / FAIL / SKIP, and for a failure listed in
`EXPECTED` why it does not pass here; a failure not listed is reported as such and makes the exit
status 1. Run it with the project's virtualenv after `make setup` (keras-rs is pinned in
requirements.txt).

Results at v0.4.0 (TensorFlow backend, CPU), 102 tests:

* `--variant model`: 89 passed, 0 failed, 13 skipped.
* default (fused table optimizers): 83 passed, 6 failed (expected), 13 skipped. The 6 are
  `test_basics_{dense,ragged,sparse}_{auto,default_device}`: they assert Keras-RS's
  `default_device` contract (the two tables are the layer's trainable variables, for the model's
  optimizer); with the optimizers fused into the backward (SparseCore's contract, where the test
  does not assert it) the tables are not trainable. They pass in `--variant model`.
* The 13 skips are Keras-RS's own on TensorFlow: `test_correctness_*_{ragged,sparse}_2d*_jit`
  (12: "TODO compilable ragged on TensorFlow", "TF SparseTensor ops are not jit compilable") and
  `test_mixed_placement` ("requires a TPU").
* The 12 `test_correctness_*_dense_*_jit` tests (jit_compile=True) pass through the layer's XLA
  path (`embedlab.keras_rs.xla`); with Keras-RS's two TensorFlow skips removed from the test file
  by hand, the 12 skipped ragged and sparse jit tests pass too.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TAG = "v0.4.0"
EMB = "keras_rs/src/layers/embedding/"
TEST_FILES = (EMB + "distributed_embedding_test.py", EMB + "embed_reduce_test.py")
HELPER_FILES = ("keras_rs/src/testing/__init__.py", "keras_rs/src/testing/test_case.py")

# (file name, exact line, replacement): the only edits made to the tests.
SUBSTITUTIONS = {
    "default": [
        ("distributed_embedding_test.py", "from keras_rs.src.layers.embedding import distributed_embedding",
         "import embedlab.keras_rs as distributed_embedding"),
        ("embed_reduce_test.py", "from keras_rs.src.layers.embedding.embed_reduce import EmbedReduce",
         "from embedlab.keras_rs import EmbedReduce"),
    ],
    "model": [
        ("distributed_embedding_test.py", "from keras_rs.src.layers.embedding import distributed_embedding",
         "import model_optimizer_variant as distributed_embedding"),
        ("embed_reduce_test.py", "from keras_rs.src.layers.embedding.embed_reduce import EmbedReduce",
         "from embedlab.keras_rs import EmbedReduce"),
    ],
}

# Per variant, the tests that fail by design, by name pattern, and why.
EXPECTED = {
    "default": [
        (re.compile(r"test_basics_(dense|ragged|sparse)_(auto|default_device)$"),
         "asserts layer.trainable_variables == the 2 tables (Keras-RS's default_device behaviour); with the "
         "tables' optimizers fused into the backward (the default, as on SparseCore, where Keras-RS skips this "
         "assertion) the tables are not trainable and the one trainable variable is bp_trigger; passes with "
         "--variant model"),
    ],
    "model": [],
}

# The --variant model module, written beside the tests: the layer with optimizer_in_backward=False.
VARIANT = '''\
import keras
import embedlab.keras_rs


@keras.saving.register_keras_serializable(package="embedlab_compat_variant")
class DistributedEmbedding(embedlab.keras_rs.DistributedEmbedding):
    def __init__(self, *args, optimizer_in_backward=False, **kwargs):
        super().__init__(*args, optimizer_in_backward=optimizer_in_backward, **kwargs)
'''

CONFTEST = '''\
import os
import keras_rs.src
# The test helpers the keras-rs wheel does not ship, read from the Keras-RS checkout.
keras_rs.src.__path__.append(os.path.join(os.path.dirname(__file__), "_ext", "keras_rs", "src"))
'''


def _read(repo, checkout, tag, path) -> str:
    if checkout:
        return (Path(checkout) / path).read_text()
    git_dir = Path(repo)
    return subprocess.run(["git", "-C", str(git_dir), "show", f"{tag}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def prepare(repo, checkout, tag, variant, dest: Path) -> list:
    """Writes the edited tests, the helpers and the conftest into dest; returns the edits made."""
    edits = []
    for path in HELPER_FILES:
        out = dest / "_ext" / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(_read(repo, checkout, tag, path))
    for path in TEST_FILES:
        name = Path(path).name
        lines = _read(repo, checkout, tag, path).split("\n")
        for fname, old, new in SUBSTITUTIONS[variant]:
            if fname != name:
                continue
            hits = [i for i, line in enumerate(lines) if line.strip() == old]
            if len(hits) != 1:
                raise SystemExit(f"keras_rs_compat: expected the line {old!r} once in {path}, found it {len(hits)} times")
            i = hits[0]
            indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
            lines[i] = indent + new
            edits.append(f"{name}:{i + 1}: {old!r} -> {new!r}")
        (dest / name).write_text("\n".join(lines))
    (dest / "conftest.py").write_text(CONFTEST)
    if variant == "model":
        (dest / "model_optimizer_variant.py").write_text(VARIANT)
    return edits


def run(dest: Path, pattern, timeout) -> list:
    """pytest over the prepared folder; [(test, outcome, message)]."""
    xml = dest / "results.xml"
    env = dict(os.environ, KERAS_BACKEND="tensorflow", CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([str(ROOT / "helpers")] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
           "distributed_embedding_test.py", "embed_reduce_test.py"]
    if pattern:
        cmd += ["-k", pattern]
    proc = subprocess.run(cmd, cwd=dest, env=env, timeout=timeout, capture_output=True, text=True)
    if not xml.exists():
        sys.stdout.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit("keras_rs_compat: pytest wrote no results")
    results = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}.{case.get('name')}"
        outcome, msg = "PASS", ""
        for tag in ("failure", "error"):
            el = case.find(tag)
            if el is not None:
                outcome = "FAIL"
                text = (el.get("message") or el.text or "").strip().splitlines()
                msg = text[0][:160] if text else ""
        el = case.find("skipped")
        if el is not None:
            outcome, msg = "SKIP", (el.get("message") or "")[:160]
        results.append((name, outcome, msg))
    return results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--repo", help="a keras-rs git clone or bare mirror (the tag is read with git show)")
    src.add_argument("--checkout", help="a keras-rs work tree: its files as they are")
    ap.add_argument("--tag", default=DEFAULT_TAG, help=f"the tag to read from --repo (default {DEFAULT_TAG})")
    ap.add_argument("--variant", choices=sorted(SUBSTITUTIONS), default="default",
                    help="default: fused table optimizers; model: optimizer_in_backward=False")
    ap.add_argument("-k", dest="pattern", help="pytest -k expression")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds for the whole pytest run")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    expected = EXPECTED[args.variant]
    with tempfile.TemporaryDirectory(prefix="keras_rs_compat_") as tmp:
        dest = Path(tmp)
        for e in prepare(args.repo, args.checkout, args.tag, args.variant, dest):
            print("edit", e)
        results = run(dest, args.pattern, args.timeout)
    rows, unexpected = [], 0
    for name, outcome, msg in results:
        why = ""
        if outcome == "FAIL":
            why = next((w for rx, w in expected if rx.search(name)), "")
            unexpected += not why
        rows.append({"test": name, "outcome": outcome, "message": msg, "expected_because": why})
    width = max((len(r["test"]) for r in rows), default=10)
    for r in rows:
        note = f"  [expected: {r['expected_because'][:90]}]" if r["expected_because"] else ""
        print(f"{r['test']:<{width}}  {r['outcome']:<4}  {r['message'][:100]}{note}")
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("PASS", "FAIL", "SKIP")}
    print(f"\n{counts['PASS']} passed, {counts['FAIL']} failed ({counts['FAIL'] - unexpected} expected, "
          f"{unexpected} unexpected), {counts['SKIP']} skipped; variant {args.variant}")
    if args.json:
        Path(args.json).write_text(json.dumps({"variant": args.variant, "tag": args.tag, "results": rows}, indent=1))
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())

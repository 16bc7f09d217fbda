"""A script that trains a Session exits with status 0 when its work is done.

The data readers decode files and translate keys in background threads, inside compiled code with
the GIL released. A daemon thread still in there when Python finalizes ends by unwinding through
C++ frames as it takes the GIL back, and the process aborts (`terminate called without an active
exception`, exit status 134) after the script's last line. The readers' threads are stopped and
joined at exit (reader.py); these scripts run as users run theirs, each in its own interpreter."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).parent

# Pins a reader thread inside the compiled decoder at exit: the decoder is wrapped so that it
# decodes again and again until the reader is told to stop. Without the stop at exit the thread is
# in compiled code (GIL released) whenever finalization begins, and the process aborts.
PINNED = textwrap.dedent("""
    import sys, threading
    sys.path.insert(0, {here!r})
    import numpy as np
    from sessionlib import dump, wdl_json, write_lists
    import embedlab
    from embedlab.session import Session, solver_parser_helper

    lists, keysets, ev = write_lists({data!r}, np.random.default_rng(0), [(1, 2), (4, 1)], n_lists=1,
                                     files_per_list=1, per_file=4000, vocab=30)
    sess = Session(solver_parser_helper(batchsize=32, batchsize_eval=32), dump({data!r} + "/m.json",
                   wdl_json(capacity=400)), False)
    reader = sess.get_data_reader_train()
    core = embedlab.core()
    real, inside = core.decode_norm, threading.Event()

    def decode_until_stopped(*args):
        inside.set()
        while True:
            out = real(*args)
            if reader._stop.is_set():
                return out

    core.decode_norm = decode_until_stopped
    reader.set_file_list_source(lists[0])
    assert inside.wait(60)
    print("work done", flush=True)
""")

# HugeCTR's W&D loop as a user writes it: oversubscription pass by pass, evaluation, model
# download, a second Session resumed from the downloaded files; the script ends right after an
# evaluation, whose reader then reads the evaluation list (one file of 150,000 samples, as an
# evaluation list holds) ahead in the background.
HUGECTR_LOOP = textwrap.dedent("""
    import sys
    sys.path.insert(0, {here!r})
    import numpy as np
    from sessionlib import dump, wdl_json, write_lists
    from embedlab.session import Session, solver_parser_helper

    lists, keysets, _ = write_lists({data!r}, np.random.default_rng(1), [(1, 2), (4, 1)], n_lists=2,
                                    files_per_list=1, per_file=20000, vocab=30)
    _, _, ev = write_lists({data!r} + "/eval", np.random.default_rng(2), [(1, 2), (4, 1)], n_lists=0,
                           per_file=150000, vocab=30)
    js = dump({data!r} + "/m.json", wdl_json(capacity=400))
    solver = solver_parser_helper(batchsize=2048, batchsize_eval=2048, max_eval_batches=1)
    sess = Session(solver, js, True, {data!r} + "/store")
    sess.get_data_reader_eval().set_file_list_source(ev)
    it = 0
    for fl, ks in zip(lists, keysets):
        sess.get_data_reader_train().set_file_list_source(fl)
        sess.get_model_oversubscriber().update(ks)
        while sess.train():
            it += 1
            if it % 4 == 0:
                sess.evaluation()
    paths = sess.download_params_to_files({data!r} + "/wdl", it)
    resumed = Session(solver_parser_helper(batchsize=2048, batchsize_eval=2048, max_eval_batches=1,
                                           model_file=paths[0], embedding_files=paths[1:]), js, False)
    resumed.get_data_reader_train().set_file_list_source(lists[0])
    resumed.get_data_reader_eval().set_file_list_source(ev)
    resumed.train()
    auc = resumed.evaluation()[0][1]
    assert 0 <= auc <= 1
    print("work done", it, flush=True)
""")


def _run(code, tmp_path, name):
    data = tmp_path / name
    data.mkdir()
    script = tmp_path / f"{name}.py"
    script.write_text(code.format(here=str(HERE), data=str(data)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONFAULTHANDLER="1")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)


def _check(p):
    assert "work done" in p.stdout, p.stderr[-3000:]
    how = f"killed by signal {-p.returncode}" if p.returncode < 0 else f"exit status {p.returncode}"
    assert p.returncode == 0, f"{how} after the work was done:\n{p.stderr[-3000:]}"
    assert "terminate called" not in p.stderr, p.stderr[-3000:]


@pytest.mark.parametrize("run", range(2))
def test_reader_thread_inside_compiled_code_at_exit(tmp_path, run):
    _check(_run(PINNED, tmp_path, "pinned"))


def test_hugectr_training_script_exits_0_every_run(tmp_path):
    for run in range(2):
        _check(_run(HUGECTR_LOOP, tmp_path, f"run{run}"))

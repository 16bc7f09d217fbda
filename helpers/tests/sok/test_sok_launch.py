"""The launcher without TensorFlow: its command line imports no TensorFlow, a failure names the
rank that failed first (by exit time, with its exit code or signal) and what became of the
others, and the workers' TensorFlow start-up banner is dropped. The workers here are plain
Python scripts (they read EMBEDLAB_SOK_RANK), so each job takes a fraction of a second."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from embedlab.sok import launch


def _run_cli(*args, env=None, timeout=60):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=e, timeout=timeout)


def _imported_modules(importtime_stderr: str) -> set:
    """Module names from `python -X importtime` output ("import time: self | cumulative | name")."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


@pytest.mark.parametrize("args", [["--help"], ["-n", "0", "train.py"], ["-n", "2"],
                                  ["--hosts", "node1,node2", "--port", "2222"]])
def test_command_line_imports_no_tensorflow(args):
    # -X importtime lists every module the real command imports, whatever ran before it
    p = _run_cli("-X", "importtime", "-m", "embedlab.sok.launch", *args)
    mods = _imported_modules(p.stderr)
    assert "embedlab.sok" in mods, p.stderr[-2000:]       # (the -m module itself runs as __main__)
    heavy = sorted(m for m in mods if m.split(".")[0] in ("tensorflow", "keras", "numpy"))
    assert not heavy, f"python -m embedlab.sok.launch {' '.join(args)} imported {heavy[:5]}"
    if args == ["--help"]:
        assert p.returncode == 0 and "usage: python -m embedlab.sok.launch" in p.stdout
    elif args[0] == "--hosts":
        assert p.returncode == 0 and p.stdout.count("export TF_CONFIG=") == 2
    else:
        assert p.returncode == 2 and "error:" in p.stderr


def test_importing_embedlab_sok_imports_no_tensorflow_until_a_name_is_used():
    code = textwrap.dedent("""
        import sys
        import embedlab.sok as sok
        print("tensorflow" in sys.modules)
        sok.Variable
        print("tensorflow" in sys.modules, sok.dump.__module__, callable(sok.load))
    """)
    p = _run_cli("-c", code)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["False", "True", "embedlab.sok.checkpoint", "True"], p.stdout


# A worker program driven by the environment: SCRIPT_<rank> is what that rank does.
WORKER = textwrap.dedent("""
    import os, signal, sys, time
    rank = int(os.environ["EMBEDLAB_SOK_RANK"])
    what = os.environ.get(f"SCRIPT_{rank}", "ok")
    print(f"started, log level {os.environ.get('TF_CPP_MIN_LOG_LEVEL')}", flush=True)
    if what.startswith("sleep"):
        time.sleep(float(what.split(":")[1]))
    elif what.startswith("exit"):
        _, after, code = what.split(":")
        time.sleep(float(after))
        sys.exit(int(code))
    elif what.startswith("kill"):
        time.sleep(float(what.split(":")[1]))
        os.kill(os.getpid(), signal.SIGKILL)
    elif what.startswith("timeout"):
        time.sleep(float(what.split(":")[1]))
        print("tensorflow.python.framework.errors_impl.DeadlineExceededError: Collective has timed out "
              "during execution. [Op:CollectiveGatherV2]", file=sys.stderr, flush=True)
        sys.exit(1)
    elif what == "banner":
        print("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR", file=sys.stderr)
        print("I0000 00:00:1.0  1 port.cc:153] oneDNN custom operations are on. You may see slightly different "
              "numerical results", file=sys.stderr)
        print("a line of my own", file=sys.stderr, flush=True)
""")


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return str(path)


def _job(worker, capfd, n=2, collective_timeout=5.0, grace=3.0, **scripts):
    env = dict(os.environ, **scripts)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    code = launch.run_local(n, [sys.executable, worker], timeout=60, collective_timeout=collective_timeout, env=env,
                            grace=grace)
    out, err = capfd.readouterr()
    return code, out, err


def test_survivor_is_not_blamed_when_a_rank_exits_with_an_error(worker, capfd):
    code, out, err = _job(worker, capfd, grace=0.5, SCRIPT_0="sleep:30", SCRIPT_1="exit:0.3:7")
    assert code == 7
    assert "rank 1 failed first: it exited with code 7" in err, err
    assert "rank 0 was still running and was ended by the launcher" in err, err
    assert "hung" not in err and "never joined" not in err, err


def test_rank_killed_by_a_signal_is_named_and_the_peer_that_failed_after_it_comes_second(worker, capfd):
    # rank 1 dies first; rank 0 fails later (within the grace period): rank 1 is named first although 0 < 1
    code, out, err = _job(worker, capfd, SCRIPT_0="exit:2.0:1", SCRIPT_1="kill:0.3")
    assert code == 128 + 9
    assert "rank 1 failed first: it was killed by SIGKILL; then rank 0 exited with code 1" in err, err
    assert "still running" not in err, err


def test_collective_timeout_names_the_rank_that_never_joined(worker, capfd):
    code, out, err = _job(worker, capfd, grace=0.5, SCRIPT_0="timeout:0.3", SCRIPT_1="sleep:30")
    assert code == 1
    assert ("rank 0 failed first: it exited with code 1 after waiting 5 s for its peers in a collective; rank 1, "
            "still running, never joined that collective (hung?)") in err, err
    assert "Collective has timed out" in err.split("last error output of rank 0:")[1]


def test_three_ranks_first_failure_by_time_not_by_rank(worker, capfd):
    code, out, err = _job(worker, capfd, n=3, SCRIPT_0="sleep:30", SCRIPT_1="exit:2.0:4", SCRIPT_2="exit:0.3:5")
    assert code == 5
    assert ("embedlab.sok.launch: rank 2 failed first: it exited with code 5; then rank 1 exited with code 4; "
            "rank 0 was still running and was ended by the launcher") in err, err


def test_workers_are_quiet_and_their_own_output_passes(worker, capfd):
    code, out, err = _job(worker, capfd, SCRIPT_0="banner", SCRIPT_1="ok")
    assert code == 0, err
    assert "[rank 0] a line of my own" in err
    assert "oneDNN" not in err and "absl::InitializeLog" not in err, err
    # TF_CPP_MIN_LOG_LEVEL defaults to 2 in the workers (C++ INFO and WARNING logs off) ...
    assert "[rank 0] started, log level 2" in out and "[rank 1] started, log level 2" in out, out


def test_a_log_level_the_user_sets_is_kept(worker, capfd):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
    assert launch.run_local(1, [sys.executable, worker], timeout=60, env=env) == 0
    out, _ = capfd.readouterr()
    assert "[rank 0] started, log level 0" in out, out


def test_failure_report_wording():
    assert launch.failure_report((1, -9), [], [0]) == (
        "embedlab.sok.launch: rank 1 failed first: it was killed by SIGKILL; rank 0 was still running and was "
        "ended by the launcher")
    assert launch.failure_report((2, 3), [(0, 1)], [1, 3], True, 60.0) == (
        "embedlab.sok.launch: rank 2 failed first: it exited with code 3 after waiting 60 s for its peers in a "
        "collective; then rank 0 exited with code 1; ranks 1, 3, still running, never joined that collective "
        "(hung?) and were ended by the launcher")

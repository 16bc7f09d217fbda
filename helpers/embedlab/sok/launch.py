"""Starts N local worker processes for `tf.distribute.MultiWorkerMirroredStrategy`: our `horovodrun -np N`.

    python -m embedlab.sok.launch -n 2 train.py --epochs 3
    python -m embedlab.sok.launch -n 2 --timeout 600 --collective-timeout 60 train.py
    python -m embedlab.sok.launch -n 2 -m embedlab.tutorials.sok_demo --data rows.tsv  # a module
    python -m embedlab.sok.launch --hosts node1,node2 --port 12345             # print TF_CONFIGs
    python -m embedlab.sok.launch --hosts node1,node2 --port 12345 --index 1 train.py   # run rank 1 here

Local mode (`-n N`): picks N free ports on 127.0.0.1, starts `python script.py args` N times
with `TF_CONFIG` set for rank 0..N-1 (plus `EMBEDLAB_SOK_RANK`, `EMBEDLAB_SOK_WORLD_SIZE`,
`EMBEDLAB_SOK_TIMEOUT`), and prefixes every line of their output with `[rank r]`.

* Quiet workers: `TF_CPP_MIN_LOG_LEVEL` is 2 in their environment unless it is set (TensorFlow's
  C++ INFO and WARNING logs off), and the start-up banner that TensorFlow prints before its
  logging can be configured ("oneDNN custom operations are on", see `embedlab.import_tensorflow`)
  is dropped from their error output. Every other line passes through.
* When a worker fails (non-zero exit or killed by a signal), the launcher ends the others
  (SIGTERM, then SIGKILL after a grace period, each by its process id) and exits non-zero. It
  names the rank that failed first, with its exit code or signal, says what became of the others
  (failed after it, or still running and ended), and repeats the end of its error output.
* Workers give up on a collective after `--collective-timeout` seconds (`embedlab.sok` reads
  it), so a worker that hangs or dies never leaves the others waiting forever. When the first
  failure is such a timeout, the ranks still running are the ones that never joined the
  collective, and the launcher says so.
* `--timeout` bounds the whole job: past it every worker is ended and the ranks still running
  are named.

The launcher itself imports no TensorFlow (`--help` and argument errors are immediate).

Several machines (`--hosts h1,h2,...`): without a script it prints the `TF_CONFIG` of each
host (export it there and start the script, one process per host); with `--index i` and a
script it runs rank i on this machine with that `TF_CONFIG` (start the same command with
every index, one per host). The ports must be reachable between the hosts; TensorFlow's
collectives use gRPC without authentication, so keep them on a private network.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque

EXIT_MISSING = 3      # our exit code when a worker is missing (timeout or collective failure)

# What a worker's error output says when one of its collectives timed out (TensorFlow's message).
_COLLECTIVE_TIMEOUT = ("Collective has timed out", "DeadlineExceededError")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct free TCP ports on host (bound together, then released)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def tf_config(workers: list[str], index: int) -> str:
    """The TF_CONFIG of worker `index` in a cluster of `workers` ("host:port" each)."""
    return json.dumps({"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": index}})


class _Worker:
    def __init__(self, rank, proc):
        self.rank, self.proc = rank, proc
        self.tail = deque(maxlen=25)      # last lines of stderr, repeated in the failure report
        self.threads = []
        self.ended_at = None              # time.monotonic() when the process ended (set by _wait)

    def wait_in_background(self):
        def wait():
            self.proc.wait()
            self.ended_at = time.monotonic()
        t = threading.Thread(target=wait, daemon=True)
        t.start()
        self.threads.append(t)


def _pump(stream, out, prefix, tail, lock, drop=None):
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        if drop is not None and drop(line):
            continue
        if tail is not None:
            tail.append(line)
        with lock:
            out.write(f"{prefix}{line}\n")
            out.flush()
    stream.close()


def _end(workers, grace=3.0):
    """SIGTERM every still-running worker's process group, then SIGKILL what is left."""
    alive = [w for w in workers if w.proc.poll() is None]
    for w in alive:
        try:
            os.killpg(w.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for w in alive:
        try:
            w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(w.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            w.proc.wait()


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _is_banner(line: str) -> bool:
    """A line of TensorFlow's start-up banner (the lines `embedlab.import_tensorflow` drops)."""
    from .._tfstart import _BANNER
    return any(b in line for b in _BANNER)


def _ranks(rs) -> str:
    rs = list(rs)
    return f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"


def failure_report(first, later, still, timed_out_in_collective=False, collective_timeout=None) -> str:
    """The launcher's one-line verdict on a failed job.

    Args:
        first: (rank, exit code) of the worker that failed first (a negative code: its signal).
        later: [(rank, exit code)] of the workers that failed after it, in order.
        still: ranks still running when the launcher ended them.
        timed_out_in_collective: the first failure was a collective timing out (its error output
            says so): then the ranks still running are the ones that never joined.
    """
    rank, code = first
    msg = f"embedlab.sok.launch: rank {rank} failed first: it {_describe(code)}"
    if timed_out_in_collective:
        waited = f" {collective_timeout:g} s" if collective_timeout is not None else ""
        msg += f" after waiting{waited} for its peers in a collective"
    for r, c in later:
        msg += f"; then rank {r} {_describe(c)}"
    if still:
        verb = "were" if len(still) > 1 else "was"
        if timed_out_in_collective:
            msg += (f"; {_ranks(still)}, still running, never joined that collective (hung?) and {verb} ended "
                    f"by the launcher")
        else:
            msg += f"; {_ranks(still)} {verb} still running and {verb} ended by the launcher"
    return msg


def run_local(n: int, cmd: list[str], timeout: float | None = None, collective_timeout: float = 60.0,
              env: dict | None = None, out=None, poll: float = 0.05, grace: float = 2.0) -> int:
    """Runs `cmd` as n local workers; returns 0 or the first failing worker's exit code (128 +
    signal for a signal; EXIT_MISSING for a job timeout). What happened is printed to stderr
    (see `failure_report`)."""
    out = out or sys.stdout
    ports = free_ports(n)
    hosts = [f"127.0.0.1:{p}" for p in ports]
    lock = threading.Lock()
    workers: list[_Worker] = []
    base = dict(os.environ if env is None else env)
    base["PYTHONUNBUFFERED"] = "1"
    base.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    started = time.monotonic()

    def join_output():
        for w in workers:
            for t in w.threads:
                t.join(timeout=2)

    try:
        for r in range(n):
            e = dict(base, TF_CONFIG=tf_config(hosts, r), EMBEDLAB_SOK_RANK=str(r),
                     EMBEDLAB_SOK_WORLD_SIZE=str(n), EMBEDLAB_SOK_TIMEOUT=str(collective_timeout))
            p = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
            w = _Worker(r, p)
            for stream, dest, tail, drop in ((p.stdout, out, None, None), (p.stderr, sys.stderr, w.tail, _is_banner)):
                t = threading.Thread(target=_pump, args=(stream, dest, f"[rank {r}] ", tail, lock, drop), daemon=True)
                t.start()
                w.threads.append(t)
            w.wait_in_background()
            workers.append(w)

        while True:
            ended = sorted((w for w in workers if w.ended_at is not None), key=lambda w: w.ended_at)
            failed = [w for w in ended if w.proc.returncode != 0]
            if failed:
                first = failed[0]
                # Give the others a moment: a worker whose peer vanished often fails on its own
                # soon after (its collective is aborted); the report lists it after the first.
                t_end = time.monotonic() + grace
                while time.monotonic() < t_end and any(w.ended_at is None for w in workers):
                    time.sleep(poll)
                still = [w.rank for w in workers if w.ended_at is None]
                _end(workers)
                join_output()
                later = sorted((w for w in workers if w is not first and w.ended_at is not None
                                and w.proc.returncode != 0 and w.rank not in still), key=lambda w: w.ended_at)
                timed_out = any(m in line for line in first.tail for m in _COLLECTIVE_TIMEOUT)
                msg = failure_report((first.rank, first.proc.returncode), [(w.rank, w.proc.returncode) for w in later],
                                     still, timed_out, collective_timeout)
                tail = "\n".join(f"    {line}" for line in first.tail if line.strip())
                sys.stderr.write(msg + (f"\nlast error output of rank {first.rank}:\n{tail}\n" if tail else "\n"))
                sys.stderr.flush()
                code = first.proc.returncode
                return code if code > 0 else 128 - code
            if len(ended) == n:
                join_output()
                return 0
            if timeout is not None and time.monotonic() - started > timeout:
                still = [w.rank for w in workers if w.ended_at is None]
                _end(workers)
                sys.stderr.write(f"embedlab.sok.launch: job timeout after {timeout:g} s; {_ranks(still)} still "
                                 f"running {'were' if len(still) > 1 else 'was'} ended\n")
                return EXIT_MISSING
            time.sleep(poll)
    finally:
        _end(workers)


_VALUED = {"-n", "--num-workers", "--timeout", "--collective-timeout", "--hosts", "--port", "--index"}


def _split_argv(argv):
    """(launcher options, target, target args): everything after `-m MODULE` or the script
    belongs to the worker program, whatever it looks like."""
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "-m":
            if i + 1 >= len(argv):
                return argv[:i] + ["-m"], None, []
            return argv[:i], ["-m", argv[i + 1]], argv[i + 2:]
        if tok.startswith("-"):
            i += 2 if tok in _VALUED else 1
            continue
        return argv[:i], [tok], argv[i + 1:]
    return argv, None, []


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    opts, target, rest = _split_argv(argv)
    ap = argparse.ArgumentParser(prog="python -m embedlab.sok.launch", description=__doc__.split("\n\n")[0],
                                 usage="python -m embedlab.sok.launch [options] (script.py | -m module) [args...]",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--num-workers", type=int, help="local worker processes to start")
    ap.add_argument("--timeout", type=float, default=None, help="end the whole job after this many seconds")
    ap.add_argument("--collective-timeout", type=float, default=60.0,
                    help="seconds a worker waits for its peers in one collective (default 60)")
    ap.add_argument("--hosts", help="comma-separated host names of a multi-machine job")
    ap.add_argument("--port", type=int, default=12345, help="port on every host in --hosts mode")
    ap.add_argument("--index", type=int, help="rank to run on this machine in --hosts mode")
    a = ap.parse_args(opts)
    target = target or []
    a.args = rest
    a.script = target[0] if target and target[0] != "-m" else None

    if a.hosts:
        hosts = [h.strip() for h in a.hosts.split(",") if h.strip()]
        workers = [h if ":" in h else f"{h}:{a.port}" for h in hosts]
        if not target or a.index is None:
            for i, h in enumerate(hosts):
                print(f"# on {h}:\nexport TF_CONFIG='{tf_config(workers, i)}'")
            return 0
        if not 0 <= a.index < len(workers):
            ap.error(f"--index {a.index} is outside 0..{len(workers) - 1}")
        env = dict(os.environ, TF_CONFIG=tf_config(workers, a.index), EMBEDLAB_SOK_RANK=str(a.index),
                   EMBEDLAB_SOK_WORLD_SIZE=str(len(workers)), EMBEDLAB_SOK_TIMEOUT=str(a.collective_timeout))
        return subprocess.call([sys.executable, *target, *a.args], env=env)

    if not a.num_workers or a.num_workers < 1:
        ap.error("give -n N (N >= 1) or --hosts")
    if not target:
        ap.error("give the script to run (or -m MODULE)")
    if a.script is not None and not os.path.exists(a.script):
        ap.error(f"script {a.script!r} not found")
    return run_local(a.num_workers, [sys.executable, *target, *a.args], timeout=a.timeout,
                     collective_timeout=a.collective_timeout)


if __name__ == "__main__":
    sys.exit(main())

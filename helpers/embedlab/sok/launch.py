"""Starts N local worker processes for `tf.distribute.MultiWorkerMirroredStrategy`: our `horovodrun -np N`.

    python -m embedlab.sok.launch -n 2 train.py --epochs 3
    python -m embedlab.sok.launch -n 2 --timeout 600 --collective-timeout 60 train.py
    python -m embedlab.sok.launch -n 2 -m embedlab.sok.demo --data rows.tsv      # a module
    python -m embedlab.sok.launch --hosts node1,node2 --port 12345             # print TF_CONFIGs
    python -m embedlab.sok.launch --hosts node1,node2 --port 12345 --index 1 train.py   # run rank 1 here

Local mode (`-n N`): picks N free ports on 127.0.0.1, starts `python script.py args` N times
with `TF_CONFIG` set for rank 0..N-1 (plus `EMBEDLAB_SOK_RANK`, `EMBEDLAB_SOK_WORLD_SIZE`,
`EMBEDLAB_SOK_TIMEOUT`), and prefixes every line of their output with `[rank r]`.

* When one worker fails (non-zero exit or killed by a signal), the launcher ends the others
  (SIGTERM, then SIGKILL after a grace period, each by its process id) and exits non-zero,
  naming that rank and repeating the end of its error output.
* Workers give up on a collective after `--collective-timeout` seconds (`embedlab.sok` reads
  it), so a worker that hangs or dies never leaves the others waiting forever. When a worker
  fails on a collective while another is still running, the launcher names the one still
  running as the missing rank.
* `--timeout` bounds the whole job: past it every worker is ended and the ranks still running
  are named.

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


def _pump(stream, out, prefix, tail, lock):
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
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


def run_local(n: int, cmd: list[str], timeout: float | None = None, collective_timeout: float = 60.0,
              env: dict | None = None, out=None, poll: float = 0.1, grace: float = 2.0) -> int:
    """Runs `cmd` as n local workers; returns 0 or the failing worker's exit code (EXIT_MISSING
    for a job timeout). What happened is printed to stderr."""
    out = out or sys.stdout
    ports = free_ports(n)
    hosts = [f"127.0.0.1:{p}" for p in ports]
    lock = threading.Lock()
    workers: list[_Worker] = []
    base = dict(os.environ if env is None else env)
    base["PYTHONUNBUFFERED"] = "1"
    started = time.monotonic()
    try:
        for r in range(n):
            e = dict(base, TF_CONFIG=tf_config(hosts, r), EMBEDLAB_SOK_RANK=str(r),
                     EMBEDLAB_SOK_WORLD_SIZE=str(n), EMBEDLAB_SOK_TIMEOUT=str(collective_timeout))
            p = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
            w = _Worker(r, p)
            for stream, dest, tail in ((p.stdout, out, None), (p.stderr, sys.stderr, w.tail)):
                t = threading.Thread(target=_pump, args=(stream, dest, f"[rank {r}] ", tail, lock), daemon=True)
                t.start()
                w.threads.append(t)
            workers.append(w)

        while True:
            codes = [w.proc.poll() for w in workers]
            failed = [w for w, c in zip(workers, codes) if c not in (None, 0)]
            if failed:
                first = failed[0]
                code = first.proc.returncode
                # Give the others a moment: a worker whose peer vanished fails on its own soon;
                # one that is still running then is the missing (hung) one.
                t_end = time.monotonic() + grace
                while time.monotonic() < t_end and any(w.proc.poll() is None for w in workers):
                    time.sleep(poll)
                still = [w.rank for w in workers if w.proc.poll() is None]
                _end(workers)
                for w in workers:
                    for t in w.threads:
                        t.join(timeout=2)
                msg = f"embedlab.sok.launch: rank {first.rank} {_describe(code)}"
                if still:
                    msg += (f"; rank{'s' if len(still) > 1 else ''} {', '.join(map(str, still))} "
                            f"{'were' if len(still) > 1 else 'was'} still running (missing from the collective: hung?) "
                            f"and {'were' if len(still) > 1 else 'was'} ended")
                others = [w.rank for w in failed if w is not first]
                if others:
                    msg += f"; rank(s) {', '.join(map(str, others))} failed too"
                tail = "\n".join(f"    {line}" for line in first.tail if line.strip())
                sys.stderr.write(msg + (f"\nlast error output of rank {first.rank}:\n{tail}\n" if tail else "\n"))
                sys.stderr.flush()
                return code if code > 0 else 128 - code
            if all(c == 0 for c in codes):
                for w in workers:
                    for t in w.threads:
                        t.join(timeout=2)
                return 0
            if timeout is not None and time.monotonic() - started > timeout:
                still = [w.rank for w, c in zip(workers, codes) if c is None]
                _end(workers)
                sys.stderr.write(f"embedlab.sok.launch: job timeout after {timeout:g} s; rank(s) "
                                 f"{', '.join(map(str, still))} still running were ended\n")
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

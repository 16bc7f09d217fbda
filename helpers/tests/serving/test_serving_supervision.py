"""`python -m embedlab.serving` under faults, real tritonserver and redis-server: SIGKILLed, it
leaves no server behind (tritonserver, its python stubs, redis-server) and starts again on the
same ports; a stale server of an earlier run is reported with its PID and the command that stops
it; one HTTP request that makes Triton's front end abort (a declared shape of 2^40 rows) costs a
restart, reported and counted in the metrics, not the service; the HPS JSON holding the Redis
password is private and removed at stop."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import psutil

from embedlab.services.redis_server import ADDRESS_ENV, PASSWORD_ENV
from embedlab.serving import client_for, infer
from serve_command import ServeCommand
from serving_export import SLOTS, random_keys


def _free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _serve(export, repo, ports, *extra):
    """The command with no Redis of the user's in its environment (it starts its own)."""
    env = {k: v for k, v in os.environ.items() if k not in (ADDRESS_ENV, PASSWORD_ENV)}
    return ServeCommand(export, repo, env, ports, *extra)


def _all_gone(pids, seconds):
    deadline = time.monotonic() + seconds
    left = set(pids)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    left.discard(pid)
            except psutil.NoSuchProcess:
                left.discard(pid)
        time.sleep(0.1)
    return left


def _kill_left(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_sigkill_leaves_no_server_and_the_next_start_works(export_dir, tmp_path, rng, reference):
    ports = _free_ports(3)
    s = _serve(export_dir, tmp_path / "repo", ports)
    try:
        out = s.until("Ctrl-C stops it.")
        triton = int(re.search(r"tritonserver pid (\d+)", out).group(1))
        redis = int(re.search(r"local redis-server started here \(pid (\d+)\)", out).group(1))
        stubs = [c.pid for c in psutil.Process(triton).children(recursive=True)]
        assert stubs, "tritonserver has no python stub processes"
        secret = export_dir / "serve" / "hps_serve.json"
        assert json.loads(secret.read_text())["volatile_db"]["password"]
        secret_mode = stat.S_IMODE(secret.stat().st_mode)
    except BaseException:
        s.stop()
        raise
    os.kill(s.proc.pid, signal.SIGKILL)
    s.proc.wait()
    left = _all_gone([triton, redis, *stubs], 10.0)
    _kill_left(left)
    assert not left, f"still running after their owner was SIGKILLed: {sorted(left)} (tritonserver {triton}, " \
                     f"redis-server {redis}, stubs {stubs})"
    assert secret_mode == 0o600, f"{secret} holds the Redis password with mode {secret_mode:o}"
    s2 = _serve(export_dir, tmp_path / "repo", ports)            # the same ports: nothing holds them
    try:
        out = s2.until("Ctrl-C stops it.")
        with client_for(re.search(r"HTTP\s+(127\.0\.0\.1:\d+)", out).group(1)) as c:
            keys = random_keys(rng, 4)
            np.testing.assert_allclose(infer(c, keys), reference.predict(keys), rtol=0, atol=1e-5)
    finally:
        rc = s2.stop()
    assert rc == 0, "".join(s2.lines)
    assert not (export_dir / "serve").exists(), "the server's HPS JSON (with the password) outlived the server"


def test_a_stale_tritonserver_is_reported_with_its_pid_and_the_command(tmp_path):
    """A process named tritonserver, marked as started by an EmbedLab process that is gone (as
    one started before the parent-death rule would be), serving the repository this start
    would rewrite: reported with its PID and `kill <pid>`, and the start refused."""
    fake = tmp_path / "tritonserver"
    fake.symlink_to("/bin/sh")
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()                                                   # a PID that no process has now
    node = __import__("embedlab._io", fromlist=["_node"])._node()
    repo = (tmp_path / "repo").resolve()
    stale = subprocess.Popen([str(fake), "-c", "sleep 120; :", f"--model-repository={repo}"],
                             env=dict(os.environ, EMBEDLAB_OWNER=f"{done.pid}.0@{node}"), start_new_session=True)
    try:
        time.sleep(0.2)
        r = subprocess.run([sys.executable, "-m", "embedlab.serving", "--export", str(tmp_path / "none"),
                            "--repository", str(repo)], capture_output=True, text=True, timeout=120)
    finally:
        os.killpg(stale.pid, signal.SIGKILL)
        stale.wait()
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"pid {stale.pid}" in r.stderr and f"`kill {stale.pid}`" in r.stderr, r.stderr


def _metric(url, name):
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_a_request_that_kills_tritonserver_costs_a_restart_not_the_service(export_dir, tmp_path, rng, reference):
    ports = _free_ports(3)
    s = _serve(export_dir, tmp_path / "repo", ports, "--tiers", "export")
    try:
        out = s.until("Ctrl-C stops it.")
        http = re.search(r"HTTP\s+(127\.0\.0\.1:\d+)", out).group(1)
        metrics = re.search(r"metrics\s+(http://127\.0\.0\.1:\d+/metrics)", out).group(1)
        restarts_before = _metric(metrics, "embedlab_triton_restarts_total")
        body = json.dumps({"inputs": [
            {"name": "EMB_KEY", "shape": [1 << 40, SLOTS], "datatype": "INT64", "data": [1, 2, 3]},
            {"name": "EMB_N_KEY", "shape": [1 << 40, 1], "datatype": "INT32", "data": [3]}]}).encode()
        req = urllib.request.Request(f"http://{http}/v2/models/ensemble/infer", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=30).read()
        except (urllib.error.URLError, ConnectionError, OSError):
            pass                                        # the front end aborted (or refused it)
        s.until("tritonserver restarted", timeout=120)
        text = "".join(s.lines)
        assert re.search(r"exited unexpectedly, status -6 \(SIGABRT\).*bad_alloc", text), text
        assert s.proc.poll() is None
        with client_for(http) as c:
            keys = random_keys(rng, 5)
            np.testing.assert_allclose(infer(c, keys), reference.predict(keys), rtol=0, atol=1e-5)
        assert (restarts_before, _metric(metrics, "embedlab_triton_restarts_total")) == (0, 1)
    finally:
        rc = s.stop()
    assert rc == 0, "".join(s.lines)

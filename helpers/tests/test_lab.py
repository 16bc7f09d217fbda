"""`make lab` (ci/lab.sh) starts JupyterLab, also as root, on loopback with token auth kept."""
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.skipif(not (ROOT / "ci" / "lab.sh").is_file(), reason="needs the repository checkout (ci/lab.sh)")
def test_lab_serves_with_token_auth(tmp_path):
    port = _free_port()
    env = dict(os.environ, PY=sys.executable, JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), JUPYTER_DATA_DIR=str(tmp_path / "data"))
    log = open(tmp_path / "lab.log", "w+")
    p = subprocess.Popen(["bash", str(ROOT / "ci" / "lab.sh"), f"--port={port}", "--ServerApp.port_retries=0"],
                         cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        status = None
        deadline = time.time() + 90
        while time.time() < deadline and p.poll() is None:
            try:
                status = _get(f"http://127.0.0.1:{port}/api")  # the version endpoint: no auth needed
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        log.seek(0)
        out = log.read()
        assert status == 200, f"JupyterLab did not come up (exit code {p.poll()}):\n{out[-3000:]}"
        assert _get(f"http://127.0.0.1:{port}/api/contents") == 403  # token authentication is on
        if os.getuid() == 0:
            assert "--allow-root" in out
        print(f"JupyterLab served on 127.0.0.1:{port} as uid {os.getuid()}, token auth on")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        log.close()


@pytest.mark.skipif(not (ROOT / "docker").is_dir(), reason="needs the repository checkout (docker/)")
def test_docker_images_use_make_lab_and_leave_host_outputs_out():
    for name in ("Dockerfile.cpu", "Dockerfile.gpu"):
        text = (ROOT / "docker" / name).read_text()
        assert 'CMD ["make", "lab", "LAB_IP=0.0.0.0"]' in text, name
    assert '"make", "lab"' in (ROOT / "docker" / "compose.yaml").read_text()
    assert "127.0.0.1:8888:8888" in (ROOT / "docker" / "compose.yaml").read_text()
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", "data/cache", "build", "helpers/build"} <= ignored

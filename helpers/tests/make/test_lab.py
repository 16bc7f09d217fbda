"""`make lab` as users and the Docker images run it: the real command, not only ci/lab.sh under it.

It serves JupyterLab on 127.0.0.1 (only) with token authentication, Jupyter gets exactly one --ip
and one --port (two --ip made Jupyter exit at once), LAB_IP / LAB_PORT choose the address, and
--allow-root is added as root and only then (as root the non-root case runs in a user namespace
that maps this user to uid 1000). The browser test of the lab is `make lab-test`.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]
needs_checkout = pytest.mark.skipif(not (ROOT / "Makefile").is_file() or not (ROOT / "ci" / "lab.sh").is_file(),
                                    reason="needs the repository checkout (Makefile, ci/lab.sh)")
START_TIMEOUT = 240  # `make lab` runs `make setup` (up to date: seconds) before Jupyter starts; a loaded 2-core VM


def _free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _get(url, token=None):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _lab_env(tmp_path):
    """The user's environment, with Jupyter's own files in tmp_path and no preset token."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("JUPYTER_TOKEN", "JUPYTER_TOKEN_FILE", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    for var, sub in (("JUPYTER_RUNTIME_DIR", "runtime"), ("JUPYTER_CONFIG_DIR", "config"),
                     ("JUPYTER_DATA_DIR", "data"), ("JUPYTERLAB_SETTINGS_DIR", "settings"),
                     ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")):
        env[var] = str(tmp_path / sub)
    return env


class MakeLab:
    """`[prefix...] make lab VAR=value...` in a process group of its own, stopped on exit."""

    def __init__(self, tmp_path, make_vars, prefix=()):
        self.log_path = tmp_path / "make-lab.log"
        self.cmd = [*prefix, "make", "lab", *make_vars]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=_lab_env(tmp_path), stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self):
        return self.log_path.read_text(errors="replace")

    def wait_serving(self, host, port):
        """The token from the printed URL once http://host:port/api answers."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"{' '.join(self.cmd)} exited with {self.proc.returncode} before serving:\n"
                            f"{self.output()[-3000:]}")
            m = re.search(rf"http://{re.escape(host)}:{port}/lab\?token=([0-9a-f]+)", self.output())
            if m:
                try:
                    if _get(f"http://{host}:{port}/api") == 200:  # the version: no auth needed
                        return m.group(1)
                except (urllib.error.URLError, OSError):
                    pass
            time.sleep(0.5)
        pytest.fail(f"{' '.join(self.cmd)} did not serve on {host}:{port} within {START_TIMEOUT} s:\n"
                    f"{self.output()[-3000:]}")

    def jupyter(self):
        """The Jupyter server process under make, and the arguments it was given."""
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            cmd = p.cmdline()
            i = next((i for i, a in enumerate(cmd) if a.endswith("jupyter-lab")), None)
            if i is not None:
                return p, cmd[i + 1:]
        pytest.fail(f"no jupyter-lab process under {' '.join(self.cmd)}")

    def stop(self):
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for p in procs:  # kernels run in sessions of their own
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        self._log.close()


@pytest.fixture
def make_lab(tmp_path):
    started = []

    def start(make_vars, prefix=()):
        lab = MakeLab(tmp_path, make_vars, prefix)
        started.append(lab)
        return lab

    yield start
    for lab in started:
        lab.stop()


def _options(args, name):
    return [a.split("=", 1)[1] if "=" in a else None for a in args if a == name or a.startswith(name + "=")]


def _check_lab(lab, host, port, as_root):
    token = lab.wait_serving(host, port)
    server, args = lab.jupyter()
    assert _options(args, "--ip") == [host], args
    assert _options(args, "--port") == [str(port)], args
    assert ("--allow-root" in args) == as_root, args
    assert ("running as root, so Jupyter gets --allow-root" in lab.output()) == as_root
    base = f"http://{host}:{port}"
    assert _get(f"{base}/api/contents") == 403, "the lab served its files without the token"
    assert _get(f"{base}/api/contents", token="not-" + token) == 403, "the lab accepted a wrong token"
    assert _get(f"{base}/api/contents", token=token) == 200, "the printed token was refused"
    listening = {c.laddr.ip for c in server.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    assert listening == {host}, f"Jupyter listens on {listening}, not only on {host}"
    return server


@needs_checkout
def test_make_lab_serves_on_loopback_with_token(make_lab):
    port = _free_port()
    lab = make_lab([f"LAB_PORT={port}"])
    server = _check_lab(lab, "127.0.0.1", port, as_root=os.getuid() == 0)
    print(f"make lab: {' '.join(lab.jupyter()[1])} (uid {server.uids().real}), token auth on")


@needs_checkout
def test_make_lab_ip_chooses_the_address(make_lab):
    host = "127.0.0.2"  # another loopback address: reachable here, and distinct from the default
    try:
        port = _free_port(host)
    except OSError as e:
        pytest.skip(f"cannot bind {host} on this machine: {e}")
    lab = make_lab([f"LAB_IP={host}", f"LAB_PORT={port}"])
    _check_lab(lab, host, port, as_root=os.getuid() == 0)
    with pytest.raises((urllib.error.URLError, OSError)):
        _get(f"http://127.0.0.1:{port}/api")


@needs_checkout
def test_make_lab_as_a_user_other_than_root(make_lab):
    if os.getuid() != 0:
        pytest.skip("not root: test_make_lab_serves_on_loopback_with_token already ran make lab as a non-root user")
    # A user namespace mapping this user to uid 1000: Jupyter and ci/lab.sh see a non-root user,
    # while the files of the checkout and of Python stay readable (no account to create).
    prefix = ["unshare", "--user", "--map-user=1000", "--map-group=1000"]
    if not shutil.which("unshare") or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("user namespaces are not available here (unshare --user fails): the non-root case needs one")
    port = _free_port()
    lab = make_lab([f"LAB_PORT={port}"], prefix=prefix)
    _check_lab(lab, "127.0.0.1", port, as_root=False)
    server, _ = lab.jupyter()
    uid_map = Path(f"/proc/{server.pid}/uid_map").read_text().split()
    assert uid_map[:2] == ["1000", str(os.getuid())], uid_map  # Jupyter ran as uid 1000 in its namespace


def _lab_sh(tmp_path, *args, **env):
    """ci/lab.sh with PY= a stand-in that prints the arguments it would give `python -m jupyter`."""
    fake = tmp_path / "fake-python"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "ARG $a"; done\n')
    fake.chmod(0o755)
    full_env = {k: v for k, v in os.environ.items() if k not in ("LAB_IP", "LAB_PORT")}
    full_env.update(PY=str(fake), **env)
    return subprocess.run(["bash", str(ROOT / "ci" / "lab.sh"), *args], env=full_env, capture_output=True, text=True)


@needs_checkout
def test_lab_sh_passes_extra_arguments_and_refuses_a_second_address(tmp_path):
    r = _lab_sh(tmp_path, "--ServerApp.port_retries=0", LAB_IP="10.1.2.3", LAB_PORT="9999")
    assert r.returncode == 0, r.stderr
    args = [line[4:] for line in r.stdout.splitlines() if line.startswith("ARG ")]
    # The first call makes the lab's working copies (ci/lab_notebooks.py), the second starts Jupyter.
    assert args[:3] == ["ci/lab_notebooks.py", "--dest", "build/lab"], args
    args = args[args.index("-m"):]
    assert args[:3] == ["-m", "jupyter", "lab"]
    assert "--ContentsManager.preferred_dir=build/lab/notebooks" in args
    assert f"--config={ROOT}/ci/jupyter_server_config.py" in args
    assert _options(args, "--ip") == ["10.1.2.3"] and _options(args, "--port") == ["9999"]
    assert args[-1] == "--ServerApp.port_retries=0"
    assert f"--ServerApp.root_dir={ROOT}" in args
    assert ("--allow-root" in args) == (os.getuid() == 0)
    for bad, var in (("--ip=0.0.0.0", "LAB_IP"), ("--ServerApp.ip=0.0.0.0", "LAB_IP"), ("--port=1", "LAB_PORT")):
        r = _lab_sh(tmp_path, bad)
        assert r.returncode == 2 and var in r.stderr and bad in r.stderr, (bad, r.stderr)
    for env in ({"LAB_PORT": "88x"}, {"LAB_PORT": "70000"}, {"LAB_IP": "0.0.0.0 --ip=1.2.3.4"}):
        r = _lab_sh(tmp_path, **env)
        assert r.returncode == 2 and "make lab: LAB_" in r.stderr, (env, r.stderr)


@pytest.mark.skipif(not (ROOT / "docker").is_dir(), reason="needs the repository checkout (docker/)")
def test_docker_images_use_make_lab_and_leave_host_outputs_out():
    """What make docker-test cannot see: the GPU image (not buildable without its registry) and
    the rules both images and the compose file keep. make docker-test builds and runs the CPU one."""
    import yaml  # a dependency of Jupyter's

    def _dockerfile_instructions(path):
        """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
        out, cur = [], ""
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("#") or not line.strip():
                continue
            cur += line.rstrip()[:-1] + " " if line.rstrip().endswith("\\") else line
            if not line.rstrip().endswith("\\"):
                word, _, rest = cur.strip().partition(" ")
                out.append((word.upper(), rest.strip()))
                cur = ""
        return out

    for name in ("Dockerfile.cpu", "Dockerfile.gpu"):
        ins = _dockerfile_instructions(ROOT / "docker" / name)
        cmds = [a for i, a in ins if i == "CMD"]
        # Exec form (make is PID 1, no shell); the address is LAB_IP: a second --ip stops Jupyter.
        assert cmds == ['["make", "lab", "LAB_IP=0.0.0.0"]'], (name, cmds)
        assert "--ip" not in (ROOT / "docker" / name).read_text(), name
        # The CPU kernels of the default build (baseline, AVX2 and AVX-512, chosen at load time) run on any
        # x86-64 CPU; make docker-test checks the built image's.
        assert "EMBEDLAB_CPU_ISA" not in (ROOT / "docker" / name).read_text().replace("EMBEDLAB_CPU_ISA=AUTO", ""), name
        for i, a in ins:
            if i == "RUN" and "apt-get update" in a:
                assert "rm -rf /var/lib/apt/lists/*" in a, f"{name}: apt lists left in the layer of: {a}"
        assert any(i == "RUN" and "make setup" in a for i, a in ins), name
    # An ENV, so that `make lab` at start sees the build's options and rebuilds nothing.
    assert "EMBEDLAB_CUDA=ON" in " ".join(a for i, a in _dockerfile_instructions(ROOT / "docker" / "Dockerfile.gpu")
                                        if i == "ENV")
    redis_ins = _dockerfile_instructions(ROOT / "docker" / "Dockerfile.redis")
    assert any(i == "RUN" and "redis-server" in a and "rm -rf /var/lib/apt/lists/*" in a for i, a in redis_ins)
    assert ("USER", "redis") in redis_ins

    services = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]
    lab, redis = services["lab"], services["redis"]
    assert "command" not in lab, "the lab service runs the image's own CMD (make lab)"
    assert lab["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    assert redis["build"]["dockerfile"] == "Dockerfile.redis"
    for name, service in services.items():  # published on the host's loopback only
        assert service.get("ports") and all(str(p).startswith("127.0.0.1:") for p in service["ports"]), name
    assert any(str(p).endswith(":8888") for p in lab["ports"])
    assert lab["environment"]["EMBEDLAB_REDIS_ADDRESS"] == "redis:6379"
    password = lab["environment"]["EMBEDLAB_REDIS_PASSWORD"]
    assert password.startswith("${EMBEDLAB_REDIS_PASSWORD:?"), "no default password"
    assert redis["command"][:3] == ["redis-server", "--requirepass", password]

    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", "data/cache", "build", "helpers/build"} <= ignored

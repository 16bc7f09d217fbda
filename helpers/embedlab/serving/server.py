"""Start and stop the real Triton Inference Server that the `nvidia-pytriton` wheel carries.

`nvidia-pytriton==0.7.0` ships a CPU build of tritonserver 2.51 under
`pytriton/tritonserver/bin/tritonserver` with only the `python` backend. PyTriton's own `Triton()`
proxy is not used (it is several times slower): the binary is launched directly on a model
repository of our own `config.pbtxt` files. That needs four things, which `TritonServer` prepares:

1. a backend folder with links to `backends/python/libtriton_python.so`,
   `triton_python_backend_utils.py` and `python_backend_stubs/<X.Y>/triton_python_backend_stub`
   (passed with `--backend-directory`);
2. `LD_LIBRARY_PATH` starting with the running interpreter's LIBDIR (else the stub loads the
   system's libpython under this interpreter's standard library and fails), then
   `site-packages/nvidia_pytriton.libs`;
3. the virtual environment's `bin` first on `PATH` (the stub's interpreter finds its
   site-packages from there; it ignores `PYTHONPATH`);
4. `--http-address 127.0.0.1` and `--grpc-address 127.0.0.1` (loopback only).

The server dies with the thread that started it (a parent-death signal, see
`embedlab.services.children`); its python stubs exit when it does. Triton's HTTP front end
aborts on some malformed requests (a declared shape of 2^40 rows makes it throw `std::bad_alloc`
before any model or `max_batch_size` check sees the request), which no model configuration can
prevent: `TritonServer.supervise` restarts a server that exits by itself, on the same ports,
logs why (the lines the server printed as it died) and counts it in the metrics
(`embedlab_triton_restarts_total`).

The metrics port is served by `TritonServer` itself (`embedlab.serving._metrics.MetricsFront`,
a thread of this process): each scrape first has every `hps_embedding` instance publish its
current HPS statistics, then relays tritonserver's own `/metrics` (on a private port), so a
scrape reads the counters as they are, at no cost to requests.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TritonServer", "TritonServerError", "find_tritonserver", "TritonInstall", "exit_reason"]

_FIX = ("Install the pinned wheel into this environment: `make setup` (requirements.txt pins "
        "nvidia-pytriton==0.7.0 and numpy 1.26.4), or `pip install nvidia-pytriton==0.7.0 'numpy<2'`.")


class TritonServerError(RuntimeError):
    """The server could not be started, did not become ready, or a model failed to load."""


@dataclass(frozen=True)
class TritonInstall:
    """Where the pieces of the server binary live in the installed `pytriton` package."""
    root: Path                 # .../site-packages/pytriton/tritonserver
    binary: Path               # bin/tritonserver
    python_backend: Path       # backends/python (libtriton_python.so + triton_python_backend_utils.py)
    stub: Path                 # python_backend_stubs/<X.Y>/triton_python_backend_stub
    libs: Path                 # site-packages/nvidia_pytriton.libs (the wheel's vendored libraries)


def find_tritonserver() -> TritonInstall:
    """Locate the tritonserver binary and the python backend inside the installed `pytriton`.

    Raises `TritonServerError` saying what is missing and how to install it.
    """
    if not sys.platform.startswith("linux"):
        raise TritonServerError(
            f"the tritonserver binary in nvidia-pytriton runs on Linux only (this is {sys.platform}); "
            "serve from a Linux machine or the project's Docker image")
    import importlib.util
    # Located, not imported: importing pytriton loads its whole client stack (aiohttp, ...).
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonServerError(f"the `pytriton` package is not installed. {_FIX}")
    pkg = Path(list(spec.submodule_search_locations)[0]).resolve()
    root = pkg / "tritonserver"
    binary = root / "bin" / "tritonserver"
    backend = root / "backends" / "python"
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / ver / "triton_python_backend_stub"
    libs = pkg.parent / "nvidia_pytriton.libs"
    for what, p in [("server binary", binary), ("python backend library", backend / "libtriton_python.so"),
                    ("python backend utilities", backend / "triton_python_backend_utils.py"),
                    ("vendored libraries folder", libs)]:
        if not p.exists():
            raise TritonServerError(f"the {what} is missing: {p} does not exist. {_FIX}")
    if not stub.exists():
        have = sorted(d.name for d in (root / "python_backend_stubs").iterdir()) \
            if (root / "python_backend_stubs").is_dir() else []
        raise TritonServerError(
            f"no python backend stub for Python {ver} in {root / 'python_backend_stubs'} "
            f"(it has {have}); run the server from a virtual environment made with one of those Pythons")
    if not os.access(binary, os.X_OK):
        raise TritonServerError(f"{binary} is not executable; reinstall the wheel: {_FIX}")
    return TritonInstall(root, binary, backend, stub, libs)


def _check_numpy() -> None:
    # The stub's bindings are built against numpy 1.x: under numpy 2 `as_numpy()` silently
    # returns zeros and outputs come back empty. Refuse rather than serve wrong answers.
    import numpy as np
    if int(np.__version__.split(".")[0]) >= 2:
        raise TritonServerError(
            f"numpy {np.__version__} is installed, but the python backend stub of tritonserver 2.51 "
            "needs numpy < 2 (with numpy 2 its inputs read as zeros and outputs come back empty). "
            "The project pins numpy 1.26.4 in requirements.txt; run `make setup` or "
            "`pip install numpy==1.26.4`.")


def _free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# Triton's error lines look like "E1123 12:00:00.123456 4242 model_lifecycle.cc:654] ...".
_ERROR_LINE = re.compile(r"^E\d{4} |Traceback|Error|error:|failed|UNAVAILABLE|cannot|No such file")


_NOISE = ("CudaDriverHelper has not been initialized",      # the CPU build says these at every start
          "unable to create stream for ensemble: CUDA driver")
_MODEL_FAILED = re.compile(r"failed to load '([^']+)' version \d+: (.*?)(?:\\n|\"$)")


_DEATH = re.compile(r"terminate called.*|Signal \(\d+\) received.*|Segmentation fault.*|Aborted.*|"
                    r"what\(\):.*|std::bad_alloc.*|out of memory.*", re.IGNORECASE)


def exit_reason(log_text: str, status) -> str:
    """Why a tritonserver exited: its status (a negative status is the signal) and the lines it
    printed as it died ("terminate called after throwing an instance of 'std::bad_alloc'", ...).

    Example:
        >>> exit_reason("terminate called after throwing an instance of 'std::bad_alloc'", -6)
        "status -6 (SIGABRT): terminate called after throwing an instance of 'std::bad_alloc'"
    """
    head = f"status {status}"
    if isinstance(status, int) and status < 0:
        try:
            head += f" ({signal.Signals(-status).name})"
        except ValueError:
            pass
    lines = list(dict.fromkeys(m.group(0).strip() for m in _DEATH.finditer(log_text)))
    return head + (": " + "; ".join(lines[:4]) if lines else "")


def _relevant_lines(text: str, limit: int = 30) -> str:
    lines = [ln for ln in text.splitlines() if not any(n in ln for n in _NOISE)]
    keep = [ln for ln in lines if _ERROR_LINE.search(ln)]
    if not keep:
        keep = lines[-limit:]
    return "\n".join(keep[-limit:])


def _model_failures(text: str) -> str:
    """One line per model that failed to load: "model 'dense' failed to load: <reason>"."""
    seen, out = set(), []
    for ln in text.splitlines():
        m = _MODEL_FAILED.search(ln)
        if m and m.group(1) not in seen:
            seen.add(m.group(1))
            out.append(f"model '{m.group(1)}' failed to load: {m.group(2)}")
    return "\n".join(out)


class TritonServer:
    """A tritonserver process on 127.0.0.1, as a context manager.

    Args:
        model_repository: folder of `<model>/config.pbtxt` + `<model>/1/model.py` (see
            `embedlab.serving.write_model_repository`).
        log_file: where the server's stdout and stderr go (default: `<repository>/../triton.log`
            next to the repository, or a temporary file).
        ready_timeout_s: seconds to wait for `/v2/health/ready` before giving up.
        stop_grace_s: seconds between SIGTERM and SIGKILL when stopping.
        http_port, grpc_port, metrics_port: 0 (default) picks free ports.
        python_shm_bytes: initial size of each python-model shared-memory region.
        extra_args: more tritonserver arguments.

    Example (+SKIP: starts a tritonserver process on a repository with notebook 05's export):
        >>> with TritonServer("data/cache/hps_triton/repository") as server:   # doctest: +SKIP
        ...     client = tritonclient.http.InferenceServerClient(server.http_url)

    On any start-up failure (binary cannot run, a model fails to load, not ready in time) the
    process is stopped before `TritonServerError` is raised, with the log's relevant lines in the
    message. Close clients before leaving the `with` block: the server waits for open
    connections up to its exit timeout.
    """

    def __init__(self, model_repository, *, log_file=None, ready_timeout_s: float = 60.0,
                 stop_grace_s: float = 10.0, http_port: int = 0, grpc_port: int = 0,
                 metrics_port: int = 0, python_shm_bytes: int = 8 << 20,
                 extra_args: list[str] | tuple[str, ...] = ()):
        self.model_repository = Path(model_repository).resolve()
        self.log_file = Path(log_file).resolve() if log_file else None
        self.ready_timeout_s = float(ready_timeout_s)
        self.stop_grace_s = float(stop_grace_s)
        self._ports = (int(http_port), int(grpc_port), int(metrics_port))
        self.python_shm_bytes = int(python_shm_bytes)
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen | None = None
        self.http_port = self.grpc_port = self.metrics_port = None
        self._backend_dir: Path | None = None
        self._log_handle = None
        self._stats_dir: Path | None = None
        self._metrics_front = None
        self.triton_metrics_port = None     # tritonserver's own metrics port (private; see metrics_url)
        self.restarts = 0                   # times `restart` brought the server back
        self.restart_reasons: list[str] = []
        self._inst: TritonInstall | None = None
        self._cmd: list[str] | None = None
        self._log_offset = 0                # where the running process's part of the log begins

    # -- addresses ---------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        """The address ``127.0.0.1:<port>`` for `tritonclient.http.InferenceServerClient`."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """The address ``127.0.0.1:<port>`` for `tritonclient.grpc.InferenceServerClient`."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """The metrics endpoint, tritonserver's metrics with the HPS statistics current at each scrape."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- start -------------------------------------------------------------------------------
    def _environment(self, inst: TritonInstall) -> dict:
        env = dict(os.environ)
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        ld = [p for p in (libdir, str(inst.libs)) if p]
        if env.get("LD_LIBRARY_PATH"):
            ld.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = ":".join(ld)
        venv_bin = str(Path(sys.executable).parent)   # .venv/bin, not the resolved base interpreter
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
        # The stub interpreter must see the same site-packages as this process, not a user's.
        env.pop("PYTHONHOME", None)
        env.setdefault("OMP_NUM_THREADS", "1")
        if self._stats_dir is not None:
            from ._metrics import REFRESH_DIR_ENV
            env[REFRESH_DIR_ENV] = str(self._stats_dir)
        return env

    def _prepare_backend_dir(self, inst: TritonInstall) -> Path:
        d = Path(tempfile.mkdtemp(prefix="embedlab-triton-backends-"))
        py = d / "python"
        py.mkdir()
        for src in (inst.python_backend / "libtriton_python.so",
                    inst.python_backend / "triton_python_backend_utils.py", inst.stub):
            (py / src.name).symlink_to(src)
        return d

    def _check_repository(self) -> None:
        repo = self.model_repository
        if not repo.is_dir():
            raise TritonServerError(f"model repository {repo} does not exist (write it first with "
                                    "embedlab.serving.write_model_repository)")
        models = [p for p in repo.iterdir() if (p / "config.pbtxt").is_file()]
        if not models:
            raise TritonServerError(f"model repository {repo} holds no <model>/config.pbtxt")

    def start(self) -> "TritonServer":
        """Starts the server and waits until it is ready; returns self.

        Raises `TritonServerError` (with the log's relevant lines) if it cannot start; the
        process is stopped first. Free ports picked here can be taken by another program
        before the server binds them: then it tries again with new ones (3 times)."""
        if self.running():
            raise TritonServerError(f"this TritonServer is already running (pid {self.pid})")
        auto_ports = not all(self._ports)
        for attempt in range(3):
            try:
                return self._start_once()
            except TritonServerError as e:
                if not (auto_ports and "already in use" in str(e) and attempt < 2):
                    raise
        raise AssertionError("unreachable")

    def _start_once(self) -> "TritonServer":
        _check_numpy()
        inst = find_tritonserver()
        self._check_repository()
        self._backend_dir = self._prepare_backend_dir(inst)
        if self.log_file is None:
            self.log_file = Path(tempfile.mkstemp(prefix="embedlab-triton-", suffix=".log")[1])
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        ports = list(self._ports)
        free = iter(_free_ports(4))
        ports = [p or next(free) for p in ports]
        self.http_port, self.grpc_port, self.metrics_port = ports
        self.triton_metrics_port = next(free)
        if self._metrics_enabled():
            self._start_metrics_front()
        shm_prefix = f"embedlab_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        cmd = [str(inst.binary),
               f"--model-repository={self.model_repository}",
               f"--backend-directory={self._backend_dir}",
               "--http-address=127.0.0.1", f"--http-port={self.http_port}",
               "--grpc-address=127.0.0.1", f"--grpc-port={self.grpc_port}",
               "--metrics-address=127.0.0.1", f"--metrics-port={self.triton_metrics_port}",
               "--allow-gpu-metrics=false",
               "--exit-on-error=true", "--strict-readiness=true",
               f"--exit-timeout-secs={max(1, int(self.stop_grace_s))}",
               f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
               f"--backend-config=python,shm-default-byte-size={self.python_shm_bytes}",
               *self.extra_args]
        self._inst, self._cmd = inst, cmd
        self._log_handle = open(self.log_file, "wb", buffering=0)
        self._launch()
        # A server left running when the interpreter exits (a notebook kernel restarted, an
        # exception between start and stop) is stopped then.
        atexit.register(self.stop)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self) -> None:
        self._log_offset = self._log_handle.tell()
        self._log_handle.write(("$ " + " ".join(self._cmd) + "\n").encode())
        from ..services import children
        try:
            # Own session: the server and its python stubs form one process group that stop()
            # can reach by id if the server leaves a stub behind. The parent-death signal ends
            # the server when the thread that started it ends, even by SIGKILL.
            self.process = subprocess.Popen(self._cmd, stdout=self._log_handle, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            **children.popen_kwargs(self._environment(self._inst)))
        except OSError as e:
            self._cleanup_files()
            raise TritonServerError(f"could not execute {self._inst.binary}: {e}. {_FIX}") from None

    def exit_reason(self) -> str:
        """Why the process exited (see :func:`exit_reason`), from its part of the log."""
        rc = self.process.returncode if self.process is not None else None
        try:
            with open(self.log_file, "rb") as f:
                f.seek(self._log_offset)
                text = f.read().decode(errors="replace")
        except (OSError, TypeError):
            text = ""
        return exit_reason(text, rc)

    def restart(self, reason: str = "") -> "TritonServer":
        """Starts the server again on the same ports, with the same metrics endpoint and log
        (appended to); counts it in `restarts` and in the metrics (`embedlab_triton_restarts_total`).

        Args:
            reason: why, recorded in `restart_reasons` (default: :meth:`exit_reason`).

        Raises:
            TritonServerError: it was never started, or it does not come back.

        Example (+SKIP: needs a started server):
            >>> server.restart("the test killed it")     # doctest: +SKIP
        """
        if self._cmd is None or self._log_handle is None:
            raise TritonServerError("restart: this TritonServer was never started (or was stopped); use start()")
        reason = reason or self.exit_reason()
        old = self.process
        if old is not None and old.poll() is None:
            old.kill()
            old.wait()
        if old is not None:
            _end_group(old.pid)
        self.restarts += 1
        self.restart_reasons.append(reason)
        self._launch()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def supervise(self, stop, *, report=None, max_restarts: int = 5, window_s: float = 600.0,
                  poll_s: float = 0.5) -> None:
        """Keeps the server up until `stop` is set: a server that exits by itself is restarted
        (:meth:`restart`), and `report` is called with a line saying why.

        Args:
            stop: a `threading.Event`; `supervise` returns when it is set.
            report: callable(str) for each restart (default: the `embedlab.serving` logger).
            max_restarts: more restarts than this within `window_s` seconds: give up.
            window_s: see `max_restarts`.
            poll_s: how often the process is checked.

        Raises:
            TritonServerError: it keeps dying (or does not come back), with the last reasons.

        Example (+SKIP: needs a started server):
            >>> stop = threading.Event()                    # doctest: +SKIP
            >>> server.supervise(stop, report=print)        # doctest: +SKIP
        """
        import logging
        report = report or logging.getLogger("embedlab.serving").warning
        times: list[float] = []
        while not stop.wait(poll_s):
            if self.running():
                continue
            why = self.exit_reason()
            now = time.monotonic()
            times = [t for t in times if now - t < window_s] + [now]
            if len(times) > max_restarts:
                raise TritonServerError(
                    f"tritonserver exited {len(times)} times within {window_s:.0f} s; not restarting it again. "
                    f"Last: {why}. Log {self.log_file}")
            report(f"tritonserver (pid {self.pid}) exited unexpectedly, {why}; restarting it "
                   f"(restart {self.restarts + 1}); log {self.log_file}")
            self.restart(why)
            report(f"tritonserver restarted (pid {self.pid}), serving again on {self.http_url}")

    def _log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def _metrics_enabled(self) -> bool:
        return not any(a.replace(" ", "") in ("--allow-metrics=false", "--allow-metrics=0")
                       for a in self.extra_args)

    def _wait_ready(self) -> None:
        """Waits for `/v2/health/ready` and then for the metrics endpoint: tritonserver starts
        its metrics service after the HTTP one, so a ready server can still refuse a metrics
        request for a moment."""
        urls = [f"http://127.0.0.1:{self.http_port}/v2/health/ready"]
        if self._metrics_enabled():
            urls.append(self.metrics_url)
        deadline = time.monotonic() + self.ready_timeout_s
        while urls:
            rc = self.process.poll()
            if rc is not None:
                raise TritonServerError(self._failure_message(f"tritonserver exited with status {rc} "
                                                              "during start-up"))
            try:
                with urllib.request.urlopen(urls[0], timeout=1.0) as r:
                    if r.status == 200:
                        urls.pop(0)
                        continue
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                what = "serving metrics" if urls[0] == self.metrics_url else "ready"
                raise TritonServerError(self._failure_message(
                    f"tritonserver was not {what} within {self.ready_timeout_s:.0f} s"))
            time.sleep(0.05)

    def _failure_message(self, head: str) -> str:
        text = self._log_text()
        hint = ""
        m = re.search(r"error while loading shared libraries: ([^:]+)", text)
        if m:
            hint = (f"\nThe binary cannot find the shared library {m.group(1)}: LD_LIBRARY_PATH must hold "
                    f"this interpreter's LIBDIR and site-packages/nvidia_pytriton.libs. {_FIX}")
        elif "GLIBC_" in text:
            hint = ("\nThis system's C library is older than the one the nvidia-pytriton wheel was built "
                    "for (manylinux glibc 2.35): use a newer Linux (Debian 12, Ubuntu 22.04 or later).")
        elif "_recursion_count" in text:
            hint = ("\nThe python stub loaded a different libpython than this interpreter's; "
                    "LD_LIBRARY_PATH must start with sysconfig.get_config_var('LIBDIR').")
        elif "already in use" in text:
            hint = (f"\nA port is already in use (HTTP {self.http_port}, gRPC {self.grpc_port}, metrics "
                    f"{self.metrics_port}): stop what holds it, or choose other ports (0 picks free ones).")
        failures = _model_failures(text)
        return (f"{head}.\n" + (failures + "\n" if failures else "") +
                f"Log {self.log_file}, relevant lines:\n{_relevant_lines(text)}{hint}")

    # -- stop --------------------------------------------------------------------------------
    def stop(self) -> int | None:
        """Stop the server by PID: SIGTERM, then SIGKILL after `stop_grace_s`. Idempotent.

        Returns the exit status (None if it was never started)."""
        rc = None
        p = self.process
        if p is not None:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                    rc = p.wait(timeout=self.stop_grace_s + 5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    rc = p.wait()
                except ProcessLookupError:
                    pass
            rc = p.returncode
            # The python stubs watch the server and exit with it; a stub that is still there a
            # moment later is ended by the process group this server was started in.
            _end_group(p.pid)
        self._cmd = None
        self._cleanup_files()
        atexit.unregister(self.stop)
        return rc

    def _start_metrics_front(self) -> None:
        from ._metrics import MetricsFront
        self._stats_dir = Path(tempfile.mkdtemp(prefix="embedlab-stats-"))
        try:
            self._metrics_front = MetricsFront(
                "127.0.0.1", self.metrics_port, f"http://127.0.0.1:{self.triton_metrics_port}/metrics",
                self._stats_dir, extra=self._own_metrics)
        except OSError as e:
            self._cleanup_files()
            raise TritonServerError(
                f"cannot serve metrics on 127.0.0.1:{self.metrics_port}: {e}"
                + (" (address already in use)" if "in use" in str(e) else "")) from None

    def _own_metrics(self) -> str:
        return ("# HELP embedlab_triton_restarts_total Times the supervisor restarted tritonserver after it "
                "exited by itself.\n# TYPE embedlab_triton_restarts_total counter\n"
                f"embedlab_triton_restarts_total {self.restarts}\n")

    def _cleanup_files(self) -> None:
        if self._metrics_front is not None:
            self._metrics_front.close()
            self._metrics_front = None
        if self._stats_dir is not None:
            shutil.rmtree(self._stats_dir, ignore_errors=True)
            self._stats_dir = None
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        if self._backend_dir is not None:
            shutil.rmtree(self._backend_dir, ignore_errors=True)
            self._backend_dir = None

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- helpers -----------------------------------------------------------------------------
    def log(self) -> str:
        """The server log so far."""
        return self._log_text()

    def model_ready(self, name: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/models/{name}/ready",
                                        timeout=2.0) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def model_config(self, name: str) -> dict:
        """The configuration the server uses for a model (after Triton's auto-completion)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/models/{name}/config",
                                    timeout=5.0) as r:
            return json.loads(r.read())

    def __repr__(self) -> str:
        state = f"pid {self.pid}, http {self.http_url}, grpc {self.grpc_url}" if self.running() else "stopped"
        return f"TritonServer({str(self.model_repository)!r}, {state})"


def _end_group(pgid: int) -> None:
    # The python stubs watch the server and exit with it; a stub that is still there a moment
    # later is ended by the process group the server was started in.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.05)
    if _group_alive(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True

"""Start and stop a local Redis for the HPS: one node, or a 3-node cluster.

Uses the ``redis-server`` and ``redis-cli`` binaries of Debian's ``redis-server`` package
(``make setup`` installs it where missing). Every server is bound to 127.0.0.1, requires a
password, keeps nothing on disk (no RDB snapshots, no AOF) and lives in a temporary folder that
``stop()`` removes.

Example:
    >>> from embedlab.hps.redis import start_redis          # doctest: +SKIP
    >>> with start_redis() as r:                            # doctest: +SKIP
    ...     cfg = {"type": "redis_cluster", "address": r.address, "password": r.password}
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["RedisServer", "RedisCluster", "start_redis", "start_redis_cluster", "redis_binaries"]


def redis_binaries() -> tuple[str, str]:
    """Paths of ``redis-server`` and ``redis-cli``; raises with the fix when they are missing."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not server or not cli:
        raise FileNotFoundError(
            "redis-server / redis-cli not found on PATH; install Debian's package: "
            "`sudo apt-get install redis-server` (or run `make setup`, which installs it where missing)")
    return server, cli


def _free_port(also_plus: int | None = None) -> int:
    """A TCP port free on 127.0.0.1 (and port + also_plus, for a cluster node's bus port)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if also_plus is None:
            return port
        if port + also_plus < 65536:
            with socket.socket() as s2:
                try:
                    s2.bind(("127.0.0.1", port + also_plus))
                    return port
                except OSError:
                    continue
    raise RuntimeError("no free TCP port on 127.0.0.1")


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 with a password.

    Args:
        port: TCP port (a free one when None).
        password: the ``requirepass`` (a random one when None).
        workdir: folder for its config and log (a new temporary folder when None).
        cluster: start it with ``cluster-enabled yes`` (a node of :class:`RedisCluster`).
        maxmemory: optional ``maxmemory`` setting such as ``"256mb"``.
    """

    def __init__(self, port: int | None = None, password: str | None = None, workdir=None,
                 cluster: bool = False, maxmemory: str | None = None):
        self._server, self._cli = redis_binaries()
        self.port = port or _free_port(10000 if cluster else None)
        self.password = password if password is not None else secrets.token_hex(12)
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="embedlab-redis-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cluster = cluster
        self.maxmemory = maxmemory
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _write_conf(self) -> Path:
        lines = [f"port {self.port}", "bind 127.0.0.1", "protected-mode yes", f"requirepass {self.password}",
                 f"masterauth {self.password}", f'dir "{self.dir}"', 'save ""', "appendonly no",
                 f'logfile "{self.dir / f"redis-{self.port}.log"}"', "daemonize no"]
        if self.cluster:
            lines += ["cluster-enabled yes", f"cluster-config-file nodes-{self.port}.conf",
                      "cluster-node-timeout 2000", "cluster-require-full-coverage no"]
        if self.maxmemory:
            lines += [f"maxmemory {self.maxmemory}"]
        conf = self.dir / f"redis-{self.port}.conf"
        conf.write_text("\n".join(lines) + "\n")
        return conf

    def start(self, timeout: float = 10.0) -> "RedisServer":
        """Starts the process and waits until it answers PING (raises with its log if it does not)."""
        if self.running:
            return self
        conf = self._write_conf()
        self.proc = subprocess.Popen([self._server, str(conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self.ping():
                return self
            time.sleep(0.05)
        log = (self.dir / f"redis-{self.port}.log")
        tail = log.read_text()[-2000:] if log.exists() else ""
        self.kill()
        raise RuntimeError(f"redis-server on 127.0.0.1:{self.port} did not start; log tail:\n{tail}")

    def ping(self) -> bool:
        import redis
        try:
            return bool(redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                                    socket_connect_timeout=0.2, socket_timeout=0.5).ping())
        except (redis.RedisError, OSError):
            return False

    def client(self):
        """A ``redis.Redis`` client for this node."""
        import redis
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password)

    def cli(self, *args: str, check: bool = True) -> str:
        """Runs ``redis-cli -p PORT ARGS`` with the password; returns stdout."""
        env = dict(os.environ, REDISCLI_AUTH=self.password)
        r = subprocess.run([self._cli, "-h", "127.0.0.1", "-p", str(self.port), *args], env=env,
                           capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(args)} failed: {r.stderr or r.stdout}")
        return r.stdout

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash would (no shutdown, nothing saved)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, remove: bool = True) -> None:
        """Stops the process (SIGTERM, then SIGKILL) and removes its temporary folder."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        if remove and self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def restart(self) -> "RedisServer":
        """Starts it again on the same port (empty: nothing is persisted)."""
        self.kill()
        return self.start()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class RedisCluster:
    """A 3-node (by default) Redis cluster on 127.0.0.1 created with ``redis-cli --cluster create``.

    ``address`` is the comma-separated node list the HPS config's ``volatile_db.address`` takes.
    """

    def __init__(self, nodes: int = 3, password: str | None = None, workdir=None):
        if nodes < 3:
            raise ValueError(f"RedisCluster: a cluster needs at least 3 master nodes, got nodes={nodes}")
        self.password = password if password is not None else secrets.token_hex(12)
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="embedlab-rediscluster-"))
        self.nodes = [RedisServer(password=self.password, workdir=self.dir, cluster=True) for _ in range(nodes)]
        # ports must differ even though _free_port released them before the servers bind
        seen = set()
        for n in self.nodes:
            while n.port in seen:
                n.port = _free_port(10000)
            seen.add(n.port)

    @property
    def address(self) -> str:
        return ",".join(n.address for n in self.nodes)

    def start(self, timeout: float = 30.0) -> "RedisCluster":
        for n in self.nodes:
            n.start()
        _, cli = redis_binaries()
        env = dict(os.environ, REDISCLI_AUTH=self.password)
        r = subprocess.run([cli, "--cluster", "create", *[n.address for n in self.nodes],
                            "--cluster-replicas", "0", "--cluster-yes"], env=env,
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            self.stop()
            raise RuntimeError(f"redis-cli --cluster create failed: {r.stdout[-2000:]} {r.stderr[-2000:]}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in n.cli("cluster", "info", check=False) for n in self.nodes):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("Redis cluster did not reach cluster_state:ok")

    def kill(self) -> None:
        for n in self.nodes:
            n.kill()

    def stop(self) -> None:
        for n in self.nodes:
            n.stop(remove=False)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def start_redis(**kwargs) -> RedisServer:
    """Starts one local ``redis-server`` (see :class:`RedisServer`) and returns it, running."""
    return RedisServer(**kwargs).start()


def start_redis_cluster(nodes: int = 3, **kwargs) -> RedisCluster:
    """Starts a local Redis cluster of ``nodes`` masters (see :class:`RedisCluster`), running."""
    return RedisCluster(nodes=nodes, **kwargs).start()

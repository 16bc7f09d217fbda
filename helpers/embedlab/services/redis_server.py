"""A redis-server launcher for the HPS's volatile tier: the user's own Redis (``EMBEDLAB_REDIS_ADDRESS``), or a local one.

:func:`hps_redis` is the one place that reads ``EMBEDLAB_REDIS_ADDRESS`` (``host:port``, or a
comma-separated node list of a Redis cluster) and ``EMBEDLAB_REDIS_PASSWORD``: when the address is
set it returns an :class:`ExternalRedis` (checked: reachable, password accepted), which code here
uses but never stops or kills; otherwise it starts a local :class:`RedisServer`. ``docker/compose.yaml``
sets both variables for its password-protected Redis service.

Local servers use the ``redis-server`` and ``redis-cli`` binaries of Debian's ``redis-server``
package (``make setup`` installs it where missing). Every one is bound to 127.0.0.1, requires a
password, keeps nothing on disk (no RDB snapshots, no AOF) and lives in a temporary folder that
``stop()`` removes. A local server dies with the process that started it: stopped at interpreter
exit (a script that raises, a notebook kernel that ends), and killed by the kernel when that
process is killed (:mod:`embedlab.services.children`). Starting one first reports, as a warning
on the ``embedlab.services`` logger, any redis-server of a gone EmbedLab process that is still
running (with its PID and the command that stops it), and removes the temporary folders such
processes left.

Example:
    >>> from embedlab.services.redis_server import hps_redis
    >>> r = hps_redis()
    >>> cfg = {"volatile_db": r.volatile_db(), "models": []}
    >>> cfg["volatile_db"]["type"]
    'redis_cluster'
    >>> r.stop()
"""
from __future__ import annotations

import atexit
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from . import children

log = logging.getLogger("embedlab.services")
_DIR_PREFIXES = ("embedlab-redis-", "embedlab-rediscluster-")
_OWNER_FILE = children.OWNER_FILE

__all__ = ["RedisServer", "RedisCluster", "ExternalRedis", "RedisSettingError", "hps_redis", "redis_to_kill",
           "report_stale_redis", "start_redis", "start_redis_cluster", "redis_binaries", "ADDRESS_ENV", "PASSWORD_ENV"]

ADDRESS_ENV = "EMBEDLAB_REDIS_ADDRESS"
PASSWORD_ENV = "EMBEDLAB_REDIS_PASSWORD"


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
        password: the ``requirepass`` (a random one when None; "" for none).
        workdir: folder for its config and log (a new temporary folder when None).
        cluster: start it with ``cluster-enabled yes`` (a node of :class:`RedisCluster`).
        maxmemory: optional ``maxmemory`` setting such as ``"256mb"``.
    """
    external = False      # started here: ``kill()`` / ``stop()`` act on it

    def __init__(self, port: int | None = None, password: str | None = None, workdir=None,
                 cluster: bool = False, maxmemory: str | None = None):
        self._server, self._cli = redis_binaries()
        self.port = port or _free_port(10000 if cluster else None)
        self.password = password if password is not None else secrets.token_hex(12)
        self._own_dir = workdir is None
        if self._own_dir:
            report_stale_redis()
        self.dir = Path(workdir or _owned_tempdir("embedlab-redis-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cluster = cluster
        self.maxmemory = maxmemory
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def volatile_db(self, **fields) -> dict:
        """The HPS JSON's ``volatile_db`` section for this server (``fields`` added)."""
        return _volatile_db(self.address, self.password, fields)

    def describe(self) -> str:
        pid = self.proc.pid if self.running else "not running"
        return (f"a local redis-server started here (pid {pid}) on {self.address}, password-protected; "
                f"{ADDRESS_ENV} is not set")

    def _write_conf(self) -> Path:
        lines = [f"port {self.port}", "bind 127.0.0.1", "protected-mode yes", f'dir "{self.dir}"', 'save ""',
                 "appendonly no", f'logfile "{self.dir / f"redis-{self.port}.log"}"', "daemonize no"]
        if self.password:     # password="" (asked for explicitly): no password
            lines += [f"requirepass {self.password}", f"masterauth {self.password}"]
        if self.cluster:
            lines += ["cluster-enabled yes", f"cluster-config-file nodes-{self.port}.conf",
                      "cluster-node-timeout 2000", "cluster-require-full-coverage no"]
        if self.maxmemory:
            lines += [f"maxmemory {self.maxmemory}"]
        conf = self.dir / f"redis-{self.port}.conf"
        # It holds the password: readable by this user only, from its creation on.
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.chmod(conf, 0o600)
        return conf

    def start(self, timeout: float = 10.0) -> "RedisServer":
        """Starts the process and waits until it answers PING (raises with its log if it does not)."""
        if self.running:
            return self
        conf = self._write_conf()
        # Its own session (a Ctrl-C in a terminal reaches the owner, which stops it in order),
        # and a parent-death signal: it dies with the thread that started it.
        with open(self.dir / f"redis-{self.port}.stderr", "wb") as err:
            self.proc = subprocess.Popen([self._server, str(conf)], stdout=subprocess.DEVNULL,
                                         stderr=err, start_new_session=True, **children.popen_kwargs())
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self.ping():
                return self
            time.sleep(0.05)
        tail = ""
        for name in (f"redis-{self.port}.stderr", f"redis-{self.port}.log"):
            f = self.dir / name
            tail += f.read_text(errors="replace")[-2000:] if f.exists() else ""
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
        atexit.unregister(self.stop)

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
    external = False

    def __init__(self, nodes: int = 3, password: str | None = None, workdir=None):
        if nodes < 3:
            raise ValueError(f"RedisCluster: a cluster needs at least 3 master nodes, got nodes={nodes}")
        self.password = password if password is not None else secrets.token_hex(12)
        self._own_dir = workdir is None
        if self._own_dir:
            report_stale_redis()
        self.dir = Path(workdir or _owned_tempdir("embedlab-rediscluster-"))
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

    def volatile_db(self, **fields) -> dict:
        """The HPS JSON's ``volatile_db`` section for this cluster (``fields`` added)."""
        return _volatile_db(self.address, self.password, fields)

    @property
    def running(self) -> bool:
        return all(n.running for n in self.nodes)

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


def _owned_tempdir(prefix: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix=prefix))
    (d / _OWNER_FILE).write_text(children.popen_kwargs({})["env"][children.OWNER_ENV] + "\n")
    return d


def report_stale_redis() -> list:
    """Logs (a warning each) the local redis-servers that a gone EmbedLab process left running,
    with their PID and the command that stops them, and removes the temporary folders of gone
    owners whose servers are no longer running.

    Returns:
        The stale servers found (:class:`embedlab.services.children.StaleServer`).

    Example:
        >>> isinstance(report_stale_redis(), list)
        True
    """
    from .._io import _OWNER, _writer_gone
    stale = children.stale_servers(("redis-server",))
    for st in stale:
        log.warning("%s", children.describe(st))
    running_owners = {st.owner_pid for st in stale}
    root = Path(tempfile.gettempdir())
    for d in root.iterdir() if root.is_dir() else []:
        if not d.name.startswith(_DIR_PREFIXES):
            continue
        try:
            tag = (d / _OWNER_FILE).read_text().strip()
        except OSError:
            continue
        m = _OWNER.fullmatch(tag + "-00000000")
        if m and int(m["pid"]) not in running_owners and _writer_gone(int(m["pid"]), int(m["start"]), m["node"]):
            shutil.rmtree(d, ignore_errors=True)
            log.warning("removed %s, the folder of a local redis-server whose owner (PID %s) is gone", d, m["pid"])
    return stale


def start_redis(**kwargs) -> RedisServer:
    """Starts one local ``redis-server`` (see :class:`RedisServer`) and returns it, running."""
    return RedisServer(**kwargs).start()


def start_redis_cluster(nodes: int = 3, **kwargs) -> RedisCluster:
    """Starts a local Redis cluster of ``nodes`` masters (see :class:`RedisCluster`), running."""
    return RedisCluster(nodes=nodes, **kwargs).start()


def _volatile_db(address: str, password: str, fields: dict) -> dict:
    return {"type": "redis_cluster", "address": address, "password": password, **fields}


class RedisSettingError(RuntimeError):
    """``EMBEDLAB_REDIS_ADDRESS`` / ``EMBEDLAB_REDIS_PASSWORD`` name a Redis that cannot be used;
    the message names the variable and the fix."""


def _parse_address(address: str) -> list[tuple[str, int]]:
    bad = RedisSettingError(
        f"{ADDRESS_ENV}={address!r} is not host:port (or a comma-separated host:port list of a Redis "
        f"cluster's nodes), e.g. {ADDRESS_ENV}=redis:6379; unset it to let EmbedLab start a local redis-server")
    if "://" in address:
        raise bad
    nodes = []
    for part in address.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise bad
        nodes.append((host, int(port)))
    return nodes


class ExternalRedis:
    """A Redis this process did not start: the one ``EMBEDLAB_REDIS_ADDRESS`` names.

    It is used (the HPS writes its tables there as ``hps_et.<model>.<table>/p<partition>`` hashes,
    rewritten at every server start) but never stopped or killed: ``kill()`` refuses, and
    ``stop()`` leaves it running. Build it with :func:`hps_redis`, which checks it first.

    Args:
        address: ``host:port``, or a comma-separated node list of a Redis cluster.
        password: its ``requirepass`` ("" for none).
    """
    external = True

    def __init__(self, address: str, password: str = "", timeout: float = 3.0):
        self.address = address.strip()
        self.password = password
        self.nodes = _parse_address(self.address)
        self.timeout = float(timeout)

    def _client(self, host: str, port: int):
        import redis
        return redis.Redis(host=host, port=port, password=self.password or None,
                           socket_connect_timeout=self.timeout, socket_timeout=self.timeout)

    def check(self) -> "ExternalRedis":
        """Connects to every node with the password (PING); raises :class:`RedisSettingError`
        naming the variable to fix when a node cannot be reached or refuses the password."""
        import redis
        for host, port in self.nodes:
            where = f"Redis at {host}:{port} ({ADDRESS_ENV}={self.address})"
            c = self._client(host, port)
            try:
                c.ping()
            except redis.AuthenticationError as e:
                text = str(e)
                if not self.password:
                    raise RedisSettingError(f"{where} requires a password: set {PASSWORD_ENV} ({text})") from None
                if "without any password configured" in text:
                    raise RedisSettingError(f"{PASSWORD_ENV} is set, but {where} has no password: unset "
                                            f"{PASSWORD_ENV} or configure requirepass there ({text})") from None
                raise RedisSettingError(f"{PASSWORD_ENV}: {where} refused the password ({text})") from None
            except redis.ResponseError as e:
                if "NOAUTH" in str(e) or "auth" in str(e).lower():
                    hint = f"set {PASSWORD_ENV}" if not self.password else f"check {PASSWORD_ENV}"
                    raise RedisSettingError(f"{where} refused the connection: {e}; {hint}") from None
                raise RedisSettingError(f"{where} answered PING with an error: {e}") from None
            except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
                raise RedisSettingError(
                    f"{ADDRESS_ENV}={self.address}: cannot connect to Redis at {host}:{port} ({e}). Start that "
                    f"Redis, correct the variable, or unset it to let EmbedLab start a local redis-server") from None
            finally:
                c.close()
        return self

    def ping(self) -> bool:
        import redis
        try:
            for host, port in self.nodes:
                c = self._client(host, port)
                try:
                    c.ping()
                finally:
                    c.close()
            return True
        except (redis.RedisError, OSError):
            return False

    @property
    def running(self) -> bool:
        return self.ping()

    def client(self):
        """A ``redis.Redis`` client for the first node."""
        return self._client(*self.nodes[0])

    def volatile_db(self, **fields) -> dict:
        """The HPS JSON's ``volatile_db`` section for this Redis (``fields`` added)."""
        return _volatile_db(self.address, self.password, fields)

    def describe(self) -> str:
        auth = "with the password of " + PASSWORD_ENV if self.password else "without a password"
        return f"the Redis at {self.address} named by {ADDRESS_ENV} ({auth}); not started here, never stopped or killed here"

    def kill(self) -> None:
        raise RuntimeError(f"refusing to kill the Redis at {self.address}: it was not started here "
                           f"({ADDRESS_ENV}); kill a local throw-away server instead (redis_to_kill)")

    def stop(self, remove: bool = True) -> None:
        """Leaves the server running: it is not this process's to stop."""

    def __enter__(self):
        return self.check()

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self) -> str:
        return f"ExternalRedis({self.address!r})"


def hps_redis(environ=None, **local) -> "ExternalRedis | RedisServer":
    """The Redis for the HPS's volatile tier: the user's, or a fresh local one.

    The one place that reads ``EMBEDLAB_REDIS_ADDRESS`` and ``EMBEDLAB_REDIS_PASSWORD``. With the
    address set (``docker/compose.yaml`` sets both for its Redis service), returns that Redis as a
    checked :class:`ExternalRedis`; without it, starts a local password-protected ``redis-server``
    on 127.0.0.1 (:func:`start_redis`, with ``local`` as its arguments). Either way the result has
    ``address``, ``password``, ``external``, ``volatile_db(**fields)``, ``describe()`` and
    ``stop()`` (which stops only a server started here).

    Args:
        environ: the variables to read (default ``os.environ``).

    Raises:
        RedisSettingError: the address is malformed or unreachable, the password is refused or
            missing, or the password is set without an address; the message names the variable.

    Example (the first two lines +SKIP: they need a running Redis at that address):
        >>> r = hps_redis({"EMBEDLAB_REDIS_ADDRESS": "redis:6379"})       # doctest: +SKIP
        >>> print(r.describe())                                           # doctest: +SKIP
        the Redis at redis:6379 named by EMBEDLAB_REDIS_ADDRESS (...)
        >>> hps_redis({"EMBEDLAB_REDIS_PASSWORD": "secret"})
        Traceback (most recent call last):
        ...
        embedlab.services.redis_server.RedisSettingError: ...
    """
    env = os.environ if environ is None else environ
    address = env.get(ADDRESS_ENV, "").strip()
    password = env.get(PASSWORD_ENV, "")
    if address:
        return ExternalRedis(address, password).check()
    if password:
        raise RedisSettingError(f"{PASSWORD_ENV} is set but {ADDRESS_ENV} is not: set {ADDRESS_ENV} to the "
                                f"host:port of that Redis, or unset {PASSWORD_ENV} to let EmbedLab start a "
                                "local redis-server")
    return start_redis(**local)


def redis_to_kill(redis) -> "RedisServer | RedisCluster":
    """A Redis that a fault demonstration may kill: ``redis`` itself when it was started here,
    else (an :class:`ExternalRedis`) a new local throw-away ``redis-server``, started and running.
    The caller stops what this returns when it is not ``redis``."""
    if getattr(redis, "external", True) is False:
        return redis
    return start_redis()

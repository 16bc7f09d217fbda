"""Child servers that die with their owner, and the stale ones of a killed owner found later.

Every server EmbedLab starts (``redis-server``, ``tritonserver``) is launched with
:func:`popen_kwargs`: a ``preexec_fn`` that asks Linux to send the child SIGKILL when the thread
that started it ends (``prctl(PR_SET_PDEATHSIG)``: the owner exiting, raising, or being
SIGKILLed), and an environment variable, ``EMBEDLAB_OWNER``, naming the owner (PID, start time,
node). The parent-death signal is tied to the starting *thread*: start servers from a thread that
lives as long as they should (the main thread, as everything here does).

A server whose owner is gone although the server runs (one started before this rule, or by a
process whose parent-death signal could not be set) is *stale*: :func:`stale_servers` finds those
of this user by the marker (or, for a server that overwrites its environment, by the ``.owner``
file of the folder it runs in), and :func:`describe` says which process it is and how to stop it.

Example:
    >>> import subprocess, sys
    >>> p = subprocess.Popen([sys.executable, "-c", "pass"], **popen_kwargs())
    >>> p.wait()
    0
    >>> stale_servers(("redis-server",)) == [] or True
    True
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from dataclasses import dataclass

__all__ = ["OWNER_ENV", "OWNER_FILE", "popen_kwargs", "StaleServer", "stale_servers", "describe"]

OWNER_ENV = "EMBEDLAB_OWNER"
_PR_SET_PDEATHSIG = 1


def _owner_tag() -> str:
    from .._io import _owner          # "<pid>.<start>@<node>": the format of the atomic writers' temporaries
    return _owner(os.getpid())


def _die_with(parent_pid: int):
    def preexec():
        # Runs in the child between fork and exec. If the parent is already gone the signal
        # would never come: exit at once instead.
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                os._exit(126)
        if os.getppid() != parent_pid:
            os._exit(126)
    return preexec


def popen_kwargs(env: dict | None = None) -> dict:
    """Keyword arguments for ``subprocess.Popen`` of a server that must die with this process.

    Args:
        env: the child's environment (default: this process's); the owner marker is added.

    Returns:
        ``{"preexec_fn": ..., "env": ...}``.

    Example:
        >>> sorted(popen_kwargs({"A": "1"})["env"])
        ['A', 'EMBEDLAB_OWNER']
    """
    env = dict(os.environ if env is None else env)
    env[OWNER_ENV] = _owner_tag()
    return {"preexec_fn": _die_with(os.getpid()), "env": env}


@dataclass(frozen=True)
class StaleServer:
    pid: int
    name: str           # the process's name (/proc/<pid>/comm)
    owner_pid: int      # the EmbedLab process that started it, no longer running
    cmdline: str


OWNER_FILE = ".owner"


def _marker(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(OWNER_ENV.encode() + b"="):
                    return item.split(b"=", 1)[1].decode(errors="replace")
    except OSError:
        pass
    # redis-server rewrites its process title over its environment; it runs in its folder, which
    # records the owner in OWNER_FILE.
    try:
        with open(os.path.join(os.readlink(f"/proc/{pid}/cwd"), OWNER_FILE)) as f:
            return f.read().strip()
    except OSError:
        return None


def stale_servers(names=("redis-server", "tritonserver")) -> list[StaleServer]:
    """This user's processes named ``names`` that an EmbedLab process started and that outlived it.

    Args:
        names: process names (``/proc/<pid>/comm``, at most 15 characters) to look for.

    Returns:
        One :class:`StaleServer` per such process (empty where ``/proc`` is missing).

    Example:
        >>> isinstance(stale_servers(), list)
        True
    """
    from .._io import _OWNER, _writer_gone
    if not os.path.isdir("/proc"):
        return []
    found, uid = [], os.getuid()
    wanted = {n[:15] for n in names}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if entry.stat().st_uid != uid:
                continue
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
            if name not in wanted:
                continue
            tag = _marker(pid)
            m = _OWNER.fullmatch((tag or "") + "-00000000")
            if not m or not _writer_gone(int(m["pid"]), int(m["start"]), m["node"]):
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found.append(StaleServer(pid, name, int(m["pid"]), cmd))
    return found


def describe(s: StaleServer) -> str:
    """One line: which stale server, whose, and the command that stops it.

    Example:
        >>> describe(StaleServer(42, "redis-server", 7, "redis-server 127.0.0.1:6379"))
        'a redis-server started by EmbedLab process 7, which is gone, is still running: pid 42 (redis-server 127.0.0.1:6379); stop it with `kill 42`'
    """
    return (f"a {s.name} started by EmbedLab process {s.owner_pid}, which is gone, is still running: "
            f"pid {s.pid} ({s.cmdline[:200]}); stop it with `kill {s.pid}`")

"""Files on disk: write-then-rename writers, and HugeCTR file lists.

Every writer in embedlab (data sets, checkpoints, sparse models, saved models, file lists) goes
through :func:`atomic_file`, :func:`atomic_dir` or :func:`atomic_set`: the work happens under a
hidden temporary name in the target's folder (same file system, so the final ``os.replace`` is
atomic) and is renamed into place only when the block exits cleanly; on an exception the
temporary is removed and the previous file or folder is left as it was. With ``fsync=True`` the
data (and the folder entry of the rename) is also flushed to the disk before and after the
rename, so the new contents survive a power loss, not only a crash of the process.

A writer that is killed (SIGKILL, power loss) cannot remove its temporary. Each temporary's name
therefore records its writer: ``.<name>.tmp-<pid>.<start>@<node>-<random>``, where ``<start>``
is the process's start time (Linux ``/proc``; 0 where unknown) and ``<node>`` the host name and
PID namespace. The next writer of the same target removes (and logs, on the ``embedlab.io``
logger) every temporary of that target whose writer is gone: same node, and the PID no longer
runs, or now belongs to a process that started at another time. Temporaries written on another
node are left alone (their writer's liveness cannot be seen from here).

A HugeCTR file list is a text file: the number of data files on line 1, then one path per line.
:func:`read_file_list` checks it and resolves relative paths; :func:`write_file_list` writes one.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import shutil
import socket
import uuid
from pathlib import Path
from typing import Sequence

__all__ = ["FormatError", "atomic_file", "atomic_dir", "atomic_set", "remove_stale_temporaries",
           "temporary_path", "read_file_list", "write_file_list"]

log = logging.getLogger("embedlab.io")


class FormatError(ValueError):
    """A corrupt, truncated or inconsistent data file or file list; the message names the file
    and the record or line."""


# ---- who wrote a temporary ------------------------------------------------------------------

def _proc_stat(pid: int):
    """(state, start time in clock ticks since boot) of `pid` from Linux's /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after the last ')'.
    fields = raw[raw.rindex(b")") + 2:].split()
    return fields[0].decode(), int(fields[19])


@functools.lru_cache(maxsize=None)
def _node() -> str:
    # The host name and the PID namespace: a PID means one process only within both.
    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "localhost"
    with contextlib.suppress(OSError):
        host += "+" + re.sub(r"\D", "", os.readlink("/proc/self/ns/pid"))
    return host


@functools.lru_cache(maxsize=8)
def _owner(pid: int) -> str:
    st = _proc_stat(pid)
    return f"{pid}.{st[1] if st else 0}@{_node()}"


def _tmp_name(path: Path, kind: str = "tmp") -> Path:
    # Hidden, unique, and in the same folder as the target so the rename never crosses devices;
    # the name records the writer (see the module docstring) so a later writer can tell whether
    # it is still running.
    return path.with_name(f".{path.name}.{kind}-{_owner(os.getpid())}-{uuid.uuid4().hex[:8]}")


def temporary_path(path) -> Path:
    """A temporary name for a writer of `path` that builds it in place of this module's writers.

    The name is hidden, unique, in `path`'s folder, and records this process as its writer, so
    :func:`remove_stale_temporaries` can remove it if the process is killed before renaming it.

    Args:
        path: the target file or folder.

    Returns:
        ``.<name>.tmp-<pid>.<start>@<node>-<random>`` beside `path`.

    Example:
        >>> temporary_path("/data/out").name.startswith(".out.tmp-")
        True
    """
    return _tmp_name(Path(path))


_OWNER = re.compile(r"(?P<pid>\d+)\.(?P<start>\d+)@(?P<node>[A-Za-z0-9._+-]+)-[0-9a-f]{8}")
_OWNER_UNTAGGED = re.compile(r"(?P<pid>\d+)-[0-9a-f]{8}")    # pid-only names: this node's


def _writer_gone(pid: int, start: int, node: str) -> bool:
    """True when the process that wrote a temporary has certainly ended."""
    if node != _node() or pid <= 0:
        return False
    st = _proc_stat(pid)
    if st is None:
        if os.path.isdir("/proc/self"):          # Linux: no /proc entry, no such process
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    state, started = st
    # A zombie has exited (only its parent has not collected it); a different start time means
    # the PID now belongs to another process.
    return state == "Z" or (start != 0 and started != start)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def remove_stale_temporaries(path) -> list[Path]:
    """Remove the temporaries of `path` that a killed writer left behind, and log each.

    A temporary ``.<name>.tmp-*`` (or ``.<name>.old-*``, the previous version moved aside) in
    `path`'s folder is stale when its writer ran on this node and has ended (see the module
    docstring). If `path` itself is missing and a stale ``.old-*`` holds the previous version
    (the writer died between its two renames), that version is renamed back into place instead.
    Every writer of this module calls this first; a writer that names its temporaries with
    another scheme can call it to the same effect only if it uses these names.

    Args:
        path: the target file or folder.

    Returns:
        The temporaries removed or restored.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / ".x.tmp-999999999.0@other-host-0123abcd").write_text("?")  # another node's
        >>> remove_stale_temporaries(d / "x")
        []
    """
    path = Path(path)
    done = []
    try:
        entries = sorted(os.scandir(path.parent), key=lambda e: e.name)
    except FileNotFoundError:
        return done
    for e in entries:
        for kind in ("tmp", "old"):
            prefix = f".{path.name}.{kind}-"
            if e.name.startswith(prefix):
                break
        else:
            continue
        rest = e.name[len(prefix):]
        m = _OWNER.fullmatch(rest)
        if m:
            pid, start, node = int(m["pid"]), int(m["start"]), m["node"]
        elif _OWNER_UNTAGGED.fullmatch(rest):
            pid, start, node = int(_OWNER_UNTAGGED.fullmatch(rest)["pid"]), 0, _node()
        else:
            continue
        if not _writer_gone(pid, start, node):
            continue
        p = Path(e.path)
        if kind == "old" and not os.path.lexists(path):
            try:
                os.replace(p, path)
            except OSError as err:
                log.warning("could not restore %s from %s (left by writer PID %d, no longer running): %s",
                            path, p, pid, err)
                continue
            log.warning("restored %s from %s: its writer (PID %d) was killed between moving the previous "
                        "version aside and moving the new one in", path, p.name, pid)
        else:
            _remove(p)
            log.warning("removed %s, a temporary of %s left by writer PID %d, which is no longer running",
                        p, path, pid)
        done.append(p)
    return done


# ---- the writers -----------------------------------------------------------------------------

def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    # Files first, then each folder (deepest first), so every entry is on disk before its parent.
    if not root.is_dir():
        _fsync_path(root)
        return
    for folder, _dirs, files in os.walk(root, topdown=False):
        for f in files:
            _fsync_path(Path(folder, f))
        _fsync_path(Path(folder))


def _prepare(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        remove_stale_temporaries(path)
    except OSError as e:                          # the write itself will say what is wrong
        log.warning("could not look for stale temporaries of %s: %s", path, e)


def _commit(targets: list[Path], tmps: list[Path], fsync: bool) -> None:
    """Move each temporary onto its target; on any failure put every target back as it was."""
    for t, tmp in zip(targets, tmps):
        if not os.path.lexists(tmp):
            raise FileNotFoundError(f"atomic write of {t}: the block wrote nothing to its temporary {tmp}")
        if fsync:
            _fsync_tree(tmp)
    done, pending = [], None        # (index, previous version moved aside or None)
    try:
        for i, (t, tmp) in enumerate(zip(targets, tmps)):
            old = None
            if os.path.lexists(t):
                old = _tmp_name(t, "old")
                os.replace(t, old)
            pending = (i, old)
            os.replace(tmp, t)
            done.append(pending)
            pending = None
    except BaseException:
        # Undo in reverse order: each new version goes back to its temporary (removed by the
        # caller's clean-up), each previous version back to its name.
        steps = ([(*pending, False)] if pending is not None else []) + [(i, old, True) for i, old in reversed(done)]
        for i, old, moved_in in steps:
            try:
                if moved_in:
                    os.replace(targets[i], tmps[i])
                if old is not None:
                    os.replace(old, targets[i])
            except OSError as err:
                log.warning("atomic write: could not put back the previous version of %s: %s", targets[i], err)
        raise
    for _i, old in done:
        if old is not None:
            _remove(old)
    if fsync:
        for folder in dict.fromkeys(t.parent for t in targets):
            _fsync_path(folder)


@contextlib.contextmanager
def atomic_set(paths: Sequence, *, fsync: bool = False):
    """Yield one temporary path per target; move them all into place if the block succeeds.

    The block creates a file or a folder at every temporary path. On success each target is
    replaced by its temporary, one rename each, in order; if a rename fails, the targets
    already replaced are put back as they were, so the set is all new or all old. On an
    exception in the block nothing is touched. (A process killed during the renames themselves,
    a window of microseconds, can leave part of the set new; the previous version of the target
    being renamed at that instant is restored by its next writer.)

    Args:
        paths: the final paths (distinct; their folders are created if missing).
        fsync: flush what was written to disk before the renames, and the folders after them.

    Returns:
        A context manager yielding the list of temporary `Path`s, in the order of `paths`.

    Raises:
        FileNotFoundError: the block left a temporary path empty (naming the target).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> with atomic_set([d / "a.bin", d / "b"]) as (ta, tb):
        ...     _ = ta.write_bytes(b"1"); tb.mkdir(); _ = (tb / "c").write_bytes(b"2")
        >>> sorted(p.name for p in d.iterdir())
        ['a.bin', 'b']
    """
    targets = [Path(p) for p in paths]
    if len(set(targets)) != len(targets):
        raise ValueError(f"atomic_set: the paths must be distinct, got {[str(t) for t in targets]}")
    for t in targets:
        _prepare(t)
    tmps = [_tmp_name(t) for t in targets]
    try:
        yield tmps
        _commit(targets, tmps, fsync)
    except BaseException:
        for tmp in tmps:
            _remove(tmp)
        raise


@contextlib.contextmanager
def atomic_file(path, *, fsync: bool = False):
    """Yield a temporary path next to `path`; rename it onto `path` if the block succeeds.

    Stale temporaries of `path` left by a killed writer are removed first (and logged).

    Args:
        path: the final file path (its folder is created if missing).
        fsync: flush the written file to disk before the rename and the folder after it.

    Returns:
        A context manager yielding the temporary `Path` to write to.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "x.bin"
        >>> with atomic_file(target, fsync=True) as tmp:
        ...     _ = tmp.write_bytes(b"abc")
        >>> target.read_bytes(), sorted(p.name for p in target.parent.iterdir())
        (b'abc', ['x.bin'])
    """
    with atomic_set([path], fsync=fsync) as (tmp,):
        yield tmp


@contextlib.contextmanager
def atomic_dir(path, *, fsync: bool = False):
    """Yield an empty temporary folder next to `path`; swap it into place on success.

    If `path` already exists it is replaced: the old folder is first renamed aside, the new one
    renamed in, then the old one deleted, so at every instant either the old or the new complete
    folder is at `path` (apart from the instant between the two renames; a writer killed there
    leaves the old folder aside, and the next writer renames it back). Stale temporaries of
    `path` left by a killed writer are removed first (and logged).

    Args:
        path: the final folder path.
        fsync: flush every file and folder written to disk before the swap, and the parent
            folder after it.

    Returns:
        A context manager yielding the temporary folder `Path`.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "model"
        >>> with atomic_dir(target) as tmp:
        ...     _ = (tmp / "w.bin").write_bytes(b"abc")
        >>> sorted(p.name for p in target.iterdir())
        ['w.bin']
    """
    with atomic_set([path], fsync=fsync) as (tmp,):
        tmp.mkdir()
        yield tmp


def write_file_list(path, files: Sequence) -> Path:
    """Write a HugeCTR file list: the number of files, then one path per line (atomic).

    Args:
        path: the list to write.
        files: the data files, written as given (`str` of each).

    Returns:
        `Path(path)`.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "a.data").write_bytes(b"")
        >>> write_file_list(d / "list.txt", ["a.data"]).read_text()
        '1\\na.data\\n'
    """
    files = [str(f) for f in files]
    with atomic_file(path) as tmp:
        Path(tmp).write_text(f"{len(files)}\n" + "".join(f + "\n" for f in files))
    return Path(path)


def read_file_list(path, *, check_exists: bool = True) -> list[Path]:
    """The data files of a HugeCTR file list (count line, then one path per line).

    A relative path names a file relative to the working directory if one is there (HugeCTR's
    rule), otherwise relative to the list's own folder.

    Args:
        path: the file list.
        check_exists: also check that every listed file exists.

    Returns:
        The listed files as `Path` objects, relative ones resolved as above.

    Raises:
        FormatError: a missing list, a bad count line, a count that disagrees with the lines, or
            (with `check_exists`) a listed file that does not exist (naming the list and the line).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "a.data").write_bytes(b"")
        >>> _ = (d / "list.txt").write_text("1\\na.data\\n")
        >>> read_file_list(d / "list.txt") == [d / "a.data"]
        True
    """
    path = Path(path)
    if not path.is_file():
        raise FormatError(f"file list {path} does not exist")
    lines = [l.strip() for l in path.read_text().splitlines() if l.strip()]
    if not lines or not lines[0].isdigit():
        raise FormatError(f"file list {path}: line 1 must be the number of files, got "
                          f"{lines[0] if lines else '(empty file)'!r}")
    count, listed = int(lines[0]), lines[1:]
    if count != len(listed):
        raise FormatError(f"file list {path}: line 1 says {count} files but lists {len(listed)}")
    files = []
    for i, f in enumerate(listed):
        as_is = Path(f)
        beside = as_is if as_is.is_absolute() else path.parent / as_is
        if as_is.is_file():
            files.append(as_is)
        elif beside.is_file() or not check_exists:
            files.append(beside)
        else:
            raise FormatError(f"file list {path}: line {i + 2}: data file {f} does not exist")
    return files

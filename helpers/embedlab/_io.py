"""Files on disk: write-then-rename writers, and HugeCTR file lists.

Every writer in embedlab (data sets, checkpoints, sparse models, saved models, file lists) goes
through :func:`atomic_file` or :func:`atomic_dir`: the work happens under a hidden temporary name
in the target's folder (same file system, so the final ``os.replace`` is atomic) and is renamed
into place only when the block exits cleanly; on an exception the temporary is removed and the
previous file or folder is left as it was. With ``fsync=True`` the data (and the folder entry
of the rename) is also flushed to the disk before and after the rename, so the new contents
survive a power loss, not only a crash of the process.

A HugeCTR file list is a text file: the number of data files on line 1, then one path per line.
:func:`read_file_list` checks it and resolves relative paths; :func:`write_file_list` writes one.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Sequence

__all__ = ["FormatError", "atomic_file", "atomic_dir", "read_file_list", "write_file_list"]


class FormatError(ValueError):
    """A corrupt, truncated or inconsistent data file or file list; the message names the file
    and the record or line."""


def _tmp_name(path: Path) -> Path:
    # Hidden, unique, and in the same folder as the target so the rename never crosses devices.
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    # Files first, then each folder (deepest first), so every entry is on disk before its parent.
    for folder, _dirs, files in os.walk(root, topdown=False):
        for f in files:
            _fsync_path(Path(folder, f))
        _fsync_path(Path(folder))


@contextlib.contextmanager
def atomic_file(path, *, fsync: bool = False):
    """Yield a temporary path next to `path`; rename it onto `path` if the block succeeds.

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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    try:
        yield tmp
        if fsync:
            _fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    if fsync:
        _fsync_path(path.parent)


@contextlib.contextmanager
def atomic_dir(path, *, fsync: bool = False):
    """Yield an empty temporary folder next to `path`; swap it into place on success.

    If `path` already exists it is replaced: the old folder is first renamed aside, the new one
    renamed in, then the old one deleted, so at every instant either the old or the new complete
    folder is at `path` (apart from the instant between the two renames).

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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    tmp.mkdir()
    try:
        yield tmp
        if fsync:
            _fsync_tree(tmp)
        if path.exists():
            old = _tmp_name(path)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if fsync:
        _fsync_path(path.parent)


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
        The listed files as `Path`s, relative ones resolved as above.

    Raises:
        FormatError naming the list and the line: a missing list, a bad count line, a count
        that disagrees with the lines, or (with `check_exists`) a listed file that does not exist.

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

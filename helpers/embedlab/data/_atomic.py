"""Write-then-rename helpers, so a crash never leaves a half-written file or folder.

Everything in `embedlab.data` that writes to disk goes through these two context managers:
the work happens under a temporary name in the same folder (same file system, so the final
`os.replace` is atomic) and is renamed into place only when the block exits cleanly.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path


def _tmp_name(path: Path) -> Path:
    # Hidden, unique, and in the same folder as the target so the rename never crosses devices.
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def atomic_file(path):
    """Yield a temporary path next to `path`; rename it onto `path` if the block succeeds.

    Args:
        path: the final file path (its folder is created if missing).

    Returns:
        A context manager yielding the temporary `Path` to write to.

    Example:
        >>> with atomic_file("/tmp/x.bin") as tmp:          # doctest: +SKIP
        ...     tmp.write_bytes(b"abc")
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def atomic_dir(path):
    """Yield an empty temporary folder next to `path`; swap it into place on success.

    If `path` already exists it is replaced: the old folder is first renamed aside, the new one
    renamed in, then the old one deleted, so at every instant either the old or the new complete
    folder is at `path` (apart from the instant between the two renames).

    Args:
        path: the final folder path.

    Returns:
        A context manager yielding the temporary folder `Path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    tmp.mkdir()
    try:
        yield tmp
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

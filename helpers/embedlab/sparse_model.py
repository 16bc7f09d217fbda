"""The one sparse-model format of the package: HugeCTR's and the HPS's ``key`` / ``emb_vector`` folder.

A sparse model is a folder holding

* ``key``: the table's keys, int64, native (little-endian) byte order, no header;
* ``emb_vector``: float32 x ``dim`` per key, in the same order, no header;
* ``slot_id`` (localized embeddings only): the slot each key belongs to, int64 per key.

1,000 keys at dim 16 are 8,000 + 64,000 bytes. The Session's ``download_params_to_files``,
the HPS training-export workflow (notebook 05) and the notebooks (a plugin layer's
``get_table()``, for instance) write sparse models with :func:`write_sparse_model`; the HPS
loader and the Session's ``embedding_files`` read them with :func:`read_sparse_model`, so what
those write is served by the HPS without conversion. Two writers keep formats of their own,
for state this one does not hold: the plugin layer's ``save`` (one checksummed file,
:mod:`embedlab.plugin.checkpoint`) and SOK's ``dump`` (tables with their optimizer slots,
:mod:`embedlab.sok.checkpoint`).

Writes are atomic and durable (a temporary folder, flushed to disk, then renamed into place:
a crash or a power loss leaves the previous model
intact); a failed write (a full disk, say) raises an `OSError` naming the file and keeping the
operating system's error number. Reads check that the files agree in length and with the
expected dim, and that no key appears twice (a reader could not tell which row is meant, and
the HPS's tiers would each pick a different one), and name the file and the sizes or the key
when they do not.

The files carry no header and no checksum: that is HugeCTR's format, read here as HugeCTR
reads it, so a flipped bit inside a vector is not detected. EmbedLab's own formats carry a
checksum (the plugin's checkpoint, SOK's dump).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._io import atomic_dir

KEY_FILE = "key"
VECTOR_FILE = "emb_vector"
SLOT_FILE = "slot_id"

__all__ = ["SparseModel", "SparseModelError", "write_sparse_model", "read_sparse_model",
           "sparse_model_info", "KEY_FILE", "VECTOR_FILE", "SLOT_FILE"]


class SparseModelError(ValueError):
    """A sparse-model folder is missing, truncated or inconsistent (the message names the file)."""


@dataclass
class SparseModel:
    """What :func:`read_sparse_model` returns.

    Attributes:
        keys: int64 ``[n]``.
        vectors: float32 ``[n, dim]``.
        slot_ids: int64 ``[n]`` for localized embeddings, else None.
    """
    keys: np.ndarray
    vectors: np.ndarray
    slot_ids: np.ndarray | None = None

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def __iter__(self):
        # Lets callers unpack: keys, vectors = read_sparse_model(path)[:2] or keys, vectors, slots = ...
        return iter((self.keys, self.vectors, self.slot_ids))


def _as_keys(name: str, a, n: int | None = None) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 1:
        raise SparseModelError(f"write_sparse_model: {name} must be 1-D, got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise SparseModelError(f"write_sparse_model: {name} must hold integers, got dtype {a.dtype}")
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise SparseModelError(f"write_sparse_model: {name} holds values above the int64 range")
    if n is not None and a.shape[0] != n:
        raise SparseModelError(f"write_sparse_model: {name} has {a.shape[0]} entries but keys has {n}")
    return a.astype("<i8", copy=False)


def _write_raw(path: Path, shown: Path, chunks) -> None:
    # Through a file object, not ndarray.tofile: a short write then raises with the OS's errno
    # (ENOSPC, EDQUOT, ...) instead of "N requested and M written". The close is inside the
    # try: the buffered tail is written there, and may be what fails.
    try:
        with open(path, "wb") as f:
            for a in chunks:
                f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
    except OSError as e:
        raise OSError(e.errno, f"cannot write {shown}: {e.strerror or e}") from e


def _first_duplicate(keys: np.ndarray):
    """The smallest key that appears more than once, and how many extra copies there are."""
    if keys.shape[0] < 2:
        return None, 0
    k = np.asarray(keys)
    if bool(np.all(k[1:] > k[:-1])):             # ascending: no duplicates, no sort needed
        return None, 0
    s = np.sort(k)
    same = s[1:] == s[:-1]
    if not same.any():
        return None, 0
    return int(s[1:][same][0]), int(same.sum())


def write_sparse_model(path, keys, vectors, slot_ids=None, *, check_unique: bool = True,
                       chunk_rows: int = 1 << 20, atomic: bool = True) -> Path:
    """Write one embedding table as a ``key`` / ``emb_vector`` (/ ``slot_id``) folder, atomically.

    Args:
        path: the folder to write (replaced as a whole if it exists; its parent is created).
        keys: integer array ``[n]`` (stored as int64).
        vectors: float array ``[n, dim]`` (stored as float32). May be a ``np.memmap``: it is
            copied in chunks of ``chunk_rows`` rows, so a table larger than memory can be written.
        slot_ids: optional integer array ``[n]``, the slot of each key (localized embeddings).
        check_unique: refuse duplicate keys (a reader could not tell which row is meant).
        chunk_rows: rows per write call.
        atomic: write through a temporary folder renamed into place (the default). With False,
            `path` must not exist and the files are written straight into it: for a caller that
            makes a larger write atomic itself (``embedlab._io.atomic_set`` over a set of models).

    Returns:
        The folder's ``Path``.

    Raises:
        SparseModelError: bad arrays (named), or a key that appears twice.
        OSError: a file could not be written (the message names it; ``errno`` is the OS's).

    Example:
        >>> import numpy as np, tempfile, os
        >>> d = os.path.join(tempfile.mkdtemp(), "table0")
        >>> _ = write_sparse_model(d, np.arange(3), np.ones((3, 4), np.float32))
        >>> sorted(os.listdir(d)), os.path.getsize(os.path.join(d, "emb_vector"))
        (['emb_vector', 'key'], 48)
    """
    keys = _as_keys("keys", keys)
    n = keys.shape[0]
    if not hasattr(vectors, "ndim"):
        vectors = np.asarray(vectors)
    if vectors.ndim != 2:
        raise SparseModelError(f"write_sparse_model: vectors must be [n, dim], got shape {tuple(vectors.shape)}")
    if vectors.shape[0] != n:
        raise SparseModelError(
            f"write_sparse_model: vectors has {vectors.shape[0]} rows but keys has {n} entries")
    if vectors.shape[1] < 1:
        raise SparseModelError("write_sparse_model: vectors must have dim >= 1")
    if np.dtype(vectors.dtype).kind != "f":
        raise SparseModelError(f"write_sparse_model: vectors must be floating point, got dtype {vectors.dtype}")
    slots = None if slot_ids is None else _as_keys("slot_ids", slot_ids, n)
    if check_unique and n:
        dup, extra = _first_duplicate(keys)
        if dup is not None:
            raise SparseModelError(
                f"write_sparse_model: key {dup} appears more than once ({extra} duplicates); "
                f"a sparse model holds one row per key")
    path = Path(path)

    def write_into(folder: Path):
        _write_raw(folder / KEY_FILE, path / KEY_FILE, [keys])
        _write_raw(folder / VECTOR_FILE, path / VECTOR_FILE,
                   (np.ascontiguousarray(vectors[lo:lo + chunk_rows], dtype="<f4") for lo in range(0, n, chunk_rows)))
        if slots is not None:
            _write_raw(folder / SLOT_FILE, path / SLOT_FILE, [slots])

    if atomic:
        with atomic_dir(path, fsync=True) as tmp:
            write_into(tmp)
    else:
        path.mkdir(parents=True)
        write_into(path)
    return path


def sparse_model_info(path, dim: int | None = None) -> tuple[int, int, bool]:
    """Checks a sparse-model folder's file sizes without reading the data.

    Args:
        path: the folder.
        dim: the expected vector size, or None to infer it (needs at least one key).

    Returns:
        ``(num_keys, dim, has_slot_id)``.

    Raises:
        SparseModelError: a file is missing, or the sizes disagree (the message names the file).
    """
    path = Path(path)
    if not path.is_dir():
        raise SparseModelError(f"sparse model {path} is not a folder (expected {KEY_FILE} and {VECTOR_FILE} in it)")
    kf, vf, sf = path / KEY_FILE, path / VECTOR_FILE, path / SLOT_FILE
    for f in (kf, vf):
        if not f.is_file():
            raise SparseModelError(f"sparse model {path}: file {f.name} is missing")
    kb, vb = kf.stat().st_size, vf.stat().st_size
    if kb % 8:
        raise SparseModelError(f"sparse model {path}: {KEY_FILE} has {kb} bytes, not a whole number of int64 keys "
                               f"(truncated?)")
    n = kb // 8
    if dim is None:
        if n == 0:
            if vb:
                raise SparseModelError(f"sparse model {path}: {KEY_FILE} is empty but {VECTOR_FILE} has {vb} bytes")
            raise SparseModelError(f"sparse model {path} holds no keys; pass dim= to read an empty table")
        if vb % (4 * n):
            raise SparseModelError(
                f"sparse model {path}: {VECTOR_FILE} has {vb} bytes, not a whole number of float32 vectors for "
                f"{n} keys (truncated, or the key/emb_vector pair does not belong together)")
        dim = vb // (4 * n)
        if dim < 1:
            raise SparseModelError(f"sparse model {path}: {VECTOR_FILE} is empty but {KEY_FILE} holds {n} keys")
    elif vb != 4 * n * dim:
        raise SparseModelError(
            f"sparse model {path}: {VECTOR_FILE} has {vb} bytes but {n} keys x dim {dim} x 4 bytes = "
            f"{4 * n * dim} (truncated, wrong dim, or the files do not belong together)")
    has_slot = sf.is_file()
    if has_slot and sf.stat().st_size != 8 * n:
        raise SparseModelError(
            f"sparse model {path}: {SLOT_FILE} has {sf.stat().st_size} bytes but {n} keys need {8 * n}")
    return int(n), int(dim), has_slot


def read_sparse_model(path, dim: int | None = None, *, mmap: bool = False,
                      check_unique: bool = True) -> SparseModel:
    """Read a ``key`` / ``emb_vector`` (/ ``slot_id``) folder, checking its sizes first.

    Args:
        path: the folder.
        dim: the expected vector size (checked), or None to infer it from the file sizes.
        mmap: map the files read-only instead of reading them (for tables larger than memory).
        check_unique: refuse a key that appears twice (the default). The check reads the keys
            once (8 bytes per row, also with `mmap`) and sorts a copy unless they are ascending.

    Returns:
        A :class:`SparseModel` (``keys`` int64 ``[n]``, ``vectors`` float32 ``[n, dim]``,
        ``slot_ids`` or None); it unpacks as ``keys, vectors, slot_ids``.

    Raises:
        SparseModelError: missing files, truncated files, sizes that disagree, or (with
            `check_unique`) a key that appears twice, named with the rows that hold it.

    Example:
        >>> import numpy as np, tempfile, os
        >>> d = os.path.join(tempfile.mkdtemp(), "t")
        >>> _ = write_sparse_model(d, [5, 7], np.eye(2, dtype=np.float32))
        >>> m = read_sparse_model(d); m.keys.tolist(), m.dim
        ([5, 7], 2)
    """
    path = Path(path)
    n, dim, has_slot = sparse_model_info(path, dim)
    if mmap and n:
        keys = np.memmap(path / KEY_FILE, dtype="<i8", mode="r", shape=(n,))
        vectors = np.memmap(path / VECTOR_FILE, dtype="<f4", mode="r", shape=(n, dim))
        slots = np.memmap(path / SLOT_FILE, dtype="<i8", mode="r", shape=(n,)) if has_slot else None
    else:
        keys = np.fromfile(path / KEY_FILE, dtype="<i8")
        vectors = np.fromfile(path / VECTOR_FILE, dtype="<f4").reshape(n, dim)
        slots = np.fromfile(path / SLOT_FILE, dtype="<i8") if has_slot else None
    if check_unique:
        dup, extra = _first_duplicate(keys)
        if dup is not None:
            rows = np.flatnonzero(np.asarray(keys) == dup)[:4].tolist()
            raise SparseModelError(
                f"sparse model {path}: {KEY_FILE} holds key {dup} more than once (rows {rows}; {extra} "
                f"duplicate{'s' if extra > 1 else ''} in all): a sparse model holds one row per key, so which "
                f"row is meant cannot be told")
    return SparseModel(keys, vectors, slots)

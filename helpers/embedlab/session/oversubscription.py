"""`ModelOversubscriber`: HugeCTR's model oversubscription, the `update(keyset)` that switches the
working tables from one pass's keys to the next (the rows live in each embedding's `HostStore`)."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..data.formats import read_keyset
from .embedding import KeyError_

__all__ = ["ModelOversubscriber"]


def _fixed_mmap_threshold(nbytes: int = 1 << 20):
    """Makes glibc serve allocations >= nbytes with their own mappings, returned to the OS when
    freed. glibc's default threshold rises to the largest block freed so far, after which the
    reader's per-file temporaries (tens of MB) stay in the heap and the resident set creeps up
    pass after pass; with oversubscription the resident set must track the working set.
    Process-wide (mallopt M_MMAP_THRESHOLD); glibc only, a no-op elsewhere."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").mallopt(-3, int(nbytes))
    except (OSError, AttributeError):
        pass


def _malloc_trim():
    """Gives the heap memory freed by a pass switch (and by the reader thread's arena) back to
    the OS, so that the resident set tracks the working set (glibc only; a no-op elsewhere)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class ModelOversubscriber:
    """HugeCTR's `ModelPrefetcher` / `ModelOversubscriber`: `update(keyset_file | [keyset_files])`.

    Writes the working rows of the previous pass (values and optimizer state) back to the host
    store and loads exactly the rows of the keysets' keys into the working tables. Keys of the
    keysets that no store holds yet (never trained) are admitted: they take a fresh row, with
    their initial vector, when training first meets them. A training key outside the loaded
    keysets is an error naming the key, the slot and the file list.
    """

    def __init__(self, session):
        self._s = session
        self.switches = []              # [{"bytes", "seconds", "keys"}] per update()

    def update(self, keyset_files):
        files = [keyset_files] if isinstance(keyset_files, (str, Path)) else list(keyset_files)
        if not files:
            raise ValueError("ModelOversubscriber.update: no keyset file given")
        kt = "int64" if self._s.solver.i64_input_key else "uint32"
        parts = []
        for f in files:
            if not Path(f).is_file():
                raise FileNotFoundError(f"ModelOversubscriber.update: keyset file {f} does not exist")
            parts.append(read_keyset(f, key_type=kt).astype(np.int64))
        keys = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if len(keys) > 1 and not bool(np.all(keys[1:] > keys[:-1])):
            keys = np.unique(keys)
        hashes = [e for e in self._s.embeddings if e.oversub]
        total_cap = sum(e.capacity for e in hashes)
        if len(keys) > total_cap:
            raise KeyError_(f"ModelOversubscriber.update: the keysets {files} hold {len(keys)} keys, more than "
                            f"the working tables hold together ({total_cap} = sum of "
                            "max_vocabulary_size_per_gpu); nothing was loaded")
        t0 = time.perf_counter()
        moved = 0
        for e in hashes:
            moved += e.load_keyset(keys, [str(f) for f in files])
        dt = time.perf_counter() - t0
        self.switches.append({"bytes": moved, "seconds": dt, "keys": int(len(keys))})
        _malloc_trim()
        return moved

"""`dump` / `load` (whole tables, gathered and re-sharded) and `export` / `assign` (this shard).

A dump is one folder, written by rank 0 into a temporary folder and renamed into place::

    meta_info                 JSON: tables (name, rows, dim, mode, kind), optimizer and its slots,
                              the number of workers that wrote it, and its own checksum
    <name>-key                int64 [n]       the global keys (row ids) of the table, ascending
    <name>-weight             float32 [n, dim]
    <name>-<optimizer>-<slot> float32 [n, dim] optimizer state, e.g. t0-Adam-momentum

Each array file starts with a 40-byte header: b"EMBLSOK2", rows, cols, dtype code (0 int64,
1 float32), the CRC-32 of the data bytes, all little-endian int64 after the magic. `meta_info`
holds ``"checksum"``: the CRC-32 of its other fields as compact JSON with sorted keys. `load`
checks sizes and both checksums, and that the keys ascend, and names the file when one fails,
so a flipped byte in a weight, an optimizer slot, a key or `meta_info` is refused, never
loaded. Dumps of format 1 (32-byte headers, b"EMBLSOK1", no checksums) still load; nothing in
them can be verified beyond their sizes.

`load` works with any number of workers (every worker reads the files and keeps its rows), so
a table dumped by 2 workers loads into 3. All workers must see the same folder (one machine,
or a shared file system).
"""
from __future__ import annotations

import errno as _errno
import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import tensorflow as tf

from .. import tables as _tables
from .._io import atomic_dir
from ..plugin.placement import distributed_owner
from . import _context, exchange
from .variable import is_sok_variable

__all__ = ["dump", "load", "export", "assign", "gather", "DumpFormatError"]

_MAGIC = b"EMBLSOK2"
_MAGIC_V1 = b"EMBLSOK1"             # format 1: 32-byte header, no checksum (read only)
_FORMAT = "embedlab.sok dump 2"
_FORMAT_V1 = "embedlab.sok dump 1"
_DTYPES = {0: np.int64, 1: np.float32}


class DumpFormatError(ValueError):
    """A dump file that is missing pieces, truncated or corrupt (the message names the file)."""


def _write_array(path: Path, a: np.ndarray) -> None:
    a = np.ascontiguousarray(a)
    code = 0 if a.dtype == np.int64 else 1
    if a.dtype not in (np.int64, np.float32):
        raise ValueError(f"embedlab.sok.dump: cannot write dtype {a.dtype} to {path}")
    rows = a.shape[0]
    cols = a.shape[1] if a.ndim == 2 else 1
    data = memoryview(a).cast("B")
    try:
        with open(path, "wb") as f:
            f.write(_MAGIC + struct.pack("<qqqq", rows, cols, code, zlib.crc32(data)))
            f.write(data)
    except OSError as e:
        raise OSError(e.errno, f"embedlab.sok.dump: cannot write {path}: {e.strerror or e}") from e


def _read_array(path: Path, version: int = 2) -> np.ndarray:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"embedlab.sok.load: {path} is missing")
    raw = path.read_bytes()
    magic, hsize = (_MAGIC, 40) if version == 2 else (_MAGIC_V1, 32)
    if len(raw) < hsize or raw[:8] != magic:
        raise DumpFormatError(f"embedlab.sok.load: {path} is not an embedlab.sok dump file of format {version} "
                              f"(bad header {raw[:8]!r}, expected {magic!r})")
    rows, cols, code = struct.unpack("<qqq", raw[8:32])
    if code not in _DTYPES or rows < 0 or cols < 1:
        raise DumpFormatError(f"embedlab.sok.load: {path} has a corrupt header (rows {rows}, cols {cols}, "
                              f"dtype {code})")
    dt = np.dtype(_DTYPES[code])
    if len(raw) != hsize + rows * cols * dt.itemsize:
        raise DumpFormatError(f"embedlab.sok.load: {path} holds {len(raw) - hsize} data bytes but its header says "
                              f"{rows} x {cols} {dt.name} ({rows * cols * dt.itemsize} bytes): truncated or corrupt")
    if version == 2:
        (crc,) = struct.unpack("<q", raw[32:40])
        got = zlib.crc32(memoryview(raw)[hsize:])
        if got != crc:
            raise DumpFormatError(f"embedlab.sok.load: {path} is corrupt: its data's CRC-32 is {got:#010x} but its "
                                  f"header says {crc:#010x}")
    a = np.frombuffer(raw, dtype=dt, offset=hsize)
    return a.reshape(rows, cols) if code == 1 else a.copy()


def _meta_checksum(meta: dict) -> int:
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def _read_meta(path: Path) -> tuple[dict, int]:
    """meta_info's contents and the dump's format version; DumpFormatError naming the file."""
    meta_path = path / "meta_info"
    if not meta_path.exists():
        raise FileNotFoundError(f"embedlab.sok.load: {meta_path} is missing (not an embedlab.sok dump)")
    try:
        meta = json.loads(meta_path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DumpFormatError(f"embedlab.sok.load: {meta_path} is corrupt: byte {e.start} is not UTF-8 "
                              f"({e.object[e.start:e.start + 1]!r})") from e
    except json.JSONDecodeError as e:
        raise DumpFormatError(f"embedlab.sok.load: {meta_path} is corrupt: not valid JSON ({e})") from e
    fmt = meta.get("format") if isinstance(meta, dict) else None
    if fmt not in (_FORMAT, _FORMAT_V1):
        raise DumpFormatError(f"embedlab.sok.load: {meta_path} is corrupt or not an embedlab.sok dump: format "
                              f"{fmt!r}, expected {_FORMAT!r}")
    version = 2 if fmt == _FORMAT else 1
    if version == 2 and meta.get("checksum") != _meta_checksum(meta):
        raise DumpFormatError(f"embedlab.sok.load: {meta_path} is corrupt: its CRC-32 is {_meta_checksum(meta):#010x} "
                              f"but it records {meta.get('checksum')!r}")
    tables = meta.get("tables")
    if not isinstance(tables, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                               for t in tables):
        raise DumpFormatError(f"embedlab.sok.load: {meta_path} is corrupt: 'tables' must be a list of tables "
                              f"with names, got {tables!r:.200}")
    return meta, version


def export(var):
    """(keys, values) of this worker's shard: global row ids (or hash-table keys) and rows."""
    if getattr(var, "is_dynamic", False):
        return var.export()
    if not is_sok_variable(var):
        raise ValueError(f"embedlab.sok.export: expected an embedlab.sok variable, got {type(var).__name__}")
    return tf.constant(var.global_rows_of_shard()), tf.convert_to_tensor(var.read_value())


def assign(var, keys, values):
    """Writes rows of this worker's shard: `keys` are global row ids this worker owns (or, for a
    DynamicVariable, keys it owns, inserted if new), `values` `[len(keys), dim]`."""
    keys = np.asarray(keys, dtype=np.int64).reshape(-1)
    values = np.asarray(values, dtype=np.float32)
    dim = int(var.shape[1])
    if values.shape != (keys.shape[0], dim):
        raise ValueError(f"embedlab.sok.assign: values of table '{var.table_name}' must be [{keys.shape[0]}, {dim}], "
                         f"got {list(values.shape)}")
    if getattr(var, "is_dynamic", False):
        return var.assign_keys(keys, values)
    local = _local_rows_of(var, keys, "embedlab.sok.assign")
    var.scatter_update(tf.IndexedSlices(tf.constant(values), tf.constant(local)))


def _local_rows_of(var, keys, where):
    n, r = var.num_workers, var.rank
    rows = var.global_shape[0]
    bad = (keys < 0) | (keys >= rows)
    if bad.any():
        raise ValueError(f"{where}: key {int(keys[bad][0])} is outside table '{var.table_name}' of {rows} rows")
    if var.kind == "distributed":
        owner, local = distributed_owner(keys, n)
        foreign = owner != r
        if foreign.any():
            raise ValueError(f"{where}: key {int(keys[foreign][0])} of table '{var.table_name}' lives on rank "
                             f"{int(owner[foreign][0])}, not on this rank {r}")
        return local
    if r != var.target_rank:
        raise ValueError(f"{where}: table '{var.table_name}' lives on rank {var.target_rank}, not on this rank {r}")
    return keys


def gather(var, shard_value=None):
    """(keys, rows) of the whole table, on every worker (collective). `shard_value`: a tensor
    shaped like the shard (an optimizer slot, say) to gather instead of the variable."""
    if getattr(var, "is_dynamic", False):
        k, v = var.export() if shard_value is None else (shard_value[0], shard_value[1])
        keys = tf.constant(np.asarray(k, np.int64))
        vals = tf.convert_to_tensor(v)
    else:
        keys = tf.constant(var.global_rows_of_shard())
        vals = tf.convert_to_tensor(var.read_value() if shard_value is None else shard_value)
    ks = exchange.all_gather_varying(keys)
    vs = exchange.all_gather_varying(vals)
    keys = np.concatenate([k.numpy() for k in ks]).astype(np.int64)
    vals = np.concatenate([v.numpy() for v in vs]).astype(np.float32)
    order = np.argsort(keys, kind="stable")
    return keys[order], vals[order].reshape(-1, int(var.shape[1]))


def _slot_items(var, optimizer):
    if optimizer is None:
        return []
    return sorted(optimizer.slots(var).items())


def barrier_status(ok: bool, what: str, err: BaseException | None = None):
    """Every worker learns whether the writing rank's write worked (and waits for it).

    A rank whose write failed raises a RuntimeError chained to its own error (`err`,
    ``__cause__``); the others raise one naming the first failing rank and its OS error
    (sent as a number: 0 fine, the errno of an OSError, -1 any other error).
    """
    code = 0 if ok else (err.errno if isinstance(err, OSError) and err.errno else -1)
    flags = exchange.all_gather(tf.constant([code], tf.int64)).numpy().reshape(-1)
    if not flags.any():
        return
    rank = _context.context().rank
    if not ok and err is not None:
        raise RuntimeError(f"embedlab.sok: {what} failed on rank {rank}: {err}") from err
    first = int(np.flatnonzero(flags)[0])
    c = int(flags[first])
    cause = (f"{_errno.errorcode.get(c, 'errno ' + str(c))}: {os.strerror(c)}" if c > 0
             else "an error that is not an OS error")
    raise RuntimeError(f"embedlab.sok: {what} failed on rank {first} ({cause}; that rank raised the full error)")


def dump(path, vars, optimizer=None):
    """Writes the whole tables (and the optimizer's slots) to the folder `path` (collective).

    Args:
        path: folder to write (replaced atomically if it exists).
        vars: list of `sok.Variable` / `sok.DynamicVariable` with distinct names.
        optimizer: None or the `sok.OptimizerWrapper` that trains them.

    Raises:
        RuntimeError: on every worker when the write fails (the folder keeps its previous
            version); on the writing rank (rank 0) chained to its own error (``__cause__``, e.g.
            an `OSError` naming the file with errno ENOSPC or ENOTDIR), on the others naming
            rank 0 and its OS error.

    Example (one worker; ``sok.init()`` first):
        >>> sok.dump("/tmp/ckpt", [v], opt)                         # doctest: +SKIP
        >>> sok.load("/tmp/ckpt", [v], opt)                         # doctest: +SKIP
    """
    vars = list(vars)
    names = [v.table_name for v in vars]
    if len(set(names)) != len(names):
        raise ValueError(f"embedlab.sok.dump: table names must be distinct, got {names}")
    ctx = _context.context()
    gathered = []
    for v in vars:
        keys, rows = gather(v)
        slots = []
        for sname, svar in _slot_items(v, optimizer):
            if getattr(v, "is_dynamic", False):
                sval = (v.export()[0], v.slot_rows(svar))
            else:
                sval = svar.read_value() if hasattr(svar, "read_value") else svar
            _, srows = gather(v, sval)
            slots.append((sname, srows))
        gathered.append((v, keys, rows, slots))
    ok, err = True, None
    if ctx.rank == 0:
        try:
            opt_name = optimizer.name if optimizer is not None else None
            meta = {"format": _FORMAT, "num_workers": ctx.world_size, "optimizer": opt_name, "tables": []}
            with atomic_dir(path, fsync=True) as tmp:
                tmp = Path(tmp)
                for v, keys, rows, slots in gathered:
                    _write_array(tmp / f"{v.table_name}-key", keys)
                    _write_array(tmp / f"{v.table_name}-weight", rows)
                    for sname, srows in slots:
                        _write_array(tmp / f"{v.table_name}-{opt_name}-{sname}", srows)
                    meta["tables"].append({
                        "name": v.table_name, "dim": int(v.shape[1]), "rows": int(keys.shape[0]),
                        "kind": "dynamic" if getattr(v, "is_dynamic", False) else v.kind,
                        "global_rows": None if getattr(v, "is_dynamic", False) else int(v.global_shape[0]),
                        "mode": v.mode, "slots": [s for s, _ in slots]})
                meta["checksum"] = _meta_checksum(meta)
                try:
                    (tmp / "meta_info").write_text(json.dumps(meta, indent=1))
                except OSError as e:
                    raise OSError(e.errno, f"embedlab.sok.dump: cannot write {tmp / 'meta_info'}: "
                                           f"{e.strerror or e}") from e
        except Exception as e:  # every worker must learn of it, or they would wait for rank 0
            ok, err = False, e
    barrier_status(ok, f"dump to {path}", err)


def load(path, vars, optimizer=None):
    """Reads a dump into the tables (and the optimizer's slots), re-sharding for this job's
    number of workers (collective). Checks every shape first and changes nothing on error.

    Raises:
        ValueError: naming the file, the table and both shapes when they differ.
        DumpFormatError: (a ValueError) naming the file when one is truncated or corrupt (a
            checksum differs, `meta_info` is not valid JSON, keys that do not ascend).
    """
    path = Path(path)
    vars = list(vars)
    meta, version = _read_meta(path)
    tables = {t["name"]: t for t in meta["tables"]}
    plan = []
    for v in vars:
        t = tables.get(v.table_name)
        if t is None:
            raise ValueError(f"embedlab.sok.load: table '{v.table_name}' is not in {path} (it holds {sorted(tables)})")
        keys = _read_array(path / f"{v.table_name}-key", version)
        rows = _read_array(path / f"{v.table_name}-weight", version)
        if keys.shape[0] > 1 and not bool(np.all(keys[1:] > keys[:-1])):
            i = int(np.flatnonzero(keys[1:] <= keys[:-1])[0])
            raise DumpFormatError(f"embedlab.sok.load: {path / (v.table_name + '-key')} is corrupt: keys must ascend, "
                                  f"but key {int(keys[i + 1])} at row {i + 1} follows {int(keys[i])}")
        dim = int(v.shape[1])
        if rows.shape[1] != dim or rows.shape[0] != keys.shape[0]:
            raise ValueError(f"embedlab.sok.load: {path / (v.table_name + '-weight')} is {list(rows.shape)} but table "
                             f"'{v.table_name}' has dim {dim} (and the key file {keys.shape[0]} keys)")
        dynamic = getattr(v, "is_dynamic", False)
        if not dynamic and t.get("global_rows") != v.global_shape[0]:
            raise ValueError(f"embedlab.sok.load: table '{v.table_name}' in {path} has {t.get('global_rows')} rows but "
                             f"the variable has {v.global_shape[0]} (shape {v.global_shape})")
        slots = []
        if optimizer is not None:
            optimizer.build(vars)
            for sname, svar in _slot_items(v, optimizer):
                f = path / f"{v.table_name}-{meta.get('optimizer')}-{sname}"
                if meta.get("optimizer") != optimizer.name:
                    raise ValueError(f"embedlab.sok.load: {path} holds {meta.get('optimizer')} state, the optimizer is "
                                     f"{optimizer.name}")
                srows = _read_array(f, version)
                if srows.shape != rows.shape:
                    raise ValueError(f"embedlab.sok.load: {f} is {list(srows.shape)}, expected {list(rows.shape)}")
                slots.append((svar, srows))
        plan.append((v, keys, rows, slots, dynamic))
    for v, keys, rows, slots, dynamic in plan:
        if dynamic:
            v.load_all(keys, rows, [(s, r) for s, r in slots])
            continue
        mine = _mine(v, keys)
        local = _local_rows_of(v, keys[mine], "embedlab.sok.load")
        full = np.zeros(v.shape.as_list(), np.float32)
        full[local] = rows[mine]
        _tables.assign(v, full)          # a placed shard (and its state) stays in its mapping
        for svar, srows in slots:
            s = np.zeros(v.shape.as_list(), np.float32)
            s[local] = srows[mine]
            _tables.assign(svar, s)


def _mine(v, keys):
    if v.kind == "distributed":
        return distributed_owner(keys, v.num_workers)[0] == v.rank
    return np.full(keys.shape, v.rank == v.target_rank)

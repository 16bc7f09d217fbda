"""HugeCTR's "Norm" binary data files, with their file lists and keysets.

Layout (little-endian, byte-compatible with HugeCTR's `DataReader`)::

    header   8 x int64 {error_check, number_of_records, label_dim, dense_dim, slot_num, 0, 0, 0}
    record   label_dim x float32, dense_dim x float32, then per slot: int32 nnz, nnz x key
             (key uint32 by default, int64 with key_type="int64")

With error_check=1 every record, the header included, is framed as `int32 length` (bytes of
the record), the record bytes, then one checksum byte: the record's bytes summed as signed chars,
wrapping (what HugeCTR's `CheckSum` reader verifies).

A file list (`write_file_list` / `read_file_list`) names the data files of
one training pass; a keyset holds the unique keys those files touch (model oversubscription).

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from embedlab.data import formats
    >>> p = Path(tempfile.mkdtemp()) / "a.data"
    >>> slots = [[3, 4], ([0, 2, 3], [7, 8, 9])]         # one key per record; a multi-hot slot
    >>> _ = formats.write_norm(p, [1.0, 0.0], [[0.5], [0.25]], slots)
    >>> d = formats.read_norm(p)
    >>> d.label.shape, d.dense.shape, d.slots[1][0].tolist(), d.slots[1][1].tolist()
    ((2, 1), (2, 1), [0, 2, 3], [7, 8, 9])
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..._io import FormatError, atomic_dir, atomic_file, write_file_list
from ..criteo.layout import LABEL
from .parquet import parquet_files, schema_columns

# The key types a Norm file or keyset may hold, by name (HugeCTR: uint32, or int64 with
# `i64_input_key`), as little-endian NumPy dtypes.
KEY_DTYPES = {"uint32": np.dtype("<u4"), "int64": np.dtype("<i8")}
_HEADER = struct.Struct("<8q")


def _as_slot(slot, n, i):
    """A slot given as 1-D keys (one per row) or (row_splits, values) -> (row_splits, values)."""
    if isinstance(slot, tuple) and len(slot) == 2:
        splits, values = np.asarray(slot[0], np.int64), np.asarray(slot[1])
        if splits.shape != (n + 1,) or splits[0] != 0 or np.any(np.diff(splits) < 0) \
                or splits[-1] != len(values):
            raise ValueError(f"write_norm: slot {i}: row_splits must be [{n + 1}], start at 0, "
                             f"be non-decreasing and end at len(values)={len(values)}")
        return splits, values
    keys = np.asarray(slot)
    if keys.ndim != 1 or len(keys) != n:
        raise ValueError(f"write_norm: slot {i}: expected {n} keys (one per record), "
                         f"got shape {keys.shape}")
    return np.arange(n + 1, dtype=np.int64), keys


def _frame(payload: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Checksum framing of records: int32 length, bytes, 1 checksum byte (signed-char sum)."""
    n = len(lengths)
    out = np.empty(len(payload) + 5 * n, dtype=np.uint8)
    out_start = starts + 5 * np.arange(n, dtype=np.int64)
    is_payload = np.ones(len(out), dtype=bool)
    pre = out_start[:, None] + np.arange(4)
    is_payload[pre.ravel()] = False
    chk_pos = out_start + 4 + lengths
    is_payload[chk_pos] = False
    out[is_payload] = payload
    out[pre.ravel()] = lengths.astype("<i4").view(np.uint8)
    # Sum of bytes mod 256 is the same bits for signed and unsigned chars.
    sums = np.add.reduceat(payload, starts, dtype=np.uint8) if n else np.empty(0, np.uint8)
    sums[lengths == 0] = 0
    out[chk_pos] = sums
    return out


def _checksum(b: np.ndarray) -> int:
    return int(b.sum(dtype=np.uint64)) & 0xFF


def write_norm(path, label, dense, slots, *, error_check: bool = True,
               key_type: str = "uint32") -> Path:
    """Write one HugeCTR Norm file, atomically.

    Args:
        path: output file.
        label: float array [n] or [n, label_dim].
        dense: float array [n, dense_dim] (dense_dim may be 0).
        slots: list over slots; each either a 1-D integer array [n] (one key per record) or a
            (row_splits [n+1], values) pair for multi-hot slots.
        error_check: write the checksum framing (HugeCTR `check: "Sum"`).
        key_type: "uint32" (HugeCTR default) or "int64" (`i64_input_key`).

    Returns:
        The output `Path`.

    Raises:
        ValueError: shapes that disagree, or keys that do not fit `key_type`.

    Example:
        >>> import tempfile
        >>> p = write_norm(Path(tempfile.mkdtemp()) / "t.data", [1.0, 0.0], [[0.5], [0.25]], [[3, 4]])
        >>> p.stat().st_size                  # framed header 69 + 2 framed records of 16 + 5 bytes
        111
    """
    header, body = norm_bytes(label, dense, slots, error_check=error_check, key_type=key_type)
    with atomic_file(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            f.write(body.tobytes())
    return Path(path)


def norm_bytes(label, dense, slots, *, error_check: bool, key_type: str):
    """The bytes of one Norm file, unwritten: what `write_norm` writes, for writers of their own.

    Args:
        label, dense, slots, error_check, key_type: as `write_norm` takes them.

    Returns:
        (header, body) as uint8 arrays; the file is their concatenation.

    Raises:
        ValueError: as `write_norm`.

    Example:
        >>> header, body = norm_bytes([1.0, 0.0], [[0.5], [0.25]], [[3, 4]], error_check=True,
        ...                           key_type="uint32")
        >>> len(header), len(body)
        (69, 42)
    """
    if key_type not in KEY_DTYPES:
        raise ValueError(f"write_norm: key_type must be 'uint32' or 'int64', got {key_type!r}")
    kdt = KEY_DTYPES[key_type]
    label = np.asarray(label, dtype=np.float32)
    label = label[:, None] if label.ndim == 1 else label
    if label.ndim != 2:
        raise ValueError(f"write_norm: label must be [n] or [n, label_dim], got {label.shape}")
    n, label_dim = label.shape
    dense = np.asarray(dense, dtype=np.float32)
    if dense.ndim == 1 and dense.size == 0:
        dense = dense.reshape(n, 0)
    if dense.ndim != 2 or dense.shape[0] != n:
        raise ValueError(f"write_norm: dense must be [{n}, dense_dim], got {dense.shape}")
    dense_dim = dense.shape[1]
    slots = [_as_slot(s, n, i) for i, s in enumerate(slots)]
    for i, (_, v) in enumerate(slots):
        if len(v) and (v.min() < 0 or v.max() > np.iinfo(kdt).max):
            raise ValueError(f"write_norm: slot {i} has key {v.min() if v.min() < 0 else v.max()}"
                             f" outside {key_type}; use key_type='int64' or re-encode keys")
    kw = kdt.itemsize // 4
    nnz = np.stack([np.diff(s) for s, _ in slots], axis=1) if slots else np.zeros((n, 0), np.int64)
    fixed = label_dim + dense_dim
    words_per = fixed + len(slots) + kw * nnz.sum(axis=1)
    rec_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(words_per, out=rec_start[1:])
    words = np.empty(int(rec_start[-1]), dtype="<u4")
    if fixed:
        pos = rec_start[:-1, None] + np.arange(fixed)
        words[pos.ravel()] = np.concatenate([label, dense], axis=1).view("<u4").ravel()
    cur = rec_start[:-1] + fixed
    for s, (splits, values) in enumerate(slots):
        words[cur] = nnz[:, s].astype("<i4").view("<u4")
        cnt = nnz[:, s] * kw
        total = int(cnt.sum())
        if total:
            first = np.repeat(cur + 1, cnt)
            within = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
            words[first + within] = values.astype(kdt).view("<u4")
        cur = cur + 1 + cnt
    header = np.frombuffer(_HEADER.pack(int(error_check), n, label_dim, dense_dim, len(slots),
                                        0, 0, 0), dtype=np.uint8)
    payload = words.view(np.uint8)
    if error_check:
        header = _frame(header, np.zeros(1, np.int64), np.array([64]))
        body = _frame(payload, rec_start[:-1] * 4, words_per * 4)
    else:
        body = payload
    return header, body


@dataclass
class NormData:
    """Contents of a Norm file: label [n, label_dim], dense [n, dense_dim], and per slot
    (row_splits [n+1] int64, keys). `error_check` says whether the file had checksums."""
    label: np.ndarray
    dense: np.ndarray
    slots: list
    error_check: bool


def read_header(path, raw: np.ndarray) -> tuple[bool, int, int, int, int, int]:
    """Parse and check the header of a Norm file's bytes (framing, checksum, sane sizes).

    Args:
        path: the file's name, for messages.
        raw: the file's bytes (at least the header) as a uint8 array.

    Returns:
        (error_check, records, label_dim, dense_dim, slot_num, byte offset of the first record).

    Raises:
        FormatError: a truncated or corrupt header, naming `path`.

    Example:
        >>> import tempfile
        >>> p = write_norm(Path(tempfile.mkdtemp()) / "t.data", [1.0, 0.0], [[0.5], [0.25]], [[3, 4]])
        >>> read_header(p, np.fromfile(p, np.uint8))
        (True, 2, 1, 1, 1, 69)
    """
    if len(raw) < 8:
        raise FormatError(f"{path}: truncated header: file has {len(raw)} bytes")
    first = int(raw[:8].view("<i8")[0])
    if first == 0:
        if len(raw) < 64:
            raise FormatError(f"{path}: truncated header: {len(raw)} of 64 bytes")
        hdr, pos, check = raw[:64], 64, False
    else:
        length = int(raw[:4].view("<i4")[0])
        if length != 64:
            raise FormatError(f"{path}: bad header: neither a raw header (error_check=0) nor a "
                              f"checksum-framed one (length prefix {length}, expected 64); "
                              "not a Norm file?")
        if len(raw) < 69:
            raise FormatError(f"{path}: truncated header: {len(raw)} of 69 bytes")
        hdr, pos, check = raw[4:68], 69, True
        if _checksum(hdr) != int(raw[68]):
            raise FormatError(f"{path}: header checksum mismatch (stored {int(raw[68])}, "
                              f"computed {_checksum(hdr)})")
    h = hdr.view("<i8")
    if int(h[0]) != int(check):
        raise FormatError(f"{path}: header error_check={int(h[0])} disagrees with the framing")
    n, label_dim, dense_dim, slot_num = (int(x) for x in h[1:5])
    if n < 0 or not (0 <= label_dim < 4096) or not (0 <= dense_dim < 1 << 20) \
            or not (0 <= slot_num < 1 << 20) or any(int(x) != 0 for x in h[5:8]):
        raise FormatError(f"{path}: bad header {h.tolist()}")
    return check, n, label_dim, dense_dim, slot_num, pos


def read_norm(path, *, key_type: str = "uint32") -> NormData:
    """Read and verify one HugeCTR Norm file.

    Checks the header, each record's length prefix and checksum (when the file has them),
    every nnz, the record count and trailing bytes. Files where every slot has one key per
    record are decoded fully vectorized; multi-hot files take a slower per-record walk.

    Args:
        path: the file.
        key_type: "uint32" or "int64" (not stored in the file; must match the writer).

    Returns:
        `NormData`.

    Raises:
        FormatError: naming the file and the record (0-based) and what is wrong.

    Example:
        >>> import tempfile
        >>> p = write_norm(Path(tempfile.mkdtemp()) / "t.data", [1.0, 0.0], [[0.5], [0.25]], [[3, 4]])
        >>> d = read_norm(p)
        >>> d.dense[:, 0].tolist(), d.slots[0][1].tolist(), d.error_check
        ([0.5, 0.25], [3, 4], True)
    """
    if key_type not in KEY_DTYPES:
        raise ValueError(f"read_norm: key_type must be 'uint32' or 'int64', got {key_type!r}")
    kdt = KEY_DTYPES[key_type]
    path = Path(path)
    raw = np.fromfile(path, dtype=np.uint8)
    check, n, label_dim, dense_dim, slot_num, pos = read_header(path, raw)
    fixed = 4 * (label_dim + dense_dim)
    ks = kdt.itemsize
    frame = 5 if check else 0
    one_hot = fixed + slot_num * (4 + ks)
    body = raw[pos:]
    # Fast path: every slot holds exactly one key, so records have one fixed size.
    if len(body) == n * (one_hot + frame) and n:
        recs = body.reshape(n, one_hot + frame)
        pay = recs[:, 4:4 + one_hot] if check else recs
        ok = True
        if check:
            lens = recs[:, :4].copy().view("<i4").ravel()
            sums = pay.sum(axis=1, dtype=np.uint64) & 0xFF
            bad = np.flatnonzero((lens != one_hot) | (sums != recs[:, -1]))
            if len(bad) and lens[bad[0]] == one_hot:
                r = int(bad[0])
                raise FormatError(f"{path}: record {r} (byte offset {pos + r * (one_hot + 5)}): "
                                  f"checksum mismatch (stored {int(recs[r, -1])}, computed "
                                  f"{int(sums[r])})")
            ok = not len(bad)
        if ok:
            slot_bytes = pay[:, fixed:].reshape(n, slot_num, 4 + ks)
            nnz = slot_bytes[:, :, :4].copy().view("<i4")[:, :, 0]
            if (nnz == 1).all():
                lab = pay[:, :4 * label_dim].copy().view("<f4")
                den = pay[:, 4 * label_dim:fixed].copy().view("<f4")
                keys = slot_bytes[:, :, 4:].copy().view(kdt)[:, :, 0]
                splits = np.arange(n + 1, dtype=np.int64)
                return NormData(lab, den, [(splits, keys[:, s].copy()) for s in range(slot_num)],
                                check)
    return _read_norm_walk(path, raw, check, n, label_dim, dense_dim, slot_num, pos, kdt)


def _read_norm_walk(path, raw, check, n, label_dim, dense_dim, slot_num, pos, kdt):
    """Record-by-record reader for multi-hot files (and for pinpointing corruption)."""
    fixed = 4 * (label_dim + dense_dim)
    ks = kdt.itemsize
    size = len(raw)
    lab = np.empty((n, label_dim), np.float32)
    den = np.empty((n, dense_dim), np.float32)
    nnzs = np.empty((n, slot_num), np.int64)
    key_parts = [[] for _ in range(slot_num)]
    buf = raw.tobytes()
    for r in range(n):
        start = pos
        if check:
            if pos + 4 > size:
                raise FormatError(f"{path}: truncated at record {r} (byte offset {pos}): "
                                  f"header promises {n} records, file ends after {r}")
            length = struct.unpack_from("<i", buf, pos)[0]
            if length < fixed + 4 * slot_num or pos + 4 + length + 1 > size:
                why = ("truncated" if length >= 0 and pos + 4 + length + 1 > size
                       else "bad length prefix")
                raise FormatError(f"{path}: record {r} (byte offset {pos}): {why} "
                                  f"(length {length}, {size - pos - 4} bytes left)")
            pos += 4
        if pos + fixed > size:
            raise FormatError(f"{path}: truncated at record {r} (byte offset {start})")
        lab[r] = np.frombuffer(buf, "<f4", label_dim, pos)
        den[r] = np.frombuffer(buf, "<f4", dense_dim, pos + 4 * label_dim)
        p = pos + fixed
        for s in range(slot_num):
            if p + 4 > size:
                raise FormatError(f"{path}: truncated at record {r} slot {s} (byte offset {p})")
            k = struct.unpack_from("<i", buf, p)[0]
            if k < 0 or p + 4 + k * ks > size:
                raise FormatError(f"{path}: record {r} slot {s} (byte offset {p}): bad nnz {k}")
            nnzs[r, s] = k
            key_parts[s].append(np.frombuffer(buf, kdt, k, p + 4))
            p += 4 + k * ks
        if check:
            if p - pos != length:
                raise FormatError(f"{path}: record {r} (byte offset {start}): length prefix "
                                  f"{length} but the record's fields take {p - pos} bytes")
            stored, got = buf[p], _checksum(raw[pos:p])
            if stored != got:
                raise FormatError(f"{path}: record {r} (byte offset {start}): checksum mismatch "
                                  f"(stored {stored}, computed {got})")
            p += 1
        pos = p
    if pos != size:
        raise FormatError(f"{path}: {size - pos} unexpected bytes after the {n} records the "
                          f"header announces (byte offset {pos})")
    slots = []
    for s in range(slot_num):
        splits = np.zeros(n + 1, np.int64)
        np.cumsum(nnzs[:, s], out=splits[1:])
        vals = np.concatenate(key_parts[s]) if n else np.empty(0, kdt)
        slots.append((splits, vals.astype(kdt)))
    return NormData(lab, den, slots, check)


def write_keyset(path, keys, *, key_type: str = "uint32") -> Path:
    """Write a keyset file: the unique keys, raw little-endian `key_type`, sorted (atomic)."""
    data = keyset_bytes(keys, key_type)
    with atomic_file(path) as tmp:
        data.tofile(tmp)
    return Path(path)


def keyset_bytes(keys, key_type: str) -> np.ndarray:
    """The contents of a keyset file (what `write_keyset` writes), unwritten.

    Args:
        keys: integer keys, any order, duplicates allowed. key_type: "uint32" or "int64".

    Returns:
        The sorted unique keys as a `KEY_DTYPES[key_type]` array (`.tobytes()` is the file).

    Raises:
        ValueError: a key outside `key_type`.

    Example:
        >>> keyset_bytes([5, 1, 5], "uint32").tolist()
        [1, 5]
    """
    kdt = KEY_DTYPES[key_type]
    keys = np.unique(np.asarray(keys))
    if len(keys) and (keys.min() < 0 or keys.max() > np.iinfo(kdt).max):
        raise ValueError(f"write_keyset: keys outside {key_type}")
    return keys.astype(kdt)


def read_keyset(path, *, key_type: str = "uint32") -> np.ndarray:
    """Read a keyset file written by `write_keyset` (or HugeCTR's criteo2hugectr)."""
    kdt = KEY_DTYPES[key_type]
    raw = np.fromfile(path, dtype=np.uint8)
    if len(raw) % kdt.itemsize:
        raise FormatError(f"{path}: {len(raw)} bytes is not a whole number of {key_type} keys")
    return raw.view(kdt).copy()


def parquet_to_norm(src, out_dir, *, samples_per_file: int = 40_960,
                    files_per_list: int | None = None, error_check: bool = True,
                    key_type: str = "uint32", prefix: str = "part",
                    slots: Sequence | None = None, dense: Sequence[str] | None = None,
                    progress: bool = True) -> list[Path]:
    """Convert parquet to HugeCTR Norm files + file list(s) + keyset(s), like criteo2hugectr.

    Writes `out_dir/<prefix>_<i>.data` of `samples_per_file` records each, then either one
    `file_list.txt` + `file_list.keyset` or, with `files_per_list`, `file_list.<k>.txt` +
    `file_list.<k>.keyset` per group of files (the model-oversubscription workflow). Keysets
    hold the unique keys the list's files touch. Paths in the lists are absolute. The folder is
    built under a temporary name and renamed into place.

    Args:
        src: parquet file(s) or folder. out_dir: output folder (replaced atomically).
        samples_per_file: records per data file (HugeCTR's tool uses 40,960).
        files_per_list: data files per file list, or None for a single list.
        error_check: checksum framing. key_type: "uint32" or "int64".
        slots: categorical columns in slot order (default: all integer/list columns). An
            entry that is itself a list of columns becomes ONE multi-hot slot holding those
            columns' keys, in that order (what criteo2hugectr does for Wide & Deep):
            `slots=[["C1_C2", "C3_C4"], "C1", ..., "C26"]` writes the 2-key wide slot first,
            then the 26 deep slots.
        dense: dense columns (default: all float columns except `label`).

    Returns:
        The file-list paths, in order.

    Example:
        >>> import tempfile
        >>> from embedlab.data.formats import write_parquet
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = write_parquet(d / "pq" / "part_0.parquet", {"label": np.zeros(5, np.float32),
        ...                   "I1": np.ones(5, np.float32), "C1": np.arange(5)})
        >>> lists = parquet_to_norm(d / "pq", d / "norm", samples_per_file=2, files_per_list=2,
        ...                         progress=False)
        >>> [p.name for p in lists], (d / "norm" / "file_list.1.txt").read_text().splitlines()[0]
        (['file_list.0.txt', 'file_list.1.txt'], '1')
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from .._progress import tqdm
    files = parquet_files(src)
    slots, slot_cols, dense = norm_columns(files[0], slots, dense)
    out_dir = Path(out_dir)
    lists = []
    with atomic_dir(out_dir) as tmp:
        data_files, keysets = [], []

        def emit(table):
            label, den, sl = norm_arrays(table, slots, dense, slot_cols)
            name = f"{prefix}_{len(data_files)}.data"
            write_norm(tmp / name, label, den, sl, error_check=error_check, key_type=key_type)
            data_files.append(name)
            keysets.append(unique_keys(sl))

        pending = None
        with tqdm(total=sum(pq.ParquetFile(f).metadata.num_rows for f in files), unit="rows",
                  desc="parquet -> Norm", disable=not progress, leave=False) as bar:
            for f in files:
                pf = pq.ParquetFile(f)
                for batch in pf.iter_batches(batch_size=samples_per_file,
                                             columns=[LABEL] + dense + slot_cols):
                    t = pa.Table.from_batches([batch])
                    pending = t if pending is None else pa.concat_tables([pending, t])
                    while len(pending) >= samples_per_file:
                        emit(pending.slice(0, samples_per_file))
                        pending = pending.slice(samples_per_file)
                    bar.update(len(batch))
            if pending is not None and len(pending):
                emit(pending)
        for k, g in enumerate(list_groups(len(data_files), files_per_list)):
            stem = list_stem(k, files_per_list)
            write_file_list(tmp / f"{stem}.txt", [out_dir / data_files[i] for i in g])
            write_keyset(tmp / f"{stem}.keyset", merge_keys([keysets[i] for i in g]),
                         key_type=key_type)
            lists.append(out_dir / f"{stem}.txt")
        (tmp / "norm_meta.json").write_text(norm_meta(slots, dense, key_type, error_check,
                                                       samples_per_file, data_files))
    return lists


# The steps of parquet_to_norm, public for conversions that run elsewhere (per part on a Dask
# cluster: criteo.etl_dask.parquet_to_norm) and must write the same bytes:
#   norm_columns (once) -> per data file: norm_arrays -> norm_bytes, unique_keys
#   -> per file list (list_groups, list_stem): merge_keys -> keyset_bytes -> norm_meta (once).

def norm_columns(first_file, slots, dense) -> tuple[list, list, list]:
    """The columns of a conversion: `parquet_to_norm`'s `slots` / `dense` defaults resolved.

    Args:
        first_file: the first parquet file (its schema gives the defaults).
        slots, dense: as `parquet_to_norm` takes them (None: every integer/list column, every
            float column but the label).

    Returns:
        (slots, slot_cols, dense): slots in slot order (a multi-hot slot is a list of columns),
        the distinct columns they read, in first-use order, and the dense columns.

    Raises:
        ValueError: an empty multi-hot slot, or no label column.

    Example:
        >>> import tempfile
        >>> from embedlab.data.formats import write_parquet
        >>> p = write_parquet(Path(tempfile.mkdtemp()) / "a.parquet", {"label": np.zeros(2, np.float32),
        ...                   "I1": np.ones(2, np.float32), "C1": np.arange(2), "C2": np.arange(2)})
        >>> norm_columns(p, [["C1", "C2"], "C1"], None)
        ([['C1', 'C2'], 'C1'], ['C1', 'C2'], ['I1'])
    """
    import pyarrow.parquet as pq
    cols = schema_columns(pq.read_schema(first_file))
    slots = ([list(c) if isinstance(c, (list, tuple)) else c for c in slots] if slots is not None
             else cols["sparse"] + cols["ragged"])
    for c in slots:
        if isinstance(c, list) and not c:
            raise ValueError("parquet_to_norm: a multi-hot slot must list at least one column")
    slot_cols = list(dict.fromkeys(x for c in slots for x in (c if isinstance(c, list) else [c])))
    dense = list(dense) if dense is not None else cols["dense"]
    if cols["label"] is None:
        raise ValueError(f"parquet_to_norm: {first_file} has no '{LABEL}' column")
    return slots, slot_cols, dense


def norm_arrays(table, slots, dense, slot_cols) -> tuple:
    """One data file's records from a pyarrow table, as `write_norm` / `norm_bytes` take them.

    Args:
        table: the rows (a `pyarrow.Table` holding the label, `dense` and `slot_cols`).
        slots, dense, slot_cols: from `norm_columns`.

    Returns:
        (label [n], dense [n, len(dense)], slots): a slot is a key array (one key per row) or a
        (row_splits, values) pair (list columns and multi-hot slots).

    Example:
        >>> import pyarrow as pa
        >>> t = pa.table({"label": [1.0], "I1": [0.5], "C1": [7], "C2": [9]})
        >>> label, dense, slots = norm_arrays(t, [["C1", "C2"]], ["I1"], ["C1", "C2"])
        >>> dense.tolist(), [a.tolist() for a in slots[0]]
        ([[0.5]], [[0, 2], [7, 9]])
    """
    import pyarrow as pa
    d = {c: table.column(c).combine_chunks() for c in [LABEL] + dense + slot_cols}

    def column(c):
        a = d[c]
        if pa.types.is_list(a.type) or pa.types.is_large_list(a.type):
            return (np.asarray(a.offsets, np.int64), np.asarray(a.flatten()))
        return a.to_numpy()

    sl = [column(c) if not isinstance(c, list) else _merge_slot([column(x) for x in c], len(table))
          for c in slots]
    den = (np.stack([d[c].to_numpy() for c in dense], axis=1) if dense
           else np.zeros((len(table), 0), np.float32))
    return d[LABEL].to_numpy(), den, sl


def unique_keys(sl) -> np.ndarray:
    """The sorted unique keys of one data file's slots (`norm_arrays`' third value).

    Example:
        >>> unique_keys([np.array([3, 1]), (np.array([0, 1, 2]), np.array([3, 8]))]).tolist()
        [1, 3, 8]
    """
    return (np.unique(np.concatenate([s[1] if isinstance(s, tuple) else s for s in sl]))
            if sl else np.empty(0))


def list_groups(n_files: int, files_per_list: int | None) -> list[list[int]]:
    """The data files (indices) of each file list: all in one, or `files_per_list` per list.

    Example:
        >>> list_groups(5, 2), list_groups(3, None)
        ([[0, 1], [2, 3], [4]], [[0, 1, 2]])
    """
    return ([list(range(n_files))] if not files_per_list else
            [list(range(i, min(i + files_per_list, n_files)))
             for i in range(0, n_files, files_per_list)])


def list_stem(k: int, files_per_list: int | None) -> str:
    """The name, without suffix, of file list `k` and its keyset (`.txt`, `.keyset`).

    Example:
        >>> list_stem(0, None), list_stem(3, 2)
        ('file_list', 'file_list.3')
    """
    return "file_list" if not files_per_list else f"file_list.{k}"


def merge_keys(keysets) -> np.ndarray:
    """The keys of one file list's keyset (int64, sorted, unique) from its files' `unique_keys`.

    Example:
        >>> merge_keys([np.array([1, 3]), np.array([3, 8])]).tolist()
        [1, 3, 8]
    """
    return (np.unique(np.concatenate(keysets)) if keysets else np.empty(0)).astype(np.int64)


def norm_meta(slots, dense, key_type, error_check, samples_per_file, data_files) -> str:
    """The text of a conversion's `norm_meta.json` (what `parquet_to_norm` wrote, for readers).

    Example:
        >>> import json
        >>> json.loads(norm_meta(["C1"], ["I1"], "uint32", True, 2, ["part_0.data"]))["files"]
        ['part_0.data']
    """
    return json.dumps({"slots": slots, "dense": dense, "label": LABEL, "key_type": key_type,
                       "error_check": bool(error_check), "samples_per_file": samples_per_file,
                       "files": data_files}, indent=1)


def _merge_slot(parts, n):
    """One multi-hot slot from several columns: per row, the keys of each column in order."""
    splits_l, vals_l = [], []
    for p in parts:
        if isinstance(p, tuple):
            splits_l.append(np.asarray(p[0], np.int64) - int(p[0][0]))
            vals_l.append(np.asarray(p[1]))
        else:
            splits_l.append(np.arange(n + 1, dtype=np.int64))
            vals_l.append(np.asarray(p))
    counts = np.stack([np.diff(sp) for sp in splits_l], axis=1)          # [n, k]
    splits = np.zeros(n + 1, np.int64)
    np.cumsum(counts.sum(axis=1), out=splits[1:])
    out = np.empty(int(splits[-1]), np.result_type(*[v.dtype for v in vals_l]))
    before = splits[:-1] + np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(counts, axis=1)[:, :-1]], axis=1).T
    for c, (sp, v) in enumerate(zip(splits_l, vals_l)):
        cnt = counts[:, c]
        pos = np.repeat(before[c], cnt) + (np.arange(int(cnt.sum())) - np.repeat(sp[:-1], cnt))
        out[pos] = v
    return splits, out


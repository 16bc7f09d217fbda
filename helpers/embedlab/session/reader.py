"""Data readers of the Session: HugeCTR Norm (and Raw, Parquet) file lists, streamed in batches.

A `DataReader` is pointed at a file list with `set_file_list_source(path)` (HugeCTR's ASCII
list: the number of files, then one path per line). A background thread reads the listed
files one at a time, verifies them (header against the JSON's Data layer, each record's length
and checksum with `check: "Sum"`, every nnz, `max_feature_num_per_sample`), cuts batches of
`batchsize` samples that run across file boundaries, and keeps a few batches ready in a
bounded queue. At most one file and a few batches are in memory, never the whole list.

A batch holds the label `[n, label_dim]`, the dense features `[n, dense_dim]` and, per sparse
input of the Data layer, its keys in sample-major CSR form: row `b * slot_num + s` holds the
keys of sample b in slot s. Keys are int64 whatever the file's key type (uint32 by default,
int64 with `i64_input_key`).

Errors (a missing file in the list, a corrupt record, a header that disagrees with the JSON)
are raised by the `next_batch()` that would have returned the batch, naming the file list, the
file and the record; no batch built from a bad record is ever returned.

The background threads never outlive the interpreter's orderly part: `close()` stops and joins
a reader's thread, and an `atexit` hook does it for every reader still reading when the script
ends (a reader restarted by `Session.evaluation()` reads ahead in the background). A daemon thread
left running would be inside the compiled decoder or hash table (the GIL released) when Python
finalizes; taking the GIL back then ends the thread by unwinding through C++ frames, and the
process aborts (`terminate called without an active exception`, exit status 134) after the
script's work is done.
"""
from __future__ import annotations

import atexit
import queue
import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from .. import _native
from .._io import read_file_list
from ..data.formats import FormatError, read_header
from .spec import DataSpec

__all__ = ["DataReader", "Batch", "FormatError", "read_norm_block", "read_file_list"]


@dataclass
class Block:
    """Decoded records of one file (or a slice of them)."""
    label: np.ndarray
    dense: np.ndarray
    sparse: list                     # per sparse input: (row_splits [n*S+1] int64, keys int64)
    slots: list                      # per sparse input: slot_num
    path: str
    first_record: int = 0

    def __len__(self):
        return self.label.shape[0]

    def slice(self, a, b):
        out = []
        for (splits, keys), s in zip(self.sparse, self.slots):
            lo, hi = splits[a * s], splits[b * s]
            out.append((splits[a * s:b * s + 1] - lo, keys[lo:hi]))
        return Block(self.label[a:b], self.dense[a:b], out, self.slots, self.path, self.first_record + a)


@dataclass
class Batch:
    """One batch: label, dense, per sparse input (row_splits, keys), and where it came from."""
    label: np.ndarray
    dense: np.ndarray
    sparse: list
    sources: list                     # [(file, first record in file, row in batch, count)]
    file_list: str
    extra: dict = field(default_factory=dict)   # what a pipeline stage recorded (KeyTranslation: rows)

    def __len__(self):
        return self.label.shape[0]

    def locate(self, row: int) -> str:
        """'file F, record R' of batch row `row` (a sample index)."""
        for f, rec, start, n in self.sources:
            if start <= row < start + n:
                return f"file {f}, record {rec + row - start}"
        return "unknown file"


def _concat(blocks, file_list):
    if len(blocks) == 1:
        b = blocks[0]
        return Batch(b.label, b.dense, b.sparse, [(b.path, b.first_record, 0, len(b))], file_list)
    label = np.concatenate([b.label for b in blocks])
    dense = np.concatenate([b.dense for b in blocks])
    sparse = []
    for i in range(len(blocks[0].sparse)):
        parts = [b.sparse[i] for b in blocks]
        offs = np.cumsum([0] + [p[1].shape[0] for p in parts])
        splits = np.concatenate([parts[0][0]] + [p[0][1:] + o for p, o in zip(parts[1:], offs[1:])])
        sparse.append((splits, np.concatenate([p[1] for p in parts])))
    sources, row = [], 0
    for b in blocks:
        sources.append((b.path, b.first_record, row, len(b)))
        row += len(b)
    return Batch(label, dense, sparse, sources, file_list)


_NORM_ERRORS = {   # csrc/core/norm_format.h NormStatus -> message (record r, slot s, offset o, values v, w)
    1: "truncated at record {r}{slot} (byte offset {o}): the header promises {n} records",
    2: "record {r} (byte offset {o}): bad length prefix {v} ({w} bytes left)",
    3: "record {r} (byte offset {o}): checksum mismatch (stored {v}, computed {w})",
    4: "record {r} slot {s} (byte offset {o}): bad nnz {v}",
    5: "record {r} slot {s}: the record's length prefix ends before its slots do",
    6: "record {r} slot {s}: nnz {v} runs past the record's length prefix",
    7: "record {r} (byte offset {o}): length prefix {v} but the record's fields take {w} bytes",
    8: "{v} unexpected bytes after the {n} records the header announces (byte offset {o})",
}


def read_norm_block(path, data: DataSpec, i64_key: bool) -> Block:
    """Decode and verify one Norm file against the Data layer `data`.

    The records are scanned, verified (length prefixes, checksums, nnz, the file's size) and
    copied out by the compiled decoder (`csrc/core/norm_format.h`, `decode_norm`), without the
    GIL; `embedlab.data.formats.read_norm` is the independent NumPy reader the tests compare it
    with.

    Raises:
        FormatError: naming the file, the record (0-based) and what is wrong.
    """
    raw = np.fromfile(path, dtype=np.uint8)
    check, n, ld, dd, sn, pos = read_header(path, raw)
    want_check = data.check == "Sum"
    if check != want_check:
        raise FormatError(f"{path}: the file {'has' if check else 'has no'} checksums but the Data "
                          f"layer says check: {data.check!r}")
    if (ld, dd, sn) != (data.label_dim, data.dense_dim, data.slot_num):
        raise FormatError(f"{path}: header says label_dim {ld}, dense_dim {dd}, slot_num {sn}; the "
                          f"Data layer {data.name!r} says {data.label_dim}, {data.dense_dim}, "
                          f"{data.slot_num} (the sum of its sparse inputs' slot_num)")
    inputs = [(inp.first_slot, inp.slot_num) for inp in data.sparse]
    err, label, dense, nnz, decoded = _native.core().decode_norm(
        raw, pos, n, ld, dd, sn, check, 8 if i64_key else 4, inputs)
    if err is not None:
        status, r, s, o, v, w = err
        msg = _NORM_ERRORS[status].format(r=r, s=s, o=o, v=v, w=w, n=n, slot=f" slot {s}" if s >= 0 else "")
        raise FormatError(f"{path}: {msg}")
    sparse, slots = [], []
    for inp, (splits, keys) in zip(data.sparse, decoded):
        per_sample = nnz[:, inp.first_slot:inp.first_slot + inp.slot_num].sum(axis=1)
        over = np.flatnonzero(per_sample > inp.max_feature_num_per_sample)
        if len(over):
            r = int(over[0])
            raise FormatError(f"{path}: record {r} has {int(per_sample[r])} keys in sparse input "
                              f"{inp.top!r}, more than its max_feature_num_per_sample "
                              f"{inp.max_feature_num_per_sample}")
        sparse.append((splits, keys))
        slots.append(inp.slot_num)
    return Block(label, dense, sparse, slots, str(path))


def read_raw_block(path, data: DataSpec, num_samples: int) -> Block:
    """HugeCTR "Raw": int32 {label, dense[dense_dim], key[slot_num]} per sample, one-hot.

    Keys are local to each slot and are offset by the slot's position in `slot_size_array`
    (as HugeCTR does); dense values get log(x + 1) unless `float_label_dense`.
    """
    rec = data.label_dim + data.dense_dim + data.slot_num
    raw = np.fromfile(path, dtype="<i4")
    if raw.size != num_samples * rec:
        raise FormatError(f"{path}: {raw.size * 4} bytes, but num_samples {num_samples} records of "
                          f"{rec} int32 take {num_samples * rec * 4}")
    m = raw.reshape(num_samples, rec)
    if data.float_label_dense:
        fl = m[:, :data.label_dim + data.dense_dim].view("<f4")
        label, dense = fl[:, :data.label_dim].copy(), fl[:, data.label_dim:].copy()
    else:
        label = m[:, :data.label_dim].astype(np.float32)
        dense = np.log1p(np.maximum(m[:, data.label_dim:data.label_dim + data.dense_dim], 0)
                         .astype(np.float32))
    keys = m[:, data.label_dim + data.dense_dim:].astype(np.int64)
    return _one_hot_block(path, data, label, dense, keys)


def _one_hot_block(path, data, label, dense, keys):
    ssa = np.asarray(data.slot_size_array, np.int64)
    bad = np.argwhere((keys < 0) | (keys >= ssa[None, :]))
    if len(bad):
        r, s = (int(x) for x in bad[0])
        raise FormatError(f"{path}: record {r} slot {s}: key {int(keys[r, s])} is outside the slot's "
                          f"slot_size_array range [0, {int(ssa[s])})")
    keys = keys + np.concatenate([[0], np.cumsum(ssa)[:-1]])[None, :]
    n = keys.shape[0]
    sparse, slots = [], []
    for inp in data.sparse:
        S = inp.slot_num
        k = keys[:, inp.first_slot:inp.first_slot + S].reshape(-1)
        sparse.append((np.arange(n * S + 1, dtype=np.int64), k.copy()))
        slots.append(S)
    return Block(label, dense, sparse, slots, str(path))


def read_parquet_block(path, data: DataSpec) -> Block:
    """HugeCTR "Parquet": label, dense (float) and one int64 column per slot (local ids, offset
    by `slot_size_array` as HugeCTR does). Columns are taken in file order: label_dim label
    columns, dense_dim dense columns, then slot_num key columns."""
    import pyarrow.parquet as pq
    try:
        t = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types
        raise FormatError(f"{path}: not a readable parquet file: {e}") from None
    need = data.label_dim + data.dense_dim + data.slot_num
    if t.num_columns < need:
        raise FormatError(f"{path}: {t.num_columns} columns; the Data layer needs {need} "
                          "(label, dense, one per slot)")
    cols = [t.column(i).to_numpy() for i in range(need)]
    label = np.stack(cols[:data.label_dim], 1).astype(np.float32)
    dense = (np.stack(cols[data.label_dim:data.label_dim + data.dense_dim], 1).astype(np.float32)
             if data.dense_dim else np.zeros((t.num_rows, 0), np.float32))
    keys = np.stack(cols[data.label_dim + data.dense_dim:], 1).astype(np.int64)
    if np.isnan(label).any() or np.isnan(dense).any():
        raise FormatError(f"{path}: NaN in label or dense columns")
    return _one_hot_block(path, data, label, dense, keys)


_END = object()

# Readers whose thread may be running; the thread's target holds its reader, so a reader stays
# here as long as its thread runs.
_LIVE: "weakref.WeakSet[DataReader]" = weakref.WeakSet()
_atexit_registered = False
_registry_lock = threading.Lock()


def _stop_all_readers():
    """Stops and joins every reader thread (at interpreter exit, before finalization)."""
    for r in list(_LIVE):
        r._shutdown()


def _track(reader):
    global _atexit_registered
    with _registry_lock:
        _LIVE.add(reader)
        if not _atexit_registered:
            # Registered when the first thread starts, after TensorFlow's own atexit hooks, so
            # (last in, first out) it runs before them.
            atexit.register(_stop_all_readers)
            _atexit_registered = True


class DataReader:
    """Streams batches from a file list in a background thread (see the module docstring).

    HugeCTR's `DataReader32` / `DataReader64`: `set_file_list_source(file_list)` (alias
    `set_source`) points it at a new list and restarts reading. With `repeat=False`,
    `next_batch()` returns None once the list is exhausted; with `repeat=True` it starts the
    list again. The last batch of a list may be smaller than `batchsize`.

    `stage`: a pipeline stage run on every batch in the background thread before it is queued
    (`stage(batch) -> batch`; the Session's training reader has its `KeyTranslation`). When
    `stage.stale(batch)` says a queued batch's result no longer holds (the tables were reloaded
    after it ran), `next_batch()` runs the stage on it again before handing it over.
    """

    def __init__(self, data: DataSpec, batchsize: int, i64_key: bool, repeat: bool, name: str,
                 default_source: str = "", prefetch: int = 4, raw_samples: int = 0, stage=None):
        self.data, self.batchsize, self.i64_key, self.repeat = data, int(batchsize), i64_key, repeat
        self.name, self.prefetch, self.raw_samples = name, prefetch, raw_samples
        self.stage = stage
        self.file_list = default_source
        self._thread = None
        self._stop = threading.Event()
        self._q: queue.Queue | None = None
        self._done = False
        self._files: list[str] | None = None
        self.batches_read = 0
        self.fresh = False             # started or restarted, nothing consumed yet

    @property
    def key_type(self):
        return "int64" if self.i64_key else "uint32"

    def set_file_list_source(self, file_list: str = ""):
        """Point the reader at `file_list` ('' = the JSON's source / eval_source) and start over.

        The list is checked here (it exists, its count line is right, every file exists);
        reading starts in the background at once.

        Raises:
            FormatError: a missing data file (naming the list and the line).
        """
        fl = str(file_list) if file_list else self.file_list
        if not fl:
            raise ValueError(f"{self.name}: no file list given and the Data layer names none")
        files = [str(f) for f in read_file_list(fl)]
        self._shutdown()
        self.file_list, self._files = fl, files
        self._done = False
        self.start()

    set_source = set_file_list_source

    def start(self):
        """Starts the background thread if it is not running (the first `next_batch` does too)."""
        if self._thread is not None or self._done:
            return
        if self._files is None:
            self._files = [str(f) for f in read_file_list(self.file_list)]
        self._stop = threading.Event()
        self._q = queue.Queue(maxsize=self.prefetch)
        self._thread = threading.Thread(target=self._run, args=(self._files, self.file_list, self._stop,
                                                                self._q), daemon=True,
                                        name=f"embedlab-{self.name}")
        _track(self)
        self._thread.start()
        self.fresh = True

    def _read(self, f):
        fmt = self.data.format
        if fmt == "Norm":
            return read_norm_block(f, self.data, self.i64_key)
        if fmt == "Raw":
            return read_raw_block(f, self.data, self.raw_samples)
        return read_parquet_block(f, self.data)

    def _run(self, files, file_list, stop, q):
        def put(item):
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            pending, have = [], 0
            while True:
                for f in files:
                    block = self._read(f)
                    a = 0
                    while a < len(block):
                        take = min(len(block) - a, self.batchsize - have)
                        pending.append(block.slice(a, a + take))
                        have += take
                        a += take
                        if have == self.batchsize:
                            if not put(self._finish(_concat(pending, file_list))):
                                return
                            pending, have = [], 0
                    if stop.is_set():
                        return
                if not self.repeat:
                    break
            if pending:
                if not put(self._finish(_concat(pending, file_list))):
                    return
            put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            if isinstance(e, FormatError) and file_list not in str(e):
                e = FormatError(f"file list {file_list}: {e}")
            put(e)

    def _finish(self, batch):
        return batch if self.stage is None else self.stage(batch)

    def next_batch(self) -> Batch | None:
        """The next batch, or None when the list is exhausted (repeat=False)."""
        if self._done:
            return None
        self.start()
        self.fresh = False
        item = self._q.get()
        if item is _END:
            self._done = True
            self._thread.join()
            self._thread = None
            return None
        if isinstance(item, BaseException):
            self._done = True
            self._thread.join()
            self._thread = None
            raise item
        self.batches_read += 1
        if self.stage is not None and self.stage.stale(item):
            item = self.stage(item)
        return item

    def restart(self):
        """Reads the current list again from its beginning (evaluation does this each time)."""
        self._shutdown()
        self._done = False
        self.start()

    def _shutdown(self):
        t = self._thread
        if t is not None:
            self._stop.set()
            if t is not threading.current_thread():
                # The thread checks the stop event between files and while it waits to hand over
                # a batch, so this waits at most for one file's decode and one translation.
                t.join()
            self._thread = None
        _LIVE.discard(self)

    def close(self):
        """Stops the background thread and waits for it to end (the reader can start again)."""
        self._shutdown()

    def __del__(self):
        try:
            self._shutdown()
        except Exception:  # noqa: BLE001
            pass

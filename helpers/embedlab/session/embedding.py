"""Sparse embeddings of the Session: hash tables of a fixed capacity, their optimizer state and
updates (the compiled EmbedLab optimizers, or `optimizer.TFOptimizer`), and the host store that
model oversubscription trains through.

A hash embedding (`DistributedSlotSparseEmbeddingHash`, `LocalizedSlotSparseEmbeddingHash`) maps
any int64 key to a row of a working table of `max_vocabulary_size_per_gpu` rows: the shared
concurrent `HashTable` (`embedlab.core().HashTable`) gives each new key the next free
row; a batch whose new keys would pass the capacity is refused (nothing inserted) with an error
naming the key, its slot and the file list. A key's initial vector depends only on the seed,
the embedding and the key (a counter-based hash, uniform in [-0.05, 0.05] as HugeCTR's), so
the same key starts from the same vector whichever row it lands in: this is what makes
oversubscribed training give the same tables as training with the whole table in memory.

The one-hot embedding (`LocalizedSlotSparseEmbeddingOneHot`) has no hash table: on one device
a key is its row, and it must lie in its slot's range of `slot_size_array` (HugeCTR's rule).

Model oversubscription (`HostStore`): the full table lives in two memory-mapped files under
`temp_embedding_dir` (values `[n, vec]` and optimizer state `[n, vec * slots]`, float32, grown by
doubling), with an in-memory `HashTable` from key to store row. A memory-mapped file was chosen
over RocksDB because every access here is a batch of whole rows: a pass switch gathers or
scatters tens of thousands of fixed-size rows with one NumPy fancy-indexing call each (no
per-key (de)serialization, no LSM compaction, no extra dependency), the OS pages the file in and
out, and `madvise(MADV_DONTNEED)` after each chunk keeps the process's resident set near the
working table's size. The key index stays in memory (about 32-64 bytes per key).
"""
from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

import numpy as np
import tensorflow as tf

from .. import _native, tables as _tables
from .._hashing import GAMMA, mix64
from .. import ops as el_ops
from .. import optimizers as el_opt
from .optimizer import TFOptimizer
from .spec import EmbeddingSpec

__all__ = ["Embedding", "HostStore", "init_values", "TFOptimizer", "KeyError_"]


class KeyError_(ValueError):
    """A key the embedding cannot place (capacity, keyset, one-hot range); names key, slot, list."""


def _hash_table(initial_capacity: int):
    core = _native.core()
    if not hasattr(core, "HashTable"):
        raise RuntimeError("embedlab.core() has no HashTable: this build of embedlab predates the "
                           "hash table; rebuild with `make setup`")
    return core.HashTable(max(1024, int(initial_capacity)))


_COL = np.uint64(0x94D049BB133111EB)      # odd multiplier spreading the column index


def init_values(keys, vec: int, seed: int, emb_index: int) -> np.ndarray:
    """Initial rows of `keys`: uniform in [-0.05, 0.05] (HugeCTR's hash-embedding range), a
    function of (seed, embedding, key, column) only (splitmix64's finalizer)."""
    keys = np.asarray(keys, np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        salt = np.uint64((int(seed) * 0x632BE59BD9B4E019 + (emb_index + 1) * 0x8CB92BA72F3D8DD7) % (1 << 64))
        z = mix64(keys[:, None] * GAMMA + (np.arange(vec, dtype=np.uint64)[None, :] + np.uint64(1)) * _COL + salt)
    u = (z >> np.uint64(40)).astype(np.float64) / float(1 << 24)
    return ((2.0 * u - 1.0) * 0.05).astype(np.float32)


# --------------------------------------------------------------------------------------
# Host store (oversubscription)
# --------------------------------------------------------------------------------------

_CHUNK = 1 << 16


class HostStore:
    """The whole table of one embedding under `temp_embedding_dir`: memory-mapped values and
    optimizer state, and a key -> store row index (see the module docstring)."""

    def __init__(self, directory, name: str, vec: int, nslots: int, seed: int, emb_index: int):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.vec, self.sw, self.seed, self.emb_index = vec, vec * nslots, seed, emb_index
        self.index = _hash_table(1 << 16)
        self.n_alloc = 0
        self.slot_ids = np.zeros(0, np.int64)
        self._paths = (self.dir / f"{name}.values.f32", self.dir / f"{name}.state.f32")
        for p in self._paths:
            with open(p, "wb"):
                pass
        self.values = self.state = None
        self._grow(1 << 12)

    def __len__(self):
        return int(self.index.size())

    @property
    def nbytes(self) -> int:
        return len(self) * (self.vec + self.sw) * 4

    def _map(self, path, width):
        if width == 0:
            return np.zeros((self.n_alloc, 0), np.float32)
        return np.memmap(path, dtype=np.float32, mode="r+", shape=(self.n_alloc, width))

    def _grow(self, need: int):
        if need <= self.n_alloc:
            return
        n = max(need, 2 * self.n_alloc, 1 << 12)
        self._release()
        self.values = self.state = None
        for p, w in zip(self._paths, (self.vec, self.sw)):
            os.truncate(p, n * w * 4)
        self.n_alloc = n
        self.values = self._map(self._paths[0], self.vec)
        self.state = self._map(self._paths[1], self.sw)
        self.slot_ids = np.concatenate([self.slot_ids, np.zeros(n - len(self.slot_ids), np.int64)])

    def _release(self):
        """Drops the mapped pages from this process's resident set (dirty pages stay in the page
        cache and reach the file; nothing is lost)."""
        for a in (self.values, self.state):
            mm = getattr(a, "_mmap", None)
            if mm is not None and hasattr(mm, "madvise"):
                mm.madvise(mmap.MADV_DONTNEED)

    def rows_for(self, keys, slots=None, init: bool = True) -> np.ndarray:
        """Store rows of unique `keys`, creating rows for new keys (initialized unless `init` is
        False: the caller writes them at once)."""
        keys = np.asarray(keys, np.int64)
        before = len(self)
        rows = self.index.find_or_insert(keys)
        after = len(self)
        if after > before:
            self._grow(after)
            new = rows >= before
            if init:
                nr, nk = rows[new], keys[new]
                for a in range(0, len(nr), _CHUNK):
                    r = nr[a:a + _CHUNK]
                    self.values[r] = init_values(nk[a:a + _CHUNK], self.vec, self.seed, self.emb_index)
                    if self.sw:
                        self.state[r] = 0.0
            if slots is not None:
                self.slot_ids[rows[new]] = np.asarray(slots)[new]
        return rows

    def find(self, keys) -> np.ndarray:
        return self.index.find(np.asarray(keys, np.int64))

    def gather(self, rows):
        return self.values[rows], self.state[rows]

    def scatter(self, rows, values, state):
        self.values[rows] = values
        if self.sw:
            self.state[rows] = state

    def export(self):
        keys, rows = self.index.export()
        return keys, rows

    def flush(self):
        for a in (self.values, self.state):
            if isinstance(a, np.memmap):
                a.flush()
        self._release()


# --------------------------------------------------------------------------------------
# The embedding
# --------------------------------------------------------------------------------------

class Embedding:
    """One sparse embedding of the model: working table, key -> row map, optimizer state.

    Args:
        spec: the parsed embedding. seed: initialization seed. oversubscribe: keep the full
            table in a `HostStore` under `store_dir` and train pass by pass.
    """

    # Global Adam is deferred (rows catch up on the steps they missed when read; every row at
    # least every GLOBAL_SYNC_EVERY steps); False runs the full pass at every step instead.
    DEFER_GLOBAL = True
    GLOBAL_SYNC_EVERY = 32

    def __init__(self, spec: EmbeddingSpec, seed: int, oversubscribe: bool = False, store_dir=None):
        self.spec, self.seed = spec, seed
        self.vec, self.capacity = spec.vec, spec.capacity
        self.name = spec.name
        self.S = spec.input.slot_num
        # 32 MiB and more on the CPU: a 2 MiB-aligned huge-page mapping of its own (`embedlab.tables`);
        # the lookups, the optimizers and the per-pass writes update it in place.
        self.table = tf.Variable(_tables.zeros([self.capacity, self.vec]), name=f"{spec.name}_table")
        o = spec.optimizer
        self.compiled = o.update_type != "Global" and o.type in ("Adam", "SGD")
        self.tfopt = TFOptimizer(o)
        if self.compiled:
            if o.type == "Adam":
                self.kopt = el_opt.Adam(o.learning_rate, beta_1=o.beta1, beta_2=o.beta2, epsilon=o.epsilon,
                                        name=f"{spec.name}_adam")
            else:
                self.kopt = el_opt.SGD(o.learning_rate, name=f"{spec.name}_sgd")
            self.kopt.build([self.table])
            self.slots = self.kopt.slot_variables(self.table)
        else:
            self.kopt = None
            self.slots = self.tfopt.make_slots([self.capacity, self.vec], spec.name, table=True)
        # Global Adam, deferred and exact (see `begin_step`): the step each row is current
        # through, and the learning rate of step j at lr_ring[j % GLOBAL_SYNC_EVERY].
        self.deferred_global = self.DEFER_GLOBAL and o.update_type == "Global" and o.type == "Adam"
        if self.deferred_global:
            self.last = tf.Variable(tf.zeros([self.capacity], tf.int64), trainable=False, name=f"{spec.name}_last")
            self.lr_ring = tf.Variable(tf.zeros([self.GLOBAL_SYNC_EVERY]), trainable=False, name=f"{spec.name}_lrs")
        self.lock = threading.Lock()
        self.one_hot = spec.one_hot
        if self.one_hot:
            ssa = np.asarray(spec.slot_size_array, np.int64)
            self.slot_lo = np.concatenate([[0], np.cumsum(ssa)[:-1]])
            self.slot_hi = self.slot_lo + ssa
            self.keys_table = None
        else:
            self.keys_table = _hash_table(min(self.capacity, 1 << 20))
        self.row_keys = np.zeros(self.capacity if not self.one_hot else 0, np.int64)
        self.row_slots = np.zeros(self.capacity if not self.one_hot else 0, np.int64)
        self.watermark = 0               # rows [0, watermark) hold initialized values
        self.oversub = bool(oversubscribe)
        self.store = (HostStore(store_dir, f"emb{spec.index}_{spec.name}", self.vec, len(self.slots), seed,
                                spec.index) if self.oversub else None)
        self.admitted = np.empty(0, np.int64)   # keyset keys absent from the store (oversubscription)
        self.keysets = []
        self.loaded = False
        self.generation = 0

    @property
    def rows_in_use(self) -> int:
        """Rows a training step may have touched, every row of a one-hot table, else the rows
        handed out so far (the watermark). A Global update skips the rows past it."""
        return self.capacity if self.one_hot else self.watermark

    # ---- key -> row translation ------------------------------------------------------

    def _slot_of(self, splits, pos):
        """Slot (within this input) and sample of the key at position pos of a batch's keys."""
        row = int(np.searchsorted(splits, pos, side="right") - 1)
        return row % self.S, row // self.S

    def translate_train(self, splits, keys, batch):
        """Rows of a training batch's keys (inserting new ones); raises ``EmbeddingKeyError``."""
        if self.one_hot:
            return self._one_hot_rows(splits, keys, batch)
        with self.lock:
            if self.oversub:
                if not self.loaded:
                    raise KeyError_(f"embedding {self.name!r}: no keyset loaded; call "
                                    "get_model_oversubscriber().update(keyset_file) before training on "
                                    f"file list {batch.file_list}")
                rows = self.keys_table.find(keys)
                miss = np.flatnonzero(rows < 0)
                if len(miss):
                    mk = keys[miss]
                    pos = np.searchsorted(self.admitted, mk)
                    pos = np.minimum(pos, max(len(self.admitted) - 1, 0))
                    ok = (self.admitted[pos] == mk) if len(self.admitted) else np.zeros(len(mk), bool)
                    if not ok.all():
                        j = int(miss[np.flatnonzero(~ok)[0]])
                        slot, sample = self._slot_of(splits, j)
                        raise KeyError_(
                            f"embedding {self.name!r}: key {int(keys[j])} of slot {slot} (sparse input "
                            f"{self.spec.input.top!r}; {batch.locate(sample)}) in file list "
                            f"{batch.file_list} is not in the loaded keysets ({self.keysets}); "
                            "nothing was trained on this batch")
                    self._insert(mk, splits, keys, miss, batch)
                    rows = self.keys_table.find(keys)
                return rows
            return self._insert(keys, splits, keys, np.arange(len(keys)), batch)

    def _insert(self, new_keys, splits, keys, pos_in_batch, batch):
        before = int(self.keys_table.size())
        try:
            rows = self.keys_table.find_or_insert(new_keys, max_size=self.capacity)
        except ValueError:
            found = self.keys_table.find(new_keys)
            fresh = new_keys[found < 0]
            _, first = np.unique(fresh, return_index=True)
            fresh_in_order = fresh[np.sort(first)]
            k = int(fresh_in_order[self.capacity - before])
            j = int(pos_in_batch[np.flatnonzero(new_keys == k)[0]])
            slot, sample = self._slot_of(splits, j)
            raise KeyError_(
                f"embedding {self.name!r}: key {k} of slot {slot} (sparse input {self.spec.input.top!r}; "
                f"{batch.locate(sample)}) in file list {batch.file_list} does not fit: the table already "
                f"holds {before} distinct keys and max_vocabulary_size_per_gpu is {self.capacity}; "
                "nothing was inserted or trained on this batch") from None
        after = int(self.keys_table.size())
        if after > before:
            new = rows >= before
            self.row_keys[rows[new]] = new_keys[new]
            p = pos_in_batch[new]
            sample_rows = np.searchsorted(splits, p, side="right") - 1
            self.row_slots[rows[new]] = sample_rows % self.S
        return rows if len(new_keys) == len(keys) else None

    def _one_hot_rows(self, splits, keys, batch):
        rows_of = np.repeat(np.arange(len(splits) - 1), np.diff(splits))
        slot = rows_of % self.S
        bad = np.flatnonzero((keys < self.slot_lo[slot]) | (keys >= self.slot_hi[slot]))
        if len(bad):
            j = int(bad[0])
            s = int(slot[j])
            raise KeyError_(
                f"embedding {self.name!r}: key {int(keys[j])} of slot {s} ({batch.locate(int(rows_of[j]) // self.S)}) "
                f"in file list {batch.file_list} is outside the slot's slot_size_array range "
                f"[{int(self.slot_lo[s])}, {int(self.slot_hi[s])})")
        return keys.copy()

    def translate_eval(self, keys):
        """Rows of evaluation keys; keys not in the working table (or not yet initialized) -> -1."""
        if self.one_hot:
            return np.where((keys >= 0) & (keys < self.capacity), keys, -1)
        with self.lock:
            rows = self.keys_table.find(keys)
            wm = self.watermark
        return np.where(rows < wm, rows, -1)

    def pending_init(self, rows_in_batch=None):
        """(rows, values) of the rows a batch needs initialized: every row below the batch's
        highest row not yet initialized (rows are handed out in translation order, so these are
        the batch's new keys and, at most, a few of prefetched batches). Advances the watermark."""
        if self.one_hot:
            return np.empty(0, np.int64), np.empty((0, self.vec), np.float32)
        with self.lock:
            upto = self.watermark
            if rows_in_batch is not None and len(rows_in_batch):
                upto = max(upto, int(rows_in_batch.max()) + 1)
            rows = np.arange(self.watermark, upto, dtype=np.int64)
            keys = self.row_keys[self.watermark:upto].copy()
            self.watermark = upto
        return rows, init_values(keys, self.vec, self.seed, self.spec.index)

    # ---- loading and exporting -------------------------------------------------------

    def load_model(self, keys, vectors, slot_ids=None):
        """Loads a stored sparse model (keys + vectors) as the starting table."""
        keys = np.asarray(keys, np.int64)
        vectors = np.asarray(vectors, np.float32)
        if self.one_hot:
            bad = np.flatnonzero((keys < 0) | (keys >= self.capacity))
            if len(bad):
                raise KeyError_(f"embedding {self.name!r}: stored key {int(keys[bad[0]])} is outside the "
                                f"one-hot table of {self.capacity} rows")
            self.table.scatter_update(tf.IndexedSlices(vectors, keys))
            self._mark_current()
            return
        if self.oversub:
            if len(np.unique(keys)) != len(keys):
                raise KeyError_(f"embedding {self.name!r}: the stored model repeats keys")
            rows = self.store.rows_for(keys, slot_ids)
            for a in range(0, len(keys), _CHUNK):
                self.store.values[rows[a:a + _CHUNK]] = vectors[a:a + _CHUNK]
            self.store.flush()
            return
        with self.lock:
            if len(np.unique(keys)) + int(self.keys_table.size()) > self.capacity:
                raise KeyError_(f"embedding {self.name!r}: the stored model holds {len(keys)} keys, more than "
                                f"max_vocabulary_size_per_gpu {self.capacity}")
            rows = self.keys_table.find_or_insert(keys, max_size=self.capacity)
            self.row_keys[rows] = keys
            if slot_ids is not None:
                self.row_slots[rows] = slot_ids
            self.watermark = int(self.keys_table.size())
        self.table.scatter_update(tf.IndexedSlices(tf.constant(vectors), tf.constant(rows)))
        self._mark_current()

    def export(self):
        """(keys, vectors, slot_ids or None) of the whole table (with oversubscription: the store)."""
        localized = self.spec.localized
        self.sync()
        if self.one_hot:
            keys = np.arange(self.capacity, dtype=np.int64)
            slots = np.searchsorted(self.slot_hi, keys, side="right")
            return keys, self.table.numpy(), slots
        if self.oversub:
            self.write_back()
            keys, rows = self.store.export()
            order = np.argsort(rows)
            keys, rows = keys[order], rows[order]
            vals = self.store.values[:len(keys)]
            return keys, vals, (self.store.slot_ids[:len(keys)] if localized else None)
        with self.lock:
            keys, rows = self.keys_table.export()
            keep = rows < self.watermark            # rows a training step has initialized
        keys, rows = keys[keep], rows[keep]
        order = np.argsort(rows)
        keys, rows = keys[order], rows[order]
        vals = self.table[:len(rows)].numpy() if len(rows) else np.zeros((0, self.vec), np.float32)
        return keys, vals, (self.row_slots[rows].copy() if localized else None)

    # ---- oversubscription ------------------------------------------------------------

    def write_back(self):
        """Writes the working rows (values and optimizer state) to the store. Returns bytes moved."""
        if not self.oversub or not self.loaded:
            return 0
        self.sync()
        with self.lock:
            n = self.watermark
            keys = self.row_keys[:n].copy()
            slots = self.row_slots[:n].copy()
        moved = 0
        srows = self.store.rows_for(keys, slots, init=False)      # every row is written below
        for a in range(0, n, _CHUNK):
            b = min(a + _CHUNK, n)
            # sparse_read of a row range: `var[a:b]` would read (copy) the whole table first
            idx = tf.range(a, b, dtype=tf.int64)
            vals = self.table.sparse_read(idx).numpy()
            st = (np.concatenate([s.sparse_read(idx).numpy() for s in self.slots], axis=1) if self.slots
                  else np.zeros((b - a, 0), np.float32))
            self.store.scatter(srows[a:b], vals, st)
            moved += vals.nbytes + st.nbytes
        self.store._release()
        return moved

    def load_keyset(self, keys, keyset_names):
        """Writes back the previous pass and loads this embedding's rows of `keys`. Returns bytes moved."""
        moved = self.write_back()
        keys = np.asarray(keys, np.int64)
        if len(keys) > 1 and not bool(np.all(keys[1:] > keys[:-1])):   # keysets come sorted and unique
            keys = np.unique(keys)
        srows = self.store.find(keys)
        have = srows >= 0
        known, krows = keys[have], srows[have]
        if len(known) > self.capacity:
            raise KeyError_(f"embedding {self.name!r}: the keysets {keyset_names} name {len(known)} keys of "
                            f"this embedding, more than its max_vocabulary_size_per_gpu {self.capacity}; "
                            "nothing was loaded")
        order = np.argsort(krows)                 # read the store in file order
        known, krows = known[order], krows[order]
        with self.lock:
            self.keys_table.clear()
            if len(known):
                rows = self.keys_table.find_or_insert(known)
                assert rows[-1] == len(known) - 1
            self.row_keys[:len(known)] = known
            self.row_slots[:len(known)] = self.store.slot_ids[krows]
            self.watermark = len(known)
            self.admitted = keys[~have]
            self.keysets = keyset_names
            self.loaded = True
            self.generation += 1
        for a in range(0, len(known), _CHUNK):
            b = min(a + _CHUNK, len(known))
            vals, st = self.store.gather(krows[a:b])
            self.table[a:b].assign(vals)
            c = 0
            for s in self.slots:
                s[a:b].assign(st[:, c:c + self.vec])
                c += self.vec
            moved += vals.nbytes + st.nbytes
        self.store._release()
        self._mark_current()
        return moved

    def _mark_current(self):
        """Deferred Global Adam: rows just written from outside (a load) are current as of now."""
        if self.deferred_global:
            self.last.assign(tf.fill([self.capacity], self.tfopt.step.read_value()))

    # ---- training-step pieces (called inside tf.function) ----------------------------

    def lookup(self, splits, rows, train: bool):
        ids = tf.RaggedTensor.from_row_splits(rows, splits, validate=False)
        if train and self.compiled:
            out = el_ops.fused_embedding_lookup([self.table], [ids], [self.spec.combiner], optimizer=self.kopt)[0]
        else:
            out = el_ops.embedding_lookup(self.table, ids, combiner=self.spec.combiner)
        return tf.reshape(out, [-1, self.S, self.vec])

    def init_rows(self, rows, values):
        self.table.scatter_update(tf.IndexedSlices(values, rows))
        for s in self.slots:
            s.scatter_update(tf.IndexedSlices(tf.zeros_like(values), rows))
        if self.deferred_global:        # fresh rows are current (zero state: nothing to replay)
            self._set_last(rows, self.tfopt.step.read_value())

    def _set_last(self, rows, step):
        self.last.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(rows), step), rows))

    def _catch_up(self, rows, all_rows, target):
        _native.tf_ops().embed_lab_global_adam_catch_up(
            self.table.handle, self.slots[0].handle, self.slots[1].handle, self.last.handle, rows,
            tf.cast(all_rows, tf.int64), tf.cast(target, tf.int64), self.lr_ring.read_value(),
            *self.tfopt.adam_constants())

    def begin_step(self, rows, lr):
        """Deferred Global Adam, before the step's lookup: records this step's learning rate and
        brings the batch's rows up to the previous step (replaying, per row, the zero-gradient
        updates of the steps it missed: the same arithmetic as a pass over every row at every
        step, so the same bits, but only on rows something reads)."""
        if not self.deferred_global:
            return
        t = self.tfopt.step.read_value() + 1
        self.lr_ring.scatter_update(tf.IndexedSlices(tf.reshape(tf.cast(lr, tf.float32), [1]),
                                                     tf.reshape(t % self.GLOBAL_SYNC_EVERY, [1])))
        self._catch_up(rows, -1, t - 1)

    def sync(self):
        """Deferred Global Adam: brings every row in use up to the last trained step (before the
        table is read outside a training step: evaluation, export, write-back, checks)."""
        if self.deferred_global:
            self._catch_up(tf.zeros([0], tf.int64), self.rows_in_use, self.tfopt.step.read_value())

    def apply(self, grad, lr, used_rows):
        """Non-compiled update (MomentumSGD / Nesterov, or any Global update) from the table's
        IndexedSlices gradient."""
        if grad is None:
            return
        if isinstance(grad, tf.IndexedSlices):
            idx, g = tf.cast(grad.indices, tf.int64), grad.values
        else:
            g = tf.convert_to_tensor(grad)
            idx = tf.range(tf.shape(g, out_type=tf.int64)[0])
        self.tfopt.step.assign_add(1)
        t = self.tfopt.step
        if self.deferred_global:
            # The batch's rows are current through t - 1 (begin_step): step t with their
            # gradients (the rows' update of a full pass), then every row every K steps.
            self.tfopt.apply_adam_rows(idx, g, self.table, self.slots, lr, t)
            tv = t.read_value()
            self._set_last(idx, tv)
            k = self.GLOBAL_SYNC_EVERY
            self._catch_up(tf.zeros([0], tf.int64), tf.where(tv % k == 0, tf.cast(used_rows, tf.int64), -1), tv)
            return
        if self.spec.optimizer.update_type == "Global" and self.spec.optimizer.type != "SGD":
            self.tfopt.apply_global(idx, g, self.table, self.slots, lr, t, used_rows)
        else:
            self.tfopt.apply_rows(idx, g, self.table, self.slots, lr, t)

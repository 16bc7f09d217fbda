"""`ParquetLoader`: shuffled, prefetched, sharded batches from parquet, straight into TensorFlow.

The loader reads whole row groups column-wise with pyarrow, keeps a bounded shuffle buffer of
rows, permutes it with one NumPy gather per column, and slices batches out of it: no Python runs
per row. A background thread does the reading, shuffling and tensor conversion while the model
trains on the previous batch.

Shuffling is two-level, like NVTabular's loader: the order of row groups is permuted every epoch,
and rows are permuted inside a buffer of `buffer_rows` rows (several row groups). Rows that do not
fill a whole batch stay in the buffer and mix with the next row groups.

Memory is bounded by the buffer, not by the dataset: about
`(2 * (buffer_rows + row_group_rows) + 2 * row_group_rows + (prefetch + 2) * batch_size)
* bytes_per_row` (the buffer and its permuted copy, one row group being stored and one decoded
ahead, the batches in flight), whatever the number of files.

Example:
    >>> import keras
    >>> from embedlab.data import ParquetLoader, criteo
    >>> txt = criteo.generate("day.txt", rows=2000, seed=0, progress=False)
    >>> _ = criteo.preprocess(txt, "criteo_parquet", progress=False)
    >>> train = ParquetLoader("criteo_parquet/train", batch_size=256, seed=0)
    >>> x, y = next(iter(train))         # a dict of columns, and the labels
    >>> tuple(x["dense"].shape), tuple(x["C1"].shape), tuple(y.shape)
    ((256, 13), (256,), (256, 1))
    >>> class CTR(keras.Model):           # any Keras model taking the dict
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.out = keras.layers.Dense(1, activation="sigmoid")
    ...     def call(self, x):
    ...         return self.out(x["dense"])
    >>> model = CTR()
    >>> model.compile("adam", "binary_crossentropy")
    >>> _ = model.fit(train, epochs=1, verbose=0)   # a Keras data adapter: no wrapping
    >>> ds = train.to_tf_dataset()       # or a tf.data.Dataset, to map/zip
"""
from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from .criteo import LABEL
from .formats import FormatError, parquet_files, schema_columns

try:  # Keras accepts any DataAdapter in fit/evaluate/predict without conversion.
    from keras.src.trainers.data_adapters.data_adapter import DataAdapter as _Base
except Exception:  # pragma: no cover - Keras missing or reorganized: still a plain iterable
    _Base = object

_END = object()


class _Ragged:
    """A ragged column chunk: row_splits (int64, may start > 0) into a values array."""
    __slots__ = ("splits", "values")

    def __init__(self, splits, values):
        self.splits, self.values = splits, values

    def __len__(self):
        return len(self.splits) - 1

    def normalized(self):
        a, b = int(self.splits[0]), int(self.splits[-1])
        return _Ragged(self.splits - a, self.values[a:b])

    def take(self, idx):
        lengths = np.diff(self.splits)[idx]
        splits = np.zeros(len(idx) + 1, np.int64)
        np.cumsum(lengths, out=splits[1:])
        total = int(splits[-1])
        src = self.splits[:-1][idx]
        gather = np.repeat(src - splits[:-1], lengths) + np.arange(total)
        return _Ragged(splits, self.values[gather])

    def slice(self, a, b):
        s = self.splits[a:b + 1]
        return _Ragged(s - s[0], self.values[int(s[0]):int(s[-1])])

    @staticmethod
    def concat(parts):
        parts = [p.normalized() for p in parts]
        lens = np.concatenate([np.diff(p.splits) for p in parts])
        splits = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=splits[1:])
        return _Ragged(splits, np.concatenate([p.values for p in parts]))


class ParquetLoader(_Base):
    """Batches of `(features, label)` from parquet files, for `model.fit` or `tf.data`.

    Args:
        src: a parquet file, a folder of them, or a list.
        batch_size: rows per batch.
        label: label column (output shape [batch, 1] float32).
        dense: float feature columns (default: every float column but the label). With
            `dense_key` they come stacked as one [batch, n_dense] float32 tensor.
        sparse: integer columns (default: every integer column), each [batch] int64, or
            stacked [batch, n_sparse] under `sparse_key`.
        ragged: list<int> columns (default: all), each a `tf.RaggedTensor` [batch, None].
        dense_key: name of the stacked dense tensor ("dense"); None gives one [batch] tensor
            per dense column.
        sparse_key: if set, stack the sparse columns into one [batch, n_sparse] tensor.
        shuffle: permute row groups per epoch and rows within the buffer.
        seed: shuffle seed; None draws one (see `.seed` to reproduce). Same seed, same files,
            same batch size -> identical batches, epoch by epoch.
        buffer_rows: rows held for shuffling (default max(4 * batch_size, 262,144)).
        drop_remainder: drop the last partial batch of an epoch.
        prefetch: batches prepared ahead by the background thread.
        input_context: a `tf.distribute.InputContext`; shards by `input_pipeline_id` of
            `num_input_pipelines`. Or give `num_shards` / `shard_index` directly.
        output: "tf" (tensors) or "numpy" (arrays; ragged columns as (row_splits, values)).

    Returns (iterating):
        One epoch of `(features_dict, label)` batches per `iter()`.

    Sharding assigns whole row groups to workers (row group i to shard i % num_shards), so
    shards are disjoint and cover the data; their sizes differ by at most a row group. With a
    `tf.distribute` strategy, build one loader per input pipeline:

        dist = strategy.distribute_datasets_from_function(
            lambda ctx: ParquetLoader(path, per_replica_batch, seed=0,
                                      input_context=ctx).to_tf_dataset())

    Performance: batches are copied once into TensorFlow tensors; `model.fit(loader)` and
    `to_tf_dataset()` go through `tf.data.Dataset.from_generator`, which adds a copy and GIL
    hand-offs (the rates are on the documentation's benchmarks page).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from embedlab.data.formats import write_parquet
        >>> p = write_parquet(Path(tempfile.mkdtemp()) / "train.parquet", {
        ...     "label": np.zeros(8, np.float32), "C1": np.arange(8),
        ...     **{f"I{i}": np.ones(8, np.float32) for i in range(1, 14)}})
        >>> ld = ParquetLoader(p, 4, seed=1, sparse_key=None)
        >>> feats, y = next(iter(ld)); feats["dense"].shape, feats["C1"].shape, y.shape
        (TensorShape([4, 13]), TensorShape([4]), TensorShape([4, 1]))
    """

    def __init__(self, src, batch_size: int, *, label: str = LABEL,
                 dense: Sequence[str] | None = None, sparse: Sequence[str] | None = None,
                 ragged: Sequence[str] | None = None, dense_key: str | None = "dense",
                 sparse_key: str | None = None, shuffle: bool = True, seed: int | None = None,
                 buffer_rows: int | None = None, drop_remainder: bool = False,
                 prefetch: int = 2, input_context=None, num_shards: int | None = None,
                 shard_index: int | None = None, output: str = "tf"):
        import pyarrow.parquet as pq
        if int(batch_size) < 1:
            raise ValueError(f"ParquetLoader: batch_size must be >= 1, got {batch_size}")
        if output not in ("tf", "numpy"):
            raise ValueError(f"ParquetLoader: output must be 'tf' or 'numpy', got {output!r}")
        if prefetch < 1:
            raise ValueError(f"ParquetLoader: prefetch must be >= 1, got {prefetch}")
        self.files = parquet_files(src)
        self._batch_size = int(batch_size)
        schema = pq.read_schema(self.files[0])
        cols = schema_columns(schema)
        if label not in schema.names:
            raise ValueError(f"ParquetLoader: label column {label!r} not in {self.files[0]} "
                             f"(columns: {schema.names})")
        self.label = label
        self.dense = list(dense) if dense is not None else cols["dense"]
        self.sparse = list(sparse) if sparse is not None else cols["sparse"]
        self.ragged = list(ragged) if ragged is not None else cols["ragged"]
        missing = [c for c in self.dense + self.sparse + self.ragged if c not in schema.names]
        if missing:
            raise ValueError(f"ParquetLoader: columns {missing} not in {self.files[0]}")
        self.columns = [label] + self.dense + self.sparse + self.ragged
        self.dense_key, self.sparse_key = dense_key, sparse_key
        self.shuffle = bool(shuffle)
        self.seed = int(np.random.SeedSequence().entropy % (2**63)) if seed is None else int(seed)
        self.buffer_rows = int(buffer_rows) if buffer_rows else max(4 * self._batch_size, 262_144)
        if self.buffer_rows < self._batch_size:
            raise ValueError(f"ParquetLoader: buffer_rows ({self.buffer_rows}) must be >= "
                             f"batch_size ({self._batch_size})")
        self.drop_remainder = bool(drop_remainder)
        self.prefetch = int(prefetch)
        self.output = output
        if input_context is not None:
            num_shards = input_context.num_input_pipelines
            shard_index = input_context.input_pipeline_id
        self.num_shards = int(num_shards or 1)
        self.shard_index = int(shard_index or 0)
        if not 0 <= self.shard_index < self.num_shards:
            raise ValueError(f"ParquetLoader: shard_index {self.shard_index} not in "
                             f"[0, {self.num_shards})")
        # Every (file, row group) with its row count, in file order; this shard's subset.
        groups = []
        for f in self.files:
            md = pq.ParquetFile(f).metadata
            sch = md.schema.to_arrow_schema()
            bad = [c for c in self.columns if c not in sch.names]
            if bad:
                raise ValueError(f"ParquetLoader: {f} lacks columns {bad}")
            groups.extend((f, i, md.row_group(i).num_rows) for i in range(md.num_row_groups))
        self.row_groups = [g for k, g in enumerate(groups) if k % self.num_shards == self.shard_index]
        if self.num_shards > 1 and not self.row_groups:
            raise ValueError(f"ParquetLoader: shard {self.shard_index} of {self.num_shards} gets "
                             f"no row groups ({len(groups)} in total); write smaller row groups")
        self.num_rows = sum(g[2] for g in self.row_groups)
        self.row_group_rows = max((g[2] for g in self.row_groups), default=0)
        self.epoch = 0
        self._spec = None

    # ---------------------------------------------------------------- sizes and specs
    def __len__(self):
        return self.num_batches

    @property
    def num_batches(self):
        full, rest = divmod(self.num_rows, self._batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    @property
    def batch_size(self):
        return self._batch_size

    @property
    def has_partial_batch(self):
        return bool(self.num_rows % self._batch_size) and not self.drop_remainder

    @property
    def partial_batch_size(self):
        return (self.num_rows % self._batch_size) if self.has_partial_batch else None

    @property
    def element_spec(self):
        """The `(features, label)` TensorSpecs of a batch (batch dimension None)."""
        import tensorflow as tf
        feats = {}
        if self.dense_key:
            if self.dense:
                feats[self.dense_key] = tf.TensorSpec([None, len(self.dense)], tf.float32)
        else:
            feats.update({c: tf.TensorSpec([None], tf.float32) for c in self.dense})
        if self.sparse_key:
            if self.sparse:
                feats[self.sparse_key] = tf.TensorSpec([None, len(self.sparse)], tf.int64)
        else:
            feats.update({c: tf.TensorSpec([None], tf.int64) for c in self.sparse})
        feats.update({c: tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1,
                                             row_splits_dtype=tf.int64) for c in self.ragged})
        return feats, tf.TensorSpec([None, 1], tf.float32)

    # ---------------------------------------------------------------- reading
    def _layout(self):
        """Fixed-width output arrays: name -> (per-row shape, dtype, source columns)."""
        lay = {self.label: ((), np.float32, [self.label])}
        if self.dense_key and self.dense:
            lay[self.dense_key] = ((len(self.dense),), np.float32, self.dense)
        else:
            lay.update({c: ((), np.float32, [c]) for c in self.dense})
        if self.sparse_key and self.sparse:
            lay[self.sparse_key] = ((len(self.sparse),), np.int64, self.sparse)
        else:
            lay.update({c: ((), np.int64, [c]) for c in self.sparse})
        return lay

    def _decode(self, f, i):
        """Read and decode one row group with pyarrow (its own threads; the GIL is released)."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        try:
            return pq.ParquetFile(f).read_row_group(i, columns=self.columns, use_threads=True)
        except (pa.ArrowException, OSError) as e:
            raise FormatError(f"ParquetLoader: cannot read {f} row group {i}: {e}") from e

    def _store(self, t, f, i, lay, buf, at):
        """Copy a decoded row group's fixed columns into `buf` rows [at, at + rows).

        Returns (rows, ragged columns as `_Ragged`, kept as separate chunks).
        """
        m = t.num_rows
        if at + m > len(buf[self.label]):
            raise RuntimeError("ParquetLoader: row group larger than the buffer (bug)")

        def column(c):
            a = t.column(c).combine_chunks()
            if a.null_count:
                raise ValueError(f"ParquetLoader: {f} row group {i} column {c} has "
                                 f"{a.null_count} nulls; fill missing values in ETL")
            return a

        for name, (shape, _, srcs) in lay.items():
            dst = buf[name][at:at + m]
            if shape:
                for j, c in enumerate(srcs):
                    dst[:, j] = column(c).to_numpy()
            else:
                dst[:] = column(srcs[0]).to_numpy()
        ragged = {}
        for c in self.ragged:
            a = column(c)
            ragged[c] = _Ragged(np.asarray(a.offsets, np.int64),
                                np.asarray(a.values).astype(np.int64, copy=False))
        return m, ragged

    def _batches(self, epoch: int):
        """Batches of one epoch as dicts of NumPy views (runs on the background thread).

        Two preallocated buffers are reused for the whole epoch: `buf` receives decoded row
        groups, `out` receives the permuted rows, and batches are slices of `out`. Reusing them
        avoids fresh allocations (and their page faults), which cost more than the copies.
        A batch's views are only valid until the next batch is requested; `_finish` copies
        them into tensors right away.
        """
        rng = np.random.default_rng([self.seed, epoch])
        order = np.arange(len(self.row_groups))
        if self.shuffle:
            order = rng.permutation(order)
        B = self._batch_size
        lay = self._layout()
        cap = self.buffer_rows + self.row_group_rows
        buf = {k: np.empty((cap,) + sh, dt) for k, (sh, dt, _) in lay.items()}
        out = {k: np.empty_like(v) for k, v in buf.items()} if self.shuffle else buf
        rparts: dict = {c: [] for c in self.ragged}
        rows = 0
        # np.take releases the GIL: gathering the columns on a few threads uses every core
        # while pyarrow's own pool decodes.
        pool = ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1)),
                                  thread_name_prefix="ParquetLoader-gather")

        def drain(final):
            nonlocal rows, rparts
            n = rows
            rag = {c: _Ragged.concat(p) for c, p in rparts.items()} if self.ragged else {}
            if self.shuffle:
                perm = rng.permutation(n)
                list(pool.map(lambda k: np.take(buf[k][:n], perm, axis=0, out=out[k][:n]), buf))
                rag = {c: r.take(perm) for c, r in rag.items()}
            k = n // B
            for j in range(k):
                batch = {name: a[j * B:(j + 1) * B] for name, a in out.items()}
                batch.update({c: r.slice(j * B, (j + 1) * B) for c, r in rag.items()})
                yield batch
            rest = n - k * B
            if rest and final:
                if not self.drop_remainder:
                    batch = {name: a[k * B:n] for name, a in out.items()}
                    batch.update({c: r.slice(k * B, n) for c, r in rag.items()})
                    yield batch
                rest = 0
            # Leftover rows (already shuffled) move to the front and mix with the next groups.
            for name in buf:
                if rest:
                    buf[name][:rest] = out[name][k * B:n]
            rparts = {c: ([r.slice(k * B, n)] if rest else []) for c, r in rag.items()}
            rows = rest

        reader = ThreadPoolExecutor(1, thread_name_prefix="ParquetLoader-read")
        try:
            # Decode the next row group while this one is stored, shuffled and converted.
            ahead = reader.submit(self._decode, *self.row_groups[order[0]][:2]) if len(order) else None
            for k, g in enumerate(order):
                f, i, _ = self.row_groups[g]
                t = ahead.result()
                ahead = (reader.submit(self._decode, *self.row_groups[order[k + 1]][:2])
                         if k + 1 < len(order) else None)
                m, rag = self._store(t, f, i, lay, buf, rows)
                del t
                for c, r in rag.items():
                    rparts[c].append(r)
                rows += m
                if rows >= self.buffer_rows:
                    yield from drain(False)
            if rows:
                yield from drain(True)
        finally:
            reader.shutdown(wait=True, cancel_futures=True)
            pool.shutdown(wait=True)

    def _finish(self, cols):
        label = cols[self.label].reshape(-1, 1)
        feats = {k: v for k, v in cols.items() if k != self.label}
        if self.output == "numpy":
            # Copies: the batch views point into buffers that the next batch reuses.
            return ({k: ((v.splits.copy(), v.values.copy()) if isinstance(v, _Ragged)
                         else v.copy()) for k, v in feats.items()}, label.copy())
        import tensorflow as tf
        out = {}
        for k, v in feats.items():
            if isinstance(v, _Ragged):
                out[k] = tf.RaggedTensor.from_row_splits(tf.constant(v.values),
                                                         tf.constant(v.splits), validate=False)
            else:
                out[k] = tf.constant(v)
        return out, tf.constant(label)

    def __iter__(self):
        """One epoch of batches; each new iteration starts the next epoch (reshuffled)."""
        epoch = self.epoch
        self.epoch += 1
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def produce():
            try:
                for cols in self._batches(epoch):
                    item = self._finish(cols)
                    while not stop.is_set():
                        try:
                            q.put(item, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                q.put(_END)
            except BaseException as e:  # surfaced in the consumer, with its traceback
                q.put(e)

        t = threading.Thread(target=produce, name=f"ParquetLoader-epoch{epoch}", daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            # Unblock a producer waiting on a full queue, then let it exit.
            while t.is_alive():
                try:
                    q.get_nowait()
                except queue.Empty:
                    t.join(timeout=0.05)

    # ---------------------------------------------------------------- tf.data / Keras
    def to_tf_dataset(self):
        """A `tf.data.Dataset` over this loader (each iteration of it is one new epoch).

        Example:
            >>> from embedlab.data import criteo
            >>> txt = criteo.generate("day.txt", rows=1000, seed=0, progress=False)
            >>> _ = criteo.preprocess(txt, "pq", progress=False)
            >>> ds = ParquetLoader("pq/train", batch_size=100).to_tf_dataset().map(lambda x, y: (x["dense"], y))
            >>> ds.element_spec[0].shape.as_list()
            [None, 13]
        """
        import tensorflow as tf
        if self.output != "tf":
            raise ValueError("to_tf_dataset needs output='tf'")
        return tf.data.Dataset.from_generator(lambda: iter(self),
                                              output_signature=self.element_spec)

    # Keras DataAdapter protocol: model.fit(loader) calls these.
    def get_tf_dataset(self):
        return self.to_tf_dataset()

    def get_numpy_iterator(self):
        if self.output == "numpy":
            return iter(self)
        return ((({k: (v if not hasattr(v, "numpy") else v.numpy()) for k, v in x.items()},
                  y.numpy()) for x, y in iter(self)))

    def get_jax_iterator(self):
        raise NotImplementedError("ParquetLoader feeds the TensorFlow backend")

    def get_torch_dataloader(self):
        raise NotImplementedError("ParquetLoader feeds the TensorFlow backend")

    def on_epoch_begin(self):
        pass

    def on_epoch_end(self):
        pass

    def __repr__(self):
        return (f"ParquetLoader({len(self.files)} files, {len(self.row_groups)} row groups, "
                f"{self.num_rows} rows, batch {self._batch_size}, shard "
                f"{self.shard_index}/{self.num_shards}, seed {self.seed})")

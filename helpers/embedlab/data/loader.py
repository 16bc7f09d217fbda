"""`ParquetLoader`: shuffled, prefetched, sharded batches from parquet, straight into TensorFlow.

The loader reads whole row groups column-wise with pyarrow, keeps a bounded shuffle buffer of
rows, permutes it with one NumPy gather per column, and slices batches out of it: no Python runs
per row. A background thread does the reading, shuffling and tensor conversion while the model
trains on the previous batch.

Shuffling is two-level, like NVTabular's loader: the order of row groups is permuted every epoch,
and rows are permuted inside a buffer of `buffer_rows` rows (several row groups). Rows that do not
fill a whole batch stay in the buffer and mix with the next row groups.

Memory is bounded by the buffer, not by the dataset: at most about
`(buffer_rows + row_group_rows + (prefetch + 2) * batch_size) * bytes_per_row * 2` bytes
(the factor 2 for the buffer and its permuted copy), whatever the number of files.

Example:
    >>> from embedlab.data import ParquetLoader                             # doctest: +SKIP
    >>> train = ParquetLoader("criteo_parquet/train", batch_size=4096, seed=0)
    >>> model.fit(train, epochs=1)                   # a Keras data adapter: no wrapping needed
    >>> ds = train.to_tf_dataset()                   # or a tf.data.Dataset, to map/zip/prefetch
"""
from __future__ import annotations

import queue
import threading
from pathlib import Path
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
    shards are disjoint and cover the data; their sizes differ by at most a row group.

    Example:
        >>> ld = ParquetLoader("pq/train", 1024, seed=1, sparse_key=None)      # doctest: +SKIP
        >>> feats, y = next(iter(ld)); feats["dense"].shape, feats["C1"].shape, y.shape
        (TensorShape([1024, 13]), TensorShape([1024]), TensorShape([1024, 1]))
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
    def _read_group(self, f, i):
        import pyarrow as pa
        import pyarrow.parquet as pq
        try:
            t = pq.ParquetFile(f).read_row_group(i, columns=self.columns, use_threads=True)
        except (pa.ArrowException, OSError) as e:
            raise FormatError(f"ParquetLoader: cannot read {f} row group {i}: {e}") from e
        out = {}
        for c in self.columns:
            a = t.column(c).combine_chunks()
            if a.null_count:
                raise ValueError(f"ParquetLoader: {f} row group {i} column {c} has "
                                 f"{a.null_count} nulls; fill missing values in ETL")
            if pa.types.is_list(a.type) or pa.types.is_large_list(a.type):
                out[c] = _Ragged(np.asarray(a.offsets, np.int64),
                                 np.asarray(a.values).astype(np.int64, copy=False))
            elif c == self.label or c in self.dense:
                out[c] = a.to_numpy().astype(np.float32, copy=False)
            else:
                out[c] = a.to_numpy().astype(np.int64, copy=False)
        # Stack dense (and optionally sparse) columns once per row group, so that shuffling
        # and batching gather one 2-D array instead of a dozen 1-D ones.
        if self.dense_key and self.dense:
            out[self.dense_key] = np.stack([out.pop(c) for c in self.dense], axis=1)
        if self.sparse_key and self.sparse:
            out[self.sparse_key] = np.stack([out.pop(c) for c in self.sparse], axis=1)
        return out

    @staticmethod
    def _concat(parts):
        keys = parts[0].keys()
        if len(parts) == 1:
            return dict(parts[0])
        return {k: (_Ragged.concat([p[k] for p in parts]) if isinstance(parts[0][k], _Ragged)
                    else np.concatenate([p[k] for p in parts])) for k in keys}

    @staticmethod
    def _take(cols, idx):
        return {k: (v.take(idx) if isinstance(v, _Ragged) else v[idx]) for k, v in cols.items()}

    @staticmethod
    def _slice(cols, a, b):
        return {k: (v.slice(a, b) if isinstance(v, _Ragged) else v[a:b]) for k, v in cols.items()}

    def _batches(self, epoch: int):
        """Numpy batches of one epoch (runs on the background thread)."""
        rng = np.random.default_rng([self.seed, epoch])
        order = np.arange(len(self.row_groups))
        if self.shuffle:
            order = rng.permutation(order)
        B = self._batch_size
        parts, rows = [], 0

        def drain(final):
            nonlocal parts, rows
            cols = self._concat(parts)
            n = rows
            if self.shuffle:
                cols = self._take(cols, rng.permutation(n))
            k = n // B
            for j in range(k):
                yield self._slice(cols, j * B, (j + 1) * B)
            rest = n - k * B
            if rest and final:
                if not self.drop_remainder:
                    yield self._slice(cols, k * B, n)
                parts, rows = [], 0
            elif rest:
                # The leftover rows (already shuffled) wait for the next row groups.
                parts, rows = [self._slice(cols, k * B, n)], rest
            else:
                parts, rows = [], 0

        for g in order:
            f, i, _ = self.row_groups[g]
            parts.append(self._read_group(f, i))
            rows += self.row_groups[g][2]
            if rows >= self.buffer_rows:
                yield from drain(False)
        if rows:
            yield from drain(True)

    def _finish(self, cols):
        label = cols[self.label].reshape(-1, 1)
        feats = {k: v for k, v in cols.items() if k != self.label}
        if self.output == "numpy":
            return ({k: ((v.splits, v.values) if isinstance(v, _Ragged) else v)
                     for k, v in feats.items()}, label)
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
            >>> ds = loader.to_tf_dataset().map(lambda x, y: (x, y))       # doctest: +SKIP
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

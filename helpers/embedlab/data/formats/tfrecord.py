"""TFRecord of `tf.train.Example`: the TensorFlow-native baseline the loader is compared with."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..._io import FormatError, atomic_file
from ..criteo.layout import CAT_COLUMNS, INT_COLUMNS, LABEL
from .parquet import parquet_files, read_parquet, schema_columns

_TFRECORD_CHUNK = 1 << 16     # rows write_tfrecord turns into Python values at a time (bounded memory)


def write_tfrecord(path, columns: dict) -> Path:
    """Write columns as `tf.train.Example` records (one per row), atomically.

    Float columns become `float_list`, integer columns `int64_list`, (row_splits, values)
    pairs variable-length `int64_list`. Rows are turned into Python values a chunk at a time,
    so memory beyond the columns themselves does not grow with the row count. This builds one
    protobuf per row in Python (about 20-40 us/row): fine for conversion, and exactly the cost
    the TFRecord path pays again at read time in `parse_example`.

    Args:
        path: output `.tfrecord` file.
        columns: dict name -> 1-D array, or (row_splits, values) for multi-hot columns.

    Returns:
        The output `Path`.

    Example:
        >>> import tempfile
        >>> p = write_tfrecord(Path(tempfile.mkdtemp()) / "x.tfrecord",
        ...                    {"label": np.array([1.0, 0.0], np.float32), "C1": np.array([3, 4])})
        >>> read_tfrecord(p, columns=[("label", "float"), ("C1", "int")])["C1"].tolist()
        [3, 4]
    """
    import tensorflow as tf
    names = list(columns)
    kinds, cols = [], []
    n = None
    for name in names:
        col = columns[name]
        if isinstance(col, tuple):
            col = (np.asarray(col[0]), np.asarray(col[1]).astype(np.int64))
            kinds.append("int")
            rows = len(col[0]) - 1
        else:
            col = np.asarray(col)
            kinds.append("float" if col.dtype.kind == "f" else "int")
            rows = len(col)
        if n is None:
            n = rows
        elif rows != n:
            raise ValueError(f"write_tfrecord: column {name} has {rows} rows, expected {n}")
        cols.append(col)
    Feature, FL, IL = tf.train.Feature, tf.train.FloatList, tf.train.Int64List
    chunk = _TFRECORD_CHUNK
    with atomic_file(path) as tmp:
        with tf.io.TFRecordWriter(str(tmp)) as w:
            for a in range(0, n or 0, chunk):
                b = min(a + chunk, n)
                lists = []
                for col in cols:
                    if isinstance(col, tuple):
                        splits, values = col[0][a:b + 1], col[1]
                        vals = values[splits[0]:splits[-1]].tolist()
                        off = (splits - splits[0]).tolist()
                        lists.append([vals[off[i]:off[i + 1]] for i in range(b - a)])
                    else:
                        lists.append([(v,) for v in col[a:b].tolist()])
                for r in range(b - a):
                    feats = {name: (Feature(float_list=FL(value=lst[r])) if k == "float"
                                    else Feature(int64_list=IL(value=lst[r])))
                             for name, k, lst in zip(names, kinds, lists)}
                    w.write(tf.train.Example(features=tf.train.Features(feature=feats))
                            .SerializeToString())
    return Path(path)


def parquet_to_tfrecord(src, path) -> Path:
    """Convert parquet file(s) to one TFRecord file of `tf.train.Example` (see `write_tfrecord`)."""
    return write_tfrecord(path, read_parquet(src))


def _feature_spec(names_kinds):
    import tensorflow as tf
    spec = {}
    for name, kind in names_kinds:
        if kind == "float":
            spec[name] = tf.io.FixedLenFeature([], tf.float32)
        elif kind == "int":
            spec[name] = tf.io.FixedLenFeature([], tf.int64)
        else:
            spec[name] = tf.io.RaggedFeature(tf.int64)
    return spec


def tfrecord_columns(src) -> list[tuple[str, str]]:
    """The (name, kind) columns of the TFRecord that `parquet_to_tfrecord(src, ...)` writes.

    What `tfrecord_dataset` and `read_tfrecord` take as `columns`: the label and the dense
    columns "float", the integer columns "int", the list columns (multi-hot slots) "ragged",
    in the parquet schema's order.

    Example:
        >>> import tempfile
        >>> from embedlab.data.formats import write_parquet
        >>> p = write_parquet(Path(tempfile.mkdtemp()) / "x.parquet", {
        ...     "label": np.zeros(2, np.float32), "I1": np.ones(2, np.float32), "C1": np.arange(2),
        ...     "tags": ([0, 1, 3], [5, 6, 7])})
        >>> tfrecord_columns(p)
        [('label', 'float'), ('I1', 'float'), ('C1', 'int'), ('tags', 'ragged')]
    """
    import pyarrow.parquet as pq
    cols = schema_columns(pq.read_schema(parquet_files(src)[0]))
    return ([(LABEL, "float")] + [(c, "float") for c in cols["dense"]]
            + [(c, "int") for c in cols["sparse"]] + [(c, "ragged") for c in cols["ragged"]])


def tfrecord_dataset(files, batch_size: int, *, columns=None, dense_key: str | None = "dense",
                     shuffle_buffer: int = 0, seed: int | None = None,
                     drop_remainder: bool = False):
    """The standard `tf.data` pipeline over TFRecord: batch, then `parse_example`, prefetch.

    This is the baseline a TensorFlow user would write (vectorized parsing, parallel map,
    autotuned prefetch); EmbedLab's benchmarks compare `ParquetLoader` with it.

    Args:
        files: TFRecord path(s).
        batch_size: rows per batch.
        columns: list of (name, kind) with kind "float" | "int" | "ragged"; default: Criteo
            (label, I1..I13 float, C1..C26 int).
        dense_key: stack the float feature columns into one [batch, n] tensor under this key
            (as `ParquetLoader` does); None keeps them separate.
        shuffle_buffer: rows in a per-record shuffle buffer (0 = no shuffle).
        seed: shuffle seed. drop_remainder: drop the last partial batch.

    Returns:
        A `tf.data.Dataset` of (features dict, label [batch, 1]).
    """
    import tensorflow as tf
    if columns is None:
        columns = ([(LABEL, "float")] + [(c, "float") for c in INT_COLUMNS]
                   + [(c, "int") for c in CAT_COLUMNS])
    spec = _feature_spec(columns)
    dense_cols = [n for n, k in columns if k == "float" and n != LABEL]
    files = [str(f) for f in ([files] if isinstance(files, (str, Path)) else files)]
    ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE if len(files) > 1
                                 else None)
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)

    @tf.autograph.experimental.do_not_convert      # plain graph code; skips autograph's warning
    def parse(x):
        f = tf.io.parse_example(x, spec)
        label = tf.reshape(f.pop(LABEL), [-1, 1])
        if dense_key:
            f[dense_key] = tf.stack([f.pop(c) for c in dense_cols], axis=1)
        return f, label

    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def read_tfrecord(path, columns=None) -> dict:
    """Read a whole TFRecord file of Examples into NumPy columns, verifying every record.

    TensorFlow checks each record's length and data CRCs; a failure is re-raised as
    `FormatError` naming the file and the record index.

    Args:
        path: the file. columns: (name, kind) list as in `tfrecord_dataset` (default Criteo).

    Returns:
        dict name -> array ((row_splits, values) for ragged columns).
    """
    import tensorflow as tf
    if columns is None:
        columns = ([(LABEL, "float")] + [(c, "float") for c in INT_COLUMNS]
                   + [(c, "int") for c in CAT_COLUMNS])
    spec = _feature_spec(columns)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"TFRecord file {path} does not exist")
    records = []
    it = iter(tf.data.TFRecordDataset(str(path)))
    while True:
        try:
            records.append(next(it))
        except StopIteration:
            break
        except (tf.errors.DataLossError, tf.errors.OutOfRangeError) as e:
            raise FormatError(f"{path}: record {len(records)} is corrupt or truncated: "
                              f"{e.message}") from None
    if not records:
        return {name: (np.zeros(1, np.int64), np.empty(0, np.int64)) if k == "ragged"
                else np.empty(0, np.float32 if k == "float" else np.int64)
                for name, k in columns}
    try:
        parsed = tf.io.parse_example(tf.stack(records), spec)
    except tf.errors.InvalidArgumentError as e:
        raise FormatError(f"{path}: records do not match the expected columns: {e.message}") \
            from None
    out = {}
    for name, k in columns:
        t = parsed[name]
        out[name] = ((t.row_splits.numpy(), t.values.numpy()) if k == "ragged" else t.numpy())
    return out

"""File formats for Criteo-style data: parquet, HugeCTR "Norm" binary (+ file lists, keysets), TFRecord.

- `parquet`: `parquet_files`, `schema_columns`, `write_parquet`, `read_parquet`.
- `norm`: `write_norm`, `read_norm` (`NormData`), `read_header`, `write_keyset`, `read_keyset`,
  `parquet_to_norm` (like HugeCTR's criteo2hugectr), and the file lists `write_file_list`,
  `read_file_list`. The steps of `parquet_to_norm` are public in `formats.norm` (`norm_columns`,
  `norm_arrays`, `norm_bytes`, `unique_keys`, `list_groups`, `list_stem`, `merge_keys`,
  `keyset_bytes`, `norm_meta`) for conversions that run elsewhere and must write the same bytes
  (`criteo.etl_dask.parquet_to_norm`).
- `tfrecord`: `write_tfrecord`, `read_tfrecord`, `parquet_to_tfrecord`, `tfrecord_columns`,
  `tfrecord_dataset` (the standard `tf.data` pipeline).

Every writer builds its output under a temporary name and renames it into place, so a crash
never leaves a half-written file. Every reader checks what it can (headers, record lengths,
checksums, counts) and raises `FormatError` naming the file and the record.

Columns follow `criteo.preprocess`: `label` (float32), `I1..I13` (float32), `C1..C26` and crosses
(int64, or list<int64> for multi-hot slots). pyarrow and TensorFlow are imported only when used.
"""
from __future__ import annotations

from ..._io import FormatError, read_file_list, write_file_list
from .norm import (NormData, parquet_to_norm, read_header, read_keyset, read_norm, write_keyset,
                   write_norm)
from .parquet import parquet_files, read_parquet, schema_columns, write_parquet
from .tfrecord import (parquet_to_tfrecord, read_tfrecord, tfrecord_columns, tfrecord_dataset,
                       write_tfrecord)

__all__ = [
    "FormatError", "parquet_files", "write_parquet", "read_parquet", "schema_columns",
    "write_norm", "read_norm", "read_header", "NormData", "write_file_list", "read_file_list",
    "write_keyset", "read_keyset", "parquet_to_norm",
    "write_tfrecord", "read_tfrecord", "parquet_to_tfrecord", "tfrecord_columns",
    "tfrecord_dataset",
]

"""Criteo data for EmbedLab: synthetic generation, ETL, file formats and a fast loader.

- `criteo` (package: layout, synth, parse, recipe, etl, etl_dask, norm_dask, cluster):
  `generate` (Kaggle TSV layout), `preprocess` (HugeCTR recipe, to parquet; on a Dask cluster
  with `client=`, `criteo.etl_dask`), `split`, `read_chunks`.
- `formats` (package: parquet, norm, tfrecord): parquet, the HugeCTR "Norm" binary +
  `file_list.txt` + keysets, TFRecord; readers that check headers, lengths and checksums.
- `ParquetLoader` (`loader`): shuffled, prefetched batches from parquet for `model.fit` / `tf.data`.
- `resident_set`: `peak_rss`, the peak resident set (RSS) of a function, run in a fresh process.

`formats` and the loader import pyarrow (and TensorFlow, for tensors) only when used.
"""
from __future__ import annotations

import importlib

from . import criteo

__all__ = ["criteo", "formats", "ParquetLoader"]


def __getattr__(name):
    # Lazy, so `from embedlab.data import criteo` stays light (no TensorFlow import).
    if name == "formats":
        return importlib.import_module(f"{__name__}.formats")
    if name == "ParquetLoader":
        from .loader import ParquetLoader
        return ParquetLoader
    raise AttributeError(f"module 'embedlab.data' has no attribute {name!r}")

"""Criteo data for EmbedLab: synthetic generation, ETL, file formats and a fast loader.

- `criteo` (package: layout, synth, parse, etl, etl_dask): `generate` (Kaggle TSV layout),
  `preprocess` (HugeCTR recipe, to parquet; on a Dask cluster with `client=`), `split`,
  `read_chunks`. `embedlab.data.criteo_dask` is `criteo.etl_dask`.
- `formats` (package: parquet, norm, tfrecord): parquet, the HugeCTR "Norm" binary +
  `file_list.txt` + keysets, TFRecord; readers that check headers, lengths and checksums.
- `ParquetLoader` (`loader`): shuffled, prefetched batches from parquet for `model.fit` / `tf.data`.
- `memory`: the peak memory of a function, run in a fresh process.

`formats` and the loader import pyarrow (and TensorFlow, for tensors) only when used.
"""
from __future__ import annotations

import importlib
import sys

from . import criteo

__all__ = ["criteo", "formats", "ParquetLoader"]

# `embedlab.data.criteo_dask` (attribute and importable module path) is `criteo.etl_dask`.
criteo_dask = criteo.etl_dask
sys.modules[f"{__name__}.criteo_dask"] = criteo_dask


def __getattr__(name):
    # Lazy, so `from embedlab.data import criteo` stays light (no TensorFlow import).
    if name == "formats":
        return importlib.import_module(f"{__name__}.formats")
    if name == "ParquetLoader":
        from .loader import ParquetLoader
        return ParquetLoader
    raise AttributeError(f"module 'embedlab.data' has no attribute {name!r}")

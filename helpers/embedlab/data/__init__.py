"""Criteo data for EmbedLab: synthetic generation, ETL, file formats and a fast loader.

- `criteo`: `generate` (Kaggle TSV layout), `preprocess` (HugeCTR recipe, to parquet),
  `split`, `read_chunks`.
- `formats`: parquet, the HugeCTR "Norm" binary + `file_list.txt` + keysets, TFRecord;
  readers that check headers, lengths and checksums.
- `ParquetLoader`: shuffled, prefetched batches from parquet for `model.fit` / `tf.data`.

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

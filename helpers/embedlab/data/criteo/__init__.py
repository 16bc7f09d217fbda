"""Criteo click logs: a synthetic generator, a vectorized TSV parser, ETL to parquet, and splits.

The Kaggle Criteo layout (`train.txt`, and each day of the Criteo 1TB logs) is one sample per
line, 40 tab-separated fields: the label (0/1), 13 integer features `I1..I13` and 26
categorical features `C1..C26` written as 8 hex digits (32-bit hashes). A missing value is an
empty field.

Everything here streams in byte chunks (tens of MB) and works column-wise on NumPy arrays: no
Python loop runs per line, so a 45M-line file goes through on a 2-core machine with a few GB of
memory (the category counters are the only state that grows, with the number of distinct
categories).

- `layout`: the column names and constants of the TSV layout.
- `synth`: `generate`, synthetic rows in that layout.
- `parse`: `read_chunks`, `count_lines`, `CriteoFormatError` (malformed lines by file and line).
- `etl`: `preprocess` (HugeCTR's recipe, to parquet), `split`, `split_counts`, `load_slot_sizes`.
- `etl_dask`: the same `preprocess` on a Dask cluster (`preprocess(..., client=...)` lands there),
  `parquet_to_norm` (the HugeCTR Norm / keyset conversion per part on the cluster, byte for byte
  `formats.parquet_to_norm`'s files), `local_client`, `output_digest`, `norm_digest`,
  `worker_peak_rss`. Dask is imported only when used.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from embedlab.data import criteo
    >>> d = Path(tempfile.mkdtemp())
    >>> txt = criteo.generate(d / "day.txt", rows=2_000, seed=1, progress=False)
    >>> res = criteo.preprocess(txt, d / "day_parquet", progress=False)
    >>> len(res.slot_size_array), res.rows
    (28, {'train': 1599, 'val': 200, 'test': 201})
"""
from __future__ import annotations

from . import etl_dask  # the Dask path (Dask itself is imported only when used)
from .etl import (CROSSES, KAGGLE_SPLIT, SPLIT_NAMES, PreprocessResult, load_slot_sizes,
                  preprocess, split, split_counts)
from .layout import (CAT_COLUMNS, INT_COLUMNS, LABEL, MISSING_HEX, NUM_CAT, NUM_FIELDS,
                     NUM_INT)
from .parse import Block, CriteoFormatError, count_lines, read_chunks
from .synth import KAGGLE_CARDINALITIES, generate

__all__ = [
    "NUM_INT", "NUM_CAT", "NUM_FIELDS", "LABEL", "INT_COLUMNS", "CAT_COLUMNS", "CROSSES",
    "MISSING_HEX", "KAGGLE_SPLIT", "SPLIT_NAMES", "KAGGLE_CARDINALITIES",
    "generate", "Block", "CriteoFormatError", "read_chunks", "count_lines",
    "split_counts", "split", "PreprocessResult", "preprocess", "load_slot_sizes", "etl_dask",
]

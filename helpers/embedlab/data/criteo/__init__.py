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
- `parse`: `read_chunks`, `count_lines`, `CriteoFormatError` (malformed lines by file and line),
  and the pieces both ETL paths read with (`iter_byte_chunks`, `parse_block`, `select_rows`).
- `recipe`: HugeCTR's recipe, what both ETL paths compute (slots, crosses, encoding, the
  vocabularies' layout, splits, the metadata written, `PreprocessResult`, `load_slot_sizes`).
- `etl`: `preprocess` in this process (two streaming passes), `split`.
- `etl_dask`: `preprocess` on a Dask cluster, chunk by chunk, with identical output;
  `output_digest`; and, re-exported, `parquet_to_norm` / `norm_digest` (from `norm_dask`: the
  HugeCTR Norm / keyset conversion per part on the cluster, byte for byte
  `formats.parquet_to_norm`'s files) and `local_client`, `resolve_client`, `worker_peak_rss`,
  `ChunkFailedError` (from `cluster`: the Dask plumbing). Dask is imported only when used.

`preprocess` (here) runs `etl.preprocess`, or `etl_dask.preprocess` when a cluster is named.

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

import os as _os
from typing import Sequence

from . import etl, etl_dask  # the Dask path (Dask itself is imported only when used)
from .cluster import SCHEDULER_ENV as _SCHEDULER_ENV
from .etl import split
from .layout import (CAT_COLUMNS, INT_COLUMNS, LABEL, MISSING_HEX, NUM_CAT, NUM_FIELDS,
                     NUM_INT)
from .parse import Block, CriteoFormatError, count_lines, read_chunks
from .recipe import (CROSSES, KAGGLE_SPLIT, SPLIT_NAMES, PreprocessResult, load_slot_sizes,
                     split_counts)
from .synth import KAGGLE_CARDINALITIES, generate

__all__ = [
    "NUM_INT", "NUM_CAT", "NUM_FIELDS", "LABEL", "INT_COLUMNS", "CAT_COLUMNS", "CROSSES",
    "MISSING_HEX", "KAGGLE_SPLIT", "SPLIT_NAMES", "KAGGLE_CARDINALITIES",
    "generate", "Block", "CriteoFormatError", "read_chunks", "count_lines",
    "split_counts", "split", "PreprocessResult", "preprocess", "load_slot_sizes", "etl_dask",
]


def preprocess(src, dst, *, normalize_dense: bool = True, feature_cross: bool = True,
               freq_threshold: int = 6, split: Sequence[int] | None = KAGGLE_SPLIT,
               on_error: str = "fail", row_group_rows: int = 65_536,
               rows_per_file: int = 2_000_000, chunk_bytes: int = 32 << 20,
               progress: bool = True, client=None) -> PreprocessResult:
    """Criteo TSV -> parquet splits, after HugeCTR's recipe, streaming in two passes.

    Pass 1 reads the training lines and counts every category (and each crossed pair) and the
    range of the dense features; pass 2 encodes all lines and writes parquet. Statistics come
    from the training split only, so validation/test values never seen in training map to the
    rare id.

    - Missing integers become 0; negatives are clipped to 0; with `normalize_dense`,
      x -> log(x + 1) then min-max scaled to [0, 1] with the training min/max (clipped).
    - Categories seen fewer than `freq_threshold` times in training, and missing values,
      map to local id 0 of their column; the others get 1..K in hex order.
    - With `feature_cross`, C1xC2 and C3xC4 pairs are new columns `C1_C2`, `C3_C4`, encoded the
      same way (a pair with a missing side is id 0).
    - Local ids are made globally unique with per-column offsets; the cardinalities
      (`slot_size_array`) and offsets are written to `dst/slot_size_array.json`, everything
      else to `dst/metadata.json`.

    Output: `dst/{train,val,test}/part_NNNNN.parquet` with columns `label` (float32),
    `I1..I13` (float32), `C1..C26` (+ crosses) (int64), in row groups of `row_group_rows`.
    The folder is built under a temporary name and renamed into place, so a failure (a
    malformed line with on_error="fail", an interrupt) leaves nothing partial.

    Memory: about 10x `chunk_bytes` plus the category counters (16 bytes per distinct value,
    about 0.5 GB for the full Kaggle file).

    Args:
        src: TSV path or list of paths (one stream; `.gz` allowed).
        dst: output folder (replaced atomically if it exists).
        normalize_dense, feature_cross, freq_threshold: see above.
        split: line-count ratios (train, val, test) scaled to the input's size (default the
            Kaggle 36,672,493 / 4,584,062 / 4,584,062); None puts every line in "train".
        on_error: "fail" (default) or "skip" malformed lines (counted, reported with file and
            line number in the result and a warning).
        row_group_rows: parquet row-group size. rows_per_file: rows per parquet file.
        chunk_bytes: input bytes parsed per step (on a cluster: per task). progress: tqdm bars.
        client: where to run. None: this process, unless the environment variable
            `EMBEDLAB_DASK_SCHEDULER` names a scheduler (`tcp://host:8786`), which is then
            used. A `distributed.Client`, a scheduler address, or "local" (a `LocalCluster`
            of one single-threaded worker process per core on 127.0.0.1, closed after): the
            same recipe on a Dask cluster, chunk by chunk, with output identical to this
            process's (`etl_dask.preprocess`, which also takes fsspec URLs).

    Returns:
        A `PreprocessResult`.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from embedlab.data.criteo import generate
        >>> d = Path(tempfile.mkdtemp())
        >>> res = preprocess(generate(d / "day.txt", rows=1000, seed=0, progress=False),
        ...                  d / "criteo_parquet", progress=False)
        >>> res.rows, res.columns[-2:], [p.name for p in res.files["val"]]
        ({'train': 799, 'val': 100, 'test': 101}, ['C1_C2', 'C3_C4'], ['part_00000.parquet'])
    """
    kw = dict(normalize_dense=normalize_dense, feature_cross=feature_cross,
              freq_threshold=freq_threshold, split=split, on_error=on_error,
              row_group_rows=row_group_rows, rows_per_file=rows_per_file,
              chunk_bytes=chunk_bytes, progress=progress)
    if client is not None or _os.environ.get(_SCHEDULER_ENV):
        return etl_dask.preprocess(src, dst, client=client, **kw)
    return etl.preprocess(src, dst, **kw)

"""Criteo ETL after HugeCTR's recipe: TSV -> parquet splits in two streaming passes; splitting a TSV."""
from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..._io import atomic_dir, atomic_file
from .layout import CAT_COLUMNS, INT_COLUMNS, LABEL, MISSING_HEX, NUM_CAT, NUM_INT
from .parse import Block, CriteoFormatError, _as_paths, _iter_byte_chunks, _parse, _select, count_lines

CROSSES = (("C1", "C2"), ("C3", "C4"))
# Line counts of the seeds' split of the full Kaggle file (head / tail of train.txt).
KAGGLE_SPLIT = (36_672_493, 4_584_062, 4_584_062)
SPLIT_NAMES = ("train", "val", "test")


def split_counts(total: int, ratios: Sequence[int] = KAGGLE_SPLIT) -> tuple[int, ...]:
    """Line counts of each split for `total` lines, scaled from `ratios`.

    With the default ratios and the full Kaggle file (45,840,617 lines) this gives exactly
    the seeds' 36,672,493 / 4,584,062 / 4,584,062. The last split takes the rounding rest.

    Example:
        >>> split_counts(1000)
        (799, 100, 101)
    """
    if total < 0 or any(r < 0 for r in ratios) or sum(ratios) <= 0:
        raise ValueError(f"split_counts: bad total {total} or ratios {ratios}")
    s = sum(ratios)
    counts = [int(total * r // s) for r in ratios[:-1]]
    counts.append(total - sum(counts))
    return tuple(counts)


def split(src, dst_dir, *, counts: Sequence[int] | None = None,
          ratios: Sequence[int] = KAGGLE_SPLIT, names: Sequence[str] = SPLIT_NAMES,
          chunk_bytes: int = 64 << 20) -> dict[str, Path]:
    """Split a Criteo TSV by line counts, like the seeds' `head` / `tail` recipe.

    The first `counts[0]` lines go to `names[0]`.txt, the next `counts[1]` to `names[1]`.txt,
    and so on; bytes are copied unparsed. Each output is written atomically.

    Args:
        src: input TSV path (or list of paths, read as one stream).
        dst_dir: output folder.
        counts: exact line counts per split (must sum to the number of lines); default: the
            `ratios` scaled to the input's line count (`split_counts`).
        ratios: relative sizes used when `counts` is None (default: the Kaggle 36.7M/4.6M/4.6M).
        names: output names, one per split.

    Returns:
        {name: path} of the written files.

    Example:
        >>> import tempfile
        >>> from embedlab.data.criteo import generate
        >>> d = Path(tempfile.mkdtemp())
        >>> out = split(generate(d / "day.txt", rows=1000, seed=0, progress=False), d / "splits")
        >>> {name: len(p.read_text().splitlines()) for name, p in out.items()}
        {'train': 799, 'val': 100, 'test': 101}
    """
    total = count_lines(src)
    if counts is None:
        counts = split_counts(total, ratios)
    counts = [int(c) for c in counts]
    if len(counts) != len(names):
        raise ValueError(f"split: {len(counts)} counts for {len(names)} names")
    if any(c < 0 for c in counts) or sum(counts) != total:
        raise ValueError(f"split: counts {counts} must be >= 0 and sum to the {total} lines")
    dst_dir = Path(dst_dir)
    out = {name: dst_dir / f"{name}.txt" for name in names}
    bounds = np.cumsum([0] + counts)
    with contextlib.ExitStack() as stack:
        tmps = [stack.enter_context(atomic_file(out[n])) for n in names]
        files = [stack.enter_context(open(t, "wb")) for t in tmps]
        line = 0  # lines written so far
        for first, buf, _ in (c for p in _as_paths(src) for c in _iter_byte_chunks(p, chunk_bytes)):
            nl = np.flatnonzero(buf == 10)
            lo = 0
            while lo < len(nl):
                k = int(np.searchsorted(bounds, line, side="right")) - 1
                take = min(len(nl) - lo, int(bounds[k + 1]) - line)
                a = 0 if lo == 0 else int(nl[lo - 1]) + 1
                b = int(nl[lo + take - 1]) + 1
                files[k].write(buf[a:b].tobytes())
                lo += take
                line += take
        for f in files:
            f.close()
    return out



class _Counter:
    """Exact value counts of a stream of uint keys, merged in batches to bound sort work."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []
        self.keys = np.empty(0, dtype)
        self.counts = np.empty(0, np.int64)

    def add(self, values: np.ndarray):
        u, c = np.unique(values, return_counts=True)
        self.parts.append((u, c))
        if len(self.parts) >= 8:
            self._merge()

    def _merge(self):
        if not self.parts:
            return
        keys = np.concatenate([self.keys] + [u for u, _ in self.parts])
        counts = np.concatenate([self.counts] + [c for _, c in self.parts])
        self.keys, inv = np.unique(keys, return_inverse=True)
        self.counts = np.bincount(inv, weights=counts, minlength=len(self.keys)).astype(np.int64)
        self.parts = []

    def frequent(self, threshold: int, exclude=None) -> np.ndarray:
        self._merge()
        keep = self.counts >= threshold
        if exclude is not None:
            keep &= ~exclude(self.keys)
        return self.keys[keep]


def _cross_key(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.uint64) << np.uint64(32)) | b.astype(np.uint64)


def _cross_has_missing(k: np.ndarray) -> np.ndarray:
    return ((k >> np.uint64(32)) == MISSING_HEX) | ((k & np.uint64(0xFFFFFFFF)) == MISSING_HEX)


def _encode(values: np.ndarray, vocab) -> np.ndarray:
    """Local ids: 1 + position in the sorted vocabulary, 0 for rare/missing/unseen values.

    `vocab` is a `pandas.Index` over the sorted frequent values: its hash lookup is 3-7x
    faster than a binary search once vocabularies hold thousands of values.
    """
    if len(vocab) == 0:
        return np.zeros(len(values), np.int64)
    return vocab.get_indexer(values).astype(np.int64) + 1


# The pieces of the recipe that the single-process path and the Dask path (`etl_dask`)
# share, so that both compute every value with the same code.
_CROSS_IDX = [(CAT_COLUMNS.index(a), CAT_COLUMNS.index(b)) for a, b in CROSSES]


def _slot_columns(feature_cross: bool) -> list[str]:
    return CAT_COLUMNS + ([f"{a}_{b}" for a, b in CROSSES] if feature_cross else [])


def _schema(columns):
    import pyarrow as pa
    return pa.schema([(LABEL, pa.float32())] + [(c, pa.float32()) for c in INT_COLUMNS]
                     + [(c, pa.int64()) for c in columns])


def _slot_values(block: Block, feature_cross: bool) -> list[np.ndarray]:
    """The values each slot counts and encodes: C1..C26 (uint32), then the crossed pairs (uint64)."""
    vals = [block.cats[:, j] for j in range(NUM_CAT)]
    if feature_cross:
        vals += [_cross_key(block.cats[:, a], block.cats[:, b]) for a, b in _CROSS_IDX]
    return vals


def _slot_exclude(slot: int):
    """Values of a slot that never enter its vocabulary (missing, or a pair with a missing side)."""
    return (lambda k: k == MISSING_HEX) if slot < NUM_CAT else _cross_has_missing


def _layout(vocabs):
    """Slot sizes (id 0 = rare/missing) and the first global id of each slot (HugeCTR's offsets)."""
    slot_sizes = [len(v) + 1 for v in vocabs]
    offsets = np.concatenate([[0], np.cumsum(slot_sizes)[:-1]]).astype(np.int64)
    return slot_sizes, offsets


def _encode_block(block: Block, lookups, offsets, dmin, dmax, normalize_dense: bool,
                  feature_cross: bool, schema):
    """One parsed block -> a pyarrow table of the output schema (label, dense, global ids)."""
    import pyarrow as pa
    dense = _dense(block)
    if normalize_dense:
        span = np.where(dmax > dmin, dmax - dmin, 1.0)
        dense = np.clip((dense - dmin) / span, 0.0, 1.0)
    cols = {LABEL: block.label.astype(np.float32)}
    for j, c in enumerate(INT_COLUMNS):
        cols[c] = dense[:, j].astype(np.float32)
    names = schema.names[1 + NUM_INT:]
    for k, v in enumerate(_slot_values(block, feature_cross)):
        cols[names[k]] = _encode(v, lookups[k]) + offsets[k]
    return pa.table(cols, schema=schema)


def _metadata(slot_info, paths, total_lines, counts, rows, normalize_dense, feature_cross,
              freq_threshold, dmin, dmax, malformed, seconds, files) -> dict:
    return dict(slot_info, source=[str(p) for p in paths], lines=total_lines,
                split_lines=dict(zip(SPLIT_NAMES, counts)), rows=rows,
                label=LABEL, dense=INT_COLUMNS, normalize_dense=normalize_dense,
                feature_cross=feature_cross, freq_threshold=int(freq_threshold),
                dense_log_min=dmin.tolist(), dense_log_max=dmax.tolist(),
                malformed=malformed, seconds=seconds, files=files)


@dataclass
class PreprocessResult:
    """What `preprocess` wrote.

    Attributes:
        dst: output folder. files: {split name: [parquet paths]}. rows: {split: rows written}.
        columns: categorical column names in slot order (C1..C26, then crosses).
        slot_size_array: cardinality per slot (id 0 = rare/missing). offsets: first global
            id of each slot. malformed: number of malformed lines skipped. errors: the first
            malformed lines as (path, line, reason). seconds: wall time. rows_per_second:
            input lines / seconds.
    """
    dst: Path
    files: dict
    rows: dict
    columns: list
    slot_size_array: list
    offsets: list
    dense_min: list
    dense_max: list
    malformed: int
    errors: list
    seconds: float
    rows_per_second: float


def _check_preprocess_args(on_error, freq_threshold, row_group_rows, rows_per_file, chunk_bytes) -> None:
    """The argument checks of `preprocess`, shared with `etl_dask.preprocess`."""
    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error must be 'fail' or 'skip', got {on_error!r}")
    if int(freq_threshold) < 1:
        raise ValueError(f"freq_threshold must be >= 1, got {freq_threshold}")
    if row_group_rows < 1 or rows_per_file < 1:
        raise ValueError("row_group_rows and rows_per_file must be >= 1")
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")


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
            process's (see `embedlab.data.criteo.etl_dask`, which also takes fsspec URLs).

    Returns:
        A `PreprocessResult`.

    Example:
        >>> import tempfile
        >>> from embedlab.data.criteo import generate
        >>> d = Path(tempfile.mkdtemp())
        >>> res = preprocess(generate(d / "day.txt", rows=1000, seed=0, progress=False),
        ...                  d / "criteo_parquet", progress=False)
        >>> res.rows, res.columns[-2:], [p.name for p in res.files["val"]]
        ({'train': 799, 'val': 100, 'test': 101}, ['C1_C2', 'C3_C4'], ['part_00000.parquet'])
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from .._progress import tqdm

    _check_preprocess_args(on_error, freq_threshold, row_group_rows, rows_per_file, chunk_bytes)
    if client is not None or os.environ.get("EMBEDLAB_DASK_SCHEDULER"):
        from . import etl_dask
        return etl_dask.preprocess(
            src, dst, normalize_dense=normalize_dense, feature_cross=feature_cross,
            freq_threshold=freq_threshold, split=split, on_error=on_error,
            row_group_rows=row_group_rows, rows_per_file=rows_per_file,
            chunk_bytes=chunk_bytes, progress=progress, client=client)
    paths = _as_paths(src)
    t0 = time.perf_counter()
    total_lines = count_lines(paths)
    if split is None:
        counts = (total_lines, 0, 0)
    else:
        counts = split_counts(total_lines, split)
    bounds = np.cumsum([0] + list(counts)) + 1          # 1-based first line of each split
    total_bytes = sum(p.stat().st_size for p in paths)

    def stream(desc, errors, stop_line=None):
        # Line numbers run on across files, so split boundaries work on the concatenation.
        offset = 0
        with tqdm(total=total_bytes, unit="B", unit_scale=True, desc=desc,
                  disable=not progress, leave=False) as bar:
            for path in paths:
                nlines = 0
                for first, buf, nbytes in _iter_byte_chunks(path, chunk_bytes):
                    if stop_line is not None and first + offset >= stop_line:
                        return          # every later line lies past the stop too
                    block = _parse(buf, first)
                    if len(block.bad_line):
                        errors.extend((str(path), int(l), r)
                                      for l, r in zip(block.bad_line, block.bad_reason))
                        if on_error == "fail":
                            raise CriteoFormatError(path, block.bad_line[0], block.bad_reason[0])
                    nlines = first + int((buf == 10).sum()) - 1
                    block.line = block.line + offset                  # global line number
                    bar.update(nbytes)
                    yield block
                offset += nlines

    # ---- pass 1: statistics over the training lines
    columns = _slot_columns(feature_cross)
    counters = [_Counter(np.uint32 if k < NUM_CAT else np.uint64) for k in range(len(columns))]
    dmin = np.full(NUM_INT, np.inf)
    dmax = np.full(NUM_INT, -np.inf)
    errors1: list = []
    for block in stream("ETL pass 1/2 (count)", errors1, stop_line=int(bounds[1])):
        sel = block.line < bounds[1]
        if not sel.all():
            block = _select(block, sel)
        if len(block) == 0:
            continue
        for counter, values in zip(counters, _slot_values(block, feature_cross)):
            counter.add(values)
        d = _dense(block)
        dmin = np.minimum(dmin, d.min(axis=0))
        dmax = np.maximum(dmax, d.max(axis=0))
    vocabs = [c.frequent(freq_threshold, exclude=_slot_exclude(k)) for k, c in enumerate(counters)]
    del counters
    import pandas as pd
    lookups = [pd.Index(v) for v in vocabs]
    slot_sizes, offsets = _layout(vocabs)
    dmin = np.where(np.isfinite(dmin), dmin, 0.0)
    dmax = np.where(np.isfinite(dmax), dmax, 0.0)
    schema = _schema(columns)
    dst = Path(dst)
    files = {name: [] for name in SPLIT_NAMES}
    rows = {name: 0 for name in SPLIT_NAMES}
    errors2: list = []
    # ---- pass 2: encode and write every split
    with atomic_dir(dst) as tmp:
        writers: dict[str, object] = {}
        pending: dict[str, list] = {name: [] for name in SPLIT_NAMES}

        def flush(name, final=False):
            # Write whole row groups; keep the remainder until more rows arrive (or the end).
            tables = pending[name]
            if not tables:
                return
            table = pa.concat_tables(tables)
            while len(table) >= row_group_rows or (final and len(table)):
                w = writers.get(name)
                if w is None or rows_in_file[name] >= rows_per_file:
                    if w is not None:
                        w.close()
                    p = tmp / name / f"part_{len(files[name]):05d}.parquet"
                    p.parent.mkdir(exist_ok=True)
                    files[name].append(dst / name / p.name)
                    w = writers[name] = pq.ParquetWriter(p, schema, compression="snappy")
                    rows_in_file[name] = 0
                take = min(row_group_rows, rows_per_file - rows_in_file[name], len(table))
                w.write_table(table.slice(0, take), row_group_size=row_group_rows)
                rows_in_file[name] += take
                rows[name] += take
                table = table.slice(take)
            pending[name] = [table] if len(table) else []

        rows_in_file = {name: 0 for name in SPLIT_NAMES}
        try:
            for block in stream("ETL pass 2/2 (write)", errors2):
                table = _encode_block(block, lookups, offsets, dmin, dmax, normalize_dense,
                                      feature_cross, schema)
                which = np.searchsorted(bounds, block.line, side="right") - 1
                for s, name in enumerate(SPLIT_NAMES):
                    sel = np.flatnonzero(which == s)
                    if len(sel) == len(block):
                        pending[name].append(table)
                    elif len(sel):
                        pending[name].append(table.take(sel))
                    flush(name)
            for name in SPLIT_NAMES:
                flush(name, final=True)
                if name not in writers:           # an empty split still gets a valid file
                    p = tmp / name / "part_00000.parquet"
                    p.parent.mkdir(exist_ok=True)
                    pq.write_table(schema.empty_table(), p)
                    files[name].append(dst / name / p.name)
        finally:
            for w in writers.values():
                w.close()
        seconds = time.perf_counter() - t0
        slot_info = {"slot_size_array": slot_sizes, "columns": columns,
                     "offsets": offsets.tolist()}
        (tmp / "slot_size_array.json").write_text(json.dumps(slot_info, indent=1))
        meta = _metadata(slot_info, paths, total_lines, counts, rows, normalize_dense,
                         feature_cross, freq_threshold, dmin, dmax, len(errors2), seconds,
                         {k: [str(Path(p).relative_to(dst)) for p in v] for k, v in files.items()})
        (tmp / "metadata.json").write_text(json.dumps(meta, indent=1))
    if errors2:
        shown = "; ".join(f"{p}:{l}: {r}" for p, l, r in errors2[:3])
        warnings.warn(f"preprocess skipped {len(errors2)} malformed lines (first: {shown})",
                      stacklevel=2)
    return PreprocessResult(dst=dst, files=files, rows=rows, columns=columns,
                            slot_size_array=slot_sizes, offsets=offsets.tolist(),
                            dense_min=dmin.tolist(), dense_max=dmax.tolist(),
                            malformed=len(errors2), errors=errors2[:100], seconds=seconds,
                            rows_per_second=total_lines / max(seconds, 1e-9))



def _dense(block: Block) -> np.ndarray:
    """log(x + 1) of the integer features with missing -> 0 and negatives clipped to 0."""
    x = np.where(block.int_missing, 0, np.maximum(block.ints, 0))
    return np.log1p(x.astype(np.float64))


def load_slot_sizes(dst) -> dict:
    """Read `slot_size_array.json` written by `preprocess` (keys slot_size_array, columns, offsets)."""
    p = Path(dst) / "slot_size_array.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p} not found: run criteo.preprocess(src, {dst!r}) first")
    return json.loads(p.read_text())

"""Criteo ETL in this process: TSV -> parquet splits in two streaming passes; splitting a TSV.

`criteo.preprocess` runs `preprocess` here unless it is given a Dask cluster
(`etl_dask.preprocess`); both compute every value with the functions of `recipe`.
"""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ..._io import atomic_dir, atomic_file
from .layout import NUM_CAT, NUM_INT
from .parse import CriteoFormatError, as_paths, count_lines, iter_byte_chunks, parse_block, select_rows
from .recipe import (KAGGLE_SPLIT, SPLIT_NAMES, PreprocessResult, check_preprocess_args,
                     dense_features, encode_block, metadata, output_schema, slot_columns,
                     slot_exclude, slot_info, slot_values, split_counts, vocab_layout,
                     warn_skipped)

__all__ = ["preprocess", "split"]


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
        for first, buf, _ in (c for p in as_paths(src) for c in iter_byte_chunks(p, chunk_bytes)):
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


def preprocess(src, dst, *, normalize_dense: bool = True, feature_cross: bool = True,
               freq_threshold: int = 6, split: Sequence[int] | None = KAGGLE_SPLIT,
               on_error: str = "fail", row_group_rows: int = 65_536,
               rows_per_file: int = 2_000_000, chunk_bytes: int = 32 << 20,
               progress: bool = True) -> PreprocessResult:
    """`criteo.preprocess` in this process: the recipe, streamed in two passes over the input.

    Pass 1 reads the training lines, counting every category (and each crossed pair) and the
    range of the dense features; pass 2 encodes all lines and writes the parquet parts,
    `rows_per_file` rows per file. The arguments, the output and the errors are those of
    `criteo.preprocess` (see it), which calls this function when no Dask cluster is named.

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
    check_preprocess_args(on_error, freq_threshold, row_group_rows, rows_per_file, chunk_bytes)
    t0 = time.perf_counter()
    inp = _Input(as_paths(src), int(chunk_bytes), on_error, progress)
    total_lines = count_lines(inp.paths)
    counts = (total_lines, 0, 0) if split is None else split_counts(total_lines, split)
    bounds = np.cumsum([0] + list(counts)) + 1          # 1-based first line of each split
    columns = slot_columns(feature_cross)
    vocabs, dmin, dmax = _count_pass(inp, int(bounds[1]), len(columns), feature_cross,
                                     freq_threshold)
    slot_sizes, offsets = vocab_layout(vocabs)
    info = slot_info(slot_sizes, columns, offsets)
    dst = Path(dst)
    errors: list = []
    with atomic_dir(dst) as tmp:
        writer = _SplitWriter(dst, tmp, output_schema(columns), row_group_rows, rows_per_file)
        _write_pass(inp, writer, bounds, vocabs, offsets, dmin, dmax, normalize_dense,
                    feature_cross, errors)
        seconds = time.perf_counter() - t0
        (tmp / "slot_size_array.json").write_text(json.dumps(info, indent=1))
        meta = metadata(info, inp.paths, total_lines, counts, writer.rows, normalize_dense,
                        feature_cross, freq_threshold, dmin, dmax, len(errors), seconds,
                        {k: [str(Path(p).relative_to(dst)) for p in v]
                         for k, v in writer.files.items()})
        (tmp / "metadata.json").write_text(json.dumps(meta, indent=1))
    warn_skipped(len(errors), errors, stacklevel=3)      # the caller of criteo.preprocess
    return PreprocessResult(dst=dst, files=writer.files, rows=writer.rows, columns=columns,
                            slot_size_array=slot_sizes, offsets=offsets.tolist(),
                            dense_min=dmin.tolist(), dense_max=dmax.tolist(),
                            malformed=len(errors), errors=errors[:100], seconds=seconds,
                            rows_per_second=total_lines / max(seconds, 1e-9))


class _Input:
    """The input files as one stream of parsed blocks, with global line numbers."""

    def __init__(self, paths, chunk_bytes: int, on_error: str, progress: bool):
        self.paths, self.chunk_bytes, self.on_error, self.progress = \
            paths, chunk_bytes, on_error, progress
        self.total_bytes = sum(p.stat().st_size for p in paths)

    def blocks(self, desc, errors, stop_line=None):
        """Parsed blocks in input order; malformed lines go to `errors` as (path, line, reason)
        and raise `CriteoFormatError` with on_error="fail". Blocks that start at or after
        `stop_line` are not read."""
        from .._progress import tqdm
        # Line numbers run on across files, so split boundaries work on the concatenation.
        offset = 0
        with tqdm(total=self.total_bytes, unit="B", unit_scale=True, desc=desc,
                  disable=not self.progress, leave=False) as bar:
            for path in self.paths:
                nlines = 0
                for first, buf, nbytes in iter_byte_chunks(path, self.chunk_bytes):
                    if stop_line is not None and first + offset >= stop_line:
                        return          # every later line lies past the stop too
                    block = parse_block(buf, first)
                    if len(block.bad_line):
                        errors.extend((str(path), int(l), r)
                                      for l, r in zip(block.bad_line, block.bad_reason))
                        if self.on_error == "fail":
                            raise CriteoFormatError(path, block.bad_line[0], block.bad_reason[0])
                    nlines = first + int((buf == 10).sum()) - 1
                    block.line = block.line + offset                  # global line number
                    bar.update(nbytes)
                    yield block
                offset += nlines


def _count_pass(inp: _Input, train_end: int, n_slots: int, feature_cross: bool,
                freq_threshold: int):
    """Pass 1: the vocabularies (per slot, its sorted frequent values) and the dense min / max
    (0 where no training line has a value) over the lines before `train_end`."""
    counters = [_Counter(np.uint32 if k < NUM_CAT else np.uint64) for k in range(n_slots)]
    dmin = np.full(NUM_INT, np.inf)
    dmax = np.full(NUM_INT, -np.inf)
    for block in inp.blocks("ETL pass 1/2 (count)", [], stop_line=train_end):
        sel = block.line < train_end
        if not sel.all():
            block = select_rows(block, sel)
        if len(block) == 0:
            continue
        for counter, values in zip(counters, slot_values(block, feature_cross)):
            counter.add(values)
        d = dense_features(block)
        dmin = np.minimum(dmin, d.min(axis=0))
        dmax = np.maximum(dmax, d.max(axis=0))
    vocabs = [c.frequent(freq_threshold, exclude=slot_exclude(k)) for k, c in enumerate(counters)]
    dmin = np.where(np.isfinite(dmin), dmin, 0.0)
    dmax = np.where(np.isfinite(dmax), dmax, 0.0)
    return vocabs, dmin, dmax


def _write_pass(inp: _Input, writer: "_SplitWriter", bounds, vocabs, offsets, dmin, dmax,
                normalize_dense, feature_cross, errors) -> None:
    """Pass 2: encode every line and hand each split's rows to `writer`, in input order."""
    import pandas as pd
    lookups = [pd.Index(v) for v in vocabs]
    try:
        for block in inp.blocks("ETL pass 2/2 (write)", errors):
            table = encode_block(block, lookups, offsets, dmin, dmax, normalize_dense,
                                 feature_cross, writer.schema)
            which = np.searchsorted(bounds, block.line, side="right") - 1
            for s, name in enumerate(SPLIT_NAMES):
                sel = np.flatnonzero(which == s)
                if len(sel) == len(block):
                    writer.add(name, table)
                elif len(sel):
                    writer.add(name, table.take(sel))
        writer.finish()
    finally:
        writer.close()


class _SplitWriter:
    """The parquet parts of every split: `<split>/part_NNNNN.parquet` of `rows_per_file` rows
    in row groups of `row_group_rows`, built in `tmp` and listed under `dst`."""

    def __init__(self, dst: Path, tmp: Path, schema, row_group_rows: int, rows_per_file: int):
        self.dst, self.tmp, self.schema = dst, tmp, schema
        self.row_group_rows, self.rows_per_file = row_group_rows, rows_per_file
        self.files = {name: [] for name in SPLIT_NAMES}
        self.rows = {name: 0 for name in SPLIT_NAMES}
        self._writers: dict = {}
        self._rows_in_file = {name: 0 for name in SPLIT_NAMES}
        self._pending: dict[str, list] = {name: [] for name in SPLIT_NAMES}

    def add(self, name: str, table) -> None:
        self._pending[name].append(table)
        self._flush(name)

    def finish(self) -> None:
        """Write what is pending; an empty split still gets a valid (empty) file."""
        import pyarrow.parquet as pq
        for name in SPLIT_NAMES:
            self._flush(name, final=True)
            if name not in self._writers:
                p = self._new_path(name)
                pq.write_table(self.schema.empty_table(), p)

    def close(self) -> None:
        for w in self._writers.values():
            w.close()

    def _new_path(self, name: str) -> Path:
        p = self.tmp / name / f"part_{len(self.files[name]):05d}.parquet"
        p.parent.mkdir(exist_ok=True)
        self.files[name].append(self.dst / name / p.name)
        return p

    def _flush(self, name: str, final: bool = False) -> None:
        # Write whole row groups; keep the remainder until more rows arrive (or the end).
        import pyarrow as pa
        import pyarrow.parquet as pq
        tables = self._pending[name]
        if not tables:
            return
        table = pa.concat_tables(tables)
        rgr, rpf = self.row_group_rows, self.rows_per_file
        while len(table) >= rgr or (final and len(table)):
            w = self._writers.get(name)
            if w is None or self._rows_in_file[name] >= rpf:
                if w is not None:
                    w.close()
                w = self._writers[name] = pq.ParquetWriter(self._new_path(name), self.schema,
                                                           compression="snappy")
                self._rows_in_file[name] = 0
            take = min(rgr, rpf - self._rows_in_file[name], len(table))
            w.write_table(table.slice(0, take), row_group_size=rgr)
            self._rows_in_file[name] += take
            self.rows[name] += take
            table = table.slice(take)
        self._pending[name] = [table] if len(table) else []

"""The Criteo ETL of `criteo.preprocess` on a `dask.distributed` cluster, with identical output.

`criteo.preprocess(src, dst, client=...)` lands here (see its docstring for the recipe). The
work is cut into chunks: byte ranges of at most `chunk_bytes` of each input file, of equal size
within a file and, for a file of more than one chunk, a multiple of the number of workers (a
chunk owns the lines that start inside its range; a `.gz` file is one chunk, gzip cannot be
entered midway).
Every chunk is one task per pass, run on the workers:

- count: the lines of each chunk, so every chunk knows the global line number of its first
  line, hence which lines are training / validation / test;
- pass 1: per chunk, the value counts of every slot (C1..C26 and the crossed pairs) and the
  min / max of the dense features over its training lines; merged in a tree (`fan_in` results
  per merge task); the vocabularies (frequency threshold, hex order, HugeCTR's offsets) are
  built once, by one task, from the merged counts, and stay on the cluster;
- pass 2: per chunk, parse, encode with the vocabularies, and write the chunk's rows of each
  split as parquet part(s), all chunks in parallel.

Identical output. The vocabularies, slot sizes, offsets, dense min/max and every value of every
row are those of the single-process path: counts are exact integer sums, min/max are exact,
and every value comes from the same functions (`recipe`: slot values, `encode_block`, ...). Row order is the input order: files
in the order given, lines in file order. Parts are named `<split>/part_<chunk>_<k>.parquet`
(zero-padded chunk index, then k = 0, 1, ... when a chunk holds more than `rows_per_file`
rows of a split), so the sorted file names (`formats.parquet_files`) and `metadata.json`'s
`files` list both read the rows in input order. What differs from the single-process folder
is only how the rows are cut into files and row groups (per chunk instead of `rows_per_file`
per file), never the rows.

Inputs and outputs are local paths or fsspec URLs. Tested here: local paths and `file://`
URLs on one machine. On several machines every worker must reach the same input and output
paths: a shared file system mounted at the same path, or an object store URL (`s3://`,
`gs://`, ... with s3fs / gcsfs installed on every worker; not tested here).

A worker that dies: Dask runs the chunks it held again on the other workers (up to
`distributed.scheduler.allowed-failures` times per task, default 3). Every task is a pure
function of its chunk, and a part file is written under a unique temporary name and renamed
into place, so a rerun writes the same bytes and the output is identical. A chunk that kills
workers more often than that fails the run with a `ChunkFailedError` naming the chunk; the
output is built in a temporary folder next to `dst` and renamed into place only at the end, so
nothing partial is left (on a local or shared file system the rename is atomic; on an object
store it is a copy).

The HugeCTR Norm conversion of the parquet output (`formats.parquet_to_norm`) runs per part
too: `parquet_to_norm(src, out_dir, client=...)` (from `norm_dask`) writes the same data files, file lists and
keysets, byte for byte, as the single-process conversion of the same parquet files (one task per
group of data files, reading only the row groups it needs; one task per file list writes its
keyset from the data files' unique keys). Its output folder is local or on a shared file system
(HugeCTR's file lists name local paths).

The cluster plumbing (`local_client`, `resolve_client`, `worker_peak_rss`, `ChunkFailedError`,
`SCHEDULER_ENV`) lives in `cluster`, the Norm conversion (`parquet_to_norm`, `norm_digest`) in
`norm_dask`; this module exports them too, as the Dask side of `criteo`.

Example:
    A LocalCluster of one worker process on 127.0.0.1, a few seconds; on several machines
    `client` is a `Client` of a `dask scheduler` (see the README).

    >>> from embedlab.data import criteo, formats
    >>> from embedlab.data.criteo import etl_dask
    >>> txt = criteo.generate("day.txt", rows=3_000, seed=1, progress=False)
    >>> single = criteo.preprocess(txt, "single", progress=False)
    >>> with etl_dask.local_client(n_workers=1) as client:
    ...     res = criteo.preprocess(txt, "on_dask", chunk_bytes=200_000, client=client,
    ...                             progress=False)
    ...     lists = etl_dask.parquet_to_norm(res.files["train"], "norm_dask", client=client,
    ...                                      samples_per_file=1_000, progress=False)
    >>> etl_dask.output_digest(res) == etl_dask.output_digest(single)
    True
    >>> want = formats.parquet_to_norm(single.files["train"], "norm_single",
    ...                                samples_per_file=1_000, progress=False)
    >>> [p.name for p in lists], etl_dask.norm_digest(lists) == etl_dask.norm_digest(want)
    (['file_list.txt'], True)
"""
from __future__ import annotations

import gzip
import os
import threading
import time
import uuid
from dataclasses import dataclass

import numpy as np

from ..._io import remove_stale_temporaries, temporary_path
from .cluster import (SCHEDULER_ENV, ChunkFailedError, ClusterJob, dashboard_link, local_client,
                      remove_tree, resolve_client, swap_into_place, worker_peak_rss)
from .layout import NUM_CAT, NUM_INT
from .norm_dask import norm_digest, parquet_to_norm
from .parse import CriteoFormatError, parse_block, select_rows
from .recipe import (KAGGLE_SPLIT, SPLIT_NAMES, PreprocessResult, check_preprocess_args,
                     dense_features, encode_block, metadata, output_schema, slot_columns,
                     slot_exclude, slot_info, slot_values, split_counts, vocab_layout,
                     warn_skipped)

__all__ = ["preprocess", "parquet_to_norm", "local_client", "resolve_client", "worker_peak_rss",
           "output_digest", "norm_digest", "ChunkFailedError", "SCHEDULER_ENV"]

_MAX_ERRORS_KEPT = 100        # malformed lines kept per chunk for the report (all are counted)


@dataclass(frozen=True)
class _Chunk:
    """A byte range of one input file: the lines that start inside it (a `.gz` file is one)."""
    index: int          # global, in input order
    file: int           # index of the input file
    fs: object          # fsspec file system
    path: str           # path inside fs
    url: str            # as the user named it (for messages and metadata)
    start: int          # byte range [start, end) whose line starts the chunk owns
    end: int
    size: int           # file size
    gz: bool

    def describe(self) -> str:
        where = "the whole file" if self.gz else f"bytes {self.start:,}-{self.end:,}"
        return f"chunk {self.index} ({self.url}, {where})"




# --------------------------------------------------------------------------------------
# Chunks: planning and reading (run on the workers)
# --------------------------------------------------------------------------------------

def _plan(src, chunk_bytes: int, workers: int = 1) -> tuple[list, list]:
    """The input URLs and their chunks: `_files` cut by `_cut`."""
    files = _files(src)
    return [f[0] for f in files], _cut(files, chunk_bytes, workers)


def _files(src) -> list:
    """(url, fs, path, size, gz) of every input file, in order; checks that each exists."""
    from fsspec.core import url_to_fs
    urls = [os.fspath(src)] if isinstance(src, (str, os.PathLike)) else [os.fspath(s) for s in src]
    if not urls:
        raise ValueError("no Criteo input files given")
    files = []
    for url in urls:
        fs, path = url_to_fs(url)
        if not fs.isfile(path):
            raise FileNotFoundError(f"Criteo file {url} does not exist (or is not a file)")
        files.append((url, fs, path, int(fs.size(path)), path.endswith(".gz")))
    return files


def _cut(files, chunk_bytes: int, workers: int = 1) -> list:
    """Chunks of at most `chunk_bytes`, of equal size within a file. A file of more than one
    chunk is cut into a multiple of `workers` chunks, so that every worker gets as many and
    none waits alone for a last, odd chunk at the end of a pass. A `.gz` file is one chunk."""
    chunks = []
    for f, (url, fs, path, size, gz) in enumerate(files):
        if gz:
            ranges = [(0, size)]
        else:
            n = max(1, -(-size // chunk_bytes))
            if n > 1 and workers > 1:
                n = -(-n // workers) * workers
            cuts = sorted({size * k // n for k in range(n + 1)})     # equal to within a byte
            ranges = list(zip(cuts[:-1], cuts[1:]))                  # none for an empty file
        for start, end in ranges:
            chunks.append(_Chunk(len(chunks), f, fs, path, url, start, end, size, gz))
    return chunks


def _count_task(chunk: _Chunk) -> int:
    """Lines starting in the chunk's range (a last line without a newline counts)."""
    if chunk.gz:
        data = _read_gz(chunk)
        return data.count(b"\n") + (len(data) > 0 and not data.endswith(b"\n"))
    # A line starts at p when p == 0 or byte p-1 is a newline.
    lo = max(chunk.start - 1, 0)
    with chunk.fs.open(chunk.path, "rb") as f:
        f.seek(lo)
        data = f.read(chunk.end - 1 - lo) if chunk.end - 1 > lo else b""
    return data.count(b"\n") + (chunk.start == 0 and chunk.size > 0)


def _read_gz(chunk: _Chunk) -> bytes:
    with chunk.fs.open(chunk.path, "rb") as raw, gzip.open(raw, "rb") as f:
        return f.read()


def _read_lines(chunk: _Chunk, expect: int) -> np.ndarray:
    """The chunk's whole lines as uint8 ending in a newline; checks there are `expect` of them."""
    if chunk.gz:
        data = _read_gz(chunk)
    else:
        with chunk.fs.open(chunk.path, "rb") as f:
            lo = max(chunk.start - 1, 0)
            f.seek(lo)
            data = f.read(chunk.end - lo)
            if chunk.start > 0:              # skip the line that began before the range
                cut = data.find(b"\n")
                data = data[cut + 1:] if cut >= 0 else b""
            if data and not data.endswith(b"\n") and chunk.end < chunk.size:
                tail = []                    # finish the last line, which started inside
                while piece := f.read(1 << 16):
                    i = piece.find(b"\n")
                    if i >= 0:
                        tail.append(piece[:i + 1])
                        break
                    tail.append(piece)
                data += b"".join(tail)
    if data and not data.endswith(b"\n"):
        data += b"\n"
    buf = np.frombuffer(data, dtype=np.uint8)
    got = int(np.count_nonzero(buf == 10))
    if got != expect:
        raise RuntimeError(f"{chunk.describe()}: {got} lines now, {expect} when counted: "
                           f"the input changed during the ETL")
    return buf


def _parse_chunk(chunk, first, nlines, line_offset):
    """Parsed block (global line numbers) and its malformed lines as (url, line in file, reason)."""
    if nlines == 0:
        return None, []
    block = parse_block(_read_lines(chunk, nlines), first)
    errors = [(chunk.url, int(l), r) for l, r in zip(block.bad_line, block.bad_reason)]
    block.line = block.line + line_offset
    return block, errors


# --------------------------------------------------------------------------------------
# Pass 1: per-chunk statistics, tree merge, vocabularies
# --------------------------------------------------------------------------------------

def _stats_task(chunk, first, nlines, line_offset, train_end, feature_cross):
    block, errors = _parse_chunk(chunk, first, nlines, line_offset)
    n_slots = len(slot_columns(feature_cross))
    dmin = np.full(NUM_INT, np.inf)
    dmax = np.full(NUM_INT, -np.inf)
    counts = [(np.empty(0, np.uint32 if k < NUM_CAT else np.uint64), np.empty(0, np.int64))
              for k in range(n_slots)]
    if block is not None:
        sel = block.line < train_end
        if not sel.all():
            block = select_rows(block, sel)
        if len(block):
            counts = [np.unique(v, return_counts=True)
                      for v in slot_values(block, feature_cross)]
            counts = [(u, c.astype(np.int64)) for u, c in counts]
            d = dense_features(block)
            dmin, dmax = d.min(axis=0), d.max(axis=0)
    return {"counts": counts, "dmin": dmin, "dmax": dmax,
            "errors": errors[:_MAX_ERRORS_KEPT], "malformed": len(errors)}


def _errors_of(stats):
    return stats["malformed"], stats["errors"]


def _merge_task(*parts):
    counts = []
    for k in range(len(parts[0]["counts"])):
        keys = np.concatenate([p["counts"][k][0] for p in parts])
        cnt = np.concatenate([p["counts"][k][1] for p in parts])
        u, inv = np.unique(keys, return_inverse=True)
        counts.append((u, np.bincount(inv, weights=cnt, minlength=len(u)).astype(np.int64)))
    return {"counts": counts,
            "dmin": np.min([p["dmin"] for p in parts], axis=0),
            "dmax": np.max([p["dmax"] for p in parts], axis=0)}


def _vocab_task(merged, freq_threshold):
    vocabs = []
    for k, (keys, counts) in enumerate(merged["counts"]):
        keep = (counts >= freq_threshold) & ~slot_exclude(k)(keys)
        vocabs.append(keys[keep])
    slot_sizes, offsets = vocab_layout(vocabs)
    dmin = np.where(np.isfinite(merged["dmin"]), merged["dmin"], 0.0)
    dmax = np.where(np.isfinite(merged["dmax"]), merged["dmax"], 0.0)
    return {"token": uuid.uuid4().hex, "vocabs": vocabs, "slot_sizes": slot_sizes,
            "offsets": offsets, "dmin": dmin, "dmax": dmax}


def _vocab_summary(v):
    return {k: v[k] for k in ("slot_sizes", "offsets", "dmin", "dmax")}


# pandas Indexes over the vocabularies, built once per worker process (not once per chunk).
_LOOKUPS = {"token": None, "lookups": None}
_LOOKUPS_LOCK = threading.Lock()


def _lookups(vocab):
    import pandas as pd
    with _LOOKUPS_LOCK:
        if _LOOKUPS["token"] != vocab["token"]:
            _LOOKUPS["lookups"] = [pd.Index(v) for v in vocab["vocabs"]]
            _LOOKUPS["token"] = vocab["token"]
        return _LOOKUPS["lookups"]


def _warm_task(vocab) -> None:
    for lookup in _lookups(vocab):        # pandas builds an Index's hash table on first use
        lookup.get_indexer(lookup[:1])


# --------------------------------------------------------------------------------------
# Pass 2: encode and write
# --------------------------------------------------------------------------------------

def _write_task(chunk, first, nlines, line_offset, bounds, vocab, options, out_fs, tmp, width):
    import pyarrow.parquet as pq
    block, errors = _parse_chunk(chunk, first, nlines, line_offset)
    result = {"files": {name: [] for name in SPLIT_NAMES},
              "errors": errors[:_MAX_ERRORS_KEPT], "malformed": len(errors)}
    if block is None or len(block) == 0 or (errors and options["on_error"] == "fail"):
        return result
    columns = slot_columns(options["feature_cross"])
    schema = output_schema(columns)
    table = encode_block(block, _lookups(vocab), vocab["offsets"], vocab["dmin"],
                         vocab["dmax"], options["normalize_dense"], options["feature_cross"],
                         schema)
    which = np.searchsorted(bounds, block.line, side="right") - 1
    rpf, rgr = options["rows_per_file"], options["row_group_rows"]
    for s, name in enumerate(SPLIT_NAMES):
        sel = np.flatnonzero(which == s)
        if not len(sel):
            continue
        part = table if len(sel) == len(table) else table.take(sel)
        for k, lo in enumerate(range(0, len(part), rpf)):
            piece = part.slice(lo, rpf)
            rel = f"{name}/part_{chunk.index:0{width}d}_{k:03d}.parquet"
            # A unique name first, then a rename: a rerun after a worker died rewrites the
            # whole file, and a half-written one never carries the final name.
            work = f"{tmp}/_work/{uuid.uuid4().hex}.parquet"
            with out_fs.open(work, "wb") as f:
                pq.write_table(piece, f, row_group_size=rgr, compression="snappy")
            out_fs.mv(work, f"{tmp}/{rel}")
            result["files"][name].append((rel, len(piece)))
    return result


# --------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------

def preprocess(src, dst, *, normalize_dense: bool = True, feature_cross: bool = True,
               freq_threshold: int = 6, split=KAGGLE_SPLIT, on_error: str = "fail",
               row_group_rows: int = 65_536, rows_per_file: int = 2_000_000,
               chunk_bytes: int = 32 << 20, progress: bool = True, client=None,
               fan_in: int = 8) -> PreprocessResult:
    """`criteo.preprocess` on a Dask cluster: same arguments, same recipe, identical rows.

    See the module docstring for how the work is cut and what "identical" covers, and
    `criteo.preprocess` for the recipe and the arguments. Here `src` and `dst` may also be
    fsspec URLs, every worker must reach them under the same names, and `chunk_bytes` bounds the
    input of one task (a file is cut into equal chunks, a multiple of the number of workers).
    `fan_in` is the number of per-chunk results one merge task combines.

    With `progress`, prints the Dask dashboard address when one runs, and shows one bar for
    the line count and one for each pass.

    Returns:
        A `criteo.PreprocessResult` (its `files` hold paths for local output, URLs otherwise).

    Raises:
        criteo.CriteoFormatError: a malformed line with on_error="fail" (the first in input
            order); nothing is written.
        ChunkFailedError: a chunk's task failed for good (e.g. its workers died more often
            than Dask retries); the error names the chunk, nothing is written.

    Example: the module's.
    """
    check_preprocess_args(on_error, freq_threshold, row_group_rows, rows_per_file, chunk_bytes)
    if fan_in < 2:
        raise ValueError(f"fan_in must be >= 2, got {fan_in}")
    from fsspec.core import url_to_fs
    files = _files(src)
    out_fs, out_path = url_to_fs(os.fspath(dst))
    out = _Output(out_fs, out_path.rstrip("/"))
    opts = dict(normalize_dense=normalize_dense, feature_cross=feature_cross,
                freq_threshold=int(freq_threshold), split=split, on_error=on_error,
                row_group_rows=int(row_group_rows), rows_per_file=int(rows_per_file),
                fan_in=int(fan_in), progress=progress)
    with resolve_client(client) as c:
        t0 = time.perf_counter()
        chunks = _cut(files, int(chunk_bytes), len(c.scheduler_info()["workers"]))
        link = dashboard_link(c)
        if progress and link:
            print(f"Dask dashboard: {link}", flush=True)
        job = ClusterJob(c)
        out.open(job.run)
        try:
            result = _run(job, [f[0] for f in files], chunks, out, t0, **opts)
        except BaseException:
            job.cancel()
            remove_tree(out.fs, out.tmp)
            raise
        finally:
            job.release()
    return result


class _Output:
    """The output folder: built in `tmp` (next to `path`), renamed onto `path` at the end."""

    def __init__(self, fs, path: str):
        self.fs, self.path = fs, path
        p = fs.protocol
        self.local = "file" in ((p,) if isinstance(p, str) else tuple(p))
        self.tmp = None

    def open(self, run: str) -> None:
        parent, name = self.path.rsplit("/", 1) if "/" in self.path else ("", self.path)
        if self.local:
            # Named after this process, so the next run removes it if this one is killed.
            remove_stale_temporaries(self.path)
            self.tmp = str(temporary_path(self.path))
        else:
            self.tmp = f"{parent}/.{name}.tmp-{run}" if parent else f".{name}.tmp-{run}"
        if parent:
            self.fs.makedirs(parent, exist_ok=True)
        for sub in ("_work",) + SPLIT_NAMES:
            self.fs.makedirs(f"{self.tmp}/{sub}", exist_ok=True)

    def write_text(self, rel: str, text: str) -> None:
        with self.fs.open(f"{self.tmp}/{rel}", "w") as f:
            f.write(text)

    def finish(self) -> None:
        self.fs.rm(f"{self.tmp}/_work", recursive=True)
        swap_into_place(self.fs, self.tmp, self.path, self.local)

    def located(self, rel_files: dict):
        """(dst, {split: files}) as the result names them: paths for a local folder, URLs else."""
        if self.local:
            from pathlib import Path
            base = Path(self.path)
            return base, {k: [base / r for r in v] for k, v in rel_files.items()}
        root = self.fs.unstrip_protocol(self.path)
        return root, {k: [f"{root}/{r}" for r in v] for k, v in rel_files.items()}


@dataclass
class _Lines:
    """Where each chunk's lines sit: its line count, the number (in its file) of its first
    line, and the lines of the files before its own."""
    nlines: list
    first_in_file: list
    line_offset: list
    total: int

    def args(self, ch) -> tuple:
        """(first, nlines, line_offset): what a chunk task needs to number its lines."""
        i = ch.index
        return self.first_in_file[i], self.nlines[i], self.line_offset[i]


def _run(job, urls, chunks, out, t0, *, normalize_dense, feature_cross, freq_threshold, split,
         on_error, row_group_rows, rows_per_file, fan_in, progress):
    from .._progress import tqdm
    total_bytes = sum({ch.file: ch.size for ch in chunks}.values())

    def bar(desc):
        return tqdm(total=total_bytes, unit="B", unit_scale=True, desc=desc,
                    disable=not progress, leave=False)

    with bar("ETL lines (count)") as b:
        lines = _count_pass(job, chunks, len(urls), b)
    phase = {"count": time.perf_counter() - t0}
    counts = (lines.total, 0, 0) if split is None else split_counts(lines.total, split)
    bounds = np.cumsum([0] + list(counts)) + 1
    with bar("ETL pass 1/2 (count)") as b:
        stats = _stats_pass(job, chunks, lines, int(bounds[1]), feature_cross, on_error, b)
    phase["pass1"] = time.perf_counter() - t0 - sum(phase.values())
    vocab, summary, levels = _vocab_pass(job, stats, freq_threshold, fan_in)
    del stats
    phase["merge_vocab"] = time.perf_counter() - t0 - sum(phase.values())
    options = dict(normalize_dense=normalize_dense, feature_cross=feature_cross,
                   on_error=on_error, rows_per_file=rows_per_file, row_group_rows=row_group_rows)
    width = max(5, len(str(len(chunks) - 1)))
    with bar("ETL pass 2/2 (write)") as b:
        written = _write_pass(job, chunks, lines, bounds, vocab, options, out, width, b)
    phase["pass2"] = time.perf_counter() - t0 - sum(phase.values())
    malformed = sum(w["malformed"] for w in written)
    errors = [e for w in written for e in w["errors"]]
    if on_error == "fail" and malformed:
        raise CriteoFormatError(*errors[0])

    columns = slot_columns(feature_cross)
    rows, rel_files = _collect_parts(written, out, output_schema(columns), width)
    seconds = time.perf_counter() - t0
    slot_sizes = [int(x) for x in summary["slot_sizes"]]
    offsets = np.asarray(summary["offsets"], np.int64)
    dmin, dmax = summary["dmin"], summary["dmax"]
    import json
    info = slot_info(slot_sizes, columns, offsets)
    meta = metadata(info, urls, lines.total, counts, rows, normalize_dense, feature_cross,
                    freq_threshold, dmin, dmax, malformed, seconds, rel_files)
    meta["dask"] = {"workers": len(job.client.scheduler_info()["workers"]),
                    "chunks": len(chunks),
                    "chunk_bytes": max((ch.end - ch.start for ch in chunks), default=0),
                    "merge_levels": levels, "phase_seconds": phase}
    out.write_text("slot_size_array.json", json.dumps(info, indent=1))
    out.write_text("metadata.json", json.dumps(meta, indent=1))
    out.finish()
    dst, files = out.located(rel_files)
    warn_skipped(malformed, errors, stacklevel=4)        # the caller of criteo.preprocess
    return PreprocessResult(
        dst=dst, files=files, rows=rows, columns=columns, slot_size_array=slot_sizes,
        offsets=offsets.tolist(), dense_min=dmin.tolist(), dense_max=dmax.tolist(),
        malformed=malformed, errors=errors[:100], seconds=seconds,
        rows_per_second=lines.total / max(seconds, 1e-9))


def _weight(ch) -> int:
    return ch.end - ch.start if not ch.gz else ch.size


def _count_pass(job, chunks, n_files, bar) -> _Lines:
    """The line count of every chunk, hence the global number of every line."""
    job.release()
    futs = [job.submit(_count_task, ch, key=f"etl-count-{ch.index}", piece=ch, weight=_weight(ch))
            for ch in chunks]
    nlines = job.gather(futs, bar)
    first_in_file, file_lines = [], {}
    for ch, n in zip(chunks, nlines):
        seen = file_lines.get(ch.file, 0)
        first_in_file.append(seen + 1)
        file_lines[ch.file] = seen + n
    file_offset, acc = {}, 0
    for f in range(n_files):
        file_offset[f] = acc
        acc += file_lines.get(f, 0)
    return _Lines(nlines, first_in_file, [file_offset[ch.file] for ch in chunks], acc)


def _stats_pass(job, chunks, lines, train_end, feature_cross, on_error, bar) -> list:
    """Pass 1: the statistics of every chunk holding training lines (futures; the results stay
    on the cluster). Raises `CriteoFormatError` for a malformed one with on_error="fail"."""
    def holds_training(ch):
        first, n, offset = lines.args(ch)
        return n and first + offset < train_end

    train_chunks = [ch for ch in chunks if holds_training(ch)]
    stats = [job.submit(_stats_task, ch, *lines.args(ch), train_end, feature_cross,
                        key=f"etl-pass1-{ch.index}", piece=ch, weight=_weight(ch))
             for ch in train_chunks]
    if not stats:              # no training line at all: empty statistics, as single-process
        stats = [job.submit(_stats_task, None, 1, 0, 0, 0, feature_cross, key="etl-pass1-none")]
    errs = []
    for i, s in enumerate(stats):
        errs.append(job.submit(_errors_of, s, key=f"etl-pass1-errors-{i}"))
        job.name_like(errs[-1], s)
    job.gather(stats, bar, fetch=False)
    errors = job.gather(errs)
    if on_error == "fail":
        for n_bad, bad in errors:
            if n_bad:
                raise CriteoFormatError(*bad[0])
    return stats


def _vocab_pass(job, stats, freq_threshold, fan_in):
    """Merge the statistics in a tree, build the vocabularies once on the cluster and let every
    worker build its lookups. Returns (vocab future, its summary, merge levels)."""
    level, layer = 0, stats
    while len(layer) > 1:
        layer = [job.submit(_merge_task, *layer[i:i + fan_in], key=f"etl-merge-{level}-{i}")
                 for i in range(0, len(layer), fan_in)]
        level += 1
    vocab = job.submit(_vocab_task, layer[0], freq_threshold, key="etl-vocab")
    summary = job.gather([job.submit(_vocab_summary, vocab, key="etl-vocab-summary")])[0]
    # Every worker fetches the vocabularies and builds its lookups now, while no worker is busy.
    # Left to the first pass-2 task, a worker fetched them from one busy encoding its own chunk
    # (whose event loop shares the GIL with that work) and sat idle ~1 s (4M lines, 2 workers).
    job.gather([job.submit(_warm_task, vocab, key=f"etl-warm-{i}", workers=[w],
                           allow_other_workers=True)
                for i, w in enumerate(job.client.scheduler_info()["workers"])])
    # Drop the per-chunk statistics and the merge tree: the cluster frees them (Dask keeps
    # their recipe, to recompute the vocabularies if every copy of them is lost).
    del layer
    job.release()
    return vocab, summary, level


def _write_pass(job, chunks, lines, bounds, vocab, options, out, width, bar) -> list:
    """Pass 2: every chunk encoded and written as parts; returns each chunk's `_write_task`
    result (its parts and malformed lines)."""
    job.release()
    futs = [job.submit(_write_task, ch, *lines.args(ch), bounds, vocab, options, out.fs,
                       out.tmp, width, key=f"etl-pass2-{ch.index}", piece=ch, weight=_weight(ch))
            for ch in chunks]
    written = job.gather(futs, bar)
    job.release()
    return written


def _collect_parts(written, out, schema, width):
    """Rows and part names of every split, in input order; an empty split gets an empty part."""
    import pyarrow.parquet as pq
    rows = {name: 0 for name in SPLIT_NAMES}
    rel_files = {name: [] for name in SPLIT_NAMES}
    for w in written:
        for name in SPLIT_NAMES:
            for rel, n in w["files"][name]:
                rel_files[name].append(rel)
                rows[name] += n
    for name in SPLIT_NAMES:
        if not rel_files[name]:               # an empty split still gets a valid file
            rel = f"{name}/part_{0:0{width}d}_000.parquet"
            with out.fs.open(f"{out.tmp}/{rel}", "wb") as f:
                pq.write_table(schema.empty_table(), f)
            rel_files[name].append(rel)
    return rows, rel_files


def output_digest(result) -> dict:
    """A fingerprint of what `criteo.preprocess` wrote: equal digests mean identical output.

    Holds the slot sizes, offsets, columns, dense ranges, row counts, and per split and column
    a SHA-1 over the values of every row in order (the parts read one at a time, in the order
    of `result.files`), so two runs compare without holding either in memory.

    Args:
        result: a `PreprocessResult` (of either path).

    Returns:
        A dict (JSON-serializable).

    Example: the module's (a single-process and a Dask run compared).
    """
    import hashlib
    import pyarrow.parquet as pq
    digest = {"slot_size_array": list(result.slot_size_array), "offsets": list(result.offsets),
              "columns": list(result.columns), "dense_min": list(result.dense_min),
              "dense_max": list(result.dense_max), "rows": dict(result.rows), "splits": {}}
    for split, files in result.files.items():
        hashes, schema = {}, None
        for f in files:
            t = pq.read_table(f)
            schema = schema or str(t.schema)
            for name in t.column_names:
                col = t.column(name).combine_chunks().to_numpy(zero_copy_only=False)
                hashes.setdefault(name, hashlib.sha1()).update(col.tobytes())
        digest["splits"][split] = {"schema": schema,
                                   **{k: h.hexdigest() for k, h in hashes.items()}}
    return digest

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
and encoding is the same function (`etl._encode_block`). Row order is the input order: files
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
too: `parquet_to_norm(src, out_dir, client=...)` writes the same data files, file lists and
keysets, byte for byte, as the single-process conversion of the same parquet files (one task per
group of data files, reading only the row groups it needs; one task per file list writes its
keyset from the data files' unique keys). Its output folder is local or on a shared file system
(HugeCTR's file lists name local paths).

Example (a LocalCluster of one worker process on 127.0.0.1, a few seconds; on several
machines `client` is a `Client` of a `dask scheduler`, see the README):
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

import contextlib
import gzip
import logging
import os
import threading
import time
import uuid
import warnings
from dataclasses import dataclass

import numpy as np

from . import etl, layout, parse

__all__ = ["preprocess", "parquet_to_norm", "local_client", "resolve_client", "worker_peak_rss",
           "output_digest", "norm_digest", "ChunkFailedError", "SCHEDULER_ENV"]

SCHEDULER_ENV = "EMBEDLAB_DASK_SCHEDULER"
_MAX_ERRORS_KEPT = 100        # malformed lines kept per chunk for the report (all are counted)


class ChunkFailedError(RuntimeError):
    """A chunk's task failed on the cluster (e.g. it killed its workers too often)."""


@dataclass(frozen=True)
class _Chunk:
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
# Cluster
# --------------------------------------------------------------------------------------

@contextlib.contextmanager
def local_client(n_workers: int | None = None, *, memory_limit="auto",
                 cpu_threads: int | None = None):
    """A `LocalCluster` on 127.0.0.1 and a `Client` to it, both closed on exit.

    One worker process per core by default, one thread each (the ETL's NumPy / pyarrow work
    holds the GIL in places; processes scale, threads would not). The scheduler's HTTP server
    (the dashboard, with bokeh installed) listens on a free port of 127.0.0.1
    (`client.dashboard_link`).

    Args:
        n_workers: worker processes (default `os.cpu_count()`).
        memory_limit: per worker, as `LocalCluster` takes it ("auto": the machine's memory
            shared equally).
        cpu_threads: threads of each worker's native thread pool (pyarrow's CSV parser; set
            through OMP_NUM_THREADS). Default: the cores shared equally, `os.cpu_count() //
            n_workers` (at least 1), so that one worker alone still uses every core. 1 gives
            every worker the same single thread whatever their number (what a strong-scaling
            measurement wants, `helpers/benchmarks/etl.py`).

    Returns:
        A context manager yielding the `distributed.Client`.

    Example: the module's (a cluster of one worker).
    """
    from distributed import Client, LocalCluster
    n = int(n_workers) if n_workers is not None else (os.cpu_count() or 1)
    if n < 1:
        raise ValueError(f"local_client: n_workers must be >= 1, got {n_workers}")
    import dask
    # Two settings of Dask's nanny slow this ETL down. MALLOC_TRIM_THRESHOLD_=65536 (set before
    # the worker starts) makes glibc return freed memory at once, so every large NumPy /
    # pyarrow temporary is a fresh mmap with fresh page faults: parsing a chunk took about 2.5x
    # longer in a worker than in a plain process (measured on the loaded 2-core VM). OMP_NUM_THREADS=1 also
    # caps pyarrow's thread pool (the CSV parser): each worker gets its share of the cores.
    share = max(1, (os.cpu_count() or 1) // n) if cpu_threads is None else int(cpu_threads)
    if share < 1:
        raise ValueError(f"local_client: cpu_threads must be >= 1, got {cpu_threads}")
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                               host="127.0.0.1", dashboard_address="127.0.0.1:0",
                               memory_limit=memory_limit, silence_logs=logging.ERROR,
                               env={"OMP_NUM_THREADS": str(share)})
    try:
        client = Client(cluster)
        try:
            yield client
        finally:
            client.close()
    finally:
        cluster.close()


@contextlib.contextmanager
def resolve_client(client):
    """The `Client` that `client` names, as a context manager (closes what it opened).

    `client` is a `distributed.Client` (used as is), "local" (`local_client()`), a scheduler
    address ("tcp://host:8786"), or None: the scheduler named by `EMBEDLAB_DASK_SCHEDULER`.
    """
    if client is None:
        addr = os.environ.get(SCHEDULER_ENV, "").strip()
        if not addr:
            raise ValueError(f"no Dask cluster: pass client=... or set {SCHEDULER_ENV}")
        client = addr
    if isinstance(client, str):
        if client == "local":
            with local_client() as c:
                yield c
            return
        from distributed import Client
        try:
            c = Client(client, timeout=30)
        except OSError as e:
            raise ConnectionError(f"cannot reach the Dask scheduler at {client!r}: {e}") from e
        try:
            yield c
        finally:
            c.close()
        return
    from distributed import Client
    if not isinstance(client, Client):
        raise TypeError(f"client must be a distributed.Client, a scheduler address, 'local' or "
                        f"None, got {type(client).__name__}")
    yield client


def worker_peak_rss(client) -> dict:
    """Peak resident memory of each worker process so far, in bytes ({worker address: bytes}).

    Linux only (the VmHWM line of /proc/self/status).
    """
    return client.run(_peak_rss)


def output_digest(result) -> dict:
    """A fingerprint of what `criteo.preprocess` wrote: equal digests mean identical output.

    Holds the slot sizes, offsets, columns, dense ranges, row counts, and per split and column
    a SHA-1 over the values of every row in order (the parts read one at a time, in the order
    of `result.files`), so two runs compare without holding either in memory.

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


def norm_digest(lists) -> dict:
    """A fingerprint of what `parquet_to_norm` wrote (this module's or `formats`'): equal
    digests mean the same bytes.

    Holds, per file list (in order), the names of its data files and a SHA-1 of each, of its
    keyset, and of the folder's `norm_meta.json`. Only the folder the lists name is left out, so
    conversions into two folders compare.

    Example: the module's (the two conversions compared).
    """
    import hashlib
    from pathlib import Path
    from ..._io import read_file_list

    def sha1(p):
        h = hashlib.sha1()
        with open(p, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
        return h.hexdigest()

    out, metas = [], set()
    for lst in (lists if isinstance(lists, (list, tuple)) else [lists]):
        lst = Path(lst)
        files = read_file_list(lst)
        out.append({"list": lst.name, "files": [f.name for f in files],
                    "sha1": [sha1(f) for f in files], "keyset": sha1(lst.with_suffix(".keyset"))})
        metas.add(sha1(lst.parent / "norm_meta.json"))
    return {"lists": out, "norm_meta": sorted(metas)}


def _peak_rss() -> int:
    # VmHWM: the high-water mark of this process's own memory since it was exec'd. (getrusage's
    # ru_maxrss is no good here: Linux carries it over exec, so a worker spawned from a
    # Jupyter kernel would report the kernel's size.)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("worker_peak_rss needs Linux's /proc/self/status")


def _dashboard(client) -> str | None:
    try:
        services = client.scheduler_info().get("services", {})
    except Exception:                                                     # pragma: no cover
        return None
    return client.dashboard_link if "dashboard" in services else None


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
    block = parse._parse(_read_lines(chunk, nlines), first)
    errors = [(chunk.url, int(l), r) for l, r in zip(block.bad_line, block.bad_reason)]
    block.line = block.line + line_offset
    return block, errors


# --------------------------------------------------------------------------------------
# Pass 1: per-chunk statistics, tree merge, vocabularies
# --------------------------------------------------------------------------------------

def _stats_task(chunk, first, nlines, line_offset, train_end, feature_cross):
    block, errors = _parse_chunk(chunk, first, nlines, line_offset)
    n_slots = len(etl._slot_columns(feature_cross))
    dmin = np.full(layout.NUM_INT, np.inf)
    dmax = np.full(layout.NUM_INT, -np.inf)
    counts = [(np.empty(0, np.uint32 if k < layout.NUM_CAT else np.uint64), np.empty(0, np.int64))
              for k in range(n_slots)]
    if block is not None:
        sel = block.line < train_end
        if not sel.all():
            block = parse._select(block, sel)
        if len(block):
            counts = [np.unique(v, return_counts=True)
                      for v in etl._slot_values(block, feature_cross)]
            counts = [(u, c.astype(np.int64)) for u, c in counts]
            d = etl._dense(block)
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
        keep = (counts >= freq_threshold) & ~etl._slot_exclude(k)(keys)
        vocabs.append(keys[keep])
    slot_sizes, offsets = etl._layout(vocabs)
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
    result = {"files": {name: [] for name in etl.SPLIT_NAMES},
              "errors": errors[:_MAX_ERRORS_KEPT], "malformed": len(errors)}
    if block is None or len(block) == 0 or (errors and options["on_error"] == "fail"):
        return result
    columns = etl._slot_columns(options["feature_cross"])
    schema = etl._schema(columns)
    table = etl._encode_block(block, _lookups(vocab), vocab["offsets"], vocab["dmin"],
                                 vocab["dmax"], options["normalize_dense"],
                                 options["feature_cross"], schema)
    which = np.searchsorted(bounds, block.line, side="right") - 1
    rpf, rgr = options["rows_per_file"], options["row_group_rows"]
    for s, name in enumerate(etl.SPLIT_NAMES):
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
               freq_threshold: int = 6, split=etl.KAGGLE_SPLIT, on_error: str = "fail",
               row_group_rows: int = 65_536, rows_per_file: int = 2_000_000,
               chunk_bytes: int = 32 << 20, progress: bool = True, client=None,
               fan_in: int = 8) -> etl.PreprocessResult:
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
    """
    from .._progress import tqdm

    etl._check_preprocess_args(on_error, freq_threshold, row_group_rows, rows_per_file, chunk_bytes)
    if fan_in < 2:
        raise ValueError(f"fan_in must be >= 2, got {fan_in}")
    from fsspec.core import url_to_fs
    files = _files(src)
    urls = [f[0] for f in files]
    out_fs, out_path = url_to_fs(os.fspath(dst))
    out_path = out_path.rstrip("/")
    local_out = "file" in _protocols(out_fs)
    with resolve_client(client) as c:
        t0 = time.perf_counter()
        chunks = _cut(files, int(chunk_bytes), len(c.scheduler_info()["workers"]))
        link = _dashboard(c)
        if progress and link:
            print(f"Dask dashboard: {link}", flush=True)
        run = uuid.uuid4().hex[:8]
        parent, name = out_path.rsplit("/", 1) if "/" in out_path else ("", out_path)
        tmp = f"{parent}/.{name}.tmp-{run}" if parent else f".{name}.tmp-{run}"
        if parent:
            out_fs.makedirs(parent, exist_ok=True)
        for sub in ("_work",) + etl.SPLIT_NAMES:
            out_fs.makedirs(f"{tmp}/{sub}", exist_ok=True)
        futures = []
        try:
            result = _run(c, urls, chunks, out_fs, tmp, run, futures, tqdm, progress,
                          normalize_dense=normalize_dense, feature_cross=feature_cross,
                          freq_threshold=int(freq_threshold), split=split, on_error=on_error,
                          row_group_rows=int(row_group_rows), rows_per_file=int(rows_per_file),
                          fan_in=int(fan_in), t0=t0, dst=dst, out_path=out_path,
                          local_out=local_out)
        except BaseException:
            for f in futures:
                f.cancel()
            _remove(out_fs, tmp)
            raise
        finally:
            futures.clear()
    return result


def _remove(fs, tmp):
    # A cancelled task that was already running may still finish writing one part into the
    # folder while it is being removed: try again until it is gone (parts never recreate it).
    for _ in range(20):
        with contextlib.suppress(Exception):
            fs.rm(tmp, recursive=True)
        if not fs.exists(tmp):
            return
        time.sleep(0.5)


def _protocols(fs):
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def _gather(client, futs, chunks_of, bar=None, weights=None, fetch=True, job="preprocess"):
    """Results of `futs` in order (None each with fetch=False: the results stay on the
    workers); a task that failed for good raises ChunkFailedError naming `job` and its chunk."""
    from distributed import as_completed
    from distributed.scheduler import KilledWorker
    out = {}
    for fut in as_completed(futs):
        try:
            if fetch or fut.status != "finished":
                out[fut.key] = fut.result()
        except KilledWorker as e:
            chunk = chunks_of.get(fut.key)
            what = chunk.describe() if chunk is not None else f"task {fut.key}"
            raise ChunkFailedError(
                f"{job} on Dask: {what} failed: the workers running it died more often "
                f"than distributed.scheduler.allowed-failures allows ({e}); nothing was "
                f"written") from e
        if bar is not None:
            bar.update(weights[fut.key] if weights else 1)
    return [out.get(f.key) for f in futs]


def _run(c, urls, chunks, out_fs, tmp, run, futures, tqdm, progress, *, normalize_dense,
         feature_cross, freq_threshold, split, on_error, row_group_rows, rows_per_file, fan_in,
         t0, dst, out_path, local_out):
    import pyarrow.parquet as pq
    sizes = {}
    for ch in chunks:
        sizes[ch.file] = ch.size
    total_bytes = sum(sizes.values())

    def bar(desc):
        return tqdm(total=total_bytes, unit="B", unit_scale=True, desc=desc,
                    disable=not progress, leave=False)

    def submit(fn, *args, key, **kw):
        f = c.submit(fn, *args, key=f"{key}-{run}", pure=False, **kw)
        futures.append(f)
        return f

    weights = {}
    chunks_of = {}

    def per_chunk(prefix, fn, args_of):
        futures.clear()
        futs = []
        for ch in chunks:
            f = submit(fn, *args_of(ch), key=f"etl-{prefix}-{ch.index}")
            weights[f.key] = ch.end - ch.start if not ch.gz else ch.size
            chunks_of[f.key] = ch
            futs.append(f)
        return futs

    # ---- line count: global line numbers, split bounds
    with bar("ETL lines (count)") as b:
        nlines = _gather(c, per_chunk("count", _count_task, lambda ch: (ch,)), chunks_of, b,
                         weights)
    phase = {"count": time.perf_counter() - t0}
    first_in_file, line_offset, file_lines = [], [], {}
    for ch, n in zip(chunks, nlines):
        seen = file_lines.get(ch.file, 0)
        first_in_file.append(seen + 1)
        file_lines[ch.file] = seen + n
    file_offset, acc = {}, 0
    for f in range(len(urls)):
        file_offset[f] = acc
        acc += file_lines.get(f, 0)
    total_lines = acc
    line_offset = [file_offset[ch.file] for ch in chunks]
    counts = (total_lines, 0, 0) if split is None else etl.split_counts(total_lines, split)
    bounds = np.cumsum([0] + list(counts)) + 1
    train_end = int(bounds[1])
    global_first = [first_in_file[i] + line_offset[i] for i in range(len(chunks))]

    # ---- pass 1: statistics of the chunks with training lines, merged in a tree
    train_chunks = [ch for ch in chunks if nlines[ch.index] and global_first[ch.index] < train_end]
    stats = []
    for ch in train_chunks:
        i = ch.index
        f = submit(_stats_task, ch, first_in_file[i], nlines[i], line_offset[i], train_end,
                   feature_cross, key=f"etl-pass1-{i}")
        weights[f.key] = ch.end - ch.start if not ch.gz else ch.size
        chunks_of[f.key] = ch
        stats.append(f)
    if not stats:              # no training line at all: empty statistics, as single-process
        stats = [submit(_stats_task, None, 1, 0, 0, 0, feature_cross, key="etl-pass1-none")]
    errs = [submit(_errors_of, s, key=f"etl-pass1-errors-{i}") for i, s in enumerate(stats)]
    for e, s in zip(errs, stats):
        chunks_of[e.key] = chunks_of.get(s.key)
    with bar("ETL pass 1/2 (count)") as b:
        _gather(c, stats, chunks_of, b, weights, fetch=False)
    errors1 = _gather(c, errs, chunks_of)
    phase["pass1"] = time.perf_counter() - t0 - sum(phase.values())
    if on_error == "fail":
        for ch, (n_bad, bad) in zip(train_chunks, errors1):
            if n_bad:
                url, line, reason = bad[0]
                raise parse.CriteoFormatError(url, line, reason)
    level, layer = 0, stats
    while len(layer) > 1:
        layer = [submit(_merge_task, *layer[i:i + fan_in], key=f"etl-merge-{level}-{i}")
                 for i in range(0, len(layer), fan_in)]
        level += 1
    vocab = submit(_vocab_task, layer[0], freq_threshold, key="etl-vocab")
    summary = _gather(c, [submit(_vocab_summary, vocab, key="etl-vocab-summary")], chunks_of)[0]
    # Every worker fetches the vocabularies and builds its lookups now, while no worker is busy.
    # Left to the first pass-2 task, a worker fetched them from one busy encoding its own chunk
    # (whose event loop shares the GIL with that work) and sat idle ~1 s (4M lines, 2 workers).
    _gather(c, [submit(_warm_task, vocab, key=f"etl-warm-{i}", workers=[w],
                       allow_other_workers=True)
                for i, w in enumerate(c.scheduler_info()["workers"])], chunks_of)
    # Drop the per-chunk statistics and the merge tree: the cluster frees them (Dask keeps
    # their recipe, to recompute the vocabularies if every copy of them is lost).
    del stats, layer, errs
    futures.clear()
    phase["merge_vocab"] = time.perf_counter() - t0 - sum(phase.values())
    slot_sizes = [int(x) for x in summary["slot_sizes"]]
    offsets = np.asarray(summary["offsets"], np.int64)
    dmin, dmax = summary["dmin"], summary["dmax"]
    columns = etl._slot_columns(feature_cross)

    # ---- pass 2: encode and write the parts
    options = dict(normalize_dense=normalize_dense, feature_cross=feature_cross,
                   on_error=on_error, rows_per_file=rows_per_file, row_group_rows=row_group_rows)
    width = max(5, len(str(len(chunks) - 1)))
    with bar("ETL pass 2/2 (write)") as b:
        written = _gather(c, per_chunk(
            "pass2", _write_task,
            lambda ch: (ch, first_in_file[ch.index], nlines[ch.index], line_offset[ch.index],
                        bounds, vocab, options, out_fs, tmp, width)), chunks_of, b, weights)
    futures.clear()
    phase["pass2"] = time.perf_counter() - t0 - sum(phase.values())
    malformed = sum(w["malformed"] for w in written)
    errors2 = [e for w in written for e in w["errors"]]
    if on_error == "fail" and malformed:
        url, line, reason = errors2[0]
        raise parse.CriteoFormatError(url, line, reason)

    rows = {name: 0 for name in etl.SPLIT_NAMES}
    rel_files = {name: [] for name in etl.SPLIT_NAMES}
    for w in written:
        for name in etl.SPLIT_NAMES:
            for rel, n in w["files"][name]:
                rel_files[name].append(rel)
                rows[name] += n
    schema = etl._schema(columns)
    for name in etl.SPLIT_NAMES:
        if not rel_files[name]:               # an empty split still gets a valid file
            rel = f"{name}/part_{0:0{width}d}_000.parquet"
            with out_fs.open(f"{tmp}/{rel}", "wb") as f:
                pq.write_table(schema.empty_table(), f)
            rel_files[name].append(rel)
    out_fs.rm(f"{tmp}/_work", recursive=True)
    seconds = time.perf_counter() - t0
    import json
    slot_info = {"slot_size_array": slot_sizes, "columns": columns, "offsets": offsets.tolist()}
    meta = etl._metadata(slot_info, urls, total_lines, counts, rows, normalize_dense,
                            feature_cross, freq_threshold, dmin, dmax, malformed, seconds,
                            rel_files)
    meta["dask"] = {"workers": len(c.scheduler_info()["workers"]), "chunks": len(chunks),
                    "chunk_bytes": max((ch.end - ch.start for ch in chunks), default=0),
                    "merge_levels": level, "phase_seconds": phase}
    with out_fs.open(f"{tmp}/slot_size_array.json", "w") as f:
        f.write(json.dumps(slot_info, indent=1))
    with out_fs.open(f"{tmp}/metadata.json", "w") as f:
        f.write(json.dumps(meta, indent=1))
    _swap_into_place(out_fs, tmp, out_path, local_out)
    if local_out:
        from pathlib import Path
        base = Path(out_path)
        files = {k: [base / r for r in v] for k, v in rel_files.items()}
        dst_out = Path(out_path)
    else:
        root = out_fs.unstrip_protocol(out_path)
        files = {k: [f"{root}/{r}" for r in v] for k, v in rel_files.items()}
        dst_out = root
    if errors2:
        shown = "; ".join(f"{p}:{l}: {r}" for p, l, r in errors2[:3])
        warnings.warn(f"preprocess skipped {malformed} malformed lines (first: {shown})",
                      stacklevel=3)
    return etl.PreprocessResult(
        dst=dst_out, files=files, rows=rows, columns=columns, slot_size_array=slot_sizes,
        offsets=offsets.tolist(), dense_min=dmin.tolist(), dense_max=dmax.tolist(),
        malformed=malformed, errors=errors2[:100], seconds=seconds,
        rows_per_second=total_lines / max(seconds, 1e-9))


def _swap_into_place(fs, tmp, out_path, local_out):
    """Rename the finished temporary folder onto `out_path` (replacing an old one)."""
    if local_out:
        import shutil
        if os.path.exists(out_path):
            old = f"{tmp}.old"
            os.replace(out_path, old)
            os.replace(tmp, out_path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_path)
        return
    if fs.exists(out_path):
        fs.rm(out_path, recursive=True)
    fs.mv(tmp, out_path, recursive=True)



# --------------------------------------------------------------------------------------
# Parquet -> HugeCTR Norm files, file lists and keysets, per part
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _NormPart:
    index: int          # task index
    first: int          # data files [first, last) of the conversion
    last: int
    lo: int             # global rows [lo, hi)
    hi: int
    pieces: tuple       # ((parquet path, row group, its first global row), ...) covering [lo, hi)
    what: str = "Norm files"

    def describe(self) -> str:
        return f"{self.what} {self.first}-{self.last - 1} (rows {self.lo:,}-{self.hi - 1:,})"


def parquet_to_norm(src, out_dir, *, samples_per_file: int = 40_960,
                    files_per_list: int | None = None, error_check: bool = True,
                    key_type: str = "uint32", prefix: str = "part", slots=None, dense=None,
                    progress: bool = True, client=None, files_per_task: int | None = None) -> list:
    """`formats.parquet_to_norm` on a Dask cluster: the same files, byte for byte.

    Same arguments and output as `formats.parquet_to_norm` (see it): `<prefix>_<i>.data` of
    `samples_per_file` records each over the rows of `src` in order, the file list(s) and their
    keysets, and `norm_meta.json`, whatever the number of workers. Data file i holds rows
    [i * samples_per_file, (i + 1) * samples_per_file) of the parquet files in order, so each
    task converts `files_per_task` consecutive data files (default: about 1M rows' worth),
    reading only the row groups it needs; one task per file list merges its files' unique keys
    into the keyset. `client` is resolved as in `preprocess` (a `Client`, an address, "local",
    or None: `EMBEDLAB_DASK_SCHEDULER`).

    `src` and `out_dir` are local paths that every worker reaches under the same names (one
    machine, or a shared file system). The folder is built under a temporary name next to
    `out_dir` (each file under a unique name, then renamed, so a task rerun after a worker died
    writes the same bytes) and renamed into place at the end; on failure nothing is left.

    Returns:
        The file-list paths, in order.

    Raises:
        ChunkFailedError: a task failed for good (its workers died more often than Dask
            retries); the error names its data files and rows, nothing is written.
    """
    import pyarrow.parquet as pq
    from pathlib import Path
    from .._progress import tqdm
    from ..formats import parquet_files
    from ..formats import norm as _norm
    from ..._io import write_file_list

    if isinstance(samples_per_file, bool) or int(samples_per_file) < 1:
        raise ValueError(f"parquet_to_norm: samples_per_file must be >= 1, got {samples_per_file}")
    if files_per_list is not None and int(files_per_list) < 1:
        raise ValueError(f"parquet_to_norm: files_per_list must be >= 1 or None, got "
                         f"{files_per_list}")
    if files_per_task is not None and int(files_per_task) < 1:
        raise ValueError(f"parquet_to_norm: files_per_task must be >= 1 or None, got "
                         f"{files_per_task}")
    if key_type not in _norm._KEY_DTYPES:
        raise ValueError(f"parquet_to_norm: key_type must be 'uint32' or 'int64', got {key_type!r}")
    for p in (src if isinstance(src, (list, tuple)) else [src]):
        if "://" in os.fspath(p):
            raise ValueError(f"parquet_to_norm on Dask reads and writes local paths (a shared file "
                             f"system on several machines), got {os.fspath(p)!r}")
    if "://" in os.fspath(out_dir):
        raise ValueError(f"parquet_to_norm on Dask writes a local path (a shared file system on "
                         f"several machines), got {os.fspath(out_dir)!r}")
    spf = int(samples_per_file)
    files = [Path(f).absolute() for f in parquet_files(src)]
    slots, slot_cols, dense = _norm._norm_columns(files[0], slots, dense)
    # Global first row of every row group, in input order.
    groups, start = [], 0
    for f in files:
        md = pq.ParquetFile(f).metadata
        for g in range(md.num_row_groups):
            n = md.row_group(g).num_rows
            if n:
                groups.append((str(f), g, start, n))
            start += n
    total = start
    n_files = -(-total // spf)
    per_task = int(files_per_task) if files_per_task else max(1, (1 << 20) // spf)
    parts, j = [], 0
    for first in range(0, n_files, per_task):
        last = min(first + per_task, n_files)
        lo, hi = first * spf, min(last * spf, total)
        while groups[j][2] + groups[j][3] <= lo:
            j += 1
        pieces, k = [], j
        while k < len(groups) and groups[k][2] < hi:
            pieces.append(groups[k][:3])
            k += 1
        parts.append(_NormPart(len(parts), first, last, lo, hi, tuple(pieces)))
    out_dir = Path(out_dir)               # named in the lists as given, as the single-process path
    out_abs = out_dir.absolute()
    options = dict(spf=spf, slots=slots, slot_cols=slot_cols, dense=dense, prefix=prefix,
                   error_check=bool(error_check), key_type=key_type)
    with resolve_client(client) as c:
        link = _dashboard(c)
        if progress and link:
            print(f"Dask dashboard: {link}", flush=True)
        run = uuid.uuid4().hex[:8]
        tmp = out_abs.parent / f".{out_abs.name}.tmp-{run}"
        (tmp / "_work").mkdir(parents=True)
        futures = []
        try:
            chunks_of, weights = {}, {}

            def submit(fn, *args, key):
                f = c.submit(fn, *args, key=f"{key}-{run}", pure=False)
                futures.append(f)
                return f

            convert = []
            for part in parts:
                f = submit(_norm_task, part, options, str(tmp), key=f"norm-part-{part.index}")
                chunks_of[f.key], weights[f.key] = part, part.hi - part.lo
                convert.append(f)
            data_files = [f"{prefix}_{i}.data" for i in range(n_files)]
            list_groups = _norm._list_groups(n_files, files_per_list)
            keysets = []
            for k, g in enumerate(list_groups):
                # The conversion tasks holding the group's data files, and which of theirs.
                tasks = sorted({i // per_task for i in g})
                stem = _norm._list_stem(k, files_per_list)
                f = submit(_keyset_task, str(tmp), f"{stem}.keyset", key_type, g, per_task,
                           tasks, *[convert[t] for t in tasks], key=f"norm-keyset-{k}")
                chunks_of[f.key] = _NormPart(
                    k, g[0] if g else 0, g[-1] + 1 if g else 0, g[0] * spf if g else 0,
                    min((g[-1] + 1) * spf, total) if g else 0, (), f"the keyset of {stem}: files")
                keysets.append(f)
            with tqdm(total=total, unit="rows", desc="parquet -> Norm (Dask)",
                      disable=not progress, leave=False) as b:
                _gather(c, convert, chunks_of, b, weights, fetch=False, job="parquet_to_norm")
            _gather(c, keysets, chunks_of, job="parquet_to_norm")
            futures.clear()
            lists = []
            for k, g in enumerate(list_groups):
                stem = _norm._list_stem(k, files_per_list)
                write_file_list(tmp / f"{stem}.txt", [out_dir / data_files[i] for i in g])
                lists.append(out_dir / f"{stem}.txt")
            (tmp / "norm_meta.json").write_text(_norm._norm_meta(
                slots, dense, key_type, error_check, samples_per_file, data_files))
            (tmp / "_work").rmdir()
        except BaseException:
            for f in futures:
                f.cancel()
            from fsspec.implementations.local import LocalFileSystem
            _remove(LocalFileSystem(), str(tmp))
            raise
        finally:
            futures.clear()
        _swap_into_place(None, str(tmp), str(out_abs), True)
    return lists


def _write_new(tmp, name, arrays):
    """Write `arrays` to tmp/name through a unique name in tmp/_work, then rename. Never
    creates a folder: once a failed run removed `tmp`, a task still running writes nothing."""
    work = os.path.join(tmp, "_work", f"{uuid.uuid4().hex}.part")
    with open(work, "xb") as f:
        for a in arrays:
            f.write(a.tobytes())
    os.replace(work, os.path.join(tmp, name))


def _norm_task(part, options, tmp):
    """Write the data files [part.first, part.last); return the unique keys of each."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from ..formats import norm as _norm
    spf = options["spf"]
    cols = [layout.LABEL] + options["dense"] + options["slot_cols"]
    keysets, index, pending = [], part.first, None
    open_files = {}

    def emit(table):
        nonlocal index
        label, den, sl = _norm._norm_arrays(table, options["slots"], options["dense"],
                                            options["slot_cols"])
        header, body = _norm._norm_bytes(label, den, sl, error_check=options["error_check"],
                                         key_type=options["key_type"])
        _write_new(tmp, f"{options['prefix']}_{index}.data", (header, body))
        keysets.append(_norm._unique_keys(sl))
        index += 1

    for path, g, first_row in part.pieces:
        pf = open_files.get(path) or open_files.setdefault(path, pq.ParquetFile(path))
        t = pf.read_row_group(g, columns=cols)
        a, b = max(part.lo - first_row, 0), min(part.hi - first_row, len(t))
        t = t.slice(a, b - a)
        pending = t if pending is None else pa.concat_tables([pending, t])
        while len(pending) >= spf:
            emit(pending.slice(0, spf))
            pending = pending.slice(spf)
    if pending is not None and len(pending):
        emit(pending)
    if index != part.last:
        raise RuntimeError(f"{part.describe()}: wrote {index - part.first} data files, expected "
                           f"{part.last - part.first}: the parquet input changed during the run")
    return keysets


def _keyset_task(tmp, name, key_type, group, per_task, tasks, *results):
    """Write one file list's keyset from the unique keys of its data files."""
    from ..formats import norm as _norm
    of = dict(zip(tasks, results))
    keys = _norm._group_keys([of[i // per_task][i % per_task] for i in group])
    _write_new(tmp, name, (_norm._keyset_bytes(keys, key_type),))

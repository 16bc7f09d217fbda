"""`formats.parquet_to_norm` on a Dask cluster, per part, writing the same files byte for byte.

Data file i holds rows [i * samples_per_file, (i + 1) * samples_per_file) of the parquet files
in order, so a task converts a run of consecutive data files on its own, reading only the row
groups that hold its rows; one task per file list then merges its files' unique keys into the
keyset. Every value goes through the public steps of `formats.norm` (`norm_arrays`,
`norm_bytes`, `unique_keys`, `merge_keys`, `keyset_bytes`, ...) that the single-process
conversion uses, hence the same bytes. `norm_digest` fingerprints a conversion to compare two.

Example: `etl_dask`'s (a conversion on a one-worker cluster compared with the single-process one).
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..._io import read_file_list, remove_stale_temporaries, temporary_path, write_file_list
from ..formats import norm as fnorm
from ..formats import parquet_files
from .cluster import ClusterJob, dashboard_link, remove_tree, resolve_client, swap_into_place
from .layout import LABEL

__all__ = ["parquet_to_norm", "norm_digest"]


@dataclass(frozen=True)
class _NormPart:
    """The work of one task: data files [first, last), i.e. global rows [lo, hi)."""
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
    keysets, and `norm_meta.json`, whatever the number of workers. Each task converts
    `files_per_task` consecutive data files (default: about 1M rows' worth), reading only the
    row groups it needs; one task per file list merges its files' unique keys into the
    keyset. `client` is resolved as in `preprocess` (a `Client`, an address, "local", or None:
    `EMBEDLAB_DASK_SCHEDULER`).

    `src` and `out_dir` are local paths that every worker reaches under the same names (one
    machine, or a shared file system). The folder is built under a temporary name next to
    `out_dir` (each file under a unique name, then renamed, so a task rerun after a worker died
    writes the same bytes) and renamed into place at the end; on failure nothing is left.

    Returns:
        The file-list paths, in order.

    Raises:
        ValueError: a bad argument, or a URL for `src` / `out_dir`.
        ChunkFailedError: a task failed for good (its workers died more often than Dask
            retries); the error names its data files and rows, nothing is written.

    Example: `etl_dask`'s module docstring (a conversion on a one-worker cluster).
    """
    from .._progress import tqdm
    _check_args(src, out_dir, samples_per_file, files_per_list, files_per_task, key_type)
    spf = int(samples_per_file)
    files = [Path(f).absolute() for f in parquet_files(src)]
    slots, slot_cols, dense = fnorm.norm_columns(files[0], slots, dense)
    groups, total = _row_groups(files)
    n_files = -(-total // spf)
    per_task = int(files_per_task) if files_per_task else max(1, (1 << 20) // spf)
    parts = _plan_parts(groups, total, n_files, spf, per_task)
    data_files = [f"{prefix}_{i}.data" for i in range(n_files)]
    list_groups = fnorm.list_groups(n_files, files_per_list)
    out_dir = Path(out_dir)               # named in the lists as given, as the single-process path
    out_abs = out_dir.absolute()
    options = dict(spf=spf, slots=slots, slot_cols=slot_cols, dense=dense, prefix=prefix,
                   error_check=bool(error_check), key_type=key_type)
    with resolve_client(client) as c:
        link = dashboard_link(c)
        if progress and link:
            print(f"Dask dashboard: {link}", flush=True)
        job = ClusterJob(c, "parquet_to_norm")
        remove_stale_temporaries(out_abs)     # left by a killed run of this conversion
        tmp = temporary_path(out_abs)
        (tmp / "_work").mkdir(parents=True)
        try:
            convert = [job.submit(_norm_task, part, options, str(tmp), piece=part,
                                  weight=part.hi - part.lo, key=f"norm-part-{part.index}")
                       for part in parts]
            keysets = [_submit_keyset(job, convert, k, g, files_per_list, key_type, per_task,
                                      spf, total, str(tmp))
                       for k, g in enumerate(list_groups)]
            with tqdm(total=total, unit="rows", desc="parquet -> Norm (Dask)",
                      disable=not progress, leave=False) as bar:
                job.gather(convert, bar, fetch=False)
            job.gather(keysets)
            job.release()
            lists = []
            for k, g in enumerate(list_groups):
                stem = fnorm.list_stem(k, files_per_list)
                write_file_list(tmp / f"{stem}.txt", [out_dir / data_files[i] for i in g])
                lists.append(out_dir / f"{stem}.txt")
            (tmp / "norm_meta.json").write_text(fnorm.norm_meta(
                slots, dense, key_type, error_check, samples_per_file, data_files))
            (tmp / "_work").rmdir()
        except BaseException:
            job.cancel()
            from fsspec.implementations.local import LocalFileSystem
            remove_tree(LocalFileSystem(), str(tmp))
            raise
        finally:
            job.release()
        swap_into_place(None, str(tmp), str(out_abs), True)
    return lists


def norm_digest(lists) -> dict:
    """A fingerprint of what `parquet_to_norm` wrote (this module's or `formats`'): equal
    digests mean the same bytes.

    Holds, per file list (in order), the names of its data files and a SHA-1 of each, of its
    keyset, and of the folder's `norm_meta.json`. Only the folder the lists name is left out, so
    conversions into two folders compare.

    Args:
        lists: a file-list path, or the list of them that `parquet_to_norm` returned.

    Returns:
        A dict (JSON-serializable).

    Example: `etl_dask`'s module docstring (the two conversions compared).
    """
    import hashlib

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


def _check_args(src, out_dir, samples_per_file, files_per_list, files_per_task, key_type):
    if isinstance(samples_per_file, bool) or int(samples_per_file) < 1:
        raise ValueError(f"parquet_to_norm: samples_per_file must be >= 1, got {samples_per_file}")
    if files_per_list is not None and int(files_per_list) < 1:
        raise ValueError(f"parquet_to_norm: files_per_list must be >= 1 or None, got "
                         f"{files_per_list}")
    if files_per_task is not None and int(files_per_task) < 1:
        raise ValueError(f"parquet_to_norm: files_per_task must be >= 1 or None, got "
                         f"{files_per_task}")
    if key_type not in fnorm.KEY_DTYPES:
        raise ValueError(f"parquet_to_norm: key_type must be 'uint32' or 'int64', got {key_type!r}")
    for p in (src if isinstance(src, (list, tuple)) else [src]):
        if "://" in os.fspath(p):
            raise ValueError(f"parquet_to_norm on Dask reads and writes local paths (a shared file "
                             f"system on several machines), got {os.fspath(p)!r}")
    if "://" in os.fspath(out_dir):
        raise ValueError(f"parquet_to_norm on Dask writes a local path (a shared file system on "
                         f"several machines), got {os.fspath(out_dir)!r}")


def _row_groups(files) -> tuple[list, int]:
    """(path, row group, its first global row, rows) of every non-empty row group, in input
    order, and the total number of rows."""
    import pyarrow.parquet as pq
    groups, start = [], 0
    for f in files:
        md = pq.ParquetFile(f).metadata
        for g in range(md.num_row_groups):
            n = md.row_group(g).num_rows
            if n:
                groups.append((str(f), g, start, n))
            start += n
    return groups, start


def _plan_parts(groups, total: int, n_files: int, spf: int, per_task: int) -> list:
    """One `_NormPart` per `per_task` data files, with the row groups that hold its rows."""
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
    return parts


def _submit_keyset(job, convert, k, group, files_per_list, key_type, per_task, spf, total, tmp):
    """The task writing file list k's keyset from the unique keys its conversion tasks return."""
    tasks = sorted({i // per_task for i in group})          # the conversion tasks holding them
    stem = fnorm.list_stem(k, files_per_list)
    g = group
    piece = _NormPart(k, g[0] if g else 0, g[-1] + 1 if g else 0, g[0] * spf if g else 0,
                      min((g[-1] + 1) * spf, total) if g else 0, (), f"the keyset of {stem}: files")
    return job.submit(_keyset_task, tmp, f"{stem}.keyset", key_type, g, per_task, tasks,
                      *[convert[t] for t in tasks], piece=piece, key=f"norm-keyset-{k}")


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
    spf = options["spf"]
    cols = [LABEL] + options["dense"] + options["slot_cols"]
    keysets, index, pending = [], part.first, None
    open_files = {}

    def emit(table):
        nonlocal index
        label, den, sl = fnorm.norm_arrays(table, options["slots"], options["dense"],
                                           options["slot_cols"])
        header, body = fnorm.norm_bytes(label, den, sl, error_check=options["error_check"],
                                        key_type=options["key_type"])
        _write_new(tmp, f"{options['prefix']}_{index}.data", (header, body))
        keysets.append(fnorm.unique_keys(sl))
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
    of = dict(zip(tasks, results))
    keys = fnorm.merge_keys([of[i // per_task][i % per_task] for i in group])
    _write_new(tmp, name, (fnorm.keyset_bytes(keys, key_type),))

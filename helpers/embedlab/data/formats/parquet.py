"""Parquet: the ETL's output format and the loader's input, read and written with pyarrow.

Columns follow `criteo.preprocess`: `label` (float32), `I1..I13` (float32), `C1..C26` and
crosses (int64, or list<int64> for multi-hot slots).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..._io import FormatError, atomic_file
from ..criteo.layout import LABEL

def parquet_files(src) -> list[Path]:
    """Parquet files named by `src`: a file, a folder (its `*.parquet`, sorted, recursively) or a list.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> for name in ("part_00001.parquet", "part_00000.parquet"):
        ...     _ = write_parquet(d / "train" / name, {"label": np.zeros(4, np.float32)})
        >>> [p.name for p in parquet_files(d / "train")]
        ['part_00000.parquet', 'part_00001.parquet']
    """
    if isinstance(src, (str, Path)):
        p = Path(src)
        if p.is_dir():
            files = sorted(p.rglob("*.parquet"))
            if not files:
                raise FileNotFoundError(f"no .parquet files under {p}")
            return files
        if not p.is_file():
            raise FileNotFoundError(f"parquet input {p} does not exist")
        return [p]
    files = []
    for s in src:
        files.extend(parquet_files(s))
    if not files:
        raise FileNotFoundError("empty list of parquet inputs")
    return files


def schema_columns(schema) -> dict:
    """Split a parquet/arrow schema into {"label", "dense", "sparse", "ragged"} column names.

    Label is `label`; dense columns are float columns other than the label; sparse columns are
    integer columns; ragged columns are list<int> columns (multi-hot slots).
    """
    import pyarrow as pa
    out = {"label": None, "dense": [], "sparse": [], "ragged": []}
    for f in schema:
        if f.name == LABEL:
            out["label"] = f.name
        elif pa.types.is_floating(f.type):
            out["dense"].append(f.name)
        elif pa.types.is_integer(f.type):
            out["sparse"].append(f.name)
        elif pa.types.is_list(f.type) or pa.types.is_large_list(f.type):
            out["ragged"].append(f.name)
    return out


def write_parquet(path, columns, *, row_group_rows: int = 65_536) -> Path:
    """Write columns to one parquet file, atomically.

    Args:
        path: output file.
        columns: a `pyarrow.Table` or a dict name -> 1-D array (a list of arrays, or a
            (row_splits, values) pair, makes a list<int64> column).
        row_group_rows: rows per row group.

    Returns:
        The output `Path`.

    Example:
        >>> import tempfile
        >>> p = write_parquet(Path(tempfile.mkdtemp()) / "x.parquet",
        ...                   {"label": np.zeros(3, np.float32), "tags": ([0, 1, 1, 3], [5, 6, 7])})
        >>> import pyarrow.parquet as pq
        >>> schema_columns(pq.read_schema(p))
        {'label': 'label', 'dense': [], 'sparse': [], 'ragged': ['tags']}
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    if isinstance(columns, pa.Table):
        table = columns
    else:
        arrays = {}
        for name, col in columns.items():
            if isinstance(col, tuple) and len(col) == 2:
                splits, values = (np.asarray(c) for c in col)
                arrays[name] = pa.ListArray.from_arrays(splits.astype(np.int32),
                                                        values.astype(np.int64))
            else:
                arrays[name] = pa.array(np.asarray(col))
        table = pa.table(arrays)
    with atomic_file(path) as tmp:
        pq.write_table(table, tmp, row_group_size=row_group_rows, compression="snappy")
    return Path(path)


def read_parquet(src, columns: Sequence[str] | None = None) -> dict:
    """Read parquet file(s) into a dict of NumPy arrays (list columns as (row_splits, values)).

    Example:
        >>> import tempfile
        >>> p = write_parquet(Path(tempfile.mkdtemp()) / "x.parquet",
        ...                   {"label": np.arange(3, dtype=np.float32), "tags": ([0, 1, 1, 3], [5, 6, 7])})
        >>> cols = read_parquet(p)
        >>> cols["label"].tolist(), [a.tolist() for a in cols["tags"]]
        ([0.0, 1.0, 2.0], [[0, 1, 1, 3], [5, 6, 7]])
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    tables = []
    for f in parquet_files(src):
        try:
            tables.append(pq.read_table(f, columns=columns))
        except (pa.ArrowInvalid, OSError) as e:
            raise FormatError(f"{f}: not a readable parquet file: {e}") from e
    table = pa.concat_tables(tables)
    out = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            out[name] = (np.asarray(col.offsets), np.asarray(col.flatten()))
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


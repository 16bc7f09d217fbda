"""HugeCTR's Criteo preprocessing recipe: what both ETL paths compute, in one place.

The single-process ETL (`etl.preprocess`) and the Dask ETL (`etl_dask.preprocess`) differ only
in how they cut and schedule the work; every value they write comes from the functions here, so
their outputs are identical:

- the slots: `slot_columns` (C1..C26, then the crossed pairs `CROSSES`), `slot_values` (the
  values each slot counts and encodes), `slot_exclude` (values kept out of a vocabulary);
- the vocabularies' layout: `vocab_layout` (slot sizes with id 0 = rare/missing, HugeCTR's
  offsets);
- the rows: `dense_features` (log(x + 1), missing and negatives -> 0), `encode_block` (one
  parsed block -> a pyarrow table of `output_schema`);
- the splits: `KAGGLE_SPLIT`, `SPLIT_NAMES`, `split_counts`;
- what is written beside the parquet parts: `slot_info` (`slot_size_array.json`),
  `metadata` (`metadata.json`), read back by `load_slot_sizes`; and the `PreprocessResult`
  returned, with the malformed-line warning `warn_skipped`;
- `check_preprocess_args`, the argument checks of `preprocess`.

Example:
    >>> slot_columns(feature_cross=True)[-2:], split_counts(1000)
    (['C1_C2', 'C3_C4'], (799, 100, 101))
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .layout import CAT_COLUMNS, INT_COLUMNS, LABEL, MISSING_HEX, NUM_CAT, NUM_INT
from .parse import Block

__all__ = ["CROSSES", "KAGGLE_SPLIT", "SPLIT_NAMES", "split_counts", "slot_columns",
           "output_schema", "slot_values", "slot_exclude", "vocab_layout", "dense_features",
           "encode_block", "slot_info", "metadata", "load_slot_sizes", "PreprocessResult",
           "check_preprocess_args", "warn_skipped"]

CROSSES = (("C1", "C2"), ("C3", "C4"))
# Line counts of the seeds' split of the full Kaggle file (head / tail of train.txt).
KAGGLE_SPLIT = (36_672_493, 4_584_062, 4_584_062)
SPLIT_NAMES = ("train", "val", "test")
_CROSS_IDX = [(CAT_COLUMNS.index(a), CAT_COLUMNS.index(b)) for a, b in CROSSES]


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


def slot_columns(feature_cross: bool) -> list[str]:
    """The categorical output columns in slot order: C1..C26, then the crosses (`C1_C2`, ...).

    Example:
        >>> len(slot_columns(False)), slot_columns(True)[26:]
        (26, ['C1_C2', 'C3_C4'])
    """
    return CAT_COLUMNS + ([f"{a}_{b}" for a, b in CROSSES] if feature_cross else [])


def output_schema(columns: Sequence[str]):
    """The parquet schema of the output: `label`, `I1..I13` (float32), `columns` (int64).

    Example:
        >>> output_schema(["C1"]).names[:2], str(output_schema(["C1"]).field("C1").type)
        (['label', 'I1'], 'int64')
    """
    import pyarrow as pa
    return pa.schema([(LABEL, pa.float32())] + [(c, pa.float32()) for c in INT_COLUMNS]
                     + [(c, pa.int64()) for c in columns])


def _cross_key(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.uint64) << np.uint64(32)) | b.astype(np.uint64)


def _cross_has_missing(k: np.ndarray) -> np.ndarray:
    return ((k >> np.uint64(32)) == MISSING_HEX) | ((k & np.uint64(0xFFFFFFFF)) == MISSING_HEX)


def slot_values(block: Block, feature_cross: bool) -> list[np.ndarray]:
    """The values each slot counts and encodes: C1..C26 (uint32), then the crossed pairs
    (uint64, the first value in the high 32 bits).

    Example:
        >>> import numpy as np
        >>> from embedlab.data.criteo.parse import parse_block
        >>> line = "\\t".join(["1"] + ["2"] * 13 + ["0000000a"] * 26) + "\\n"
        >>> v = slot_values(parse_block(np.frombuffer(line.encode(), np.uint8), 1), True)
        >>> len(v), int(v[0][0]), hex(int(v[26][0]))
        (28, 10, '0xa0000000a')
    """
    vals = [block.cats[:, j] for j in range(NUM_CAT)]
    if feature_cross:
        vals += [_cross_key(block.cats[:, a], block.cats[:, b]) for a, b in _CROSS_IDX]
    return vals


def slot_exclude(slot: int):
    """For slot `slot`, a function of a value array -> a bool mask of the values that never enter
    its vocabulary (missing, or a crossed pair with a missing side).

    Example:
        >>> import numpy as np
        >>> slot_exclude(0)(np.array([5, 0x80000000], np.uint32)).tolist()
        [False, True]
    """
    return (lambda k: k == MISSING_HEX) if slot < NUM_CAT else _cross_has_missing


def vocab_layout(vocabs) -> tuple[list[int], np.ndarray]:
    """Slot sizes (id 0 = rare/missing) and the first global id of each slot (HugeCTR's offsets).

    Args:
        vocabs: per slot, the sorted frequent values.

    Returns:
        (slot_sizes, offsets int64).

    Example:
        >>> sizes, offsets = vocab_layout([[3, 5], [7]])
        >>> sizes, offsets.tolist()
        ([3, 2], [0, 3])
    """
    slot_sizes = [len(v) + 1 for v in vocabs]
    offsets = np.concatenate([[0], np.cumsum(slot_sizes)[:-1]]).astype(np.int64)
    return slot_sizes, offsets


def dense_features(block: Block) -> np.ndarray:
    """log(x + 1) of the integer features (float64 [n, 13]), missing -> 0, negatives clipped to 0.

    Example:
        >>> import numpy as np
        >>> from embedlab.data.criteo.parse import parse_block
        >>> line = "\\t".join(["1", "-5", ""] + ["0"] * 11 + ["0000000a"] * 26) + "\\n"
        >>> dense_features(parse_block(np.frombuffer(line.encode(), np.uint8), 1))[0, :3].tolist()
        [0.0, 0.0, 0.0]
    """
    x = np.where(block.int_missing, 0, np.maximum(block.ints, 0))
    return np.log1p(x.astype(np.float64))


def _encode(values: np.ndarray, vocab) -> np.ndarray:
    """Local ids: 1 + position in the sorted vocabulary, 0 for rare/missing/unseen values.

    `vocab` is a `pandas.Index` over the sorted frequent values: its hash lookup is 3-7x
    faster than a binary search once vocabularies hold thousands of values.
    """
    if len(vocab) == 0:
        return np.zeros(len(values), np.int64)
    return vocab.get_indexer(values).astype(np.int64) + 1


def encode_block(block: Block, lookups, offsets, dmin, dmax, normalize_dense: bool,
                 feature_cross: bool, schema):
    """One parsed block -> a pyarrow table of the output schema (label, dense, global ids).

    Args:
        block: parsed lines (`parse.Block`).
        lookups: per slot, a `pandas.Index` over its sorted vocabulary.
        offsets: per slot, its first global id (`vocab_layout`).
        dmin, dmax: the training min / max of `dense_features`, for `normalize_dense`.
        normalize_dense, feature_cross: the recipe's options.
        schema: `output_schema(slot_columns(feature_cross))`.

    Returns:
        A `pyarrow.Table` of `schema`, one row per line of `block`, in order.

    Example:
        >>> import numpy as np, pandas as pd
        >>> from embedlab.data.criteo.parse import parse_block
        >>> line = "\\t".join(["1"] + ["2"] * 13 + ["0000000a"] * 26) + "\\n"
        >>> block = parse_block(np.frombuffer(line.encode(), np.uint8), 1)
        >>> cols = slot_columns(False)
        >>> sizes, offsets = vocab_layout([[10]] * 26)
        >>> t = encode_block(block, [pd.Index([10])] * 26, offsets, np.zeros(13), np.ones(13),
        ...                  True, False, output_schema(cols))
        >>> t.column("C1").to_pylist(), t.column("C2").to_pylist(), t.column("I1").to_pylist()
        ([1], [3], [1.0])
    """
    import pyarrow as pa
    dense = dense_features(block)
    if normalize_dense:
        span = np.where(dmax > dmin, dmax - dmin, 1.0)
        dense = np.clip((dense - dmin) / span, 0.0, 1.0)
    cols = {LABEL: block.label.astype(np.float32)}
    for j, c in enumerate(INT_COLUMNS):
        cols[c] = dense[:, j].astype(np.float32)
    names = schema.names[1 + NUM_INT:]
    for k, v in enumerate(slot_values(block, feature_cross)):
        cols[names[k]] = _encode(v, lookups[k]) + offsets[k]
    return pa.table(cols, schema=schema)


def slot_info(slot_sizes, columns, offsets) -> dict:
    """The contents of `slot_size_array.json` (keys slot_size_array, columns, offsets).

    Example:
        >>> slot_info([3, 2], ["C1", "C2"], np.array([0, 3]))
        {'slot_size_array': [3, 2], 'columns': ['C1', 'C2'], 'offsets': [0, 3]}
    """
    return {"slot_size_array": slot_sizes, "columns": columns,
            "offsets": np.asarray(offsets).tolist()}


def metadata(slot_info, paths, total_lines, counts, rows, normalize_dense, feature_cross,
             freq_threshold, dmin, dmax, malformed, seconds, files) -> dict:
    """The contents of `metadata.json`: `slot_info`, the inputs, line and row counts, the
    options, the dense ranges, the malformed-line count, the wall time and the parts.

    Example:
        >>> m = metadata(slot_info([2], ["C1"], [0]), ["day.txt"], 10, (8, 1, 1),
        ...              {"train": 8, "val": 1, "test": 1}, True, False, 6, np.zeros(13),
        ...              np.ones(13), 0, 1.5, {"train": ["train/part_00000.parquet"]})
        >>> m["split_lines"], m["freq_threshold"]
        ({'train': 8, 'val': 1, 'test': 1}, 6)
    """
    return dict(slot_info, source=[str(p) for p in paths], lines=total_lines,
                split_lines=dict(zip(SPLIT_NAMES, counts)), rows=rows,
                label=LABEL, dense=INT_COLUMNS, normalize_dense=normalize_dense,
                feature_cross=feature_cross, freq_threshold=int(freq_threshold),
                dense_log_min=dmin.tolist(), dense_log_max=dmax.tolist(),
                malformed=malformed, seconds=seconds, files=files)


def load_slot_sizes(dst) -> dict:
    """Read `slot_size_array.json` written by `preprocess` (keys slot_size_array, columns, offsets).

    Raises:
        FileNotFoundError: `dst` holds no `slot_size_array.json`.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "slot_size_array.json").write_text(json.dumps(slot_info([3], ["C1"], [0])))
        >>> load_slot_sizes(d)["slot_size_array"]
        [3]
    """
    p = Path(dst) / "slot_size_array.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p} not found: run criteo.preprocess(src, {dst!r}) first")
    return json.loads(p.read_text())


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


def check_preprocess_args(on_error, freq_threshold, row_group_rows, rows_per_file,
                          chunk_bytes) -> None:
    """The argument checks of `preprocess` (both paths): raises ValueError naming the argument.

    Example:
        >>> check_preprocess_args("ignore", 6, 1, 1, 1)
        Traceback (most recent call last):
        ValueError: on_error must be 'fail' or 'skip', got 'ignore'
    """
    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error must be 'fail' or 'skip', got {on_error!r}")
    if int(freq_threshold) < 1:
        raise ValueError(f"freq_threshold must be >= 1, got {freq_threshold}")
    if row_group_rows < 1 or rows_per_file < 1:
        raise ValueError("row_group_rows and rows_per_file must be >= 1")
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")


def warn_skipped(malformed: int, errors: list, stacklevel: int) -> None:
    """Warn that `malformed` lines were skipped, showing the first of `errors` (path, line,
    reason); nothing when none was. `stacklevel` as `warnings.warn` takes it, from the caller."""
    if not malformed:
        return
    shown = "; ".join(f"{p}:{l}: {r}" for p, l, r in errors[:3])
    warnings.warn(f"preprocess skipped {malformed} malformed lines (first: {shown})",
                  stacklevel=stacklevel + 1)

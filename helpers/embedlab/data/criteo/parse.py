"""Reading Criteo TSV: byte chunks of whole lines, a vectorized parser, malformed-line reports."""
from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from . import _swar
from .layout import CAT_COLUMNS, INT_COLUMNS, LABEL, MISSING_HEX, NUM_CAT, NUM_FIELDS, NUM_INT

_HEX_LUT = np.full(256, -1, dtype=np.int16)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_LUT[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_LUT[_c] = 10 + _i
_MAX_INT_CHARS = 18          # longest integer field accepted (int64 Horner cannot overflow)


class CriteoFormatError(ValueError):
    """A malformed Criteo line. `path`, `line` (1-based) and `reason` say which and why."""

    def __init__(self, path, line, reason, count=None):
        self.path, self.line, self.reason, self.count = str(path), int(line), reason, count
        extra = f" ({count} malformed lines in total)" if count else ""
        super().__init__(f"{path}:{line}: {reason}{extra}. Pass on_error='skip' to drop "
                         f"malformed lines (they are counted and reported).")


def _open(path):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Criteo file {path} does not exist (or is not a file)")
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def iter_byte_chunks(path, chunk_bytes: int) -> Iterator[tuple[int, np.ndarray, int]]:
    """A Criteo file as chunks of whole lines, read `chunk_bytes` at a time (`.gz` through gzip).

    Yields:
        (1-based number of the chunk's first line, uint8 array of whole lines ending in
        b'\\n', raw bytes of the file it covers). A last line without a newline gets one.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "a.txt"
        >>> _ = p.write_bytes(b"a\\nb\\nc")
        >>> [(first, buf.tobytes(), n) for first, buf, n in iter_byte_chunks(p, 3)]
        [(1, b'a\\n', 2), (2, b'b\\n', 2), (3, b'c\\n', 1)]
    """
    line = 1
    rest = b""
    with _open(path) as f:
        while True:
            data = f.read(chunk_bytes)
            if not data:
                break
            data = rest + data
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            rest = data[cut + 1:]
            arr = np.frombuffer(data, dtype=np.uint8, count=cut + 1)
            nlines = data.count(b"\n", 0, cut + 1)
            yield line, arr, len(data) - len(rest)
            line += nlines
    if rest:
        yield line, np.frombuffer(rest + b"\n", dtype=np.uint8), len(rest)


@dataclass
class Block:
    """Parsed Criteo lines: column arrays for the valid lines plus the malformed ones.

    Attributes:
        line: 1-based line numbers of the valid lines, int64 [n].
        label: int8 [n]. ints: int64 [n, 13]. int_missing: bool [n, 13].
        cats: uint32 [n, 26] (missing -> 0x80000000). cat_missing: bool [n, 26].
        bad_line: int64 line numbers of malformed lines; bad_reason: their reasons.
    """
    line: np.ndarray
    label: np.ndarray
    ints: np.ndarray
    int_missing: np.ndarray
    cats: np.ndarray
    cat_missing: np.ndarray
    bad_line: np.ndarray
    bad_reason: list = field(default_factory=list)

    def __len__(self):
        return len(self.line)


def parse_block(buf: np.ndarray, first_line: int) -> Block:
    """Parse whole lines (buf ends with b'\\n') column-wise. See `Block`.

    Args:
        buf: uint8 array of whole lines, the last ending in b'\\n'.
        first_line: the 1-based line number of buf's first line (for `Block.line`, reports).

    Returns:
        A `Block`: the valid lines' columns, and the malformed lines with their reasons.

    Clean chunks go through pyarrow's multi-threaded CSV reader (about 1M lines/s on two
    cores); a chunk that pyarrow rejects, or whose categoricals are not all 8 hex digits, is
    parsed again by the NumPy parser, which pins each malformed line and its reason.

    Example:
        >>> line = "\\t".join(["1"] + ["7"] * 13 + ["0000000a"] * 26) + "\\n"
        >>> b = parse_block(np.frombuffer((line + "bad\\n").encode(), np.uint8), 5)
        >>> b.line.tolist(), b.ints[0, 0], b.bad_line.tolist()
        ([5], 7, [6])
    """
    block = _parse_fast(buf, first_line)
    return block if block is not None else _parse_slow(buf, first_line)


_CSV_OPTS = None
_FAST_BYTES = b"0123456789abcdefABCDEF-\t\r\n"


def _csv_options():
    global _CSV_OPTS
    if _CSV_OPTS is None:
        import pyarrow as pa
        import pyarrow.csv as pcsv
        names = [LABEL] + INT_COLUMNS + CAT_COLUMNS
        types = {LABEL: pa.int8(), **{c: pa.int64() for c in INT_COLUMNS},
                 **{c: pa.binary() for c in CAT_COLUMNS}}
        _CSV_OPTS = (
            pcsv.ReadOptions(column_names=names, use_threads=True, block_size=4 << 20),
            # No quoting or escapes in Criteo; empty lines must be reported, not dropped.
            pcsv.ParseOptions(delimiter="\t", quote_char=False, double_quote=False,
                              escape_char=False, newlines_in_values=False,
                              ignore_empty_lines=False),
            pcsv.ConvertOptions(column_types=types, strings_can_be_null=True, null_values=[""],
                                quoted_strings_can_be_null=False, check_utf8=False))
    return _CSV_OPTS


def _parse_fast(buf: np.ndarray, first_line: int):
    """pyarrow fast path; None when the chunk holds anything malformed."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    # pyarrow is more lenient than the Kaggle format (it trims spaces and takes '+5' or '0x5'
    # as integers): any byte other than hex digits, '-', tab, CR, LF sends the chunk to the
    # strict parser.
    if buf.tobytes().translate(None, _FAST_BYTES):     # C-speed: deletes the allowed bytes
        return None
    nlines = int(np.count_nonzero(buf == 10))
    ro, po, co = _csv_options()
    try:
        table = pcsv.read_csv(pa.py_buffer(buf), read_options=ro, parse_options=po,
                              convert_options=co)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    if len(table) != nlines:
        return None
    lab = table.column(0).combine_chunks()
    if lab.null_count:
        return None
    label = lab.to_numpy()
    if ((label != 0) & (label != 1)).any():
        return None
    ints = np.empty((nlines, NUM_INT), dtype=np.int64)
    int_missing = np.empty((nlines, NUM_INT), dtype=bool)
    for j in range(NUM_INT):
        col = table.column(1 + j).combine_chunks()
        int_missing[:, j] = col.is_null().to_numpy(zero_copy_only=False)
        ints[:, j] = col.fill_null(0).to_numpy()
    cats = np.empty((nlines, NUM_CAT), dtype=np.uint32)
    cat_missing = np.empty((nlines, NUM_CAT), dtype=bool)
    for j in range(NUM_CAT):
        col = table.column(1 + NUM_INT + j).combine_chunks()
        _, off_buf, data_buf = col.buffers()
        off = np.frombuffer(off_buf, dtype=np.int32)[col.offset:col.offset + nlines + 1]
        lens = np.diff(off)
        missing = col.is_null().to_numpy(zero_copy_only=False) | (lens == 0)
        if ((lens != 8) & ~missing).any():
            return None
        data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else None
        if data is None or len(data) < 8:
            vals, ok = np.zeros(nlines, np.uint32), np.ones(nlines, bool)
        else:
            starts = np.minimum(off[:-1], len(data) - 8).astype(np.int64)
            words = _swar.load_u64(data, starts)
            vals, ok = _swar.blocked(_swar.hex_decode, words, out_dtypes=[np.uint32, bool])
        if not (ok | missing).all():
            return None
        vals[missing] = MISSING_HEX
        cats[:, j] = vals
        cat_missing[:, j] = missing
    return Block(line=first_line + np.arange(nlines, dtype=np.int64), label=label.astype(np.int8),
                 ints=ints, int_missing=int_missing, cats=cats, cat_missing=cat_missing,
                 bad_line=np.empty(0, np.int64), bad_reason=[])


def _parse_slow(buf: np.ndarray, first_line: int) -> Block:
    """NumPy parser that reports every malformed line with its reason."""
    nl = np.flatnonzero(buf == 10)
    nlines = len(nl)
    starts = np.empty(nlines, dtype=np.int64)
    starts[0] = 0
    starts[1:] = nl[:-1] + 1
    ends = nl.astype(np.int64)
    # Accept CRLF line ends.
    cr = (ends > starts) & (buf[np.maximum(ends - 1, 0)] == 13)
    ends = ends - cr
    tabs = np.flatnonzero(buf == 9)
    tab_line = np.searchsorted(nl, tabs)
    ntabs = np.bincount(tab_line, minlength=nlines)
    shape_ok = ntabs == NUM_FIELDS - 1
    line_no = first_line + np.arange(nlines, dtype=np.int64)

    t = tabs[shape_ok[tab_line]].reshape(-1, NUM_FIELDS - 1)
    fs = np.empty((len(t), NUM_FIELDS), dtype=np.int64)
    fe = np.empty_like(fs)
    fs[:, 0] = starts[shape_ok]
    fs[:, 1:] = t + 1
    fe[:, :-1] = t
    fe[:, -1] = ends[shape_ok]
    flen = fe - fs
    last = len(buf) - 1
    n = len(t)
    bad_field = np.full(n, -1, dtype=np.int64)     # first bad field index per line, -1 = ok

    # Label: exactly one character, '0' or '1'.
    lab_ch = buf[np.minimum(fs[:, 0], last)]
    label_ok = (flen[:, 0] == 1) & ((lab_ch == 48) | (lab_ch == 49))
    label = (lab_ch.astype(np.int16) - 48).astype(np.int8)

    # Integers: optional '-', then digits; empty = missing.
    li = flen[:, 1:1 + NUM_INT]
    m = int(min(li.max(initial=0), _MAX_INT_CHARS))
    ints = np.zeros((n, NUM_INT), dtype=np.int64)
    int_ok = li <= _MAX_INT_CHARS
    if m > 0:
        pos = np.arange(m)
        idx = np.minimum(fs[:, 1:1 + NUM_INT, None] + pos, last)
        ch = buf[idx].astype(np.int64)
        inside = pos < li[:, :, None]
        neg = (li > 0) & (ch[:, :, 0] == 45)
        isdig = (ch >= 48) & (ch <= 57)
        sign_pos = (pos == 0) & neg[:, :, None]
        int_ok &= np.all(~inside | isdig | sign_pos, axis=2) & ~(neg & (li == 1))
        d = ch - 48
        for k in range(m):
            use = inside[:, :, k] & isdig[:, :, k]
            ints = np.where(use, ints * 10 + d[:, :, k], ints)
        ints = np.where(neg, -ints, ints)
    int_missing = li == 0

    # Categoricals: exactly 8 hex digits; empty = missing.
    lc = flen[:, 1 + NUM_INT:]
    idx = np.minimum(fs[:, 1 + NUM_INT:, None] + np.arange(8), last)
    nib = _HEX_LUT[buf[idx]]
    cat_ok = (lc == 0) | ((lc == 8) & np.all(nib >= 0, axis=2))
    shifts = np.arange(28, -1, -4, dtype=np.int64)
    cats = (np.maximum(nib, 0).astype(np.int64) << shifts).sum(axis=2).astype(np.uint32)
    cat_missing = lc == 0
    cats[cat_missing] = MISSING_HEX

    ok_fields = np.column_stack([label_ok, int_ok, cat_ok])
    row_ok = ok_fields.all(axis=1)
    bad_rows = np.flatnonzero(~row_ok)
    bad_field[bad_rows] = np.argmin(ok_fields[bad_rows], axis=1)

    good_lines = line_no[shape_ok]
    # Malformed: wrong field count, or a bad field.
    bad_shape = np.flatnonzero(~shape_ok)
    bad_line = np.concatenate([line_no[bad_shape], good_lines[bad_rows]])
    reasons = [f"expected {NUM_FIELDS} tab-separated fields, found {int(c) + 1}"
               for c in ntabs[bad_shape]]
    names = [LABEL] + INT_COLUMNS + CAT_COLUMNS
    for r in bad_rows:
        j = int(bad_field[r])
        raw = bytes(buf[fs[r, j]:fe[r, j]][:40]).decode("latin-1")
        what = ("label must be 0 or 1" if j == 0 else
                "integer field is not a number" if j <= NUM_INT else
                "categorical field is not 8 hex digits")
        reasons.append(f"{names[j]} = {raw!r}: {what}")
    order = np.argsort(bad_line, kind="stable")
    return Block(line=good_lines[row_ok], label=label[row_ok], ints=ints[row_ok],
                 int_missing=int_missing[row_ok], cats=cats[row_ok],
                 cat_missing=cat_missing[row_ok], bad_line=bad_line[order],
                 bad_reason=[reasons[i] for i in order])


def as_paths(src) -> list[Path]:
    """`src` (a path, or a non-empty list of paths) as a list of `Path`.

    Example:
        >>> as_paths("day.txt"), as_paths(["a.txt", "b.txt"])[1]
        ([PosixPath('day.txt')], PosixPath('b.txt'))
    """
    if isinstance(src, (str, os.PathLike)):
        return [Path(src)]
    paths = [Path(p) for p in src]
    if not paths:
        raise ValueError("no Criteo input files given")
    return paths


def read_chunks(src, *, chunk_bytes: int = 32 << 20, on_error: str = "fail",
                errors: list | None = None) -> Iterator[tuple[Path, Block]]:
    """Stream Criteo TSV file(s) as parsed column blocks, with bounded memory.

    Args:
        src: a path or a list of paths (`.gz` is read through gzip).
        chunk_bytes: bytes read per block (memory use is a small multiple of this).
        on_error: "fail" raises `CriteoFormatError` at the first malformed line; "skip"
            drops malformed lines. Either way each malformed line is appended to `errors`
            (if given) as (path, line, reason).
        errors: optional list collecting malformed lines.

    Returns:
        An iterator of (path, `Block`).

    Example:
        >>> import tempfile
        >>> from embedlab.data.criteo import generate
        >>> p = generate(Path(tempfile.mkdtemp()) / "day.txt", rows=1000, seed=0, progress=False)
        >>> blocks = [block for _, block in read_chunks(p, chunk_bytes=50_000)]
        >>> len(blocks) > 1, sum(len(b) for b in blocks), blocks[0].cats.shape[1]
        (True, 1000, 26)
    """
    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error must be 'fail' or 'skip', got {on_error!r}")
    for path in as_paths(src):
        for first, buf, _ in iter_byte_chunks(path, chunk_bytes):
            block = parse_block(buf, first)
            if len(block.bad_line):
                if errors is not None:
                    errors.extend((str(path), int(l), r)
                                  for l, r in zip(block.bad_line, block.bad_reason))
                if on_error == "fail":
                    raise CriteoFormatError(path, block.bad_line[0], block.bad_reason[0])
            yield path, block


def count_lines(src, chunk_bytes: int = 64 << 20) -> int:
    """Number of lines (a last line without a newline counts) in one file or a list of files."""
    total = 0
    for path in as_paths(src):
        last = b"\n"
        with _open(path) as f:
            while data := f.read(chunk_bytes):
                total += data.count(b"\n")
                last = data[-1:]
        total += last != b"\n"
    return total


def select_rows(block: Block, sel: np.ndarray) -> Block:
    """The valid lines of `block` that `sel` (a bool mask or indices) picks; the malformed-line
    report is kept whole.

    Example:
        >>> line = "\\t".join(["1"] + ["7"] * 13 + ["0000000a"] * 26) + "\\n"
        >>> b = parse_block(np.frombuffer((line * 3).encode(), np.uint8), 1)
        >>> select_rows(b, b.line >= 2).line.tolist()
        [2, 3]
    """
    return Block(line=block.line[sel], label=block.label[sel], ints=block.ints[sel],
                 int_missing=block.int_missing[sel], cats=block.cats[sel],
                 cat_missing=block.cat_missing[sel], bad_line=block.bad_line,
                 bad_reason=block.bad_reason)


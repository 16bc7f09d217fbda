"""Plain-Python oracles for embedlab.data: one line, one record at a time, no vectorization.

They are slow and obviously correct, and share no code with the package.
"""
from __future__ import annotations

import math
import struct
from collections import Counter

import numpy as np

HEX = set("0123456789abcdefABCDEF")
MISSING = 0x80000000


def parse_line(line: str):
    """(label, ints with None for missing, cats as int with MISSING for missing); ValueError if bad."""
    line = line.rstrip("\n").rstrip("\r")
    f = line.split("\t")
    if len(f) != 40:
        raise ValueError(f"expected 40 fields, found {len(f)}")
    if f[0] not in ("0", "1"):
        raise ValueError("label")
    ints = []
    for x in f[1:14]:
        if x == "":
            ints.append(None)
            continue
        body = x[1:] if x.startswith("-") else x
        if not body or not body.isdigit() or not body.isascii():
            raise ValueError(f"int {x!r}")
        ints.append(int(x))
    cats = []
    for x in f[14:]:
        if x == "":
            cats.append(MISSING)
        elif len(x) == 8 and set(x) <= HEX:
            cats.append(int(x, 16))
        else:
            raise ValueError(f"hex {x!r}")
    return int(f[0]), ints, cats


def preprocess(lines, counts, freq_threshold=6, normalize_dense=True, feature_cross=True):
    """The HugeCTR recipe as `criteo.preprocess` documents it, row by row.

    Returns (splits: {name: list of row dicts}, slot_size_array, offsets).
    """
    rows = [parse_line(l) for l in lines]
    n_train = counts[0]
    train = rows[:n_train]
    crosses = [(0, 1), (2, 3)] if feature_cross else []

    def cat_values(r):
        vals = list(r[2])
        for a, b in crosses:
            vals.append((r[2][a], r[2][b]))
        return vals

    n_slots = 26 + len(crosses)
    counters = [Counter() for _ in range(n_slots)]
    for r in train:
        for j, v in enumerate(cat_values(r)):
            counters[j][v] += 1

    def is_missing(j, v):
        return (MISSING in v) if j >= 26 else v == MISSING

    vocab = []
    for j in range(n_slots):
        keep = sorted(v for v, c in counters[j].items() if c >= freq_threshold
                      and not is_missing(j, v))
        vocab.append({v: i + 1 for i, v in enumerate(keep)})
    sizes = [len(v) + 1 for v in vocab]
    offsets = [sum(sizes[:j]) for j in range(n_slots)]

    def dense(r):
        return [math.log1p(max(x, 0)) if x is not None else 0.0 for x in r[1]]

    lo = [min(dense(r)[k] for r in train) if train else 0.0 for k in range(13)]
    hi = [max(dense(r)[k] for r in train) if train else 0.0 for k in range(13)]
    names = ["train", "val", "test"]
    out = {n: [] for n in names}
    bounds = np.cumsum([0] + list(counts))
    for i, r in enumerate(rows):
        s = names[int(np.searchsorted(bounds, i, side="right")) - 1]
        d = dense(r)
        if normalize_dense:
            d = [min(max((x - l) / (h - l) if h > l else (x - l), 0.0), 1.0)
                 for x, l, h in zip(d, lo, hi)]
        row = {"label": float(r[0])}
        row.update({f"I{k + 1}": d[k] for k in range(13)})
        cat_names = [f"C{k + 1}" for k in range(26)] + (["C1_C2", "C3_C4"] if feature_cross else [])
        for j, v in enumerate(cat_values(r)):
            row[cat_names[j]] = vocab[j].get(v, 0) + offsets[j]
        out[s].append(row)
    return out, sizes, offsets


def norm_bytes(label, dense, slots, error_check=True, key_type="uint32"):
    """HugeCTR Norm file bytes, one struct.pack per field. slots: per slot a list of key lists."""
    kfmt = "<I" if key_type == "uint32" else "<q"
    n = len(label)

    def framed(payload: bytes) -> bytes:
        if not error_check:
            return payload
        s = sum(struct.unpack(f"{len(payload)}b", payload)) & 0xFF if payload else 0
        return struct.pack("<i", len(payload)) + payload + bytes([s])

    out = framed(struct.pack("<8q", int(error_check), n, len(label[0]) if n else 1,
                             len(dense[0]) if n else 0, len(slots), 0, 0, 0))
    for r in range(n):
        p = b"".join(struct.pack("<f", x) for x in label[r])
        p += b"".join(struct.pack("<f", x) for x in dense[r])
        for s in slots:
            keys = s[r]
            p += struct.pack("<i", len(keys)) + b"".join(struct.pack(kfmt, int(k)) for k in keys)
        out += framed(p)
    return out

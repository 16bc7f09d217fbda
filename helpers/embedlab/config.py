"""One place for the knobs every notebook and script reads.

`EMBEDLAB_SCALE` (ci | small | full) sets problem sizes; `EMBEDLAB_DATA_DIR` sets where
generated and converted data live; `CRITEO_DIR` points at a real Criteo download.
They are read once, at import.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Scale:
    name: str
    criteo_rows: int        # rows of synthetic Criteo data a notebook generates
    train_steps: int        # optimizer steps a notebook trains for
    batch_size: int         # training batch size in notebooks
    bench_repeats: int      # timing repeats in notebook throughput comparisons


_SCALES = {
    "ci": Scale("ci", criteo_rows=20_000, train_steps=40, batch_size=512, bench_repeats=3),
    "small": Scale("small", criteo_rows=200_000, train_steps=200, batch_size=2048, bench_repeats=5),
    "full": Scale("full", criteo_rows=4_000_000, train_steps=2000, batch_size=16384, bench_repeats=10),
}


def _read_scale() -> Scale:
    name = os.environ.get("EMBEDLAB_SCALE", "small").strip().lower()
    if name not in _SCALES:
        raise ValueError(
            f"EMBEDLAB_SCALE={name!r} is not one of {sorted(_SCALES)}; unset it or pick one")
    return _SCALES[name]


SCALE: Scale = _read_scale()
DATA_DIR: Path = Path(os.environ.get("EMBEDLAB_DATA_DIR", _REPO_ROOT / "data" / "cache")).resolve()
CRITEO_DIR: Path | None = Path(os.environ["CRITEO_DIR"]).resolve() if os.environ.get("CRITEO_DIR") else None


def data_path(*parts: str) -> Path:
    """A path under DATA_DIR, with its parent folder created."""
    p = DATA_DIR.joinpath(*parts)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p

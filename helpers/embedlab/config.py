"""One place for the knobs every notebook and script reads.

`EMBEDLAB_SCALE` (ci | small | full) sets problem sizes; `CRITEO_DIR` points at a real Criteo
download. Both are read once, at import.

`DATA_DIR`, where generated and converted data live, is `EMBEDLAB_DATA_DIR` when that is set,
else `data/cache/` of the EmbedLab checkout that contains the current working directory (the
first folder, walking up from the cwd, that holds `helpers/pyproject.toml` and `notebooks/`;
notebooks run with their own folder as cwd, scripts and tests from the repository root). It is
never derived from where the package is installed: a non-editable install lives inside a virtual
environment, and data must not land there. Outside a checkout, with `EMBEDLAB_DATA_DIR` unset,
reading `DATA_DIR` raises an error that says to set it. It is resolved on first use.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path



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
CRITEO_DIR: Path | None = Path(os.environ["CRITEO_DIR"]).resolve() if os.environ.get("CRITEO_DIR") else None


class DataDirError(RuntimeError):
    """No data folder: EMBEDLAB_DATA_DIR is unset and the cwd is not inside an EmbedLab checkout."""


def find_checkout(start: Path | str | None = None) -> Path | None:
    """The EmbedLab checkout containing `start` (default: the cwd), or None.

    A checkout is the first folder, walking up from `start`, that holds both
    `helpers/pyproject.toml` and a `notebooks/` folder.
    """
    here = Path.cwd() if start is None else Path(start)
    here = here.resolve()
    for folder in (here, *here.parents):
        if (folder / "helpers" / "pyproject.toml").is_file() and (folder / "notebooks").is_dir():
            return folder
    return None


def _resolve_data_dir() -> Path:
    env = os.environ.get("EMBEDLAB_DATA_DIR", "").strip()
    if env:
        return Path(env).expanduser().resolve()
    root = find_checkout()
    if root is None:
        raise DataDirError(
            f"embedlab.config.DATA_DIR: EMBEDLAB_DATA_DIR is not set and the working directory {Path.cwd()} "
            "is not inside an EmbedLab checkout (a folder with helpers/pyproject.toml and notebooks/); "
            "set EMBEDLAB_DATA_DIR to the folder where generated data should go, or run from the checkout")
    return root / "data" / "cache"


_data_dir: Path | None = None


def __getattr__(name):
    # DATA_DIR is resolved on first use, so that importing embedlab outside a checkout works and
    # only asking for the data folder there raises.
    global _data_dir
    if name == "DATA_DIR":
        if _data_dir is None:
            _data_dir = _resolve_data_dir()
        return _data_dir
    raise AttributeError(f"module 'embedlab.config' has no attribute {name!r}")


def data_path(*parts: str) -> Path:
    """A path under DATA_DIR, with its parent folder created."""
    p = __getattr__("DATA_DIR").joinpath(*parts)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p

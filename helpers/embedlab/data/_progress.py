"""The progress bar class for the ETL and converters.

`tqdm.auto` draws a widget in Jupyter, which needs ipywidgets; without it, it warns
("IProgress not found") and falls back anyway. So: the widget bar where ipywidgets is
installed, tqdm's plain text bar everywhere else (terminals, and notebooks executed by
nbconvert / nbval, whose outputs keep the text bar's final line).
"""
from __future__ import annotations

import importlib.util


def _bar_class():
    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm as bar
    else:
        from tqdm.std import tqdm as bar
    return bar


def tqdm(*args, **kwargs):
    """`tqdm.tqdm(...)` with the bar class above."""
    return _bar_class()(*args, **kwargs)

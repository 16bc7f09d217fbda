"""The progress bar of the ETL and the converters: tqdm's text bar, drawn where it reads well.

- In a terminal (or any stream that is not a Jupyter kernel's), tqdm's plain text bar on stderr,
  redrawn in place with carriage returns.
- In a Jupyter kernel, the same text drawn as one display output that is updated in place
  (IPython's display updates). A carriage return means nothing to a notebook's stored output:
  a text bar there leaves one stream output per redraw in the executed notebook (what nbconvert
  and nbval save), while a display update replaces the output, live in a browser and in the
  saved file alike. At the end a bar made with `leave=False` empties its output and one made
  with `leave=True` keeps its last line; a bar closed before its total keeps its last line, so a
  failed run shows where it stopped. A bar reuses the output of a finished `leave=False` bar of
  the same cell, so a cell that runs several passes leaves one empty output, not one per bar.
  No ipywidgets needed.
"""
from __future__ import annotations

from tqdm.std import tqdm as _text_tqdm

__all__ = ["tqdm", "in_notebook_kernel"]


def in_notebook_kernel() -> bool:
    """True inside a Jupyter kernel (IPython with a kernel attached), False elsewhere."""
    import sys
    if "IPython" not in sys.modules:          # never imported: not a kernel, and no import cost
        return False
    try:
        from IPython import get_ipython
    except ImportError:                       # pragma: no cover
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def _current_cell() -> str | None:
    """The id of the request the kernel is executing (one per cell run), or None."""
    from IPython import get_ipython
    header = getattr(get_ipython(), "parent_header", None) or {}
    return header.get("msg_id") or (header.get("header") or {}).get("msg_id")


class NotebookBar(_text_tqdm):
    """tqdm's text bar as one display output of a Jupyter kernel, updated in place."""

    # Outputs of the running cell whose bars were closed empty (leave=False): the cell's next
    # bar draws in one of them instead of adding an output.
    _free = {"cell": None, "handles": []}

    def __init__(self, *args, **kwargs):
        kwargs = dict(kwargs, gui=True)                  # gui: tqdm itself writes to no stream
        kwargs["disable"] = bool(kwargs.get("disable", False))
        super().__init__(*args, **kwargs)
        self._handle = None
        if not self.disable:
            free, cell = NotebookBar._free, _current_cell()
            if free["cell"] != cell:
                free.update(cell=cell, handles=[])
            if cell is not None and free["handles"]:
                self._handle = free["handles"].pop()
                self._handle.update(self._bundle(str(self)), raw=True)
            else:
                from IPython.display import display
                self._handle = display(self._bundle(str(self)), raw=True, display_id=True)

    @staticmethod
    def _bundle(text: str) -> dict:
        return {"text/plain": text}

    def display(self, msg=None, pos=None):
        if self._handle is not None:
            self._handle.update(self._bundle(str(self) if msg is None else msg), raw=True)
        return True

    def clear(self, *_, **__):
        pass

    def close(self):
        if self.disable:
            return
        leave = self.leave if self.leave is not None else True
        keep = leave or (bool(self.total) and self.n < self.total)
        super().close()
        if self._handle is not None:
            self._handle.update(self._bundle(str(self) if keep else ""), raw=True)
            if not keep and NotebookBar._free["cell"] == _current_cell():
                NotebookBar._free["handles"].append(self._handle)


def tqdm(*args, **kwargs):
    """`tqdm.tqdm(...)`: the text bar in a terminal, `NotebookBar` in a Jupyter kernel."""
    return (NotebookBar if in_notebook_kernel() else _text_tqdm)(*args, **kwargs)

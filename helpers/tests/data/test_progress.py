"""The progress bar of the ETL and converters: tqdm's text bar outside Jupyter, and in a real
Jupyter kernel (run through nbclient, as nbconvert and nbval run the notebooks) one display
output updated in place: no stream output, an empty output when a `leave=False` bar ends, the
last line kept for `leave=True` and for a bar that stopped early."""
from __future__ import annotations

import pytest
import tqdm as tqdm_pkg

from embedlab.data import _progress


def test_outside_a_kernel_it_is_tqdms_text_bar(capsys):
    assert not _progress.in_notebook_kernel()
    bar = _progress.tqdm(total=3, desc="rows", leave=False)
    assert type(bar) is tqdm_pkg.std.tqdm
    bar.update(3)
    bar.close()
    assert "rows" in capsys.readouterr().err


def _run_in_kernel(code: str) -> list:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(code), nbformat.v4.new_code_cell(
        "for i in tqdm(range(20), desc='next cell', leave=False): pass")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    return [c.outputs for c in nb.cells]


def test_in_a_kernel_bars_update_one_output_in_place():
    code = ("from embedlab.data._progress import tqdm, in_notebook_kernel, NotebookBar\n"
            "import time\n"
            "print('kernel', in_notebook_kernel())\n"
            "for i in tqdm(range(200), desc='pass 1', leave=False): time.sleep(0.001)\n"
            "for i in tqdm(range(200), desc='pass 2', leave=False): time.sleep(0.001)\n"
            "with tqdm(total=10, desc='kept', unit='rows') as bar:\n"
            "    assert isinstance(bar, NotebookBar)\n"
            "    bar.update(10)\n"
            "bar = tqdm(total=10, desc='stopped', leave=False); bar.update(4); bar.close()\n"
            "with tqdm(total=5, disable=True) as bar: bar.update(5)\n"
            "print('done')")
    first, second = _run_in_kernel(code)
    streams = [o for o in first if o["output_type"] == "stream"]
    assert [o["text"] for o in streams] == ["kernel True\n", "done\n"], streams    # no bar text in streams
    shown = [o["data"]["text/plain"] for o in first if o["output_type"] == "display_data"]
    # pass 1 and pass 2 share one output, which pass 2's end left to the next bar
    assert len(shown) == 2, shown
    assert shown[0].startswith("kept: 100%") and "10/10" in shown[0] and "rows" in shown[0]
    assert shown[1].startswith("stopped:  40%") and "4/10" in shown[1]
    assert not any("\r" in s for s in shown)
    assert [o["output_type"] for o in second] == ["display_data"] and second[0]["data"]["text/plain"] == ""

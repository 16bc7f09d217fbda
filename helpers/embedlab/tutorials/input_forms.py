"""Notebook 01's input-form lesson: where the forward time of each key form (pre-built CSR, sorted
and shuffled COO, dense) goes, a cost model of the COO forms (CSR work + the conversion op alone),
and a report whose words follow the measured numbers and their spread.

The timings come from `embedlab.timing.interleaved_samples` over cases named
`(form, "forward" | "call" | "convert")`: the form's forward, the same call with an empty body
(the fixed cost of passing its tensors), and, for COO forms, the conversion op on its own.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..timing import compare, format_spread, spread

__all__ = ["CSR", "SORTED", "SHUFFLED", "DENSE", "graph_ops", "cost_split", "format_ms", "input_form_report"]

CSR, SORTED, SHUFFLED, DENSE = "pre-built CSR", "COO, sorted by row", "COO, shuffled", "dense, -1 padded"


def graph_ops(fn, x) -> dict:
    """The ops a traced `tf.function` runs for input `x`, for reading what a forward does.

    Args:
        fn: a `tf.function`. x: its one argument.

    Returns:
        dict: `count` (ops other than placeholders, constants, identities and no-ops) and
        `embedlab` (the sorted EmbedLab op types in the graph).

    Example:
        >>> import tensorflow as tf
        >>> graph_ops(tf.function(lambda t: t * 2 + 1), tf.constant([1.0]))["count"]
        2
    """
    g = fn.get_concrete_function(x).graph
    types = [o.type for o in g.get_operations() if o.type not in ("Placeholder", "Const", "Identity", "NoOp")]
    return {"count": len(types), "embedlab": sorted({t for t in types if t.startswith("EmbedLab")})}


def cost_split(samples: Mapping) -> dict:
    """Per-round cost split of each input form, and the COO forms' cost model with its residual.

    Args:
        samples: `{(form, what): ms array}` from `interleaved_samples`, `what` in "forward",
            "call" and (COO forms) "convert"; must hold `CSR`'s forward and call.

    Returns:
        `{form: {"forward", "call", "work", ["convert", "predicted", "residual"]: ms arrays}}`,
        element i of each from round i. `work` = forward - call; for a COO form, `convert` is
        the conversion op less its own call cost, `predicted` = CSR's work + convert (the
        model: a COO forward is a conversion, then the CSR lookup), `residual` = work - predicted.

    Raises:
        ValueError: a form without its forward or call, or no CSR form.

    Example:
        >>> s = {(CSR, "forward"): [3.0], (CSR, "call"): [1.0], (SORTED, "forward"): [4.0],
        ...      (SORTED, "call"): [1.5], (SORTED, "convert"): [2.0]}
        >>> float(cost_split(s)[SORTED]["residual"][0])      # 2.5 - (2.0 + 0.5)
        0.0
    """
    forms = list(dict.fromkeys(f for f, _ in samples))
    if CSR not in forms:
        raise ValueError(f"cost_split: samples need the form {CSR!r}; got forms {forms}")
    out = {}
    for form in forms:
        for what in ("forward", "call"):
            if (form, what) not in samples:
                raise ValueError(f"cost_split: samples lack ({form!r}, {what!r})")
        t = {what: np.asarray(samples[(form, what)], dtype=np.float64)
             for what in ("forward", "call", "convert") if (form, what) in samples}
        t["work"] = t["forward"] - t["call"]
        if "convert" in t:
            t["convert"] = t["convert"] - t["call"]
        out[form] = t
    for form, t in out.items():
        if "convert" in t:
            t["predicted"] = out[CSR]["work"] + t["convert"]
            t["residual"] = t["work"] - t["predicted"]
    return out


def format_ms(x) -> str:
    """'median ms (q1-q3)' of repeated ms, written 'median ms (q1 to q3)' with signs where the
    range reaches below 0 (a difference of two timings can).

    Example:
        >>> format_ms([1.0, 2.0, 3.0]), format_ms([-1.0, 0.5, 2.0])
        ('2.00 ms (1.50-2.50)', '+0.50 ms (-0.25 to +1.25)')
    """
    med, q1, q3 = spread(x)
    if q1 < 0:
        return f"{med:+.2f} ms ({q1:+.2f} to {q3:+.2f})"
    return format_spread(x, ".2f")


_ms = format_ms


def _signed_ms(x) -> str:
    med, q1, q3 = spread(x)
    return f"{med:+.2f} ms ({q1:+.2f} to {q3:+.2f})"


def input_form_report(split: dict, ops: Mapping[str, dict], keys: int) -> tuple:
    """(markdown, numbers): what each input form cost in this run, the model's prediction against
    the measurement, and advice, every outcome worded from the numbers and their spread.

    Args:
        split: `cost_split`'s result (with `CSR`, `SORTED`, `SHUFFLED`, `DENSE`).
        ops: `{form: graph_ops(forward, x)}` for the four forms.
        keys: keys in the batch (for the text).

    Returns:
        (markdown string, dict of `Comparison`s: "sorted_vs_csr", "dense_vs_csr",
        "sorted_vs_shuffled", and `residual` per COO form: (median, q1, q3) ms).
    """
    missing = [f for f in (CSR, SORTED, SHUFFLED, DENSE) if f not in split or f not in ops]
    if missing:
        raise ValueError(f"input_form_report: split and ops need the forms {missing}")
    fw = {f: split[f]["forward"] for f in split}
    rounds = len(fw[CSR])
    cmp = {"sorted_vs_csr": compare(fw[SORTED], fw[CSR], "sorted COO", "pre-built CSR"),
           "dense_vs_csr": compare(fw[DENSE], fw[CSR], "dense keys", "pre-built CSR"),
           "sorted_vs_shuffled": compare(fw[SORTED], fw[SHUFFLED], "sorted COO", "shuffled COO")}
    res = {f: spread(split[f]["residual"]) for f in (SORTED, SHUFFLED)}
    out = [f"Measured in this run ({keys:,} keys, medians of {rounds} interleaved rounds, the middle half of "
           f"the rounds in brackets): forward with pre-built CSR **{_ms(fw[CSR])}**, sorted COO "
           f"**{_ms(fw[SORTED])}**, shuffled COO **{_ms(fw[SHUFFLED])}**, dense **{_ms(fw[DENSE])}**."]
    out.append(" ".join(c.sentence() + "." for c in cmp.values()))

    # The cost model against the measurement.
    rows = ["| COO form | CSR work + conversion alone (prediction) | measured work | residual |",
            "|---|---|---|---|"]
    for f in (SORTED, SHUFFLED):
        t = split[f]
        rows.append(f"| {f} | {_ms(t['predicted'])} | {_ms(t['work'])} | {_signed_ms(t['residual'])} |")
    out.append("The model (a COO forward = the conversion op, then the CSR lookup), per round, work = forward "
               "less the call cost:\n\n" + "\n".join(rows))
    outside = [f for f, (m, q1, q3) in res.items() if not q1 <= 0.0 <= q3]
    csr_ops, coo_ops = ops[CSR], ops[SORTED]
    facts = (f"The model leaves out two things the traced graphs show: a COO forward runs {', '.join(coo_ops['embedlab'])}, one op that "
             f"converts and looks up in one pass without writing the CSR arrays out and reading them back, "
             f"while the conversion op timed alone does write them; and the CSR forward runs "
             f"{csr_ops['count']} ops against {coo_ops['count']} for COO, the difference being the checks of "
             "user-given `row_offsets` (differences, minimum, maximum, first and last over every offset, each "
             "a pass over memory), which converted COO does not need because the op builds its offsets itself.")
    if not outside:
        out.append("Both residuals are within this machine's noise (the middle half of the rounds holds 0): at "
                   "this noise the model accounts for the measurement. " + facts + " Either may show as a "
                   "residual on a quieter machine or at a larger batch.")
    else:
        signs = ", ".join(f"{f}: {m:+.2f} ms ({q1:+.2f} to {q3:+.2f})" for f, (m, q1, q3) in res.items())
        side = [("less" if res[f][0] < 0 else "more") for f in outside]
        out.append(f"The residual ({signs}) is larger than the noise for {' and '.join(outside)}: the measured "
                   f"work is {' / '.join(side)} than the model predicts: the model misses a cost or a saving, beyond the timer's noise. "
                   + facts)

    # Advice from the numbers.
    s = cmp["sorted_vs_csr"]
    if s.faster == "pre-built CSR":
        advice = ("Pre-built CSR was the faster input here: building it in the data pipeline saves the "
                  "forward that time.")
    elif s.faster == "sorted COO":
        advice = ("Pre-built CSR was slower than sorted COO here, since its offsets are checked on every call: "
                  "building CSR in the data pipeline buys nothing for this layer; a canonical (row-ordered) "
                  "SparseTensor is the cheaper input.")
    else:
        advice = ("Sorted COO and pre-built CSR cost the same within the noise: building CSR in the data "
                  "pipeline buys nothing measurable for this layer.")
    sh = cmp["sorted_vs_shuffled"]
    if sh.faster == "sorted COO":
        advice += " Shuffled COO pays its counting sort and gather on every step: keep COO in row order."
    elif sh.faster is None:
        advice += " Shuffled and sorted COO were within the noise of each other at this batch."
    else:
        advice += " Shuffled COO was not slower than sorted COO in this run."
    out.append(advice)
    return "\n\n".join(out), {**cmp, "residual": res}

"""The Kaggle Criteo TSV layout: one sample per line, 40 tab-separated fields.

The label (0/1), 13 integer features `I1..I13`, then 26 categorical features `C1..C26` written
as 8 hex digits (32-bit hashes). A missing value is an empty field.
"""
from __future__ import annotations

NUM_INT = 13
NUM_CAT = 26
NUM_FIELDS = 1 + NUM_INT + NUM_CAT
LABEL = "label"
INT_COLUMNS = [f"I{i}" for i in range(1, NUM_INT + 1)]
CAT_COLUMNS = [f"C{i}" for i in range(1, NUM_CAT + 1)]
# HugeCTR's preprocess.py writes a missing categorical as the hex string '80000000'; we keep
# the same convention so that "missing" is one more 32-bit value in every counter.
MISSING_HEX = 0x80000000

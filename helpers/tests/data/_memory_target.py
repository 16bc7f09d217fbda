"""Module-level functions for test_memory.py's child processes (found through PYTHONPATH)."""
import numpy as np


def allocate(mib: int) -> int:
    a = np.ones(mib << 18, dtype=np.float32)      # mib MiB, touched
    return int(a.size)


def fail(message: str):
    raise ValueError(message)

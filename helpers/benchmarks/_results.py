"""Where a benchmark writes its JSON: docs/benchmarks/results/<benchmark>_<machine>_<date>.json.

`machine` is a short slug of the hardware that ran it (`amd-epyc-2c`, `nvidia-h100`, ...),
`date` the UTC time of the run (`2026-11-23T0052Z`), so runs never overwrite each other and
the documentation's benchmarks page (docs/benchmarks/, its tables and plots generated from
these files by docs/benchmarks/generate.py) can cite each file by name.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "results"


def slug(text: str) -> str:
    s = re.sub(r"\((r|tm)\)|\bcpu\b|\bprocessor\b|@.*$|\d+-core", " ", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-")


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (e.g. 'AMD EPYC 7B13'), or the platform's machine name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.machine()


def cpu_family_model() -> str:
    """'family F model M' of the CPU from /proc/cpuinfo ('' where it is not there): one slug covers
    hosts of different generations (an AMD EPYC of family 25 or of family 26), this tells them apart."""
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("cpu family", "model") and key not in fields:
                fields[key] = value.strip()
            if not line.strip() and fields:
                break
    except OSError:
        return ""
    return f"family {fields['cpu family']} model {fields['model']}" if len(fields) == 2 else ""


def cpu_machine() -> str:
    """A slug for this CPU machine: vendor and family, then the core count ('amd-epyc-2c')."""
    words = slug(cpu_name()).split("-")
    return "-".join(words[:2] + [f"{os.cpu_count()}c"])


def default_out(benchmark: str, machine: str) -> Path:
    stamp = time.strftime("%Y-%m-%dT%H%MZ", time.gmtime())
    return RESULTS_DIR / f"{benchmark}_{slug(machine)}_{stamp}.json"


def gpu_machine(device_name: str) -> str:
    """A slug for a GPU: vendor and model ('NVIDIA H100 80GB HBM3' -> 'nvidia-h100')."""
    return "-".join(slug(device_name).split("-")[:2])

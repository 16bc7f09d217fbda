"""What the GPU benchmarks (lookup_gpu.py, hps_gpu.py, sok.py --mode gpu-routing) share: the
framework-free module, the CUDA-event timer, the GPU's description, and where the JSON goes
($OUT on the device machine, else results/)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import _results


def load_core():
    """The framework-free module: a standalone build (EMBEDLAB_CORE_STANDALONE=1, on PYTHONPATH),
    else the installed package's, else a standalone build after all."""
    if os.environ.get("EMBEDLAB_CORE_STANDALONE"):
        import _embedlab_core
        return _embedlab_core
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import embedlab
        return embedlab.core()
    except Exception:
        import _embedlab_core
        return _embedlab_core


def events_ms(torch, fn, reps, inner=10, warmup=3, setup=None) -> float:
    """Median over reps of (time between CUDA events around `inner` back-to-back fn() calls) / inner.

    Back-to-back calls let the host's per-call overhead (argument checks, DLPack import,
    PyTorch's dispatcher) overlap the previous call's GPU work, as in a training loop; both
    sides of a comparison get the same treatment. setup(), when given, runs untimed before each
    rep; the first `warmup` reps are not counted.
    """
    times = []
    for i in range(warmup + reps):
        if setup is not None:
            setup()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        if i >= warmup:
            times.append(a.elapsed_time(b) / inner)
    return float(np.median(times))


def gpu_info(torch) -> dict:
    """GPU name, PyTorch and its CUDA, and nvidia-smi's name, driver, memory and clocks."""
    info = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
        info["nvidia_smi"] = out
        info["driver"] = out.split(",")[1].strip()
    except Exception as e:  # noqa: BLE001 - informative only
        info["nvidia_smi"] = f"unavailable ({e})"
        info["driver"] = f"unknown ({e})"
    return info


def out_path(benchmark: str, info: dict) -> Path:
    """results/<benchmark>_<gpu>_<UTC time>.json, or the same name under $OUT when it is set."""
    path = _results.default_out(benchmark, _results.gpu_machine(info["gpu"]))
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / path.name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path

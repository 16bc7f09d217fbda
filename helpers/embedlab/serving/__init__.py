"""Serving with a real Triton Inference Server: HPS lookup + ONNX dense model as an ensemble.

- `write_model_repository(manifest, repository, ...)`: the `hps_embedding` (python backend over
  `embedlab.hps.ParameterServer`), `dense` (python backend over onnxruntime) and `ensemble`
  models for a model exported by notebook 05 (`serving.json`).
- `write_identity_repository(...)`: a two-model identity ensemble, the ceiling of this path.
- `TritonServer(repository)`: the tritonserver binary of the `nvidia-pytriton` wheel on
  127.0.0.1, as a context manager (free ports, readiness wait, log file, stop by PID).
- `InProcessModel(manifest)`: the same two steps (HPS lookup, then onnxruntime) in this
  process, the reference the served answers are compared with.
- `run_load(...)`, `infer(...)`, `predict(...)`: a bounded multi-threaded tritonclient load
  generator and one-call client helpers (`predict` also returns, per sample, how many keys were
  answered with the default vector); `hps_stats(server)` reads the HPS statistics from the
  metrics endpoint, current at every scrape.

`python -m embedlab.serving` (`make serve`) serves notebook 05's export for a person to query.
"""
from .repository import (ENSEMBLE, IDENTITY_ENSEMBLE, ServingManifest, load_manifest, verify_manifest_files,
                         write_identity_repository, write_model_repository,
                         write_ps_config_variant)
from .server import TritonServer, TritonServerError, find_tritonserver

__all__ = ["TritonServer", "TritonServerError", "find_tritonserver", "ServingManifest",
           "load_manifest", "verify_manifest_files", "write_model_repository", "write_identity_repository", "write_ps_config_variant", "ENSEMBLE",
           "IDENTITY_ENSEMBLE", "InProcessModel", "run_load", "infer", "predict", "Prediction", "make_inputs",
           "hps_stats", "LoadResult", "client_for", "sweep"]


def __getattr__(name):
    # The client side imports tritonclient / onnxruntime only when used.
    if name in ("run_load", "infer", "predict", "Prediction", "make_inputs", "hps_stats", "LoadResult",
                "client_for", "sweep"):
        from . import client
        return getattr(client, name)
    if name == "InProcessModel":
        from .reference import InProcessModel
        return InProcessModel
    raise AttributeError(f"module 'embedlab.serving' has no attribute {name!r}")

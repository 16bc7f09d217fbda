"""`solver_parser_helper` and the `SolverConfig` it returns: HugeCTR v2.3's solver arguments
(they replace the JSON's `solver` clause)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["SolverConfig", "solver_parser_helper"]


@dataclass
class SolverConfig:
    """What `solver_parser_helper` returns (HugeCTR's `SolverParser`)."""
    seed: int = 0
    batchsize_eval: int = 16384
    batchsize: int = 16384
    model_file: str = ""
    embedding_files: list = field(default_factory=list)
    vvgpu: list = field(default_factory=lambda: [[0]])
    use_mixed_precision: bool = False
    scaler: float = 1.0
    i64_input_key: bool = False
    use_algorithm_search: bool = True
    use_cuda_graph: bool = True
    repeat_dataset: bool = False
    max_eval_batches: int | None = None


def solver_parser_helper(seed=0, batchsize_eval=16384, batchsize=16384, model_file="", embedding_files=(),
                         vvgpu=((0,),), use_mixed_precision=False, scaler=1.0, i64_input_key=False,
                         use_algorithm_search=True, use_cuda_graph=True, repeat_dataset=False,
                         max_eval_batches=None) -> SolverConfig:
    """The solver configuration (replaces the JSON's `solver` clause), HugeCTR v2.3's arguments.

    Args:
        seed: initializes the dense weights, the embedding rows (per key) and dropout.
        batchsize_eval, batchsize: samples per evaluation / training batch.
        model_file: a dense model file to start from ('' = fresh weights).
        embedding_files: one sparse model folder per embedding to start from ([] = fresh).
        vvgpu: the devices. Without GPUs (what TensorFlow sees), one device: `[[0]]`. With GPUs,
            one GPU id; the Session trains on one device.
        use_mixed_precision, scaler: float16 dense compute with this loss scale.
        i64_input_key: the data files hold int64 keys (else uint32).
        use_algorithm_search, use_cuda_graph: cuBLAS algorithm search and CUDA graphs in HugeCTR;
            accepted and reported by `Session.summary()`, they change nothing here.
        repeat_dataset: False: `train()` returns False at the end of the file list.
        max_eval_batches: batches per `evaluation()` (None: the JSON solver's `eval_batches`,
            else the whole evaluation list).

    Example:
        >>> cfg = solver_parser_helper(batchsize=512, batchsize_eval=512)
        >>> cfg.batchsize, cfg.repeat_dataset
        (512, False)
    """
    def _int(name, v, lo=1):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"solver_parser_helper: {name} must be an integer >= {lo}, got {v!r}")
        return int(v)

    vv = [list(x) for x in vvgpu]
    if not vv or not all(vv) or not all(isinstance(g, (int, np.integer)) and g >= 0 for x in vv for g in x):
        raise ValueError(f"solver_parser_helper: vvgpu must be a list of device-id lists like [[0]], got {vvgpu!r}")
    if not isinstance(scaler, (int, float)) or scaler <= 0:
        raise ValueError(f"solver_parser_helper: scaler must be > 0, got {scaler!r}")
    emb = list(embedding_files)
    if not all(isinstance(e, (str, Path)) for e in emb):
        raise ValueError(f"solver_parser_helper: embedding_files must be a list of paths, got {embedding_files!r}")
    return SolverConfig(seed=_int("seed", seed, 0), batchsize_eval=_int("batchsize_eval", batchsize_eval),
                        batchsize=_int("batchsize", batchsize), model_file=str(model_file or ""),
                        embedding_files=[str(e) for e in emb], vvgpu=vv,
                        use_mixed_precision=bool(use_mixed_precision), scaler=float(scaler),
                        i64_input_key=bool(i64_input_key), use_algorithm_search=bool(use_algorithm_search),
                        use_cuda_graph=bool(use_cuda_graph), repeat_dataset=bool(repeat_dataset),
                        max_eval_batches=None if max_eval_batches is None else _int("max_eval_batches",
                                                                                   max_eval_batches))

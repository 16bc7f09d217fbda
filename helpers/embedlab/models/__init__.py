"""Recommender models built on EmbedLab's embedding layers.

- `DeepFM`: DeepFM (Guo et al., 2017) over Criteo-style inputs, with the HugeCTR-plugin
  `EmbeddingLayer` or with native `keras.layers.Embedding`.
- `FusedEmbedding`: one table per categorical column, all looked up by one EmbedLab op.
- `criteo_inputs` / `load_criteo_parquet`: preprocessed Criteo columns -> the model's inputs.

`train_steps`, `sparse_update_step` and `sparse_update_ms` (notebook 01's timing helpers) are
`embedlab.tutorials.training`'s, also reachable here.
"""
from .deepfm import DeepFM, NativeSlotEmbedding, criteo_inputs, load_criteo_parquet
from .embeddings import FusedEmbedding

__all__ = ["DeepFM", "FusedEmbedding", "NativeSlotEmbedding", "criteo_inputs", "load_criteo_parquet",
           "sparse_update_ms", "sparse_update_step", "train_steps"]


def __getattr__(name):
    # Loaded on first use, so that importing the models does not import the tutorials.
    if name in ("sparse_update_ms", "sparse_update_step", "train_steps", "training"):
        from ..tutorials import training
        return training if name == "training" else getattr(training, name)
    raise AttributeError(f"module 'embedlab.models' has no attribute {name!r}")

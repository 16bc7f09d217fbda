"""Recommender models built on EmbedLab's embedding layers.

- `DeepFM`: DeepFM (Guo et al., 2017) over Criteo-style inputs, with the HugeCTR-plugin
  `EmbeddingLayer` or with native `keras.layers.Embedding`.
- `criteo_inputs` / `load_criteo_parquet`: preprocessed Criteo columns -> the model's inputs.
- `train_steps`: a timed step-by-step training loop (per-batch losses, examples/s).
"""
from .deepfm import DeepFM, NativeSlotEmbedding, criteo_inputs, load_criteo_parquet
from .training import train_steps

__all__ = ["DeepFM", "NativeSlotEmbedding", "criteo_inputs", "load_criteo_parquet", "train_steps"]

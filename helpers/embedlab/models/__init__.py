"""Recommender models built on EmbedLab's embedding layers.

- `DeepFM`: DeepFM (Guo et al., 2017) over Criteo-style inputs, with the HugeCTR-plugin
  `EmbeddingLayer` or with native `keras.layers.Embedding`.
- `criteo_inputs` / `load_criteo_parquet`: preprocessed Criteo columns -> the model's inputs.
"""
from .deepfm import DeepFM, NativeSlotEmbedding, criteo_inputs, load_criteo_parquet

__all__ = ["DeepFM", "NativeSlotEmbedding", "criteo_inputs", "load_criteo_parquet"]

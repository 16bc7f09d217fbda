"""Recommender models built on EmbedLab's embedding layers.

- `DeepFM`: DeepFM (Guo et al., 2017) over Criteo-style inputs, with the HugeCTR-plugin
  `EmbeddingLayer` or with native `keras.layers.Embedding`.
- `FusedEmbedding`: one table per categorical column, all looked up by one EmbedLab op.
- `criteo_inputs` / `load_criteo_parquet`: preprocessed Criteo columns -> the model's inputs.
"""
from .deepfm import DeepFM, NativeSlotEmbedding, criteo_inputs, load_criteo_parquet
from .embeddings import FusedEmbedding

__all__ = ["DeepFM", "FusedEmbedding", "NativeSlotEmbedding", "criteo_inputs", "load_criteo_parquet"]

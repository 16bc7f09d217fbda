"""HugeCTR v2.3's Python training interface on EmbedLab: `Session`, `solver_parser_helper`.

A script written for HugeCTR's Python interface runs with one changed import line:

    from embedlab.session import Session, solver_parser_helper

- `solver_parser_helper(...)`: the solver configuration (HugeCTR's arguments).
- `Session(solver_config, config_file, use_model_oversubscriber=False, temp_embedding_dir="")`:
  a HugeCTR JSON model (Wide & Deep, DeepFM, DCN, the Criteo MLP ...) on EmbedLab's compiled
  embedding kernels; `train()`, `evaluation()`, `get_current_loss()`, `set_learning_rate()`,
  `get_data_reader_train()/eval().set_file_list_source(...)`,
  `get_model_oversubscriber().update(keyset)`, `download_params_to_files(prefix, iteration)`,
  `summary()`.
- `parse_model(path)`: the JSON parser alone (errors name the layer and the field).
"""
from .spec import ModelError, ModelSpec, parse_model, LAYER_TYPES
from .reader import DataReader, FormatError
from .embedding import KeyError_ as EmbeddingKeyError
from .model_files import DenseModelError
from .session import ModelOversubscriber, Session, SolverConfig, auc, solver_parser_helper

__all__ = ["Session", "solver_parser_helper", "SolverConfig", "ModelOversubscriber", "DataReader",
           "parse_model", "ModelSpec", "ModelError", "FormatError", "EmbeddingKeyError",
           "DenseModelError", "LAYER_TYPES", "auc"]

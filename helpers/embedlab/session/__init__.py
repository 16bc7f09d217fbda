"""HugeCTR v2.3's Python training interface on EmbedLab: `Session`, `solver_parser_helper`,
`get_learning_rate_scheduler`.

A script written for HugeCTR's Python interface runs with one changed import line:

    from embedlab.session import Session, solver_parser_helper, get_learning_rate_scheduler

- `solver_parser_helper(...)`: the solver configuration (HugeCTR's arguments).
- `Session(solver_config, config_file, use_model_oversubscriber=False, temp_embedding_dir="")`:
  a HugeCTR JSON model (Wide & Deep, DeepFM, DCN, the Criteo MLP ...) on EmbedLab's compiled
  embedding kernels; `train()`, `evaluation()`, `get_current_loss()`, `set_learning_rate()`,
  `get_data_reader_train()/eval().set_file_list_source(...)`,
  `get_model_oversubscriber().update(keyset)`, `download_params_to_files(prefix, iteration)`,
  `summary()`.
- `get_learning_rate_scheduler(json_file)` / `LearningRateScheduler(base_lr, warmup_steps=1,
  decay_start=0, decay_steps=1, decay_power=2.0, end_lr=0.0)`: the warm-up / polynomial-decay
  schedule of the JSON's optimizer clause; `get_next()` each iteration, fed to
  `Session.set_learning_rate`.
- `parse_model(path)`: the JSON parser alone (errors name the layer and the field).

What of v2.3's `hugectr` module is not here, and why: the README's `embedlab.session` entry.
"""
from .spec import ModelError, ModelSpec, parse_model, LAYER_TYPES
from .reader import DataReader, FormatError
from .embedding import KeyError_ as EmbeddingKeyError
from .model_files import DenseModelError
from .oversubscription import ModelOversubscriber
from .session import Session, auc
from .solver import SolverConfig, solver_parser_helper
from .lr_scheduler import LearningRateScheduler, get_learning_rate_scheduler

__all__ = ["Session", "solver_parser_helper", "get_learning_rate_scheduler", "LearningRateScheduler",
           "SolverConfig", "ModelOversubscriber", "DataReader", "parse_model", "ModelSpec", "ModelError", "FormatError", "EmbeddingKeyError",
           "DenseModelError", "LAYER_TYPES", "auc"]

"""The package as a user meets it: `dir(embedlab)`, and where data goes (an installed package).

The data-folder tests run a fresh interpreter on the INSTALLED package (`make setup` installs
helpers/ non-editable into .venv), with the working directory inside a throw-away checkout and
outside any checkout, so a DATA_DIR derived from the package's own location would fail them.
"""
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import embedlab

_PRINT_DATA_DIR = "import embedlab.config as c; print(c.DATA_DIR)"


def _python(code, cwd, env_extra=None, unset=("EMBEDLAB_DATA_DIR",)):
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.pop("PYTHONPATH", None)  # the installed package, not a source tree
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def _fake_checkout(root: Path) -> Path:
    (root / "helpers").mkdir(parents=True)
    (root / "helpers" / "pyproject.toml").write_text("[project]\nname = 'embedlab'\n")
    (root / "notebooks").mkdir()
    return root


def test_dir_lists_only_modules_that_import():
    names = [n for n in dir(embedlab) if not n.startswith("_")]
    for expected in ("config", "ops", "optimizers", "plugin", "data", "models", "tables", "build_info", "cuda_built",
                     "core", "tf_ops", "cpu_isa", "prefetch_level"):
        assert expected in names
    pkg_dir = Path(embedlab.__file__).parent
    for name in names:
        if name in ("core", "tf_ops", "build_info", "cuda_built", "cpu_isa", "prefetch_level", "NativeLibraryError",
                    "import_tensorflow", "SparseInput"):
            continue
        assert (pkg_dir / f"{name}.py").is_file() or (pkg_dir / name / "__init__.py").is_file(), name
        assert importlib.import_module(f"embedlab.{name}") is getattr(embedlab, name)
    with pytest.raises(AttributeError, match="no attribute 'sok_missing'"):
        embedlab.sok_missing  # noqa: B018
    print(f"dir(embedlab) lists {len(names)} public names, each importable")


def test_installed_package_puts_data_in_the_checkout_of_the_cwd(tmp_path):
    root = _fake_checkout(tmp_path / "project")
    nb_dir = root / "notebooks"
    r = _python(_PRINT_DATA_DIR, cwd=nb_dir)  # nbval / nbconvert run a notebook in its own folder
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == (root / "data" / "cache").resolve()
    r = _python(_PRINT_DATA_DIR, cwd=root)
    assert Path(r.stdout.strip()) == (root / "data" / "cache").resolve()
    # never inside the environment the package is installed in
    where = _python("import embedlab; print(embedlab.__file__)", cwd=root).stdout.strip()
    assert not Path(r.stdout.strip()).is_relative_to(Path(where).parents[1])


def test_env_var_wins(tmp_path):
    root = _fake_checkout(tmp_path / "project")
    r = _python(_PRINT_DATA_DIR, cwd=root, env_extra={"EMBEDLAB_DATA_DIR": str(tmp_path / "elsewhere")})
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == (tmp_path / "elsewhere").resolve()


def test_outside_a_checkout_asks_for_the_env_var(tmp_path):
    outside = tmp_path / "not_a_checkout"
    outside.mkdir()
    r = _python("import embedlab.config, embedlab.data; print('imports fine')", cwd=outside)
    assert r.returncode == 0 and "imports fine" in r.stdout, r.stderr  # importing never needs it
    r = _python(_PRINT_DATA_DIR, cwd=outside)
    assert r.returncode != 0
    assert "DataDirError" in r.stderr and "set EMBEDLAB_DATA_DIR" in r.stderr, r.stderr


def test_this_checkout_data_dir_is_data_cache():
    from embedlab import config
    root = config.find_checkout(Path(__file__).parent)
    assert root is not None and (root / "helpers" / "tests").is_dir()
    if not os.environ.get("EMBEDLAB_DATA_DIR") and config.find_checkout() == root:
        assert config.DATA_DIR == root / "data" / "cache"
    assert not config.DATA_DIR.is_relative_to(Path(sys.prefix).resolve())


def test_import_tensorflow_drops_the_banner_and_keeps_other_stderr(tmp_path):
    """The C++ start-up banner goes, other stderr lines stay, and Python INFO logs are off."""
    plain = _python("import tensorflow", cwd=tmp_path, unset=("EMBEDLAB_DATA_DIR",))
    if "oneDNN custom operations" not in plain.stderr and "absl::InitializeLog" not in plain.stderr:
        pytest.skip("this TensorFlow prints no start-up banner, so there is nothing to filter")
    code = ("import os, sys\n"
            "os.environ.pop('TF_CPP_MIN_LOG_LEVEL', None)\n"
            "os.write(2, b'before the import\\n')\n"
            "import embedlab\n"
            "tf = embedlab.import_tensorflow()\n"
            "assert os.environ['TF_CPP_MIN_LOG_LEVEL'] == '2'\n"
            "tf.get_logger().info('an INFO line that must not show')\n"
            "os.write(2, b'after the import\\n')\n"
            "print(tf.__version__)\n")
    r = _python(code, cwd=tmp_path, unset=("EMBEDLAB_DATA_DIR", "TF_CPP_MIN_LOG_LEVEL"))
    assert r.returncode == 0, r.stderr
    assert "before the import" in r.stderr and "after the import" in r.stderr
    for banner in ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard", "INFO line"):
        assert banner not in r.stderr, r.stderr


def test_progress_bar_needs_no_ipywidgets(monkeypatch):
    import importlib.util
    import warnings

    import tqdm as tqdm_pkg

    from embedlab.data import _progress
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # tqdm.auto's IProgress warning would raise here
        bar = _progress.tqdm(total=3, disable=True)
    assert type(bar) is tqdm_pkg.std.tqdm


def test_interleaved_ms_times_every_case_in_turn():
    from embedlab import timing
    calls = []
    t = timing.interleaved_ms({"slow": lambda: (calls.append("s"), sum(range(200_000)))[1],
                               "fast": lambda: calls.append("f")}, repeats=4, warmup=1)
    assert calls == ["s", "f"] * 5                  # one of each per round, warm-up included
    assert list(t) == ["slow", "fast"] and t["slow"] > t["fast"] >= 0
    with pytest.raises(ValueError, match="repeats"):
        timing.interleaved_ms({"a": lambda: None}, repeats=0)


def test_tutorials_are_a_leaf_imported_by_their_own_paths():
    """The notebooks' helpers live in embedlab.tutorials and import by those paths only; no
    product package imports them, and the redis-server launcher is a service helper."""
    r = subprocess.run([sys.executable, "-c", "import sys, embedlab.models, embedlab.session, embedlab.sok, "
                        "embedlab.hps, embedlab.hps.export, embedlab.serving.reference, embedlab.services; "
                        "print(sorted(m for m in sys.modules if m.startswith('embedlab.tutorials')))"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)
    from embedlab import tutorials
    from embedlab.tutorials import hps_demo, naive_dnn, session_lab, sok_demo, sok_guide, training
    assert tutorials.training is training and callable(training.train_steps) and callable(session_lab.train_passes)
    for m in (training, session_lab, hps_demo, sok_demo, sok_guide, naive_dnn):
        assert m.__spec__.name == m.__name__ and m.__name__.startswith("embedlab.tutorials."), m
    for old in ("embedlab.models.training", "embedlab.session.lab", "embedlab.sok.demo", "embedlab.sok.demo_guide",
                "embedlab.hps.demo", "embedlab.hps.redis"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    import embedlab.models
    from embedlab.hps import export
    for name in ("train_steps", "sparse_update_step", "sparse_update_ms", "training"):
        assert not hasattr(embedlab.models, name), name
    for name in ("DemoArgs", "demo_args", "ClickModel", "train_naive_dnn", "export_for_serving", "MODEL_NAME"):
        assert not hasattr(export, name), name
    from embedlab import services
    from embedlab.services import redis_server
    assert services.hps_redis is redis_server.hps_redis and services.start_redis is redis_server.start_redis
    r = subprocess.run([sys.executable, "-m", "embedlab.tutorials.sok_demo", "--help"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "--global-batch" in r.stdout, r.stderr


def test_data_public_names_keep_their_old_paths():
    """embedlab.data.criteo and .formats are packages now; every public name of the former
    modules still import."""
    import embedlab._io
    from embedlab.data import ParquetLoader, criteo, formats, resident_set  # noqa: F401
    from embedlab.data.criteo import etl_dask
    for name in ["NUM_INT", "NUM_CAT", "NUM_FIELDS", "LABEL", "INT_COLUMNS", "CAT_COLUMNS",
                 "CROSSES", "MISSING_HEX", "KAGGLE_SPLIT", "SPLIT_NAMES", "KAGGLE_CARDINALITIES",
                 "generate", "Block", "CriteoFormatError", "read_chunks", "count_lines",
                 "split_counts", "split", "PreprocessResult", "preprocess", "load_slot_sizes"]:
        assert getattr(criteo, name) is not None, name
    for name in ["preprocess", "local_client", "resolve_client", "worker_peak_rss",
                 "output_digest", "ChunkFailedError", "SCHEDULER_ENV"]:
        assert getattr(etl_dask, name) is not None, name
    for name in formats.__all__:
        assert getattr(formats, name) is not None, name
    assert formats.FormatError is embedlab._io.FormatError
    assert formats.read_file_list is embedlab._io.read_file_list
    from embedlab.data.formats import NormData, read_header, read_norm  # noqa: F401
    assert criteo.generate.__module__ == "embedlab.data.criteo.synth"
    assert formats.read_norm.__module__ == "embedlab.data.formats.norm"


def test_plugin_and_io_public_names_keep_their_old_paths():
    """embedlab.plugin is a package (placement, layer, checkpoint): its public names import from
    embedlab.plugin as before, a layer config saved under the old module path deserializes, and
    the file-list reader of data.formats and session.reader is the one in embedlab._io."""
    import keras

    import embedlab._io
    import embedlab.plugin as plugin
    import embedlab.session.reader
    from embedlab.plugin import (CheckpointError, EmbeddingLayer, PluginConfig, current,  # noqa: F401
                                 init, initial_values, split_cpu)
    from embedlab.plugin import checkpoint, layer, placement
    assert set(plugin.__all__) == {"init", "split_cpu", "current", "EmbeddingLayer", "PluginConfig",
                                   "initial_values", "CheckpointError"}
    assert (EmbeddingLayer, initial_values, CheckpointError, init) == (
        layer.EmbeddingLayer, layer.initial_values, checkpoint.CheckpointError, placement.init)
    assert keras.saving.get_registered_object("embedlab>EmbeddingLayer") is EmbeddingLayer
    old = {"module": "embedlab.plugin", "class_name": "EmbeddingLayer", "registered_name": "embedlab>EmbeddingLayer",
           "config": {"name": "e", "vocabulary_size": 4, "embedding_vec_size": 2, "slot_num": 1, "max_nnz": 1,
                      "initializer": 0.5, "devices": ["/CPU:0"]}}
    emb = keras.saving.deserialize_keras_object(old)
    assert type(emb) is EmbeddingLayer and emb.get_table().tolist() == [[0.5, 0.5]] * 4
    assert embedlab.session.reader.read_file_list is embedlab._io.read_file_list


def test_session_public_names_keep_their_old_paths():
    """embedlab.session's layers are a package (one class per layer type) and the step inputs and
    key translation have modules of their own: the names a script may have imported still import
    from where they were."""
    import embedlab.session as session
    from embedlab.session import layers, spec
    from embedlab.session.embedding import Embedding, HostStore, KeyError_, TFOptimizer, init_values  # noqa: F401
    from embedlab.session.optimizer import lr_at  # noqa: F401
    from embedlab.session.layers import DenseModel, forward_layer  # noqa: F401
    from embedlab.session.reader import Batch, DataReader, FormatError, read_file_list, read_norm_block  # noqa: F401
    from embedlab.session.spec import (EMBEDDING_TYPES, LAYER_TYPES, OPTIMIZER_TYPES, UPDATE_TYPES,  # noqa: F401
                                       LayerSpec, ModelError, ModelSpec, T2, T3, parse_model)
    for name in session.__all__:
        assert getattr(session, name) is not None, name
    assert session.parse_model is parse_model and session.ModelError is ModelError
    assert spec.LAYER_TYPES[:4] == ("Data",) + EMBEDDING_TYPES
    assert set(spec.LAYER_TYPES[4:]) == set(layers.LAYERS) and "BinaryCrossEntropyLoss" in layers.LAYERS
    assert DenseModel.__module__ == "embedlab.session.layers.model"
    assert TFOptimizer.__module__ == "embedlab.session.optimizer"


def test_sok_v1_module_paths_resolve_to_the_compat_wing():
    """SOK v1's module paths and the Horovod shim live in `embedlab.sok.compat`; the paths code
    imported them by under `embedlab.sok` (as `ci/hugectr_compat.py` once mapped
    `sparse_operation_kit.*`) import the wing's modules, the same objects, with no second copy."""
    import sys
    import embedlab.sok as sok
    from embedlab.sok import compat
    wing = Path(compat.__file__).parent
    for old in ("core", "embeddings", "optimizers", "saver", "horovod.py", "legacy.py"):
        assert not (Path(sok.__file__).parent / old).exists(), old        # no shim beside the product
    pairs = {"embedlab.sok.core": "embedlab.sok.compat.core",
             "embedlab.sok.core.initialize": "embedlab.sok.compat.core.initialize",
             "embedlab.sok.core.context_scope": "embedlab.sok.compat.core.context_scope",
             "embedlab.sok.embeddings": "embedlab.sok.compat.embeddings",
             "embedlab.sok.embeddings.distributed_embedding": "embedlab.sok.compat.embeddings.distributed_embedding",
             "embedlab.sok.embeddings.all2all_dense_embedding":
                 "embedlab.sok.compat.embeddings.all2all_dense_embedding",
             "embedlab.sok.embeddings.get_embedding_op": "embedlab.sok.compat.embeddings.get_embedding_op",
             "embedlab.sok.embeddings.tf_distributed_embedding":
                 "embedlab.sok.compat.embeddings.tf_distributed_embedding",
             "embedlab.sok.optimizers": "embedlab.sok.compat.optimizers",
             "embedlab.sok.optimizers.utils": "embedlab.sok.compat.optimizers.utils",
             "embedlab.sok.saver": "embedlab.sok.compat.saver",
             "embedlab.sok.saver.Saver": "embedlab.sok.compat.saver.Saver",
             "embedlab.sok.horovod": "embedlab.sok.compat.horovod",
             "embedlab.sok.legacy": "embedlab.sok.compat.v1"}
    for old, new in pairs.items():
        assert compat.target(old) == new, old
        module = importlib.import_module(old)
        assert module is importlib.import_module(new) and module.__name__ == new, old
        assert Path(module.__file__).is_relative_to(wing), old
        assert sys.modules[old] is sys.modules[new], old
    assert compat.target("embedlab.sok.lookup") is None and compat.target("embedlab.sok.coreish") is None
    from embedlab.sok.embeddings.tf_distributed_embedding import TFDistributedEmbedding
    from embedlab.sok.compat.embeddings import tf_distributed_embedding
    assert TFDistributedEmbedding is tf_distributed_embedding.TFDistributedEmbedding
    # SOK's package attributes: sok.embeddings.<module>, sok.core.initialize, sok.saver.Saver.Saver
    assert sok.embeddings.distributed_embedding.DistributedEmbedding is sok.DistributedEmbedding
    assert sok.core.initialize.Init is sok.Init and sok.saver.Saver.Saver is sok.Saver
    assert sok.DistributedEmbedding.__module__ == "embedlab.sok.compat.v1"
    with pytest.raises(AttributeError, match="compiled GPU Adam is not provided"):
        sok.optimizers.Adam  # noqa: B018
    with pytest.raises(ModuleNotFoundError, match="embedlab.sok.embeddings.missing"):
        importlib.import_module("embedlab.sok.embeddings.missing")


def test_core_module_names_keep_their_place():
    """`_embedlab_core` is made of one bindings file per capability (csrc/py, registered through
    registry.h): every capability's names are on the module, the CUDA ones wherever CUDA was built."""
    core = embedlab.core()
    cpu = {"lookup_forward", "lookup_forward_coo", "lookup_backward", "lookup_backward_apply",
           "lookup_backward_apply_many", "sparse_sgd", "sparse_adagrad", "sparse_adam", "coo_to_csr",
           "cpu_isa", "cpu_isas_built", "cuda_built", "EmbeddingCache", "HashMapStore", "HashTable",
           "decode_norm", "route_keys"}
    cuda = {"cuda_device_count", "_set_cuda_forward_variant", "_set_cuda_backward_variant",
            "_cuda_backward_variant", "_cuda_forward_variant", "_gather_rows_cuda",
            "lookup_backward_cuda_workspace_size", "lookup_forward_cuda", "lookup_backward_cuda",
            "lookup_backward_apply_cuda", "lookup_backward_apply_multi_cuda_workspace_size",
            "lookup_backward_apply_multi_cuda", "sparse_sgd_cuda", "sparse_adagrad_cuda", "sparse_adam_cuda",
            "CudaEmbeddingCache", "route_cuda_workspace_size", "route_count_cuda", "route_scatter_cuda"}
    names = {n for n in dir(core) if not n.startswith("__")}
    assert cpu <= names, sorted(cpu - names)
    assert core.cuda_built == embedlab.cuda_built()
    if core.cuda_built:
        assert cuda <= names, sorted(cuda - names)
    else:
        assert not cuda & names, sorted(cuda & names)
    assert core.cpu_isa == embedlab.cpu_isa()

"""Writes Triton model repositories: the HPS + ONNX ensemble, and an identity ensemble.

The served model is a folder that `embedlab.hps.export.export_model` writes (notebook 05 writes one):
a folder with a `serving.json` manifest naming the HPS JSON, the sparse model, the ONNX dense
model and the SavedModels. The repository follows HugeCTR's "HPS + Triton ensemble" sample::

    hps_embedding   python backend: KEYS (INT64), NUMKEYS (INT32) -> OUTPUT0 (FP32 vectors) and
                    DEFAULTED_KEYS (INT32, per sample: keys no tier holds, answered with the
                    default vector), served by embedlab.hps.ParameterServer from the HPS JSON
    dense           python backend: LOOKUP_VECTORS -> DENSE_OUTPUT through onnxruntime
    ensemble        platform "ensemble": EMB_KEY, EMB_N_KEY -> hps_embedding -> LOOKUP_VECTORS
                    -> dense -> DENSE_OUTPUT; hps_embedding's DEFAULTED_KEYS is an output too

All three are batched (`max_batch_size`, first dimension = samples), with dynamic batching and
an `instance_group` on the CPU. NUMKEYS carries, per sample, the number of keys in its row of
KEYS (HugeCTR's NUMKEYS is the request's total; one count per sample keeps requests batchable).
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

__all__ = ["ServingManifest", "load_manifest", "verify_manifest_files", "write_model_repository",
           "write_identity_repository", "write_ps_config_variant", "ENSEMBLE", "IDENTITY_ENSEMBLE"]

ENSEMBLE = "ensemble"
IDENTITY_ENSEMBLE = "identity_ensemble"
_BACKENDS = Path(__file__).resolve().parent / "backends"


@dataclass(frozen=True)
class ServingManifest:
    """The `serving.json` that notebook 05's export writes (paths absolute)."""
    model_name: str
    ps_config_file: str
    table_id: int
    emb_vec_size: int
    slot_num: int
    keys_per_sample: int
    onnx_file: str
    onnx_input: str
    onnx_output: str
    dense_savedmodel: str
    inference_savedmodel: str
    path: str = ""          # the manifest file itself (filled in by load_manifest)
    extra: dict = field(default_factory=dict, compare=False, repr=False)   # other fields of serving.json


def verify_manifest_files(manifest: ServingManifest) -> None:
    """Checks every file the manifest records (its ``files``: size and SHA-256, written by
    :func:`embedlab.hps.export.write_manifest`): an export that was interrupted, mixed with
    another or changed afterwards is refused. Files unchanged since this process hashed them are
    not read again.

    Raises:
        embedlab.hps.export.ManifestFileError: (a ValueError) naming the manifest and the file.

    Example (+SKIP: it needs an export):
        >>> verify_manifest_files(load_manifest("hps_triton"))    # doctest: +SKIP
    """
    from embedlab.hps.export import verify_files
    verify_files(Path(manifest.path).parent, manifest.extra, where=manifest.path)


def load_manifest(path) -> ServingManifest:
    """Reads `serving.json` (or the folder holding it) and checks its fields and files: every
    file it records must have the recorded size and SHA-256 (:func:`verify_manifest_files`).

    Raises:
        FileNotFoundError: no manifest there (run notebook 05 first), or a file it names is missing.
        ValueError: a field is missing or has the wrong type, naming the field;
            embedlab.hps.export.ManifestFileError: (a ValueError) a recorded file is missing or
            differs from its record (an interrupted or mixed export), naming the file.

    Example (+SKIP: it needs an export):
        >>> load_manifest("hps_triton").model_name     # doctest: +SKIP
        'naive_dnn'
    """
    path = Path(path)
    if path.is_dir():
        path = path / "serving.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: run notebook 05 (05_hps_training_export.ipynb) first; it trains the "
            "model and exports it for serving (embedlab.hps.export.export_model)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    kw = {}
    for f in fields(ServingManifest):
        if f.name in ("path", "extra"):
            continue
        if f.name not in raw:
            raise ValueError(f"{path}: field {f.name!r} is missing")
        v = raw[f.name]
        want = int if f.type in (int, "int") else str
        if want is int and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"{path}: field {f.name!r} = {v!r} is not a non-negative integer")
        if want is str and not isinstance(v, str):
            raise ValueError(f"{path}: field {f.name!r} = {v!r} is not a string")
        kw[f.name] = v
    m = ServingManifest(**kw, path=str(path.resolve()),
                        extra={k: v for k, v in raw.items() if k not in kw})
    if m.emb_vec_size < 1 or m.keys_per_sample < 1:
        raise ValueError(f"{path}: emb_vec_size and keys_per_sample must be >= 1")
    for name in ("ps_config_file", "onnx_file"):
        p = Path(getattr(m, name))
        if not p.is_file():
            raise FileNotFoundError(f"{path}: {name} {p} does not exist (run notebook 05 again)")
    verify_manifest_files(m)
    return m


def _pbtxt_params(params: dict) -> str:
    return "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: {json.dumps(str(v))} }} }}\n'
        for k, v in params.items())


def _dims(d) -> str:
    return "[ " + ", ".join(str(int(x)) for x in d) + " ]"


def _tensors(kind: str, specs) -> str:
    """The ``input`` / ``output`` block of a config.pbtxt from (name, data_type, dims) triples."""
    return f"{kind} [\n" + ",\n".join(
        f'  {{ name: "{n}" data_type: {t} dims: {_dims(d)} }}' for n, t, d in specs) + "\n]\n"


def _python_model_config(name: str, max_batch_size: int, inputs, outputs, instances: int,
                         max_queue_delay_us: int, params: dict) -> str:
    text = f'name: "{name}"\nbackend: "python"\nmax_batch_size: {int(max_batch_size)}\n'
    text += _tensors("input", inputs) + _tensors("output", outputs)
    text += f"instance_group [ {{ count: {int(instances)} kind: KIND_CPU }} ]\n"
    text += f"dynamic_batching {{ max_queue_delay_microseconds: {int(max_queue_delay_us)} }}\n"
    text += "version_policy: { specific: { versions: 1 } }\n"
    text += _pbtxt_params(params)
    return text


def _ensemble_config(name: str, max_batch_size: int, inputs, outputs, steps) -> str:
    text = f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {int(max_batch_size)}\n'
    text += _tensors("input", inputs) + _tensors("output", outputs)
    text += "ensemble_scheduling {\n  step [\n"
    parts = []
    for model, in_map, out_map in steps:
        s = f'    {{\n      model_name: "{model}"\n      model_version: -1\n'
        for k, v in in_map.items():
            s += f'      input_map {{ key: "{k}" value: "{v}" }}\n'
        for k, v in out_map.items():
            s += f'      output_map {{ key: "{k}" value: "{v}" }}\n'
        parts.append(s + "    }")
    text += ",\n".join(parts) + "\n  ]\n}\n"
    return text


def _write_model(repo: Path, name: str, config: str, backend_file: str | None) -> None:
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(config)
    if backend_file:
        shutil.copyfile(_BACKENDS / backend_file, d / "1" / "model.py")


def _onnx_output_width(onnx_file: str, output: str) -> int:
    import onnx
    try:
        model = onnx.load(onnx_file, load_external_data=False)
    except Exception as e:
        raise ValueError(f"{onnx_file} is not a readable ONNX model: {e}") from None
    for o in model.graph.output:
        if o.name == output:
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in o.type.tensor_type.shape.dim]
            tail = dims[1:]
            if any(d < 1 for d in tail):
                raise ValueError(f"{onnx_file}: output {output!r} has shape {dims}; expected [batch, k] "
                                 "with a known k")
            width = 1
            for d in tail:
                width *= d
            return width
    raise ValueError(f"{onnx_file} has no output {output!r} "
                     f"(it has {[o.name for o in model.graph.output]})")


def write_model_repository(manifest, repository, *, max_batch_size: int = 1024,
                           embedding_instances: int = 1, dense_instances: int = 1,
                           dense_threads: int | None = None, max_queue_delay_us: int = 0,
                           ps_config_file=None) -> Path:
    """Writes the `hps_embedding` + `dense` + `ensemble` repository for an exported model.

    Args:
        manifest: a `ServingManifest`, or the path of `serving.json` / its folder.
        repository: the folder to write (replaced atomically if it exists).
        max_batch_size: the largest batch (samples per request) of every model.
        embedding_instances, dense_instances: `instance_group` counts (CPU).
        dense_threads: onnxruntime `intra_op_num_threads` of each dense instance; default: the
            machine's cores divided among the dense instances.
        max_queue_delay_us: dynamic batching's queue delay (0: batch only what is already waiting,
            which keeps batch-1 latency lowest).
        ps_config_file: serve with this HPS JSON instead of the manifest's (the same tables with
            other tiers, e.g. a Redis volatile DB and a RocksDB persistent DB).

    Returns:
        The repository path. The ensemble is served as `ensemble` with inputs EMB_KEY (INT64
        [batch, keys_per_sample]) and EMB_N_KEY (INT32 [batch, 1]) and outputs DENSE_OUTPUT
        (FP32 [batch, k]) and DEFAULTED_KEYS (INT32 [batch, 1]: per sample, how many of its keys
        no tier of the HPS holds, so that they were answered with the table's default vector).
        A client that asks for DENSE_OUTPUT alone gets it alone.

    Example:
        >>> import numpy as np
        >>> import tensorflow as tf
        >>> from embedlab.hps import export
        >>> dense = tf.keras.Sequential([tf.keras.Input((3 * 16,)), tf.keras.layers.Dense(1)])
        >>> vectors = np.random.default_rng(0).standard_normal((3000, 16)).astype(np.float32)
        >>> _ = export.export_model("hps_triton", dense, np.arange(3000), vectors, model_name="tiny",
        ...                         keys_per_sample=3, max_batch_size=256)   # a dense model + its table
        >>> repo = write_model_repository("hps_triton", "hps_triton/repository")
        >>> sorted(p.name for p in repo.iterdir())
        ['dense', 'ensemble', 'hps_embedding', 'serving.json']
    """
    from embedlab._io import atomic_dir
    m = manifest if isinstance(manifest, ServingManifest) else load_manifest(manifest)
    verify_manifest_files(m)        # again for a manifest loaded earlier: its files may have changed since
    if ps_config_file is not None:
        ps = Path(ps_config_file).resolve()
        if not ps.is_file():
            raise FileNotFoundError(f"ps_config_file {ps} does not exist")
        m = replace(m, ps_config_file=str(ps))
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    if embedding_instances < 1 or dense_instances < 1:
        raise ValueError("embedding_instances and dense_instances must be >= 1")
    if embedding_instances > 1:
        # Each instance is its own process with its own ParameterServer; RocksDB lets one
        # process open a database for writing.
        per = json.loads(Path(m.ps_config_file).read_text()).get("persistent_db", {})
        if per.get("type") == "rocks_db" and not per.get("read_only", False):
            raise ValueError(
                f"embedding_instances={embedding_instances} with the writable RocksDB at {per.get('path')} "
                f"({m.ps_config_file}): each instance opens it and RocksDB allows one writer; use one "
                "instance, or set persistent_db.read_only")
    if dense_threads is None:
        dense_threads = max(1, (os.cpu_count() or 1) // dense_instances)
    out_width = _onnx_output_width(m.onnx_file, m.onnx_output)
    k, dim = m.keys_per_sample, m.emb_vec_size
    repository = Path(repository)
    with atomic_dir(repository) as tmp:
        _write_model(tmp, "hps_embedding", _python_model_config(
            "hps_embedding", max_batch_size,
            [("KEYS", "TYPE_INT64", [k]), ("NUMKEYS", "TYPE_INT32", [1])],
            [("OUTPUT0", "TYPE_FP32", [k, dim]), ("DEFAULTED_KEYS", "TYPE_INT32", [1])],
            embedding_instances, max_queue_delay_us,
            {"ps_config_file": m.ps_config_file, "hps_model_name": m.model_name,
             "table_id": m.table_id, "keys_per_sample": k, "emb_vec_size": dim}), "hps_embedding.py")
        _write_model(tmp, "dense", _python_model_config(
            "dense", max_batch_size,
            [("LOOKUP_VECTORS", "TYPE_FP32", [k, dim])],
            [("DENSE_OUTPUT", "TYPE_FP32", [out_width])], dense_instances, max_queue_delay_us,
            {"onnx_file": m.onnx_file, "onnx_input": m.onnx_input, "onnx_output": m.onnx_output,
             "keys_per_sample": k, "emb_vec_size": dim, "intra_op_num_threads": dense_threads}),
            "dense.py")
        _write_model(tmp, ENSEMBLE, _ensemble_config(
            ENSEMBLE, max_batch_size,
            [("EMB_KEY", "TYPE_INT64", [k]), ("EMB_N_KEY", "TYPE_INT32", [1])],
            [("DENSE_OUTPUT", "TYPE_FP32", [out_width]), ("DEFAULTED_KEYS", "TYPE_INT32", [1])],
            [("hps_embedding", {"KEYS": "EMB_KEY", "NUMKEYS": "EMB_N_KEY"},
              {"OUTPUT0": "LOOKUP_VECTORS", "DEFAULTED_KEYS": "DEFAULTED_KEYS"}),
             ("dense", {"LOOKUP_VECTORS": "LOOKUP_VECTORS"}, {"DENSE_OUTPUT": "DENSE_OUTPUT"})]), None)
        record = {k: v for k, v in asdict(m).items() if k != "extra"}
        (tmp / "serving.json").write_text(json.dumps({**m.extra, **record}, indent=2) + "\n")
    return repository


def write_identity_repository(repository, *, keys_per_sample: int, max_batch_size: int = 1024,
                              instances: int = 1) -> Path:
    """A two-model ensemble of identity python models with the ensemble's input (INT64 keys).

    `identity_ensemble` maps EMB_KEY -> identity_a -> identity_b -> OUTPUT: the cost of Triton's
    HTTP/gRPC front end, the ensemble scheduler and two python-backend hops with no work, the
    ceiling any model served this way is measured against.
    """
    from embedlab._io import atomic_dir
    k = int(keys_per_sample)
    repository = Path(repository)
    with atomic_dir(repository) as tmp:
        for name in ("identity_a", "identity_b"):
            _write_model(tmp, name, _python_model_config(
                name, max_batch_size, [("INPUT0", "TYPE_INT64", [k])], [("OUTPUT0", "TYPE_INT64", [k])],
                instances, 0, {}), "identity.py")
        _write_model(tmp, IDENTITY_ENSEMBLE, _ensemble_config(
            IDENTITY_ENSEMBLE, max_batch_size, [("EMB_KEY", "TYPE_INT64", [k])],
            [("OUTPUT", "TYPE_INT64", [k])],
            [("identity_a", {"INPUT0": "EMB_KEY"}, {"OUTPUT0": "MID"}),
             ("identity_b", {"INPUT0": "MID"}, {"OUTPUT0": "OUTPUT"})]), None)
    return repository


def write_ps_config_variant(manifest, path, *, volatile_db: dict | None = None,
                            persistent_db: dict | None = None, **model_fields) -> Path:
    """Writes a copy of the exported HPS JSON with other tiers or model settings.

    The same tables (the same sparse files) served through, e.g., Redis and RocksDB (the Redis
    is only named here; `embedlab.services.hps_redis()` gives a running one's address and password):

        >>> import numpy as np
        >>> import tensorflow as tf
        >>> from embedlab.hps import export
        >>> dense = tf.keras.Sequential([tf.keras.Input((3 * 16,)), tf.keras.layers.Dense(1)])
        >>> vectors = np.random.default_rng(0).standard_normal((3000, 16)).astype(np.float32)
        >>> _ = export.export_model("hps_triton", dense, np.arange(3000), vectors, model_name="tiny",
        ...                         keys_per_sample=3, max_batch_size=256)   # a dense model + its table
        >>> path = write_ps_config_variant("hps_triton", "hps_redis.json",
        ...     volatile_db={"type": "redis_cluster", "address": "127.0.0.1:6379", "password": "secret"},
        ...     persistent_db={"type": "rocks_db", "path": "rocksdb"}, gpucacheper=0.1)
        >>> cfg = json.loads(path.read_text())
        >>> cfg["volatile_db"]["type"], cfg["persistent_db"]["type"], cfg["models"][0]["gpucacheper"]
        ('redis_cluster', 'rocks_db', 0.1)

    Args:
        manifest: a `ServingManifest` or the path of `serving.json` / its folder.
        path: the JSON file to write (atomically; mode 0600 when a section holds a password).
        volatile_db, persistent_db: replace those sections when given.
        model_fields: fields set on the served model's entry (`gpucacheper`, ...).
    """
    from embedlab._io import atomic_file
    m = manifest if isinstance(manifest, ServingManifest) else load_manifest(manifest)
    cfg = json.loads(Path(m.ps_config_file).read_text())
    if volatile_db is not None:
        cfg["volatile_db"] = dict(volatile_db)
    if persistent_db is not None:
        cfg["persistent_db"] = dict(persistent_db)
    entries = [e for e in cfg.get("models", []) if e.get("model") == m.model_name]
    if not entries:
        raise ValueError(f"{m.ps_config_file} has no model {m.model_name!r}")
    entries[0].update(model_fields)
    path = Path(path)
    secret = any(isinstance(cfg.get(k), dict) and cfg[k].get("password") for k in ("volatile_db", "persistent_db"))
    with atomic_file(path) as tmp:
        # A JSON holding a password is readable by this user only, from its creation on.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(cfg, indent=2) + "\n")
        if secret:
            os.chmod(tmp, 0o600)
    return path.resolve()

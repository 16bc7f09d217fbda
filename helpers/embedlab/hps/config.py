"""HugeCTR's HPS JSON configuration: parsed, checked, and reported.

The file is the one HugeCTR's HPS (TensorFlow plugin, Triton backend) reads::

    {"supportlonglong": true,
     "volatile_db": {"type": "redis_cluster", "address": "127.0.0.1:7000", ...},
     "persistent_db": {"type": "rocks_db", "path": "/tmp/rocksdb", ...},
     "models": [{"model": "demo", "sparse_files": ["/models/demo_sparse.model"],
                 "embedding_table_names": ["sparse_embedding0"],
                 "embedding_vecsize_per_table": [16], ...}]}

Every field HugeCTR documents is recognised. Fields that steer this implementation are checked
(a bad value raises :class:`HPSConfigError` naming the field, e.g. ``models[0].gpucacheper``).
Fields that mean nothing here (GPU worker buffers, CUDA streams, TLS, shared memory, Kafka) and
fields nobody knows are accepted but *reported*: ``HPSConfig.report`` lists them, and
:func:`load_config` logs one warning naming them all.
"""
from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("embedlab.hps")

__all__ = ["HPSConfigError", "HPSConfig", "ModelConfig", "VolatileDBConfig", "PersistentDBConfig",
           "load_config", "VOLATILE_TYPES", "PERSISTENT_TYPES", "OVERFLOW_POLICIES"]

VOLATILE_TYPES = ("disabled", "hash_map", "parallel_hash_map", "redis_cluster")
PERSISTENT_TYPES = ("disabled", "rocks_db")
OVERFLOW_POLICIES = ("evict_random", "evict_least_used", "evict_oldest")
CACHE_TYPES = ("dynamic", "static")


class HPSConfigError(ValueError):
    """The HPS JSON is unreadable or a field has a bad value (the message names the field)."""


# Fields HugeCTR defines that have no effect in this implementation, with the reason.
_NO_EFFECT_TOP = {
    "fuse_embedding_table": "tables are looked up one by one (no fused storage)",
    "update_source": "online updates come through ParameterServer.update, not Kafka",
}
_NO_EFFECT_MODEL = {
    "dense_file": "the dense part is served by TensorFlow / ONNX, not by the HPS",
    "network_file": "the dense part is served by TensorFlow / ONNX, not by the HPS",
    "num_of_worker_buffer_in_pool": "no GPU worker buffer pool (CPU cache)",
    "num_of_refresher_buffer_in_pool": "no GPU refresh buffer pool (CPU cache)",
    "use_context_stream": "no CUDA streams in the CPU lookup path",
    "maxnum_des_feature_per_sample": "dense features are not handled by the HPS",
    "label_dim": "labels are not handled by the HPS",
    "slot_num": "the HPS looks up keys, it does not split slots",
    "refresh_delay": "refresh happens when ParameterServer.refresh is called",
    "refresh_interval": "refresh happens when ParameterServer.refresh is called",
    "thread_pool_size": "the cache sizes its own thread pool",
    "use_mixed_precision": "no dense network in the HPS",
    "scaler": "no dense network in the HPS",
    "use_algorithm_search": "no dense network in the HPS",
    "use_cuda_graph": "no dense network in the HPS",
    "i64_input_key": "use supportlonglong",
    "device_id": "the CPU cache serves every device",
    "use_hctr_cache_implementation": "one cache implementation (csrc/core/embedding_cache.h)",
    "use_static_table": "use embedding_cache_type",
    "fuse_embedding_table": "tables are looked up one by one (no fused storage)",
}
_NO_EFFECT_VOLATILE = {
    "allocation_rate": "memory is allocated by the native hash map as it grows",
    "shared_memory_size": "multi_process_hash_map is not provided",
    "shared_memory_name": "multi_process_hash_map is not provided",
    "shared_memory_auto_remove": "multi_process_hash_map is not provided",
    "enable_tls": "TLS connections are not provided (Redis is reached on 127.0.0.1)",
    "tls_ca_certificate": "TLS connections are not provided",
    "tls_client_certificate": "TLS connections are not provided",
    "tls_client_key": "TLS connections are not provided",
    "tls_server_name_identification": "TLS connections are not provided",
    "update_filters": "no Kafka update source",
    "max_set_batch_size": "inserts are chunked by max_batch_size",
    "refresh_time_after_fetch": "rows are not refreshed on fetch",
}
_NO_EFFECT_PERSISTENT = {
    "update_filters": "no Kafka update source",
    "max_set_batch_size": "inserts are chunked by max_batch_size",
}


@dataclass
class VolatileDBConfig:
    type: str = "parallel_hash_map"
    address: str = "127.0.0.1:7000"
    user_name: str = "default"
    password: str = ""
    num_partitions: int = field(default_factory=lambda: max(1, min(os.cpu_count() or 1, 16)))
    max_batch_size: int = 65536
    overflow_margin: int = 0          # 0 = unlimited (HugeCTR: max size_t)
    overflow_policy: str = "evict_random"
    overflow_resolution_target: float = 0.8
    initialize_after_startup: bool = True
    initial_cache_rate: float = 1.0
    cache_missed_embeddings: bool = False

    @property
    def addresses(self) -> list[tuple[str, int]]:
        out = []
        for part in self.address.split(","):
            host, _, port = part.strip().rpartition(":")
            out.append((host, int(port)))
        return out


@dataclass
class PersistentDBConfig:
    type: str = "disabled"
    path: str = "/tmp/rocksdb"
    read_only: bool = False
    max_batch_size: int = 65536
    num_threads: int = 16             # HugeCTR's default; used as min(num_threads, cores)
    initialize_after_startup: bool = True


@dataclass
class ModelConfig:
    model: str
    sparse_files: list[str]
    embedding_table_names: list[str]
    embedding_vecsize_per_table: list[int]
    maxnum_catfeature_query_per_table_per_sample: list[int]
    default_value_for_each_table: list[float]
    deployed_device_list: list[int] = field(default_factory=lambda: [0])
    max_batch_size: int = 1024
    gpucache: bool = True
    gpucacheper: float = 0.2
    hit_rate_threshold: float = 0.9
    embedding_cache_type: str = "dynamic"
    cache_refresh_percentage_per_iteration: float = 0.0

    @property
    def num_tables(self) -> int:
        return len(self.sparse_files)


@dataclass
class HPSConfig:
    """A parsed HPS JSON (see :func:`load_config`)."""
    models: list[ModelConfig]
    volatile_db: VolatileDBConfig
    persistent_db: PersistentDBConfig
    supportlonglong: bool = True
    source: str = "<dict>"
    report: list[str] = field(default_factory=list)   # fields accepted with no effect, and unknown fields

    def model(self, name: str) -> ModelConfig:
        for m in self.models:
            if m.model == name:
                return m
        raise KeyError(f"HPS: unknown model {name!r}; the config ({self.source}) has "
                       f"{[m.model for m in self.models]}")


# ---- field checking ------------------------------------------------------------------------

def _err(where: str, msg: str) -> HPSConfigError:
    return HPSConfigError(f"HPS config: {where} {msg}")


def _bool(where, v):
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    raise _err(where, f"must be true or false, got {v!r}")


def _int(where, v, lo=None):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise _err(where, f"must be an integer, got {v!r}")
    v = int(v)
    if lo is not None and v < lo:
        raise _err(where, f"must be >= {lo}, got {v}")
    return v


def _float(where, v, lo=None, hi=None, lo_open=False):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _err(where, f"must be a finite number, got {v!r}")
    v = float(v)
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise _err(where, f"must be {'>' if lo_open else '>='} {lo}, got {v}")
    if hi is not None and v > hi:
        raise _err(where, f"must be <= {hi}, got {v}")
    return v


def _str(where, v, choices=None):
    if not isinstance(v, str):
        raise _err(where, f"must be a string, got {v!r}")
    if choices is not None and v not in choices:
        raise _err(where, f"must be one of {list(choices)}, got {v!r}")
    return v


def _list(where, v, item, n=None):
    if not isinstance(v, list):
        raise _err(where, f"must be a list, got {v!r}")
    if n is not None and len(v) != n:
        raise _err(where, f"has {len(v)} entries but the model has {n} tables (sparse_files)")
    return [item(f"{where}[{i}]", x) for i, x in enumerate(v)]


def _report_extra(where: str, d: dict, known: set, no_effect: dict, report: list) -> None:
    for k in d:
        if k in no_effect:
            report.append(f"{where}{k}: no effect here ({no_effect[k]})")
        elif k not in known:
            report.append(f"{where}{k}: unknown field, ignored")


def _parse_volatile(d, base: Path, report) -> VolatileDBConfig:
    where = "volatile_db."
    if not isinstance(d, dict):
        raise _err("volatile_db", f"must be an object, got {d!r}")
    c = VolatileDBConfig()
    known = {"type", "address", "user_name", "password", "num_partitions", "max_batch_size",
             "max_get_batch_size", "overflow_margin", "overflow_policy", "overflow_resolution_target",
             "initialize_after_startup", "initial_cache_rate", "cache_missed_embeddings"}
    if "type" in d:
        t = _str(where + "type", d["type"])
        if t == "multi_process_hash_map":
            raise _err(where + "type", "'multi_process_hash_map' is not provided here; use 'hash_map', "
                       "'parallel_hash_map' or 'redis_cluster'")
        c.type = _str(where + "type", t, VOLATILE_TYPES)
    if "address" in d:
        c.address = _str(where + "address", d["address"])
        try:
            addrs = c.addresses
        except ValueError:
            addrs = []
        if not addrs or any(not h or not (0 < p < 65536) for h, p in addrs):
            raise _err(where + "address", f"must be 'host:port[,host:port...]', got {c.address!r}")
    if "user_name" in d:
        c.user_name = _str(where + "user_name", d["user_name"])
    if "password" in d:
        c.password = _str(where + "password", d["password"])
    if "num_partitions" in d:
        c.num_partitions = _int(where + "num_partitions", d["num_partitions"], 1)
    for k in ("max_batch_size", "max_get_batch_size"):  # max_get_batch_size: HugeCTR before 23.x
        if k in d:
            c.max_batch_size = _int(where + k, d[k], 1)
    if "overflow_margin" in d:
        c.overflow_margin = _int(where + "overflow_margin", d["overflow_margin"], 0)
        if c.overflow_margin >= 2 ** 62:   # HugeCTR writes max size_t for "unlimited"
            c.overflow_margin = 0
    if "overflow_policy" in d:
        c.overflow_policy = _str(where + "overflow_policy", d["overflow_policy"], OVERFLOW_POLICIES)
    if "overflow_resolution_target" in d:
        c.overflow_resolution_target = _float(where + "overflow_resolution_target",
                                              d["overflow_resolution_target"], 0.0, 1.0, lo_open=True)
    for k in ("initialize_after_startup", "cache_missed_embeddings"):
        if k in d:
            setattr(c, k, _bool(where + k, d[k]))
    if "initial_cache_rate" in d:
        c.initial_cache_rate = _float(where + "initial_cache_rate", d["initial_cache_rate"], 0.0, 1.0)
    _report_extra(where, d, known, _NO_EFFECT_VOLATILE, report)
    return c


def _parse_persistent(d, base: Path, report) -> PersistentDBConfig:
    where = "persistent_db."
    if not isinstance(d, dict):
        raise _err("persistent_db", f"must be an object, got {d!r}")
    c = PersistentDBConfig()
    known = {"type", "path", "read_only", "max_batch_size", "max_get_batch_size", "num_threads",
             "initialize_after_startup"}
    if "type" in d:
        c.type = _str(where + "type", d["type"], PERSISTENT_TYPES)
    if "path" in d:
        c.path = _str(where + "path", d["path"])
        if not c.path:
            raise _err(where + "path", "must not be empty")
    if "read_only" in d:
        c.read_only = _bool(where + "read_only", d["read_only"])
    if "initialize_after_startup" in d:
        c.initialize_after_startup = _bool(where + "initialize_after_startup", d["initialize_after_startup"])
    for k in ("max_batch_size", "max_get_batch_size"):
        if k in d:
            c.max_batch_size = _int(where + k, d[k], 1)
    if "num_threads" in d:
        c.num_threads = _int(where + "num_threads", d["num_threads"], 1)
    _report_extra(where, d, known, _NO_EFFECT_PERSISTENT, report)
    return c


def _resolve(path: str, base: Path) -> str:
    p = Path(path).expanduser()
    if p.is_absolute():
        return str(p)
    # Relative paths: the current folder first (HugeCTR's behaviour), then the JSON's folder.
    if p.exists() or base is None:
        return str(p.resolve())
    return str((base / p).resolve())


def _parse_model(i: int, d, base: Path, report) -> ModelConfig:
    where = f"models[{i}]."
    if not isinstance(d, dict):
        raise _err(f"models[{i}]", f"must be an object, got {d!r}")
    for k in ("model", "sparse_files", "embedding_vecsize_per_table"):
        if k not in d:
            raise _err(where + k, "is required")
    name = _str(where + "model", d["model"])
    if not name:
        raise _err(where + "model", "must not be empty")
    files = _list(where + "sparse_files", d["sparse_files"], _str)
    if not files:
        raise _err(where + "sparse_files", "must name at least one table")
    n = len(files)
    files = [_resolve(f, base) for f in files]
    dims = _list(where + "embedding_vecsize_per_table", d["embedding_vecsize_per_table"],
                 lambda w, v: _int(w, v, 1), n)
    names = (_list(where + "embedding_table_names", d["embedding_table_names"], _str, n)
             if "embedding_table_names" in d else [f"sparse_embedding{t}" for t in range(n)])
    if len(set(names)) != n:
        raise _err(where + "embedding_table_names", f"must be distinct, got {names}")
    maxq = (_list(where + "maxnum_catfeature_query_per_table_per_sample",
                  d["maxnum_catfeature_query_per_table_per_sample"], lambda w, v: _int(w, v, 1), n)
            if "maxnum_catfeature_query_per_table_per_sample" in d else [1] * n)
    defaults = (_list(where + "default_value_for_each_table", d["default_value_for_each_table"], _float, n)
                if "default_value_for_each_table" in d else [0.0] * n)
    m = ModelConfig(model=name, sparse_files=files, embedding_table_names=names,
                    embedding_vecsize_per_table=dims, maxnum_catfeature_query_per_table_per_sample=maxq,
                    default_value_for_each_table=defaults)
    if "deployed_device_list" in d:
        m.deployed_device_list = _list(where + "deployed_device_list", d["deployed_device_list"],
                                       lambda w, v: _int(w, v, 0))
        if not m.deployed_device_list:
            raise _err(where + "deployed_device_list", "must name at least one device")
    if "max_batch_size" in d:
        m.max_batch_size = _int(where + "max_batch_size", d["max_batch_size"], 1)
    if "gpucache" in d:
        m.gpucache = _bool(where + "gpucache", d["gpucache"])
    if "gpucacheper" in d:
        m.gpucacheper = _float(where + "gpucacheper", d["gpucacheper"], 0.0, 1.0)
    if "hit_rate_threshold" in d:
        m.hit_rate_threshold = _float(where + "hit_rate_threshold", d["hit_rate_threshold"], 0.0)
    if "embedding_cache_type" in d:
        t = _str(where + "embedding_cache_type", d["embedding_cache_type"])
        if t == "uvm":
            raise _err(where + "embedding_cache_type", "'uvm' is a GPU-only cache; use 'dynamic' or 'static'")
        m.embedding_cache_type = _str(where + "embedding_cache_type", t, CACHE_TYPES)
    if "cache_refresh_percentage_per_iteration" in d:
        m.cache_refresh_percentage_per_iteration = _float(
            where + "cache_refresh_percentage_per_iteration", d["cache_refresh_percentage_per_iteration"], 0.0, 1.0)
    # Read and checked, but with no effect in this implementation: reported too. (Which tier a
    # model's cache got, on its deployed_device_list or in host memory, the ParameterServer
    # reports: only it knows whether a GPU is there.)
    checked_no_effect = {
        "max_batch_size": "lookups of any size are served (no preallocated GPU buffers)",
        "maxnum_catfeature_query_per_table_per_sample": "lookups of any size are served (no preallocated GPU buffers)",
        "cache_refresh_percentage_per_iteration": "refresh() updates every cached row in one pass",
    }
    for k, why in checked_no_effect.items():
        if k in d:
            report.append(f"{where}{k}: checked, no effect here ({why})")
    known = {"model", "sparse_files", "embedding_table_names", "embedding_vecsize_per_table",
             "maxnum_catfeature_query_per_table_per_sample", "default_value_for_each_table",
             "deployed_device_list", "max_batch_size", "gpucache", "gpucacheper", "hit_rate_threshold",
             "embedding_cache_type", "cache_refresh_percentage_per_iteration"}
    _report_extra(where, d, known, _NO_EFFECT_MODEL, report)
    return m


def parse_config(d: dict, source: str = "<dict>", base: Path | None = None) -> HPSConfig:
    """Checks an HPS config already loaded as a dict (see :func:`load_config`); a field error
    names ``source`` (the file) when it is not ``"<dict>"``."""
    try:
        return _parse_config(d, source, base)
    except HPSConfigError as e:
        msg = str(e)
        if source != "<dict>" and msg.startswith("HPS config: "):
            raise HPSConfigError(f"HPS config {source}: {msg[len('HPS config: '):]}") from e
        raise


def _parse_config(d: dict, source: str, base: Path | None) -> HPSConfig:
    if not isinstance(d, dict):
        raise HPSConfigError(f"HPS config {source}: the top level must be a JSON object, got {type(d).__name__}")
    report: list[str] = []
    supportlonglong = _bool("supportlonglong", d["supportlonglong"]) if "supportlonglong" in d else True
    vol = _parse_volatile(d.get("volatile_db", {}), base, report)
    per = _parse_persistent(d.get("persistent_db", {}), base, report)
    if "models" not in d:
        raise _err("models", "is required")
    models_raw = d["models"]
    if not isinstance(models_raw, list) or not models_raw:
        raise _err("models", f"must be a non-empty list, got {models_raw!r}")
    models = [_parse_model(i, m, base, report) for i, m in enumerate(models_raw)]
    names = [m.model for m in models]
    if len(set(names)) != len(names):
        raise _err("models", f"model names must be distinct, got {names}")
    if per.type == "rocks_db":
        per.path = _resolve(per.path, base) if not Path(per.path).is_absolute() else per.path
    known = {"supportlonglong", "volatile_db", "persistent_db", "models"}
    _report_extra("", d, known, _NO_EFFECT_TOP, report)
    if vol.type == "disabled" and per.type == "disabled":
        # Even a static cache cannot promise to hold every row (a full set refuses more keys).
        raise _err("volatile_db.type", "and persistent_db.type are both 'disabled': the tables would have "
                   "nowhere to be kept in full (enable a volatile or a persistent database)")
    return HPSConfig(models=models, volatile_db=vol, persistent_db=per, supportlonglong=supportlonglong,
                     source=source, report=report)


def load_config(ps_config) -> HPSConfig:
    """Reads and checks an HPS JSON file (or a dict holding the same content, or an HPSConfig).

    Args:
        ps_config: path to the JSON file, a ``dict``, or an :class:`HPSConfig` (returned as is).

    Returns:
        :class:`HPSConfig`; its ``report`` lists fields accepted without effect and unknown
        fields (also logged once as a warning).

    Raises:
        HPSConfigError: unreadable file, a file that is not UTF-8, invalid JSON, or a bad value
            (the message names the file, when one was given, and the field).

    Example:
        >>> c = load_config({"models": [{"model": "m", "sparse_files": ["/x"],
        ...                              "embedding_vecsize_per_table": [8], "slot_num": 3}]})
        >>> c.models[0].gpucacheper, c.report
        (0.2, ['models[0].slot_num: no effect here (the HPS looks up keys, it does not split slots)'])
    """
    if isinstance(ps_config, HPSConfig):
        return ps_config
    if isinstance(ps_config, dict):
        cfg = parse_config(ps_config, "<dict>", None)
    else:
        path = Path(ps_config)
        try:
            text = path.read_bytes().decode("utf-8")
        except OSError as e:
            raise HPSConfigError(f"HPS config {path}: cannot read it ({e.strerror or e})") from e
        except UnicodeDecodeError as e:
            raise HPSConfigError(f"HPS config {path}: not UTF-8 text: byte 0x{e.object[e.start]:02x} at offset "
                                 f"{e.start} ({e.reason}); JSON files are UTF-8") from e
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise HPSConfigError(f"HPS config {path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from e
        cfg = parse_config(d, str(path.resolve()), path.resolve().parent)
    if cfg.report:
        log.warning("HPS config %s: %d field(s) have no effect here or are unknown: %s",
                    cfg.source, len(cfg.report), "; ".join(cfg.report))
    return cfg

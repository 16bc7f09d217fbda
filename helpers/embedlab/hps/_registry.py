"""The process-wide parameter servers, one per HPS JSON file (HugeCTR's ``hps.Init``)."""
from __future__ import annotations

import threading
from pathlib import Path

from .server import ParameterServer

_lock = threading.RLock()
_servers: dict[str, ParameterServer] = {}
_last: list[str] = []


def _key(ps_config_file) -> str:
    if isinstance(ps_config_file, dict):
        raise TypeError("hps.Init: ps_config_file must be the path of the HPS JSON file "
                        "(use ParameterServer(dict) for a config held in memory)")
    return str(Path(ps_config_file).expanduser().resolve())


def _start(global_batch_size: int, ps_config_file) -> ParameterServer:
    """The server for an HPS JSON file, started now if none runs for it (once per file and process)."""
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise ValueError(f"hps.Init: global_batch_size must be a positive int, got {global_batch_size!r}")
    if not ps_config_file:
        raise ValueError("hps.Init: ps_config_file must name the HPS JSON file, got an empty value")
    key = _key(ps_config_file)
    with _lock:
        ps = _servers.get(key)
        if ps is None:
            ps = ParameterServer(key)
            ps.global_batch_size = global_batch_size
            _servers[key] = ps
        if key in _last:
            _last.remove(key)
        _last.append(key)
        return ps


def Init(global_batch_size: int, ps_config_file) -> str:
    """Starts the parameter server for an HPS JSON file (once per file and process).

    HugeCTR's ``hps.Init``: call it once before using the layers, or let a layer with
    ``ps_config_file`` do it on first call (implicit init, how SavedModels initialise).

    Args:
        global_batch_size: the largest batch the layers will look up (checked >= 1).
        ps_config_file: path of the HPS JSON.

    Returns:
        ``"OK"``, as HugeCTR's ``hps.Init`` (failures raise). The server itself is
        ``hps.get_server(ps_config_file)`` (the same object on later calls with the same file).

    Raises:
        HPSConfigError: bad file or field (named); TierError: a tier cannot be set up.

    Example:
        >>> import json, numpy as np
        >>> from embedlab.sparse_model import write_sparse_model
        >>> _ = write_sparse_model("demo.model", np.arange(10), np.arange(20, dtype=np.float32).reshape(10, 2))
        >>> with open("hps.json", "w") as f:
        ...     json.dump({"models": [{"model": "demo", "sparse_files": ["demo.model"],
        ...                             "embedding_vecsize_per_table": [2]}]}, f)
        >>> import embedlab.hps as hps
        >>> hps.Init(global_batch_size=1024, ps_config_file="hps.json")
        'OK'
        >>> hps.get_server("hps.json") is hps.get_server("hps.json")
        True
        >>> hps.shutdown("hps.json")
    """
    _start(global_batch_size, ps_config_file)
    return "OK"


init = Init


def get_server(ps_config_file: str = "", global_batch_size: int | None = None) -> ParameterServer:
    """The server for ``ps_config_file``, started now if needed (when ``global_batch_size`` is given);
    with an empty name, the server most recently initialised."""
    with _lock:
        if not ps_config_file:
            if not _last:
                raise RuntimeError("HPS: no parameter server is initialised; call hps.Init(global_batch_size, "
                                   "ps_config_file) first or give the layer ps_config_file")
            return _servers[_last[-1]]
        key = _key(ps_config_file)
        ps = _servers.get(key)
        if ps is None:
            if global_batch_size is None:
                raise RuntimeError(f"HPS: no parameter server is initialised for {key}")
            ps = _start(max(1, int(global_batch_size)), key)
        return ps


def servers() -> dict[str, ParameterServer]:
    """The running servers by config path."""
    with _lock:
        return dict(_servers)


def shutdown(ps_config_file: str = "") -> None:
    """Closes and forgets one server (by config path) or, with no argument, all of them."""
    with _lock:
        keys = [_key(ps_config_file)] if ps_config_file else list(_servers)
        for k in keys:
            ps = _servers.pop(k, None)
            if ps is not None:
                ps.close()
            if k in _last:
                _last.remove(k)

"""A sparse model whose `key` file holds a key twice is refused by the ParameterServer at start-up,
whatever the tiers (each tier would otherwise keep a different row of the two), naming file and key."""
import numpy as np
import pytest

from embedlab.hps import ParameterServer
from embedlab.sparse_model import SparseModelError

from hps_testing import Table


@pytest.mark.parametrize("stack", ["hash_map", "parallel_hash_map+rocks_db", "static cache+hash_map"])
def test_duplicate_key_in_the_sparse_model_is_refused(tmp_path, stack):
    tab = Table(tmp_path / "t", n=100, dim=8)
    raw = bytearray((tab.path / "key").read_bytes())
    raw[8:16] = raw[0:8]                                   # key[1] overwritten by key[0]
    (tab.path / "key").write_bytes(bytes(raw))
    volatile = {"type": stack.split("+")[-1] if "cache" in stack else stack.split("+")[0]}
    persistent = {"type": "rocks_db", "path": str(tmp_path / "db")} if "rocks_db" in stack else {"type": "disabled"}
    model = {"model": "m", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [8],
             "embedding_table_names": ["t"], "default_value_for_each_table": [0.0],
             "gpucache": "cache" in stack}
    if "static" in stack:
        model["embedding_cache_type"] = "static"
    cfg = {"volatile_db": volatile, "persistent_db": persistent, "models": [model]}
    with pytest.raises(SparseModelError, match=rf"sparse model {tab.path}: key holds key {int(tab.keys[0])} "
                                               r"more than once"):
        ParameterServer(cfg)

"""HugeCTR's HPS JSON: every documented field read, bad values named, meaningless/unknown ones reported."""
import copy
import json
import logging

import pytest

import embedlab.hps as hps
import embedlab.sparse_model as sm
from embedlab.hps.config import HPSConfigError, load_config

# HugeCTR's documented example (hps_database_backend.md), redis + rocksdb, every field.
FULL = {
    "supportlonglong": True,
    "fuse_embedding_table": False,
    "volatile_db": {
        "type": "redis_cluster", "address": "127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005",
        "user_name": "default", "password": "", "num_partitions": 8, "allocation_rate": 268435456,
        "shared_memory_size": 17179869184, "shared_memory_name": "hctr_mp_hash_map_database",
        "shared_memory_auto_remove": True, "max_batch_size": 65536, "enable_tls": False,
        "tls_ca_certificate": "cacertbundle.crt", "tls_client_certificate": "client_cert.pem",
        "tls_client_key": "client_key.pem", "tls_server_name_identification": "redis.localhost",
        "overflow_margin": 10000000, "overflow_policy": "evict_random", "overflow_resolution_target": 0.8,
        "initialize_after_startup": True, "initial_cache_rate": 1.0, "cache_missed_embeddings": False,
        "update_filters": [".+"]},
    "persistent_db": {"type": "rocks_db", "path": "/tmp/rocksdb", "num_threads": 16, "read_only": False,
                      "max_batch_size": 65536, "update_filters": [".+"]},
    "models": [{
        "model": "wdl", "sparse_files": ["/wdl/wdl0_sparse.model", "/wdl/wdl1_sparse.model"],
        "dense_file": "/wdl/wdl_dense.model", "network_file": "/wdl/wdl.json",
        "num_of_worker_buffer_in_pool": 4, "num_of_refresher_buffer_in_pool": 1, "deployed_device_list": [0],
        "max_batch_size": 64, "default_value_for_each_table": [0.0, 0.5], "maxnum_des_feature_per_sample": 26,
        "maxnum_catfeature_query_per_table_per_sample": [2, 26], "embedding_vecsize_per_table": [1, 15],
        "embedding_table_names": ["table1", "table2"], "refresh_delay": 0, "refresh_interval": 0,
        "hit_rate_threshold": 0.9, "gpucacheper": 0.1, "embedding_cache_type": "dynamic", "gpucache": True,
        "cache_refresh_percentage_per_iteration": 0.2, "label_dim": 1, "slot_num": 10, "use_context_stream": False}],
}


def test_full_documented_config_is_read():
    c = load_config(FULL)
    v, p, m = c.volatile_db, c.persistent_db, c.models[0]
    assert v.type == "redis_cluster" and v.addresses == [("127.0.0.1", 7003), ("127.0.0.1", 7004), ("127.0.0.1", 7005)]
    assert (v.num_partitions, v.max_batch_size, v.overflow_margin, v.overflow_policy) == (8, 65536, 10000000, "evict_random")
    assert (v.initial_cache_rate, v.cache_missed_embeddings) == (1.0, False)
    assert (p.type, p.path, p.read_only, p.num_threads) == ("rocks_db", "/tmp/rocksdb", False, 16)
    assert m.model == "wdl" and m.embedding_vecsize_per_table == [1, 15] and m.embedding_table_names == ["table1", "table2"]
    assert m.maxnum_catfeature_query_per_table_per_sample == [2, 26] and m.default_value_for_each_table == [0.0, 0.5]
    assert (m.gpucache, m.gpucacheper, m.hit_rate_threshold, m.embedding_cache_type) == (True, 0.1, 0.9, "dynamic")
    assert m.cache_refresh_percentage_per_iteration == 0.2 and m.max_batch_size == 64 and m.deployed_device_list == [0]
    reported = {r.split(":")[0] for r in c.report}
    for f in ("fuse_embedding_table", "volatile_db.enable_tls", "volatile_db.shared_memory_size",
              "models[0].dense_file", "models[0].slot_num", "models[0].use_context_stream",
              "models[0].cache_refresh_percentage_per_iteration"):
        assert f in reported, f
    # Every field that steers the server is not reported (deployed_device_list: the server says
    # which tier each model's cache got).
    for f in ("models[0].gpucacheper", "volatile_db.num_partitions", "persistent_db.read_only",
              "persistent_db.num_threads", "models[0].deployed_device_list"):
        assert f not in reported
    print("ok")


def test_unknown_fields_warned_once_and_kept_in_report(caplog):
    d = copy.deepcopy(FULL)
    d["models"][0]["gpu_cache_percent"] = 0.3          # a typo of a real field
    d["volatile_db"]["shards"] = 4
    with caplog.at_level(logging.WARNING, logger="embedlab.hps"):
        c = load_config(d)
    assert "models[0].gpu_cache_percent: unknown field, ignored" in c.report
    assert "volatile_db.shards: unknown field, ignored" in c.report
    warnings = [r for r in caplog.records if "no effect here or are unknown" in r.message]
    assert len(warnings) == 1 and "gpu_cache_percent" in warnings[0].message


@pytest.mark.parametrize("path, value, field", [
    (("models", 0, "gpucacheper"), 1.5, "models[0].gpucacheper"),
    (("models", 0, "gpucacheper"), "0.2", "models[0].gpucacheper"),
    (("models", 0, "hit_rate_threshold"), -0.1, "models[0].hit_rate_threshold"),
    (("models", 0, "embedding_cache_type"), "lru", "models[0].embedding_cache_type"),
    (("models", 0, "embedding_vecsize_per_table"), [16], "models[0].embedding_vecsize_per_table"),
    (("models", 0, "embedding_vecsize_per_table"), [16, 0], "models[0].embedding_vecsize_per_table[1]"),
    (("models", 0, "default_value_for_each_table"), [0.0, "x"], "models[0].default_value_for_each_table[1]"),
    (("models", 0, "max_batch_size"), 0, "models[0].max_batch_size"),
    (("models", 0, "gpucache"), 1, "models[0].gpucache"),
    (("models", 0, "sparse_files"), [], "models[0].sparse_files"),
    (("models", 0, "embedding_table_names"), ["a", "a"], "models[0].embedding_table_names"),
    (("volatile_db", "type"), "memcached", "volatile_db.type"),
    (("volatile_db", "num_partitions"), 0, "volatile_db.num_partitions"),
    (("volatile_db", "overflow_policy"), "evict_newest", "volatile_db.overflow_policy"),
    (("volatile_db", "overflow_resolution_target"), 0.0, "volatile_db.overflow_resolution_target"),
    (("volatile_db", "initial_cache_rate"), 2.0, "volatile_db.initial_cache_rate"),
    (("volatile_db", "address"), "localhost", "volatile_db.address"),
    (("volatile_db", "max_batch_size"), 2.5, "volatile_db.max_batch_size"),
    (("persistent_db", "type"), "leveldb", "persistent_db.type"),
    (("persistent_db", "read_only"), "yes", "persistent_db.read_only"),
    (("persistent_db", "num_threads"), 0, "persistent_db.num_threads"),
    (("supportlonglong",), None, "supportlonglong"),
])
def test_bad_value_names_the_field(path, value, field):
    d = copy.deepcopy(FULL)
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    with pytest.raises(HPSConfigError, match=__import__("re").escape(field)):
        load_config(d)


def test_missing_required_and_empty_models():
    for k in ("model", "sparse_files", "embedding_vecsize_per_table"):
        d = copy.deepcopy(FULL)
        del d["models"][0][k]
        with pytest.raises(HPSConfigError, match=rf"models\[0\]\.{k} is required"):
            load_config(d)
    with pytest.raises(HPSConfigError, match="models"):
        load_config({"models": []})
    d = copy.deepcopy(FULL)
    d["volatile_db"]["type"] = "disabled"
    d["persistent_db"]["type"] = "disabled"
    with pytest.raises(HPSConfigError, match="nowhere"):
        load_config(d)


def test_files_and_defaults(tmp_path):
    with pytest.raises(HPSConfigError, match="missing.json"):
        load_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"models": [}')
    with pytest.raises(HPSConfigError, match=r"bad.json: invalid JSON at line 1"):
        load_config(bad)
    (tmp_path / "t").mkdir()
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"models": [{"model": "m", "sparse_files": ["t"], "embedding_vecsize_per_table": [4]}]}))
    c = load_config(ok)
    m = c.models[0]
    # relative sparse_files resolve against the JSON's folder when absent from the working folder
    assert m.sparse_files == [str(tmp_path / "t")]
    assert (c.volatile_db.type, c.persistent_db.type, m.gpucache, m.gpucacheper, m.hit_rate_threshold,
            m.embedding_cache_type, m.default_value_for_each_table, m.embedding_table_names) == \
        ("parallel_hash_map", "disabled", True, 0.2, 0.9, "dynamic", [0.0], ["sparse_embedding0"])
    assert c.report == []


def test_init_arguments_and_one_sparse_model_implementation():
    assert hps.write_sparse_model is sm.write_sparse_model and hps.read_sparse_model is sm.read_sparse_model
    assert hps.init is hps.Init
    with pytest.raises(ValueError, match="global_batch_size"):
        hps.Init(0, "x.json")
    with pytest.raises(ValueError, match="ps_config_file"):
        hps.Init(16, "")
    with pytest.raises(HPSConfigError, match="nope.json"):
        hps.Init(16, "/nonexistent/nope.json")

"""The HPS on the Redis that EMBEDLAB_REDIS_ADDRESS / EMBEDLAB_REDIS_PASSWORD name (a real
password-protected redis-server the test starts on 127.0.0.1 stands for the user's): the volatile
tier and the tier demos use it and leave no rows. The launcher itself is tested in
tests/services/test_redis_server.py."""
import uuid

import numpy as np
import pytest

from embedlab.hps import ParameterServer
from embedlab.services.redis_server import ADDRESS_ENV, ExternalRedis, hps_redis, redis_to_kill

from hps_testing import Table, needs_native_tiers


def test_the_variables_select_that_redis_and_the_hps_uses_it(users_redis_env, tmp_path):
    r = hps_redis()
    assert isinstance(r, ExternalRedis) and r.external
    assert (r.address, r.password) == (users_redis_env.address, users_redis_env.password)
    assert ADDRESS_ENV in r.describe() and users_redis_env.address in r.describe()
    tab = Table(tmp_path / "t", n=500, dim=8)
    name = f"envtest{uuid.uuid4().hex[:12]}"     # a model name no other run uses in that Redis
    cfg = {"volatile_db": r.volatile_db(num_partitions=3), "persistent_db": {"type": "disabled"},
           "models": [{"model": name, "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [8],
                       "gpucache": False}]}
    with ParameterServer(cfg) as ps:
        q = tab.query(300)
        assert np.array_equal(ps.lookup(name, 0, q), tab.expect(q))
        assert ps.stats()["tiers"]["volatile"]["hits"] == len(np.unique(q))
    # the rows live in the user's Redis, under the HPS's key names
    keys = [k.decode() for k in users_redis_env.client().keys(f"hps_et.{name}.*")]
    assert len(keys) == 3 and sum(users_redis_env.client().hlen(k) for k in keys) == 500
    users_redis_env.client().delete(*keys)


@needs_native_tiers
def test_tier_demo_uses_the_users_redis_and_leaves_no_rows(users_redis_env, tmp_path):
    from embedlab.tutorials import hps_demo as demo
    tab = Table(tmp_path / "t", n=2000, dim=8, key_space=10**6)
    stream = demo.zipf_stream(tab.keys, 6, 256, seed=1)
    r = hps_redis()
    runs = demo.tier_stacks(tab.path, stream, r, workdir=tmp_path / "w", gpucacheper=0.05)
    assert [x.name for x in runs] == ["cache -> hash_map", "cache -> Redis -> RocksDB", "RocksDB only"]
    assert all(all(x.exact) for x in runs)
    assert sum(runs[1].tier_keys["volatile"]) > 0 and runs[1].stats["tiers"]["volatile"]["hits"] > 0
    assert not users_redis_env.client().keys("hps_et.walk.*")          # the demo's table was deleted afterwards
    split = demo.tier_split(runs[2])
    assert split["persistent_keys"] > 0 and split["cache_keys"] == 0
    with pytest.raises(ValueError, match="was not started here"):
        demo.redis_outage(tab.path, stream, r, workdir=tmp_path / "o")
    victim = redis_to_kill(r)
    try:
        run = demo.redis_outage(tab.path, stream, victim, workdir=tmp_path / "o", kill_at=0.34, restart_at=0.67)
    finally:
        victim.stop()
    assert all(run.exact) and run.stats["tiers"]["volatile"]["outages"] == 1
    assert [p[0] for p in run.phases()] == ["start", "Redis killed", "Redis restarted, empty"]
    assert any("unavailable" in m for m in run.log) and any("is back" in m for m in run.log)
    assert users_redis_env.ping()

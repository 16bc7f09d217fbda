"""The Redis tier of the served HPS killed under load: no failed request, no wrong answer, and
the outage in the HPS statistics the server publishes. Real redis-server, real tritonserver."""
from __future__ import annotations

from embedlab.serving import TritonServer, write_model_repository, write_ps_config_variant
from embedlab.serving.faults import kill_during_load
from serving_export import MAX_BATCH, random_keys


def test_redis_killed_under_load(export_dir, reference, tmp_path, rng):
    from embedlab.services.redis_server import start_redis
    batches = [random_keys(rng, 16) for _ in range(24)]
    # The reference serves the same tables from the export's in-process hash map.
    expected = [reference.predict(k) for k in batches]
    with start_redis() as redis:
        ps = write_ps_config_variant(
            export_dir, tmp_path / "hps_redis.json",
            volatile_db={"type": "redis_cluster", "address": redis.address, "password": redis.password},
            persistent_db={"type": "rocks_db", "path": str(tmp_path / "rocksdb")},
            gpucacheper=0.1)
        repo = write_model_repository(export_dir, tmp_path / "repo", max_batch_size=MAX_BATCH,
                                      ps_config_file=ps)
        with TritonServer(repo, log_file=tmp_path / "triton.log") as server:
            run = kill_during_load(server, redis.kill, batches, expected, kill_after_s=0.8,
                                   duration_s=2.5, concurrency=2)
            assert not redis.running
    res = run.result
    assert run.killed_at_s is not None
    assert res.failed == 0 and res.wrong == 0, res.errors
    assert (res.times > run.killed_at_s).sum() >= 10, "too few requests answered after the kill"
    before, after = run.stats_before, run.stats_after
    assert after["tiers.volatile.outages"] > before.get("tiers.volatile.outages", 0), run.changed()
    assert after["tiers.persistent.hits"] > before.get("tiers.persistent.hits", 0), run.changed("tiers.")

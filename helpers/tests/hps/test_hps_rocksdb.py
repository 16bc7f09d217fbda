"""The rocks_db tier on a real RocksDB (rocksdict): oracle, column families, read_only, bad paths."""
import numpy as np
import pytest
import rocksdict

from embedlab.hps import ParameterServer
from embedlab.hps.config import PersistentDBConfig
from embedlab.hps.tiers import RocksDBTier, TierError

from hps_testing import Table


def _tier(path, **kw):
    return RocksDBTier(PersistentDBConfig(type="rocks_db", path=str(path), **kw))


def test_rocksdb_tier_against_oracle(tmp_path, rng):
    tabs = {name: Table(tmp_path / name, n=int(rng.integers(200, 1500)), dim=dim, rng=rng)
            for name, dim in (("hps_et.m.a", 8), ("hps_et.m.b", 33))}
    t = _tier(tmp_path / "db", max_batch_size=97)      # several multi-get batches
    for name, tab in tabs.items():
        t.add_table(name, tab.dim)
        t.insert(name, tab.keys, tab.vectors)
    for name, tab in tabs.items():
        q = tab.query(700, absent=50)
        out = np.full((len(q), tab.dim), np.nan, np.float32)
        missing = t.find(name, q, out)
        present = np.array([int(k) in tab.oracle for k in q])
        assert np.array_equal(missing, np.flatnonzero(~present))
        assert np.array_equal(out[present], tab.expect(q)[present])       # never a foreign row
        assert np.isnan(out[~present]).all()                                # misses untouched
    # overwrite and erase
    tab = tabs["hps_et.m.a"]
    new = rng.standard_normal((10, tab.dim)).astype(np.float32)
    t.insert("hps_et.m.a", tab.keys[:10], new)
    t.erase("hps_et.m.a", tab.keys[10:20])
    out = np.zeros((20, tab.dim), np.float32)
    assert np.array_equal(t.find("hps_et.m.a", tab.keys[:20], out), np.arange(10, 20))
    assert np.array_equal(out[:10], new)
    t.close()
    # one column family per table
    assert set(rocksdict.Rdict.list_cf(str(tmp_path / "db"), rocksdict.Options(raw_mode=True))) >= set(tabs)


def test_threaded_multi_get_against_oracle(tmp_path, monkeypatch, rng):
    """A lookup split over num_threads threads (small chunks, so many of them), with duplicate and
    absent keys and one wrong-length value, gives exactly the single-thread answer; so do several
    callers at once."""
    import os
    from concurrent.futures import ThreadPoolExecutor
    monkeypatch.setattr(RocksDBTier, "MIN_CHUNK", 64)
    tab = Table(tmp_path / "t", n=4000, dim=24, rng=rng)
    t = _tier(tmp_path / "db", num_threads=4)
    assert t.threads == min(4, os.cpu_count())
    t.add_table("x", tab.dim)
    t.insert("x", tab.keys, tab.vectors, bulk=True)
    bad_key = int(tab.keys[7])
    t._db.get_column_family("x")[bad_key.to_bytes(8, "big", signed=True)] = b"\0" * 12   # a wrong-length row
    q = np.concatenate([tab.query(3000, absent=300), tab.keys[:50], [bad_key] * 3])
    rng.shuffle(q)
    assert len(t._chunks(len(q))) == 4 * t.threads
    present = np.array([int(k) in tab.oracle and int(k) != bad_key for k in q])

    def look(_):
        out = np.full((len(q), tab.dim), np.nan, np.float32)
        return t.find("x", q, out), out

    for missing, out in [look(0)] + list(ThreadPoolExecutor(3).map(look, range(3))):
        assert np.array_equal(missing, np.flatnonzero(~present))
        assert np.array_equal(out[present], tab.expect(q)[present])
        assert np.isnan(out[~present]).all()
    assert t.bad_values == 4 * int((q == bad_key).sum())   # every occurrence counted, never returned
    t.close()


def test_bulk_insert_leaves_one_compacted_run(tmp_path, rng):
    """A bulk insert (the ParameterServer's load) flushes and compacts the table: nothing left in
    the memtables or level 0, every row still exact, and later small writes still win."""
    tab = Table(tmp_path / "t", n=5000, dim=16, rng=rng)
    t = _tier(tmp_path / "db", max_batch_size=1000)
    t.add_table("x", tab.dim)
    t.insert("x", tab.keys[:2500], tab.vectors[:2500])              # a first load ...
    t.insert("x", tab.keys, tab.vectors, bulk=True)                 # ... overwritten by the bulk one
    cf = t._cfs["x"]
    assert int(cf.property_value("rocksdb.num-files-at-level0")) == 0
    assert int(cf.property_value("rocksdb.num-entries-active-mem-table")) == 0
    q = tab.query(3000, absent=100)
    out = np.full((len(q), tab.dim), np.nan, np.float32)
    missing = t.find("x", q, out)
    present = np.array([int(k) in tab.oracle for k in q])
    assert np.array_equal(missing, np.flatnonzero(~present))
    assert np.array_equal(out[present], tab.expect(q)[present])
    new = rng.standard_normal((5, tab.dim)).astype(np.float32)
    t.insert("x", tab.keys[:5], new)
    out = np.zeros((5, tab.dim), np.float32)
    assert t.find("x", tab.keys[:5], out).size == 0 and np.array_equal(out, new)
    t.close()


def test_read_only_reopen_and_wrong_length_value(tmp_path):
    tab = Table(tmp_path / "t", n=300, dim=4)
    t = _tier(tmp_path / "db")
    t.add_table("x", 4)
    t.insert("x", tab.keys, tab.vectors)
    # plant a value of the wrong length under a real key
    t._cfs["x"][int(tab.keys[0]).to_bytes(8, "big", signed=True)] = b"\x00" * 12
    t.close()
    ro = _tier(tmp_path / "db", read_only=True)
    ro.add_table("x", 4)
    out = np.zeros((3, 4), np.float32)
    assert ro.find("x", tab.keys[:3], out).tolist() == [0]             # wrong length -> miss, reported
    assert ro.bad_values == 1
    assert np.array_equal(out[1:], tab.vectors[1:3])
    with pytest.raises(TierError, match="read_only"):
        ro.insert("x", tab.keys[:1], tab.vectors[:1])
    with pytest.raises(TierError, match="no column family 'y'"):
        ro.add_table("y", 4)
    ro.close()


def test_unreadable_paths_fail_at_start_naming_the_path(tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    with pytest.raises(TierError, match=str(f / "db")):
        _tier(f / "db")                                    # parent is a file
    with pytest.raises(TierError, match=str(f)):
        _tier(f)                                           # path is a file
    with pytest.raises(TierError, match=str(tmp_path / "none")):
        _tier(tmp_path / "none", read_only=True)           # read_only needs an existing database
    tab = Table(tmp_path / "t", n=10, dim=4)
    cfg = {"volatile_db": {"type": "disabled"}, "persistent_db": {"type": "rocks_db", "path": str(f / "db")},
           "models": [{"model": "m", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [4],
                       "gpucache": False}]}
    with pytest.raises(TierError, match=str(f / "db")):
        ParameterServer(cfg)

"""The Session's Raw and Parquet readers: blocks equal to what was written (one-hot keys offset by
`slot_size_array`, HugeCTR's dense transform for Raw), batches through `DataReader`, and errors
that name the file, record and slot."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedlab.data import formats
from embedlab.session.reader import DataReader, FormatError, read_parquet_block, read_raw_block
from embedlab.session.spec import DataSpec, SparseInput

SLOT_SIZES = [5, 1, 7, 300]          # slots 0-1 feed input 0, slots 2-3 input 1


def spec(fmt, float_label_dense=False, dense_dim=3):
    sparse = [SparseInput(top="a", type="DistributedSlot", max_feature_num_per_sample=2, slot_num=2, first_slot=0),
              SparseInput(top="b", type="LocalizedSlot", max_feature_num_per_sample=2, slot_num=2, first_slot=2)]
    return DataSpec(name="data", format=fmt, source="", eval_source="", check="None", label_top="label",
                    label_dim=1, dense_top="dense", dense_dim=dense_dim, sparse=sparse,
                    slot_size_array=list(SLOT_SIZES), float_label_dense=float_label_dense)


def records(rng, n, dense_dim=3):
    label = (rng.random(n) > 0.5).astype(np.int32)
    dense = rng.integers(-3, 1000, (n, dense_dim)).astype(np.int32)         # negatives clip to 0
    keys = np.stack([rng.integers(0, s, n) for s in SLOT_SIZES], 1).astype(np.int32)
    return label, dense, keys


def expected_keys(keys):
    off = np.concatenate([[0], np.cumsum(SLOT_SIZES)[:-1]])
    g = keys.astype(np.int64) + off[None, :]
    return [g[:, 0:2].reshape(-1), g[:, 2:4].reshape(-1)]


def check_block(b, label, dense, keys):
    n = len(label)
    np.testing.assert_array_equal(b.label[:, 0], label.astype(np.float32))
    np.testing.assert_allclose(b.dense, dense, rtol=1e-6)
    for (splits, k), want in zip(b.sparse, expected_keys(keys)):
        np.testing.assert_array_equal(splits, np.arange(2 * n + 1))        # one key per slot
        np.testing.assert_array_equal(k, want)


def test_raw_block_matches_written(tmp_path, rng):
    n = 37
    label, dense, keys = records(rng, n)
    p = tmp_path / "d.raw"
    np.concatenate([label[:, None], dense, keys], 1).astype("<i4").tofile(p)
    b = read_raw_block(p, spec("Raw"), n)
    check_block(b, label, np.log1p(np.maximum(dense, 0)).astype(np.float32), keys)


def test_raw_float_label_dense(tmp_path, rng):
    n = 11
    label, _, keys = records(rng, n)
    dense = rng.standard_normal((n, 3)).astype(np.float32)
    m = np.concatenate([label[:, None].astype(np.float32).view("<i4"), dense.view("<i4"), keys], 1)
    p = tmp_path / "f.raw"
    m.astype("<i4").tofile(p)
    check_block(read_raw_block(p, spec("Raw", float_label_dense=True), n), label, dense, keys)


def test_raw_errors_name_file_record_and_slot(tmp_path, rng):
    label, dense, keys = records(rng, 8)
    p = tmp_path / "bad.raw"
    np.concatenate([label[:, None], dense, keys], 1).astype("<i4").tofile(p)
    with pytest.raises(FormatError, match=r"bad\.raw.*num_samples 9"):
        read_raw_block(p, spec("Raw"), 9)
    keys[5, 3] = SLOT_SIZES[3]                                                # one past the slot's range
    np.concatenate([label[:, None], dense, keys], 1).astype("<i4").tofile(p)
    with pytest.raises(FormatError, match=r"bad\.raw: record 5 slot 3: key 300 is outside"):
        read_raw_block(p, spec("Raw"), 8)


def write_parquet(path, label, dense, keys):
    cols = {"label": label.astype(np.float32)}
    cols.update({f"I{i}": dense[:, i].astype(np.float32) for i in range(dense.shape[1])})
    cols.update({f"C{i}": keys[:, i].astype(np.int64) for i in range(keys.shape[1])})
    pq.write_table(pa.table(cols), path)


def test_parquet_block_and_reader_batches(tmp_path, rng):
    parts = []
    for f in range(3):
        n = int(rng.integers(20, 60))
        label, dense, keys = records(rng, n)
        dense = dense.astype(np.float32) / 7
        write_parquet(tmp_path / f"p{f}.parquet", label, dense, keys)
        check_block(read_parquet_block(tmp_path / f"p{f}.parquet", spec("Parquet")), label, dense, keys)
        parts.append((label, dense, keys))
    formats.write_file_list(tmp_path / "list.txt", [tmp_path / f"p{f}.parquet" for f in range(3)])
    r = DataReader(spec("Parquet"), batchsize=16, i64_key=True, repeat=False, name="train")
    r.set_file_list_source(str(tmp_path / "list.txt"))
    got_label, got_keys = [], [[], []]
    while (b := r.next_batch()) is not None:
        assert len(b) <= 16
        got_label.append(b.label[:, 0])
        for i, (splits, k) in enumerate(b.sparse):
            assert np.array_equal(splits, np.arange(2 * len(b) + 1))
            got_keys[i].append(k)
    r.close()
    label = np.concatenate([p[0] for p in parts])
    np.testing.assert_array_equal(np.concatenate(got_label), label)
    for i in range(2):
        want = np.concatenate([expected_keys(p[2])[i] for p in parts])
        np.testing.assert_array_equal(np.concatenate(got_keys[i]), want)


def test_parquet_errors(tmp_path, rng):
    label, dense, keys = records(rng, 10)
    dense = dense.astype(np.float32)
    dense[4, 1] = np.nan
    write_parquet(tmp_path / "nan.parquet", label, dense, keys)
    with pytest.raises(FormatError, match=r"nan\.parquet: NaN"):
        read_parquet_block(tmp_path / "nan.parquet", spec("Parquet"))
    write_parquet(tmp_path / "few.parquet", label, dense[:, :1], keys)
    with pytest.raises(FormatError, match=r"few\.parquet: 6 columns; the Data layer needs 8"):
        read_parquet_block(tmp_path / "few.parquet", spec("Parquet"))
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(FormatError, match=r"junk\.parquet: not a readable parquet file"):
        read_parquet_block(tmp_path / "junk.parquet", spec("Parquet"))
    keys[2, 0] = -1
    write_parquet(tmp_path / "neg.parquet", label, np.zeros((10, 3), np.float32), keys)
    with pytest.raises(FormatError, match=r"neg\.parquet: record 2 slot 0: key -1 is outside"):
        read_parquet_block(tmp_path / "neg.parquet", spec("Parquet"))

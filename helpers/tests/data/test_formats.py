"""embedlab.data.formats: byte layouts, round trips, and corruption handling for every format."""
from __future__ import annotations

import struct

import numpy as np
import pytest

import reference_data as ref
from embedlab.data import formats


def test_norm_tiny_file_hand_computed_bytes(tmp_path):
    p = formats.write_norm(tmp_path / "t.data", [1.0], [[0.5]], [[7], [9]])
    hdr = struct.pack("<8q", 1, 1, 1, 1, 2, 0, 0, 0)
    rec = (struct.pack("<f", 1.0) + struct.pack("<f", 0.5)
           + struct.pack("<iI", 1, 7) + struct.pack("<iI", 1, 9))
    # Checksums by hand: header bytes 1+1+1+1+2 = 6; record 0x80+0x3f + 0x3f + 1+7 + 1+9 = 272.
    expect = (struct.pack("<i", 64) + hdr + bytes([6])
              + struct.pack("<i", 24) + rec + bytes([272 % 256]))
    assert p.read_bytes() == expect
    raw = formats.write_norm(tmp_path / "r.data", [1.0], [[0.5]], [[7], [9]], error_check=False)
    assert raw.read_bytes() == struct.pack("<8q", 0, 1, 1, 1, 2, 0, 0, 0) + rec
    # A negative byte sum exercises the signed-char wrap: 0xFF bytes count as -1.
    p2 = formats.write_norm(tmp_path / "n.data", [np.float32(np.frombuffer(b"\xff\xff\xff\xff",
                                                                          "<f4")[0])], [[]], [])
    assert p2.read_bytes()[-1] == (-4) % 256


@pytest.mark.parametrize("error_check", [True, False])
@pytest.mark.parametrize("key_type", ["uint32", "int64"])
def test_norm_matches_struct_oracle_and_round_trips(tmp_path, rng, error_check, key_type):
    n = int(rng.integers(1, 60))
    label = rng.random((n, int(rng.integers(1, 3)))).astype(np.float32)
    dense = rng.random((n, int(rng.integers(0, 5)))).astype(np.float32)
    hi = 2**32 if key_type == "uint32" else 2**62
    slots, as_lists = [], []
    for s in range(int(rng.integers(1, 5))):
        if rng.random() < 0.5:                      # one key per record
            keys = rng.integers(0, hi, n, dtype=np.uint64 if key_type == "uint32" else np.int64)
            slots.append(keys)
            as_lists.append([[int(k)] for k in keys])
        else:                                        # multi-hot with empty rows and duplicates
            nnz = rng.integers(0, 4, n)
            splits = np.concatenate([[0], np.cumsum(nnz)])
            vals = rng.integers(0, 50, splits[-1])
            slots.append((splits, vals))
            as_lists.append([vals[a:b].tolist() for a, b in zip(splits[:-1], splits[1:])])
    p = formats.write_norm(tmp_path / "x.data", label, dense, slots, error_check=error_check,
                           key_type=key_type)
    assert p.read_bytes() == ref.norm_bytes(label.tolist(), dense.tolist(), as_lists,
                                            error_check, key_type)
    d = formats.read_norm(p, key_type=key_type)
    assert d.error_check == error_check
    np.testing.assert_array_equal(d.label, label)
    np.testing.assert_array_equal(d.dense, dense)
    for (splits, vals), want in zip(d.slots, as_lists):
        assert [vals[a:b].tolist() for a, b in zip(splits[:-1], splits[1:])] == want


def _one_hot_file(tmp_path, rng, n=300):
    label = rng.integers(0, 2, n).astype(np.float32)
    dense = rng.random((n, 13)).astype(np.float32)
    slots = [rng.integers(0, 2**32, n) for _ in range(26)]
    return formats.write_norm(tmp_path / "c.data", label, dense, slots), n


def test_norm_corruption_names_file_and_record(tmp_path, rng):
    p, n = _one_hot_file(tmp_path, rng)
    good = p.read_bytes()
    rec = 4 + 4 * 14 + 26 * 8 + 1
    bad = tmp_path / "bad.data"
    # A flipped payload byte in a random record -> checksum mismatch naming that record.
    r = int(rng.integers(0, n))
    off = 69 + r * rec + 4 + int(rng.integers(0, rec - 5))
    b = bytearray(good)
    b[off] ^= 1 << int(rng.integers(0, 8))
    bad.write_bytes(bytes(b))
    with pytest.raises(formats.FormatError, match=rf"bad\.data: record {r} .*checksum"):
        formats.read_norm(bad)
    # Truncated anywhere inside the records -> names the first incomplete record.
    cut = int(rng.integers(70, len(good) - 1))
    bad.write_bytes(good[:cut])
    r_cut = (cut - 69) // rec
    with pytest.raises(formats.FormatError, match=rf"bad\.data: (truncated at )?record {r_cut}\b"):
        formats.read_norm(bad)
    # A broken length prefix.
    b = bytearray(good)
    b[69 + 5 * rec] = 0xFF
    bad.write_bytes(bytes(b))
    with pytest.raises(formats.FormatError, match=r"record 5 .*(length|truncated)"):
        formats.read_norm(bad)
    # Bytes after the last record, a damaged header, a truncated header, not a Norm file.
    bad.write_bytes(good + b"\0\0")
    with pytest.raises(formats.FormatError, match="unexpected bytes"):
        formats.read_norm(bad)
    b = bytearray(good)
    b[12] ^= 1                                          # number_of_records
    bad.write_bytes(bytes(b))
    with pytest.raises(formats.FormatError, match="header checksum"):
        formats.read_norm(bad)
    bad.write_bytes(good[:30])
    with pytest.raises(formats.FormatError, match="truncated header"):
        formats.read_norm(bad)
    bad.write_bytes(b"hello world, this is not a norm file" * 3)
    with pytest.raises(formats.FormatError, match="bad header"):
        formats.read_norm(bad)


def test_norm_empty_file_round_trips(tmp_path):
    for ec in (True, False):
        p = formats.write_norm(tmp_path / "e.data", np.zeros((0, 1)), np.zeros((0, 13)),
                               [np.zeros(0, np.int64)] * 3, error_check=ec)
        d = formats.read_norm(p)
        assert d.label.shape == (0, 1) and d.dense.shape == (0, 13) and len(d.slots) == 3
        assert all(len(v) == 0 and list(s) == [0] for s, v in d.slots)


def test_norm_bad_input(tmp_path):
    with pytest.raises(ValueError, match="outside uint32"):
        formats.write_norm(tmp_path / "k.data", [0.0], [[1.0]], [[2**32]])
    with pytest.raises(ValueError, match="outside"):
        formats.write_norm(tmp_path / "k.data", [0.0], [[1.0]], [[-1]], key_type="int64")
    with pytest.raises(ValueError, match="slot 1"):
        formats.write_norm(tmp_path / "k.data", [0.0, 1.0], [[1.0], [2.0]], [[1, 2], [3]])
    with pytest.raises(ValueError, match="row_splits"):
        formats.write_norm(tmp_path / "k.data", [0.0], [[1.0]], [([0, 2], [1])])
    with pytest.raises(ValueError, match="key_type"):
        formats.write_norm(tmp_path / "k.data", [0.0], [[1.0]], [[1]], key_type="int32")
    assert not (tmp_path / "k.data").exists() and not list(tmp_path.iterdir())


def test_file_list_and_keyset(tmp_path, rng):
    files = [tmp_path / f"f{i}.data" for i in range(3)]
    for f in files:
        f.write_bytes(b"")
    fl = formats.write_file_list(tmp_path / "file_list.txt", files)
    assert fl.read_text() == "3\n" + "".join(f"{f}\n" for f in files)
    assert formats.read_file_list(fl) == files
    fl.write_text("4\n" + "".join(f"{f}\n" for f in files))
    with pytest.raises(formats.FormatError, match="says 4 files but lists 3"):
        formats.read_file_list(fl)
    fl.write_text(f"1\n{tmp_path / 'missing.data'}\n")
    with pytest.raises(formats.FormatError, match="line 2.*does not exist"):
        formats.read_file_list(fl)
    keys = rng.integers(0, 2**32, 500)
    ks = formats.write_keyset(tmp_path / "a.keyset", np.concatenate([keys, keys[:50]]))
    assert ks.stat().st_size == 4 * len(np.unique(keys))
    np.testing.assert_array_equal(formats.read_keyset(ks), np.unique(keys))
    ks.write_bytes(ks.read_bytes()[:-1])
    with pytest.raises(formats.FormatError, match="whole number"):
        formats.read_keyset(ks)


def test_parquet_to_norm_with_file_lists_and_keysets(criteo_small, tmp_path):
    _, res = criteo_small
    lists = formats.parquet_to_norm(res.dst / "train", tmp_path / "norm", samples_per_file=1000,
                                    files_per_list=2, progress=False)
    data = formats.read_parquet(res.dst / "train")
    n = len(data["label"])
    assert len(lists) == -(-(-(-n // 1000)) // 2)
    got_rows, start = 0, 0
    for fl in lists:
        files = formats.read_file_list(fl)
        keys = []
        for f in files:
            d = formats.read_norm(f)
            m = len(d.label)
            assert m <= 1000 and d.error_check
            np.testing.assert_array_equal(d.label[:, 0], data["label"][start:start + m])
            for j, c in enumerate(res.columns):
                np.testing.assert_array_equal(d.slots[j][1], data[c][start:start + m])
                keys.append(d.slots[j][1])
            np.testing.assert_array_equal(d.dense[:, 0], data["I1"][start:start + m])
            start += m
            got_rows += m
        np.testing.assert_array_equal(formats.read_keyset(fl.with_suffix(".keyset")),
                                      np.unique(np.concatenate(keys)))
    assert got_rows == n


def test_parquet_round_trip_with_ragged(tmp_path, rng):
    n = 257
    splits = np.concatenate([[0], np.cumsum(rng.integers(0, 5, n))])
    vals = rng.integers(0, 1000, splits[-1])
    cols = {"label": rng.integers(0, 2, n).astype(np.float32),
            "I1": rng.random(n).astype(np.float32), "C1": rng.integers(0, 99, n),
            "tags": (splits, vals)}
    p = formats.write_parquet(tmp_path / "x.parquet", cols, row_group_rows=64)
    back = formats.read_parquet(p)
    for k in ("label", "I1", "C1"):
        np.testing.assert_array_equal(back[k], cols[k])
    np.testing.assert_array_equal(back["tags"][0], splits)
    np.testing.assert_array_equal(back["tags"][1], vals)
    import pyarrow.parquet as pq
    assert pq.ParquetFile(p).metadata.num_row_groups == 5
    assert formats.schema_columns(pq.read_schema(p)) == {
        "label": "label", "dense": ["I1"], "sparse": ["C1"], "ragged": ["tags"]}
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(formats.FormatError, match="junk.parquet"):
        formats.read_parquet(tmp_path / "junk.parquet")


def test_tfrecord_round_trip_and_corruption(criteo_small, tmp_path, rng):
    _, res = criteo_small
    data = formats.read_parquet(res.files["val"])
    p = formats.parquet_to_tfrecord(res.files["val"], tmp_path / "v.tfrecord")
    cols = ([("label", "float")] + [(f"I{i}", "float") for i in range(1, 14)]
            + [(c, "int") for c in res.columns])
    back = formats.read_tfrecord(p, columns=cols)
    for k in data:
        np.testing.assert_array_equal(back[k], data[k], err_msg=k)
    # The tf.data baseline pipeline yields the same rows.
    ds = formats.tfrecord_dataset(p, batch_size=128, columns=cols)
    feats, labels = zip(*[(x, y) for x, y in ds])
    np.testing.assert_array_equal(np.concatenate([y.numpy()[:, 0] for y in labels]), data["label"])
    np.testing.assert_array_equal(np.concatenate([x["dense"].numpy()[:, 12] for x in feats]),
                                  data["I13"])
    np.testing.assert_array_equal(np.concatenate([x["C1_C2"].numpy() for x in feats]),
                                  data["C1_C2"])
    # Ragged columns.
    splits = np.array([0, 2, 2, 5])
    rp = formats.write_tfrecord(tmp_path / "r.tfrecord", {"label": np.ones(3, np.float32),
                                                          "tags": (splits, np.arange(5))})
    r = formats.read_tfrecord(rp, columns=[("label", "float"), ("tags", "ragged")])
    np.testing.assert_array_equal(r["tags"][0], splits)
    # Corruption: a flipped byte inside a random record, and a truncated file.
    raw = bytearray(p.read_bytes())
    k = int(rng.integers(1, 20))
    pos = 0                                              # walk the length prefixes to record k
    for _ in range(k):
        pos += struct.unpack("<Q", raw[pos:pos + 8])[0] + 16
    raw[pos + 12 + 5] ^= 0x40                            # inside record k's data
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(raw))
    with pytest.raises(formats.FormatError, match=rf"bad\.tfrecord: record {k} "):
        formats.read_tfrecord(bad, columns=cols)
    bad.write_bytes(p.read_bytes()[:pos + 20])
    with pytest.raises(formats.FormatError, match=rf"record {k} "):
        formats.read_tfrecord(bad, columns=cols)


def test_tfrecord_columns_of_parquet(criteo_small, tmp_path):
    """tfrecord_columns names the columns parquet_to_tfrecord writes: the Criteo ETL's, and a
    multi-hot (list) column as "ragged", which read_tfrecord then reads back."""
    _, res = criteo_small
    assert formats.tfrecord_columns(res.files["val"]) == (
        [("label", "float")] + [(f"I{i}", "float") for i in range(1, 14)]
        + [(c, "int") for c in res.columns])
    splits = np.array([0, 2, 2, 5])
    pq_path = formats.write_parquet(tmp_path / "m.parquet", {
        "label": np.ones(3, np.float32), "I1": np.arange(3, dtype=np.float32),
        "C1": np.arange(3, dtype=np.int64), "tags": (splits, np.arange(5))})
    cols = formats.tfrecord_columns(pq_path)
    assert cols == [("label", "float"), ("I1", "float"), ("C1", "int"), ("tags", "ragged")]
    back = formats.read_tfrecord(formats.parquet_to_tfrecord(pq_path, tmp_path / "m.tfrecord"),
                                 columns=cols)
    np.testing.assert_array_equal(back["tags"][0], splits)
    np.testing.assert_array_equal(back["tags"][1], np.arange(5))
    np.testing.assert_array_equal(back["C1"], np.arange(3))

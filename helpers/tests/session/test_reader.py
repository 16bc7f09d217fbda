"""The Session's Norm reader: batches equal to what was written (multi-hot, empty slots, both key
types, across files), and errors that name the file list, file and record."""
from __future__ import annotations

import numpy as np
import pytest

from embedlab.data import formats
from embedlab.session.reader import DataReader, FormatError, read_norm_block
from embedlab.session.spec import DataSpec, SparseInput


def data_spec(check="Sum", dense_dim=3, inputs=((2, 4), (3, 3))):
    sparse, first = [], 0
    for i, (S, mx) in enumerate(inputs):
        sparse.append(SparseInput(top=f"in{i}", type="DistributedSlot", max_feature_num_per_sample=mx,
                                  slot_num=S, first_slot=first))
        first += S
    return DataSpec(name="data", format="Norm", source="", eval_source="", check=check, label_top="label",
                    label_dim=1, dense_top="dense", dense_dim=dense_dim, sparse=sparse)


def make_file(rng, path, n, spec, key_type="uint32", max_key=2**32 - 1):
    """Random records: per slot 0-2 keys (empty slots and duplicates included), capped per input."""
    label = (rng.random(n) > 0.5).astype(np.float32)
    dense = rng.standard_normal((n, spec.dense_dim)).astype(np.float32)
    slots = []
    for inp in spec.sparse:
        budget = np.full(n, inp.max_feature_num_per_sample)
        for _ in range(inp.slot_num):
            cnt = np.minimum(rng.integers(0, 3, n), budget)
            budget -= cnt
            splits = np.concatenate([[0], np.cumsum(cnt)])
            vals = rng.integers(0, max_key, int(splits[-1]), dtype=np.int64)
            if len(vals) > 3:
                vals[1] = vals[0]                                  # a duplicate key
            slots.append((splits, vals))
    formats.write_norm(path, label, dense, slots, error_check=spec.check == "Sum", key_type=key_type)
    return label, dense, slots


def expected_input(slots, spec, inp_index, n):
    """Sample-major CSR of one sparse input from per-slot (splits, values)."""
    inp = spec.sparse[inp_index]
    rows = []
    for r in range(n):
        for s in range(inp.first_slot, inp.first_slot + inp.slot_num):
            sp, v = slots[s]
            rows.append(v[sp[r]:sp[r + 1]])
    splits = np.concatenate([[0], np.cumsum([len(x) for x in rows])])
    return splits, (np.concatenate(rows) if rows else np.empty(0)).astype(np.int64)


@pytest.mark.parametrize("check,key_type", [("Sum", "uint32"), ("None", "int64"), ("Sum", "int64")])
def test_block_matches_written(tmp_path, rng, check, key_type):
    spec = data_spec(check)
    n = 57
    label, dense, slots = make_file(rng, tmp_path / "a.data", n, spec, key_type,
                                    2**40 if key_type == "int64" else 2**32 - 1)
    b = read_norm_block(tmp_path / "a.data", spec, key_type == "int64")
    np.testing.assert_array_equal(b.label[:, 0], label)
    np.testing.assert_array_equal(b.dense, dense)
    for i in range(len(spec.sparse)):
        sp, keys = expected_input(slots, spec, i, n)
        np.testing.assert_array_equal(b.sparse[i][0], sp)
        np.testing.assert_array_equal(b.sparse[i][1], keys)
    # the independent reader of embedlab.data agrees too
    ref = formats.read_norm(tmp_path / "a.data", key_type=key_type)
    np.testing.assert_array_equal(ref.dense, b.dense)


def test_batches_across_files_and_repeat(tmp_path, rng):
    spec = data_spec()
    files, all_label, all_in0 = [], [], []
    for k, n in enumerate([30, 7, 45]):
        f = tmp_path / f"p{k}.data"
        label, _, slots = make_file(rng, f, n, spec)
        files.append(f)
        all_label.append(label)
        all_in0.append(expected_input(slots, spec, 0, n))
    formats.write_file_list(tmp_path / "list.txt", files)
    r = DataReader(spec, 16, False, False, "train", prefetch=2)
    r.set_file_list_source(str(tmp_path / "list.txt"))
    got, sizes = [], []
    while (b := r.next_batch()) is not None:
        sizes.append(len(b))
        got.append(b)
    assert sizes == [16, 16, 16, 16, 16, 2]                   # 82 samples; the last batch is partial
    assert r.next_batch() is None
    np.testing.assert_array_equal(np.concatenate([b.label[:, 0] for b in got]), np.concatenate(all_label))
    keys = np.concatenate([b.sparse[0][1] for b in got])
    np.testing.assert_array_equal(keys, np.concatenate([k for _, k in all_in0]))
    # a batch spanning files knows where each sample came from
    assert "p0.data, record 0" in got[0].locate(0) and "p1.data, record 1" in got[1].locate(1 + 30 - 16)
    # repeat: the list starts over
    r2 = DataReader(spec, 16, False, True, "train")
    r2.set_file_list_source(str(tmp_path / "list.txt"))
    n = sum(len(r2.next_batch()) for _ in range(7))
    assert n == 7 * 16
    r2.close()


def test_exit_hook_stops_every_reading_thread(tmp_path, rng):
    """What runs at interpreter exit (reader._stop_all_readers, registered with atexit) leaves no
    reader thread running, whether it was reading ahead (repeat) or restarted and untouched; a
    stopped reader reads again from the start when asked. test_exit.py runs whole scripts."""
    from embedlab.session import reader as reader_mod
    spec = data_spec()
    make_file(rng, tmp_path / "p.data", 40, spec)
    formats.write_file_list(tmp_path / "list.txt", [tmp_path / "p.data"])
    ahead = DataReader(spec, 8, False, True, "train", prefetch=2)
    ahead.set_file_list_source(str(tmp_path / "list.txt"))
    first = ahead.next_batch()
    fresh = DataReader(spec, 8, False, False, "eval")
    fresh.set_file_list_source(str(tmp_path / "list.txt"))
    threads = [ahead._thread, fresh._thread]
    assert all(t.is_alive() for t in threads) and {ahead, fresh} <= set(reader_mod._LIVE)
    reader_mod._stop_all_readers()
    assert not any(t.is_alive() for t in threads) and ahead._thread is None and fresh._thread is None
    assert not ({ahead, fresh} & set(reader_mod._LIVE))
    fresh.restart()
    b = fresh.next_batch()
    np.testing.assert_array_equal(b.label, first.label)
    fresh.close()
    assert fresh._thread is None


def test_missing_file_in_list(tmp_path, rng):
    spec = data_spec()
    make_file(rng, tmp_path / "a.data", 5, spec)
    (tmp_path / "list.txt").write_text(f"2\n{tmp_path / 'a.data'}\n{tmp_path / 'gone.data'}\n")
    r = DataReader(spec, 4, False, False, "train")
    with pytest.raises(FormatError, match=r"list.txt: line 3: data file .*gone.data does not exist"):
        r.set_file_list_source(str(tmp_path / "list.txt"))
    (tmp_path / "bad.txt").write_text(f"3\n{tmp_path / 'a.data'}\n")
    with pytest.raises(FormatError, match="says 3 files but lists 1"):
        r.set_file_list_source(str(tmp_path / "bad.txt"))


def test_corrupt_record_names_file_and_record(tmp_path, rng):
    spec = data_spec()
    make_file(rng, tmp_path / "a.data", 20, spec)
    raw = bytearray((tmp_path / "a.data").read_bytes())
    good = read_norm_block(tmp_path / "a.data", spec, False)
    # flip one byte inside record 7's payload (its dense values)
    off = 69
    for r in range(7):
        off += 5 + int.from_bytes(raw[off:off + 4], "little")
    raw[off + 4 + 6] ^= 0x5A
    (tmp_path / "a.data").write_bytes(bytes(raw))
    formats.write_file_list(tmp_path / "list.txt", [tmp_path / "a.data"])
    r = DataReader(spec, 8, False, False, "train")
    r.set_file_list_source(str(tmp_path / "list.txt"))
    with pytest.raises(FormatError, match=r"list.txt: .*a.data: record 7 .*checksum mismatch"):
        r.next_batch()
    assert len(good) == 20
    # truncated file
    (tmp_path / "t.data").write_bytes(bytes(raw[:-30]))
    with pytest.raises(FormatError, match="t.data"):
        read_norm_block(tmp_path / "t.data", spec, False)


def test_header_and_limits(tmp_path, rng):
    spec = data_spec()
    make_file(rng, tmp_path / "a.data", 5, spec)
    other = data_spec(dense_dim=4)
    with pytest.raises(FormatError, match="dense_dim 3.*says 1, 4"):
        read_norm_block(tmp_path / "a.data", other, False)
    tight = data_spec(inputs=((2, 1), (3, 3)))
    formats.write_norm(tmp_path / "m.data", [0.0], np.zeros((1, 3)), [([0, 2], [1, 2]), [3], [4], [5], [6]])
    with pytest.raises(FormatError, match="record 0 has 3 keys in sparse input 'in0', more than its "
                                          "max_feature_num_per_sample 1"):
        read_norm_block(tmp_path / "m.data", tight, False)
    with pytest.raises(FormatError, match="has checksums but the Data layer says check: 'None'"):
        read_norm_block(tmp_path / "a.data", data_spec("None"), False)


@pytest.mark.parametrize("check,key_type", [("Sum", "uint32"), ("None", "uint32"), ("Sum", "int64"), ("None", "int64")])
def test_compiled_decoder_matches_numpy_reader(tmp_path, rng, check, key_type):
    """The compiled decoder (decode_norm) against embedlab.data's NumPy reader, per slot, on
    multi-hot files with empty slots and duplicate keys, including an empty file."""
    spec = data_spec(check, inputs=((3, 5), (1, 2), (2, 4)))
    for n in (0, 1, 300):
        f = tmp_path / f"a{n}.data"
        make_file(rng, f, n, spec, key_type, 2**40 if key_type == "int64" else 2**32 - 1)
        b = read_norm_block(f, spec, key_type == "int64")
        ref = formats.read_norm(f, key_type=key_type)
        np.testing.assert_array_equal(b.label, ref.label.reshape(n, spec.label_dim))
        np.testing.assert_array_equal(b.dense, ref.dense)
        for inp, (splits, keys) in zip(spec.sparse, b.sparse):
            got = [keys[splits[r]:splits[r + 1]] for r in range(n * inp.slot_num)]
            for r in range(n):
                for s in range(inp.slot_num):
                    sp, v = ref.slots[inp.first_slot + s]
                    np.testing.assert_array_equal(got[r * inp.slot_num + s], v[sp[r]:sp[r + 1]].astype(np.int64))


def test_every_corruption_of_a_framed_file_is_reported(tmp_path, rng):
    """Any single changed byte after a checksummed file's header, and any truncation, is a
    FormatError naming the file; nothing decodes from a damaged file."""
    spec = data_spec("Sum")
    make_file(rng, tmp_path / "a.data", 12, spec)
    raw = (tmp_path / "a.data").read_bytes()
    positions = rng.choice(np.arange(69, len(raw)), size=min(250, len(raw) - 69), replace=False)
    for i, p in enumerate(positions):
        bad = bytearray(raw)
        bad[p] ^= int(rng.integers(1, 256))
        f = tmp_path / f"c{i}.data"
        f.write_bytes(bytes(bad))
        with pytest.raises(FormatError, match=f"c{i}.data: "):
            read_norm_block(f, spec, False)
    for cut in sorted(set(rng.integers(69, len(raw), 40).tolist()) | {len(raw) - 1}):
        f = tmp_path / "t.data"
        f.write_bytes(raw[:cut])
        with pytest.raises(FormatError, match="t.data: "):
            read_norm_block(f, spec, False)
    f.write_bytes(raw + b"\0\0\0")
    with pytest.raises(FormatError, match="3 unexpected bytes after the 12 records"):
        read_norm_block(f, spec, False)


def test_unframed_file_bad_nnz_and_truncation(tmp_path, rng):
    spec = data_spec("None")
    make_file(rng, tmp_path / "a.data", 6, spec)
    raw = bytearray((tmp_path / "a.data").read_bytes())
    nnz_at = 64 + 4 * (1 + 3)                        # record 0, slot 0's nnz (after label and dense)
    raw[nnz_at:nnz_at + 4] = (-3).to_bytes(4, "little", signed=True)
    (tmp_path / "b.data").write_bytes(bytes(raw))
    with pytest.raises(FormatError, match=r"record 0 slot 0 \(byte offset 80\): bad nnz -3"):
        read_norm_block(tmp_path / "b.data", spec, False)
    raw[nnz_at:nnz_at + 4] = (10**6).to_bytes(4, "little", signed=True)
    (tmp_path / "b.data").write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="b.data: truncated at record 0"):
        read_norm_block(tmp_path / "b.data", spec, False)

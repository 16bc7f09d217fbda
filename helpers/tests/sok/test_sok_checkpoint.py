"""sok.dump / sok.load as files: the checksums of format 2 (a flipped byte anywhere is refused,
naming the file), corrupt meta_info named, errors that keep their cause on the writing rank and
name it on the others, and the temporaries of a killed dump removed by the next one."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import embedlab.sok as sok
from embedlab.sok import checkpoint as ck

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module", autouse=True)
def one_worker():
    sok.init()


def _trained(rng, name="a"):
    a = sok.Variable(rng.normal(size=(13, 4)).astype(np.float32), name=name)
    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adam(learning_rate=0.1))
    ids = tf.ragged.constant([[1, 2], [12]], dtype=tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([a], [ids], combiners=["sum"])[0])
    opt.apply_gradients(zip(tape.gradient(loss, [a]), [a]))
    return a, opt


def _fresh(name="a"):
    return sok.Variable(np.zeros((13, 4), np.float32), name=name), \
        sok.OptimizerWrapper(tf.keras.optimizers.Adam(learning_rate=0.1))


def _flip(path, offset_from_end):
    raw = bytearray(path.read_bytes())
    raw[len(raw) - offset_from_end] ^= 0x10
    path.write_bytes(bytes(raw))


@pytest.fixture
def dumped(tmp_path, rng):
    a, opt = _trained(rng)
    d = tmp_path / "d"
    sok.dump(d, [a], opt)
    return d, a, opt


def _slot_file(d):
    return sorted(d.glob("a-Adam-*"))[0]


@pytest.mark.parametrize("what", ["weight", "slot", "key"])
def test_a_flipped_byte_is_refused_naming_the_file(dumped, what):
    d, a, opt = dumped
    b, opt_b = _fresh()
    sok.load(d, [b], opt_b)                                     # intact: loads
    np.testing.assert_array_equal(b.numpy(), a.numpy())
    f = {"weight": d / "a-weight", "slot": _slot_file(d), "key": d / "a-key"}[what]
    _flip(f, 5)
    c, opt_c = _fresh()
    with pytest.raises(ValueError, match=rf"{f} is corrupt: its data's CRC-32"):
        sok.load(d, [c], opt_c)
    assert not c.numpy().any()                                  # nothing changed
    assert issubclass(ck.DumpFormatError, ValueError)


def test_keys_that_do_not_ascend_are_refused_naming_the_key(dumped):
    d, a, opt = dumped
    keys = np.arange(13, dtype=np.int64)
    keys[5] = 4                                                 # a duplicate, with a valid checksum
    ck._write_array(d / "a-key", keys)
    b, _ = _fresh()
    with pytest.raises(ValueError, match=r"a-key is corrupt: keys must ascend, but key 4 at row 5 follows 4"):
        sok.load(d, [b])


@pytest.mark.parametrize("corrupt, match", [
    (lambda t: b"\xff" + t[1:], r"meta_info is corrupt: byte 0 is not UTF-8"),
    (lambda t: t[:-3], r"meta_info is corrupt: not valid JSON"),
    (lambda t: t.replace(b'"tables"', b'"tablez"'), r"meta_info is corrupt: its CRC-32"),
    (lambda t: t.replace(b'"rows": 13', b'"rows": 93'), r"meta_info is corrupt: its CRC-32"),
    (lambda t: t.replace(b"embedlab.sok dump", b"embedlab.sok dumq"), r"meta_info is corrupt or not an embedlab"),
])
def test_corrupt_meta_info_is_named(dumped, corrupt, match):
    d, a, opt = dumped
    m = d / "meta_info"
    m.write_bytes(corrupt(m.read_bytes()))
    b, _ = _fresh()
    with pytest.raises(ValueError, match=rf"{d}/{match}"):
        sok.load(d, [b])


def test_format_1_dumps_still_load(dumped):
    d, a, opt = dumped
    meta = json.loads((d / "meta_info").read_text())
    meta["format"] = "embedlab.sok dump 1"
    del meta["checksum"]
    (d / "meta_info").write_text(json.dumps(meta))
    for f in d.iterdir():
        if f.name != "meta_info":
            raw = f.read_bytes()
            f.write_bytes(b"EMBLSOK1" + raw[8:32] + raw[40:])
    b, opt_b = _fresh()
    sok.load(d, [b], opt_b)
    np.testing.assert_array_equal(b.numpy(), a.numpy())


def test_dump_under_a_regular_file_keeps_its_cause(tmp_path, rng):
    a, opt = _trained(rng)
    (tmp_path / "a_file").write_text("x")
    target = tmp_path / "a_file" / "sub" / "ckpt"
    with pytest.raises(RuntimeError, match=rf"dump to {target} failed on rank 0: .*Not a directory") as ei:
        sok.dump(target, [a], opt)
    assert isinstance(ei.value.__cause__, OSError) and ei.value.__cause__.errno == errno.ENOTDIR


def test_dump_onto_a_full_disk_names_the_file_and_keeps_the_previous_dump(tmp_path, rng):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and a mountable tmpfs for a real full disk")
    try:
        a, opt = _trained(rng)
        sok.dump(mnt / "ckpt", [a], opt)                              # the previous version
        big = sok.Variable(np.ones((20_000, 16), np.float32), name="a")   # 1.3 MB per array
        with pytest.raises(RuntimeError, match=r"failed on rank 0: .*cannot write .*ckpt.tmp-.*No space left") as ei:
            sok.dump(mnt / "ckpt", [big])
        assert ei.value.__cause__.errno == errno.ENOSPC
        b, opt_b = _fresh()
        sok.load(mnt / "ckpt", [b], opt_b)
        np.testing.assert_array_equal(b.numpy(), a.numpy())
        assert sorted(p.name for p in mnt.iterdir()) == ["ckpt"]
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_two_workers_the_writing_rank_keeps_its_cause_the_other_names_it(tmp_path):
    (tmp_path / "a_file").write_text("x")
    cmd = [sys.executable, "-m", "embedlab.sok.launch", "-n", "2", "--timeout", "120", "--collective-timeout", "30",
           os.path.join(HERE, "dump_fail_job.py"), str(tmp_path)]
    p = subprocess.run(cmd, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True, text=True,
                       timeout=150)
    assert p.returncode == 0, p.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["error"] == "RuntimeError" and r0["cause_errno"] == errno.ENOTDIR, r0
    assert "failed on rank 0: " in r0["message"] and "Not a directory" in r0["message"], r0
    assert r1["error"] == "RuntimeError" and r1["cause"] is None, r1
    assert "failed on rank 0 (ENOTDIR: Not a directory; that rank raised the full error)" in r1["message"], r1


_KILLED_DUMP = r"""
import os, sys, numpy as np
import embedlab.sok as sok
from embedlab.sok import checkpoint as ck
sok.init()
v = sok.Variable(np.ones((64, 4), np.float32), name="t")
real = ck._write_array
def write_then_hang(path, a):
    real(path, a)
    print(path.parent, flush=True)
    import time; time.sleep(600)
ck._write_array = write_then_hang
sok.dump(sys.argv[1], [v])
"""


def test_temporary_of_a_killed_dump_is_removed_by_the_next_dump(tmp_path, rng, caplog):
    target = tmp_path / "ckpt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TF_CPP_MIN_LOG_LEVEL="3")
    p = subprocess.Popen([sys.executable, "-c", _KILLED_DUMP, str(target)], stdout=subprocess.PIPE, text=True, env=env)
    tmp = p.stdout.readline().strip()
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert tmp and os.path.basename(tmp).startswith(".ckpt.tmp-") and os.path.isdir(tmp)
    a, opt = _trained(rng)
    with caplog.at_level("WARNING", logger="embedlab.io"):
        sok.dump(target, [a], opt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert f"removed {tmp}" in caplog.text

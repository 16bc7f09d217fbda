"""embedlab.tables: where large CPU tables live (2 MiB-aligned mappings on huge pages), and that
nothing else changes: values, lookups, training, assign (TensorFlow's snapshot semantics),
checkpoints, memory release."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from embedlab import tables, ops  # noqa: E402
from embedlab import optimizers as eopt  # noqa: E402

A = tables.ALIGNMENT
ROWS, DIM = 1 << 20, 8      # 32 MiB: the smallest table that gets a mapping of its own


def _table(rng, rows=ROWS, dim=DIM):
    return rng.uniform(-1, 1, (rows, dim)).astype(np.float32)


def _ids(rng, rows=ROWS):
    return tf.RaggedTensor.from_row_lengths(rng.integers(0, rows, 300), [1, 2, 3] * 50)


def _lookup(v, ids):
    return ops.fused_embedding_lookup([v], [ids], "sum")[0].numpy()


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _vm_flags(addr):
    """The VmFlags of the mapping that holds addr (/proc/self/smaps)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                inside = lo <= addr < hi
            elif inside and head[0] == "VmFlags:":
                return head[1:]
    return []


def _thp_enabled():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def test_aligned_copies_values_into_an_aligned_huge_page_mapping(rng):
    x = _table(rng)
    t = tables.aligned(tf.constant(x))
    v = tf.Variable(t)
    del t
    assert tables.address(v) % A == 0                       # the variable adopted the aligned buffer
    assert v.numpy().tobytes() == x.tobytes()
    if _thp_enabled() and os.environ.get("EMBEDLAB_HUGE_PAGES", "1") not in ("0", "off"):
        assert "hg" in _vm_flags(tables.address(v))         # advised MADV_HUGEPAGE


def test_aligned_leaves_small_and_other_tables_as_they_are(rng):
    small = tf.constant(_table(rng, 1000, 4))
    assert tables.aligned(small) is small
    ints = tf.zeros([ROWS, DIM], tf.int32)
    assert tables.aligned(ints) is ints


def test_aligned_gives_the_variable_a_buffer_of_its_own(rng):
    """Even from a 2 MiB-aligned NumPy buffer seen through DLPack: a buffer TensorFlow does not own
    would be copied into TensorFlow's allocator at the first sparse update."""
    raw = np.empty(ROWS * DIM + A // 4, np.float32)
    skip = (-raw.__array_interface__["data"][0] % A) // 4
    x = raw[skip:skip + ROWS * DIM].reshape(ROWS, DIM)
    x[:] = _table(rng)
    v = tf.Variable(tables.aligned(tf.experimental.dlpack.from_dlpack(x.__dlpack__())))
    addr = tables.address(v)
    assert addr % A == 0 and addr != x.__array_interface__["data"][0]
    sgd = eopt.SGD(learning_rate=0.1)
    sgd.build([v])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(ops.fused_embedding_lookup([v], [_ids(rng)], "sum", optimizer=sgd)[0])
    tape.gradient(loss, [v])
    assert tables.address(v) == addr


def test_lookups_read_aligned_tables_with_the_same_bits(rng):
    x = _table(rng)
    plain, placed = tf.Variable(x), tf.Variable(tables.aligned(x))
    assert tables.address(placed) % A == 0
    ids = _ids(rng)
    for _ in range(3):                                    # and the lookups leave both where they are
        assert _lookup(plain, ids).tobytes() == _lookup(placed, ids).tobytes()
    assert tables.address(placed) % A == 0


def test_assign_keeps_the_mapping_and_tensorflows_snapshot_semantics(rng):
    x, y, z = _table(rng), _table(rng), _table(rng)
    v = tf.Variable(tables.aligned(x))
    addr = tables.address(v)
    tables.assign(v, y)                       # no one else holds it: copied in place
    assert tables.address(v) == addr
    assert v.numpy().tobytes() == y.tobytes()

    held = v.value()                           # a read holds the buffer: a new mapping, the read keeps y
    view = np.from_dlpack(_Capsule(tf.experimental.dlpack.to_dlpack(v.value())))
    tables.assign(v, z)
    assert tables.address(v) != addr and tables.address(v) % A == 0
    assert held.numpy().tobytes() == view.tobytes() == y.tobytes()
    assert v.numpy().tobytes() == z.tobytes()

    with pytest.raises(ValueError, match="shape"):
        tables.assign(v, x[:-1])
    small = tf.Variable(np.zeros((4, 2), np.float32))   # small tables: TensorFlow's assign
    tables.assign(small, np.ones((4, 2), np.float32))
    assert small.numpy().sum() == 8


class _Capsule:
    def __init__(self, c):
        self.c = c

    def __dlpack__(self, stream=None, **_):
        return self.c

    def __dlpack_device__(self):
        return (1, 0)


def test_training_keeps_tables_aligned_and_trains_the_same_bits(rng):
    x = _table(rng)
    v, ref = tf.Variable(tables.aligned(x)), tf.Variable(x)
    ids = _ids(rng)
    for var in (v, ref):
        sgd = eopt.SGD(learning_rate=0.1)
        sgd.build([var])
        for _ in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(ops.fused_embedding_lookup([var], [ids], "sum", optimizer=sgd)[0] ** 2)
            tape.gradient(loss, [var])
    assert tables.address(v) % A == 0
    assert v.numpy().tobytes() == ref.numpy().tobytes()
    adam = eopt.Adam(0.01)                     # IndexedSlices gradients, then the sparse update op
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(ops.fused_embedding_lookup([v], [ids], "sum")[0])
    adam.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    assert tables.address(v) % A == 0


def test_zeros_is_a_fresh_mapping_that_nothing_touched(rng):
    """`zeros` gives a large table a mapping of its own that is zero as mapped: no copy, no page
    touched until written; small tables come as tf.zeros gives them; a bad shape is refused."""
    gc.collect()
    base = _rss()
    v = tf.Variable(tables.zeros([ROWS * 4, DIM]))                  # 128 MiB
    assert _rss() - base < 16 << 20                                    # nothing faulted in
    assert tables.address(v) % A == 0
    assert not tf.reduce_any(v != 0.0).numpy()
    ids = _ids(rng)
    x = _table(rng, 150, DIM)
    w = tf.Variable(tf.zeros([ROWS * 4, DIM]))
    for var in (v, w):                                                 # trained like tf.zeros' table
        sgd = eopt.SGD(0.5)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(ops.fused_embedding_lookup([var], [ids], "sum", optimizer=sgd)[0] * x)
        tape.gradient(loss, [var])
    assert v.numpy().tobytes() == w.numpy().tobytes() and v.numpy().any()
    assert tables.address(v) % A == 0
    small = tables.zeros([1000, 4])
    assert small.shape == (1000, 4) and not small.numpy().any()
    with pytest.raises(ValueError, match=r"shape must be \[rows, dim\]"):
        tables.zeros([4, 4, 4])


def test_assign_op_refuses_another_shape_or_dtype_and_changes_nothing(rng):
    """The op itself (under the Python wrapper's checks) refuses a value of another shape, or a
    variable of another dtype, naming both, and leaves the table as it was."""
    import embedlab
    x = _table(rng)
    v = tf.Variable(tables.aligned(x))
    addr = tables.address(v)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"EmbedLabAssignTable: value of shape \[%d,%d\] "
                       r"for a variable of shape \[%d,%d\]" % (ROWS * 2, DIM // 2, ROWS, DIM)):
        embedlab.tf_ops().embed_lab_assign_table(v.handle, tf.zeros([ROWS * 2, DIM // 2]))
    d = tf.Variable(tf.zeros([ROWS, DIM], tf.float64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="value of dtype float for a variable of dtype double"):
        embedlab.tf_ops().embed_lab_assign_table(d.handle, tf.zeros([ROWS, DIM]))
    assert tables.address(v) == addr and v.numpy().tobytes() == x.tobytes()
    assert d.dtype == tf.float64 and not d.numpy().any()


def test_checkpoints_restore_values_and_place_by_path(rng, tmp_path):
    """tf.train.Checkpoint restores the values; its assign takes TensorFlow's buffer, and
    `tables.assign` of the restored value puts the table back."""
    x = _table(rng)
    v = tf.Variable(tables.aligned(x))
    path = tf.train.Checkpoint(t=v).save(str(tmp_path / "ckpt"))
    tables.assign(v, np.zeros_like(x))
    tf.train.Checkpoint(t=v).restore(path)
    assert v.numpy().tobytes() == x.tobytes()
    tables.assign(v, v.read_value())
    assert tables.address(v) % A == 0 and v.numpy().tobytes() == x.tobytes()


def test_memory_is_released_with_the_variable(rng):
    gc.collect()
    base = _rss()
    vs = [tf.Variable(tables.aligned(tf.fill([ROWS * 2, DIM], 1.0))) for _ in range(4)]   # 4 x 64 MiB
    assert all(tables.address(v) % A == 0 for v in vs)
    created = _rss()
    assert created - base > 0.8 * 4 * (64 << 20)
    for v in vs:                               # assigning in place holds no second copy
        before = tables.address(v)
        tables.assign(v, tf.fill([ROWS * 2, DIM], 2.0))
        assert tables.address(v) == before
    assigned = _rss()
    assert assigned - created < 1.5 * (64 << 20)
    del vs, v
    gc.collect()
    assert assigned - _rss() > 0.9 * 4 * (64 << 20)     # the four mappings went back to the system


def test_aligned_tables_off_keeps_tensorflows_buffers():
    """EMBEDLAB_ALIGNED_TABLES=0: neither `aligned` nor `assign` puts a table in a mapping (the
    setting is read once per process, hence a child process)."""
    code = textwrap.dedent("""
        import numpy as np, tensorflow as tf
        from embedlab import tables, ops
        x = np.ones((1 << 20, 8), np.float32)
        v = tf.Variable(tables.aligned(x))
        ids = tf.RaggedTensor.from_row_lengths(np.arange(6, dtype=np.int64), [1, 2, 3])
        tables.assign(v, x * 2)
        out = ops.fused_embedding_lookup([v], [ids], "sum")[0].numpy()
        assert out[2, 0] == 6.0
        z = tf.Variable(tables.zeros(x.shape))
        assert not z.numpy().any()
        print(tables.address(v) % tables.ALIGNMENT != 0 and tables.address(z) % tables.ALIGNMENT != 0)
    """)
    env = dict(os.environ, EMBEDLAB_ALIGNED_TABLES="0", TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "True"


def test_assign_to_a_mirrored_variable_writes_every_copy():
    """A variable of a tf.distribute strategy keeps one copy per replica, and its `handle` outside
    a replica is the first copy's: `assign` gives it the strategy's own assign, which writes every
    copy (two logical CPUs, set before TensorFlow starts, hence a child process)."""
    code = textwrap.dedent("""
        import numpy as np, tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        from embedlab import tables
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            v = tf.Variable(tf.zeros([1 << 20, 8]))
        x = np.random.default_rng(0).uniform(-1, 1, (1 << 20, 8)).astype(np.float32)
        tables.assign(v, x)
        print([c.numpy().tobytes() == x.tobytes() for c in strategy.experimental_local_results(v)])
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[True, True]"

"""sok.DynamicVariable is read and written BY KEY on every path, as SOK's is, and has SOK's
public surface. One worker; every path in eager and in tf.function, with keys 0, small, 2**40,
2**63-1, -1, duplicates and an empty key tensor. The paths that would need a dense,
positional value raise NotImplementedError naming the path and what to use instead."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import embedlab.sok as sok

BIG = 2**63 - 1
KEYS = [0, 7, 2**40, BIG, -1, 7, 0]          # duplicates included; -1 is a key like any other here


@pytest.fixture(scope="module", autouse=True)
def one_worker():
    sok.init()


def _modes():
    return [pytest.param(lambda f: f, id="eager"), pytest.param(tf.function, id="tf.function")]


def _k(keys):
    return tf.constant(np.asarray(keys, np.int64).reshape(np.shape(keys)), tf.int64)


def _trained_like_the_issue():
    """The issue's table: keys 5, 3, 100 trained with gradients 1, 2, 3 (SGD 1.0) from 0."""
    v = sok.DynamicVariable(dimension=2, initializer="0", init_capacity=8)
    opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=1.0))
    ids = tf.ragged.constant([[5], [3], [100]], dtype=tf.int64)
    with tf.GradientTape() as tape:
        emb = sok.lookup_sparse([v], [ids], combiners=["sum"])[0]
        loss = tf.reduce_sum(emb * tf.constant([[1.0], [2.0], [3.0]]))
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    return v


def test_issue_snippet_reads_by_key():
    v = _trained_like_the_issue()
    keys, rows = sok.export(v)
    got = dict(zip(keys.numpy().tolist(), rows.numpy().tolist()))
    assert got == {5: [-1.0, -1.0], 3: [-2.0, -2.0], 100: [-3.0, -3.0]}
    np.testing.assert_array_equal(tf.nn.embedding_lookup(v, tf.constant([3, 5], tf.int64)), [[-2, -2], [-1, -1]])
    np.testing.assert_array_equal(tf.nn.embedding_lookup(v, tf.constant([2**40], tf.int64)), [[0, 0]])
    np.testing.assert_array_equal(tf.nn.embedding_lookup(v, tf.constant([100, 2**40], tf.int64)),
                                  [[-3, -3], [0, 0]])


def _table(initializer="0.5", dim=3):
    """A table with keys 0 and 2**40 set; every other key reads the initializer's value."""
    v = sok.DynamicVariable(dimension=dim, initializer=initializer, init_capacity=4)
    set_rows = {0: np.arange(dim, dtype=np.float32) + 1, 2**40: -np.arange(dim, dtype=np.float32) - 10}
    sok.assign(v, list(set_rows), np.stack(list(set_rows.values())))
    return v, set_rows


def _expected(keys, set_rows, fill, dim=3):
    return np.stack([set_rows.get(k, np.full(dim, fill, np.float32)) for k in np.asarray(keys).reshape(-1).tolist()]
                    ).reshape(list(np.shape(keys)) + [dim]) if np.size(keys) else np.zeros([0, dim], np.float32)


READERS = {
    "tf.gather": lambda v, k: tf.gather(v, k),
    "tf.nn.embedding_lookup": lambda v, k: tf.nn.embedding_lookup(v, k),
    "tf.nn.embedding_lookup([v])": lambda v, k: tf.nn.embedding_lookup([v], k),
    "tf.compat.v1.nn.embedding_lookup": lambda v, k: tf.compat.v1.nn.embedding_lookup(v, k),
    "sparse_read": lambda v, k: v.sparse_read(k),
}


@pytest.mark.parametrize("mode", _modes())
@pytest.mark.parametrize("reader", list(READERS))
def test_every_gather_path_reads_by_key(mode, reader):
    v, set_rows = _table()
    read = mode(READERS[reader])
    np.testing.assert_array_equal(read(v, _k(KEYS)), _expected(KEYS, set_rows, 0.5))
    two_d = [[BIG, 3], [2**40, 0]]
    np.testing.assert_array_equal(read(v, _k(two_d)), _expected(two_d, set_rows, 0.5))
    empty = read(v, tf.zeros([0], tf.int64))
    assert empty.shape == (0, 3)
    # int32 keys are keys too (SOK casts them)
    np.testing.assert_array_equal(read(v, tf.constant([0, 5], tf.int32)), _expected([0, 5], set_rows, 0.5))
    # unseen keys were inserted with the initializer's value, as SOK does: the size counts them
    assert int(v.size[0]) == len({0, 7, 2**40, BIG, -1, 3, 5})


@pytest.mark.parametrize("mode", _modes())
def test_embedding_lookup_sparse_reads_by_key(mode):
    v, set_rows = _table()
    sp = tf.SparseTensor(indices=[[0, 0], [0, 1], [1, 0], [3, 0], [3, 1]], values=tf.constant([0, BIG, 2**40, 7, 7], tf.int64),
                         dense_shape=[4, 2])
    w = tf.SparseTensor(sp.indices, tf.constant([1.0, 2.0, 0.5, 1.0, 3.0]), sp.dense_shape)
    out = mode(lambda: tf.nn.embedding_lookup_sparse(v, sp, w, combiner="sum"))()
    e = lambda k: _expected([k], set_rows, 0.5)[0]  # noqa: E731
    want = [e(0) + 2 * e(BIG), 0.5 * e(2**40), np.zeros(3), 4 * e(7)]
    np.testing.assert_allclose(out, np.stack(want), rtol=1e-6)
    safe = mode(lambda: tf.nn.safe_embedding_lookup_sparse(v, sp, w, combiner="sum"))()
    np.testing.assert_allclose(safe, np.stack(want), rtol=1e-6)


@pytest.mark.parametrize("mode", _modes())
def test_scatter_methods_write_by_key(mode):
    v, set_rows = _table()
    keys = _k([BIG, 0, 9])
    delta = tf.constant([[1.0, 1, 1], [2, 2, 2], [3, 3, 3]])
    def run(method, delta, keys):   # SOK's scatter methods return an op (None eagerly)
        mode(lambda: [getattr(v, method)(tf.IndexedSlices(delta, keys)), None][1])()

    run("scatter_add", delta, keys)
    want = {BIG: 0.5 + 1, 0: set_rows[0] + 2, 9: 0.5 + 3}
    run("scatter_sub", tf.ones([2, 3]), _k([9, 2**40]))
    want[9] = want[9] - 1
    want[2**40] = set_rows[2**40] - 1
    run("scatter_update", tf.fill([1, 3], 42.0), _k([7]))
    want[7] = 42.0
    got = tf.nn.embedding_lookup(v, _k(list(want)))
    np.testing.assert_allclose(got, np.stack([np.broadcast_to(np.float32(x), (3,)) for x in want.values()]))
    with pytest.raises(TypeError, match="IndexedSlices"):
        v.scatter_add(tf.ones([1, 3]))
    with pytest.raises(ValueError, match="values of shape"):
        v.scatter_update(tf.IndexedSlices(tf.ones([2, 4]), _k([1, 2])))


def test_training_through_embedding_lookup_matches_a_tf_variable(rng):
    """SOK's own dynamic_variable_test: the table read with tf.nn.embedding_lookup and trained
    with OptimizerWrapper equals a tf.Variable trained by the same optimizer on the same rows."""
    universe = np.array([0, 3, 2**40, BIG, -5, 123456789], np.int64)
    for make in (lambda: tf.keras.optimizers.SGD(learning_rate=0.5, momentum=0.9),
                 lambda: tf.keras.optimizers.Adagrad(learning_rate=0.5)):
        v = sok.DynamicVariable(dimension=4, initializer="random", init_capacity=2)
        opt = sok.OptimizerWrapper(make())
        ref = tf.Variable(tf.nn.embedding_lookup(v, tf.constant(universe)))
        ref_opt = make()

        def sok_step(pos, w):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.nn.embedding_lookup(v, tf.gather(tf.constant(universe), pos)) * w)
            opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

        def ref_step(pos, w):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.nn.embedding_lookup(ref, pos) * w)
            ref_opt.apply_gradients(zip(tape.gradient(loss, [ref]), [ref]))

        graph_step = tf.function(sok_step)
        for i in range(6):
            pos = tf.constant(rng.integers(0, len(universe), size=5), tf.int64)
            w = tf.constant(rng.normal(size=(5, 4)).astype(np.float32))
            (sok_step if i % 2 else graph_step)(pos, w)
            ref_step(pos, w)
        np.testing.assert_allclose(tf.nn.embedding_lookup(v, tf.constant(universe)), ref.numpy(), rtol=1e-5, atol=1e-6)


DENSE_PATHS = {
    "read_value": lambda v: v.read_value(),
    "value": lambda v: v.value(),
    "tf.convert_to_tensor": lambda v: tf.convert_to_tensor(v),
    "tf.identity": lambda v: tf.identity(v),
    "operator +": lambda v: v + 1.0,
    "tf.reduce_sum": lambda v: tf.reduce_sum(v),
    "tf.print": lambda v: tf.print(v),
    "indexing": lambda v: v[0],
    "gather_nd": lambda v: v.gather_nd([[0]]),
    "tf.gather axis=1": lambda v: tf.gather(v, [0], axis=1),
    "partitioned embedding_lookup": lambda v: tf.nn.embedding_lookup([v, v], tf.constant([0, 1], tf.int64)),
    "assign": lambda v: v.assign(tf.zeros([4, 3])),
    "assign_add": lambda v: v.assign_add(tf.zeros([4, 3])),
    "assign_sub": lambda v: v.assign_sub(tf.zeros([4, 3])),
    "scatter_max": lambda v: v.scatter_max(tf.IndexedSlices(tf.zeros([1, 3]), _k([0]))),
    "scatter_nd_update": lambda v: v.scatter_nd_update([[0]], tf.zeros([1, 3])),
    "batch_scatter_update": lambda v: v.batch_scatter_update(tf.IndexedSlices(tf.zeros([1, 3]), _k([0]))),
}


@pytest.mark.parametrize("mode", _modes())
@pytest.mark.parametrize("path", list(DENSE_PATHS))
def test_positional_paths_raise_naming_what_to_use(mode, path):
    v, _ = _table()
    with pytest.raises(NotImplementedError, match="DynamicVariable .*(by key|sok.assign|sok.export|embedding_lookup)"):
        mode(lambda: DENSE_PATHS[path](v))()


@pytest.mark.parametrize("path", ["numpy", "np.asarray", "initial_value", "int"])
def test_eager_only_positional_paths_raise(path):
    v, _ = _table()
    with pytest.raises(NotImplementedError, match="DynamicVariable"):
        {"numpy": lambda: v.numpy(), "np.asarray": lambda: np.asarray(v), "initial_value": lambda: v.initial_value,
         "int": lambda: int(v)}[path]()


def test_public_surface_matches_sok():
    v = sok.DynamicVariable(dimension=5, initializer="13", var_type="hybrid", init_capacity=64, max_capacity=1024,
                            name="surface")
    assert v.dimension == 5 and v.key_type == tf.int64 and v.handle_dtype == tf.float32 and v.dtype == tf.float32
    assert v.backend_type == "hybrid" and v.initializer_str == "13" and v.mode == "distributed"
    assert v.target_gpu == -1 and v.num_gpus == 1 and v.indices is None and not v.is_static()
    assert v.config_dict == {"init_capacity": 64, "max_capacity": 1024}
    assert v.name.startswith("surface") and v.shape.as_list() == [None, 5] and v.trainable
    assert v.handle.dtype == tf.resource
    assert v.size.dtype == tf.int32 and v.size.numpy().tolist() == [0, 5]
    tf.nn.embedding_lookup(v, _k([1, 2**40, 1]))
    assert v.size.numpy().tolist() == [2, 5]
    assert tf.function(lambda: v.size)().numpy().tolist() == [2, 5]
    k = _k([3, 4])
    assert v.key_map(k) is k
    assert "surface" in repr(v) and "13" not in repr(v).split("initializer")[0]
    with pytest.raises(NotImplementedError, match="to_static"):
        v.to_static(_k([1]))
    with pytest.raises(NotImplementedError, match="to_dynamic"):
        v.to_dynamic()
    loc = sok.DynamicVariable(dimension=2, mode="localized:0", key_type=tf.int32)
    assert loc.target_gpu == 0 and loc.mode == "localized:0" and loc.key_type == tf.int32
    default = sok.DynamicVariable(dimension=2)
    assert default.backend_type == "hbm" and default.initializer_str == "random"
    # positional order of SOK's signature: (dimension, initializer, var_type, name, ...)
    pos = sok.DynamicVariable(2, "0.5", "hbm", "by_position")
    assert pos.name.startswith("by_position") and pos.backend_type == "hbm"
    np.testing.assert_array_equal(tf.nn.embedding_lookup(pos, _k([11])), [[0.5, 0.5]])
    with pytest.raises(ValueError, match="var_type must be 'hbm' or 'hybrid'"):
        sok.DynamicVariable(dimension=2, var_type="ssd")
    with pytest.raises(TypeError, match="unknown option 'bogus'"):
        sok.DynamicVariable(dimension=2, bogus=1)
    with pytest.raises(NotImplementedError, match="constraint"):
        sok.DynamicVariable(dimension=2, constraint=lambda x: x)


def test_checkpoint_round_trip_is_by_key(tmp_path):
    v = _trained_like_the_issue()
    opt_keys = [5, 3, 100]
    ck = tf.train.Checkpoint(table=v)
    path = ck.save(tmp_path / "ck")
    # a table that saw other keys first (so every row index differs) restores by key
    w = sok.DynamicVariable(dimension=2, initializer="0", init_capacity=2)
    w.scatter_update(tf.IndexedSlices(tf.fill([4, 2], 9.0), _k([100, 77, BIG, 3])))
    tf.train.Checkpoint(table=w).restore(path).assert_consumed()
    np.testing.assert_array_equal(tf.nn.embedding_lookup(w, _k(opt_keys)), [[-1, -1], [-2, -2], [-3, -3]])
    np.testing.assert_array_equal(tf.nn.embedding_lookup(w, _k([77, BIG])), [[0, 0], [0, 0]])   # not in the checkpoint
    keys, _ = sok.export(w)
    assert sorted(keys.numpy().tolist()) == sorted(opt_keys + [77, BIG])
    # the restored table keeps training by key
    w.scatter_sub(tf.IndexedSlices(tf.ones([1, 2]), _k([5])))
    np.testing.assert_array_equal(tf.nn.embedding_lookup(w, _k([5])), [[-2, -2]])
    with pytest.raises(ValueError, match="dimension 2 .*dimension 3|has dim"):
        tf.train.Checkpoint(table=sok.DynamicVariable(dimension=3)).restore(path).assert_consumed()


def test_saved_model_raises(tmp_path):
    v, _ = _table()
    m = tf.Module()
    m.table = v
    with pytest.raises(NotImplementedError, match="SavedModel.*sok.dump"):
        tf.saved_model.save(m, str(tmp_path / "sm"))


def test_dump_load_and_export_keep_extreme_keys(tmp_path):
    v, set_rows = _table()
    tf.nn.embedding_lookup(v, _k([BIG, -1]))
    sok.dump(tmp_path / "d", [v])
    w = sok.DynamicVariable(dimension=3, initializer="0.5", name=v.table_name)
    sok.load(tmp_path / "d", [w])
    keys = [0, 2**40, BIG, -1, 12]
    np.testing.assert_array_equal(tf.nn.embedding_lookup(w, _k(keys)), _expected(keys, set_rows, 0.5))
    k, rows = sok.export(w)
    assert k.numpy().tolist() == sorted(k.numpy().tolist())          # ascending keys, as SOK exports
    assert set(k.numpy().tolist()) == set(keys)


def test_not_a_keras_weight():
    """A DynamicVariable held by a Keras layer is not among its weights (get_weights would give
    rows by position); it is trained through the tape and OptimizerWrapper."""
    v, _ = _table()

    class Holder(tf.keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.table = v

        def call(self, keys):
            return tf.nn.embedding_lookup(self.table, keys)

    layer = Holder()
    out = layer(_k([0]))
    np.testing.assert_array_equal(out, [[1, 2, 3]])
    assert layer.get_weights() == [] and layer.weights == []


def test_embedlab_ops_refuse_a_dynamic_variable():
    """embedlab.ops reads tables by row index; a DynamicVariable is refused (it would give the
    rows of other keys), and sok.lookup_sparse over it still trains by key."""
    import embedlab.ops as eops
    v = _trained_like_the_issue()
    with pytest.raises(ValueError, match="tables\\[0\\] is an embedlab.sok.DynamicVariable.*by key"):
        eops.embedding_lookup(v, tf.ragged.constant([[0]], dtype=tf.int64))
    out = sok.lookup_sparse([v], [tf.ragged.constant([[3, 5], [2**40]], dtype=tf.int64)], combiners=["sum"])[0]
    np.testing.assert_array_equal(out, [[-3, -3], [0, 0]])


_TWO_WORKER_JOB = r'''
import os, sys, json
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf
import embedlab.sok as sok

ctx = sok.init()
rank, world = ctx.rank, ctx.world_size
BIG = 2**63 - 1
v = sok.DynamicVariable(dimension=2, initializer="0", init_capacity=2, name="dyn2")
opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=1.0))
keys = np.array([0, 1, 2, 3, 2**40, 2**40 + 1, BIG, -1 - 2], np.int64)
ids = tf.ragged.constant([keys[rank::world].tolist()], dtype=tf.int64)   # each rank sends half
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(sok.lookup_sparse([v], [ids], combiners=["sum"])[0] * float(rank + 1))
opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
# every key got the gradient of the one rank that sent it: -(sender + 1)
mine = keys[np.mod(keys, world) == rank]
out = {"rank": rank, "mine": mine.tolist(),
       "eager": tf.nn.embedding_lookup(v, tf.constant(mine)).numpy().tolist(),
       "graph": tf.function(lambda k: tf.gather(v, k))(tf.constant(mine)).numpy().tolist(),
       "export": dict(zip(map(str, sok.export(v)[0].numpy().tolist()), sok.export(v)[1].numpy()[:, 0].tolist()))}
foreign = int(keys[np.mod(keys, world) != rank][0])
for name, f in {"eager": lambda: tf.nn.embedding_lookup(v, tf.constant([foreign])),
                "graph": lambda: tf.function(lambda k: tf.nn.embedding_lookup(v, k))(tf.constant([foreign]))}.items():
    try:
        f()
        out["foreign_" + name] = "no error"
    except (ValueError, tf.errors.InvalidArgumentError) as e:
        out["foreign_" + name] = str(e)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as fh:
    json.dump(out, fh)
'''


def test_two_workers_read_their_own_keys_and_refuse_others(tmp_path):
    import json
    import os
    import subprocess
    import sys
    job = tmp_path / "job.py"
    job.write_text(_TWO_WORKER_JOB)
    p = subprocess.run([sys.executable, "-m", "embedlab.sok.launch", "-n", "2", "--timeout", "180", str(job),
                        str(tmp_path)], env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True,
                       text=True, timeout=240)
    assert p.returncode == 0, f"{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    keys = np.array([0, 1, 2, 3, 2**40, 2**40 + 1, BIG, -3], np.int64)
    sender = {int(k): i % 2 for i, k in enumerate(keys)}
    for rank in range(2):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r["mine"] == [int(k) for k in keys if k % 2 == rank]
        want = [[-(sender[k] + 1.0)] * 2 for k in r["mine"]]
        assert r["eager"] == want and r["graph"] == want
        assert r["export"] == {str(k): -(sender[k] + 1.0) for k in r["mine"]}
        for mode in ("eager", "graph"):
            assert "belongs to another worker" in r["foreign_" + mode] and f"this is rank {rank}" in r["foreign_" + mode]


def test_checkpoint_with_optimizer_resumes_training_exactly(tmp_path, rng):
    """Table and OptimizerWrapper's slots in one tf.train.Checkpoint: restored into a table that
    saw other keys first, training goes on to the same rows as without the break."""
    universe = np.array([4, 2**40, BIG, -9, 0], np.int64)
    batches = [tf.constant(rng.choice(universe, size=6), tf.int64) for _ in range(6)]

    def make():
        v = sok.DynamicVariable(dimension=3, initializer="0.25", init_capacity=2)
        return v, sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.3))

    def step(v, opt, keys):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.nn.embedding_lookup(v, keys) - 1.0))
        opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))

    a, opt_a = make()
    for b in batches[:3]:
        step(a, opt_a, b)
    path = tf.train.Checkpoint(table=a, opt=opt_a.optimizer).save(tmp_path / "ck")
    for b in batches[3:]:
        step(a, opt_a, b)
    c, opt_c = make()
    step(c, opt_c, tf.constant([77, 4, 2**41], tf.int64))     # other keys and rows first; builds the slots
    tf.train.Checkpoint(table=c, opt=opt_c.optimizer).restore(path)
    for b in batches[3:]:
        step(c, opt_c, b)
    np.testing.assert_allclose(tf.nn.embedding_lookup(c, tf.constant(universe)),
                               tf.nn.embedding_lookup(a, tf.constant(universe)), rtol=1e-6)
    # an asynchronous checkpoint saves by key too
    ck = tf.train.Checkpoint(table=a)
    apath = ck.save(tmp_path / "async", options=tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True))
    ck.sync()
    d, _ = make()
    tf.train.Checkpoint(table=d).restore(apath).assert_consumed()
    np.testing.assert_array_equal(tf.nn.embedding_lookup(d, tf.constant(universe)),
                                  tf.nn.embedding_lookup(a, tf.constant(universe)))


def test_static_variable_has_soks_attribute_names():
    v = sok.Variable(np.arange(10 * 2, dtype=np.float32).reshape(10, 2), name="static")
    assert v.target_gpu == -1 and v.num_gpus == 1 and v.global_gpu_id == 0 and v.global_shape == [10, 2]
    assert v.key_map(tf.constant([7], tf.int64)).numpy().tolist() == [7]
    loc = sok.Variable(np.zeros((3, 2), np.float32), mode="localized:0")
    assert loc.target_gpu == 0 and loc.key_map(5) == 5


@pytest.mark.parametrize("mode", _modes())
def test_a_gradient_is_not_applied_as_keys(mode):
    """A read's gradient indexes storage rows; a plain Keras optimizer (which calls scatter_sub
    with it) or v.scatter_sub(grad) is refused instead of moving the rows of other keys."""
    v, _ = _table()

    def grad():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(v, _k([2**40, 5])))
        return tape.gradient(loss, v)

    g = grad()
    assert isinstance(g, tf.IndexedSlices) and g.dense_shape is not None
    with pytest.raises(ValueError, match="gradient of a DynamicVariable indexes its storage rows.*OptimizerWrapper"):
        v.scatter_sub(g)
    plain = tf.keras.optimizers.SGD(learning_rate=1.0)
    with pytest.raises(ValueError, match="OptimizerWrapper"):
        mode(lambda: [plain.apply_gradients([(grad(), v)]), None][1])()
    # the same gradient through OptimizerWrapper moves exactly those keys
    sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=1.0)).apply_gradients([(grad(), v)])
    np.testing.assert_array_equal(tf.nn.embedding_lookup(v, _k([2**40, 5, 7])),
                                  [[-11, -12, -13], [-0.5, -0.5, -0.5], [0.5, 0.5, 0.5]])

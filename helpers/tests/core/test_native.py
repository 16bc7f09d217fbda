"""The native libraries: build info, load errors, and the framework-free core module.

The core kernels are checked here through `_embedlab_core` (NumPy in, NumPy out) against a
float64 NumPy oracle, independent of TensorFlow: random sizes, empty rows, -1 padding,
duplicate and Zipf-skewed keys, weights, several thread counts (bitwise equal results).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import reference as ref
from embedlab import _native

def random_csr(rng, batch, rows, max_nnz=5, zipf=False):
    return ref.random_csr(rng, batch, rows, max_nnz=max_nnz, zipf=zipf, zipf_a=1.3)


def test_build_info_reports_the_build():
    info = _native.build_info()
    for key in ("tensorflow_version", "cuda_built", "tf_ops_built", "compiler"):
        assert key in info
    assert isinstance(info["cuda_built"], bool)
    assert info["tf_ops_built"] is True


def _gpu_visible():
    if os.path.exists("/dev/nvidia0"):
        return True
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU " in out.stdout


def test_build_info_says_why_cuda_was_or_was_not_built():
    """EMBEDLAB_CUDA=AUTO builds the CUDA kernels only where they can run (a GPU is visible or
    TensorFlow is a CUDA build); ON always; OFF never. build_info() says which and why."""
    import shutil
    info = _native.build_info()
    assert info["cuda_option"] in ("AUTO", "ON", "OFF")
    assert info["cuda_reason"]
    if info["cuda_option"] == "OFF":
        assert not info["cuda_built"]
    elif info["cuda_option"] == "ON":
        assert info["cuda_built"]  # ON without nvcc fails the build instead
    else:
        import tensorflow as tf
        usable = _gpu_visible() or tf.test.is_built_with_cuda()
        nvcc = shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")
        if not usable:
            assert not info["cuda_built"] and "skipped" in info["cuda_reason"], info
        elif nvcc:
            assert info["cuda_built"], info
    print(f"CUDA kernels built: {info['cuda_built']} ({info['cuda_reason']})")


def test_build_info_names_the_cpu_instruction_sets():
    """AUTO builds the baseline and, on x86-64, the AVX2 and AVX-512 kernels; a process runs the
    widest copy this CPU has (unless EMBEDLAB_CPU_ISA_RUNTIME says otherwise), and both libraries
    report the instruction set that build_info() names."""
    import platform
    info = _native.build_info()
    built = info["cpu_isas_built"]
    assert built[0] == "baseline" and set(built) <= {"baseline", "avx2", "avx512"}, built
    assert info["cpu_isa_option"] in ("AUTO", "BASELINE")
    if info["cpu_isa_option"] == "BASELINE":
        assert built == ["baseline"]
    elif platform.machine() in ("x86_64", "AMD64"):
        assert built == ["baseline", "avx2", "avx512"]
    flags = _native._cpu_flags()
    request = os.environ.get(_native.ISA_ENV, "") or "auto"
    if request == "auto" and flags is not None:
        runs = [isa for isa in built if _native._ISA_FLAGS[isa] <= flags]
        assert info["cpu_isa"] == runs[-1], (info, runs)
    _native.core()
    _native.tf_ops()
    loaded = _native.loaded_cpu_isas()
    assert loaded == {"core": info["cpu_isa"], "tf_ops": info["cpu_isa"]}, loaded
    assert _native.core().cpu_isas_built == ",".join(built)
    print(f"CPU kernels built for {built}, running {info['cpu_isa']}")


def test_cpu_isa_choice_and_its_errors():
    """The choice (best supported unless EMBEDLAB_CPU_ISA_RUNTIME says otherwise), and a clear
    error, before any library loads, for a value the libraries would not honour."""
    both, base = {"cpu_isas_built": "baseline,avx2"}, {"cpu_isas_built": "baseline", "cpu_isa_option": "BASELINE"}
    every = {"cpu_isas_built": "baseline,avx2,avx512"}
    old_cpu, new_cpu = frozenset({"sse2", "avx"}), frozenset({"sse2", "avx", "avx2"})
    wide_cpu = new_cpu | {"avx512f", "avx512bw", "avx512dq", "avx512vl"}
    isa = _native.cpu_isa
    assert isa(both, old_cpu, {}) == "baseline"
    assert isa(both, new_cpu, {}) == "avx2"
    assert isa(both, new_cpu, {_native.ISA_ENV: "auto"}) == "avx2"
    assert isa(both, new_cpu, {_native.ISA_ENV: ""}) == "avx2"
    assert isa(both, new_cpu, {_native.ISA_ENV: "baseline"}) == "baseline"
    assert isa(both, new_cpu, {_native.ISA_ENV: "avx2"}) == "avx2"
    assert isa(base, new_cpu, {}) == "baseline"
    assert isa(every, old_cpu, {}) == "baseline"
    assert isa(every, new_cpu, {}) == "avx2"
    assert isa(every, new_cpu | {"avx512f", "avx512vl"}, {}) == "avx2"  # F and VL alone are not enough
    assert isa(every, wide_cpu, {}) == "avx512"
    assert isa(every, wide_cpu, {_native.ISA_ENV: "avx512"}) == "avx512"
    assert isa(every, wide_cpu, {_native.ISA_ENV: "avx2"}) == "avx2"
    assert isa(every, wide_cpu, {_native.ISA_ENV: "baseline"}) == "baseline"
    assert isa(both, wide_cpu, {}) == "avx2"
    with pytest.raises(_native.NativeLibraryError, match="EMBEDLAB_CPU_ISA_RUNTIME=avx2 but this CPU has no AVX2"):
        isa(both, old_cpu, {_native.ISA_ENV: "avx2"})
    with pytest.raises(_native.NativeLibraryError,
                       match="EMBEDLAB_CPU_ISA_RUNTIME=avx512 but this CPU has no AVX-512 F/BW/DQ/VL"):
        isa(every, new_cpu | {"avx512f"}, {_native.ISA_ENV: "avx512"})
    with pytest.raises(_native.NativeLibraryError, match=r"built for baseline only \(EMBEDLAB_CPU_ISA=BASELINE\).*"
                                                         r"EMBEDLAB_CPU_ISA=AUTO.*make setup"):
        isa(base, new_cpu, {_native.ISA_ENV: "avx2"})
    with pytest.raises(_native.NativeLibraryError, match=r"built for baseline, avx2 only"):
        isa(both, wide_cpu, {_native.ISA_ENV: "avx512"})
    for bad in ("Baseline", "sse2", " avx2", "AVX512", "avx512f"):
        with pytest.raises(_native.NativeLibraryError, match="must be auto, baseline, avx2 or avx512"):
            isa(every, wide_cpu, {_native.ISA_ENV: bad})
    with pytest.raises(_native.NativeLibraryError, match="names no CPU kernels this version knows.*make setup"):
        isa({"cpu_isa": "avx2"}, new_cpu, {})  # build info of another version: rebuild


def test_a_bad_cpu_isa_request_stops_the_libraries_from_loading():
    """Neither library loads under a request it would not honour (a library alone would run
    other kernels than asked, so the check sits in front of both)."""
    out = _load_in_child(["core", "tf_ops"], EMBEDLAB_CPU_ISA_RUNTIME="sse4")
    lines = out.splitlines()
    assert sum(line.startswith("ERR") and "must be auto, baseline, avx2 or avx512" in line for line in lines) == 2, out
    assert "IMPORTED []" in out, out


def _load_in_child(loaders, **env) -> str:
    """Calls each of embedlab._native's `loaders` in a fresh process with `env` added; its output:
    a line 'LOADED name' or 'ERR name message' per loader, then 'IMPORTED [native modules]'."""
    code = (
        "import embedlab._native as n\n"
        f"for load in ({', '.join('n.' + x for x in loaders)},):\n"
        "    try:\n"
        "        load()\n"
        "        print('LOADED', load.__name__)\n"
        "    except n.NativeLibraryError as e:\n"
        "        print('ERR', load.__name__, e)\n"
        "import sys\n"
        "print('IMPORTED', sorted(m for m in sys.modules if m.startswith('embedlab._embedlab')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, **env))
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _isa_workload(seed: int, out_path: str) -> None:
    """Lookups, backward passes and optimizer steps through both libraries, with a fixed seed;
    writes every result (and which kernels each library ran) to out_path (.npz). Run in a fresh
    process per instruction set by test_every_built_copy_gives_the_baseline_bits."""
    import tensorflow as tf
    from embedlab import ops
    from embedlab import optimizers as eopt

    rng = np.random.default_rng(seed)
    core = _native.core()
    res = {}
    dims = (1, 4, 7, 8, 16, 33, 64, 128)  # the fixed widths the kernels unroll, and odd ones
    tables = [rng.standard_normal((int(rng.integers(20, 400)), d)).astype(np.float32) for d in dims]
    for combiner in ("sum", "mean"):
        for weighted in (False, True):
            tag = f"{combiner}_{'w' if weighted else 'u'}"
            csr = [random_csr(rng, int(rng.integers(1, 90)), len(t), zipf=bool(i % 2)) for i, t in enumerate(tables)]
            wts = [rng.uniform(0.1, 2.0, size=len(k)).astype(np.float32) for _, k in csr] if weighted else None
            outs = [np.empty((len(o) - 1, t.shape[1]), np.float32) for (o, _), t in zip(csr, tables)]
            core.lookup_forward(tables, [o for o, _ in csr], [k for _, k in csr], wts, [combiner] * len(tables),
                                outs, num_threads=2)
            for t, (table, (o, k), out) in enumerate(zip(tables, csr, outs)):
                w = wts[t] if weighted else None
                res[f"core_fwd_{tag}_{t}"] = out
                rows = np.repeat(np.arange(len(o) - 1), np.diff(o))
                coo_out = np.empty_like(out)
                core.lookup_forward_coo(table, np.stack([rows, np.zeros_like(rows)], 1), k, w, len(o) - 1, combiner,
                                        coo_out, num_threads=2)
                res[f"core_coo_{tag}_{t}"] = coo_out
                g = rng.standard_normal(out.shape).astype(np.float32)
                uk, gr = core.lookup_backward(o, k, w, combiner, g, len(table), num_threads=2)
                res[f"core_bwd_keys_{tag}_{t}"], res[f"core_bwd_rows_{tag}_{t}"] = uk, gr
                for opt in ("sgd", "adagrad", "adam"):
                    tb, acc = table.copy(), np.full_like(table, 0.1)
                    m, v = np.zeros_like(table), np.zeros_like(table)
                    for step in (1, 2, 3):
                        core.lookup_backward_apply(tb, o, k, w, combiner, g * step, opt, 0.05, accumulator=acc, m=m,
                                                   v=v, step=step, num_threads=2)
                    res[f"core_fused_{opt}_{tag}_{t}"] = tb
                    if len(uk) == 0:
                        continue
                    tb, acc = table.copy(), np.full_like(table, 0.1)
                    m, v = np.zeros_like(table), np.zeros_like(table)
                    if opt == "sgd":
                        core.sparse_sgd(tb, uk, gr, 0.05, num_threads=2)
                    elif opt == "adagrad":
                        core.sparse_adagrad(tb, acc, uk, gr, 0.05, 1e-7, num_threads=2)
                    else:
                        core.sparse_adam(tb, m, v, uk, gr, 0.05, 0.9, 0.999, 1e-7, 2, num_threads=2)
                    res[f"core_sparse_{opt}_{tag}_{t}"] = tb
    # The TensorFlow op library: the fused forward and its gradient, the optimizers (apply_gradients
    # and the optimizer inside the backward), Global Adam and its deferred catch-up.
    shapes = [(int(rng.integers(30, 300)), d) for d in (16, 64, 7, 128)]
    combs = ["sum", "mean", "sum", "mean"]
    for kind, make in (("sgd", lambda: eopt.SGD(0.1)), ("adagrad", lambda: eopt.Adagrad(0.1)),
                       ("adam", lambda: eopt.Adam(0.01, beta_1=0.8, beta_2=0.95))):
        init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        va, vb = [tf.Variable(x) for x in init], [tf.Variable(x) for x in init]
        oa, ob = make(), make()
        for step in range(3):
            ids = [ref.random_ids(rng, 64, r, max_nnz=5).ragged(tf, True) for r, _ in shapes]
            r = [tf.constant(rng.standard_normal((64, d)).astype(np.float32)) for _, d in shapes]
            with tf.GradientTape() as tape:
                outs = ops.fused_embedding_lookup(va, [i for i, _ in ids], combs, weights=[w for _, w in ids])
                loss = tf.add_n([tf.reduce_sum(o * x) for o, x in zip(outs, r)])
            grads = tape.gradient(loss, va)
            for t, (o, g) in enumerate(zip(outs, grads)):
                res[f"tf_fwd_{kind}_{step}_{t}"] = o.numpy()
                res[f"tf_grad_values_{kind}_{step}_{t}"] = g.values.numpy()
                res[f"tf_grad_indices_{kind}_{step}_{t}"] = g.indices.numpy()
            oa.apply_gradients(zip(grads, va))
            with tf.GradientTape() as tape:
                outs = ops.fused_embedding_lookup(vb, [i for i, _ in ids], combs, weights=[w for _, w in ids],
                                                  optimizer=ob)
                loss = tf.add_n([tf.reduce_sum(o * x) for o, x in zip(outs, r)])
            tape.gradient(loss, vb)
        for t, (a, b) in enumerate(zip(va, vb)):
            res[f"tf_apply_{kind}_{t}"], res[f"tf_in_backward_{kind}_{t}"] = a.numpy(), b.numpy()
    lib = _native.tf_ops()
    rows, dim = 300, 16
    w = tf.Variable(rng.standard_normal((rows, dim)).astype(np.float32))
    m = tf.Variable((rng.standard_normal((rows, dim)) * 0.01).astype(np.float32))
    v = tf.Variable((rng.random((rows, dim)) * 0.001).astype(np.float32))
    adam = [tf.constant(x, tf.float64) for x in (0.9, 0.999)] + [tf.constant(1e-7, tf.float32)]
    for step in (1, 2, 3):
        idx = np.unique(rng.integers(0, 250, size=40)).astype(np.int64)
        g = rng.standard_normal((len(idx), dim)).astype(np.float32)
        lib.embed_lab_global_apply_adam([w.handle], [m.handle], [v.handle], [tf.constant(idx)], [tf.constant(g)],
                                        tf.constant(0.01), *adam, tf.constant(step, tf.int64),
                                        tf.constant([260], tf.int64))
    last = tf.Variable(rng.integers(0, 4, size=rows).astype(np.int64))
    lib.embed_lab_global_adam_catch_up(w.handle, m.handle, v.handle, last.handle, tf.zeros([0], tf.int64),
                                       tf.constant(rows, tf.int64), tf.constant(6, tf.int64),
                                       tf.constant([0.01, 0.02, 0.005, 0.01, 0.03, 0.02, 0.01, 0.04], tf.float32),
                                       *adam)
    res["tf_global_adam_w"], res["tf_global_adam_m"], res["tf_global_adam_v"] = w.numpy(), m.numpy(), v.numpy()
    loaded = _native.loaded_cpu_isas()
    np.savez(out_path, _isa_core=np.array(loaded["core"]), _isa_tf_ops=np.array(loaded["tf_ops"]), **res)


def test_every_built_copy_gives_the_baseline_bits(rng, tmp_path):
    """The same lookups, backward passes and optimizer steps (both libraries, every unrolled
    width, sum and mean, weights, duplicates, -1 padding) in a process forced onto each built copy
    of the kernels that this CPU runs (EMBEDLAB_CPU_ISA_RUNTIME=avx2, avx512) and in one forced
    onto the baseline give the same bits: no FMA contraction, no reassociation in the vector code."""
    info = _native.build_info()
    flags = _native._cpu_flags()
    wide = [isa for isa in info["cpu_isas_built"] if isa != "baseline"]
    if not wide:
        pytest.skip(f"only {info['cpu_isas_built']} kernels were built (EMBEDLAB_CPU_ISA={info['cpu_isa_option']})")
    runnable = [isa for isa in wide if flags is None or _native._ISA_FLAGS[isa] <= flags]
    if not runnable:
        pytest.skip(f"this CPU runs none of the {wide} kernels")
    seed = int(rng.integers(2**31))
    here = os.path.dirname(os.path.abspath(__file__))
    results = {}
    for isa in runnable + ["baseline"]:
        env = dict(os.environ, EMBEDLAB_CPU_ISA_RUNTIME=isa, TF_CPP_MIN_LOG_LEVEL="3")
        env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in sys.path if p])
        path = tmp_path / f"{isa}.npz"
        code = f"import test_native; test_native._isa_workload({seed}, {str(path)!r})"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env,
                             cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        with np.load(path) as z:
            results[isa] = {k: z[k] for k in z.files}
        got = results[isa]
        assert (str(got.pop("_isa_core")), str(got.pop("_isa_tf_ops"))) == (isa, isa)
    b = results["baseline"]
    assert len(b) > 400, len(b)
    floats = [k for k in b if b[k].dtype == np.float32 and b[k].size]
    assert sum(bool(np.any(b[k] != 0)) for k in floats) > 0.9 * len(floats)  # the results hold values
    for isa in runnable:
        a = results[isa]
        assert a.keys() == b.keys(), isa
        differ = [k for k in a if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or a[k].tobytes() != b[k].tobytes()]
        assert not differ, f"{len(differ)} of {len(a)} results differ between {isa} and baseline, e.g. {differ[:5]}"
    print(f"{len(b)} results, {sum(x.size for x in b.values()):,} values: the same bits with {runnable} and baseline")


def test_both_prefetch_levels_give_the_same_bits(rng, tmp_path):
    """The forward's prefetches into L1 or into L2 (EMBEDLAB_PREFETCH_LEVEL, chosen per core
    otherwise) change only speed: the same lookups, backward passes and optimizer steps as above
    give the same bits in a process forced onto each, and both libraries report the level."""
    seed = int(rng.integers(2**31))
    here = os.path.dirname(os.path.abspath(__file__))
    results = {}
    for level in ("l1", "l2"):
        env = dict(os.environ, EMBEDLAB_PREFETCH_LEVEL=level, TF_CPP_MIN_LOG_LEVEL="3")
        env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in sys.path if p])
        path = tmp_path / f"{level}.npz"
        code = (f"import test_native; test_native._isa_workload({seed}, {str(path)!r})\n"
                "import ctypes, embedlab._native as n\n"
                "core_level = ctypes.CDLL(n.core().__file__).embedlab_prefetch_level\n"
                "core_level.restype = ctypes.c_char_p\n"
                "print('LEVEL', core_level().decode(), n.prefetch_level())\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env,
                             cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"LEVEL {level} {level}" in out.stdout, out.stdout[-500:]   # the core module, then the op library
        with np.load(path) as z:
            results[level] = {k: z[k] for k in z.files if not k.startswith("_isa")}
    a, b = results["l1"], results["l2"]
    assert a.keys() == b.keys() and len(a) > 400
    differ = [k for k in a if a[k].tobytes() != b[k].tobytes()]
    assert not differ, f"{len(differ)} of {len(a)} results differ between the prefetch levels, e.g. {differ[:5]}"


def test_a_bad_prefetch_level_stops_the_libraries_from_loading():
    out = _load_in_child(["core", "tf_ops", "prefetch_level"], EMBEDLAB_PREFETCH_LEVEL="l3")
    lines = out.splitlines()
    assert sum(line.startswith("ERR") and "EMBEDLAB_PREFETCH_LEVEL must be auto, l1 or l2 (or unset), got 'l3'" in line
               for line in lines) == 3, out
    assert "IMPORTED []" in out, out


def test_op_library_refuses_another_tensorflow(tmp_path):
    """A library built for another TensorFlow must raise with the fix, not crash later."""
    code = (
        "import json, embedlab._native as n\n"
        "real = n._info_file()\n"
        "fake = dict(real, tensorflow_version='1.15.0')\n"
        "n._info_file.cache_clear()\n"
        "n._info_file = lambda: fake\n"
        "try:\n"
        "    n.tf_ops()\n"
        "except n.NativeLibraryError as e:\n"
        "    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "ERR" in out.stdout, out.stderr[-2000:]
    assert "1.15.0" in out.stdout and "make setup" in out.stdout


@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_core_forward_matches_float64_oracle(core, rng, combiner, weighted):
    tables, offs, keys, weights, outs, refs = [], [], [], [], [], []
    for t in range(4):
        rows, dim = int(rng.integers(1, 300)), int(rng.choice([1, 4, 16, 33]))
        table = rng.standard_normal((rows, dim)).astype(np.float32)
        o, k = random_csr(rng, int(rng.integers(0, 60)), rows, zipf=bool(t % 2))
        w = rng.uniform(0.1, 2.0, size=len(k)).astype(np.float32) if weighted else None
        tables.append(table), offs.append(o), keys.append(k), weights.append(w)
        outs.append(np.full((len(o) - 1, dim), np.nan, np.float32))  # poison: every element must be written
        refs.append(ref.csr_lookup(table, o, k, w, combiner))
    core.lookup_forward(tables, offs, keys, weights if weighted else None, [combiner] * 4, outs)
    for out, want in zip(outs, refs):
        assert not np.isnan(out).any()
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_core_backward_matches_oracle_and_is_deterministic(core, rng, combiner):
    rows, dim, batch = 5000, 16, 3000
    o, k = random_csr(rng, batch, rows, max_nnz=8, zipf=True)
    w = rng.uniform(0.1, 2.0, size=len(k)).astype(np.float32)
    dy = rng.standard_normal((batch, dim)).astype(np.float32)
    uk, grad = core.lookup_backward(o, k, w, combiner, dy, rows)
    ref_k, ref_g = ref.csr_lookup_grad(o, k, w, combiner, dy)
    np.testing.assert_array_equal(uk, ref_k)
    np.testing.assert_allclose(grad, ref_g, rtol=1e-4, atol=1e-4)
    for threads in (1, 2, 3, 8):  # same bits for any thread count and on every run
        uk2, grad2 = core.lookup_backward(o, k, w, combiner, dy, rows, num_threads=threads)
        assert np.array_equal(uk2, uk) and grad2.tobytes() == grad.tobytes()


def _coo_of(offsets):
    """[nnz, 2] COO indices (row, column) of CSR offsets, in row order."""
    counts = np.diff(offsets)
    rows = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    cols = np.concatenate([np.arange(c) for c in counts] + [np.zeros(0, np.int64)]).astype(np.int64)
    return np.ascontiguousarray(np.stack([rows, cols], 1))


@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_core_coo_forward_single_pass_equals_csr(core, rng, combiner, weighted):
    # Canonical COO takes the single pass ('ok'), for any thread count (blocks then start inside
    # the table, found by binary search over the rows): the CSR forward's bits and offsets.
    for dim in (1, 16, 33):
        rows, batch = 5000, int(rng.integers(2000, 4000))
        table = rng.standard_normal((rows, dim)).astype(np.float32)
        o, k = random_csr(rng, batch, rows, max_nnz=6, zipf=dim == 16)
        w = rng.uniform(0.1, 2.0, size=len(k)).astype(np.float32) if weighted else None
        want = np.empty((batch, dim), np.float32)
        core.lookup_forward([table], [o], [k], [w] if weighted else None, [combiner], [want])
        for threads in (1, 2, 3, 8):
            out = np.full((batch, dim), np.nan, np.float32)
            off, status = core.lookup_forward_coo(table, _coo_of(o), k, w, batch, combiner, out, num_threads=threads)
            assert status == "ok"
            np.testing.assert_array_equal(off, o)
            assert out.tobytes() == want.tobytes()


def test_core_coo_forward_reports_unordered_rows_and_bad_keys(core, rng):
    table = rng.standard_normal((50, 4)).astype(np.float32)
    o, k = random_csr(rng, 300, 50)
    k = np.where(k < -1, -1, k)
    coo = _coo_of(o)
    out = np.empty((300, 4), np.float32)
    for threads in (1, 3):
        p = rng.permutation(len(k))
        if len(set(coo[p, 0].tolist())) > 1 and not np.all(np.diff(coo[p, 0]) >= 0):
            _, status = core.lookup_forward_coo(table, np.ascontiguousarray(coo[p]), k[p], None, 300, "sum", out,
                                                num_threads=threads)
            assert status == "unordered"
        bad = coo.copy()
        bad[-1, 0] = 300                                   # in order, but past the last row
        assert core.lookup_forward_coo(table, bad, k, None, 300, "sum", out, num_threads=threads)[1] == "unordered"
        bad = coo.copy()
        bad[0, 0] = -1                                     # in order, but before the first row
        assert core.lookup_forward_coo(table, bad, k, None, 300, "sum", out, num_threads=threads)[1] == "unordered"
        kb = k.copy()
        kb[len(kb) // 2] = 50                              # a key outside the table
        assert core.lookup_forward_coo(table, coo, kb, None, 300, "sum", out, num_threads=threads)[1] == "bad_key"
        kb[len(kb) // 2] = -2                              # negative keys other than -1
        assert core.lookup_forward_coo(table, coo, kb, None, 300, "sum", out, num_threads=threads)[1] == "bad_key"
    empty = np.empty((0, 4), np.float32)
    two = np.zeros((2, 2), np.int64)
    assert core.lookup_forward_coo(table, two, np.array([1, 2], np.int64), None, 0, "sum", empty)[1] == "unordered"
    off, status = core.lookup_forward_coo(table, np.zeros((0, 2), np.int64), np.zeros(0, np.int64), None, 0, "sum",
                                          empty)
    assert status == "ok" and off.tolist() == [0]


def test_core_forward_same_bits_for_any_thread_count(core, rng):
    table = rng.standard_normal((20000, 64)).astype(np.float32)
    o, k = random_csr(rng, 4096, 20000, max_nnz=6)
    outs = []
    for threads in (1, 2, 5):
        out = np.empty((4096, 64), np.float32)
        core.lookup_forward([table], [o], [k], None, ["mean"], [out], num_threads=threads)
        outs.append(out.tobytes())
    assert outs[0] == outs[1] == outs[2]


def test_core_rejects_bad_keys_and_changes_nothing(core, rng):
    table = rng.standard_normal((10, 4)).astype(np.float32)
    before = table.copy()
    out = np.zeros((2, 4), np.float32)
    offsets = np.array([0, 1, 2], np.int64)
    with pytest.raises(ValueError, match=r"key 10 at position 1 \(row 1\) is outside the table of 10 rows"):
        core.lookup_forward([table], [offsets], [np.array([3, 10], np.int64)], None, ["sum"], [out])
    with pytest.raises(ValueError, match=r"key -2 .* only -1 may mark a missing key"):
        core.lookup_forward([table], [offsets], [np.array([-2, 1], np.int64)], None, ["sum"], [out])
    with pytest.raises(ValueError, match="row_offsets end at 2 but there are 3 keys"):
        core.lookup_forward([table], [offsets], [np.array([1, 2, 3], np.int64)], None, ["sum"], [out])
    # Offsets are checked inside the kernel: a middle offset far past nnz, or one going back,
    # must be reported without reading outside the keys.
    out3 = np.zeros((3, 4), np.float32)
    for bad in ([0, 1 << 40, 2, 3], [0, 2, 1, 3], [0, -5, 2, 3]):
        with pytest.raises(ValueError, match="row_offsets decrease at row"):
            core.lookup_forward([table], [np.array(bad, np.int64)], [np.array([1, 2, 3], np.int64)], None,
                                ["sum"], [out3])
    with pytest.raises(ValueError, match="index 10 at position 0 is outside"):
        core.sparse_sgd(table, np.array([10], np.int64), np.ones((1, 4), np.float32), 0.1)
    np.testing.assert_array_equal(table, before)


def test_core_sparse_optimizers_touch_only_given_rows(core, rng):
    rows, dim = 100, 8
    idx = np.sort(rng.choice(rows, size=30, replace=False)).astype(np.int64)
    g = rng.standard_normal((30, dim)).astype(np.float32)
    table = rng.standard_normal((rows, dim)).astype(np.float32)
    untouched = np.setdiff1d(np.arange(rows), idx)
    # SGD
    t = table.copy()
    core.sparse_sgd(t, idx, g, 0.5)
    np.testing.assert_array_equal(t[untouched], table[untouched])
    np.testing.assert_allclose(t[idx], table[idx] - 0.5 * g, rtol=1e-6)
    # Adagrad
    t, acc = table.copy(), np.full((rows, dim), 0.1, np.float32)
    core.sparse_adagrad(t, acc, idx, g, 0.5, 1e-7)
    ref_acc = 0.1 + g.astype(np.float64) ** 2
    np.testing.assert_allclose(acc[idx], ref_acc, rtol=1e-6)
    np.testing.assert_allclose(t[idx], table[idx] - 0.5 * g / np.sqrt(ref_acc + 1e-7), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(t[untouched], table[untouched])
    # lazy Adam, two steps
    t, m, v = table.copy(), np.zeros((rows, dim), np.float32), np.zeros((rows, dim), np.float32)
    rm, rv, rt = np.zeros((30, dim)), np.zeros((30, dim)), table[idx].astype(np.float64)
    for step in (1, 2):
        core.sparse_adam(t, m, v, idx, g, 0.01, 0.9, 0.999, 1e-7, step)
        rm = rm + (g - rm) * 0.1
        rv = rv + (g.astype(np.float64) ** 2 - rv) * 0.001
        alpha = 0.01 * np.sqrt(1 - 0.999**step) / (1 - 0.9**step)
        rt = rt - alpha * rm / (np.sqrt(rv) + 1e-7)
    np.testing.assert_allclose(t[idx], rt, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(t[untouched], table[untouched])
    assert not m[untouched].any() and not v[untouched].any()


@pytest.mark.parametrize("opt", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_core_fused_backward_apply_equals_backward_then_update(core, rng, opt, combiner):
    # Zipf keys (hot keys touched many times), weights, empty rows and -1 padding; dims 16
    # (compile-time width) and 12 (run-time width). Bit for bit equal to the two-step path, for
    # any thread count, and rows no key touched stay exactly as they were.
    for dim in (16, 12):
        rows, batch = 3000, 2000
        o, k = random_csr(rng, batch, rows, max_nnz=6, zipf=True)
        w = rng.uniform(0.1, 2.0, size=len(k)).astype(np.float32)
        dy = rng.standard_normal((batch, dim)).astype(np.float32)
        table = rng.standard_normal((rows, dim)).astype(np.float32)
        s1 = rng.uniform(0.0, 1.0, (rows, dim)).astype(np.float32)
        s2 = rng.uniform(0.0, 1.0, (rows, dim)).astype(np.float32)
        hp = dict(lr=0.05, epsilon=1e-6, beta_1=0.8, beta_2=0.99, step=3)

        t0, a0, b0 = table.copy(), s1.copy(), s2.copy()
        uk, g = core.lookup_backward(o, k, w, combiner, dy, rows)
        ref.core_update(core, opt, t0, a0, b0, uk, g, **hp)

        for threads in (1, 2, 5):
            t1, a1, b1 = table.copy(), s1.copy(), s2.copy()
            slots = {"sgd": {}, "adagrad": {"accumulator": a1}, "adam": {"m": a1, "v": b1}}[opt]
            core.lookup_backward_apply(t1, o, k, w, combiner, dy, opt, num_threads=threads, **slots, **hp)
            assert t1.tobytes() == t0.tobytes(), (dim, threads)
            assert a1.tobytes() == a0.tobytes() and b1.tobytes() == b0.tobytes()
        untouched = np.setdiff1d(np.arange(rows), uk)
        assert len(untouched) > 0
        np.testing.assert_array_equal(t1[untouched], table[untouched])


def test_core_fused_backward_apply_gives_back_a_huge_scratch(core, rng):
    """The fused backward sums into a buffer the calling thread keeps for the next call, but
    only up to 64 MiB: after one huge call the memory goes back (trim_scratch), and a small
    call afterwards is still exact."""
    psutil = pytest.importorskip("psutil")
    rows, dim, nu = 1_000_000, 64, 400_000  # summed rows: 400k x 64 floats = 98 MiB
    table = np.zeros((rows, dim), np.float32)
    table.fill(0.0)  # resident before the baseline (np.zeros maps its pages lazily)
    keys = rng.permutation(rows)[:nu].astype(np.int64)
    offsets = np.arange(nu + 1, dtype=np.int64)
    dy = np.ones((nu, dim), np.float32)
    proc = psutil.Process()
    before = proc.memory_info().rss
    core.lookup_backward_apply(table, offsets, keys, None, "sum", dy, "sgd", lr=0.5, num_threads=1)
    grown = proc.memory_info().rss - before
    assert grown < 48 << 20, f"RSS grew by {grown >> 20} MiB after the call: the scratch was kept"
    assert (table[keys] == -0.5).all() and np.count_nonzero(table) == nu * dim
    small = np.zeros((10, 4), np.float32)
    o, k = np.array([0, 2, 3], np.int64), np.array([7, 7, 2], np.int64)
    core.lookup_backward_apply(small, o, k, None, "sum", np.ones((2, 4), np.float32), "sgd", lr=1.0, num_threads=1)
    np.testing.assert_array_equal(small[7], [-2.0] * 4)
    np.testing.assert_array_equal(small[2], [-1.0] * 4)
    assert np.count_nonzero(small) == 8


def test_core_fused_backward_apply_rejects_bad_input_and_changes_nothing(core, rng):
    table = rng.standard_normal((10, 4)).astype(np.float32)
    before = table.copy()
    o = np.array([0, 1, 2], np.int64)
    dy = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match=r"key 10 at position 1 \(row 1\) is outside the table of 10 rows"):
        core.lookup_backward_apply(table, o, np.array([3, 10], np.int64), None, "sum", dy, "sgd", 0.1)
    with pytest.raises(ValueError, match="adam needs m"):
        core.lookup_backward_apply(table, o, np.array([3, 1], np.int64), None, "sum", dy, "adam", 0.1)
    with pytest.raises(ValueError, match="optimizer must be 'sgd', 'adagrad', 'adam' or 'ftrl', got 'rmsprop'"):
        core.lookup_backward_apply(table, o, np.array([3, 1], np.int64), None, "sum", dy, "rmsprop", 0.1)
    np.testing.assert_array_equal(table, before)


def test_core_coo_to_csr_is_a_stable_sort(core, rng):
    batch = 50
    rows = rng.integers(0, batch, size=400).astype(np.int64)
    offsets, perm = core.coo_to_csr(rows, batch)
    np.testing.assert_array_equal(offsets, np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=batch))]))
    np.testing.assert_array_equal(perm, np.argsort(rows, kind="stable"))
    with pytest.raises(ValueError, match=r"row index 50 at indices\[0, 0\] is outside \[0, 50\)"):
        core.coo_to_csr(np.array([50], np.int64), batch)


def test_build_info_json_is_valid():
    path = os.path.join(os.path.dirname(_native.__file__), "_build_info.json")
    with open(path) as f:
        json.load(f)


def test_huge_page_advice_on_large_tables_changes_no_values(rng):
    """Tables over 32 MiB are madvised (and collapsed) onto huge pages on their second use:
    lookups and sparse updates must read and write the same values before and after."""
    import tensorflow as tf
    from embedlab import ops, optimizers

    rows, dim = 600_000, 16  # 38 MB, over the advice threshold
    init = rng.standard_normal((rows, dim)).astype(np.float32)
    table = tf.Variable(init)
    ids = rng.integers(0, rows, size=(256, 3)).astype(np.int64)
    opt = optimizers.SGD(learning_rate=0.5)
    expect = init.astype(np.float64)
    for step in range(4):  # uses 1 and 2 see the buffer first and second (the advice); 3, 4 after
        out = ops.embedding_lookup(table, tf.constant(ids), "sum").numpy()
        np.testing.assert_allclose(out, expect[ids].sum(axis=1), rtol=1e-5, atol=1e-5)
        grad = tf.IndexedSlices(tf.ones((3, dim)), tf.constant([5, 70_000, rows - 1], tf.int64),
                                tf.constant([rows, dim], tf.int64))
        opt.apply_gradients([(grad, table)])
        expect[[5, 70_000, rows - 1]] -= 0.5
    np.testing.assert_allclose(table.numpy(), expect, rtol=1e-6, atol=1e-6)


def test_core_backward_with_keys_too_wide_to_pack(core, rng):
    """Keys near 2^61 leave no room to pack (key, position) in 64 bits: the two-array sort path
    must give the same answer as the oracle."""
    base = np.int64(2**61)
    offsets, small = random_csr(rng, 200, 50, max_nnz=6)
    keys = np.where(small >= 0, base + small, -1).astype(np.int64)
    dy = rng.standard_normal((200, 8)).astype(np.float32)
    uk, grad = core.lookup_backward(offsets, keys, None, "sum", dy, 2**62)
    ref_k, ref_g = ref.csr_lookup_grad(offsets, small, None, "sum", dy)
    np.testing.assert_array_equal(uk, base + ref_k)
    np.testing.assert_allclose(grad, ref_g, rtol=1e-5, atol=1e-5)

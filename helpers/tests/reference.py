"""Oracles for EmbedLab's embedding ops, optimizers and plugin layer.

* `tf_safe_lookup`: TensorFlow's own `tf.nn.safe_embedding_lookup_sparse`.
* `np_lookup` / `np_lookup_grad`: pooled lookup and its gradient in NumPy float64.
* `np_sgd`, `np_adagrad`, `np_lazy_adam`: sparse optimizer steps in NumPy float64 (Keras'
  formulas; Adam lazy: only touched rows' moments move).
* `random_ids`: random CSR ids with empty rows, duplicate keys and -1 padding, in all three
  forms (ragged, sparse, dense).
* `random_csr`, `csr_lookup`, `csr_lookup_grad`: raw CSR inputs (empty rows, -1 padding,
  duplicates, optional Zipf-skewed keys) and vectorised float64 oracles over them, for the
  kernel-level tests of the framework-free module (CPU and CUDA).
* `seeded_rng` / `fresh_seed`: one fresh seed per test run (each test draws its own stream from
  it), printed so that a failure can be replayed with `EMBEDLAB_TEST_SEED=<seed>`; the `rng`
  fixture of conftest.py is `seeded_rng`.
"""
from __future__ import annotations

import os
import secrets
import zlib
from dataclasses import dataclass

import numpy as np


def _run_seed() -> int:
    env = os.environ.get("EMBEDLAB_TEST_SEED")
    try:
        return int(env) if env else secrets.randbelow(2**31)
    except ValueError:
        raise ValueError(f"EMBEDLAB_TEST_SEED must be an integer, got {env!r}") from None


RUN_SEED = _run_seed()  # one seed per test run: fresh, or EMBEDLAB_TEST_SEED to replay a run


def fresh_seed() -> int:
    """This run's seed (fresh each run; EMBEDLAB_TEST_SEED=<seed> replays a run)."""
    return RUN_SEED


def seeded_rng(request=None):
    """A NumPy Generator for one test: this run's seed mixed with the test's name (so every test
    draws its own stream, the same whether it runs alone or with others). The seed is printed;
    pytest shows it on failure, and EMBEDLAB_TEST_SEED=<seed> replays the draw."""
    node = getattr(request, "node", None)
    name = getattr(node, "name", "")
    print(f"[seed] EMBEDLAB_TEST_SEED={RUN_SEED} {getattr(node, 'nodeid', '')}")
    return np.random.default_rng([RUN_SEED, zlib.crc32(name.encode())])


@dataclass
class Ids:
    splits: np.ndarray        # [batch + 1] int64
    keys: np.ndarray          # [nnz] int64, -1 allowed
    weights: np.ndarray       # [nnz] float32
    max_nnz: int

    @property
    def batch(self):
        return len(self.splits) - 1

    def ragged(self, tf, with_weights=False):
        r = tf.RaggedTensor.from_row_splits(self.keys, self.splits)
        w = tf.RaggedTensor.from_row_splits(self.weights, self.splits)
        return (r, w) if with_weights else r

    def coo(self):
        rows = np.repeat(np.arange(self.batch, dtype=np.int64), np.diff(self.splits))
        cols = np.concatenate([np.arange(n) for n in np.diff(self.splits)] + [np.zeros(0)]).astype(np.int64)
        return np.stack([rows, cols], 1), self.keys, self.weights

    def sparse(self, tf, with_weights=False, shuffle_rng=None):
        idx, keys, w = self.coo()
        if shuffle_rng is not None:          # unordered COO must work too
            p = shuffle_rng.permutation(len(keys))
            idx, keys, w = idx[p], keys[p], w[p]
        shape = [self.batch, max(self.max_nnz, 1)]
        s = tf.SparseTensor(idx.reshape(-1, 2), keys, shape)
        return (s, tf.SparseTensor(idx.reshape(-1, 2), w, shape)) if with_weights else s

    def dense(self, with_weights=False):
        d = np.full((self.batch, max(self.max_nnz, 1)), -1, np.int64)
        dw = np.zeros(d.shape, np.float32)
        for b in range(self.batch):
            a, e = self.splits[b], self.splits[b + 1]
            d[b, :e - a] = self.keys[a:e]
            dw[b, :e - a] = self.weights[a:e]
        return (d, dw) if with_weights else d


def random_ids(rng, batch: int, rows: int, max_nnz: int = 4, pad_prob: float = 0.1) -> Ids:
    """Random ids with at least one empty row, duplicate keys, and some -1 keys."""
    counts = rng.integers(0, max_nnz + 1, size=batch)
    picks = rng.permutation(batch)[:2]                      # two distinct rows
    if batch:
        counts[picks[0]] = 0                                # an empty row, always
    if batch > 1 and max_nnz >= 2:
        counts[picks[1]] = max_nnz                          # a full row
    nnz = int(counts.sum())
    keys = rng.integers(0, rows, size=nnz, dtype=np.int64)
    if nnz >= 2:
        keys[1] = keys[0]                                   # a duplicate, always
    keys[rng.random(nnz) < pad_prob] = -1                   # explicit "no key" entries
    weights = rng.uniform(0.1, 2.0, size=nnz).astype(np.float32)
    splits = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Ids(splits, keys, weights, max_nnz)


def np_lookup(table, splits, keys, weights=None, combiner="sum"):
    """Pooled lookup in float64: -1 skipped; mean divides by the count (or the weight sum)."""
    table = np.asarray(table, np.float64)
    out = np.zeros((len(splits) - 1, table.shape[1]))
    for b in range(len(splits) - 1):
        den = 0.0
        for j in range(splits[b], splits[b + 1]):
            k = keys[j]
            if k < 0:
                continue
            w = 1.0 if weights is None else float(weights[j])
            out[b] += w * table[k]
            den += w
        if combiner == "mean" and den > 0:
            out[b] /= den
    return out


def np_lookup_grad(dy, splits, keys, rows, weights=None, combiner="sum"):
    """Dense gradient of sum(dy * np_lookup(table)) with respect to the table, float64."""
    dy = np.asarray(dy, np.float64)
    g = np.zeros((rows, dy.shape[1]))
    for b in range(len(splits) - 1):
        sl = range(splits[b], splits[b + 1])
        ws = [(j, 1.0 if weights is None else float(weights[j])) for j in sl if keys[j] >= 0]
        den = sum(w for _, w in ws) if combiner == "mean" else 1.0
        for j, w in ws:
            g[keys[j]] += dy[b] * (w / den if den else 0.0)
    return g


def tf_safe_lookup(tf, table, ids: Ids, combiner="sum", weighted=False):
    """`tf.nn.safe_embedding_lookup_sparse` on the same ids (-1 entries dropped first)."""
    idx, keys, w = ids.coo()
    keep = keys >= 0
    shape = [ids.batch, max(ids.max_nnz, 1)]
    sp = tf.SparseTensor(idx[keep].reshape(-1, 2), keys[keep], shape)
    spw = tf.SparseTensor(idx[keep].reshape(-1, 2), w[keep], shape) if weighted else None
    return tf.nn.safe_embedding_lookup_sparse(table, sp, spw, combiner=combiner)


def _coalesce(idx, g):
    idx = np.asarray(idx, np.int64)
    u, inv = np.unique(idx, return_inverse=True)
    s = np.zeros((len(u), g.shape[1]))
    np.add.at(s, inv, np.asarray(g, np.float64))
    return u, s


def np_sgd(w, idx, g, lr):
    w = np.array(w, np.float64)
    u, s = _coalesce(idx, g)
    w[u] -= lr * s
    return w


def np_adagrad(w, acc, idx, g, lr, eps=1e-7):
    w, acc = np.array(w, np.float64), np.array(acc, np.float64)
    u, s = _coalesce(idx, g)
    acc[u] += s * s
    w[u] -= lr * s / np.sqrt(acc[u] + eps)
    return w, acc


def np_lazy_adam(w, m, v, idx, g, lr, step, b1=0.9, b2=0.999, eps=1e-7):
    """One lazy Adam step (Keras' formula: lr_t = lr*sqrt(1-b2^t)/(1-b1^t), eps outside)."""
    w, m, v = (np.array(x, np.float64) for x in (w, m, v))
    u, s = _coalesce(idx, g)
    m[u] = b1 * m[u] + (1 - b1) * s
    v[u] = b2 * v[u] + (1 - b2) * s * s
    lr_t = lr * np.sqrt(1 - b2 ** step) / (1 - b1 ** step)
    w[u] -= lr_t * m[u] / (np.sqrt(v[u]) + eps)
    return w, m, v


# ---- raw CSR inputs and vectorised oracles (kernel-level tests) --------------------------------

def random_csr(rng, batch, rows, max_nnz=5, zipf=False, zipf_a=1.2, pad=0.2, empty=0.15):
    """CSR ids `(offsets [batch + 1], keys [nnz])`: random row lengths with extra empty rows,
    keys uniform or Zipf(`zipf_a`)-skewed (hot keys), a share `pad` of -1 entries, and a key
    repeated inside the first row (and so, often, across rows)."""
    lengths = rng.integers(0, max_nnz + 1, size=batch)
    lengths[rng.random(batch) < empty] = 0
    offsets = np.zeros(batch + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    nnz = int(offsets[-1])
    if zipf:
        keys = (rng.zipf(zipf_a, size=nnz) - 1) % rows
    else:
        keys = rng.integers(0, rows, size=nnz)
    keys = keys.astype(np.int64)
    keys[rng.random(nnz) < pad] = -1
    if nnz > 3:  # a -1 there becomes key 1, or 0 in a table of one row
        keys[1] = keys[0] = abs(keys[0]) % rows
    return offsets, keys


def _row_index(offsets):
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


def csr_lookup(table, offsets, keys, weights, combiner):
    """Pooled lookup in float64; mean divides by the weight sum, empty rows give zeros."""
    batch = len(offsets) - 1
    rows = _row_index(offsets)
    valid = keys >= 0
    w = np.ones(len(keys)) if weights is None else weights.astype(np.float64)
    out = np.zeros((batch, table.shape[1]))
    np.add.at(out, rows[valid], w[valid, None] * table[keys[valid]].astype(np.float64))
    if combiner == "mean":
        wsum = np.zeros(batch)
        np.add.at(wsum, rows[valid], w[valid])
        nz = wsum != 0
        out[nz] /= wsum[nz, None]
        out[~nz] = 0
    return out


def csr_lookup_grad(offsets, keys, weights, combiner, dy):
    """Gradient of sum(dy * csr_lookup(table)): `(unique keys ascending, summed rows)`, float64."""
    rows = _row_index(offsets)
    valid = keys >= 0
    w = np.ones(len(keys)) if weights is None else weights.astype(np.float64)
    scale = w.copy()
    if combiner == "mean":
        wsum = np.zeros(len(offsets) - 1)
        np.add.at(wsum, rows[valid], w[valid])
        scale = w / np.where(wsum[rows] == 0, 1, wsum[rows])
    uk, inv = np.unique(keys[valid], return_inverse=True)
    g = np.zeros((len(uk), dy.shape[1]))
    np.add.at(g, inv, scale[valid, None] * dy[rows[valid]].astype(np.float64))
    return uk, g


def core_update(core, opt, table, s1, s2, keys, grads, lr, epsilon, beta_1, beta_2, step):
    """Applies `opt` ("sgd" | "adagrad" | "adam") with the CPU core's sparse_* kernels in place
    (s1: Adagrad accumulator or Adam m; s2: Adam v): the two-step reference for fused paths."""
    if opt == "sgd":
        core.sparse_sgd(table, keys, grads, lr)
    elif opt == "adagrad":
        core.sparse_adagrad(table, s1, keys, grads, lr, epsilon)
    else:
        core.sparse_adam(table, s1, s2, keys, grads, lr, beta_1, beta_2, epsilon, step)


def np_ftrl(w, n, z, idx, g, lr, lr_power=-0.5, l1=0.0, l2=0.0, l2_shrinkage=0.0, beta=0.0):
    """One FTRL step in float64 on the touched rows (duplicates summed first), Keras 3's
    `keras.optimizers.Ftrl.update_step` formula: returns `(w, n, z)`; untouched rows keep all three."""
    w, n, z = (np.array(x, np.float64) for x in (w, n, z))
    u, s = _coalesce(idx, g)
    wu, nu = w[u], n[u]
    l2_eff = l2 + beta / (2.0 * lr)
    n_new = nu + s * s
    z[u] += s + 2.0 * l2_shrinkage * wu - (n_new ** -lr_power - nu ** -lr_power) / lr * wu
    quad = n_new ** -lr_power / lr + 2.0 * l2_eff
    w[u] = (np.clip(z[u], -l1, l1) - z[u]) / quad
    n[u] = n_new
    return w, n, z

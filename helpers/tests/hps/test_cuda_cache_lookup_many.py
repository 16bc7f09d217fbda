"""`CudaCacheLookup.lookup` (the fused multi-cache lookup, EmbeddingCacheCudaMultiLookup in
csrc/core/embedding_cache_cuda.cu) against each cache's own `CudaEmbeddingCache.lookup`.

Every test builds twin caches per table, filled by the same insert() calls: twin A is looked up
through one fused call, twin B table by table. Both must give the same rows bit for bit, the same
ascending local miss positions (at missing[sum of the earlier sizes] ...), the same counts, the
same stats(), and afterwards the same LRU evictions. Outputs are poisoned with NaN and `missing`
with -5, so a row or position written where it should not be (or not written where it should)
fails. The tables mix dims (1, 3, 4, 16, 33, 64, 128), static and dynamic caches, the three places
a dynamic cache keeps its stamps (beside the tags at dims <= 16 that are multiples of 4, in slot
words, in proof words from 65,536 sets on), 16-byte-aligned and unaligned row offsets (the
kernel's float4 and float variants), empty tables, duplicate and absent keys, and 300 tables.

Keys inserted into twins are first filtered through the CPU cache of the same geometry (the same
set of each key: embedding_cache.h), so that no set overflows: which way of a set a key takes may
differ between twins (the GPU's threads race for free ways), which only shows once a set is full.
The LRU test uses caches of one set filled one key per insert() call, where placement is fixed.

Skipped, with the reason, when the module was built without CUDA, when neither PyTorch nor CuPy
is importable, or when no GPU is visible.
"""
import numpy as np
import pytest

from gpu_arrays import core_and_device

core, DEV, _ = core_and_device("CudaCacheLookup")
pytestmark = pytest.mark.needs_gpu("CudaCacheLookup")

POISON_POS = -5


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def describe(i, cache, n):
    kind = "static" if cache.static else "dynamic"
    return f"table {i} (dim {cache.dim}, {kind}, {cache.num_sets} sets x {cache.ways} ways, {n} keys)"


def random_keys(rng, n):
    """Distinct int64 keys: small, negative and huge ones, and both ends of int64."""
    k = rng.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64, endpoint=True)
    k[: n // 3] = rng.integers(-1000, 100_000, size=n // 3)
    if n >= 2:
        k[0], k[1] = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    return np.unique(k)


class Twin:
    """One table: caches A (fused lookups) and B (its own lookups), the same inserts into both,
    and the row last inserted for each key (the oracle of a hit's row)."""

    def __init__(self, capacity, dim, ways=8, static=False):
        self.a = core.CudaEmbeddingCache(capacity, dim, ways=ways, static=static)
        self.b = core.CudaEmbeddingCache(capacity, dim, ways=ways, static=static)
        # The no-overflow filter: a static CPU cache of the same sets stores a key only into a free
        # way and never evicts, so the keys it holds fit the twins' sets together.
        self.cpu = core.EmbeddingCache(capacity, dim, ways=ways, static=True, num_threads=1)
        assert self.a.num_sets == self.cpu.num_sets, "the GPU and CPU caches must have the same sets"
        self.dim, self.rows = dim, {}

    def fitting(self, keys):
        """The keys of `keys` not kept before that, with every key kept so far, overflow no set
        (kept from now on)."""
        keys = keys[~np.isin(keys, np.fromiter(self.rows, np.int64, len(self.rows)))]
        self.cpu.insert(keys, np.zeros((keys.size, self.dim), np.float32))
        probe = np.empty((keys.size, self.dim), np.float32)
        return np.delete(keys, self.cpu.lookup(keys, probe))

    def insert(self, rng, keys):
        vals = rng.standard_normal((keys.size, self.dim)).astype(np.float32)
        s = DEV.stream()
        na = self.a.insert(DEV.put(keys), DEV.put(vals), stream=s)
        nb = self.b.insert(DEV.put(keys), DEV.put(vals), stream=s)
        assert na == nb == keys.size, f"insert stored {na} / {nb} of {keys.size} rows in the twins"
        for k, v in zip(keys.tolist(), vals):
            self.rows[k] = v


def fill(rng, twin, n):
    """Inserts about n fresh keys (those that fit) into both twins; returns them."""
    keys = twin.fitting(random_keys(rng, n))
    if keys.size:
        twin.insert(rng, keys)
    return keys


def query(rng, present, n, absent_frac=0.3):
    """n keys: present ones (with repeats) and absent ones (fresh random keys, a few repeated)."""
    if n == 0:
        return np.zeros(0, np.int64)
    n_abs = int(n * absent_frac) if present.size else n
    q = [present[rng.integers(0, present.size, n - n_abs)]] if present.size else []
    absent = rng.integers(-(2**62), 2**62, size=max(n_abs, 1), dtype=np.int64)[:n_abs]
    q.append(absent[rng.integers(0, max(absent.size, 1), n_abs)] if n_abs else absent)
    q = np.concatenate(q)
    return q[rng.permutation(q.size)]


def fused(look, caches, qs, shifts=None):
    """One CudaCacheLookup.lookup over every table; table i's rows start `shifts[i]` floats past
    the end of the previous table's (a shift that is not a multiple of 4 makes them unaligned)."""
    sizes = [int(q.size) for q in qs]
    shifts = shifts or [0] * len(qs)
    offs, o = [], 0
    for n, c, sh in zip(sizes, caches, shifts):
        o += sh
        offs.append(o)
        o += n * c.dim
    out = DEV.nan(o + 7)
    missing = DEV.full(sum(sizes) + 3, POISON_POS, np.int64)
    keys = DEV.put(np.concatenate(qs) if qs else np.zeros(0, np.int64))
    counts = look.lookup(caches, keys, sizes, out, offs, missing, stream=DEV.stream())
    return counts, DEV.get(out), DEV.get(missing), offs


def own(cache, q):
    """The table's own lookup: (rows [n, dim] with NaN at misses, ascending miss positions)."""
    if q.size == 0:
        return np.zeros((0, cache.dim), np.float32), np.zeros(0, np.int64)
    out = DEV.nan((q.size, cache.dim))
    miss = DEV.get(cache.lookup(DEV.put(q), out, stream=DEV.stream()))
    return DEV.get(out), miss


def check_against_own(look, twins, qs, shifts=None):
    """A fused lookup of the A twins against the B twins' own lookups and the inserted rows."""
    caches_a = [t.a for t in twins]
    counts, out, missing, offs = fused(look, caches_a, qs, shifts)
    assert len(counts) == len(twins), f"counts has {len(counts)} entries for {len(twins)} tables"
    written = np.zeros(out.size, bool)
    k = 0
    for i, (t, q) in enumerate(zip(twins, qs)):
        n, d, what = q.size, t.dim, describe(i, t.a, q.size)
        ref_rows, ref_miss = own(t.b, q)
        assert counts[i] == ref_miss.size, f"{what}: fused count {counts[i]}, its own lookup {ref_miss.size}"
        np.testing.assert_array_equal(missing[k:k + counts[i]], ref_miss,
                                      err_msg=f"{what}: miss positions at missing[{k}:] differ from its own lookup")
        assert (missing[k + counts[i]:k + n] == POISON_POS).all(), \
            f"{what}: missing[{k + counts[i]}:{k + n}] (past its misses) was written"
        got = out[offs[i]:offs[i] + n * d].reshape(n, d)
        np.testing.assert_array_equal(bits(got), bits(ref_rows),
                                      err_msg=f"{what}: rows (out[{offs[i]}:]) differ bitwise from its own lookup")
        hit = np.ones(n, bool)
        hit[ref_miss] = False
        assert np.isnan(got[~hit]).all(), f"{what}: a miss had its row written"
        for j in np.flatnonzero(hit)[:200]:
            np.testing.assert_array_equal(bits(got[j]), bits(t.rows[int(q[j])]),
                                          err_msg=f"{what}: hit {j} (key {q[j]}) is not the row inserted")
        written[offs[i]:offs[i] + n * d] = True
        k += n
    assert np.isnan(out[~written]).all(), "out was written outside the tables' rows"
    assert (missing[k:] == POISON_POS).all(), "missing was written past sum(sizes)"
    return counts


def check_stats(twins):
    for i, t in enumerate(twins):
        sa, sb = t.a.stats(), t.b.stats()
        assert sa == sb, f"{describe(i, t.a, -1)}: stats after fused lookups {sa} != after its own {sb}"


# (capacity, dim, ways, static, shift of its rows): dims <= 16 multiples of 4 keep the key and the
# stamps beside the row and tags; 3, 33 and 1 take the float kernels; so do multiple-of-4 dims
# whose rows start off a 16-byte boundary (shifts of 1 to 3 floats, and the odd-sized tables
# before them); tables 0 and 1 start aligned (float4 kernels); 2**19 slots of 8 ways are 65,536
# sets (proof words at dims > 16).
MIXED = [
    (4096, 16, 8, False, 0),
    (4096, 128, 8, False, 0),
    (2048, 3, 4, False, 1),
    (4096, 33, 16, False, 3),
    (4096, 16, 8, True, 0),
    (3000, 128, 8, True, 2),
    (1024, 4, 8, False, 1),
    (2048, 1, 32, True, 0),
    (2048, 64, 8, False, 0),
    (2**19, 40, 8, False, 0),
    (2**19, 16, 8, True, 0),
]


def test_mixed_tables_match_their_own_lookups(rng):
    """Mixed dims, kinds, stamp places and alignments, empty tables among them, duplicate and
    absent keys; several rounds with inserts between (the epoch advances): rows, misses, counts
    and stats agree with each table's own lookups after every round."""
    twins = [Twin(cap, d, w, st) for cap, d, w, st, _ in MIXED]
    shifts = [sh for *_, sh in MIXED]
    present = [fill(rng, t, int(rng.integers(200, 1500))) for t in twins]
    look = core.CudaCacheLookup(0)
    for rnd in range(4):
        sizes = [int(rng.integers(0, 3000)) for _ in twins]
        sizes[rnd % len(sizes)] = 0                     # an empty table, at a different place each round
        sizes[(rnd + 5) % len(sizes)] = int(rng.integers(1, 4))
        qs = [query(rng, p, n) for p, n in zip(present, sizes)]
        counts = check_against_own(look, twins, qs, shifts)
        assert sum(counts) > 0 and sum(counts) < sum(sizes), "expected both hits and misses"
        check_stats(twins)
        for i, t in enumerate(twins):               # new rows between rounds (no set overflows)
            present[i] = np.concatenate([present[i], fill(rng, t, 100)])
    # Every table empty: nothing written, all counts 0 (no work is enqueued).
    counts = check_against_own(look, twins, [np.zeros(0, np.int64) for _ in twins], shifts)
    assert counts == [0] * len(twins)
    check_stats(twins)


def test_three_hundred_tables(rng):
    """300 tables (dims 16, 128, 3, 33 and static/dynamic in turn; 0 to 40 keys each, some
    empty) and one of 20,000 keys among them: one fused call."""
    kinds = [(16, False), (128, False), (3, False), (33, True), (16, True), (128, True)]
    twins = [Twin(256, kinds[i % 6][0], 8, kinds[i % 6][1]) for i in range(300)]
    present = [fill(rng, t, 80) for t in twins]
    look = core.CudaCacheLookup(0)
    for rnd in range(2):
        sizes = rng.integers(0, 41, 300)
        sizes[rng.integers(0, 300, 30)] = 0
        sizes[137] = 20_000
        qs = [query(rng, p, int(n)) for p, n in zip(present, sizes)]
        check_against_own(look, twins, qs)
        check_stats(twins)


def test_large_batches_and_skewed_sizes(rng):
    """26 tables of dims 16 and 128 at 50,000 keys each (95 % present), then sizes from 1 to
    200,000 in one call: the block-to-table mapping and the miss split at scale."""
    twins = [Twin(1 << 16, 16 if i % 2 else 128, 8, i % 5 == 0) for i in range(26)]
    present = [fill(rng, t, 40_000) for t in twins]
    look = core.CudaCacheLookup(0)
    qs = [query(rng, p, 50_000, absent_frac=0.05) for p in present]
    check_against_own(look, twins, qs)
    sizes = [200_000, 1, 0, 7, 3000] + [int(rng.integers(0, 50)) for _ in range(21)]
    qs = [query(rng, p, n) for p, n in zip(present, sizes)]
    check_against_own(look, twins, qs)
    check_stats(twins)


def test_reused_buffers_and_changed_caches(rng):
    """The same shapes in consecutive calls (the descriptors may be reused) with other keys, other
    caches, another output buffer, and one cache listed twice: each call reads what it is given."""
    twins = [Twin(2048, d) for d in (16, 128, 33)]
    others = [Twin(2048, d) for d in (16, 128, 33)]
    present = [fill(rng, t, 800) for t in twins]
    other_present = [fill(rng, t, 800) for t in others]
    look = core.CudaCacheLookup(0)
    sizes = [500, 300, 200]
    caches = [t.a for t in twins]
    offs = [0, 500 * 16, 500 * 16 + 300 * 128]
    out = DEV.nan(offs[-1] + 200 * 33)
    missing = DEV.full(sum(sizes), POISON_POS, np.int64)
    keys = DEV.put(np.zeros(sum(sizes), np.int64))
    for rnd in range(3):                 # the same buffers, new keys written into them each time
        qs = [query(rng, p, n) for p, n in zip(present, sizes)]
        if DEV.name == "torch":
            keys.copy_(DEV.put(np.concatenate(qs)))
            out.fill_(float("nan"))            # re-poisoned: misses must leave their rows untouched
            missing.fill_(POISON_POS)
        else:
            keys.set(np.concatenate(qs))
            out.fill(np.nan)
            missing.fill(POISON_POS)
        counts = look.lookup(caches, keys, sizes, out, offs, missing, stream=DEV.stream())
        h_out, h_miss = DEV.get(out), DEV.get(missing)
        k = 0
        for i, (t, q) in enumerate(zip(twins, qs)):
            ref_rows, ref_miss = own(t.b, q)
            assert counts[i] == ref_miss.size, f"round {rnd}, {describe(i, t.a, q.size)}: count"
            np.testing.assert_array_equal(h_miss[k:k + counts[i]], ref_miss, err_msg=f"round {rnd}, table {i}: misses")
            assert (h_miss[k + counts[i]:k + q.size] == POISON_POS).all(), f"round {rnd}, table {i}: missing overwritten"
            got = h_out[offs[i]:offs[i] + q.size * t.dim].reshape(q.size, t.dim)
            np.testing.assert_array_equal(bits(got), bits(ref_rows), err_msg=f"round {rnd}, table {i}: rows")
            k += q.size
    # Other caches of the same geometry, in the same call shape: their rows, not the first ones'.
    qs = [query(rng, p, n) for p, n in zip(other_present, sizes)]
    check_against_own(look, others, qs)
    # One cache twice (and a third table): both parts answered from it.
    dup = [twins[0], twins[0], twins[2]]
    qs = [query(rng, present[0], 400), query(rng, present[0], 250), query(rng, present[2], 100)]
    check_against_own(look, dup, qs)
    check_stats(twins + others)


def one_set_caches(dim, ways, proof):
    """Twins whose keys all share one set: a cache of one set, or (proof) of 65,536 sets with
    keys of one set, so that a dynamic cache at dims > 16 keeps its stamps in proof words."""
    from test_embedding_cache_cuda import PROOF_SETS, one_set_keys

    if proof:
        cap = PROOF_SETS * ways
        keys = one_set_keys(3 * ways)
    else:
        cap = ways
        keys = np.arange(3 * ways, dtype=np.int64) * 7919 - 40_000
    a = core.CudaEmbeddingCache(cap, dim, ways=ways)
    b = core.CudaEmbeddingCache(cap, dim, ways=ways)
    return a, b, keys


@pytest.mark.parametrize("static_too", [False, True])
def test_lru_evictions_after_fused_lookups_match(rng, static_too):
    """Stamps: tables of one set each (stamps beside the tags at dim 16, in slot words at 33 and
    128, in proof words at 7 with 65,536 sets), filled one key per insert() (distinct stamps, fixed
    ways). A fused lookup of some keys on twin A, their own lookups on twin B, then new keys one
    per insert(): the keys not looked up go first (oldest first), then the looked-up ones; both
    twins evict the same keys, and hold the same keys and rows afterwards. A static table in the
    call (static_too) evicts nothing and writes no stamps."""
    specs = [(16, 8, False), (33, 8, False), (128, 4, False), (7, 4, True)]
    tabs = [one_set_caches(*s) for s in specs]
    if static_too:
        sa = core.CudaEmbeddingCache(8, 16, ways=8, static=True)
        sb = core.CudaEmbeddingCache(8, 16, ways=8, static=True)
        tabs.append((sa, sb, np.arange(24, dtype=np.int64) + 10**12))
    look = core.CudaCacheLookup(0)
    s = DEV.stream()
    rows = {}

    def insert_one(i, a, b, key):
        v = rng.standard_normal((1, a.dim)).astype(np.float32)
        na = a.insert(DEV.put(np.array([key])), DEV.put(v), stream=s)
        nb = b.insert(DEV.put(np.array([key])), DEV.put(v), stream=s)
        assert na == nb, f"table {i}: insert of key {key} stored {na} in A, {nb} in B"
        if na:
            rows[(i, int(key))] = v[0]

    for i, (a, b, keys) in enumerate(tabs):
        for key in keys[: a.ways]:
            insert_one(i, a, b, key)
    # Look up a few of each table's keys (repeated), with an absent one: hits stamped in A by the
    # fused kernel, in B by its own.
    looked = []
    qs = []
    for i, (a, b, keys) in enumerate(tabs):
        pick = keys[rng.permutation(a.ways)[: max(1, a.ways // 3)]]
        looked.append(set(pick.tolist()))
        q = np.concatenate([pick, pick[:1], keys[-1:]])  # keys[-1] was never inserted
        qs.append(q[rng.permutation(q.size)])
    counts, out, missing, offs = fused(look, [t[0] for t in tabs], qs)
    for i, ((a, b, keys), q) in enumerate(zip(tabs, qs)):
        ref_rows, ref_miss = own(b, q)
        assert counts[i] == ref_miss.size == 1, f"table {i}: {counts[i]} fused misses, {ref_miss.size} own, 1 expected"
        got = out[offs[i]:offs[i] + q.size * a.dim].reshape(q.size, a.dim)
        np.testing.assert_array_equal(bits(got), bits(ref_rows), err_msg=f"table {i}: rows")
    # New keys one per insert(): as many as the keys not looked up, which must be exactly those evicted.
    for i, (a, b, keys) in enumerate(tabs):
        n_new = a.ways - len(looked[i])
        for key in keys[a.ways: a.ways + n_new]:
            insert_one(i, a, b, key)
        everything = keys[: 2 * a.ways]
        ra, ma = own(a, everything)
        rb, mb = own(b, everything)
        np.testing.assert_array_equal(ma, mb, err_msg=f"table {i} (dim {a.dim}): A and B hold different keys")
        np.testing.assert_array_equal(bits(ra), bits(rb), err_msg=f"table {i}: A and B rows differ")
        held = set(everything[np.setdiff1d(np.arange(everything.size), ma)].tolist())
        if a.static:
            assert held == set(keys[: a.ways].tolist()), f"static table {i} changed its keys: {sorted(held)}"
        else:
            want = looked[i] | set(keys[a.ways: a.ways + n_new].tolist())
            assert held == want, (f"table {i} (dim {a.dim}): after the fused lookup of {sorted(looked[i])}, "
                                  f"{n_new} inserts left {sorted(held)}, expected {sorted(want)}")
    # One more insert each: now a looked-up key goes (the oldest stamps tie; the lowest way breaks it).
    for i, (a, b, keys) in enumerate(tabs):
        insert_one(i, a, b, keys[2 * a.ways])
        ra, ma = own(a, keys)
        rb, mb = own(b, keys)
        np.testing.assert_array_equal(ma, mb, err_msg=f"table {i} (dim {a.dim}): A and B evicted different keys")
        np.testing.assert_array_equal(bits(ra), bits(rb), err_msg=f"table {i}: A and B rows differ")
        sta, stb = a.stats(), b.stats()
        assert sta == stb, f"table {i} (dim {a.dim}, static {a.static}): stats {sta} != {stb}"


def test_errors_name_the_argument(rng):
    """Bad arguments are refused before any work, as before the fused kernel."""
    twins = [Twin(512, 16), Twin(512, 33)]
    for t in twins:
        fill(rng, t, 100)
    look = core.CudaCacheLookup(0)
    caches = [t.a for t in twins]
    out = DEV.nan(10 * 16 + 10 * 33)
    missing = DEV.full(20, 0, np.int64)
    keys = DEV.put(np.arange(20, dtype=np.int64))
    with pytest.raises(ValueError, match=r"sizes\[1\] must be >= 0"):
        look.lookup(caches, keys, [20, -1], out, [0, 320], missing)
    with pytest.raises(ValueError, match=r"out_offsets\[1\] = 100 must be at least 160"):
        look.lookup(caches, keys, [10, 10], out, [0, 100], missing)
    with pytest.raises(ValueError, match=r"caches\[0\] must be a CudaEmbeddingCache"):
        look.lookup([object(), caches[1]], keys, [10, 10], out, [0, 160], missing)
    assert look.lookup(caches, keys, [10, 10], out, [0, 160], missing) is not None

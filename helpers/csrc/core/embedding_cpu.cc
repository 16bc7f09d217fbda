// Multi-threaded CPU kernels of the contract in embedding.h: the forward, the backward and the
// sparse optimizers. The entry points of embedding.h call them through embedding_api_cpu.cc.
//
// Where the time goes: the forward and the optimizers are gathers/scatters of random table
// rows, bound by memory latency, so they prefetch a few keys ahead and parallelise over
// (table, row block). The forward sums each output row in registers and stores it once
// (pool_row), as FBGEMM's JIT EmbeddingSpMDM (torch's EmbeddingBag on the CPU) does. The backward groups each table's keys with an LSD radix sort over only
// the bits the largest key needs (two 10-bit passes for a 1M-row table), then sums the
// output-gradient rows in one pass in position order (sequential reads), so contributions to
// one key are added in position order: deterministic bits.
//
// Compiled once per instruction set (CMakeLists.txt, cpu_isa.h): into namespace
// embedlab::baseline, and with EMBEDLAB_ISA_AVX2 into embedlab::avx2. AVX2's 32-byte loads, adds
// and stores halve the memory instructions per table row: at dims 64 and 128 the SSE2 forward
// ran 11-28 % above a plain gather of the same rows and the AVX2 one at or below it
// (helpers/benchmarks/gather_floor.cc, 2-core AMD EPYC VM). Both copies do the same float
// operations in the same order and nothing is contracted into an FMA (-ffp-contract=off), so
// they give the same bits.
//
// The AVX2 copy is compiled under `#pragma GCC target("avx2")`, opened after the last #include,
// rather than with -mavx2: only the functions defined in this file become AVX2 code. The inline
// functions and templates of the headers (std::vector, std::function, ...) keep the baseline
// target wherever they are emitted out of line; the linker keeps one copy of each for the whole
// library, and with -mavx2 that copy could be an AVX2 one that a baseline caller then runs on a
// CPU without AVX2. Inlined into an AVX2 function they are compiled for AVX2 there.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "cpu_isa.h"
#include "embedding.h"

#if defined(EMBEDLAB_ISA_AVX2)
#if !defined(__GNUC__) || defined(__clang__)
#error "the AVX2 kernels are compiled with GCC's #pragma GCC target (CMakeLists.txt builds them with GCC only)"
#endif
#define EMBEDLAB_ISA_NS avx2
#define EMBEDLAB_ISA_ENUM CpuIsa::kAvx2
#pragma GCC push_options
#pragma GCC target("avx2")
#else
#define EMBEDLAB_ISA_NS baseline
#define EMBEDLAB_ISA_ENUM CpuIsa::kBaseline
#endif

namespace embedlab {
namespace EMBEDLAB_ISA_NS {
namespace {

constexpr int kPrefetchDistance = 16;

// How many keys ahead the forward prefetches: about 128 cache lines of rows in flight, at least
// 16 keys (FBGEMM's distance) and at most 64. A plain read of the forward's random rows was
// fastest at 64 keys ahead for 64-byte rows, 32 for 256-byte ones and 16 for 512-byte ones
// (gather_floor.cc on the 2-core AMD EPYC VM: at dim 16, 0.41 ms at 64 keys vs 0.80 at 16).
constexpr int64_t forward_prefetch_distance(int64_t dim) {
  const int64_t lines = (dim * 4 + 63) / 64;
  const int64_t d = 128 / (lines > 0 ? lines : 1);
  return d < 16 ? 16 : (d > 64 ? 64 : d);
}

inline void prefetch_row(const float* row, int64_t dim) {
  // One prefetch per 64-byte line; rows longer than 256 floats only get their head fetched,
  // the hardware prefetcher follows sequential lines from there. PREFETCHT0 (into L1, the hint
  // FBGEMM's EmbeddingSpMDM uses): a plain read of the forward's random rows took 4.37 ms with it
  // and 5.29 ms with PREFETCHT2 at dim 128, 16 keys ahead (gather_floor.cc, 2-core AMD EPYC VM).
  const int64_t lines = std::min<int64_t>((dim * 4 + 63) / 64, 16);
  for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(row + l * 16, 0, 3);
}

// The same for a row about to be updated in place: fetched with intent to write (PREFETCHW),
// so the line arrives owned and the store does not need a second trip to upgrade it. On the
// 2-core VM, 213k random read-modify-writes of 64-byte rows took 9.1 ms after read prefetches
// and 3.5 ms after write prefetches (no prefetch: 25 ms).
inline void prefetch_row_for_write(float* row, int64_t dim) {
  const int64_t lines = std::min<int64_t>((dim * 4 + 63) / 64, 16);
  for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(row + l * 16, 1, 1);
}

// Row arithmetic with the width known at compile time where it matters. D > 0 is the row width;
// D == 0 means "read it at run time". Fixed widths let the compiler unroll into straight vector
// code (no loop, no memset call per row), which is most of the per-key cost once rows are in
// cache. Every variant does the same float operations in the same order: same bits.
template <int D>
struct Width {
  static constexpr int64_t get(int64_t) { return D; }
};
template <>
struct Width<0> {
  static int64_t get(int64_t dim) { return dim; }
};

template <int D>
inline void axpy(float* __restrict out, const float* __restrict src, float w, int64_t dim) {
  const int64_t n = Width<D>::get(dim);
  for (int64_t d = 0; d < n; ++d) out[d] += w * src[d];
}
template <int D>
inline void add(float* __restrict out, const float* __restrict src, int64_t dim) {
  const int64_t n = Width<D>::get(dim);
  for (int64_t d = 0; d < n; ++d) out[d] += src[d];
}
template <int D>
inline void zero(float* __restrict out, int64_t dim) {
  const int64_t n = Width<D>::get(dim);
  for (int64_t d = 0; d < n; ++d) out[d] = 0.f;
}

// Calls fn(std::integral_constant<int, D>) with D = dim for the common widths, else D = 0.
template <typename F>
inline void dispatch_dim(int64_t dim, F fn) {
  switch (dim) {
    case 4: return fn(std::integral_constant<int, 4>());
    case 8: return fn(std::integral_constant<int, 8>());
    case 16: return fn(std::integral_constant<int, 16>());
    case 32: return fn(std::integral_constant<int, 32>());
    case 64: return fn(std::integral_constant<int, 64>());
    case 128: return fn(std::integral_constant<int, 128>());
    default: return fn(std::integral_constant<int, 0>());
  }
}

// Maps a flat unit index over several tables (unit = one row, or one index) to its table.
struct FlatIndex {
  std::vector<int64_t> starts;  // starts[t] = first unit of table t; starts[T] = total
  template <typename F>
  explicit FlatIndex(int num_tables, F units_of) : starts(num_tables + 1, 0) {
    for (int t = 0; t < num_tables; ++t) starts[t + 1] = starts[t] + units_of(t);
  }
  int64_t total() const { return starts.back(); }
  // Calls fn(t, begin, end) for the parts of [b, e) that fall in each table t.
  template <typename F>
  void for_each(int64_t b, int64_t e, F fn) const {
    int t = static_cast<int>(std::upper_bound(starts.begin(), starts.end(), b) - starts.begin()) - 1;
    while (b < e) {
      const int64_t te = std::min(e, starts[t + 1]);
      if (te > b) fn(t, b - starts[t], te - starts[t]);
      b = te;
      ++t;
    }
  }
};

// Calls fn(t, r0, r1) in parallel on blocks of output rows [r0, r1) of table t, over the
// rows_of(t) rows of every table (0 skips a table), with the forward's cost hint (~1 ns per
// element: each row's output plus each key's table row).
template <typename RowsOf, typename F>
void parallel_over_rows(const LookupArgs* tables, int num_tables, ThreadPool& pool, RowsOf rows_of, F fn) {
  FlatIndex flat(num_tables, rows_of);
  if (flat.total() == 0) return;
  int64_t work = 0;
  for (int t = 0; t < num_tables; ++t) work += (tables[t].ids.nnz + tables[t].ids.batch) * tables[t].dim;
  const int64_t cost = std::max<int64_t>(1, work / flat.total());
  pool.parallel_for(flat.total(), cost, [&](int64_t b, int64_t e) { flat.for_each(b, e, fn); });
}

// Key j of an output row o: prefetches the table row of the key forward_prefetch_distance ahead in the
// flat key stream (across row boundaries, below jend: rows are random DRAM lines, so several
// must be in flight), then adds key j's row, weighted, into o and its weight into *wsum.
// Returns false for a key outside [-1, num_rows), which is skipped like -1. The path for widths
// that are not a multiple of 8 (pool_row below takes the others).
template <int D>
inline bool add_key(const LookupArgs& a, float* __restrict o, int64_t j, int64_t jend, float* wsum) {
  const int64_t dim = Width<D>::get(a.dim);
  const int64_t* keys = a.ids.keys;
  const int64_t ahead = forward_prefetch_distance(dim);
  if (j + ahead < jend) {
    const int64_t kp = keys[j + ahead];
    if (kp >= 0) prefetch_row(a.table + kp * dim, dim);
  }
  const int64_t k = keys[j];
  if (static_cast<uint64_t>(k) >= static_cast<uint64_t>(a.num_rows)) return k == -1;  // k < 0 or k >= rows
  const float* src = a.table + k * dim;
  const float* w = a.ids.weights;
  if (w) {
    axpy<D>(o, src, w[j], dim);
    *wsum += w[j];
  } else {
    add<D>(o, src, dim);
    *wsum += 1.f;
  }
  return true;
}

// The combiner's last step on a finished output row: mean divides by the summed weights (a row
// without valid keys stays zero).
template <int D>
inline void finish_row(const LookupArgs& a, float* o, float wsum) {
  if (a.combiner != Combiner::kMean) return;
  const int64_t dim = Width<D>::get(a.dim);
  if (wsum != 0.f) {
    for (int64_t d = 0; d < dim; ++d) o[d] /= wsum;
  } else {
    zero<D>(o, dim);
  }
}

// Eight floats as one value (GCC's vector extension): one ymm register in the AVX2 copy, two xmm
// registers in the baseline one. aligned(4): table and output rows are only float-aligned.
typedef float Vec8 __attribute__((vector_size(32), aligned(4), may_alias));
// Floats of an output row summed in registers at a time: AVX2 has 16 ymm registers, SSE2 16 xmm
// ones (half as wide), and the loads need a few of them.
#if defined(EMBEDLAB_ISA_AVX2)
constexpr int kRegFloats = 64;
#else
constexpr int kRegFloats = 32;
#endif

// One output row o from its keys [jb, je) (jend: where the block's keys end, the prefetch
// bound). Widths that are a multiple of 8 sum in registers, kRegFloats columns at a time (the
// keys of the row are walked once per such chunk; the later walks find the rows in cache), and
// store each output float once: what FBGEMM's JIT EmbeddingSpMDM does. The first walk prefetches
// the row forward_prefetch_distance(D) keys ahead. Same float operations in the same order as add_key's
// loop (0 + w_0 x_0 + w_1 x_1 + ..., products rounded before the add), so the same bits.
// Returns false if a key outside [-1, num_rows) was seen (and skipped).
template <int D>
inline bool pool_row(const LookupArgs& a, float* __restrict o, int64_t jb, int64_t je, int64_t jend) {
  if constexpr (D == 0 || D % 8 != 0) {
    float wsum = 0.f;
    bool ok = true;
    zero<D>(o, a.dim);
    for (int64_t j = jb; j < je; ++j) ok &= add_key<D>(a, o, j, jend, &wsum);
    finish_row<D>(a, o, wsum);
    return ok;
  } else {
    constexpr int kChunk = D < kRegFloats ? D : kRegFloats;
    constexpr int kVecs = kChunk / 8;
    constexpr int64_t kAhead = forward_prefetch_distance(D);
    static_assert(D % kChunk == 0, "the fixed widths are multiples of the register chunk");
    const int64_t* keys = a.ids.keys;
    const float* w = a.ids.weights;
    const uint64_t rows = static_cast<uint64_t>(a.num_rows);
    bool ok = true;
    float wsum = 0.f;
    for (int c = 0; c < D; c += kChunk) {
      Vec8 acc[kVecs];
      for (int v = 0; v < kVecs; ++v) acc[v] = Vec8{};
      for (int64_t j = jb; j < je; ++j) {
        if (c == 0 && j + kAhead < jend) {
          const int64_t kp = keys[j + kAhead];
          if (kp >= 0) prefetch_row(a.table + kp * D, D);
        }
        const int64_t k = keys[j];
        if (static_cast<uint64_t>(k) >= rows) {  // k < 0 or k >= rows: skipped
          ok &= k == -1;
          continue;
        }
        const Vec8* src = reinterpret_cast<const Vec8*>(a.table + k * D + c);
        if (w) {
          const float wj = w[j];
          const Vec8 wv = Vec8{} + wj;
          for (int v = 0; v < kVecs; ++v) acc[v] += wv * src[v];
          if (c == 0) wsum += wj;
        } else {
          for (int v = 0; v < kVecs; ++v) acc[v] += src[v];
          if (c == 0) wsum += 1.f;
        }
      }
      Vec8* dst = reinterpret_cast<Vec8*>(o + c);
      for (int v = 0; v < kVecs; ++v) dst[v] = acc[v];
    }
    finish_row<D>(a, o, wsum);
    return ok;
  }
}

// Returns false if a key outside [-1, num_rows) or a row whose offsets are not within
// [0, nnz] and non-decreasing was seen (and skipped): no key or weight outside [0, nnz) is read.
template <int D>
bool forward_rows(const LookupArgs& a, int64_t r0, int64_t r1) {
  bool ok = true;
  const int64_t dim = Width<D>::get(a.dim);
  const int64_t* off = a.ids.row_offsets;
  const int64_t nnz = a.ids.nnz;
  const int64_t jend = std::min(std::max<int64_t>(off[r1], 0), nnz);  // prefetch bound only
  for (int64_t r = r0; r < r1; ++r) {
    float* o = a.out + r * dim;
    const int64_t jb = off[r], je = off[r + 1];
    if (jb < 0 || je < jb || je > nnz) {
      zero<D>(o, dim);
      ok = false;
      continue;
    }
    ok &= pool_row<D>(a, o, jb, je, jend);
  }
  return ok;
}

// Stable LSD radix sort of indices 0..n-1 by keys[i] in [0, key_bound).
void radix_order(const int64_t* keys, int64_t n, int64_t key_bound, std::vector<int64_t>* order) {
  order->resize(n);
  std::iota(order->begin(), order->end(), 0);
  if (n < 2) return;
  if (n < 64) {  // insertion sort is stable and beats histogram set-up here
    auto& o = *order;
    for (int64_t i = 1; i < n; ++i) {
      const int64_t v = o[i];
      int64_t j = i - 1;
      while (j >= 0 && keys[o[j]] > keys[v]) {
        o[j + 1] = o[j];
        --j;
      }
      o[j + 1] = v;
    }
    return;
  }
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) < key_bound) ++bits;
  constexpr int kRadixBits = 11;
  constexpr int64_t kBuckets = int64_t{1} << kRadixBits;
  std::vector<int64_t> tmp(n);
  std::vector<int64_t> kbuf(n), ktmp(n);  // keys carried along: sequential reads per pass
  for (int64_t i = 0; i < n; ++i) kbuf[i] = keys[i];
  std::vector<int64_t> count(kBuckets);
  int64_t* src = order->data();
  int64_t* dst = tmp.data();
  int64_t* ksrc = kbuf.data();
  int64_t* kdst = ktmp.data();
  for (int shift = 0; shift < bits; shift += kRadixBits) {
    std::fill(count.begin(), count.end(), 0);
    for (int64_t i = 0; i < n; ++i) ++count[(ksrc[i] >> shift) & (kBuckets - 1)];
    int64_t sum = 0;
    for (auto& c : count) {
      const int64_t t = c;
      c = sum;
      sum += t;
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = count[(ksrc[i] >> shift) & (kBuckets - 1)]++;
      dst[p] = src[i];
      kdst[p] = ksrc[i];
    }
    std::swap(src, dst);
    std::swap(ksrc, kdst);
  }
  if (src != order->data()) std::memcpy(order->data(), src, sizeof(int64_t) * n);
}

}  // namespace

int lookup_forward(const LookupArgs* tables, int num_tables, ThreadPool& pool) {
  // Offsets: the ends here (O(1)); every row's pair inside the kernel, in the same pass as
  // the lookup. Together that is check_offsets without its separate pass over each table.
  for (int t = 0; t < num_tables; ++t) {
    const CsrIds& ids = tables[t].ids;
    if (ids.batch < 0 || ids.nnz < 0 || ids.row_offsets[0] != 0 || ids.row_offsets[ids.batch] != ids.nnz) return t;
  }
  std::vector<std::atomic<bool>> bad(num_tables);
  for (auto& b : bad) b.store(false, std::memory_order_relaxed);
  parallel_over_rows(tables, num_tables, pool, [&](int t) { return tables[t].ids.batch; },
                     [&](int t, int64_t r0, int64_t r1) {
                       dispatch_dim(tables[t].dim, [&](auto d) {
                         if (!forward_rows<decltype(d)::value>(tables[t], r0, r1))
                           bad[t].store(true, std::memory_order_relaxed);
                       });
                     });
  for (int t = 0; t < num_tables; ++t)
    if (bad[t].load()) return t;
  return -1;
}

namespace {

// The first entry in [0, nnz) whose COO row is >= r, if the rows are in order (if they are
// not, some entry a block then reads falls outside its rows and the table is reported).
int64_t first_entry_of_row(const CooRows& c, int64_t nnz, int64_t r) {
  int64_t lo = 0, hi = nnz;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (c.row_index[mid * c.stride] < r) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Output rows [r0, r1) of one table from its COO entries [j0, j1), whose rows must be
// non-decreasing and inside [r0, r1). Writes row_offsets[r0 + 1 .. r1]. Same float operations
// in the same order as forward_rows on the equivalent CSR ids: same bits.
template <int D>
CooStatus forward_coo_rows(const LookupArgs& a, const CooRows& c, int64_t r0, int64_t r1, int64_t j0, int64_t j1) {
  const int64_t dim = Width<D>::get(a.dim);
  bool keys_ok = true;
  int64_t j = j0;
  for (int64_t r = r0; r < r1; ++r) {
    // Row r's entries: from j while their row index says r (a sequential read ahead of the
    // row reads, which pool_row then does as for CSR ids).
    const int64_t jb = j;
    for (; j < j1; ++j) {
      const int64_t row = c.row_index[j * c.stride];
      if (row != r) {
        if (row < r || row >= r1) return kCooUnordered;
        break;  // row r is complete (or empty)
      }
    }
    keys_ok &= pool_row<D>(a, a.out + r * dim, jb, j, j1);
    c.row_offsets[r + 1] = j;
  }
  if (j != j1) return kCooUnordered;  // entries left over: their rows lie outside [r0, r1)
  return keys_ok ? kCooOk : kCooBadKey;
}

}  // namespace

void lookup_forward_coo(const LookupArgs* tables, const CooRows* coo, int num_tables, ThreadPool& pool,
                        std::vector<int>* status) {
  std::vector<std::atomic<int>> st(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    const int64_t batch = tables[t].ids.batch, nnz = tables[t].ids.nnz;
    const bool bad = batch < 0 || nnz < 0 || (batch == 0 && nnz > 0);  // entries but no row to hold them
    st[t].store(bad ? kCooUnordered : kCooOk, std::memory_order_relaxed);
    if (!bad) coo[t].row_offsets[0] = 0;
  }
  parallel_over_rows(
      tables, num_tables, pool,
      [&](int t) { return st[t].load(std::memory_order_relaxed) == kCooOk ? tables[t].ids.batch : 0; },
      [&](int t, int64_t r0, int64_t r1) {
        const LookupArgs& a = tables[t];
        // The first block of a table starts at entry 0 and the last ends at nnz, whatever the
        // rows say: together with each block's check, every entry is covered and in order.
        const int64_t j0 = r0 == 0 ? 0 : first_entry_of_row(coo[t], a.ids.nnz, r0);
        const int64_t j1 = r1 == a.ids.batch ? a.ids.nnz : first_entry_of_row(coo[t], a.ids.nnz, r1);
        CooStatus s = kCooUnordered;
        if (j0 <= j1) {
          dispatch_dim(a.dim, [&](auto d) { s = forward_coo_rows<decltype(d)::value>(a, coo[t], r0, r1, j0, j1); });
        }
        if (s != kCooOk) {  // the worst status wins: unordered over a bad key
          int cur = st[t].load(std::memory_order_relaxed);
          while (cur < s && !st[t].compare_exchange_weak(cur, s, std::memory_order_relaxed)) {
          }
        }
      });
  status->resize(num_tables);
  for (int t = 0; t < num_tables; ++t) (*status)[t] = st[t].load();
}

void sort_runs(const int64_t* keys, int64_t n, int64_t key_bound, std::vector<int64_t>* order,
               std::vector<int64_t>* run_starts, ThreadPool&) {
  radix_order(keys, n, key_bound, order);
  run_starts->clear();
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || keys[(*order)[i]] != keys[(*order)[i - 1]]) run_starts->push_back(i);
  }
  run_starts->push_back(n);
}

namespace {

int bits_for(uint64_t bound) {  // smallest b with 2^b >= bound
  int b = 0;
  while (b < 64 && (uint64_t{1} << b) < bound) ++b;
  return b;
}

// Per-thread scratch is kept between calls only up to this size: a one-off huge call must not
// pin its memory to a pool thread for the life of the process.
template <typename T>
void trim_scratch(std::vector<T>* v) {
  constexpr size_t kMaxKeptBytes = size_t{64} << 20;
  if (v->capacity() * sizeof(T) > kMaxKeptBytes) std::vector<T>().swap(*v);
}

// Stable LSD radix sort of packed values by bits [lo, lo + nbits), in as few passes of at most
// 11 bits as cover them, the bits shared evenly (20 key bits: two passes of 10). The low bits
// hold the position, so equal keys stay in position order without a second array. One read
// pass counts the digits of every pass; a pass whose digit is the same for all values is
// skipped.
void radix_sort_packed(std::vector<uint64_t>* v, std::vector<uint64_t>* tmp, std::vector<int64_t>* counts, int lo,
                       int nbits) {
  constexpr int kMaxBits = 11;
  const int64_t n = static_cast<int64_t>(v->size());
  if (n < 2 || nbits == 0) return;
  const int passes = (nbits + kMaxBits - 1) / kMaxBits;
  const int bits = (nbits + passes - 1) / passes;
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  const int64_t buckets = int64_t{1} << bits;
  counts->assign(static_cast<size_t>(passes * buckets), 0);
  int64_t* count = counts->data();
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t x = (*v)[i] >> lo;
    for (int p = 0; p < passes; ++p) ++count[p * buckets + ((x >> (p * bits)) & mask)];
  }
  tmp->resize(n);
  uint64_t* src = v->data();
  uint64_t* dst = tmp->data();
  for (int p = 0; p < passes; ++p) {
    int64_t* c = count + p * buckets;
    const int shift = lo + p * bits;
    if (c[(src[0] >> shift) & mask] == n) continue;  // one digit for all: already in order
    int64_t sum = 0;
    for (int64_t d = 0; d < buckets; ++d) {
      const int64_t t = c[d];
      c[d] = sum;
      sum += t;
    }
    for (int64_t i = 0; i < n; ++i) dst[c[(src[i] >> shift) & mask]++] = src[i];
    std::swap(src, dst);
  }
  if (src != v->data()) std::memcpy(v->data(), src, sizeof(uint64_t) * n);
}

}  // namespace

int64_t grad_prepare(LookupGradCpu::State* state, const LookupGradArgs& args, ThreadPool& pool) {
  LookupGradCpu::State& s = *state;
  // Groups the contributions by key: each valid position's index among the sorted unique keys
  // (s.slot_of_pos). fill() then walks the ids in position order, reading each output-gradient
  // row once and in order, and sums into the rows of the unique keys in position order per key.
  s.args = args;
  const CsrIds& ids = args.ids;
  s.slot_of_pos.resize(ids.nnz);
  s.unique_keys.clear();
  // One pass: min / max / count, and each valid key packed as (key << pos_bits | position)
  // for a sort on the key bits only; a key too wide to pack sends the table to the slow path.
  const int pos_bits = bits_for(static_cast<uint64_t>(ids.nnz));
  const uint64_t too_wide = pos_bits == 0 ? 0 : ~uint64_t{0} << (64 - pos_bits);
  // The sort's buffers belong to the calling thread, not to this table (only prepare() reads
  // them): one thread preparing many tables in turn reuses buffers that stay in its L2 cache.
  thread_local std::vector<uint64_t> packed, scratch;
  thread_local std::vector<int64_t> counts;
  packed.resize(ids.nnz);
  int64_t max_key = 0, valid = 0, min_key = INT64_MAX;
  uint64_t wide = 0;
  for (int64_t j = 0; j < ids.nnz; ++j) {
    const int64_t k = ids.keys[j];
    min_key = std::min(min_key, k);
    max_key = std::max(max_key, k);
    if (k >= 0) {
      wide |= static_cast<uint64_t>(k) & too_wide;
      packed[valid++] = (static_cast<uint64_t>(k) << pos_bits) | static_cast<uint64_t>(j);
    } else {
      s.slot_of_pos[j] = -1;
    }
  }
  s.min_key = ids.nnz == 0 ? -1 : min_key;
  s.max_key = valid > 0 ? max_key : -1;
  packed.resize(valid);
  if (wide == 0) {
    radix_sort_packed(&packed, &scratch, &counts, pos_bits, bits_for(static_cast<uint64_t>(max_key) + 1));
    const uint64_t pos_mask = pos_bits == 0 ? 0 : (~uint64_t{0} >> (64 - pos_bits));
    for (int64_t i = 0; i < valid; ++i) {
      const int64_t k = static_cast<int64_t>(packed[i] >> pos_bits);
      if (i == 0 || k != s.unique_keys.back()) s.unique_keys.push_back(k);
      s.slot_of_pos[packed[i] & pos_mask] = static_cast<int64_t>(s.unique_keys.size()) - 1;
    }
  } else {  // keys near 2^63: sort (key, position) pairs as two arrays
    std::vector<int64_t> valid_keys, valid_pos, order, runs;
    valid_keys.reserve(valid);
    valid_pos.reserve(valid);
    for (int64_t j = 0; j < ids.nnz; ++j) {
      if (ids.keys[j] < 0) continue;
      valid_keys.push_back(ids.keys[j]);
      valid_pos.push_back(j);
    }
    sort_runs(valid_keys.data(), valid, max_key + 1, &order, &runs, pool);
    for (size_t u = 0; u + 1 < runs.size(); ++u) {
      s.unique_keys.push_back(valid_keys[order[runs[u]]]);
      for (int64_t i = runs[u]; i < runs[u + 1]; ++i)
        s.slot_of_pos[valid_pos[order[i]]] = static_cast<int64_t>(u);
    }
  }
  trim_scratch(&packed);
  trim_scratch(&scratch);
  return static_cast<int64_t>(s.unique_keys.size());
}

namespace {

// The summed gradient rows of the unique keys [u0, u1) (rows[u] for u in that range): one pass
// over the ids in position order, each output-gradient row read once and in order and added
// into the rows of its keys, so each key's contributions are added in increasing position,
// whatever the split into key ranges: deterministic bits. Only the summed rows are written at
// random; they are prefetched for writing ahead in the key stream. The rows start from zero:
// zeroed by a memset of the range, or, with `touched` (nu flags, all 0), each at its key's
// first contribution. The second saves a pass over fresh output memory (fill(): the two-op
// step 1-5 % faster, in-process A/B); into apply()'s warm buffer it measured no faster.
template <int D>
void sum_rows(const LookupGradArgs& g, const int64_t* slot_of_pos, int64_t u0, int64_t u1, float* rows,
              uint8_t* touched) {
  const int64_t dim = Width<D>::get(g.dim);
  const CsrIds& ids = g.ids;
  const bool mean = g.combiner == Combiner::kMean;
  if (!touched) std::memset(rows + u0 * dim, 0, sizeof(float) * (u1 - u0) * dim);
  const int64_t nnz = ids.nnz;
  for (int64_t r = 0; r < ids.batch; ++r) {
    const int64_t jb = ids.row_offsets[r], je = ids.row_offsets[r + 1];
    const float* gr = g.grad_out + r * dim;
    float ws = 1.f;
    if (mean) {  // the forward's divisor: the row's summed weights over its valid keys
      ws = 0.f;
      for (int64_t j = jb; j < je; ++j)
        if (ids.keys[j] >= 0) ws += ids.weights ? ids.weights[j] : 1.f;
    }
    for (int64_t j = jb; j < je; ++j) {
      if (j + kPrefetchDistance < nnz) {
        const int64_t up = slot_of_pos[j + kPrefetchDistance];
        if (up >= u0 && up < u1) prefetch_row_for_write(rows + up * dim, dim);
      }
      const int64_t u = slot_of_pos[j];
      if (u < u0 || u >= u1) continue;  // -1 (no key), or another thread's key range
      float* out = rows + u * dim;
      if (touched && !touched[u]) {
        touched[u] = 1;
        zero<D>(out, dim);
      }
      const float wj = ids.weights ? ids.weights[j] : 1.f;
      if (mean) {
        // d(sum/wsum)/d(row) = w / wsum: divide first, as the forward did.
        for (int64_t d = 0; d < dim; ++d) out[d] += wj * (gr[d] / ws);
      } else if (ids.weights) {
        axpy<D>(out, gr, wj, dim);
      } else {
        add<D>(out, gr, dim);
      }
    }
  }
}

// rows[nu, dim] of all unique keys: one key range per thread. Each range's pass reads all ids
// but sums only its keys' rows, so no two threads write the same row. (With many tables the TF
// op gives each table one thread: one pass.) touched: see sum_rows (nullptr: memset).
void sum_all_rows(const LookupGradArgs& g, const int64_t* slot_of_pos, int64_t nu, float* rows, ThreadPool& pool,
                  uint8_t* touched = nullptr) {
  const int64_t parts = std::min<int64_t>(std::max(pool.num_threads(), 1), nu);
  pool.parallel_for(parts, int64_t{1} << 20, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      dispatch_dim(g.dim, [&](auto d) {
        sum_rows<decltype(d)::value>(g, slot_of_pos, nu * p / parts, nu * (p + 1) / parts, rows, touched);
      });
    }
  });
}

// The optimizers' row updates, shared by sparse_sgd/adagrad/adam and the fused backward: each is called
// as update(width, w, slot1, slot2, g, dim) on one row. Same float32 expression order as Keras.
// kCost: rough ns per element, the thread pool's block-size hint.
struct SgdRow {
  static constexpr int64_t kCost = 1;
  float lr;
  template <typename W>
  void operator()(W, float* __restrict w, float*, float*, const float* __restrict g, int64_t dim_rt) const {
    const int64_t dim = Width<W::value>::get(dim_rt);
    for (int64_t d = 0; d < dim; ++d) w[d] -= g[d] * lr;
  }
};

struct AdagradRow {
  static constexpr int64_t kCost = 4;
  AdagradParams p;
  template <typename W>
  void operator()(W, float* __restrict w, float* __restrict acc, float*, const float* __restrict g,
                  int64_t dim_rt) const {
    const int64_t dim = Width<W::value>::get(dim_rt);
    for (int64_t d = 0; d < dim; ++d) {
      acc[d] += g[d] * g[d];
      w[d] -= (p.lr * g[d]) / std::sqrt(acc[d] + p.epsilon);
    }
  }
};

struct AdamRow {
  static constexpr int64_t kCost = 6;
  float alpha, one_b1, one_b2, eps;
  explicit AdamRow(const AdamParams& p) {
    // Same float32 expression order as Keras' Adam so that rows touched every step match it.
    const float t = static_cast<float>(p.step);
    const float b1p = std::pow(static_cast<float>(p.beta1), t);
    const float b2p = std::pow(static_cast<float>(p.beta2), t);
    alpha = p.lr * std::sqrt(1.f - b2p) / (1.f - b1p);
    one_b1 = static_cast<float>(1.0 - p.beta1);
    one_b2 = static_cast<float>(1.0 - p.beta2);
    eps = p.epsilon;
  }
  template <typename W>
  void operator()(W, float* __restrict w, float* __restrict m, float* __restrict v, const float* __restrict g,
                  int64_t dim_rt) const {
    const int64_t dim = Width<W::value>::get(dim_rt);
    for (int64_t d = 0; d < dim; ++d) {
      m[d] += (g[d] - m[d]) * one_b1;
      v[d] += (g[d] * g[d] - v[d]) * one_b2;
      w[d] -= (m[d] * alpha) / (std::sqrt(v[d]) + eps);
    }
  }
  // The same update with g = 0: a row no batch touched at this step (Global Adam). The full
  // pass and the deferred catch-up both use this one, which is what makes them the same bits.
  template <typename W>
  void zero_grad(W, float* __restrict w, float* __restrict m, float* __restrict v, int64_t dim_rt) const {
    const int64_t dim = Width<W::value>::get(dim_rt);
    for (int64_t d = 0; d < dim; ++d) {
      m[d] += (0.f - m[d]) * one_b1;
      v[d] += (0.f - v[d]) * one_b2;
      w[d] -= (m[d] * alpha) / (std::sqrt(v[d]) + eps);
    }
  }
};

template <typename RowUpdate>
void sparse_update(const SparseUpdateArgs* tables, int num_tables, ThreadPool& pool, RowUpdate update) {
  FlatIndex flat(num_tables, [&](int t) { return tables[t].n; });
  if (flat.total() == 0) return;
  int64_t dims = 0;
  for (int t = 0; t < num_tables; ++t) dims = std::max(dims, tables[t].dim);
  pool.parallel_for(flat.total(), dims * RowUpdate::kCost, [&](int64_t b, int64_t e) {
    flat.for_each(b, e, [&](int t, int64_t i0, int64_t i1) {
      const SparseUpdateArgs& a = tables[t];
      dispatch_dim(a.dim, [&](auto width) {
        for (int64_t i = i0; i < i1; ++i) {
          if (i + kPrefetchDistance < i1) {
            const int64_t kp = a.indices[i + kPrefetchDistance] * a.dim;
            prefetch_row_for_write(a.table + kp, a.dim);
            if (a.slot1) prefetch_row_for_write(a.slot1 + kp, a.dim);
            if (a.slot2) prefetch_row_for_write(a.slot2 + kp, a.dim);
          }
          const int64_t off = a.indices[i] * a.dim;
          update(width, a.table + off, a.slot1 ? a.slot1 + off : nullptr, a.slot2 ? a.slot2 + off : nullptr,
                 a.grads + i * a.dim, a.dim);
        }
      });
    });
  });
}

// Calls fn(row_update) with the update of `opt`.
template <typename F>
void with_update(const SparseOptimizer& opt, F fn) {
  switch (opt.kind) {
    case OptimizerKind::kSgd: return fn(SgdRow{opt.sgd.lr});
    case OptimizerKind::kAdagrad: return fn(AdagradRow{opt.adagrad});
    case OptimizerKind::kAdam: return fn(AdamRow(opt.adam));
  }
}

}  // namespace

void grad_fill(const LookupGradCpu::State& s, int64_t* unique_keys, float* rows, ThreadPool& pool) {
  const int64_t nu = static_cast<int64_t>(s.unique_keys.size());
  if (nu <= 0) return;
  std::memcpy(unique_keys, s.unique_keys.data(), sizeof(int64_t) * nu);
  // rows is usually a fresh output tensor: zero each row at its first contribution rather than
  // in a separate pass (every unique key has at least one, so every row is written).
  thread_local std::vector<uint8_t> touched;
  touched.assign(nu, 0);
  sum_all_rows(s.args, s.slot_of_pos.data(), nu, rows, pool, touched.data());
  trim_scratch(&touched);
}

void grad_apply(const LookupGradCpu::State& s, const SparseUpdateArgs& target, const SparseOptimizer& opt,
                ThreadPool& pool) {
  // Two passes over a reused buffer: the summed rows, then the update, row by row in key order
  // with write prefetches. Interleaving the two per key (or per chunk of 32 to 2,048 keys)
  // measured slower (helpers/benchmarks/RESULTS.md, lookup_cpu): each loop keeps its own stream
  // of misses in flight, and every switch restarts the prefetch pipeline. Same code, so the same bits, as fill() followed
  // by sparse_<opt>_cpu; the difference to that is no output tensors, one op, no allocation.
  const int64_t nu = static_cast<int64_t>(s.unique_keys.size());
  if (nu <= 0) return;
  // The summed rows go to a buffer of the calling thread, not of this table: a thread that
  // applies many tables in turn (the TF op's many-table path) reuses one buffer that stays in
  // its L2 cache, instead of memsetting and filling a cold one per table (26 x 512 KiB a step
  // for the Criteo shape).
  thread_local std::vector<float> sums;
  if (static_cast<int64_t>(sums.size()) < nu * s.args.dim) sums.resize(nu * s.args.dim);
  sum_all_rows(s.args, s.slot_of_pos.data(), nu, sums.data(), pool);
  SparseUpdateArgs a = target;
  a.indices = s.unique_keys.data();
  a.grads = sums.data();
  a.n = nu;
  with_update(opt, [&](auto update) { sparse_update(&a, 1, pool, update); });
  trim_scratch(&sums);
}

void coalesce(const int64_t* indices, const float* rows, int64_t n, int64_t dim, int64_t key_bound,
              std::vector<int64_t>* out_indices, std::vector<float>* out_rows, ThreadPool& pool) {
  std::vector<int64_t> order, runs;
  sort_runs(indices, n, key_bound, &order, &runs, pool);
  const int64_t nu = static_cast<int64_t>(runs.size()) - 1;
  out_indices->resize(std::max<int64_t>(nu, 0));
  out_rows->assign(std::max<int64_t>(nu, 0) * dim, 0.f);
  pool.parallel_for(nu, dim * 2, [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      (*out_indices)[u] = indices[order[runs[u]]];
      float* out = out_rows->data() + u * dim;
      for (int64_t i = runs[u]; i < runs[u + 1]; ++i) add<0>(out, rows + order[i] * dim, dim);
    }
  });
}

void sparse_sgd(const SparseUpdateArgs* tables, int num_tables, SgdParams p, ThreadPool& pool) {
  sparse_update(tables, num_tables, pool, SgdRow{p.lr});
}

void sparse_adagrad(const SparseUpdateArgs* tables, int num_tables, AdagradParams p, ThreadPool& pool) {
  sparse_update(tables, num_tables, pool, AdagradRow{p});
}

void sparse_adam(const SparseUpdateArgs* tables, int num_tables, AdamParams p, ThreadPool& pool) {
  sparse_update(tables, num_tables, pool, AdamRow(p));
}

void global_adam(const SparseUpdateArgs* tables, const int64_t* rows_used, int num_tables, AdamParams p,
                 ThreadPool& pool) {
  std::vector<int64_t> rows(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    const SparseUpdateArgs& a = tables[t];
    rows[t] = std::min(a.num_rows, std::max(rows_used[t], a.n ? a.indices[a.n - 1] + 1 : int64_t{0}));
  }
  FlatIndex flat(num_tables, [&](int t) { return rows[t]; });
  if (flat.total() == 0) return;
  int64_t dims = 0;
  for (int t = 0; t < num_tables; ++t) dims = std::max(dims, tables[t].dim);
  const AdamRow update(p);
  pool.parallel_for(flat.total(), dims * AdamRow::kCost, [&](int64_t b, int64_t e) {
    flat.for_each(b, e, [&](int t, int64_t r0, int64_t r1) {
      const SparseUpdateArgs& a = tables[t];
      int64_t j = std::lower_bound(a.indices, a.indices + a.n, r0) - a.indices;
      dispatch_dim(a.dim, [&](auto width) {
        for (int64_t r = r0; r < r1; ++r) {
          float* w = a.table + r * a.dim;
          float* m = a.slot1 + r * a.dim;
          float* v = a.slot2 + r * a.dim;
          if (j < a.n && a.indices[j] == r) {
            update(width, w, m, v, a.grads + j * a.dim, a.dim);
            ++j;
          } else {
            update.zero_grad(width, w, m, v, a.dim);
          }
        }
      });
    });
  });
}

int64_t global_adam_catch_up(float* table, float* m, float* v, int64_t* last, int64_t num_rows, int64_t dim,
                             const int64_t* rows, int64_t n, int64_t all_rows, int64_t target,
                             const float* lr_ring, int64_t ring, AdamParams p, ThreadPool& pool) {
  const bool all = all_rows >= 0;
  const int64_t count = all ? std::min(all_rows, num_rows) : n;
  auto row_at = [&](int64_t i) { return all ? i : rows[i]; };
  const int64_t oldest = target - ring + 1;     // the first step the ring still holds
  // Check first, so that an error leaves every row as it was.
  std::atomic<int64_t> behind{-1};
  pool.parallel_for(count, 2, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = row_at(i);
      if (last[r] < target && last[r] + 1 < std::max<int64_t>(oldest, 1)) {
        int64_t none = -1;
        behind.compare_exchange_strong(none, r);
        return;
      }
    }
  });
  if (behind.load() >= 0) return behind.load();
  // Step j's update: AdamRow(lr of step j, step j), the expression global_adam_cpu uses.
  std::vector<AdamRow> steps;
  const int64_t first = std::max<int64_t>(oldest, 1);
  for (int64_t j = first; j <= target; ++j) {
    AdamParams q = p;
    q.lr = lr_ring[j % ring];
    q.step = j;
    steps.emplace_back(q);
  }
  pool.parallel_for(count, dim * AdamRow::kCost * 4, [&](int64_t b, int64_t e) {
    dispatch_dim(dim, [&](auto width) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t r = row_at(i);
        int64_t from = __atomic_load_n(&last[r], __ATOMIC_ACQUIRE);
        // Claim the row (a repeated row in `rows` is replayed by one thread only).
        while (from < target &&
               !__atomic_compare_exchange_n(&last[r], &from, target, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        }
        if (from >= target) continue;
        for (int64_t j = from + 1; j <= target; ++j)
          steps[j - first].zero_grad(width, table + r * dim, m + r * dim, v + r * dim, dim);
      }
    });
  });
  return -1;
}

// This copy's entry points, in the order of EmbeddingKernels' fields (cpu_isa.h).
extern const EmbeddingKernels kEmbeddingKernels = {
    EMBEDLAB_ISA_ENUM, &lookup_forward, &lookup_forward_coo, &sort_runs,   &grad_prepare,        &grad_fill,
    &grad_apply,       &sparse_sgd,     &sparse_adagrad,     &sparse_adam, &global_adam,
    &global_adam_catch_up, &coalesce,
};

}  // namespace EMBEDLAB_ISA_NS
}  // namespace embedlab

#if defined(EMBEDLAB_ISA_AVX2)
#pragma GCC pop_options
#endif

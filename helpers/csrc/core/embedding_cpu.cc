// Multi-threaded CPU implementation of embedding.h: the forward and the backward (the
// optimizers, and the fused backward + optimizer, are in sparse_optimizer_cpu.cc; the sorts in
// csr_cpu.cc). The kernels are compiled once per instruction set; the entry points of
// embedding.h at the end of this file are compiled once, with the baseline copy, and call the
// copy that cpu_isa() chose.
//
// Where the time goes: the forward is a gather of random table rows, bound by memory latency,
// so it prefetches a few keys ahead and parallelises over (table, row block). The forward sums
// each output row in registers and stores it once (pool_row), as FBGEMM's JIT EmbeddingSpMDM
// (torch's EmbeddingBag on the CPU) does. The backward groups each table's keys with an LSD
// radix sort (csr_cpu.cc) over only the bits the largest key needs (two 10-bit passes for a
// 1M-row table), then sums the output-gradient rows in one pass in position order (sequential
// reads), so contributions to one key are added in position order: deterministic bits.
//
// Compiled once per instruction set (CMakeLists.txt, cpu_isa.h, cpu_isa_kernels.h): into
// namespace embedlab::baseline, with EMBEDLAB_ISA_AVX2 into embedlab::avx2 and with
// EMBEDLAB_ISA_AVX512 into embedlab::avx512. Each wider copy (AVX2's 32-byte, AVX-512's 64-byte
// vectors) halves the memory instructions per table row, which brings the forward at dims 64 and
// 128 to the speed of a plain gather of the same rows (helpers/benchmarks/gather_floor.cc).
// Every copy does the same float operations in the same order and nothing is contracted into an
// FMA (-ffp-contract=off), so they give the same bits.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_isa.h"
#include "embedding.h"
#include "cpu_isa_kernels.h"  // last: opens the instruction set's namespace and target

namespace embedlab {

// The entry points of one compiled copy of this file's kernels.
struct EmbeddingKernels {
  int (*lookup_forward)(const LookupArgs* tables, int num_tables, ThreadPool& pool);
  void (*lookup_forward_coo)(const LookupArgs* tables, const CooRows* coo, int num_tables, ThreadPool& pool,
                             std::vector<int>* status);
  int64_t (*grad_prepare)(LookupGradCpu::State* s, const LookupGradArgs& args, ThreadPool& pool);
  void (*grad_fill)(const LookupGradCpu::State& s, int64_t* unique_keys, float* rows, ThreadPool& pool);
};

namespace EMBEDLAB_ISA_NS {
namespace {

// How many keys ahead the forward prefetches: about 128 cache lines of rows in flight, at least
// 16 keys (FBGEMM's distance) and at most 64, because a plain read of random rows is fastest
// with more keys ahead the shorter the rows are (helpers/benchmarks/gather_floor.cc).
constexpr int64_t forward_prefetch_distance(int64_t dim) {
  const int64_t lines = (dim * 4 + 63) / 64;
  const int64_t d = 128 / (lines > 0 ? lines : 1);
  return d < 16 ? 16 : (d > 64 ? 64 : d);
}

template <bool L2>
inline void prefetch_row(const float* row, int64_t dim) {
  // One prefetch per 64-byte line; rows longer than 256 floats only get their head fetched,
  // the hardware prefetcher follows sequential lines from there. Into L1 (PREFETCHT0, the hint
  // FBGEMM's EmbeddingSpMDM uses) or L2 (PREFETCHT1), as forward_prefetch_to_l2() chose for this
  // core (cpu_isa.h). A template argument, chosen once per call (with_prefetch_level), because a
  // branch on the flag inside the key loops slows both choices.
  const int64_t lines = std::min<int64_t>((dim * 4 + 63) / 64, 16);
  for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(row + l * 16, 0, L2 ? 2 : 3);
}

// fn(std::bool_constant<L2>{}) with the prefetch level this process chose (cpu_isa.h).
template <typename F>
inline void with_prefetch_level(F&& fn) {
  if (forward_prefetch_to_l2())
    fn(std::true_type{});
  else
    fn(std::false_type{});
}

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
template <int D, bool L2>
inline bool add_key(const LookupArgs& a, float* __restrict o, int64_t j, int64_t jend, float* wsum) {
  const int64_t dim = Width<D>::get(a.dim);
  const int64_t* keys = a.ids.keys;
  const int64_t ahead = forward_prefetch_distance(dim);
  if (j + ahead < jend) {
    const int64_t kp = keys[j + ahead];
    if (kp >= 0) prefetch_row<L2>(a.table + kp * dim, dim);
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

// Eight floats as one value (GCC's vector extension): one ymm register in the AVX2 and AVX-512
// copies, two xmm registers in the baseline one. aligned(4): table and output rows are only
// float-aligned. kWideLanes: the floats of the widest vector pool_row sums rows in (16, one zmm
// register, in the AVX-512 copy, for widths that are a multiple of 16; 8 in the others).
typedef float Vec8 __attribute__((vector_size(32), aligned(4), may_alias));
// Floats of an output row summed in registers at a time: AVX-512 has 32 zmm registers, AVX2 16
// ymm ones (half as wide), SSE2 16 xmm ones (a quarter), and the loads need a few of them.
#if defined(EMBEDLAB_ISA_AVX512)
constexpr int kWideLanes = 16;
constexpr int kRegFloats = 128;
#elif defined(EMBEDLAB_ISA_AVX2)
constexpr int kWideLanes = 8;
constexpr int kRegFloats = 64;
#else
constexpr int kWideLanes = 8;
constexpr int kRegFloats = 32;
#endif

// One output row o from its keys [jb, je) (jend: where the block's keys end, the prefetch
// bound). Widths that are a multiple of 8 sum in registers, kRegFloats columns at a time (the
// keys of the row are walked once per such chunk; the later walks find the rows in cache), and
// store each output float once: what FBGEMM's JIT EmbeddingSpMDM does. The first walk prefetches
// the row forward_prefetch_distance(D) keys ahead. Same float operations in the same order as add_key's
// loop (0 + w_0 x_0 + w_1 x_1 + ..., products rounded before the add), so the same bits.
// Returns false if a key outside [-1, num_rows) was seen (and skipped).
template <int D, bool L2>
inline bool pool_row(const LookupArgs& a, float* __restrict o, int64_t jb, int64_t je, int64_t jend) {
  if constexpr (D == 0 || D % 8 != 0) {
    float wsum = 0.f;
    bool ok = true;
    zero<D>(o, a.dim);
    for (int64_t j = jb; j < je; ++j) ok &= add_key<D, L2>(a, o, j, jend, &wsum);
    finish_row<D>(a, o, wsum);
    return ok;
  } else {
    // Not std::conditional_t of two typedefs: a template argument drops aligned(4) and may_alias.
    constexpr int kLanes = D % kWideLanes == 0 ? kWideLanes : 8;
    typedef float Vec __attribute__((vector_size(kLanes * sizeof(float)), aligned(4), may_alias));
    constexpr int kChunk = D < kRegFloats ? D : kRegFloats;
    constexpr int kVecs = kChunk / kLanes;
    constexpr int64_t kAhead = forward_prefetch_distance(D);
    static_assert(D % kChunk == 0, "the fixed widths are multiples of the register chunk");
    const int64_t* keys = a.ids.keys;
    const float* w = a.ids.weights;
    const uint64_t rows = static_cast<uint64_t>(a.num_rows);
    bool ok = true;
    float wsum = 0.f;
    for (int c = 0; c < D; c += kChunk) {
      Vec acc[kVecs];
      for (int v = 0; v < kVecs; ++v) acc[v] = Vec{};
      for (int64_t j = jb; j < je; ++j) {
        if (c == 0 && j + kAhead < jend) {
          const int64_t kp = keys[j + kAhead];
          if (kp >= 0) prefetch_row<L2>(a.table + kp * D, D);
        }
        const int64_t k = keys[j];
        if (static_cast<uint64_t>(k) >= rows) {  // k < 0 or k >= rows: skipped
          ok &= k == -1;
          continue;
        }
        const Vec* src = reinterpret_cast<const Vec*>(a.table + k * D + c);
        if (w) {
          const float wj = w[j];
          const Vec wv = Vec{} + wj;
          for (int v = 0; v < kVecs; ++v) acc[v] += wv * src[v];
          if (c == 0) wsum += wj;
        } else {
          for (int v = 0; v < kVecs; ++v) acc[v] += src[v];
          if (c == 0) wsum += 1.f;
        }
      }
      Vec* dst = reinterpret_cast<Vec*>(o + c);
      for (int v = 0; v < kVecs; ++v) dst[v] = acc[v];
    }
    finish_row<D>(a, o, wsum);
    return ok;
  }
}

// Returns false if a key outside [-1, num_rows) or a row whose offsets are not within
// [0, nnz] and non-decreasing was seen (and skipped): no key or weight outside [0, nnz) is read.
template <int D, bool L2>
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
    ok &= pool_row<D, L2>(a, o, jb, je, jend);
  }
  return ok;
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
                       with_prefetch_level([&](auto l2) {
                         dispatch_dim(tables[t].dim, [&](auto d) {
                           if (!forward_rows<decltype(d)::value, decltype(l2)::value>(tables[t], r0, r1))
                             bad[t].store(true, std::memory_order_relaxed);
                         });
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
template <int D, bool L2>
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
    keys_ok &= pool_row<D, L2>(a, a.out + r * dim, jb, j, j1);
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
          with_prefetch_level([&](auto l2) {
            dispatch_dim(a.dim, [&](auto d) {
              s = forward_coo_rows<decltype(d)::value, decltype(l2)::value>(a, coo[t], r0, r1, j0, j1);
            });
          });
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

namespace {

int bits_for(uint64_t bound) {  // smallest b with 2^b >= bound
  int b = 0;
  while (b < 64 && (uint64_t{1} << b) < bound) ++b;
  return b;
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
// first contribution. The second saves a pass over fresh output memory (fill()); a buffer that
// is already in cache (apply()'s) gains nothing from it.
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

}  // namespace

// rows[nu, dim] of all unique keys: one key range per thread. Each range's pass reads all ids
// but sums only its keys' rows, so no two threads write the same row. (With many tables the TF
// op gives each table one thread: one pass.) touched: see sum_rows (nullptr: memset).
void sum_all_rows(const LookupGradArgs& g, const int64_t* slot_of_pos, int64_t nu, float* rows, ThreadPool& pool,
                  uint8_t* touched) {
  const int64_t parts = std::min<int64_t>(std::max(pool.num_threads(), 1), nu);
  pool.parallel_for(parts, int64_t{1} << 20, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      dispatch_dim(g.dim, [&](auto d) {
        sum_rows<decltype(d)::value>(g, slot_of_pos, nu * p / parts, nu * (p + 1) / parts, rows, touched);
      });
    }
  });
}

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

extern const EmbeddingKernels kEmbeddingKernels = {&lookup_forward, &lookup_forward_coo, &grad_prepare, &grad_fill};

}  // namespace EMBEDLAB_ISA_NS
}  // namespace embedlab

// ---- the entry points of embedding.h (compiled once, in the baseline copy) ------------------
#if EMBEDLAB_ISA_BASELINE_COPY
namespace embedlab {

EMBEDLAB_CPU_ISA_KERNELS(EmbeddingKernels, kEmbeddingKernels)

bool parse_combiner(const std::string& name, Combiner* out) {
  if (name == "sum") { *out = Combiner::kSum; return true; }
  if (name == "mean") { *out = Combiner::kMean; return true; }
  return false;
}

std::string check_offsets(const CsrIds& ids) {
  if (ids.batch < 0 || ids.nnz < 0) return "negative size (batch " + str(ids.batch) + ", nnz " + str(ids.nnz) + ")";
  const int64_t* off = ids.row_offsets;
  if (off[0] != 0) return "row_offsets[0] is " + str(off[0]) + ", expected 0";
  for (int64_t r = 0; r < ids.batch; ++r) {
    if (off[r + 1] < off[r])
      return "row_offsets decrease at row " + str(r) + " (" + str(off[r]) + " then " + str(off[r + 1]) + ")";
  }
  if (off[ids.batch] != ids.nnz)
    return "row_offsets end at " + str(off[ids.batch]) + " but there are " + str(ids.nnz) + " keys";
  return "";
}

std::string check_ids(const CsrIds& ids, int64_t num_rows) {
  std::string err = check_offsets(ids);
  if (!err.empty()) return err;
  const int64_t* off = ids.row_offsets;
  for (int64_t j = 0; j < ids.nnz; ++j) {
    const int64_t k = ids.keys[j];
    if (k < -1 || k >= num_rows) {
      const int64_t row = std::upper_bound(off, off + ids.batch + 1, j) - off - 1;
      const std::string where = "key " + str(k) + " at position " + str(j) + " (row " + str(row) + ")";
      if (k < -1) return where + " is negative; only -1 may mark a missing key";
      return where + " is outside the table of " + str(num_rows) + " rows";
    }
  }
  return "";
}

int lookup_forward_cpu(const LookupArgs* tables, int num_tables, ThreadPool& pool) {
  return kernels().lookup_forward(tables, num_tables, pool);
}

void lookup_forward_coo_cpu(const LookupArgs* tables, const CooRows* coo, int num_tables, ThreadPool& pool,
                            std::vector<int>* status) {
  kernels().lookup_forward_coo(tables, coo, num_tables, pool, status);
}

int64_t LookupGradCpu::prepare(const LookupGradArgs& args, ThreadPool& pool) {
  return kernels().grad_prepare(&s_, args, pool);
}

void LookupGradCpu::fill(int64_t* unique_keys, float* rows, ThreadPool& pool) const {
  kernels().grad_fill(s_, unique_keys, rows, pool);
}

}  // namespace embedlab
#endif  // EMBEDLAB_ISA_BASELINE_COPY

// The deterministic backward engine of the CUDA kernels: sort the (key, position) pairs of up to
// 32 tables with CUB, number the runs of equal keys, sum each key's contributions in segments of
// kCudaSegment in position order (hot keys in a fixed tree), and hand each finished row to an
// "epilogue". The lookup backward (embedding_cuda.cu: GradEpi writes the summed rows) and the
// optimizers (sparse_optimizer_cuda.cu: SgdEpi, AdagradEpi, AdamEpi, FtrlEpi update the table rows in
// place, the fused backward + optimizer) instantiate it with their epilogue; the templates live
// here so that each file compiles only its own. The sort is the GPU's index preparation (csr.h
// on the CPU). Why it looks like this: the comment at the top of embedding_cuda.cu.
//
// Internal to csrc/core: included by .cu files only.
#pragma once

#include <cub/cub.cuh>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "embedding.h"
#include "sparse_optimizer.h"

namespace embedlab {

// The backward variant (benchmark knob, same bits: state prefetch, min blocks per SM), one
// setting for every file that launches the engine; defined, with its defaults, in
// embedding_cuda.cu (set_cuda_backward_variant).
extern bool g_backward_prefetch;
extern int g_backward_min_blocks;

// The device's multiprocessor count, read once per process (embedding_cuda.cu).
cudaError_t num_sms(int* out);

namespace {

#define EL_TRY(expr)                          \
  do {                                        \
    const cudaError_t el_err_ = (expr);       \
    if (el_err_ != cudaSuccess) return el_err_; \
  } while (0)

constexpr int kBlock = 256;        // threads per block of the row kernels
constexpr int kTreeBlock = 1024;   // threads per block of the hot-key tree reduction
constexpr int kMaxTablesPerLaunch = 32;
constexpr int S = kCudaSegment;

inline int log2_lanes_for(int64_t vecs) {
  int l = 0;
  while (l < 5 && (int64_t{1} << l) < vecs) ++l;
  return l;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---- vectors of V floats (V = 4: one 16-byte access; V = 1: scalars) ------------------------

template <int V>
struct Vec {
  float v[V];
};

template <int V>
__device__ __forceinline__ Vec<V> vzero() {
  Vec<V> r;
#pragma unroll
  for (int i = 0; i < V; ++i) r.v[i] = 0.f;
  return r;
}

// Read-only path (__ldg): table rows in the forward, gradient rows in the backward.
template <int V>
__device__ __forceinline__ Vec<V> vldg(const float* p) {
  Vec<V> r;
  if constexpr (V == 4) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(p));
    r.v[0] = f.x; r.v[1] = f.y; r.v[2] = f.z; r.v[3] = f.w;
  } else {
    r.v[0] = __ldg(p);
  }
  return r;
}

// Plain load: rows this kernel also writes (tables and slots under an optimizer; partials).
template <int V>
__device__ __forceinline__ Vec<V> vld(const float* p) {
  Vec<V> r;
  if constexpr (V == 4) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    r.v[0] = f.x; r.v[1] = f.y; r.v[2] = f.z; r.v[3] = f.w;
  } else {
    r.v[0] = *p;
  }
  return r;
}

template <int V>
__device__ __forceinline__ void vst(float* p, const Vec<V>& a) {
  if constexpr (V == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(a.v[0], a.v[1], a.v[2], a.v[3]);
  } else {
    *p = a.v[0];
  }
}

// Streaming store: forward outputs are written once and not read again here.
template <int V>
__device__ __forceinline__ void vstcs(float* p, const Vec<V>& a) {
  if constexpr (V == 4) {
    __stcs(reinterpret_cast<float4*>(p), make_float4(a.v[0], a.v[1], a.v[2], a.v[3]));
  } else {
    __stcs(p, a.v[0]);
  }
}

// acc += w * x, rounded as the CPU does it (a product, then a sum: no FMA contraction).
template <int V>
__device__ __forceinline__ void vaxpy(Vec<V>& acc, float w, const Vec<V>& x) {
#pragma unroll
  for (int i = 0; i < V; ++i) acc.v[i] = __fadd_rn(acc.v[i], __fmul_rn(w, x.v[i]));
}

template <int V>
__device__ __forceinline__ void vadd(Vec<V>& acc, const Vec<V>& x) {
#pragma unroll
  for (int i = 0; i < V; ++i) acc.v[i] = __fadd_rn(acc.v[i], x.v[i]);
}

// ============================================================================================
// Backward machinery (one or several tables per call)
// ============================================================================================
//
// Several tables share one sort: table t's key k becomes the global key key_base[t] + k
// (key_base = prefix sum of the row counts), its position j the global position pos_base[t] + j
// and its row r the global row row_base[t] + r. Runs of equal global keys never cross tables,
// so every per-key sum is exactly the single-table sum, and 26 tables cost the dozen launches
// of one (per-table launches would cost a launch sequence per table).

struct BwdTable {
  const int64_t* offsets;  // nullptr: one key per row (the optimizers' index lists)
  const int64_t* keys;
  const float* weights;
  const float* grad_out;   // [batch, dim]
  float* table;            // the optimizer's target (fused path only)
  float* slot1;
  float* slot2;
  int64_t dim;
  int64_t key_base;
  int64_t row_base;
  int64_t pos_base;
  int64_t batch;
  int32_t mean;
};

struct BwdTables {
  BwdTable t[kMaxTablesPerLaunch];
  int32_t n;
};

__device__ __forceinline__ int table_of_key(const BwdTables& T, int64_t key) {
  int t = 0;
  while (t + 1 < T.n && key >= T.t[t + 1].key_base) ++t;
  return t;
}

__device__ __forceinline__ int table_of_row(const BwdTables& T, int64_t row) {
  int t = 0;
  while (t + 1 < T.n && row >= T.t[t + 1].row_base) ++t;
  return t;
}

// Per position: sort key (global key, or `sentinel` = total rows for -1 so that missing keys
// sort last) and payload (the global row without weights: all the reduction needs; the global
// position with weights, plus row_of[] and the weight in wbuf[], 1 for unweighted tables).
// row_scale[row]: the row's weight sum for mean tables (added in increasing j as the forward
// did), 1 for sum tables: g / 1 and 1 * g are exact, so sum tables keep the CPU's bits.
// One thread per row: rows are short, and one-key rows write coalesced.
template <typename K>
__global__ void prep_rows_kernel(const __grid_constant__ BwdTables T, int64_t total_batch, K sentinel, K* skeys,
                                 int32_t* svals, int32_t* row_of, float* wbuf, float* row_scale) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= total_batch) return;
  const BwdTable& B = T.t[table_of_row(T, r)];
  const int64_t lr = r - B.row_base;
  const int64_t b = B.offsets ? B.offsets[lr] : lr;
  const int64_t e = B.offsets ? B.offsets[lr + 1] : lr + 1;
  float wsum = 0.f;
  for (int64_t j = b; j < e; ++j) {
    const int64_t k = B.keys[j];
    const bool valid = k >= 0;
    const int64_t gpos = B.pos_base + j;
    const float w = B.weights ? B.weights[j] : 1.f;
    skeys[gpos] = valid ? static_cast<K>(B.key_base + k) : sentinel;
    svals[gpos] = static_cast<int32_t>(row_of ? gpos : r);
    if (row_of) {
      row_of[gpos] = static_cast<int32_t>(r);
      wbuf[gpos] = w;
    }
    if (valid) wsum = __fadd_rn(wsum, w);
  }
  if (row_scale) row_scale[r] = B.mean ? wsum : 1.f;
}

template <typename K>
__global__ void heads_kernel(const K* skeys, int64_t n, K sentinel, int32_t* flags) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const K k = skeys[i];
  flags[i] = (k != sentinel && (i == 0 || skeys[i - 1] != k)) ? 1 : 0;
}

// counters[0] = number of unique keys, [1] = number of valid contributions, [2] = hot keys.
template <typename K>
__global__ void scatter_runs_kernel(const K* skeys, const int32_t* rid, int64_t n, K sentinel, int32_t* run_start,
                                    int64_t* unique_keys, int64_t* num_unique, int32_t* counters) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const K k = skeys[i];
  if (k == sentinel) {
    if (i == 0) {  // nothing valid at all
      counters[0] = 0;
      counters[1] = 0;
      run_start[0] = 0;
      if (num_unique) *num_unique = 0;
    }
    return;
  }
  const int32_t u = rid[i] - 1;
  if (i == 0 || skeys[i - 1] != k) {
    run_start[u] = static_cast<int32_t>(i);
    if (unique_keys) unique_keys[u] = static_cast<int64_t>(k);
  }
  if (i == n - 1 || skeys[i + 1] == sentinel) {  // the last valid contribution
    counters[0] = u + 1;
    counters[1] = static_cast<int32_t>(i + 1);
    run_start[u + 1] = static_cast<int32_t>(i + 1);
    if (num_unique) *num_unique = u + 1;
  }
}

template <typename K>
struct BwdParams {
  BwdTables T;
  const K* skeys;
  const int32_t* svals;
  const int32_t* row_of;     // with weights: global row of a global position
  const float* wbuf;         // with weights: weight of a global position
  const float* row_scale;    // with mean: per global row
  const int32_t* rid;        // inclusive scan of run heads
  const int32_t* run_start;  // [nu + 1]
  int32_t* counters;
  int32_t* long_list;        // hot keys (more than S contributions), in no particular order
  float* partial;            // [2 * nnz / S + 2, stride]
  int64_t n;                 // sorted items (total nnz)
  int64_t stride;            // largest dim: the partial rows' stride and the column space
  int32_t lanes_log2;
  int32_t chunks;
};

// ---- epilogues: what happens to a finished key's summed row (key is table-local) ----------
// Two phases: load() reads the row's optimizer state, apply() combines it with the summed
// gradient and stores. The reduction calls load() before it sums the gradient rows, so the
// state's loads are in flight together with the gradient's instead of after them (the chain
// per key is then one memory latency, not two).

template <int V>
struct EpiState {
  Vec<V> w, s1, s2;
};

// Sum of sorted items [s, e) (all of table B) for one column block, in increasing position:
// item i contributes w_j * (g[row] / scale_row), exactly the CPU's expression (w = 1 and
// scale = 1 where the table has no weights or sums: both exact).
template <int V, typename K>
__device__ __forceinline__ Vec<V> sum_items(const BwdParams<K>& p, const BwdTable& B, int64_t s, int64_t e,
                                            int64_t col, bool mean) {
  Vec<V> acc = vzero<V>();
  const int64_t dim = B.dim;
  const float* gbase = B.grad_out + col;
  int64_t i = s;
  for (; i + 4 <= e; i += 4) {
    int32_t r[4];
    float w[4], sc[4];
    Vec<V> g[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int32_t v = __ldg(p.svals + i + u);
      r[u] = p.wbuf ? __ldg(p.row_of + v) : v;
      w[u] = p.wbuf ? __ldg(p.wbuf + v) : 1.f;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      g[u] = vldg<V>(gbase + (static_cast<int64_t>(r[u]) - B.row_base) * dim);
      sc[u] = mean ? __ldg(p.row_scale + r[u]) : 1.f;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (mean) {
#pragma unroll
        for (int c = 0; c < V; ++c) g[u].v[c] = __fdiv_rn(g[u].v[c], sc[u]);
      }
      vaxpy(acc, w[u], g[u]);
    }
  }
  for (; i < e; ++i) {
    const int32_t v = __ldg(p.svals + i);
    const int32_t r = p.wbuf ? __ldg(p.row_of + v) : v;
    const float w = p.wbuf ? __ldg(p.wbuf + v) : 1.f;
    Vec<V> g = vldg<V>(gbase + (static_cast<int64_t>(r) - B.row_base) * dim);
    if (mean) {
      const float sc = __ldg(p.row_scale + r);
#pragma unroll
      for (int c = 0; c < V; ++c) g.v[c] = __fdiv_rn(g.v[c], sc);
    }
    vaxpy(acc, w, g);
  }
  return acc;
}

// One group per (chunk of S sorted items, column block): sums every segment that starts in
// the chunk. Partial-sum slot of segment p of a hot key whose first item is a: 2*(a/S) + p,
// disjoint between keys because a hot key spans more than S items (so its successor starts at
// least one chunk later, and 2*floor(cnt/S) >= ceil(cnt/S)).
// kMinBlocks: register cap as resident blocks per SM (1 = compiler's choice); prefetch: load
// the optimizer state before summing. Both are measured by the benchmark (same bits).
template <int V, typename K, typename Epi, int kMinBlocks>
__global__ void __launch_bounds__(kBlock, kMinBlocks) reduce_segments_kernel(const __grid_constant__ BwdParams<K> p,
                                                                             const Epi epi, bool mean, bool prefetch) {
  const int lg = p.lanes_log2;
  const int lane = threadIdx.x & ((1 << lg) - 1);
  const int64_t item = static_cast<int64_t>(blockIdx.x) * (kBlock >> lg) + (threadIdx.x >> lg);
  const int64_t g = p.chunks == 1 ? item : item / p.chunks;
  const int64_t chunk = p.chunks == 1 ? 0 : item % p.chunks;
  const int64_t col = (chunk * (1 << lg) + lane) * V;
  const int64_t nvalid = p.counters[1];
  const int32_t nu = p.counters[0];
  const int64_t start = g * S;
  if (start >= nvalid || col >= p.stride) return;
  const int64_t end = min(start + S, nvalid);
  int32_t u = __ldg(p.rid + start) - 1;
  int64_t a = p.run_start[u], b = p.run_start[u + 1];
  int64_t piece = (start - a + S - 1) / S;
  int64_t seg = a + piece * S;
  while (true) {
    if (seg >= b) {  // next key
      if (++u >= nu) break;
      a = b;
      b = p.run_start[u + 1];
      piece = 0;
      seg = a;
    }
    if (seg >= end) break;
    const int64_t gkey = static_cast<int64_t>(p.skeys[a]);
    const BwdTable& B = p.T.t[table_of_key(p.T, gkey)];
    if (col < B.dim) {
      const int64_t key = gkey - B.key_base;
      if (b - a <= S && prefetch) {  // the whole key here: state loads overlap the gradient loads
        const EpiState<V> st = epi.template load<V>(B, key, col);
        const Vec<V> acc = sum_items<V, K>(p, B, seg, b, col, mean);
        epi.template apply<V>(B, key, u, col, st, acc);
      } else if (b - a <= S) {
        const Vec<V> acc = sum_items<V, K>(p, B, seg, b, col, mean);
        epi.template apply<V>(B, key, u, col, epi.template load<V>(B, key, col), acc);
      } else {
        const Vec<V> acc = sum_items<V, K>(p, B, seg, min(seg + S, b), col, mean);
        vst<V>(p.partial + (2 * (a / S) + piece) * p.stride + col, acc);
      }
    }
    if (b - a > S && piece == 0 && lane == 0 && chunk == 0) p.long_list[atomicAdd(&p.counters[2], 1)] = u;
    seg += S;
    ++piece;
  }
}

// One block per hot key (grid-stride over the list): kTreeSlices groups each add a fixed
// contiguous slice of the key's partial sums in order, then group 0 adds the slice sums in
// order. The tree depends on the partial count only: not on timing, not on the dims of the
// tables that share the launch (L varies with them), so the bits are those of the input alone.
constexpr int kTreeSlices = 32;  // <= kTreeBlock / 32, the fewest groups a block can have
template <int V, typename K, typename Epi>
__global__ void __launch_bounds__(kTreeBlock) reduce_hot_kernel(const __grid_constant__ BwdParams<K> p,
                                                                const Epi epi) {
  __shared__ Vec<V> slice_sum[kTreeBlock];
  const int lg = p.lanes_log2;
  const int L = 1 << lg;
  const int lane = threadIdx.x & (L - 1);
  const int q = threadIdx.x >> lg;  // groups q >= kTreeSlices (when L < 32) stay idle
  const int32_t nlong = p.counters[2];
  for (int32_t h = blockIdx.x; h < nlong; h += gridDim.x) {
    const int32_t u = p.long_list[h];
    const int64_t a = p.run_start[u], b = p.run_start[u + 1];
    const int64_t nseg = (b - a + S - 1) / S;
    const int64_t per = (nseg + kTreeSlices - 1) / kTreeSlices;
    const float* base = p.partial + 2 * (a / S) * p.stride;
    const int64_t gkey = static_cast<int64_t>(p.skeys[a]);
    const BwdTable& B = p.T.t[table_of_key(p.T, gkey)];
    for (int32_t c = 0; c < p.chunks; ++c) {
      const int64_t col = (static_cast<int64_t>(c) * L + lane) * V;
      Vec<V> acc = vzero<V>();
      if (col < B.dim && q < kTreeSlices) {
        const int64_t s0 = min(nseg, q * per), s1 = min(nseg, s0 + per);
        for (int64_t s = s0; s < s1; ++s) vadd(acc, vld<V>(base + s * p.stride + col));
      }
      slice_sum[threadIdx.x] = acc;
      __syncthreads();
      if (q == 0 && col < B.dim) {
        Vec<V> tot = vzero<V>();
        for (int qq = 0; qq < kTreeSlices; ++qq) vadd(tot, slice_sum[qq * L + lane]);
        const int64_t key = gkey - B.key_base;
        epi.template apply<V>(B, key, u, col, epi.template load<V>(B, key, col), tot);
      }
      __syncthreads();
    }
  }
}

// ---- host side -----------------------------------------------------------------------------

inline size_t align256(size_t x) { return (x + 255) & ~size_t{255}; }

inline bool wide_keys(int64_t num_rows) { return num_rows >= int64_t{0xFFFFFFFF}; }

inline int key_bits(int64_t num_rows) {  // bits of the sentinel num_rows
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) <= num_rows) ++bits;
  return bits;
}

bool rows_aligned(const float* p, int64_t dim) { return p == nullptr || dim % 4 != 0 || aligned16(p); }

// One launch group (<= kMaxTablesPerLaunch tables) as device-side descriptors plus totals.
struct BwdGroup {
  BwdTables T;
  int64_t batch = 0, nnz = 0, rows = 0, stride = 1;
  bool weights = false, mean = false, vec4 = true;
};

cudaError_t make_group(const LookupGradArgs* g, const SparseUpdateArgs* targets, int n, BwdGroup* G) {
  if (n < 1 || n > kMaxTablesPerLaunch) return cudaErrorInvalidValue;
  std::memset(&G->T, 0, sizeof(G->T));
  G->T.n = n;
  for (int t = 0; t < n; ++t) {
    BwdTable& B = G->T.t[t];
    const LookupGradArgs& a = g[t];
    if (a.ids.row_offsets == nullptr && a.ids.batch != a.ids.nnz) return cudaErrorInvalidValue;
    if (a.dim < 1 || a.ids.batch < 0 || a.ids.nnz < 0) return cudaErrorInvalidValue;
    B.offsets = a.ids.row_offsets;
    B.keys = a.ids.keys;
    B.weights = a.ids.weights;
    B.grad_out = a.grad_out;
    B.dim = a.dim;
    B.batch = a.ids.batch;
    B.mean = a.combiner == Combiner::kMean;
    B.key_base = G->rows;
    B.row_base = G->batch;
    B.pos_base = G->nnz;
    const int64_t num_rows = targets ? targets[t].num_rows : 0;
    if (targets) {
      if (targets[t].dim != a.dim) return cudaErrorInvalidValue;
      B.table = targets[t].table;
      B.slot1 = targets[t].slot1;
      B.slot2 = targets[t].slot2;
    }
    G->batch += a.ids.batch;
    G->nnz += a.ids.nnz;
    G->rows += num_rows;
    G->stride = std::max(G->stride, a.dim);
    G->weights |= a.ids.weights != nullptr;
    G->mean |= B.mean;
    G->vec4 &= a.dim % 4 == 0 && aligned16(a.grad_out) && rows_aligned(B.table, a.dim) &&
               rows_aligned(B.slot1, a.dim) && rows_aligned(B.slot2, a.dim);
  }
  if (G->nnz >= (int64_t{1} << 31) - 1 || G->batch >= (int64_t{1} << 31) - 1) return cudaErrorInvalidValue;
  return cudaSuccess;
}

struct BwdLayout {
  size_t skeys_in, skeys_out, svals_in, svals_out, row_of, wbuf, row_scale, flags, rid, run_start, counters,
      long_list, partial, cub, total;
};

template <typename K>
cudaError_t cub_bytes(int64_t nnz, int end_bit, size_t* bytes) {
  size_t sort_bytes = 0, scan_bytes = 0;
  const int n = static_cast<int>(nnz);
  EL_TRY(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const K*>(nullptr), static_cast<K*>(nullptr),
                                         static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0,
                                         end_bit));
  EL_TRY(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, static_cast<const int32_t*>(nullptr),
                                       static_cast<int32_t*>(nullptr), n));
  *bytes = std::max(sort_bytes, scan_bytes);
  return cudaSuccess;
}

cudaError_t bwd_layout(int64_t batch, int64_t nnz, int64_t stride, int64_t num_rows, BwdLayout* L) {
  if (nnz >= (int64_t{1} << 31) - 1 || batch >= (int64_t{1} << 31) - 1) return cudaErrorInvalidValue;
  const size_t ksz = wide_keys(num_rows) ? 8 : 4;
  const size_t n = static_cast<size_t>(std::max<int64_t>(nnz, 1));
  size_t cub = 0;
  if (wide_keys(num_rows)) {
    EL_TRY(cub_bytes<uint64_t>(nnz, key_bits(num_rows), &cub));
  } else {
    EL_TRY(cub_bytes<uint32_t>(nnz, key_bits(num_rows), &cub));
  }
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align256(bytes);
    return at;
  };
  L->skeys_in = take(n * ksz);
  L->skeys_out = take(n * ksz);
  L->svals_in = take(n * 4);
  L->svals_out = take(n * 4);
  L->row_of = take(n * 4);
  L->wbuf = take(n * 4);
  L->row_scale = take(static_cast<size_t>(std::max<int64_t>(batch, 1)) * 4);
  L->flags = take(n * 4);
  L->rid = take(n * 4);
  L->run_start = take((n + 1) * 4);
  L->counters = take(4 * 4);
  L->long_list = take((n / (S + 1) + 1) * 4);
  L->partial = take((2 * (n / S) + 2) * static_cast<size_t>(std::max<int64_t>(stride, 1)) * 4);
  L->cub = take(std::max<size_t>(cub, 1));
  L->total = off;
  return cudaSuccess;
}

template <int V, typename K, typename Epi>
cudaError_t launch_reduce(const BwdParams<K>& p, const Epi& epi, bool mean, cudaStream_t stream) {
  const int64_t groups = (p.n + S - 1) / S * p.chunks;
  const int64_t per_block = kBlock >> p.lanes_log2;
  const int64_t blocks = (groups + per_block - 1) / per_block;
  if (blocks > 0) {
    if (g_backward_min_blocks == 4) {
      reduce_segments_kernel<V, K, Epi, 4>
          <<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(p, epi, mean, g_backward_prefetch);
    } else {
      reduce_segments_kernel<V, K, Epi, 1>
          <<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(p, epi, mean, g_backward_prefetch);
    }
    EL_TRY(cudaGetLastError());
  }
  if (p.n > S) {  // a hot key needs more than S contributions
    int sms = 0;
    EL_TRY(num_sms(&sms));
    const int64_t max_hot = p.n / (S + 1) + 1;
    const int64_t hot_blocks = std::min<int64_t>(max_hot, 2 * static_cast<int64_t>(sms));
    reduce_hot_kernel<V, K, Epi><<<static_cast<unsigned>(hot_blocks), kTreeBlock, 0, stream>>>(p, epi);
    EL_TRY(cudaGetLastError());
  }
  return cudaSuccess;
}

// Sort, number the runs, then reduce with the epilogue. unique_keys/num_unique: only for the
// plain backward (nullptr otherwise). key_space: the sentinel (total rows, or the key bound).
template <typename K, typename Epi>
cudaError_t backward_impl(const BwdGroup& G, int64_t key_space, const Epi& epi, int64_t* unique_keys,
                          int64_t* num_unique, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const int64_t nnz = G.nnz, batch = G.batch;
  BwdLayout L;
  EL_TRY(bwd_layout(batch, nnz, G.stride, key_space, &L));
  if (workspace_bytes < L.total || (nnz > 0 && workspace == nullptr)) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  int32_t* counters = reinterpret_cast<int32_t*>(ws + L.counters);
  EL_TRY(cudaMemsetAsync(counters, 0, 4 * sizeof(int32_t), stream));
  if (nnz == 0) {
    if (num_unique) EL_TRY(cudaMemsetAsync(num_unique, 0, sizeof(int64_t), stream));
    return cudaSuccess;
  }
  K* skeys_in = reinterpret_cast<K*>(ws + L.skeys_in);
  K* skeys = reinterpret_cast<K*>(ws + L.skeys_out);
  int32_t* svals_in = reinterpret_cast<int32_t*>(ws + L.svals_in);
  int32_t* svals = reinterpret_cast<int32_t*>(ws + L.svals_out);
  int32_t* row_of = G.weights ? reinterpret_cast<int32_t*>(ws + L.row_of) : nullptr;
  float* wbuf = G.weights ? reinterpret_cast<float*>(ws + L.wbuf) : nullptr;
  float* row_scale = G.mean ? reinterpret_cast<float*>(ws + L.row_scale) : nullptr;
  int32_t* flags = reinterpret_cast<int32_t*>(ws + L.flags);
  int32_t* rid = reinterpret_cast<int32_t*>(ws + L.rid);
  int32_t* run_start = reinterpret_cast<int32_t*>(ws + L.run_start);
  const K sentinel = static_cast<K>(key_space);
  const int n = static_cast<int>(nnz);
  const unsigned row_blocks = static_cast<unsigned>((batch + kBlock - 1) / kBlock);
  const unsigned item_blocks = static_cast<unsigned>((nnz + kBlock - 1) / kBlock);

  if (row_blocks > 0) {
    prep_rows_kernel<K><<<row_blocks, kBlock, 0, stream>>>(G.T, batch, sentinel, skeys_in, svals_in, row_of, wbuf,
                                                           row_scale);
    EL_TRY(cudaGetLastError());
  }
  void* cub_tmp = ws + L.cub;
  size_t cub_avail = L.total - L.cub;
  // Stable LSD radix sort over only the bits the sentinel needs: equal keys keep position order.
  EL_TRY(cub::DeviceRadixSort::SortPairs(cub_tmp, cub_avail, skeys_in, skeys, svals_in, svals, n, 0,
                                         key_bits(key_space), stream));
  heads_kernel<K><<<item_blocks, kBlock, 0, stream>>>(skeys, nnz, sentinel, flags);
  EL_TRY(cudaGetLastError());
  cub_avail = L.total - L.cub;
  EL_TRY(cub::DeviceScan::InclusiveSum(cub_tmp, cub_avail, flags, rid, n, stream));
  scatter_runs_kernel<K><<<item_blocks, kBlock, 0, stream>>>(skeys, rid, nnz, sentinel, run_start, unique_keys,
                                                             num_unique, counters);
  EL_TRY(cudaGetLastError());

  BwdParams<K> p;
  p.T = G.T;
  p.skeys = skeys;
  p.svals = svals;
  p.row_of = row_of;
  p.wbuf = wbuf;
  p.row_scale = row_scale;
  p.rid = rid;
  p.run_start = run_start;
  p.counters = counters;
  p.long_list = reinterpret_cast<int32_t*>(ws + L.long_list);
  p.partial = reinterpret_cast<float*>(ws + L.partial);
  p.n = nnz;
  p.stride = G.stride;
  const int64_t vecs = G.vec4 ? G.stride / 4 : G.stride;
  p.lanes_log2 = log2_lanes_for(vecs);
  p.chunks = static_cast<int32_t>((vecs + (1 << p.lanes_log2) - 1) >> p.lanes_log2);
  return G.vec4 ? launch_reduce<4, K, Epi>(p, epi, G.mean, stream) : launch_reduce<1, K, Epi>(p, epi, G.mean, stream);
}

template <typename Epi>
cudaError_t backward_dispatch(const BwdGroup& G, int64_t key_space, const Epi& epi, int64_t* unique_keys,
                              int64_t* num_unique, void* ws, size_t ws_bytes, cudaStream_t stream) {
  if (wide_keys(key_space))
    return backward_impl<uint64_t, Epi>(G, key_space, epi, unique_keys, num_unique, ws, ws_bytes, stream);
  return backward_impl<uint32_t, Epi>(G, key_space, epi, unique_keys, num_unique, ws, ws_bytes, stream);
}

}  // namespace
}  // namespace embedlab

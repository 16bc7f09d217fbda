// CUDA implementation of the contract in embedding.h (see the CUDA section there).
//
// Where the time goes, and why the kernels look like this:
//   * Forward: a gather of random table rows, bound by memory. A "group" of L lanes (L = a
//     power of two <= 32, L * 4 >= dim when rows allow 16-byte access) produces one output
//     row: at dim 128 a warp per row, each lane one float4; at dim 16 four lanes per row and
//     eight rows per warp. Keys are read by every lane of the group (one broadcast load), the
//     key loop is unrolled by 4 so that four row loads are in flight before the first add,
//     and outputs are written with streaming stores (they are not read again by this kernel).
//     All tables of a call share one launch: the blocks are split between tables by a prefix
//     held in a __grid_constant__ parameter (no descriptor copy to the device, no workspace).
//   * Backward (deterministic): CUB radix sort of (key, payload) pairs, stable, so each key's
//     contributions come out in position order; run heads + an inclusive scan number the
//     unique keys. Then the sorted array is cut into chunks of kCudaSegment items; the group
//     owning a chunk walks the "segments" that start in it (a segment = up to kCudaSegment
//     consecutive contributions of one key, aligned to the key's first contribution) and sums
//     each in position order. A key with one segment is finished on the spot (written out, or
//     the optimizer applied to its table row); a longer (hot) key leaves partial sums, which a
//     second kernel adds in a fixed tree, one block per hot key. Work per group is bounded
//     whatever the skew (a Zipf hot key is spread over the whole GPU), and there are no float
//     atomics: the bits depend on the input only.
//   * Optimizers: the same kernels with an optimizer "epilogue" instead of a write: the fused
//     backward+optimizer never materializes the gradient; the standalone sparse updates run
//     their (index, grad row) pairs through the same path, which also coalesces duplicates.
#include <cub/cub.cuh>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "embedding.h"

namespace embedlab {
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
// Forward
// ============================================================================================

struct FwdTable {
  const float* table;
  const int64_t* offsets;
  const int64_t* keys;
  const float* weights;
  float* out;
  int64_t dim;
  int64_t batch;
  int64_t items;        // ceil(batch / R) * chunks
  int32_t block_begin;  // first block of this table in the launch
  int32_t lanes_log2;   // group size L = 1 << lanes_log2
  int32_t chunks;       // column chunks of L * V floats per row (1 unless dim > 32 * V)
  int32_t vec4;         // 16-byte path
  int32_t mean;
};

struct FwdBatch {
  FwdTable t[kMaxTablesPerLaunch];
  int32_t num_tables;
};

// R consecutive output rows per group, in lockstep, U key steps unrolled: R * U table-row loads
// in flight per thread. With one key per lookup the chain offsets -> key -> row is latency-
// bound, so R > 1 is what puts more bytes in flight; with many keys per lookup U > 1 does.
// Registers grow with R * U, and occupancy falls with them: the benchmark measures the mix.
// Adds stay in increasing j within each row.
template <int V, int R, int U>
__device__ __forceinline__ void forward_rows(const FwdTable& T, int64_t row0, int64_t col) {
  const int64_t dim = T.dim;
  const float* __restrict__ tab = T.table + col;
  // Row lengths fit 32 bits (validated: nnz < 2^31 per launch); fewer 64-bit registers.
  int64_t beg[R];
  int32_t len[R];
  int32_t maxlen = 0;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (row0 + r < T.batch) {
      beg[r] = __ldg(T.offsets + row0 + r);
      len[r] = static_cast<int32_t>(__ldg(T.offsets + row0 + r + 1) - beg[r]);
    } else {
      beg[r] = 0;
      len[r] = 0;
    }
    maxlen = max(maxlen, len[r]);
  }
  Vec<V> acc[R];
  float wsum[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    acc[r] = vzero<V>();
    wsum[r] = 0.f;
  }
  for (int32_t s = 0; s < maxlen; s += U) {
    int64_t k[R][U];
    float w[R][U];
    Vec<V> x[R][U];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool in = s + u < len[r];
        k[r][u] = in ? __ldg(T.keys + beg[r] + s + u) : -1;
        w[r][u] = (in && T.weights) ? __ldg(T.weights + beg[r] + s + u) : 1.f;
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int u = 0; u < U; ++u) x[r][u] = k[r][u] >= 0 ? vldg<V>(tab + k[r][u] * dim) : vzero<V>();
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (k[r][u] >= 0) {
          vaxpy(acc[r], w[r][u], x[r][u]);  // w = 1 without weights: 1 * x is exact, i.e. "+= x"
          wsum[r] = __fadd_rn(wsum[r], w[r][u]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (row0 + r >= T.batch) break;
    if (T.mean) {
      if (wsum[r] != 0.f) {
#pragma unroll
        for (int i = 0; i < V; ++i) acc[r].v[i] = __fdiv_rn(acc[r].v[i], wsum[r]);
      } else {
        acc[r] = vzero<V>();
      }
    }
    vstcs<V>(T.out + (row0 + r) * dim + col, acc[r]);
  }
}

// kMinBlocks: resident 256-thread blocks per SM the compiler must allow, i.e. a register cap
// (8 -> 32 registers, full occupancy; 1 -> the compiler's choice). kRows: R above.
// Chosen by set_cuda_forward_variant (the benchmark measures them all).
template <int kRows, int kUnroll, int kMinBlocks>
__global__ void __launch_bounds__(kBlock, kMinBlocks) forward_kernel(const __grid_constant__ FwdBatch b) {
  int t = 0;
  while (t + 1 < b.num_tables && static_cast<int32_t>(blockIdx.x) >= b.t[t + 1].block_begin) ++t;
  const FwdTable& T = b.t[t];
  const int lg = T.lanes_log2;
  const int lane = threadIdx.x & ((1 << lg) - 1);
  const int64_t item = static_cast<int64_t>(blockIdx.x - T.block_begin) * (kBlock >> lg) + (threadIdx.x >> lg);
  if (item >= T.items) return;
  const int64_t rowgroup = T.chunks == 1 ? item : item / T.chunks;
  const int64_t chunk = T.chunks == 1 ? 0 : item % T.chunks;
  if (T.vec4) {
    const int64_t col = (chunk * (1 << lg) + lane) * 4;
    if (col < T.dim) forward_rows<4, kRows, kUnroll>(T, rowgroup * kRows, col);
  } else {
    const int64_t col = chunk * (1 << lg) + lane;
    if (col < T.dim) forward_rows<1, kRows, kUnroll>(T, rowgroup * kRows, col);
  }
}

// ============================================================================================
// Validation
// ============================================================================================

// status[0]: smallest bad key position; status[1]: smallest row whose offsets decrease;
// status[2]: 0 if row_offsets[0] != 0 or row_offsets[batch] != nnz. "No error" is the memset
// pattern 0x7f7f... (a large positive int64), so atomicMin finds the first bad position.
// status[3]: 1 + the largest key (starts at 0).
__global__ void __launch_bounds__(kBlock) check_ids_kernel(const int64_t* offsets, const int64_t* keys, int64_t batch,
                                                           int64_t nnz, int64_t num_rows, int64_t min_key,
                                                           bool want_max, unsigned long long* status) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long top = 0;  // 1 + the largest valid key seen by this thread
  if (i < nnz) {
    const int64_t k = keys[i];
    if (k < min_key || k >= num_rows) atomicMin(&status[0], static_cast<unsigned long long>(i));
    else if (k >= 0) top = static_cast<unsigned long long>(k) + 1;
  }
  if (want_max) {  // one atomic per block: a single hot address would serialize 10^6 atomics
    using BlockMax = cub::BlockReduce<unsigned long long, kBlock>;
    __shared__ typename BlockMax::TempStorage tmp;
    const unsigned long long block_top = BlockMax(tmp).Reduce(top, ::cuda::maximum<>{});
    if (threadIdx.x == 0 && block_top > 0) atomicMax(&status[3], block_top);
  }
  if (offsets != nullptr) {
    if (i < batch && offsets[i + 1] < offsets[i]) atomicMin(&status[1], static_cast<unsigned long long>(i));
    if (i == 0 && (offsets[0] != 0 || offsets[batch] != nnz)) status[2] = 0;
  }
}

// ============================================================================================
// Backward machinery (one or several tables per call)
// ============================================================================================
//
// Several tables share one sort: table t's key k becomes the global key key_base[t] + k
// (key_base = prefix sum of the row counts), its position j the global position pos_base[t] + j
// and its row r the global row row_base[t] + r. Runs of equal global keys never cross tables,
// so every per-key sum is exactly the single-table sum, and 26 tables cost the dozen launches
// of one (per-table launches made a 26-table step slower than PyTorch's).

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

struct GradEpi {  // write (lookup_backward_cuda, one table)
  float* rows;
  template <int V>
  __device__ __forceinline__ EpiState<V> load(const BwdTable&, int64_t, int64_t) const {
    return EpiState<V>{};
  }
  template <int V>
  __device__ __forceinline__ void apply(const BwdTable& B, int64_t, int64_t u, int64_t col, const EpiState<V>&,
                                        const Vec<V>& g) const {
    vst<V>(rows + u * B.dim + col, g);
  }
};

struct SgdEpi {  // w -= g * lr
  float lr;
  template <int V>
  __device__ __forceinline__ EpiState<V> load(const BwdTable& B, int64_t key, int64_t col) const {
    EpiState<V> st;
    st.w = vld<V>(B.table + key * B.dim + col);
    return st;
  }
  template <int V>
  __device__ __forceinline__ void apply(const BwdTable& B, int64_t key, int64_t, int64_t col, EpiState<V> st,
                                        const Vec<V>& g) const {
#pragma unroll
    for (int i = 0; i < V; ++i) st.w.v[i] = __fsub_rn(st.w.v[i], __fmul_rn(g.v[i], lr));
    vst<V>(B.table + key * B.dim + col, st.w);
  }
};

struct AdagradEpi {  // acc += g*g; w -= (lr*g) / sqrt(acc + eps)
  float lr, eps;
  template <int V>
  __device__ __forceinline__ EpiState<V> load(const BwdTable& B, int64_t key, int64_t col) const {
    const int64_t off = key * B.dim + col;
    EpiState<V> st;
    st.w = vld<V>(B.table + off);
    st.s1 = vld<V>(B.slot1 + off);
    return st;
  }
  template <int V>
  __device__ __forceinline__ void apply(const BwdTable& B, int64_t key, int64_t, int64_t col, EpiState<V> st,
                                        const Vec<V>& g) const {
    const int64_t off = key * B.dim + col;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      st.s1.v[i] = __fadd_rn(st.s1.v[i], __fmul_rn(g.v[i], g.v[i]));
      st.w.v[i] = __fsub_rn(st.w.v[i], __fdiv_rn(__fmul_rn(lr, g.v[i]), __fsqrt_rn(__fadd_rn(st.s1.v[i], eps))));
    }
    vst<V>(B.slot1 + off, st.s1);
    vst<V>(B.table + off, st.w);
  }
};

struct AdamEpi {  // Keras order: m += (g-m)(1-b1); v += (g*g-v)(1-b2); w -= (m*alpha)/(sqrt(v)+eps)
  float alpha, one_b1, one_b2, eps;
  template <int V>
  __device__ __forceinline__ EpiState<V> load(const BwdTable& B, int64_t key, int64_t col) const {
    const int64_t off = key * B.dim + col;
    EpiState<V> st;
    st.w = vld<V>(B.table + off);
    st.s1 = vld<V>(B.slot1 + off);
    st.s2 = vld<V>(B.slot2 + off);
    return st;
  }
  template <int V>
  __device__ __forceinline__ void apply(const BwdTable& B, int64_t key, int64_t, int64_t col, EpiState<V> st,
                                        const Vec<V>& g) const {
    const int64_t off = key * B.dim + col;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      st.s1.v[i] = __fadd_rn(st.s1.v[i], __fmul_rn(__fsub_rn(g.v[i], st.s1.v[i]), one_b1));
      st.s2.v[i] = __fadd_rn(st.s2.v[i], __fmul_rn(__fsub_rn(__fmul_rn(g.v[i], g.v[i]), st.s2.v[i]), one_b2));
      st.w.v[i] =
          __fsub_rn(st.w.v[i], __fdiv_rn(__fmul_rn(st.s1.v[i], alpha), __fadd_rn(__fsqrt_rn(st.s2.v[i]), eps)));
    }
    vst<V>(B.slot1 + off, st.s1);
    vst<V>(B.slot2 + off, st.s2);
    vst<V>(B.table + off, st.w);
  }
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

// Backward variant (benchmark knob, same bits): state prefetch, and min blocks per SM (1 or 4).
// Default from the H200 sweep: prefetch on (SGD 1.03 -> 0.98 ms at 128d/1 key), no register
// cap (capping to 64 registers spilled Adam's state: 1.67 -> 1.94 ms).
bool g_backward_prefetch = true;
int g_backward_min_blocks = 1;

int g_num_sms = 0;
cudaError_t num_sms(int* out) {
  if (g_num_sms == 0) {
    int dev = 0, sms = 0;
    EL_TRY(cudaGetDevice(&dev));
    EL_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    g_num_sms = sms;
  }
  *out = g_num_sms;
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

// Adam's step size, computed on the host exactly as sparse_adam_cpu does.
AdamEpi adam_epi(const AdamParams& p) {
  const float ts = static_cast<float>(p.step);
  const float b1p = std::pow(static_cast<float>(p.beta1), ts);
  const float b2p = std::pow(static_cast<float>(p.beta2), ts);
  AdamEpi e;
  e.alpha = p.lr * std::sqrt(1.f - b2p) / (1.f - b1p);
  e.one_b1 = static_cast<float>(1.0 - p.beta1);  // Keras: 1 - beta in double, rounded once
  e.one_b2 = static_cast<float>(1.0 - p.beta2);
  e.eps = p.epsilon;
  return e;
}

cudaError_t apply_group(const BwdGroup& G, const SparseOptimizer& opt, void* ws, size_t ws_bytes,
                        cudaStream_t stream) {
  for (int t = 0; t < G.T.n; ++t) {
    const BwdTable& B = G.T.t[t];
    if (B.table == nullptr || (opt.kind == OptimizerKind::kAdagrad && B.slot1 == nullptr) ||
        (opt.kind == OptimizerKind::kAdam && (B.slot1 == nullptr || B.slot2 == nullptr)))
      return cudaErrorInvalidValue;
  }
  switch (opt.kind) {
    case OptimizerKind::kSgd:
      return backward_dispatch(G, G.rows, SgdEpi{opt.sgd.lr}, nullptr, nullptr, ws, ws_bytes, stream);
    case OptimizerKind::kAdagrad:
      return backward_dispatch(G, G.rows, AdagradEpi{opt.adagrad.lr, opt.adagrad.epsilon}, nullptr, nullptr, ws,
                               ws_bytes, stream);
    case OptimizerKind::kAdam:
      if (opt.adam.step < 1) return cudaErrorInvalidValue;
      return backward_dispatch(G, G.rows, adam_epi(opt.adam), nullptr, nullptr, ws, ws_bytes, stream);
  }
  return cudaErrorInvalidValue;
}

// Forward variants (rows per group R, key unroll U, min blocks per SM); see forward_kernel.
// Only these are compiled; kForwardVariants[g_forward_variant] is used.
struct FwdVariant {
  int rows, unroll, min_blocks;
};
constexpr FwdVariant kForwardVariants[] = {{1, 4, 1}, {1, 4, 8}, {1, 1, 8}, {2, 1, 8},
                                           {2, 2, 4}, {2, 2, 6}, {4, 1, 4}, {4, 1, 6}};
constexpr int kNumForwardVariants = sizeof(kForwardVariants) / sizeof(kForwardVariants[0]);
// -1: automatic. One key per lookup is latency-bound, and R = 4 rows per group with U = 1 wins
// (H200: 82% of copy at dim 128 vs 53% for R = 1, U = 4); many keys per lookup are not, and
// R = 1, U = 4 at the compiler's occupancy wins (99% vs 93%). Chosen per launch from the
// launch's mean keys per output row.
int g_forward_variant = -1;
constexpr int kAutoFewKeys = 6;   // {4, 1, 4}
constexpr int kAutoManyKeys = 0;  // {1, 4, 1}
constexpr double kAutoKeysThreshold = 3.0;

template <int R, int U, int MB>
cudaError_t launch_forward(const FwdBatch& b, int64_t blocks, cudaStream_t stream) {
  forward_kernel<R, U, MB><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(b);
  return cudaGetLastError();
}

}  // namespace

// ============================================================================================
// Public entry points
// ============================================================================================

void get_cuda_forward_variant(int* rows_per_group, int* unroll, int* min_blocks) {
  if (g_forward_variant < 0) {
    *rows_per_group = *unroll = *min_blocks = 0;
    return;
  }
  const FwdVariant& v = kForwardVariants[g_forward_variant];
  *rows_per_group = v.rows;
  *unroll = v.unroll;
  *min_blocks = v.min_blocks;
}

bool set_cuda_backward_variant(bool prefetch, int min_blocks) {
  if (min_blocks != 1 && min_blocks != 4) return false;
  g_backward_prefetch = prefetch;
  g_backward_min_blocks = min_blocks;
  return true;
}

void get_cuda_backward_variant(bool* prefetch, int* min_blocks) {
  *prefetch = g_backward_prefetch;
  *min_blocks = g_backward_min_blocks;
}

bool set_cuda_forward_variant(int rows_per_group, int unroll, int min_blocks) {
  if (rows_per_group == 0 && unroll == 0 && min_blocks == 0) {
    g_forward_variant = -1;
    return true;
  }
  for (int i = 0; i < kNumForwardVariants; ++i) {
    const FwdVariant& v = kForwardVariants[i];
    if (v.rows == rows_per_group && v.unroll == unroll && v.min_blocks == min_blocks) {
      g_forward_variant = i;
      return true;
    }
  }
  return false;
}
// ============================================================================================

cudaError_t lookup_forward_cuda(const LookupArgs* tables, int num_tables, cudaStream_t stream) {
  for (int t0 = 0; t0 < num_tables; t0 += kMaxTablesPerLaunch) {
    const int t1 = std::min(num_tables, t0 + kMaxTablesPerLaunch);
    int variant = g_forward_variant;
    if (variant < 0) {
      double keys = 0, rows = 0;
      for (int t = t0; t < t1; ++t) {
        keys += static_cast<double>(tables[t].ids.nnz) * static_cast<double>(tables[t].dim);
        rows += static_cast<double>(tables[t].ids.batch) * static_cast<double>(tables[t].dim);
      }
      variant = keys >= kAutoKeysThreshold * rows ? kAutoManyKeys : kAutoFewKeys;
    }
    FwdBatch b;
    std::memset(&b, 0, sizeof(b));
    int64_t blocks = 0;
    int nt = 0;
    for (int t = t0; t < t1; ++t, ++nt) {
      const LookupArgs& a = tables[t];
      if (a.ids.nnz >= (int64_t{1} << 31) || a.ids.batch >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
      FwdTable& T = b.t[nt];
      T.table = a.table;
      T.offsets = a.ids.row_offsets;
      T.keys = a.ids.keys;
      T.weights = a.ids.weights;
      T.out = a.out;
      T.dim = a.dim;
      T.batch = a.ids.batch;
      T.mean = a.combiner == Combiner::kMean;
      T.vec4 = a.dim % 4 == 0 && aligned16(a.table) && aligned16(a.out);
      const int64_t vecs = T.vec4 ? a.dim / 4 : a.dim;
      T.lanes_log2 = log2_lanes_for(vecs);
      T.chunks = static_cast<int32_t>(std::max<int64_t>(1, (vecs + (1 << T.lanes_log2) - 1) >> T.lanes_log2));
      const int64_t R = kForwardVariants[variant].rows;
      T.items = a.dim > 0 ? (a.ids.batch + R - 1) / R * T.chunks : 0;
      T.block_begin = static_cast<int32_t>(blocks);
      const int64_t per_block = kBlock >> T.lanes_log2;
      blocks += (T.items + per_block - 1) / per_block;
      if (blocks >= (int64_t{1} << 31)) return cudaErrorInvalidConfiguration;
    }
    b.num_tables = nt;
    if (blocks == 0) continue;
    // The variant changes speed only: every one gives the same bits.
    cudaError_t e;
    switch (variant) {
      case 1: e = launch_forward<1, 4, 8>(b, blocks, stream); break;
      case 2: e = launch_forward<1, 1, 8>(b, blocks, stream); break;
      case 3: e = launch_forward<2, 1, 8>(b, blocks, stream); break;
      case 4: e = launch_forward<2, 2, 4>(b, blocks, stream); break;
      case 5: e = launch_forward<2, 2, 6>(b, blocks, stream); break;
      case 6: e = launch_forward<4, 1, 4>(b, blocks, stream); break;
      case 7: e = launch_forward<4, 1, 6>(b, blocks, stream); break;
      default: e = launch_forward<1, 4, 1>(b, blocks, stream); break;
    }
    EL_TRY(e);
  }
  return cudaSuccess;
}

size_t check_ids_cuda_workspace() { return 256; }

namespace {
// The words check_ids() uses, built with std::to_string: no iostreams on this path (an
// ostringstream inside the Python module crashed on the GPU machine once PyTorch was loaded).
std::string describe_bad_ids(const std::vector<int64_t>& keys, const std::vector<int64_t>& off, int64_t nnz,
                             int64_t batch, int64_t num_rows, bool allow_missing) {
  using std::to_string;
  if (off[0] != 0) return "row_offsets[0] is " + to_string(off[0]) + ", expected 0";
  for (int64_t r = 0; r < batch; ++r)
    if (off[r + 1] < off[r])
      return "row_offsets decrease at row " + to_string(r) + " (" + to_string(off[r]) + " then " +
             to_string(off[r + 1]) + ")";
  if (off[batch] != nnz)
    return "row_offsets end at " + to_string(off[batch]) + " but there are " + to_string(nnz) + " keys";
  for (int64_t j = 0; j < nnz; ++j) {
    const int64_t k = keys[j];
    if (k >= -1 && k < num_rows && (allow_missing || k != -1)) continue;
    const int64_t row = std::upper_bound(off.begin(), off.end(), j) - off.begin() - 1;
    const std::string where = " at position " + to_string(j) + " (row " + to_string(row) + ")";
    if (k == -1) return "key -1" + where + " is not allowed here";
    if (k < -1) return "key " + to_string(k) + where + " is negative; only -1 may mark a missing key";
    return "key " + to_string(k) + where + " is outside the table of " + to_string(num_rows) + " rows";
  }
  return "invalid ids (found on the device)";
}
}  // namespace

std::string check_ids_cuda(const CsrIds& ids, int64_t num_rows, bool allow_missing, void* workspace,
                           cudaStream_t stream, cudaError_t* err, int64_t* max_key) {
  *err = cudaSuccess;
  if (ids.batch < 0 || ids.nnz < 0) return "negative size";
  auto fail = [&](cudaError_t e) {
    *err = e;
    return std::string("CUDA error: ") + cudaGetErrorString(e);
  };
  unsigned long long* status = static_cast<unsigned long long*>(workspace);
  cudaError_t e = cudaMemsetAsync(status, 0x7f, 3 * sizeof(unsigned long long), stream);
  if (e != cudaSuccess) return fail(e);
  if ((e = cudaMemsetAsync(status + 3, 0, sizeof(unsigned long long), stream)) != cudaSuccess) return fail(e);
  const int64_t n = std::max<int64_t>(std::max(ids.nnz, ids.batch), 1);
  check_ids_kernel<<<static_cast<unsigned>((n + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
      ids.row_offsets, ids.keys, ids.batch, ids.nnz, num_rows, allow_missing ? -1 : 0, max_key != nullptr, status);
  if ((e = cudaGetLastError()) != cudaSuccess) return fail(e);
  unsigned long long host[4];
  if ((e = cudaMemcpyAsync(host, status, sizeof(host), cudaMemcpyDeviceToHost, stream)) != cudaSuccess) return fail(e);
  if ((e = cudaStreamSynchronize(stream)) != cudaSuccess) return fail(e);
  if (max_key) *max_key = static_cast<int64_t>(host[3]) - 1;
  const unsigned long long ok = 0x7f7f7f7f7f7f7f7fULL;
  if (host[0] == ok && host[1] == ok && host[2] == ok) return "";
  // Cold path: copy the ids to the host and let the CPU check word the message.
  std::vector<int64_t> keys(ids.nnz), offs;
  if (ids.nnz > 0 &&
      (e = cudaMemcpy(keys.data(), ids.keys, ids.nnz * sizeof(int64_t), cudaMemcpyDeviceToHost)) != cudaSuccess)
    return fail(e);
  if (ids.row_offsets == nullptr) {
    const int64_t j = static_cast<int64_t>(host[0]);
    return "index " + std::to_string(keys[j]) + " at position " + std::to_string(j) + " is outside the table of " +
           std::to_string(num_rows) + " rows";
  }
  offs.resize(ids.batch + 1);
  if ((e = cudaMemcpy(offs.data(), ids.row_offsets, offs.size() * sizeof(int64_t), cudaMemcpyDeviceToHost)) !=
      cudaSuccess)
    return fail(e);
  return describe_bad_ids(keys, offs, ids.nnz, ids.batch, num_rows, allow_missing);
}

size_t lookup_backward_cuda_workspace(int64_t batch, int64_t nnz, int64_t dim, int64_t num_rows, cudaError_t* err) {
  BwdLayout L;
  const cudaError_t e = bwd_layout(batch, nnz, dim, num_rows, &L);
  if (err) *err = e;
  return e == cudaSuccess ? L.total : 0;
}

cudaError_t lookup_backward_cuda(const LookupGradArgs& args, int64_t num_rows, int64_t* unique_keys, float* rows,
                                 int64_t* num_unique, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  BwdGroup G;
  EL_TRY(make_group(&args, nullptr, 1, &G));
  G.vec4 &= rows_aligned(rows, args.dim);
  return backward_dispatch(G, num_rows, GradEpi{rows}, unique_keys, num_unique, workspace, workspace_bytes, stream);
}

size_t lookup_backward_apply_cuda_workspace(const LookupGradArgs* grads, const SparseUpdateArgs* targets,
                                            int num_tables, cudaError_t* err) {
  size_t most = 0;
  for (int t0 = 0; t0 < num_tables; t0 += kMaxTablesPerLaunch) {
    BwdGroup G;
    BwdLayout L;
    cudaError_t e = make_group(grads + t0, targets + t0, std::min(kMaxTablesPerLaunch, num_tables - t0), &G);
    if (e == cudaSuccess) e = bwd_layout(G.batch, G.nnz, G.stride, G.rows, &L);
    if (e != cudaSuccess) {
      if (err) *err = e;
      return 0;
    }
    most = std::max(most, L.total);
  }
  if (err) *err = cudaSuccess;
  return most;
}

cudaError_t lookup_backward_apply_cuda(const LookupGradArgs* grads, const SparseUpdateArgs* targets, int num_tables,
                                       const SparseOptimizer& opt, void* workspace, size_t workspace_bytes,
                                       cudaStream_t stream) {
  for (int t0 = 0; t0 < num_tables; t0 += kMaxTablesPerLaunch) {
    BwdGroup G;
    EL_TRY(make_group(grads + t0, targets + t0, std::min(kMaxTablesPerLaunch, num_tables - t0), &G));
    EL_TRY(apply_group(G, opt, workspace, workspace_bytes, stream));
  }
  return cudaSuccess;
}

cudaError_t lookup_backward_apply_cuda(const LookupGradArgs& grad, const SparseUpdateArgs& target,
                                       const SparseOptimizer& opt, void* workspace, size_t workspace_bytes,
                                       cudaStream_t stream) {
  return lookup_backward_apply_cuda(&grad, &target, 1, opt, workspace, workspace_bytes, stream);
}

namespace {
// The optimizers' (index, grad row) lists as "one key per row" gradient args.
std::vector<LookupGradArgs> index_grads(const SparseUpdateArgs* tables, int num_tables) {
  std::vector<LookupGradArgs> g(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    g[t].ids.row_offsets = nullptr;
    g[t].ids.keys = tables[t].indices;
    g[t].ids.batch = tables[t].n;
    g[t].ids.nnz = tables[t].n;
    g[t].combiner = Combiner::kSum;
    g[t].dim = tables[t].dim;
    g[t].grad_out = tables[t].grads;
  }
  return g;
}

cudaError_t sparse_update(const SparseUpdateArgs* tables, int num_tables, const SparseOptimizer& opt, void* ws,
                          size_t ws_bytes, cudaStream_t stream) {
  const std::vector<LookupGradArgs> g = index_grads(tables, num_tables);
  return lookup_backward_apply_cuda(g.data(), tables, num_tables, opt, ws, ws_bytes, stream);
}
}  // namespace

size_t sparse_update_cuda_workspace(const SparseUpdateArgs* tables, int num_tables, cudaError_t* err) {
  const std::vector<LookupGradArgs> g = index_grads(tables, num_tables);
  return lookup_backward_apply_cuda_workspace(g.data(), tables, num_tables, err);
}

cudaError_t sparse_sgd_cuda(const SparseUpdateArgs* tables, int num_tables, SgdParams p, void* ws, size_t ws_bytes,
                            cudaStream_t stream) {
  SparseOptimizer o;
  o.kind = OptimizerKind::kSgd;
  o.sgd = p;
  return sparse_update(tables, num_tables, o, ws, ws_bytes, stream);
}

cudaError_t sparse_adagrad_cuda(const SparseUpdateArgs* tables, int num_tables, AdagradParams p, void* ws,
                                size_t ws_bytes, cudaStream_t stream) {
  SparseOptimizer o;
  o.kind = OptimizerKind::kAdagrad;
  o.adagrad = p;
  return sparse_update(tables, num_tables, o, ws, ws_bytes, stream);
}

cudaError_t sparse_adam_cuda(const SparseUpdateArgs* tables, int num_tables, AdamParams p, void* ws, size_t ws_bytes,
                             cudaStream_t stream) {
  SparseOptimizer o;
  o.kind = OptimizerKind::kAdam;
  o.adam = p;
  return sparse_update(tables, num_tables, o, ws, ws_bytes, stream);
}

// ============================================================================================
// The gather floor (benchmarks): out[i] = table[rows[i]], nothing else
// ============================================================================================

namespace {
// One thread per 16-byte chunk of an output row (V = 4) or per float (V = 1), so every load of
// every row is in flight at once; a row index outside [0, num_rows) gives a zero row.
template <int V>
__global__ void __launch_bounds__(kBlock) gather_rows_kernel(const float* __restrict__ table, int64_t num_rows,
                                                             int64_t vecs, const int64_t* __restrict__ rows, int64_t n,
                                                             float* __restrict__ out) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= n * vecs) return;
  const int64_t i = t / vecs, j = t - i * vecs;
  const int64_t r = __ldg(rows + i);
  Vec<V> x = vzero<V>();
  if (r >= 0 && r < num_rows) x = vldg<V>(table + (r * vecs + j) * V);
  vst<V>(out + t * V, x);
}
}  // namespace

cudaError_t gather_rows_cuda(const float* table, int64_t num_rows, int64_t dim, const int64_t* rows, int64_t n,
                             float* out, cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return cudaSuccess;
  const bool vec4 = dim % 4 == 0 && aligned16(table) && aligned16(out);
  const int64_t vecs = vec4 ? dim / 4 : dim;
  const int64_t blocks = (n * vecs + kBlock - 1) / kBlock;
  if (blocks >= (int64_t{1} << 31)) return cudaErrorInvalidConfiguration;
  if (vec4) gather_rows_kernel<4><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(table, num_rows, vecs, rows, n, out);
  else gather_rows_kernel<1><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(table, num_rows, vecs, rows, n, out);
  return cudaGetLastError();
}

}  // namespace embedlab

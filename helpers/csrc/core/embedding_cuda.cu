// CUDA implementation of the contract in embedding.h (see the CUDA section there): the forward,
// the id checks, the backward (the engine in backward_cuda.cuh, with GradEpi), and the gather
// floor. The optimizers, which run the same engine with their epilogues, are in
// sparse_optimizer_cuda.cu.
//
// Where the time goes, and why the kernels look like this:
//   * Forward: a gather of random table rows, bound by memory. A "group" of L lanes (L = a
//     power of two <= 32, L * 4 >= dim when rows allow 16-byte access) produces one output
//     row: at dim 128 a warp per row, each lane one float4; at dim 16 four lanes per row and
//     eight rows per warp. Keys are read by every lane of the group (one broadcast load), the
//     key loop is unrolled by 4 so that four row loads are in flight before the first add,
//     and outputs are written with streaming stores (they are not read again by this kernel).
//     With as many keys as rows (one key per lookup, the latency-bound case) the row of key i
//     is loaded before row i's offsets arrive (forward_one_key): key -> row, as in a plain
//     gather, instead of offsets -> key -> row.
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
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backward_cuda.cuh"
#include "embedding.h"

namespace embedlab {

// Backward variant (benchmark knob, same bits): state prefetch, and min blocks per SM (1 or 4).
// Default: prefetch on, the faster setting, and no register cap, which would spill Adam's state.
bool g_backward_prefetch = true;
int g_backward_min_blocks = 1;

namespace {
int g_num_sms = 0;
}  // namespace

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

namespace {

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
  int32_t one_key;      // nnz == batch: most likely one key per row (forward_one_key)
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

// One output row's columns [col, col + V): the pooled sum, divided by the weight sum for "mean"
// (an empty row, or one of padding only, gives zeros), written with a streaming store.
template <int V>
__device__ __forceinline__ void store_pooled(const FwdTable& T, int64_t row, int64_t col, Vec<V> acc, float wsum) {
  if (T.mean) {
    if (wsum != 0.f) {
#pragma unroll
      for (int i = 0; i < V; ++i) acc.v[i] = __fdiv_rn(acc.v[i], wsum);
    } else {
      acc = vzero<V>();
    }
  }
  vstcs<V>(T.out + row * T.dim + col, acc);
}

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
    store_pooled<V>(T, row0 + r, col, acc[r], wsum[r]);
  }
}

// As many keys as rows (nnz == batch), most likely one key per row: the row of keys[row] is
// loaded before the offsets arrive and kept when offsets[row] == row and offsets[row + 1] ==
// row + 1 (else the row's keys are read after all, one by one: same bits, only slower). The
// chain is then key -> table row, with the offsets beside it, instead of offsets -> key -> row,
// one dependent load fewer (the plain gather's chain). Same adds, in the same order, as
// forward_rows: the same bits.
template <int V, int R>
__device__ __forceinline__ void forward_one_key(const FwdTable& T, int64_t row0, int64_t col) {
  const int64_t dim = T.dim;
  const float* __restrict__ tab = T.table + col;
  Vec<V> x[R];
  bool ok[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t k = row0 + r < T.batch ? __ldg(T.keys + row0 + r) : -1;  // nnz == batch
    ok[r] = k >= 0;
    x[r] = ok[r] ? vldg<V>(tab + k * dim) : vzero<V>();
  }
  bool single[R];  // offsets[row] == row and offsets[row + 1] == row + 1
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = row0 + r;
    const bool in = row < T.batch;
    const int64_t b0 = in ? __ldg(T.offsets + row) : -1, b1 = in ? __ldg(T.offsets + row + 1) : -1;
    single[r] = (b0 == row) & (b1 == row + 1);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = row0 + r;
    if (row >= T.batch) break;
    Vec<V> acc = vzero<V>();
    float wsum = 0.f;
    if (single[r]) {
      if (ok[r]) {
        const float w = T.weights ? __ldg(T.weights + row) : 1.f;
        vaxpy(acc, w, x[r]);
        wsum = __fadd_rn(wsum, w);
      }
    } else {
      const int64_t end = __ldg(T.offsets + row + 1);
      for (int64_t j = __ldg(T.offsets + row); j < end; ++j) {
        const int64_t k = __ldg(T.keys + j);
        if (k < 0) continue;
        const float w = T.weights ? __ldg(T.weights + j) : 1.f;
        vaxpy(acc, w, vldg<V>(tab + k * dim));
        wsum = __fadd_rn(wsum, w);
      }
    }
    store_pooled<V>(T, row, col, acc, wsum);
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
    if (col >= T.dim) return;
    if (kUnroll == 1 && T.one_key) forward_one_key<4, kRows>(T, rowgroup * kRows, col);
    else forward_rows<4, kRows, kUnroll>(T, rowgroup * kRows, col);
  } else {
    const int64_t col = chunk * (1 << lg) + lane;
    if (col >= T.dim) return;
    if (kUnroll == 1 && T.one_key) forward_one_key<1, kRows>(T, rowgroup * kRows, col);
    else forward_rows<1, kRows, kUnroll>(T, rowgroup * kRows, col);
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
// The plain backward's epilogue
// ============================================================================================

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

// Forward variants (rows per group R, key unroll U, min blocks per SM); see forward_kernel.
// Only these are compiled; kForwardVariants[g_forward_variant] is used.
struct FwdVariant {
  int rows, unroll, min_blocks;
};
constexpr FwdVariant kForwardVariants[] = {{1, 4, 1}, {1, 4, 8}, {1, 1, 8}, {2, 1, 8},
                                           {2, 2, 4}, {2, 2, 6}, {4, 1, 4}, {4, 1, 6}};
constexpr int kNumForwardVariants = sizeof(kForwardVariants) / sizeof(kForwardVariants[0]);
// -1: automatic. One key per lookup is latency-bound, so R = 4 rows per group with U = 1 keeps
// more rows in flight; many keys per lookup are not, and R = 1, U = 4 at the compiler's occupancy
// is faster there. Chosen per launch from the launch's mean keys per output row.
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
      T.one_key = a.ids.nnz == a.ids.batch;
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

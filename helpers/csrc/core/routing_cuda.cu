// CUDA routing of keys to their owners (see routing.h).
//
// Fast path (up to kFastTables tables and kFastWorkers workers): the keys of each table are cut
// into warp chunks of kChunk consecutive keys (a chunk never straddles two tables). One warp
// per chunk counts its keys per owner (__match_any_sync groups the lanes of one owner; the
// group's leader adds the group's size to the chunk's counter, so no atomics), a scan over a
// table's chunks turns those counts into each chunk's start inside its (owner, table) bucket,
// and the scatter pass walks the chunk again in input order: a key lands at its bucket's base +
// its chunk's start + the keys of its owner before it in the chunk. Input order within a bucket
// is kept (a stable counting sort), so the result is the CPU's, bit for bit. Tables travel as a
// kernel parameter: nothing is copied from the host and nothing synchronizes.
//
// Other shapes take the general path: one thread per key computes its bucket, a stable radix
// sort (CUB) of the bucket ids orders the keys, and a scatter writes them.
//
// Both paths check the output sizes on the device before writing anything: a stride below the
// busiest owner's count, a compact send array shorter than the routed keys, or a bad key leaves
// send and inverse untouched and puts the reason into the status words (routing.h).
#include <cuda_runtime.h>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "routing.h"

namespace embedlab {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("routing (CUDA): ") + what + ": " + cudaGetErrorString(e));
}

struct DevTable {
  int32_t mode;
  int32_t rank;
  int64_t rows;
};

__device__ __forceinline__ bool route_dev(const DevTable& t, int32_t n, int64_t key, int32_t* owner, int64_t* local) {
  if (t.mode == 2) {
    int64_t m = key % n;
    *owner = static_cast<int32_t>(m < 0 ? m + n : m);
    *local = key;
    return true;
  }
  if (t.mode == 1) {
    if (t.rows >= 0 && (key < 0 || key >= t.rows)) return false;
    *owner = t.rank;
    *local = key;
    return true;
  }
  if (key < 0 || key >= t.rows) return false;
  *owner = static_cast<int32_t>(key % n);
  *local = key / n;
  return true;
}

// Last t with offsets[t] <= i (binary search over T + 1 entries).
__device__ __forceinline__ int32_t table_of(const int64_t* offsets, int32_t T, int64_t i) {
  int32_t lo = 0, hi = T;  // offsets[lo] <= i < offsets[hi]
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (offsets[mid] <= i) lo = mid; else hi = mid;
  }
  return lo;
}

size_t align(size_t x) { return (x + 255) & ~size_t{255}; }

template <typename T>
T* at(void* ws, size_t off) {
  return reinterpret_cast<T*>(static_cast<char*>(ws) + off);
}

int grid_for(int64_t n) {
  const int64_t g = (n + 255) / 256;
  return static_cast<int>(g < 1 ? 1 : (g > 65535 ? 65535 : g));
}

// ---- status words (device int64[kRouteStatusWords], see routing.h) -----------------------------
// status_kernel: total, busiest owner, first bad key (from the counts [n * T] and first_bad),
// and, for a scatter, whether the outputs can hold the keys (stride / send_len; check = 1).
struct Offsets {
  const int64_t* dev;                      // general path: the offsets in the workspace
  int64_t host[kRouteFastTables + 1];      // fast path: the offsets themselves
};

__global__ void status_kernel(const int64_t* __restrict__ counts, int32_t n, int32_t T,
                              const unsigned long long* __restrict__ first_bad, const int64_t* __restrict__ keys,
                              const __grid_constant__ Offsets offs, int64_t stride, int64_t send_len, int check,
                              int64_t* __restrict__ status) {
  __shared__ unsigned long long s_total, s_max;
  if (threadIdx.x == 0) s_total = s_max = 0;
  __syncthreads();
  for (int32_t o = threadIdx.x; o < n; o += blockDim.x) {
    int64_t sum = 0;
    for (int32_t t = 0; t < T; ++t) sum += counts[static_cast<int64_t>(o) * T + t];
    atomicAdd(&s_total, static_cast<unsigned long long>(sum));
    atomicMax(&s_max, static_cast<unsigned long long>(sum));
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const unsigned long long bad = *first_bad;
  int64_t err = kRouteOk;
  status[0] = static_cast<int64_t>(s_total);
  status[1] = static_cast<int64_t>(s_max);
  status[2] = bad == ~0ull ? -1 : static_cast<int64_t>(bad);
  status[3] = -1;
  status[4] = 0;
  if (bad != ~0ull) {
    status[3] = table_of(offs.dev ? offs.dev : offs.host, T, static_cast<int64_t>(bad));
    status[4] = keys[bad];
    err = kRouteBadKey;
  } else if (check && stride > 0 && static_cast<int64_t>(s_max) > stride) {
    err = kRouteStrideTooSmall;
  } else if (check && stride == 0 && static_cast<int64_t>(s_total) > send_len) {
    err = kRouteSendTooShort;
  }
  status[5] = err;
}

// ---- fast path: warp chunks ----------------------------------------------------------------------
constexpr int kChunk = 256;       // keys per warp chunk (8 rounds of 32)
constexpr int kWarpsPerBlock = 8;

struct FastParams {
  DevTable tables[kRouteFastTables];
  int64_t offsets[kRouteFastTables + 1];      // key offsets of the tables
  int64_t chunk_begin[kRouteFastTables + 1];  // first chunk of each table
  int32_t T, n;
  int64_t chunks;
};

// Chunk c -> (table, first key, end key).
__device__ __forceinline__ void chunk_span(const FastParams& p, int64_t c, int32_t* t, int64_t* begin, int64_t* end) {
  int32_t lo = 0, hi = p.T;
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (p.chunk_begin[mid] <= c) lo = mid; else hi = mid;
  }
  *t = lo;
  *begin = p.offsets[lo] + (c - p.chunk_begin[lo]) * kChunk;
  *end = min(*begin + kChunk, p.offsets[lo + 1]);
}

// hist[(chunk_begin[t] * n) + o * chunks_t + (c - chunk_begin[t])]: keys of owner o in chunk c;
// owner-major within a table, so the scan over a table's chunks reads consecutive words.
__device__ __forceinline__ int64_t hist_index(const FastParams& p, int32_t t, int32_t o, int64_t c) {
  const int64_t ct = p.chunk_begin[t + 1] - p.chunk_begin[t];
  return p.chunk_begin[t] * p.n + static_cast<int64_t>(o) * ct + (c - p.chunk_begin[t]);
}

// SCATTER = false: count (hist must be zero). SCATTER = true: hist holds each chunk's start in
// its bucket (from scan_kernel); writes send / inverse unless status[5] reports an error.
template <bool SCATTER>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) chunk_kernel(const __grid_constant__ FastParams p,
                                                                   const int64_t* __restrict__ keys,
                                                                   int32_t* __restrict__ hist,
                                                                   unsigned long long* __restrict__ first_bad,
                                                                   const int64_t* __restrict__ base,
                                                                   const int64_t* __restrict__ status,
                                                                   int64_t* __restrict__ send,
                                                                   int64_t* __restrict__ inverse) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (c >= p.chunks) return;
  if (SCATTER && status[5] != kRouteOk) return;
  const int lane = threadIdx.x & 31;
  const unsigned lt = (1u << lane) - 1u;
  int32_t t;
  int64_t begin, end;
  chunk_span(p, c, &t, &begin, &end);
  const DevTable tab = p.tables[t];
  const int32_t sentinel = -1;
  // All keys of the chunk are loaded first: 8 independent loads in flight per lane.
  int64_t k[kChunk / 32];
#pragma unroll
  for (int r = 0; r < kChunk / 32; ++r) {
    const int64_t i = begin + r * 32 + lane;
    k[r] = i < end ? __ldg(keys + i) : -1;
  }
#pragma unroll
  for (int r = 0; r < kChunk / 32; ++r) {
    const int64_t i = begin + r * 32 + lane;
    int32_t o = sentinel;
    int64_t local = -1;
    if (i < end && k[r] != -1) {
      if (!route_dev(tab, p.n, k[r], &o, &local)) {
        o = sentinel;
        if (!SCATTER) atomicMin(first_bad, static_cast<unsigned long long>(i));
      }
    }
    const unsigned peers = __match_any_sync(0xffffffffu, o);
    const int leader = __ffs(peers) - 1;
    int32_t start = 0;
    if (o != sentinel && lane == leader) {
      int32_t* h = hist + hist_index(p, t, o, c);
      start = *h;
      *h = start + __popc(peers);
    }
    start = __shfl_sync(0xffffffffu, start, leader);
    if (SCATTER && i < end) {
      if (o == sentinel) {
        inverse[i] = -1;
      } else {
        const int64_t pos = base[static_cast<int64_t>(o) * p.T + t] + start + __popc(peers & lt);
        send[pos] = local;
        inverse[i] = pos;
      }
    }
    __syncwarp();  // the next round's leader reads what this round's leader wrote
  }
}

// One warp per (table, owner): exclusive scan of the owner's counts over the table's chunks
// (in place), and the total into counts[o * T + t].
__global__ void scan_kernel(const __grid_constant__ FastParams p, int32_t* __restrict__ hist,
                            int64_t* __restrict__ counts) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (w >= static_cast<int64_t>(p.T) * p.n) return;
  const int32_t t = static_cast<int32_t>(w / p.n), o = static_cast<int32_t>(w % p.n);
  const int lane = threadIdx.x & 31;
  const int64_t ct = p.chunk_begin[t + 1] - p.chunk_begin[t];
  int32_t* h = hist + p.chunk_begin[t] * p.n + static_cast<int64_t>(o) * ct;
  int64_t carry = 0;
  for (int64_t c0 = 0; c0 < ct; c0 += 32) {
    const int64_t c = c0 + lane;
    const int32_t v = c < ct ? h[c] : 0;
    int32_t x = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t y = __shfl_up_sync(0xffffffffu, x, d);
      if (lane >= d) x += y;
    }
    if (c < ct) h[c] = static_cast<int32_t>(carry) + x - v;
    carry += __shfl_sync(0xffffffffu, x, 31);
  }
  if (lane == 0) counts[static_cast<int64_t>(o) * p.T + t] = carry;
}

// ---- both paths ----------------------------------------------------------------------------------
// base[o * T + t]: where bucket (o, t) starts in send; start[b]: where it starts in the sorted
// order (general path). One block of kBasesThreads: a thread per owner, a block scan over owners
// (with a carry across rounds) for the compact layout.
constexpr int kBasesThreads = 1024;
__global__ void __launch_bounds__(kBasesThreads) bases_kernel(const int64_t* __restrict__ counts, int32_t n, int32_t T,
                                                              int64_t stride, int64_t* __restrict__ base,
                                                              int64_t* __restrict__ start) {
  using Scan = cub::BlockScan<int64_t, kBasesThreads>;
  __shared__ typename Scan::TempStorage tmp;
  int64_t carry = 0;
  for (int32_t o0 = 0; o0 < n; o0 += kBasesThreads) {
    const int32_t o = o0 + static_cast<int32_t>(threadIdx.x);
    int64_t sum = 0;
    if (o < n)
      for (int32_t t = 0; t < T; ++t) sum += counts[static_cast<int64_t>(o) * T + t];
    int64_t excl = 0, agg = 0;
    Scan(tmp).ExclusiveSum(sum, excl, agg);
    if (o < n) {
      int64_t run = stride > 0 ? static_cast<int64_t>(o) * stride : carry + excl;
      int64_t sorted = carry + excl;
      for (int32_t t = 0; t < T; ++t) {
        const int64_t b = static_cast<int64_t>(o) * T + t;
        base[b] = run;
        if (start) start[b] = sorted;
        run += counts[b];
        sorted += counts[b];
      }
    }
    carry += agg;
    __syncthreads();  // tmp is reused by the next round
  }
}

// -1 in every slot of the padded layout (before the keys land), unless the status is an error.
__global__ void fill_kernel(int64_t* __restrict__ send, int64_t size, const int64_t* __restrict__ status) {
  if (status[5] != kRouteOk) return;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < size;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x)
    send[j] = -1;
}

// ---- general path: radix sort of bucket ids ------------------------------------------------------
__global__ void bucket_kernel(const int64_t* __restrict__ keys, int64_t nnz, const int64_t* __restrict__ offsets,
                              const DevTable* __restrict__ tables, int32_t T, int32_t n, int32_t* __restrict__ bucket,
                              int64_t* __restrict__ local, int64_t* __restrict__ idx,
                              unsigned long long* __restrict__ counts, unsigned long long* __restrict__ first_bad) {
  const int32_t sentinel = n * T;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < nnz;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t k = keys[i];
    int32_t b = sentinel;
    int64_t lr = -1;
    if (k != -1) {
      const int32_t t = table_of(offsets, T, i);
      int32_t o;
      if (route_dev(tables[t], n, k, &o, &lr)) {
        b = o * T + t;
        atomicAdd(counts + b, 1ull);
      } else {
        atomicMin(first_bad, static_cast<unsigned long long>(i));
      }
    }
    if (bucket) bucket[i] = b;
    if (local) local[i] = lr;
    if (idx) idx[i] = i;
  }
}

__global__ void scatter_kernel(const int32_t* __restrict__ sorted_bucket, const int64_t* __restrict__ perm,
                               const int64_t* __restrict__ local, const int64_t* __restrict__ base,
                               const int64_t* __restrict__ start, int32_t sentinel, int64_t nnz,
                               const int64_t* __restrict__ status, int64_t* __restrict__ send,
                               int64_t* __restrict__ inverse) {
  if (status[5] != kRouteOk) return;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < nnz;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t b = sorted_bucket[j];
    const int64_t i = perm[j];
    if (b == sentinel) {
      inverse[i] = -1;
      continue;
    }
    const int64_t pos = base[b] + (j - start[b]);
    send[pos] = local[i];
    inverse[i] = pos;
  }
}

int end_bit_for(int32_t sentinel) {
  int bits = 1;
  while ((1ll << bits) <= sentinel) ++bits;
  return bits;
}

bool fast_path(const RouteArgs& a) { return a.num_tables <= kRouteFastTables && a.num_workers <= kRouteFastWorkers; }

int64_t chunks_of(const RouteArgs& a) {
  int64_t c = 0;
  for (int32_t t = 0; t < a.num_tables; ++t) c += (a.table_offsets[t + 1] - a.table_offsets[t] + kChunk - 1) / kChunk;
  return c;
}

// Workspace layout (every piece 256-byte aligned).
struct Layout {
  size_t bucket_in, bucket_out, local, idx_in, idx_out, offsets, tables, base, start, counts, bad, status, hist, cub,
      cub_bytes, total;
};

Layout layout(const RouteArgs& a) {
  Layout L{};
  const int32_t T = a.num_tables, n = a.num_workers;
  const size_t m = static_cast<size_t>(a.nnz > 0 ? a.nnz : 1);
  const size_t nb = static_cast<size_t>(n) * T;
  size_t at = 0;
  L.base = at; at += align(nb * 8);
  L.start = at; at += align(nb * 8);
  L.counts = at; at += align(nb * 8);
  L.bad = at; at += align(8);
  L.status = at; at += align(8 * kRouteStatusWords);
  L.offsets = at; at += align((T + 1) * 8);
  if (fast_path(a)) {
    L.hist = at; at += align(static_cast<size_t>(chunks_of(a)) * n * 4);
  } else {
    L.tables = at; at += align(T * sizeof(DevTable));
    L.bucket_in = at; at += align(m * 4);
    L.bucket_out = at; at += align(m * 4);
    L.local = at; at += align(m * 8);
    L.idx_in = at; at += align(m * 8);
    L.idx_out = at; at += align(m * 8);
    size_t cub_bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, static_cast<const int32_t*>(nullptr),
                                    static_cast<int32_t*>(nullptr), static_cast<const int64_t*>(nullptr),
                                    static_cast<int64_t*>(nullptr), static_cast<int64_t>(m), 0,
                                    end_bit_for(static_cast<int32_t>(nb)));
    L.cub = at; at += align(cub_bytes);
    L.cub_bytes = cub_bytes;
  }
  L.total = at;
  return L;
}

FastParams fast_params(const RouteArgs& a) {
  FastParams p;
  std::memset(&p, 0, sizeof(p));
  p.T = a.num_tables;
  p.n = a.num_workers;
  int64_t c = 0;
  for (int32_t t = 0; t < a.num_tables; ++t) {
    p.tables[t] = DevTable{static_cast<int32_t>(a.tables[t].mode), a.tables[t].rank, a.tables[t].rows};
    p.offsets[t] = a.table_offsets[t];
    p.chunk_begin[t] = c;
    c += (a.table_offsets[t + 1] - a.table_offsets[t] + kChunk - 1) / kChunk;
  }
  p.offsets[a.num_tables] = a.table_offsets[a.num_tables];
  p.chunk_begin[a.num_tables] = c;
  p.chunks = c;
  return p;
}

// The counting pass of both calls: counts (workspace, int64 [n * T]) and the first bad key.
// Fast path: hist holds the per-chunk counts, scanned (chunk starts within each bucket).
void count_pass(const RouteArgs& a, void* ws, const Layout& L, cudaStream_t s, FastParams* fp) {
  const int32_t n = a.num_workers, T = a.num_tables;
  const size_t nb = static_cast<size_t>(n) * T;
  auto* counts = at<int64_t>(ws, L.counts);
  auto* bad = at<unsigned long long>(ws, L.bad);
  check(cudaMemsetAsync(bad, 0xFF, 8, s), "clear status");
  if (fast_path(a)) {
    *fp = fast_params(a);
    auto* hist = at<int32_t>(ws, L.hist);
    if (fp->chunks > 0) {
      check(cudaMemsetAsync(hist, 0, static_cast<size_t>(fp->chunks) * n * 4, s), "clear chunk counts");
      const unsigned blocks = static_cast<unsigned>((fp->chunks + kWarpsPerBlock - 1) / kWarpsPerBlock);
      chunk_kernel<false><<<blocks, kWarpsPerBlock * 32, 0, s>>>(*fp, a.keys, hist, bad, nullptr, nullptr, nullptr,
                                                                 nullptr);
      check(cudaGetLastError(), "chunk count kernel");
    }
    const int64_t warps = static_cast<int64_t>(T) * n;
    scan_kernel<<<static_cast<unsigned>((warps + 7) / 8), 256, 0, s>>>(*fp, hist, counts);
    check(cudaGetLastError(), "scan kernel");
    return;
  }
  check(cudaMemsetAsync(counts, 0, nb * 8, s), "clear counts");
  std::vector<DevTable> t(T);
  for (int32_t i = 0; i < T; ++i) t[i] = DevTable{static_cast<int32_t>(a.tables[i].mode), a.tables[i].rank, a.tables[i].rows};
  check(cudaMemcpyAsync(at<int64_t>(ws, L.offsets), a.table_offsets, (T + 1) * 8, cudaMemcpyHostToDevice, s),
        "copy table offsets");
  check(cudaMemcpyAsync(at<DevTable>(ws, L.tables), t.data(), t.size() * sizeof(DevTable), cudaMemcpyHostToDevice, s),
        "copy tables");
  if (a.nnz > 0) {
    bucket_kernel<<<grid_for(a.nnz), 256, 0, s>>>(a.keys, a.nnz, at<int64_t>(ws, L.offsets), at<DevTable>(ws, L.tables),
                                                  T, n, at<int32_t>(ws, L.bucket_in), at<int64_t>(ws, L.local),
                                                  at<int64_t>(ws, L.idx_in), reinterpret_cast<unsigned long long*>(counts),
                                                  bad);
    check(cudaGetLastError(), "bucket kernel");
  }
}

Offsets offsets_param(const RouteArgs& a, void* ws, const Layout& L) {
  Offsets o;
  std::memset(&o, 0, sizeof(o));
  if (fast_path(a)) std::copy(a.table_offsets, a.table_offsets + a.num_tables + 1, o.host);
  else o.dev = at<int64_t>(ws, L.offsets);
  return o;
}

}  // namespace

size_t route_cuda_workspace_size(const RouteArgs& a) { return layout(a).total; }

void route_count_cuda_async(const RouteArgs& a, int64_t* status, void* workspace, size_t workspace_bytes,
                            void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Layout L = layout(a);
  if (workspace_bytes < L.total) throw std::invalid_argument("route_count_cuda: workspace too small");
  FastParams fp;
  count_pass(a, workspace, L, s, &fp);
  const size_t nb = static_cast<size_t>(a.num_workers) * a.num_tables;
  check(cudaMemcpyAsync(a.counts, at<int64_t>(workspace, L.counts), nb * 8, cudaMemcpyDeviceToDevice, s),
        "copy counts");
  status_kernel<<<1, 256, 0, s>>>(at<int64_t>(workspace, L.counts), a.num_workers, a.num_tables,
                                  at<unsigned long long>(workspace, L.bad), a.keys, offsets_param(a, workspace, L),
                                  0, 0, 0, status ? status : at<int64_t>(workspace, L.status));
  check(cudaGetLastError(), "status kernel");
}

RouteStatus read_route_status(const int64_t* status_dev, void* stream) {
  int64_t h[kRouteStatusWords];
  check(cudaMemcpyAsync(h, status_dev, sizeof(h), cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)),
        "read status");
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "synchronize");
  RouteStatus st;
  st.total = h[0];
  st.max_per_owner = h[1];
  st.bad_index = h[2];
  st.bad_table = static_cast<int32_t>(h[3]);
  st.bad_key = h[4];
  st.error = static_cast<int32_t>(h[5]);
  return st;
}

RouteStatus route_count_cuda(const RouteArgs& a, void* workspace, size_t workspace_bytes, void* stream) {
  const Layout L = layout(a);
  int64_t* status = at<int64_t>(workspace, L.status);
  route_count_cuda_async(a, status, workspace, workspace_bytes, stream);
  return read_route_status(status, stream);
}

void route_scatter_cuda(const RouteArgs& a, int64_t stride, int64_t* send, int64_t send_len, int64_t* inverse,
                        int64_t* status, void* workspace, size_t workspace_bytes, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int32_t n = a.num_workers, T = a.num_tables;
  const Layout L = layout(a);
  if (workspace_bytes < L.total) throw std::invalid_argument("route_scatter_cuda: workspace too small");
  if (stride < 0) throw std::invalid_argument("route_scatter_cuda: stride must be >= 0");
  if (stride > 0 && send_len < static_cast<int64_t>(n) * stride)
    throw std::invalid_argument("route_scatter_cuda: send is shorter than num_workers * stride");
  int64_t* st = status ? status : at<int64_t>(workspace, L.status);
  FastParams fp;
  count_pass(a, workspace, L, s, &fp);
  auto* counts = at<int64_t>(workspace, L.counts);
  // The counts of this pass (not the caller's) place the keys, and are checked against the
  // outputs before anything is written.
  check(cudaMemcpyAsync(a.counts, counts, static_cast<size_t>(n) * T * 8, cudaMemcpyDeviceToDevice, s), "copy counts");
  status_kernel<<<1, 256, 0, s>>>(counts, n, T, at<unsigned long long>(workspace, L.bad), a.keys,
                                  offsets_param(a, workspace, L), stride, send_len, 1, st);
  check(cudaGetLastError(), "status kernel");
  const bool general = !fast_path(a);
  bases_kernel<<<1, kBasesThreads, 0, s>>>(counts, n, T, stride, at<int64_t>(workspace, L.base),
                               general ? at<int64_t>(workspace, L.start) : nullptr);
  check(cudaGetLastError(), "bases kernel");
  if (stride > 0) {
    const int64_t size = static_cast<int64_t>(n) * stride;
    fill_kernel<<<grid_for(size), 256, 0, s>>>(send, size, st);
    check(cudaGetLastError(), "fill kernel");
  }
  if (a.nnz == 0) return;
  if (!general) {
    if (fp.chunks == 0) return;
    const unsigned blocks = static_cast<unsigned>((fp.chunks + kWarpsPerBlock - 1) / kWarpsPerBlock);
    chunk_kernel<true><<<blocks, kWarpsPerBlock * 32, 0, s>>>(fp, a.keys, at<int32_t>(workspace, L.hist), nullptr,
                                                              at<int64_t>(workspace, L.base), st, send, inverse);
    check(cudaGetLastError(), "chunk scatter kernel");
    return;
  }
  const int32_t sentinel = n * T;
  size_t cub_bytes = L.cub_bytes;
  check(cub::DeviceRadixSort::SortPairs(at<void>(workspace, L.cub), cub_bytes, at<int32_t>(workspace, L.bucket_in),
                                        at<int32_t>(workspace, L.bucket_out), at<int64_t>(workspace, L.idx_in),
                                        at<int64_t>(workspace, L.idx_out), a.nnz, 0, end_bit_for(sentinel), s),
        "radix sort");
  scatter_kernel<<<grid_for(a.nnz), 256, 0, s>>>(at<int32_t>(workspace, L.bucket_out), at<int64_t>(workspace, L.idx_out),
                                                 at<int64_t>(workspace, L.local), at<int64_t>(workspace, L.base),
                                                 at<int64_t>(workspace, L.start), sentinel, a.nnz, st, send, inverse);
  check(cudaGetLastError(), "scatter kernel");
}

}  // namespace embedlab

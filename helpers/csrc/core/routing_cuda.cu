// CUDA routing of keys to their owners (see routing.h). One thread per key computes its
// bucket (owner * T + table) and local row; route_count adds up the buckets with atomics and
// finds the first bad key (atomicMin of its position); route_scatter sorts the bucket ids with
// a stable radix sort (CUB), so keys keep their input order within a bucket exactly as on the
// CPU, then writes every key at its bucket's base plus its rank in the bucket.
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>

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
  {
    *owner = static_cast<int32_t>(key % n);
    *local = key / n;
  }
  return true;
}

// Table of position i: the last t with offsets[t] <= i (binary search over T + 1 entries).
__device__ __forceinline__ int32_t table_of(const int64_t* offsets, int32_t T, int64_t i) {
  int32_t lo = 0, hi = T;  // offsets[lo] <= i < offsets[hi]
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (offsets[mid] <= i) lo = mid; else hi = mid;
  }
  return lo;
}

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
        if (counts) atomicAdd(counts + b, 1ull);
      } else if (first_bad) {
        atomicMin(first_bad, static_cast<unsigned long long>(i));
      }
    }
    if (bucket) bucket[i] = b;
    if (local) local[i] = lr;
    if (idx) idx[i] = i;
  }
}

// One thread: base[b] (where bucket b starts in send) and start[b] (where it starts in the
// sorted order), from the counts. n * T is small (tables x workers).
__global__ void bases_kernel(const int64_t* __restrict__ counts, int32_t n, int32_t T, int64_t stride,
                             int64_t* __restrict__ base, int64_t* __restrict__ start) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  int64_t sorted = 0, compact = 0;
  for (int32_t o = 0; o < n; ++o) {
    int64_t run = stride > 0 ? static_cast<int64_t>(o) * stride : compact;
    for (int32_t t = 0; t < T; ++t) {
      const int32_t b = o * T + t;
      base[b] = run;
      start[b] = sorted;
      run += counts[b];
      sorted += counts[b];
    }
    compact = run;
  }
}

__global__ void scatter_kernel(const int32_t* __restrict__ sorted_bucket, const int64_t* __restrict__ perm,
                               const int64_t* __restrict__ local, const int64_t* __restrict__ base,
                               const int64_t* __restrict__ start, int32_t sentinel, int64_t nnz,
                               int64_t* __restrict__ send, int64_t* __restrict__ inverse) {
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

size_t align(size_t x) { return (x + 255) & ~size_t{255}; }

// Workspace layout (every piece 256-byte aligned).
struct Layout {
  size_t bucket_in, bucket_out, local, idx_in, idx_out, offsets, tables, base, start, counts, bad, cub, cub_bytes, total;
};

Layout layout(int64_t nnz, int32_t T, int32_t n) {
  Layout L{};
  const size_t m = static_cast<size_t>(nnz > 0 ? nnz : 1);
  const size_t nb = static_cast<size_t>(n) * T;
  size_t at = 0;
  L.bucket_in = at; at += align(m * 4);
  L.bucket_out = at; at += align(m * 4);
  L.local = at; at += align(m * 8);
  L.idx_in = at; at += align(m * 8);
  L.idx_out = at; at += align(m * 8);
  L.offsets = at; at += align((T + 1) * 8);
  L.tables = at; at += align(T * sizeof(DevTable));
  L.base = at; at += align(nb * 8);
  L.start = at; at += align(nb * 8);
  L.counts = at; at += align(nb * 8);
  L.bad = at; at += align(8);
  size_t cub_bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                  static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
                                  static_cast<int64_t>(m), 0, end_bit_for(static_cast<int32_t>(nb)));
  L.cub = at; at += align(cub_bytes);
  L.cub_bytes = cub_bytes;
  L.total = at;
  return L;
}

template <typename T>
T* at(void* ws, size_t off) {
  return reinterpret_cast<T*>(static_cast<char*>(ws) + off);
}

int grid_for(int64_t n) {
  const int64_t g = (n + 255) / 256;
  return static_cast<int>(g < 1 ? 1 : (g > 65535 ? 65535 : g));
}

void upload_tables(const RouteArgs& a, void* ws, const Layout& L, cudaStream_t s) {
  std::vector<DevTable> t(a.num_tables);
  for (int32_t i = 0; i < a.num_tables; ++i)
    t[i] = DevTable{static_cast<int32_t>(a.tables[i].mode), a.tables[i].rank, a.tables[i].rows};
  check(cudaMemcpyAsync(at<int64_t>(ws, L.offsets), a.table_offsets, (a.num_tables + 1) * 8, cudaMemcpyHostToDevice, s),
        "copy table offsets");
  check(cudaMemcpyAsync(at<DevTable>(ws, L.tables), t.data(), t.size() * sizeof(DevTable), cudaMemcpyHostToDevice, s),
        "copy tables");
}

}  // namespace

size_t route_cuda_workspace_size(int64_t nnz, int32_t num_tables, int32_t num_workers) {
  return layout(nnz, num_tables, num_workers).total;
}

RouteStatus route_count_cuda(const RouteArgs& a, void* workspace, size_t workspace_bytes, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int32_t n = a.num_workers, T = a.num_tables;
  const Layout L = layout(a.nnz, T, n);
  if (workspace_bytes < L.total) throw std::invalid_argument("route_count_cuda: workspace too small");
  RouteStatus st;
  const size_t nb = static_cast<size_t>(n) * T;
  auto* counts = at<unsigned long long>(workspace, L.counts);
  auto* bad = at<unsigned long long>(workspace, L.bad);
  check(cudaMemsetAsync(counts, 0, nb * 8, s), "clear counts");
  check(cudaMemsetAsync(bad, 0xFF, 8, s), "clear status");
  if (a.nnz > 0) {
    upload_tables(a, workspace, L, s);
    bucket_kernel<<<grid_for(a.nnz), 256, 0, s>>>(a.keys, a.nnz, at<int64_t>(workspace, L.offsets),
                                                  at<DevTable>(workspace, L.tables), T, n, nullptr, nullptr, nullptr,
                                                  counts, bad);
    check(cudaGetLastError(), "bucket kernel");
  }
  std::vector<int64_t> host(nb);
  unsigned long long first_bad = 0;
  check(cudaMemcpyAsync(a.counts, counts, nb * 8, cudaMemcpyDeviceToDevice, s), "copy counts");
  check(cudaMemcpyAsync(host.data(), counts, nb * 8, cudaMemcpyDeviceToHost, s), "read counts");
  check(cudaMemcpyAsync(&first_bad, bad, 8, cudaMemcpyDeviceToHost, s), "read status");
  check(cudaStreamSynchronize(s), "synchronize");
  if (first_bad != ~0ull) {
    st.bad_index = static_cast<int64_t>(first_bad);
    int32_t t = 0;
    while (t + 1 < T && a.table_offsets[t + 1] <= st.bad_index) ++t;
    st.bad_table = t;
    check(cudaMemcpy(&st.bad_key, a.keys + st.bad_index, 8, cudaMemcpyDeviceToHost), "read bad key");
    return st;
  }
  for (int32_t o = 0; o < n; ++o) {
    int64_t sum = 0;
    for (int32_t t = 0; t < T; ++t) sum += host[static_cast<size_t>(o) * T + t];
    st.total += sum;
    st.max_per_owner = sum > st.max_per_owner ? sum : st.max_per_owner;
  }
  return st;
}

void route_scatter_cuda(const RouteArgs& a, int64_t stride, int64_t* send, int64_t* inverse, void* workspace,
                        size_t workspace_bytes, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int32_t n = a.num_workers, T = a.num_tables;
  const Layout L = layout(a.nnz, T, n);
  if (workspace_bytes < L.total) throw std::invalid_argument("route_scatter_cuda: workspace too small");
  if (stride > 0) check(cudaMemsetAsync(send, 0xFF, static_cast<size_t>(n) * stride * 8, s), "fill send with -1");
  if (a.nnz == 0) return;
  upload_tables(a, workspace, L, s);
  const int32_t sentinel = n * T;
  bucket_kernel<<<grid_for(a.nnz), 256, 0, s>>>(a.keys, a.nnz, at<int64_t>(workspace, L.offsets),
                                                at<DevTable>(workspace, L.tables), T, n,
                                                at<int32_t>(workspace, L.bucket_in), at<int64_t>(workspace, L.local),
                                                at<int64_t>(workspace, L.idx_in), nullptr, nullptr);
  check(cudaGetLastError(), "bucket kernel");
  size_t cub_bytes = L.cub_bytes;
  check(cub::DeviceRadixSort::SortPairs(at<void>(workspace, L.cub), cub_bytes, at<int32_t>(workspace, L.bucket_in),
                                        at<int32_t>(workspace, L.bucket_out), at<int64_t>(workspace, L.idx_in),
                                        at<int64_t>(workspace, L.idx_out), a.nnz, 0, end_bit_for(sentinel), s),
        "radix sort");
  bases_kernel<<<1, 1, 0, s>>>(a.counts, n, T, stride, at<int64_t>(workspace, L.base), at<int64_t>(workspace, L.start));
  check(cudaGetLastError(), "bases kernel");
  scatter_kernel<<<grid_for(a.nnz), 256, 0, s>>>(at<int32_t>(workspace, L.bucket_out), at<int64_t>(workspace, L.idx_out),
                                                 at<int64_t>(workspace, L.local), at<int64_t>(workspace, L.base),
                                                 at<int64_t>(workspace, L.start), sentinel, a.nnz, send, inverse);
  check(cudaGetLastError(), "scatter kernel");
}

}  // namespace embedlab

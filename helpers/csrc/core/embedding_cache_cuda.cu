// CUDA embedding cache (see embedding_cache.h for the layout and the contract).
//
// Where the time goes: the hit path is a gather with two dependent lookups in front of it
// (key -> its set's occupancy word and keys -> the row). A "group" of G lanes serves one key
// (G = 4 at dim 16, 32 at dim 128: one 16-byte access per lane per row chunk): the group reads
// the key (one broadcast load), compares the set's ways (lane w checks ways w, w + G, ...),
// agrees on the way with a tile ballot, and copies the row with 16-byte loads and streaming
// stores. At dim 16 (G = 4) a 65,536-key batch fits in one wave of resident groups on an H100,
// so the dependent memory latencies of all its keys overlap. Dynamic caches write
// the call's epoch (a device counter, see call_epoch) into a hit's stamp only when it differs;
// static caches write nothing.
//
// Writes (insert / update / erase): one group per key; lane 0 takes the set's lock (its version
// word from even to odd with atomicCAS), decides the way, publishes it to the group, the group
// copies the row, every lane fences, and lane 0 releases the lock (version + 1). Independent
// thread scheduling (sm_70+) lets a spinning lane and the holder share a warp.
#include <cooperative_groups.h>
#include <cub/cub.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstdint>

#include "embedding_cache.h"

namespace embedlab {
namespace {

namespace cg = cooperative_groups;

#define EL_TRY(expr)                            \
  do {                                          \
    const cudaError_t el_err_ = (expr);         \
    if (el_err_ != cudaSuccess) return el_err_; \
  } while (0)

constexpr int kBlock = 256;
enum Counter { kHits = 0, kMisses, kInserts, kEvictions, kUpdates, kErases, kRejected, kNumCounters };
constexpr int kCall = 8;  // offset of this call's counters
enum WriteMode { kInsert = 0, kUpdate = 1, kErase = 2 };


struct Cache {
  uint32_t* headers;
  int64_t* keys;
  uint32_t* stamps;
  float* values;
  int64_t num_sets;
  int64_t dim;
  int ways;
  bool is_static;
};

// Block-wide sum of per-thread counts, then one atomic per block.
__device__ __forceinline__ void add_block(unsigned long long* dst, unsigned long long v) {
  __shared__ unsigned long long sum;
  if (threadIdx.x == 0) sum = 0;
  __syncthreads();
  v = __reduce_add_sync(0xffffffffu, static_cast<unsigned>(v));
  if ((threadIdx.x & 31) == 0 && v) atomicAdd(&sum, v);
  __syncthreads();
  if (threadIdx.x == 0 && sum) atomicAdd(dst, sum);
}

// This call's epoch: block 0 advances the device counter and takes the value it had; the other
// blocks read the counter (before or after that increment), so one call's stamps lie within
// {e, e + 1}. Ages are taken as signed differences clamped at 0, which keeps that harmless.
__device__ __forceinline__ uint32_t call_epoch(uint32_t* counter) {
  __shared__ uint32_t e;
  if (threadIdx.x == 0) e = blockIdx.x == 0 ? atomicAdd(counter, 1u) : *reinterpret_cast<volatile uint32_t*>(counter);
  __syncthreads();
  return e;
}

__device__ __forceinline__ int32_t age(uint32_t epoch, uint32_t stamp) {
  const int32_t a = static_cast<int32_t>(epoch - stamp);
  return a < 0 ? 0 : a;
}

template <int G, typename Tile>
__device__ __forceinline__ int find_way(const Tile& tile, const Cache& c, int64_t s, uint32_t occ, int64_t key) {
  int way = -1;
  for (int w = tile.thread_rank(); w < c.ways; w += G)
    if (((occ >> w) & 1u) && __ldcg(c.keys + s * c.ways + w) == key) way = w;
  const unsigned m = tile.ballot(way >= 0);
  return m ? tile.shfl(way, __ffs(m) - 1) : -1;
}

template <int G, bool VEC4, bool TOUCH>
__global__ void __launch_bounds__(kBlock, 6) lookup_kernel(Cache c, const int64_t* __restrict__ keys, int64_t n,
                                                         float* __restrict__ out, uint8_t* __restrict__ flags,
                                                         uint8_t hit_flag, uint32_t* epoch_counter,
                                                         unsigned long long* counters) {
  const uint32_t epoch = TOUCH ? call_epoch(epoch_counter) : 0;
  auto tile = cg::tiled_partition<G>(cg::this_thread_block());
  const int lane = tile.thread_rank();
  const int64_t step = static_cast<int64_t>(gridDim.x) * (kBlock / G);
  unsigned long long hits = 0, seen = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * (kBlock / G) + threadIdx.x / G; i < n; i += step) {
    const int64_t key = __ldg(keys + i);
    const int64_t s = cache_set_of(key, c.num_sets);
    const uint32_t occ = __ldcg(c.headers + 2 * s + 1);
    const int way = find_way<G>(tile, c, s, occ, key);
    if (way >= 0) {
      const int64_t slot = s * c.ways + way;
      if (VEC4) {
        const int64_t d4 = c.dim / 4;
        const float4* src = reinterpret_cast<const float4*>(c.values) + slot * d4;
        float4* dst = reinterpret_cast<float4*>(out) + i * d4;
        for (int64_t j = lane; j < d4; j += G) __stcs(dst + j, __ldcs(src + j));
      } else {
        const float* src = c.values + slot * c.dim;
        float* dst = out + i * c.dim;
        for (int64_t j = lane; j < c.dim; j += G) __stcs(dst + j, __ldcs(src + j));
      }
      if (TOUCH && lane == 0 && c.stamps[slot] != epoch) c.stamps[slot] = epoch;
    }
    if (lane == 0) {
      if (flags) flags[i] = (way >= 0) ? hit_flag : static_cast<uint8_t>(1 - hit_flag);
      hits += way >= 0;
      ++seen;
    }
  }
  if (counters) {
    add_block(counters + kHits, hits);
    add_block(counters + kMisses, seen - hits);
  }
}

__device__ __forceinline__ uint32_t lock_set(uint32_t* version) {
  for (;;) {
    const uint32_t v = *reinterpret_cast<volatile uint32_t*>(version);
    if (!(v & 1u) && atomicCAS(version, v, v + 1) == v) {
      __threadfence();
      return v + 1;
    }
    __nanosleep(32);
  }
}

template <int G, bool VEC4>
__global__ void __launch_bounds__(kBlock) write_kernel(Cache c, const int64_t* __restrict__ keys,
                                                        const float* __restrict__ values, int64_t n, int mode,
                                                        uint32_t* epoch_counter, unsigned long long* counters) {
  const uint32_t epoch = mode == kErase ? 0 : call_epoch(epoch_counter);
  auto tile = cg::tiled_partition<G>(cg::this_thread_block());
  const int lane = tile.thread_rank();
  const int64_t step = static_cast<int64_t>(gridDim.x) * (kBlock / G);
  const uint32_t full = c.ways == 32 ? 0xffffffffu : ((1u << c.ways) - 1u);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * (kBlock / G) + threadIdx.x / G; i < n; i += step) {
    const int64_t key = keys[i];
    const int64_t s = cache_set_of(key, c.num_sets);
    uint32_t* version = c.headers + 2 * s;
    volatile uint32_t* occupied = reinterpret_cast<volatile uint32_t*>(c.headers + 2 * s + 1);
    volatile int64_t* set_keys = reinterpret_cast<volatile int64_t*>(c.keys + s * c.ways);
    // Set metadata is read and written through volatile pointers: L1 is not coherent between
    // SMs, and another block may have changed the set since this SM last cached its line.
    volatile uint32_t* stamps = reinterpret_cast<volatile uint32_t*>(c.stamps + s * c.ways);
    int way = -1, copy = 0;
    uint32_t held = 0;
    if (lane == 0) {
      held = lock_set(version);
      const uint32_t occ = *occupied;
      for (int w = 0; w < c.ways; ++w)
        if (((occ >> w) & 1u) && set_keys[w] == key) {
          way = w;
          break;
        }
      if (mode == kErase) {
        if (way >= 0) {
          *occupied = occ & ~(1u << way);
          atomicAdd(counters + kErases, 1ull);
          atomicAdd(counters + kCall, 1ull);
        }
        way = -1;
      } else if (way >= 0) {
        if (!c.is_static) {  // overwrite (insert) or update
          stamps[way] = epoch;
          copy = 1;
          atomicAdd(counters + (mode == kInsert ? kInserts : kUpdates), 1ull);
          atomicAdd(counters + kCall, 1ull);
        }
      } else if (mode == kInsert) {
        const uint32_t free_ways = ~occ & full;
        if (free_ways) {
          way = __ffs(free_ways) - 1;
          atomicAdd(counters + kCall + 1, 1ull);  // rows added (size)
        } else if (!c.is_static) {
          way = 0;
          int32_t oldest = age(epoch, stamps[0]);
          for (int w = 1; w < c.ways; ++w) {
            const int32_t a = age(epoch, stamps[w]);
            if (a > oldest) {
              oldest = a;
              way = w;
            }
          }
          atomicAdd(counters + kEvictions, 1ull);
        } else {
          atomicAdd(counters + kRejected, 1ull);
        }
        if (way >= 0) {
          set_keys[way] = key;
          stamps[way] = epoch;
          *occupied = occ | (1u << way);
          copy = 1;
          atomicAdd(counters + kInserts, 1ull);
          atomicAdd(counters + kCall, 1ull);
        }
      }
    }
    way = tile.shfl(way, 0);
    copy = tile.shfl(copy, 0);
    if (copy) {
      const int64_t slot = s * c.ways + way;
      if (VEC4) {
        const int64_t d4 = c.dim / 4;
        float4* dst = reinterpret_cast<float4*>(c.values) + slot * d4;
        const float4* src = reinterpret_cast<const float4*>(values) + i * d4;
        for (int64_t j = lane; j < d4; j += G) dst[j] = src[j];
      } else {
        float* dst = c.values + slot * c.dim;
        const float* src = values + i * c.dim;
        for (int64_t j = lane; j < c.dim; j += G) dst[j] = src[j];
      }
    }
    __threadfence();  // this lane's row stores before the release
    tile.sync();
    if (lane == 0) atomicExch(version, held + 1);
  }
}

__global__ void size_kernel(const uint32_t* headers, int64_t num_sets, unsigned long long* out) {
  unsigned long long cnt = 0;
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < num_sets;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x)
    cnt += __popc(headers[2 * s + 1]);
  add_block(out, cnt);
}

int lanes_for(int64_t vecs) {
  int g = 4;
  while (g < 32 && g < vecs) g *= 2;
  return g;
}

// Enough blocks for every resident slot (the lookup kernel allows 6 blocks per SM), capped by n.
int grid_for(int64_t n, int g) {
  static int sms = 0;
  if (!sms) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (sms <= 0) sms = 80;
  }
  const int64_t groups_per_block = kBlock / g;
  const int64_t want = (n + groups_per_block - 1) / groups_per_block;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(want, int64_t{sms} * 6)));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <int G>
cudaError_t launch_lookup(const Cache& c, bool vec4, const int64_t* keys, int64_t n, float* out, uint8_t* flags,
                          uint8_t hit_flag, uint32_t* epoch, unsigned long long* counters, cudaStream_t stream) {
  const int grid = grid_for(n, G);
  if (vec4) {
    if (c.is_static) lookup_kernel<G, true, false><<<grid, kBlock, 0, stream>>>(c, keys, n, out, flags, hit_flag, epoch, counters);
    else lookup_kernel<G, true, true><<<grid, kBlock, 0, stream>>>(c, keys, n, out, flags, hit_flag, epoch, counters);
  } else {
    if (c.is_static) lookup_kernel<G, false, false><<<grid, kBlock, 0, stream>>>(c, keys, n, out, flags, hit_flag, epoch, counters);
    else lookup_kernel<G, false, true><<<grid, kBlock, 0, stream>>>(c, keys, n, out, flags, hit_flag, epoch, counters);
  }
  return cudaGetLastError();
}

template <int G>
cudaError_t launch_write(const Cache& c, bool vec4, const int64_t* keys, const float* values, int64_t n, int mode,
                         uint32_t* epoch, unsigned long long* counters, cudaStream_t stream) {
  const int grid = grid_for(n, G);
  if (vec4) write_kernel<G, true><<<grid, kBlock, 0, stream>>>(c, keys, values, n, mode, epoch, counters);
  else write_kernel<G, false><<<grid, kBlock, 0, stream>>>(c, keys, values, n, mode, epoch, counters);
  return cudaGetLastError();
}

}  // namespace

EmbeddingCacheCuda::EmbeddingCacheCuda(int64_t capacity, int64_t dim, int ways, bool is_static, cudaError_t* err)
    : dim_(dim), ways_(ways), static_(is_static) {
  num_sets_ = std::max<int64_t>(1, (capacity + ways - 1) / ways);
  const size_t slots = static_cast<size_t>(num_sets_ * ways_);
  auto run = [&]() -> cudaError_t {
    EL_TRY(cudaGetDevice(&device_));
    EL_TRY(cudaMalloc(&headers_, sizeof(uint32_t) * 2 * num_sets_));
    EL_TRY(cudaMalloc(&keys_, sizeof(int64_t) * slots));
    EL_TRY(cudaMalloc(&stamps_, sizeof(uint32_t) * slots));
    EL_TRY(cudaMalloc(&values_, sizeof(float) * slots * static_cast<size_t>(dim_)));
    EL_TRY(cudaMalloc(&counters_, sizeof(unsigned long long) * 16));
    EL_TRY(cudaMalloc(&epoch_, sizeof(uint32_t)));
    const uint32_t first_epoch = 1;
    EL_TRY(cudaMemcpy(epoch_, &first_epoch, sizeof(uint32_t), cudaMemcpyHostToDevice));
    EL_TRY(cudaMemset(headers_, 0, sizeof(uint32_t) * 2 * num_sets_));
    EL_TRY(cudaMemset(stamps_, 0, sizeof(uint32_t) * slots));
    EL_TRY(cudaMemset(counters_, 0, sizeof(unsigned long long) * 16));
    return cudaDeviceSynchronize();
  };
  *err = run();
}

EmbeddingCacheCuda::~EmbeddingCacheCuda() {
  cudaFree(headers_);
  cudaFree(keys_);
  cudaFree(stamps_);
  cudaFree(values_);
  cudaFree(counters_);
  cudaFree(epoch_);
}

#define EL_DISPATCH_G(g, fn, ...)                 \
  switch (g) {                                    \
    case 4: return fn<4>(__VA_ARGS__);            \
    case 8: return fn<8>(__VA_ARGS__);            \
    case 16: return fn<16>(__VA_ARGS__);          \
    default: return fn<32>(__VA_ARGS__);          \
  }

cudaError_t EmbeddingCacheCuda::lookup_mask(const int64_t* keys, int64_t n, float* out, uint8_t* hit_mask,
                                            cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const Cache c{headers_, keys_, stamps_, values_, num_sets_, dim_, ways_, static_};
  const bool vec4 = dim_ % 4 == 0 && aligned16(out);
  const int g = lanes_for(vec4 ? dim_ / 4 : dim_);
  EL_DISPATCH_G(g, launch_lookup, c, vec4, keys, n, out, hit_mask, uint8_t{1}, epoch_, counters_, stream);
}

size_t EmbeddingCacheCuda::lookup_workspace_bytes(int64_t n) {
  size_t cub_bytes = 0;
  cub::DeviceSelect::Flagged(nullptr, cub_bytes, thrust::counting_iterator<int64_t>(0),
                             static_cast<const uint8_t*>(nullptr), static_cast<int64_t*>(nullptr),
                             static_cast<int64_t*>(nullptr), static_cast<int64_t>(std::max<int64_t>(n, 1)));
  const size_t flags = (static_cast<size_t>(std::max<int64_t>(n, 1)) + 255) / 256 * 256;
  return flags + 256 + (cub_bytes + 255) / 256 * 256;
}

cudaError_t EmbeddingCacheCuda::lookup(const int64_t* keys, int64_t n, float* out, int64_t* missing, int64_t* m_host,
                                       void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  *m_host = 0;
  if (n <= 0) return cudaSuccess;
  if (workspace_bytes < lookup_workspace_bytes(n)) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  uint8_t* flags = reinterpret_cast<uint8_t*>(ws);
  const size_t flag_bytes = (static_cast<size_t>(n) + 255) / 256 * 256;
  int64_t* d_count = reinterpret_cast<int64_t*>(ws + flag_bytes);
  void* tmp = ws + flag_bytes + 256;
  size_t tmp_bytes = workspace_bytes - flag_bytes - 256;
  const Cache c{headers_, keys_, stamps_, values_, num_sets_, dim_, ways_, static_};
  const bool vec4 = dim_ % 4 == 0 && aligned16(out);
  const int g = lanes_for(vec4 ? dim_ / 4 : dim_);
  cudaError_t e;
  switch (g) {
    case 4: e = launch_lookup<4>(c, vec4, keys, n, out, flags, 0, epoch_, counters_, stream); break;
    case 8: e = launch_lookup<8>(c, vec4, keys, n, out, flags, 0, epoch_, counters_, stream); break;
    case 16: e = launch_lookup<16>(c, vec4, keys, n, out, flags, 0, epoch_, counters_, stream); break;
    default: e = launch_lookup<32>(c, vec4, keys, n, out, flags, 0, epoch_, counters_, stream); break;
  }
  EL_TRY(e);
  EL_TRY(cub::DeviceSelect::Flagged(tmp, tmp_bytes, thrust::counting_iterator<int64_t>(0), flags, missing, d_count,
                                    n, stream));
  EL_TRY(cudaMemcpyAsync(m_host, d_count, sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  return cudaStreamSynchronize(stream);
}

cudaError_t EmbeddingCacheCuda::write(int mode, const int64_t* keys, const float* values, int64_t n,
                                      int64_t* count_host, cudaStream_t stream) {
  if (count_host) *count_host = 0;
  if (n <= 0) return cudaSuccess;
  EL_TRY(cudaMemsetAsync(counters_ + kCall, 0, 2 * sizeof(unsigned long long), stream));
  const Cache c{headers_, keys_, stamps_, values_, num_sets_, dim_, ways_, static_};
  const bool vec4 = values && dim_ % 4 == 0 && aligned16(values);
  const int g = mode == kErase ? 4 : lanes_for(vec4 ? dim_ / 4 : dim_);
  cudaError_t e;
  switch (g) {
    case 4: e = launch_write<4>(c, vec4, keys, values, n, mode, epoch_, counters_, stream); break;
    case 8: e = launch_write<8>(c, vec4, keys, values, n, mode, epoch_, counters_, stream); break;
    case 16: e = launch_write<16>(c, vec4, keys, values, n, mode, epoch_, counters_, stream); break;
    default: e = launch_write<32>(c, vec4, keys, values, n, mode, epoch_, counters_, stream); break;
  }
  EL_TRY(e);
  if (!count_host) return cudaSuccess;
  unsigned long long v = 0;
  EL_TRY(cudaMemcpyAsync(&v, counters_ + kCall, sizeof(v), cudaMemcpyDeviceToHost, stream));
  EL_TRY(cudaStreamSynchronize(stream));
  *count_host = static_cast<int64_t>(v);
  return cudaSuccess;
}

cudaError_t EmbeddingCacheCuda::insert(const int64_t* keys, const float* values, int64_t n, int64_t* stored_host,
                                       cudaStream_t stream) {
  return write(kInsert, keys, values, n, stored_host, stream);
}
cudaError_t EmbeddingCacheCuda::update(const int64_t* keys, const float* values, int64_t n, int64_t* present_host,
                                       cudaStream_t stream) {
  return write(kUpdate, keys, values, n, present_host, stream);
}
cudaError_t EmbeddingCacheCuda::erase(const int64_t* keys, int64_t n, int64_t* removed_host, cudaStream_t stream) {
  return write(kErase, keys, nullptr, n, removed_host, stream);  // erase takes no epoch (as on the CPU)
}

cudaError_t EmbeddingCacheCuda::clear(cudaStream_t stream) {
  return cudaMemsetAsync(headers_, 0, sizeof(uint32_t) * 2 * num_sets_, stream);
}

cudaError_t EmbeddingCacheCuda::size(int64_t* size_host, cudaStream_t stream) {
  EL_TRY(cudaMemsetAsync(counters_ + kCall + 2, 0, sizeof(unsigned long long), stream));
  const int grid = static_cast<int>(std::min<int64_t>((num_sets_ + kBlock - 1) / kBlock, 1024));
  size_kernel<<<grid, kBlock, 0, stream>>>(headers_, num_sets_, counters_ + kCall + 2);
  EL_TRY(cudaGetLastError());
  unsigned long long v = 0;
  EL_TRY(cudaMemcpyAsync(&v, counters_ + kCall + 2, sizeof(v), cudaMemcpyDeviceToHost, stream));
  EL_TRY(cudaStreamSynchronize(stream));
  *size_host = static_cast<int64_t>(v);
  return cudaSuccess;
}

cudaError_t EmbeddingCacheCuda::stats(EmbeddingCacheStats* out, cudaStream_t stream) {
  unsigned long long v[kNumCounters];
  EL_TRY(cudaMemcpyAsync(v, counters_, sizeof(v), cudaMemcpyDeviceToHost, stream));
  EL_TRY(cudaStreamSynchronize(stream));
  out->hits = static_cast<int64_t>(v[kHits]);
  out->misses = static_cast<int64_t>(v[kMisses]);
  out->inserts = static_cast<int64_t>(v[kInserts]);
  out->evictions = static_cast<int64_t>(v[kEvictions]);
  out->updates = static_cast<int64_t>(v[kUpdates]);
  out->erases = static_cast<int64_t>(v[kErases]);
  out->rejected = static_cast<int64_t>(v[kRejected]);
  return cudaSuccess;
}

}  // namespace embedlab

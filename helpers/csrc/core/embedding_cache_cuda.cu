// CUDA embedding cache (see embedding_cache.h for the layout and the contract).
//
// Where the time goes: the hit path is a gather with a key check in front of it. A plain gather
// of the same rows reads the index and the row; the cache must also find the way and prove the
// key. To read as little as possible besides the row, each set keeps one byte per way, a tag (8
// bits of the key's hash other than those that choose the set, never 0; 0 marks a free way): 8
// bytes per set at 8 ways (4.2 MB for 4.2 M slots), loaded with an L2 evict_last policy so that
// the rows streaming through L2 leave them there. A lookup reads its set's tags and, for the
// first way whose tag matches, that way's key and row at the same time; the row is kept only if
// the key is equal (another matching way is tried otherwise, so a tag collision costs one more
// key and row read). The occupancy mask and the other ways' keys are never read by a lookup.
// Proving the key is a second random DRAM access per hit: at dims <= 16 the key is kept beside
// its row (one 80-byte record at dim 16, in two adjacent 64-byte blocks where the row alone is
// one), at larger dims in its own array (one 32-byte sector against the row's 512 bytes at dim
// 128, where a record [row | key] of 544 or 640 bytes is no faster), loaded evict_last like the
// tags, so that the part of the keys that L2 holds saves the DRAM access. That access, not the
// tags, bounds the hit path at dim 16, and padding the record to keep key and row in one
// 128-byte line does not remove it. A
// dynamic cache keeps each way's stamp in a sector the hit reads anyway (embedding_cache.h): at
// dims > 16 in the slot word it compares instead of the key, which one load brings and which
// stays in L2 (evict_last) for the stamp write, so that a dynamic hit reads no more sectors than
// a static one. From 65,536 sets on that word is 8 bytes (48 bits of the key's hash and the
// stamp; 33.5 MB at 4.2 M slots, as the keys), half a {key, stamp} word, so more of it stays in L2.
// At dims <= 16 the stamps lie beside the set's tags in one 32-byte sector per set, so that the
// hits after an insert dirty one sector per set rather than each its own record's. One "group" of G
// lanes serves one key (G = 4 at dim 16, one 16-byte piece of the row per lane; G = 16 at dim
// 128, two pieces per lane), one group per key in the grid, so all loads of a batch are in
// flight at once. Dynamic caches write the epoch (a device counter that only insert() advances)
// into a hit's stamp, in the sector already read, only when it differs; static caches write
// nothing.
//
// Writes (insert / update / erase): one group per key; lane 0 takes the set's lock (its version
// word from even to odd with atomicCAS), decides the way, publishes it to the group, the group
// copies the row, every lane fences, and lane 0 releases the lock (version + 1). The way's tag
// changes with its key and occupancy bit, under the lock. Independent thread scheduling (sm_70+)
// lets a spinning lane and the holder share a warp.
#include <cooperative_groups.h>
#include <cub/cub.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

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
// Lookups count their keys in one word (kLookups: one atomic per launch) and their misses into
// kStripes counters after the first 16 (a miss of block b adds to stripe b % kStripes: one
// address taking an atomic from every miss would serialize them in L2); hits are the difference.
// No block-wide reduction: a group whose key is done returns at once (no barrier to wait at).
constexpr int kLookups = 15;
constexpr int kStripes = 128;
constexpr int kStripeBase = 16;
constexpr int kNumCounterWords = kStripeBase + kStripes;
enum WriteMode { kInsert = 0, kUpdate = 1, kErase = 2 };


struct Cache {
  uint32_t* headers;
  int64_t* keys;
  int64_t* slot_words;  // dynamic caches with row_off == 0: per slot {a copy of its key, a word
                        // whose low 16 bits are its stamp} or, with proof_words, one word
                        // [low 48 bits of the key's hash | stamp] (embedding_cache.h); else null
  uint8_t* meta;      // [num_sets * meta_stride]: per set, one tag byte per way (0 = free), then
                      // in dynamic caches with row_off one 16-bit stamp per way at byte tag_stride
  float* values;      // [num_sets * ways * rec]: per slot, [key (16 bytes) if row_off] then the row
  int64_t num_sets;
  int64_t dim;
  int64_t rec;        // floats per slot: dim + row_off
  int64_t row_off;    // 4 (the key is kept before the row, dims <= 16) or 0 (keys only in `keys`)
  int ways;
  int tag_stride;     // tag bytes per set: ways rounded up to 8
  int meta_stride;    // bytes per set: tag_stride, or a power of two >= 32 with stamps (one
                      // 32-byte sector at 8 ways)
  bool is_static;
  bool proof_words;   // slot_words of 8 bytes: [low 48 bits of the key's hash | 16-bit stamp]
  __device__ __forceinline__ const uint8_t* tags(int64_t s) const { return meta + s * meta_stride; }
  // The stamp of slot (in set s) of a dynamic cache: in the set's sector beside its tags at
  // row_off (dims <= 16), else the low 16 bits of its proof word or of the word after its key
  // copy.
  __device__ __forceinline__ uint16_t* stamp_in_set(int64_t s, int64_t slot) const {
    return reinterpret_cast<uint16_t*>(meta + s * meta_stride + tag_stride) + (slot - s * ways);
  }
  __device__ __forceinline__ uint16_t* stamp_in_slot_word(int64_t slot) const {
    return proof_words ? reinterpret_cast<uint16_t*>(slot_words + slot)
                       : reinterpret_cast<uint16_t*>(slot_words + 2 * slot + 1);
  }
  __device__ __forceinline__ uint16_t* stamp(int64_t s, int64_t slot) const {
    return row_off ? stamp_in_set(s, slot) : stamp_in_slot_word(slot);
  }
};

// Where a dynamic lookup finds a hit's stamp (a template argument of the lookup kernel).
enum StampAt { kNoStamps = 0, kStampInSet = 1, kStampInSlotWord = 2, kStampInProofWord = 3 };

// L2 eviction priorities (sm_80+): the tags, a static hit's key (at dims > 16) and a dynamic
// hit's slot word are loaded evict_last, so that the 1 to 2 GB of rows streaming through the 50
// MB L2 per batch (loaded and stored evict-first with .cs) do not push them out: a later lookup
// of the set finds its tags and the part of the keys that L2 holds there, and a hit's stamp write
// finds its sector there (a partial write of a sector that has left L2 costs a read of it from
// DRAM).
__device__ __forceinline__ uint64_t l2_keep_policy() {
  uint64_t p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
#endif
  return p;
}
__device__ __forceinline__ uint2 load_tags8(const uint2* p, uint64_t keep) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint2 r;
  asm volatile("ld.global.nc.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;" : "=r"(r.x), "=r"(r.y) : "l"(p), "l"(keep));
  return r;
#else
  return __ldg(p);
#endif
}
// Not .nc: hits of the same launch may write the stamp word (L1 no-allocate, so a later read
// of it goes to L2, which is coherent).
__device__ __forceinline__ longlong2 load_slot_word(const int64_t* p, uint64_t keep) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  longlong2 r;
  asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v2.s64 {%0, %1}, [%2], %3;"
               : "=l"(r.x), "=l"(r.y) : "l"(p), "l"(keep));
  return r;
#else
  const volatile int64_t* v = p;
  return make_longlong2(v[0], v[1]);
#endif
}

// The same for a proof word (8 bytes).
__device__ __forceinline__ uint64_t load_proof_word(const int64_t* p, uint64_t keep) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint64_t r;
  asm volatile("ld.global.L1::no_allocate.L2::cache_hint.u64 %0, [%1], %2;" : "=l"(r) : "l"(p), "l"(keep));
  return r;
#else
  return *reinterpret_cast<const volatile uint64_t*>(p);
#endif
}
// A static cache's key: kept in L2 like the tags (nothing writes keys during a lookup).
__device__ __forceinline__ int64_t load_key_keep(const int64_t* p, uint64_t keep) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  int64_t r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.s64 %0, [%1], %2;" : "=l"(r) : "l"(p), "l"(keep));
  return r;
#else
  return __ldg(p);
#endif
}

// A key's tag: the low 8 bits of its hash (the set takes the high ones), never 0.
__device__ __forceinline__ uint32_t tag_of(uint64_t h) {
  const uint32_t t = static_cast<uint32_t>(h & 0xffu);
  return t ? t : 1u;
}

// Bit w set where byte w of the set's tags equals `tag` (tags of free ways are 0: no match).
__device__ __forceinline__ uint32_t tag_match(const Cache& c, int64_t s, uint32_t tag, uint64_t keep) {
  const uint32_t tag4 = tag * 0x01010101u;
  const uint2* t = reinterpret_cast<const uint2*>(c.tags(s));
  uint32_t m = 0;
  for (int w8 = 0; w8 < c.tag_stride / 8; ++w8) {
    const uint2 v = load_tags8(t + w8, keep);
    const uint32_t lo = (((__vcmpeq4(v.x, tag4) & 0x01010101u) * 0x01020408u) >> 24) & 0xfu;
    const uint32_t hi = (((__vcmpeq4(v.y, tag4) & 0x01010101u) * 0x01020408u) >> 24) & 0xfu;
    m |= (lo | (hi << 4)) << (8 * w8);
  }
  return m;
}

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

// The epoch (embedding_cache.h): lookups and update() stamp with the counter's value C, insert()
// with C + 1, and a one-thread kernel after each insert() advances the counter by 2. No kernel
// that reads the counter runs while it changes, so every block of a call sees the same value.
__global__ void advance_epoch_kernel(uint32_t* counter) { *counter += 2u; }

// Ages modulo 2^16 (the unsigned 16-bit distance from the current epoch), as on the CPU.
__device__ __forceinline__ uint32_t age(uint32_t epoch, uint16_t stamp) {
  return static_cast<uint16_t>(static_cast<uint16_t>(epoch) - stamp);
}

// One group of G lanes per key. T is float4 (dim % 4 == 0, 16-byte aligned out) or float; each
// lane holds up to SPEC of its row's elements in registers, loaded together with the key of the
// candidate way (the rest, for dims past G * SPEC elements, is copied once the key is proven).
// Rows of at most G elements take SPEC = 1: fewer registers, more keys in flight per SM. Longer
// rows take SPEC = 2 with a register cap (EMBEDLAB_CACHE_LOOKUP_MIN_BLOCKS blocks of 256 threads
// per SM), the fastest of the (G, SPEC) pairs at dim 128, because without the cap the kernel's
// registers leave too few keys in flight (docs/benchmarks/index.md, HPS embedding cache).
constexpr int kSpec = 2;
#ifndef EMBEDLAB_CACHE_LOOKUP_MIN_BLOCKS
#define EMBEDLAB_CACHE_LOOKUP_MIN_BLOCKS 8
#endif

// lookup_key is the work of one group for key i of one cache, shared by the kernel of one cache
// (lookup_kernel) and the kernel of several (lookup_many_kernel), so that both find, prove, copy,
// stamp and count alike. flags[i] (may be null) = hit_flag for a hit, 1 - hit_flag for a miss; a
// miss adds 1 to the cache's miss stripe `stripe` (counters may be null: no counts).
template <int G, int SPEC, typename T, int STAMPS>
__device__ __forceinline__ void lookup_key(const Cache& c, const int64_t* __restrict__ keys, int64_t i,
                                           float* __restrict__ out, uint8_t* __restrict__ flags, uint8_t hit_flag,
                                           const uint32_t* __restrict__ epoch_counter, unsigned long long* counters,
                                           unsigned stripe) {
  // The epoch does not change during a lookup: read it up front, beside the key.
  const uint16_t epoch = STAMPS ? static_cast<uint16_t>(__ldg(epoch_counter)) : 0;
  const uint64_t keep = l2_keep_policy();
  const int lane = G == 1 ? 0 : static_cast<int>(threadIdx.x % G);
  // 32-bit column arithmetic (the constructor refuses dims of 2^31 and more): fewer registers
  // under the cap of 32 that SPEC = 2 kernels run with
  const int cols = static_cast<int>(sizeof(T) == 16 ? c.dim / 4 : c.dim);  // elements of T per row
  const int64_t rec = sizeof(T) == 16 ? c.rec / 4 : c.rec;                 // ... per slot
  const int off = static_cast<int>(sizeof(T) == 16 ? c.row_off / 4 : c.row_off);
  const int64_t key = __ldg(keys + i);
  const uint64_t h = cache_mix64(static_cast<uint64_t>(key));
  const uint64_t proof = h << 16;  // what a proof word holds above its stamp
  const int64_t s = static_cast<int64_t>(__umul64hi(h, static_cast<uint64_t>(c.num_sets)));
  uint32_t cand = tag_match(c, s, tag_of(h), keep);
  int64_t slot = -1;
  T x[SPEC];
  while (cand) {
    const int64_t sl = s * c.ways + (__ffs(cand) - 1);
    cand &= cand - 1;
    const T* base = reinterpret_cast<const T*>(c.values) + sl * rec;
    bool match;
    uint16_t stamp = 0;
    if (STAMPS == kStampInSlotWord) {  // the key copy and its stamp, one 16-byte load, kept in L2
      const longlong2 w = load_slot_word(c.slot_words + 2 * sl, keep);
      match = w.x == key;
      stamp = static_cast<uint16_t>(w.y);
    } else if (STAMPS == kStampInProofWord) {  // 48 bits of the hash and the stamp, kept in L2
      const uint64_t w = load_proof_word(c.slot_words + sl, keep);
      match = (w & ~uint64_t{0xffff}) == proof;
      stamp = static_cast<uint16_t>(w);
    } else {
      match = (off ? __ldcs(reinterpret_cast<const long long*>(base)) : load_key_keep(c.keys + sl, keep)) == key;
    }
    const T* src = base + off;
#pragma unroll
    for (int v = 0; v < SPEC; ++v) {
      const int j = lane + v * G;
      if (j < cols) x[v] = __ldcs(src + j);
    }
    if (match) {
      slot = sl;
      // Stamped here, not after the row is stored: the stamp's register is then free before
      // the stores (dim 128 under the 32-register cap: no spill, where stamping last spilled 4
      // bytes per thread). Written only when it differs, like the stamp in the set below.
      if ((STAMPS == kStampInSlotWord || STAMPS == kStampInProofWord) && lane == 0 && stamp != epoch)
        *c.stamp_in_slot_word(sl) = epoch;
      break;
    }
  }
  if (lane == 0 && flags) flags[i] = slot >= 0 ? hit_flag : static_cast<uint8_t>(1 - hit_flag);
  if (slot < 0) {
    if (lane == 0 && counters) atomicAdd(counters + kStripeBase + stripe, 1ull);
    return;
  }
  T* dst = reinterpret_cast<T*>(out) + i * cols;
#pragma unroll
  for (int v = 0; v < SPEC; ++v) {
    const int j = lane + v * G;
    if (j < cols) __stcs(dst + j, x[v]);
  }
  const T* src = reinterpret_cast<const T*>(c.values) + slot * rec + off;
  for (int j = lane + SPEC * G; j < cols; j += G) __stcs(dst + j, __ldcs(src + j));
  // The stamp shares the sector of the tags just read (a slot word's stamp was written above).
  // Written only when it differs: between two insert() calls a row is stamped once, however
  // often it is hit.
  if (STAMPS == kStampInSet && lane == 0) {  // in the sector of the tags just read
    uint16_t* st = c.stamp_in_set(s, slot);
    if (*st != epoch) *st = epoch;
  }
}

template <int G, int SPEC, typename T, int STAMPS>
__global__ void __launch_bounds__(kBlock, SPEC > 1 ? EMBEDLAB_CACHE_LOOKUP_MIN_BLOCKS : 1)
    lookup_kernel(Cache c, const int64_t* __restrict__ keys, int64_t n, float* __restrict__ out,
                  uint8_t* __restrict__ flags, uint8_t hit_flag, const uint32_t* __restrict__ epoch_counter,
                  unsigned long long* counters) {
  if (counters && blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(counters + kLookups, static_cast<unsigned long long>(n));
  const int64_t i = static_cast<int64_t>(blockIdx.x) * (kBlock / G) + threadIdx.x / G;
  if (i >= n) return;
  lookup_key<G, SPEC, T, STAMPS>(c, keys, i, out, flags, hit_flag, epoch_counter, counters, blockIdx.x % kStripes);
}

// One cache's part of a multi-cache lookup (EmbeddingCacheCudaMultiLookup), as the kernels read
// it from device memory.
struct ManyTable {
  Cache c;
  const uint32_t* epoch;
  unsigned long long* counters;
  int64_t key_begin;  // its keys are keys[key_begin .. key_begin + n), its flags flags[key_begin ..]
  int64_t n;          // >= 1 (empty tables get no descriptor)
  int64_t out_off;    // its rows go to out + out_off
};
static_assert(sizeof(ManyTable) % 8 == 0 && alignof(ManyTable) == 8, "ManyTable is copied in 8-byte words");

// The lookups of the caches of one kernel variant in one launch: table j of the group owns
// blocks [block_begin[j], block_begin[j + 1]) (block_begin[num_tables] = gridDim.x), one group of
// G lanes per key as in lookup_kernel. A block finds its table with one parallel comparison of
// the block ranges (one memory round trip, whatever the number of tables), and copies its
// descriptor into shared memory, from where the per-key work reads it as lookup_kernel reads its
// parameters. Flags: 1 for a miss, 0 for a hit (what the compaction selects).
// SPEC = 1 takes the register cap of lookup_kernel's SPEC = 1 variants' use (6 blocks of 256
// threads per SM): uncapped, the descriptor's fields held in registers would cost a block per SM.
template <int G, int SPEC, typename T, int STAMPS>
__global__ void __launch_bounds__(kBlock, SPEC > 1 ? EMBEDLAB_CACHE_LOOKUP_MIN_BLOCKS : 6)
    lookup_many_kernel(const ManyTable* __restrict__ tables, const int64_t* __restrict__ block_begin, int num_tables,
                       const int64_t* __restrict__ keys, float* __restrict__ out, uint8_t* __restrict__ flags) {
  constexpr int kWords = static_cast<int>(sizeof(ManyTable) / 8);
  static_assert(kWords <= kBlock, "one thread per word of the descriptor");
  __shared__ union {
    ManyTable t;
    int64_t w[kWords];
  } d;
  __shared__ int which;
  __shared__ int64_t first_block;
  const int64_t b = blockIdx.x;
  for (int j = threadIdx.x; j < num_tables; j += kBlock) {
    const int64_t lo = block_begin[j];
    const int64_t hi = j + 1 < num_tables ? block_begin[j + 1] : static_cast<int64_t>(gridDim.x);
    if (lo <= b && b < hi) {  // exactly one table owns the block (every range is non-empty)
      which = j;
      first_block = lo;
    }
  }
  __syncthreads();
  if (threadIdx.x < kWords) d.w[threadIdx.x] = reinterpret_cast<const int64_t*>(tables + which)[threadIdx.x];
  __syncthreads();
  const ManyTable& t = d.t;
  const int64_t local = b - first_block;  // the block's index within its table
  if (local == 0 && threadIdx.x == 0) atomicAdd(t.counters + kLookups, static_cast<unsigned long long>(t.n));
  const int64_t i = local * (kBlock / G) + threadIdx.x / G;
  if (i >= t.n) return;
  lookup_key<G, SPEC, T, STAMPS>(t.c, keys + t.key_begin, i, out + t.out_off, flags + t.key_begin, uint8_t{0},
                                 t.epoch, t.counters, static_cast<unsigned>(local % kStripes));
}

// After the compaction of the misses of every table (global positions, ascending, compacted[0 ..
// *m)): table i's keys are [key_begin[i], key_begin[i + 1]) (t + 1 entries, empty tables
// included), so its misses are the run of compacted between the lower bounds of key_begin[i] and
// key_begin[i + 1]. Writes counts[i] (i < t) and, for each miss p of table i, its local position
// to missing[key_begin[i] + (p - the run's start)]: the layout of one lookup per table.
__device__ __forceinline__ int64_t lower_bound_i64(const int64_t* a, int64_t n, int64_t v) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (a[mid] < v) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

__global__ void split_misses_kernel(const int64_t* __restrict__ compacted, const int64_t* __restrict__ m_dev,
                                    const int64_t* __restrict__ key_begin, int t, int64_t* __restrict__ missing,
                                    int64_t* __restrict__ counts) {
  const int64_t m = *m_dev;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < m || p < t; p += step) {
    if (p < t)
      counts[p] = lower_bound_i64(compacted, m, key_begin[p + 1]) - lower_bound_i64(compacted, m, key_begin[p]);
    if (p < m) {
      const int64_t g = compacted[p];
      // the table: the last i with key_begin[i] <= g (empty tables before it share its begin)
      const int64_t i = lower_bound_i64(key_begin, int64_t{t} + 1, g + 1) - 1;
      const int64_t k = key_begin[i];
      missing[k + (p - lower_bound_i64(compacted, m, k))] = g - k;
    }
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
                                                        const uint32_t* epoch_counter, unsigned long long* counters) {
  // insert() stamps with C + 1 (the counter then advances by 2), update() with C, like a lookup.
  const uint32_t epoch = mode == kErase ? 0 : *epoch_counter + (mode == kInsert ? 1u : 0u);
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
    auto stamp = [&](int w) { return reinterpret_cast<volatile uint16_t*>(c.stamp(s, s * c.ways + w)); };
    volatile uint8_t* tags = reinterpret_cast<volatile uint8_t*>(c.meta + s * c.meta_stride);
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
          tags[way] = 0;
          *occupied = occ & ~(1u << way);
          atomicAdd(counters + kErases, 1ull);
          atomicAdd(counters + kCall, 1ull);
        }
        way = -1;
      } else if (way >= 0) {
        if (!c.is_static) {  // overwrite (insert) or update
          *stamp(way) = static_cast<uint16_t>(epoch);
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
          uint32_t oldest = age(epoch, *stamp(0));
          for (int w = 1; w < c.ways; ++w) {
            const uint32_t a = age(epoch, *stamp(w));
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
          // the copy the lookups compare: beside the row (dims <= 16), else in slot_words
          // (dynamic caches; static ones compare keys[])
          if (c.row_off)
            *reinterpret_cast<volatile int64_t*>(c.values + (s * c.ways + way) * c.rec) = key;
          else if (c.proof_words)
            *reinterpret_cast<volatile uint64_t*>(c.slot_words + s * c.ways + way) =
                cache_mix64(static_cast<uint64_t>(key)) << 16;
          else if (!c.is_static)
            *reinterpret_cast<volatile int64_t*>(c.slot_words + 2 * (s * c.ways + way)) = key;
          if (!c.is_static) *stamp(way) = static_cast<uint16_t>(epoch);  // static: no stamps kept
          tags[way] = static_cast<uint8_t>(tag_of(cache_mix64(static_cast<uint64_t>(key))));
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
        float4* dst = reinterpret_cast<float4*>(c.values + slot * c.rec + c.row_off);
        const float4* src = reinterpret_cast<const float4*>(values) + i * d4;
        for (int64_t j = lane; j < d4; j += G) dst[j] = src[j];
      } else {
        float* dst = c.values + slot * c.rec + c.row_off;
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

// Write kernels: lanes per key for a row of `vecs` elements (4..32).
int lanes_for(int64_t vecs) {
  int g = 4;
  while (g < 32 && g < vecs) g *= 2;
  return g;
}

// Lookup: lanes per key so that each lane holds up to kSpec elements of the row, and at least
// 64 contiguous bytes per load instruction of a group (4 lanes of float4, 16 of float): a row
// read in 16-byte pieces by separate instructions reaches DRAM as separate 32-byte requests,
// which is slower.
int lookup_lanes_for(int64_t vecs, bool vec4) {
  int g = vec4 ? 4 : 16;
  while (g < 32 && g * kSpec < vecs) g *= 2;
  return g;
}

// Write kernels: enough blocks for every resident slot (6 blocks per SM), capped by n.
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

// The lookup kernel variant of a cache and output: lanes per key G, SPEC elements held per lane,
// 16-byte copies (vec4: dim % 4 == 0 and a 16-byte-aligned output), where the stamps are. Each
// variant is one instantiation of lookup_kernel and of lookup_many_kernel.
struct LookupVariant {
  int g;
  int spec;
  bool vec4;
  int stamps;
  int id() const { return ((g * 4 + spec) * 2 + (vec4 ? 1 : 0)) * 4 + stamps; }
};

LookupVariant lookup_variant(const Cache& c, bool vec4) {
  const int stamps = c.is_static ? kNoStamps : c.row_off ? kStampInSet : c.proof_words ? kStampInProofWord : kStampInSlotWord;
  const int64_t vecs = vec4 ? c.dim / 4 : c.dim;
  if (vec4 && vecs <= 4) return {4, 1, vec4, stamps};
  if (!vec4 && vecs <= 16) return {16, 1, vec4, stamps};
  return {lookup_lanes_for(vecs, vec4), kSpec, vec4, stamps};
}

// Calls f.template run<G, SPEC, T, STAMPS>() for variant v (only the variants lookup_variant
// gives are instantiated).
template <int G, int SPEC, typename T, typename F>
cudaError_t visit_stamps(int stamps, F& f) {
  switch (stamps) {
    case kNoStamps: return f.template run<G, SPEC, T, kNoStamps>();
    case kStampInSet: return f.template run<G, SPEC, T, kStampInSet>();
    case kStampInProofWord: return f.template run<G, SPEC, T, kStampInProofWord>();
    default: return f.template run<G, SPEC, T, kStampInSlotWord>();
  }
}

template <typename F>
cudaError_t visit_variant(const LookupVariant& v, F& f) {
  if (v.vec4) {
    if (v.spec == 1) return visit_stamps<4, 1, float4>(v.stamps, f);
    switch (v.g) {
      case 4: return visit_stamps<4, kSpec, float4>(v.stamps, f);
      case 8: return visit_stamps<8, kSpec, float4>(v.stamps, f);
      case 16: return visit_stamps<16, kSpec, float4>(v.stamps, f);
      default: return visit_stamps<32, kSpec, float4>(v.stamps, f);
    }
  }
  if (v.spec == 1) return visit_stamps<16, 1, float>(v.stamps, f);
  if (v.g == 16) return visit_stamps<16, kSpec, float>(v.stamps, f);
  return visit_stamps<32, kSpec, float>(v.stamps, f);
}

// One cache's lookup: one group of G lanes per key.
struct LaunchLookup {
  const Cache& c;
  const int64_t* keys;
  int64_t n;
  float* out;
  uint8_t* flags;
  uint8_t hit_flag;
  const uint32_t* epoch;
  unsigned long long* counters;
  cudaStream_t stream;
  template <int G, int SPEC, typename T, int S>
  cudaError_t run() {
    const int64_t blocks = (n + kBlock / G - 1) / (kBlock / G);
    if (blocks >= (int64_t{1} << 31)) return cudaErrorInvalidConfiguration;
    lookup_kernel<G, SPEC, T, S><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(c, keys, n, out, flags, hit_flag,
                                                                                      epoch, counters);
    return cudaGetLastError();
  }
};

cudaError_t dispatch_lookup(const Cache& c, bool vec4, const int64_t* keys, int64_t n, float* out, uint8_t* flags,
                            uint8_t hit_flag, const uint32_t* epoch, unsigned long long* counters, cudaStream_t stream) {
  LaunchLookup f{c, keys, n, out, flags, hit_flag, epoch, counters, stream};
  return visit_variant(lookup_variant(c, vec4), f);
}

// The caches of one variant of a multi-cache lookup: `blocks` blocks over `num_tables`
// descriptors.
struct LaunchLookupMany {
  const ManyTable* tables;
  const int64_t* block_begin;
  int num_tables;
  int64_t blocks;
  const int64_t* keys;
  float* out;
  uint8_t* flags;
  cudaStream_t stream;
  template <int G, int SPEC, typename T, int S>
  cudaError_t run() {
    if (blocks >= (int64_t{1} << 31)) return cudaErrorInvalidConfiguration;
    lookup_many_kernel<G, SPEC, T, S><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(tables, block_begin,
                                                                                          num_tables, keys, out, flags);
    return cudaGetLastError();
  }
};

template <int G>
cudaError_t launch_write(const Cache& c, bool vec4, const int64_t* keys, const float* values, int64_t n, int mode,
                         const uint32_t* epoch, unsigned long long* counters, cudaStream_t stream) {
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
    if (dim >= (int64_t{1} << 31)) return cudaErrorInvalidValue;  // lookups index a row with 32 bits
    EL_TRY(cudaGetDevice(&device_));
    EL_TRY(cudaMalloc(&headers_, sizeof(uint32_t) * 2 * num_sets_));
    EL_TRY(cudaMalloc(&keys_, sizeof(int64_t) * slots));
    EL_TRY(cudaMalloc(&meta_, static_cast<size_t>(num_sets_) * meta_stride()));
    if (!static_ && !row_off())
      EL_TRY(cudaMalloc(&slot_words_, (proof_words() ? 1 : 2) * sizeof(int64_t) * slots));
    EL_TRY(cudaMalloc(&values_, sizeof(float) * slots * static_cast<size_t>(rec())));
    EL_TRY(cudaMalloc(&counters_, sizeof(unsigned long long) * kNumCounterWords));
    EL_TRY(cudaMallocHost(&counters_host_, sizeof(unsigned long long) * kNumCounterWords));
    EL_TRY(cudaMalloc(&epoch_, sizeof(uint32_t)));
    const uint32_t first_epoch = 1;
    EL_TRY(cudaMemcpy(epoch_, &first_epoch, sizeof(uint32_t), cudaMemcpyHostToDevice));
    EL_TRY(cudaMemset(headers_, 0, sizeof(uint32_t) * 2 * num_sets_));
    EL_TRY(cudaMemset(meta_, 0, static_cast<size_t>(num_sets_) * meta_stride()));
    EL_TRY(cudaMemset(counters_, 0, sizeof(unsigned long long) * kNumCounterWords));
    return cudaDeviceSynchronize();
  };
  *err = run();
}

EmbeddingCacheCuda::~EmbeddingCacheCuda() {
  cudaFree(headers_);
  cudaFree(keys_);
  cudaFree(slot_words_);
  cudaFree(meta_);
  cudaFree(values_);
  cudaFree(counters_);
  cudaFreeHost(counters_host_);
  cudaFree(epoch_);
}


cudaError_t EmbeddingCacheCuda::lookup_mask(const int64_t* keys, int64_t n, float* out, uint8_t* hit_mask,
                                            cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const Cache c{headers_, keys_, slot_words_, meta_, values_, num_sets_, dim_, rec(), row_off(), ways_, tag_stride(), meta_stride(), static_, proof_words()};
  const bool vec4 = dim_ % 4 == 0 && aligned16(out);
  return dispatch_lookup(c, vec4, keys, n, out, hit_mask, uint8_t{1}, epoch_, counters_, stream);
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
  int64_t* count = reinterpret_cast<int64_t*>(counters_host_);
  EL_TRY(lookup_enqueue(keys, n, out, missing, count, workspace, workspace_bytes, stream));
  EL_TRY(cudaStreamSynchronize(stream));
  *m_host = *count;
  return cudaSuccess;
}

cudaError_t EmbeddingCacheCuda::lookup_enqueue(const int64_t* keys, int64_t n, float* out, int64_t* missing,
                                               int64_t* m_pinned, void* workspace, size_t workspace_bytes,
                                               cudaStream_t stream) {
  if (n <= 0) {
    *m_pinned = 0;
    return cudaSuccess;
  }
  if (workspace_bytes < lookup_workspace_bytes(n)) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  uint8_t* flags = reinterpret_cast<uint8_t*>(ws);
  const size_t flag_bytes = (static_cast<size_t>(n) + 255) / 256 * 256;
  int64_t* d_count = reinterpret_cast<int64_t*>(ws + flag_bytes);
  void* tmp = ws + flag_bytes + 256;
  size_t tmp_bytes = workspace_bytes - flag_bytes - 256;
  const Cache c{headers_, keys_, slot_words_, meta_, values_, num_sets_, dim_, rec(), row_off(), ways_, tag_stride(), meta_stride(), static_, proof_words()};
  const bool vec4 = dim_ % 4 == 0 && aligned16(out);
  EL_TRY(dispatch_lookup(c, vec4, keys, n, out, flags, 0, epoch_, counters_, stream));
  EL_TRY(cub::DeviceSelect::Flagged(tmp, tmp_bytes, thrust::counting_iterator<int64_t>(0), flags, missing, d_count,
                                    n, stream));
  // The workspace's count is read before a later call on this stream writes it (stream order),
  // so one workspace serves any number of lookups enqueued on one stream.
  return cudaMemcpyAsync(m_pinned, d_count, sizeof(int64_t), cudaMemcpyDeviceToHost, stream);
}

cudaError_t EmbeddingCacheCuda::write(int mode, const int64_t* keys, const float* values, int64_t n,
                                      int64_t* count_host, cudaStream_t stream) {
  if (count_host) *count_host = 0;
  if (n <= 0) return cudaSuccess;
  EL_TRY(cudaMemsetAsync(counters_ + kCall, 0, 2 * sizeof(unsigned long long), stream));
  const Cache c{headers_, keys_, slot_words_, meta_, values_, num_sets_, dim_, rec(), row_off(), ways_, tag_stride(), meta_stride(), static_, proof_words()};
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
  if (mode == kInsert && !static_) EL_TRY(advance_epoch(stream));
  if (!count_host) return cudaSuccess;
  EL_TRY(cudaMemcpyAsync(counters_host_, counters_ + kCall, sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                         stream));
  EL_TRY(cudaStreamSynchronize(stream));
  *count_host = static_cast<int64_t>(counters_host_[0]);
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

cudaError_t EmbeddingCacheCuda::advance_epoch(cudaStream_t stream) {
  advance_epoch_kernel<<<1, 1, 0, stream>>>(epoch_);
  return cudaGetLastError();
}

cudaError_t EmbeddingCacheCuda::clear(cudaStream_t stream) {
  EL_TRY(cudaMemsetAsync(meta_, 0, static_cast<size_t>(num_sets_) * meta_stride(), stream));
  return cudaMemsetAsync(headers_, 0, sizeof(uint32_t) * 2 * num_sets_, stream);
}

cudaError_t EmbeddingCacheCuda::size(int64_t* size_host, cudaStream_t stream) {
  EL_TRY(cudaMemsetAsync(counters_ + kCall + 2, 0, sizeof(unsigned long long), stream));
  const int grid = static_cast<int>(std::min<int64_t>((num_sets_ + kBlock - 1) / kBlock, 1024));
  size_kernel<<<grid, kBlock, 0, stream>>>(headers_, num_sets_, counters_ + kCall + 2);
  EL_TRY(cudaGetLastError());
  EL_TRY(cudaMemcpyAsync(counters_host_, counters_ + kCall + 2, sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                         stream));
  EL_TRY(cudaStreamSynchronize(stream));
  *size_host = static_cast<int64_t>(counters_host_[0]);
  return cudaSuccess;
}

cudaError_t EmbeddingCacheCuda::stats(EmbeddingCacheStats* out, cudaStream_t stream) {
  unsigned long long* v = counters_host_;
  EL_TRY(cudaMemcpyAsync(v, counters_, sizeof(unsigned long long) * kNumCounterWords, cudaMemcpyDeviceToHost, stream));
  EL_TRY(cudaStreamSynchronize(stream));
  unsigned long long misses = v[kMisses];
  for (int i = 0; i < kStripes; ++i) misses += v[kStripeBase + i];
  const unsigned long long hits = v[kHits] + v[kLookups] - (misses - v[kMisses]);
  out->hits = static_cast<int64_t>(hits);
  out->misses = static_cast<int64_t>(misses);
  out->inserts = static_cast<int64_t>(v[kInserts]);
  out->evictions = static_cast<int64_t>(v[kEvictions]);
  out->updates = static_cast<int64_t>(v[kUpdates]);
  out->erases = static_cast<int64_t>(v[kErases]);
  out->rejected = static_cast<int64_t>(v[kRejected]);
  return cudaSuccess;
}

// ---- EmbeddingCacheCudaMultiLookup ---------------------------------------------------------
//
// The descriptors (one upload): [ManyTable x e, grouped by variant][block_begin: int64 x e, each
// group's from 0][key_begin: int64 x (t + 1)], e = the non-empty tables. The workspace: [flags:
// uint8 x total][compacted: int64 x total][m: int64][counts: int64 x t][cub's temporary storage],
// each part 256-byte aligned.

namespace {
size_t round256(size_t b) { return (b + 255) / 256 * 256; }
}  // namespace

EmbeddingCacheCudaMultiLookup::~EmbeddingCacheCudaMultiLookup() {
  cudaFree(desc_dev_);
  cudaFreeHost(desc_host_);
  cudaFree(ws_);
  cudaFreeHost(counts_);
}

cudaError_t EmbeddingCacheCudaMultiLookup::enqueue(EmbeddingCacheCuda* const* caches, const int64_t* sizes,
                                                   const int64_t* out_offsets, int64_t t, const int64_t* keys,
                                                   float* out, int64_t* missing, cudaStream_t stream) {
  if (t < 0 || t >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  int dev = 0;
  EL_TRY(cudaGetDevice(&dev));
  if (device_ >= 0 && dev != device_) return cudaErrorInvalidDevice;  // its buffers live on device_
  int64_t total = 0;
  for (int64_t i = 0; i < t; ++i) {
    if (sizes[i] < 0) return cudaErrorInvalidValue;
    if (caches[i]->device() != dev) return cudaErrorInvalidDevice;
    total += sizes[i];
  }
  if (static_cast<size_t>(t) > counts_cap_) {
    if (counts_) cudaFreeHost(counts_);
    counts_ = nullptr;
    counts_cap_ = 0;
    EL_TRY(cudaMallocHost(reinterpret_cast<void**>(&counts_), sizeof(int64_t) * static_cast<size_t>(std::max<int64_t>(t, 1))));
    counts_cap_ = static_cast<size_t>(std::max<int64_t>(t, 1));
  }
  device_ = dev;
  if (total == 0) {
    std::fill(counts_, counts_ + t, int64_t{0});
    return cudaSuccess;
  }

  // A cache's descriptor, member by member (the padding bytes of `c` are left as they are, zero
  // in the staging buffer, so that equal descriptors compare equal byte for byte).
  auto fill = [](Cache& c, const EmbeddingCacheCuda& e) {
    c.headers = e.headers_;
    c.keys = e.keys_;
    c.slot_words = e.slot_words_;
    c.meta = e.meta_;
    c.values = e.values_;
    c.num_sets = e.num_sets_;
    c.dim = e.dim_;
    c.rec = e.rec();
    c.row_off = e.row_off();
    c.ways = e.ways_;
    c.tag_stride = e.tag_stride();
    c.meta_stride = e.meta_stride();
    c.is_static = e.static_;
    c.proof_words = e.proof_words();
  };
  auto variant_of = [&](int64_t i) {
    Cache c;
    fill(c, *caches[i]);
    return lookup_variant(c, c.dim % 4 == 0 && aligned16(out + out_offsets[i]));
  };

  // The non-empty tables, grouped by kernel variant (stable: in input order within a group).
  variant_.resize(static_cast<size_t>(t));
  order_.clear();
  for (int64_t i = 0; i < t; ++i) {
    if (!sizes[i]) continue;
    variant_[i] = variant_of(i).id();
    order_.push_back(i);
  }
  std::stable_sort(order_.begin(), order_.end(), [&](int64_t a, int64_t b) { return variant_[a] < variant_[b]; });
  const size_t e_count = order_.size();
  const size_t desc_size = sizeof(ManyTable) * e_count + sizeof(int64_t) * (e_count + static_cast<size_t>(t) + 1);
  staging_.assign(desc_size, 0);  // zeroed: the padding inside ManyTable compares equal too
  ManyTable* tab = reinterpret_cast<ManyTable*>(staging_.data());
  int64_t* blk = reinterpret_cast<int64_t*>(staging_.data() + sizeof(ManyTable) * e_count);
  int64_t* kbeg = blk + e_count;
  kbeg[0] = 0;
  for (int64_t i = 0; i < t; ++i) kbeg[i + 1] = kbeg[i] + sizes[i];
  // per group: [first descriptor, end), its variant and its blocks
  struct Group {
    size_t begin, end;
    LookupVariant v;
    int64_t blocks;
  };
  std::vector<Group> groups;
  for (size_t j = 0; j < e_count; ++j) {
    const int64_t i = order_[j];
    const EmbeddingCacheCuda& e = *caches[i];
    ManyTable& d = tab[j];
    fill(d.c, e);
    d.epoch = e.epoch_;
    d.counters = e.counters_;
    d.key_begin = kbeg[i];
    d.n = sizes[i];
    d.out_off = out_offsets[i];
    const LookupVariant v = variant_of(i);
    if (groups.empty() || groups.back().v.id() != v.id()) groups.push_back({j, j, v, 0});
    Group& g = groups.back();
    blk[j] = g.blocks;
    g.blocks += (sizes[i] + kBlock / v.g - 1) / (kBlock / v.g);
    g.end = j + 1;
  }
  // The descriptors: uploaded only when they differ from the last upload (the previous call has
  // completed, so desc_host_ and desc_dev_ hold those bytes).
  if (desc_size > desc_cap_) {
    cudaFree(desc_dev_);
    cudaFreeHost(desc_host_);
    desc_dev_ = desc_host_ = nullptr;
    desc_cap_ = desc_bytes_ = 0;
    const size_t cap = std::max(desc_size, static_cast<size_t>(4096));
    EL_TRY(cudaMalloc(&desc_dev_, cap));
    EL_TRY(cudaMallocHost(&desc_host_, cap));
    desc_cap_ = cap;
  }
  if (desc_bytes_ != desc_size || std::memcmp(desc_host_, staging_.data(), desc_size) != 0) {
    desc_bytes_ = 0;  // invalid until the copy is enqueued
    std::memcpy(desc_host_, staging_.data(), desc_size);
    EL_TRY(cudaMemcpyAsync(desc_dev_, desc_host_, desc_size, cudaMemcpyHostToDevice, stream));
    desc_bytes_ = desc_size;
  }

  // The workspace.
  size_t cub_bytes = 0;
  EL_TRY(cub::DeviceSelect::Flagged(nullptr, cub_bytes, thrust::counting_iterator<int64_t>(0),
                                    static_cast<const uint8_t*>(nullptr), static_cast<int64_t*>(nullptr),
                                    static_cast<int64_t*>(nullptr), total));
  const size_t flags_off = 0;
  const size_t compacted_off = flags_off + round256(static_cast<size_t>(total));
  const size_t m_off = compacted_off + round256(sizeof(int64_t) * static_cast<size_t>(total));
  const size_t counts_off = m_off + 256;
  const size_t cub_off = counts_off + round256(sizeof(int64_t) * static_cast<size_t>(t));
  const size_t ws_need = cub_off + round256(cub_bytes);
  if (ws_need > ws_bytes_) {
    cudaFree(ws_);
    ws_ = nullptr;
    ws_bytes_ = 0;
    EL_TRY(cudaMalloc(&ws_, ws_need));
    ws_bytes_ = ws_need;
  }
  char* ws = static_cast<char*>(ws_);
  uint8_t* flags = reinterpret_cast<uint8_t*>(ws + flags_off);
  int64_t* compacted = reinterpret_cast<int64_t*>(ws + compacted_off);
  int64_t* m_dev = reinterpret_cast<int64_t*>(ws + m_off);
  int64_t* counts_dev = reinterpret_cast<int64_t*>(ws + counts_off);

  // One lookup launch per group, one compaction, one split, one copy of the counts.
  const ManyTable* tab_dev = reinterpret_cast<const ManyTable*>(desc_dev_);
  const int64_t* blk_dev = reinterpret_cast<const int64_t*>(desc_dev_ + sizeof(ManyTable) * e_count);
  const int64_t* kbeg_dev = blk_dev + e_count;
  for (const Group& g : groups) {
    LaunchLookupMany f{tab_dev + g.begin, blk_dev + g.begin, static_cast<int>(g.end - g.begin), g.blocks, keys, out,
                       flags, stream};
    EL_TRY(visit_variant(g.v, f));
  }
  EL_TRY(cub::DeviceSelect::Flagged(ws + cub_off, cub_bytes, thrust::counting_iterator<int64_t>(0), flags, compacted,
                                    m_dev, total, stream));
  const int64_t work = std::max<int64_t>(total, t);
  split_misses_kernel<<<grid_for(work, 1), kBlock, 0, stream>>>(compacted, m_dev, kbeg_dev, static_cast<int>(t),
                                                                 missing, counts_dev);
  EL_TRY(cudaGetLastError());
  return cudaMemcpyAsync(counts_, counts_dev, sizeof(int64_t) * static_cast<size_t>(t), cudaMemcpyDeviceToHost,
                         stream);
}

}  // namespace embedlab

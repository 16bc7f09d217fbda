// The HPS embedding cache: a set-associative int64 key -> float32[dim] row cache (CPU and CUDA).
//
// Layout (both implementations)
//   * num_sets = ceil(capacity / ways) sets of `ways` slots (ways in [1, 32]); capacity() is
//     num_sets * ways (>= the capacity asked for).
//   * A key lives only in set set_of(key) = (fmix64(key) * num_sets) >> 64, in any of its ways.
//   * Per set: one 32-bit version word (a seqlock, see below) and a 32-bit occupancy mask;
//     per slot: the key, an access stamp, and the row, stored contiguously
//     (values[slot * dim .. slot * dim + dim)), slot = set * ways + way; the GPU, at dims <= 16
//     that are multiples of 4, also keeps a copy of the key in 16 bytes before each row (one
//     record of dim + 4 floats per slot), which its lookups compare. The CPU keeps a set's
//     version, mask and 16-bit stamps together in one small header (one cache line to read and,
//     on a hit, to stamp); the GPU keeps per set one tag byte per way (8 bits of the key's hash
//     other than the set's, never 0; 0 = free way; 8 bytes per set at 8 ways), which its lookups
//     read instead of the occupancy mask and the keys (the key of a way whose tag matches is then
//     compared, so a lookup stays exact). A dynamic GPU cache keeps each way's 16-bit stamp where
//     a hit has just read: at dims <= 16 that are multiples of 4, beside the set's tags (tags and
//     stamps in one 32-byte sector per set at 8 ways); at other dims in a slot word per slot,
//     which the lookups read in one load and compare (static caches compare the keys
//     themselves): 16 bytes, {a copy of the key, a word whose low 16 bits are the stamp}, in
//     caches of fewer than 65,536 sets; from 65,536 sets on 8 bytes, the low 48 bits of the key's
//     hash above the 16-bit stamp, which prove the key there (see slot_words_ below). A hit
//     writes its stamp, when it differs, into that sector.
//   * Any int64 key is valid (occupancy is a bit, not a reserved key).
//
// Eviction (dynamic caches): LRU at the granularity of insert() calls. A cache-wide epoch counter
// C (odd, starting at 1) advances only in insert(): by 2 per call. A hit in lookup() and a row
// overwritten by update() are stamped with C; a row stored by insert() with C + 1 (so it is newer
// than every row touched before that insert() and older than every row touched after it). A
// stamp is written only when it differs: between two insert() calls a row is stamped at most
// once, however often it is hit. insert() of an absent key takes a free way of its set or, when
// the set is full, evicts the way with the smallest stamp (ties: the lowest way): the way touched
// least recently, where all touches between two insert() calls count as simultaneous. (A clock
// advanced by every call would also order the touches between two insert() calls among
// themselves; this one breaks those ties by the lowest way, and in exchange a hit writes its
// stamp once per insert() interval, not once per lookup().)
// (Stamps are the epoch's low 16 bits and ages are taken modulo 2^16, on the CPU and the GPU
// alike: a row untouched for more than 32,767 insert() calls may look younger than it is, an
// approximation in the spirit of CLOCK.)
//
// Static caches (is_static = true) are filled by insert() into free ways only: nothing is ever
// evicted or overwritten (insert() of a key whose set is full, or that is already present, stores
// nothing), update() and erase() are refused by the adapters, and lookup() writes no stamps.
// Lookups of a static cache are read-only: they never write to shared memory.
//
// Thread safety (CPU): every method may be called from any number of threads at once.
//   * Writers (insert, update, erase, clear) take a set's version word from even to odd with a
//     compare-and-swap (a per-set spin lock), change the set, and release it at the next even
//     value. Writers of different sets never wait for each other.
//   * Readers (lookup) never lock: they read the version, find the key, copy the row into the
//     output, then re-read the version; if it was odd or changed, they copy again. A row handed
//     back was therefore read entirely while its set held that key: never torn, never another
//     key's. (The optimistic copy may read a row while a writer changes it; the copy is discarded
//     then. Readers spin only while a writer holds that one set.)
//   * Within one call, work is cut across the pool: lookup() by position; insert(), update() and
//     erase() by set (each thread takes the keys of its range of sets, in input order), so their
//     result is the same for any thread count: for a key repeated in one call, the last value
//     wins, and evictions happen in input order.
//
// Thread safety (CUDA): all work of one cache is enqueued on the caller's stream, and calls on
// one cache must be ordered (one stream, or events between streams): a lookup kernel does not
// re-check a set's version, so it must not run while a write kernel of the same cache runs.
// Within one write launch, the threads that write one set take its lock (the version word) one
// at a time. For a key repeated in one insert() call, one of its values wins (not necessarily
// the last).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "thread_pool.h"

namespace embedlab {

struct EmbeddingCacheStats {
  int64_t hits = 0;       // lookup positions found
  int64_t misses = 0;     // lookup positions not found
  int64_t inserts = 0;    // rows stored by insert() (new keys and overwrites)
  int64_t evictions = 0;  // rows evicted to make room
  int64_t updates = 0;    // positions overwritten by update()
  int64_t erases = 0;     // rows removed by erase()
  int64_t rejected = 0;   // static caches: insert() positions with no free way (nothing stored)
};

constexpr int kEmbeddingCacheMaxWays = 32;

#if defined(__CUDACC__)
#define EMBEDLAB_CACHE_HD __host__ __device__ __forceinline__
#else
#define EMBEDLAB_CACHE_HD inline
#endif

// The set of a key: murmur3's 64-bit finalizer, then a multiply-shift onto [0, num_sets). One
// definition for the CPU and the CUDA cache (a key maps to the same set in both).
EMBEDLAB_CACHE_HD uint64_t cache_mix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}
EMBEDLAB_CACHE_HD int64_t cache_set_of(int64_t key, int64_t num_sets) {
  const uint64_t h = cache_mix64(static_cast<uint64_t>(key));
#if defined(__CUDA_ARCH__)
  return static_cast<int64_t>(__umul64hi(h, static_cast<uint64_t>(num_sets)));
#else
  return static_cast<int64_t>((static_cast<unsigned __int128>(h) * static_cast<uint64_t>(num_sets)) >> 64);
#endif
}

class EmbeddingCacheCpu {
 public:
  // capacity >= 1, dim >= 1, ways in [1, kEmbeddingCacheMaxWays] (callers validate).
  EmbeddingCacheCpu(int64_t capacity, int64_t dim, int ways, bool is_static);

  int64_t capacity() const { return num_sets_ * ways_; }
  int64_t num_sets() const { return num_sets_; }
  int64_t dim() const { return dim_; }
  int ways() const { return ways_; }
  bool is_static() const { return static_; }

  // For each position i: if keys[i] is cached, copies its row to out[i * dim ..]; otherwise
  // leaves out[i * dim ..] untouched and records i. Writes the recorded positions, ascending,
  // to missing[0 .. m) (missing has room for n) and returns m.
  int64_t lookup(const int64_t* keys, int64_t n, float* out, int64_t* missing, ThreadPool& pool);

  // Stores values[i * dim ..] under keys[i] (overwriting a present key; dynamic caches evict
  // as described above). Returns the number of positions stored.
  int64_t insert(const int64_t* keys, const float* values, int64_t n, ThreadPool& pool);

  // Overwrites the rows of the keys that are present; absent keys are ignored. Returns the
  // number of positions that were present (a repeated present key counts each time).
  int64_t update(const int64_t* keys, const float* values, int64_t n, ThreadPool& pool);

  // Removes the keys that are present. Returns the number of rows removed.
  int64_t erase(const int64_t* keys, int64_t n, ThreadPool& pool);

  void clear();
  int64_t size() const { return size_.load(std::memory_order_relaxed); }
  EmbeddingCacheStats stats() const;

 private:
  // Set s's header: version (atomic uint32), occupancy mask (atomic uint32), then one uint16
  // access stamp per way; hdr_stride_ bytes (a power of two: 32 at 8 ways), so that a lookup's
  // metadata for one set (occupancy and, on a hit, the stamp it writes) is one cache line.
  std::atomic<uint32_t>& version(int64_t s) const {
    return *reinterpret_cast<std::atomic<uint32_t>*>(hdr_ + s * hdr_stride_);
  }
  std::atomic<uint32_t>& occupied(int64_t s) const {
    return *reinterpret_cast<std::atomic<uint32_t>*>(hdr_ + s * hdr_stride_ + 4);
  }
  uint16_t* stamps(int64_t s) const { return reinterpret_cast<uint16_t*>(hdr_ + s * hdr_stride_ + 8); }
  uint32_t lock_set(int64_t s);
  void unlock_set(int64_t s, uint32_t v);
  // Runs fn(position, set) for every position, grouped so that each pool thread owns a range
  // of sets and sees its positions in input order.
  static constexpr int kCounters = 4;
  template <typename Fn>
  void for_each_by_set(const int64_t* keys, int64_t n, ThreadPool& pool, int64_t cost, Fn&& fn, int64_t* totals);

  const int64_t dim_;
  const int ways_;
  const bool static_;
  int64_t num_sets_;
  int64_t hdr_stride_ = 0;
  char* hdr_ = nullptr;                  // [num_sets * hdr_stride_], 64-byte aligned
  int64_t* keys_ = nullptr;              // [num_sets * ways]
  float* values_ = nullptr;              // [num_sets * ways * dim], 64-byte aligned
  std::atomic<uint32_t> epoch_{1};
  std::atomic<int64_t> size_{0};
  std::atomic<int64_t> hits_{0}, misses_{0}, inserts_{0}, evictions_{0}, updates_{0}, erases_{0}, rejected_{0};

 public:
  ~EmbeddingCacheCpu();
  EmbeddingCacheCpu(const EmbeddingCacheCpu&) = delete;
  EmbeddingCacheCpu& operator=(const EmbeddingCacheCpu&) = delete;
};

}  // namespace embedlab

#ifdef EMBEDLAB_WITH_CUDA
#include <cuda_runtime_api.h>

namespace embedlab {

class EmbeddingCacheCudaMultiLookup;

// The same cache in device memory. Every method enqueues its work on `stream`; the ones that
// return a count to the host (a non-null *_host pointer) synchronize the stream once to read it.
// Keys, rows and outputs are device pointers. One host thread at a time per object (the
// per-call counters live in the object); callers serialize (the Python binding holds a lock).
class EmbeddingCacheCuda {
 public:
  // Allocates and zeroes the cache on the current device (synchronous). *err receives the
  // first CUDA error (then the object is unusable).
  EmbeddingCacheCuda(int64_t capacity, int64_t dim, int ways, bool is_static, cudaError_t* err);
  ~EmbeddingCacheCuda();
  EmbeddingCacheCuda(const EmbeddingCacheCuda&) = delete;
  EmbeddingCacheCuda& operator=(const EmbeddingCacheCuda&) = delete;

  int64_t capacity() const { return num_sets_ * ways_; }
  int64_t num_sets() const { return num_sets_; }
  int64_t dim() const { return dim_; }
  int ways() const { return ways_; }
  bool is_static() const { return static_; }
  int device() const { return device_; }

  // The hit path alone, no host synchronization: rows of hits copied to out[i * dim ..];
  // hit_mask[i] (uint8[n], may be null) set to 1 for a hit, 0 for a miss; miss rows untouched.
  cudaError_t lookup_mask(const int64_t* keys, int64_t n, float* out, uint8_t* hit_mask, cudaStream_t stream);

  // lookup_mask, then the miss positions, ascending, compacted into missing[0 .. *m_host)
  // (missing: int64[n]). Needs lookup_workspace_bytes(n) of device workspace; synchronizes.
  static size_t lookup_workspace_bytes(int64_t n);
  cudaError_t lookup(const int64_t* keys, int64_t n, float* out, int64_t* missing, int64_t* m_host, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream);
  // lookup() without the synchronization: the miss count is copied to *m_pinned (page-locked
  // host memory) on `stream`, valid once the stream has synchronized (written at once when
  // n <= 0). Lookups of several caches enqueued on one stream may share one workspace (stream
  // order keeps them apart) and then cost one synchronization together.
  cudaError_t lookup_enqueue(const int64_t* keys, int64_t n, float* out, int64_t* missing, int64_t* m_pinned,
                             void* workspace, size_t workspace_bytes, cudaStream_t stream);

  // Same meaning and counts as the CPU methods (count_host: may be null = no synchronization).
  cudaError_t insert(const int64_t* keys, const float* values, int64_t n, int64_t* stored_host, cudaStream_t stream);
  cudaError_t update(const int64_t* keys, const float* values, int64_t n, int64_t* present_host, cudaStream_t stream);
  cudaError_t erase(const int64_t* keys, int64_t n, int64_t* removed_host, cudaStream_t stream);
  cudaError_t clear(cudaStream_t stream);
  // What every insert() of a dynamic cache does to the LRU clock (C += 2, see Eviction above):
  // later lookups stamp their hits again. For benchmarks of the hit path as it runs between the
  // insert() calls of serving.
  cudaError_t advance_epoch(cudaStream_t stream);
  cudaError_t size(int64_t* size_host, cudaStream_t stream);     // synchronizes
  cudaError_t stats(EmbeddingCacheStats* out, cudaStream_t stream);  // synchronizes

 private:
  friend class EmbeddingCacheCudaMultiLookup;  // reads the device layout into its descriptors
  cudaError_t write(int mode, const int64_t* keys, const float* values, int64_t n, int64_t* count_host,
                    cudaStream_t stream);

  int64_t dim_;
  int ways_;
  bool static_;
  int64_t num_sets_;
  int device_ = 0;
  // The epoch counter lives in device memory and insert() advances it with a kernel, so that
  // calls replayed from a CUDA graph still age the rows (a host counter would be frozen into it).
  uint32_t* epoch_ = nullptr;
  uint32_t* headers_ = nullptr;  // [num_sets * 2]: version, occupied
  int64_t* keys_ = nullptr;      // [num_sets * ways]
  // [num_sets * meta_stride()]: per set a tag per way (8 bits of the key's hash, 0 = free), then,
  // in dynamic caches with row_off() == 4, at byte tag_stride() a 16-bit stamp per way (low 16
  // bits of the epoch of the last touch)
  uint8_t* meta_ = nullptr;
  int tag_stride() const { return (ways_ + 7) / 8 * 8; }
  // dynamic caches with row_off() == 4 keep their stamps in the set's sector too (a power of two
  // >= 32 bytes: one sector at 8 ways); the others keep the tags alone (8 bytes per set at 8 ways)
  int meta_stride() const {
    if (static_ || !row_off()) return tag_stride();
    int m = 32;
    while (m < tag_stride() + 2 * ways_) m *= 2;
    return m;
  }
  // Dynamic caches with row_off() == 0: per slot one slot word of proof_words() ? 8 : 16 bytes.
  // 16 bytes: a copy of its key, then a word whose low 16 bits are the slot's stamp (low 16 bits
  // of the epoch of its last touch). 8 bytes (at least 65,536 sets): the low 48 bits of the key's
  // hash in the high 48 bits, the stamp in the low 16. The hash (cache_mix64) is a bijection and a
  // set holds the hashes of one interval of length 2^64 / num_sets <= 2^48, so two keys of one
  // set never share their hash's low 48 bits: comparing them proves the key. Null otherwise.
  int64_t* slot_words_ = nullptr;
  bool proof_words() const { return !static_ && !row_off() && num_sets_ >= (int64_t{1} << 16); }
  // [num_sets * ways * rec()]: per slot, a copy of its key in the first 16 bytes when row_off()
  // is 4 (dims <= 16 that are multiples of 4: the key and the row lie in adjacent sectors, which
  // a hit reads together), then the row
  float* values_ = nullptr;
  int64_t row_off() const { return dim_ % 4 == 0 && dim_ <= 16 ? 4 : 0; }
  int64_t rec() const { return dim_ + row_off(); }
  // [0..7) running totals in EmbeddingCacheStats order; [8..16) this call's counts; then the
  // lookups' hit and miss counters, striped (see kStripes in embedding_cache_cuda.cu)
  unsigned long long* counters_ = nullptr;
  // Page-locked host copy of counters_ (the same words): the synchronous calls read their counts
  // through it, a direct DMA, where a copy into pageable memory is staged by the driver.
  unsigned long long* counters_host_ = nullptr;
};

// The lookups of several caches of one device as one request, in a constant number of CUDA
// operations whatever the number of caches: the caches' descriptors in one device array (one
// host-to-device copy from page-locked memory, skipped when they equal the last ones uploaded),
// one lookup kernel per group of caches that share a kernel variant (lanes per key, 16-byte
// copies, where the stamps are: one group for a model of one dim and kind), one miss compaction
// over every key, one kernel that splits the misses into each cache's local positions and counts,
// and one device-to-host copy of the counts. Each cache's rows, misses, stamps and statistics are
// those of its own lookup_enqueue(). The object owns its buffers (grown to the largest request
// seen) and serves one device (the current one at its first call); one host thread at a time.
//
// Example (caches c0, c1 of the current device; keys, out, missing device arrays):
//   EmbeddingCacheCudaMultiLookup many;
//   EmbeddingCacheCuda* caches[2] = {&c0, &c1};
//   int64_t sizes[2] = {n0, n1}, offs[2] = {0, n0 * c0.dim()};
//   many.enqueue(caches, sizes, offs, 2, keys, out, missing, stream);
//   cudaStreamSynchronize(stream);   // then many.counts()[i] = table i's misses
class EmbeddingCacheCudaMultiLookup {
 public:
  EmbeddingCacheCudaMultiLookup() = default;
  ~EmbeddingCacheCudaMultiLookup();
  EmbeddingCacheCudaMultiLookup(const EmbeddingCacheCudaMultiLookup&) = delete;
  EmbeddingCacheCudaMultiLookup& operator=(const EmbeddingCacheCudaMultiLookup&) = delete;

  // For each table i of t (host arrays caches, sizes, out_offsets; k_i = sizes[0] + ... +
  // sizes[i-1]): looks up keys[k_i .. k_i + sizes[i]) in *caches[i], copies the rows of hits to
  // out + out_offsets[i] as float32[sizes[i], dim_i] (miss rows untouched), and writes the miss
  // positions (local to table i), ascending, to missing[k_i .. k_i + m_i) (missing: int64[sum of
  // sizes]). Enqueued on `stream`; m_i lands in counts()[i] once the stream has synchronized
  // (written at once when every size is 0). Every cache must be on the current device, and the
  // previous call's work must have completed before the next call (its buffers are reused): the
  // caller synchronizes the stream after each call. Returns cudaErrorInvalidDevice for a cache of
  // another device, cudaErrorInvalidValue for a negative size or t < 0.
  cudaError_t enqueue(EmbeddingCacheCuda* const* caches, const int64_t* sizes, const int64_t* out_offsets, int64_t t,
                      const int64_t* keys, float* out, int64_t* missing, cudaStream_t stream);

  // Page-locked: counts()[i] = table i's misses of the last enqueue() (after its synchronization).
  const int64_t* counts() const { return counts_; }

 private:
  int device_ = -1;
  char* desc_dev_ = nullptr;   // the descriptors as the kernels read them
  char* desc_host_ = nullptr;  // page-locked: the bytes last copied into desc_dev_
  size_t desc_cap_ = 0;        // bytes of each
  size_t desc_bytes_ = 0;      // bytes of desc_dev_ that hold the last upload (0: none valid)
  std::vector<char> staging_;  // this call's descriptors, compared with desc_host_
  std::vector<int64_t> order_; // scratch: the non-empty tables, grouped by kernel variant
  std::vector<int> variant_;   // scratch: each table's kernel variant
  void* ws_ = nullptr;         // flags, compacted misses, their count, per-table counts, cub's storage
  size_t ws_bytes_ = 0;
  int64_t* counts_ = nullptr;  // page-locked, counts_cap_ entries
  size_t counts_cap_ = 0;
};

}  // namespace embedlab
#endif  // EMBEDLAB_WITH_CUDA

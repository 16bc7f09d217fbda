// CPU embedding cache (see embedding_cache.h for the layout, eviction and locking contract).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "embedding_cache.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define EL_CPU_RELAX() _mm_pause()
#else
#define EL_CPU_RELAX() ((void)0)
#endif

namespace embedlab {
namespace {

inline int64_t load_key(const int64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline void store_key(int64_t* p, int64_t k) { __atomic_store_n(p, k, __ATOMIC_RELAXED); }

// Rows are copied with plain loads and stores: a reader's copy that raced with a writer is
// detected by the seqlock and redone, never returned.
// Fixed-size 64-byte chunks compile to inline vector moves (a variable-size memcpy is a libc
// call, which cost more than the copy itself at dim 16).
inline void copy_row(float* __restrict dst, const float* __restrict src, int64_t dim) {
  int64_t j = 0;
  for (; j + 16 <= dim; j += 16) std::memcpy(dst + j, src + j, 64);
  for (; j + 4 <= dim; j += 4) std::memcpy(dst + j, src + j, 16);
  for (; j < dim; ++j) dst[j] = src[j];
}

// Way holding `key` among the occupied ways of a set, or -1.
inline int find_way(const int64_t* set_keys, uint32_t occupied, int ways, int64_t key) {
  for (int w = 0; w < ways; ++w)
    if (((occupied >> w) & 1u) && load_key(set_keys + w) == key) return w;
  return -1;
}

// How far ahead the lookup prefetches a key's set header and keys (kFar), then, once those
// are in cache, its candidate row (kNear).
constexpr int kFar = 16;
constexpr int kNear = 8;
constexpr int kRing = 32;  // power of two > kFar

// Large arrays are 2 MiB aligned and marked for transparent huge pages: a lookup touches three
// random places (header, keys, row), and with 4 KiB pages each is also a TLB miss.
void* alloc_table(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = bytes >= kHuge ? kHuge : 64;
  bytes = std::max<size_t>(64, (bytes + align - 1) / align * align);
  void* p = std::aligned_alloc(align, bytes);
  if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (align == kHuge) madvise(p, bytes, MADV_HUGEPAGE);  // a hint: failure changes nothing
#endif
  return p;
}

}  // namespace

EmbeddingCacheCpu::EmbeddingCacheCpu(int64_t capacity, int64_t dim, int ways, bool is_static)
    : dim_(dim), ways_(ways), static_(is_static) {
  num_sets_ = std::max<int64_t>(1, (capacity + ways - 1) / ways);
  const int64_t slots = num_sets_ * ways_;
  hdr_stride_ = 16;
  while (hdr_stride_ < 8 + 2 * ways_) hdr_stride_ *= 2;
  hdr_ = static_cast<char*>(alloc_table(static_cast<size_t>(num_sets_ * hdr_stride_)));
  std::memset(hdr_, 0, static_cast<size_t>(num_sets_ * hdr_stride_));
  for (int64_t s = 0; s < num_sets_; ++s) {
    new (&version(s)) std::atomic<uint32_t>(0);
    new (&occupied(s)) std::atomic<uint32_t>(0);
  }
  keys_ = static_cast<int64_t*>(alloc_table(sizeof(int64_t) * static_cast<size_t>(slots)));
  std::memset(keys_, 0, sizeof(int64_t) * static_cast<size_t>(slots));
  values_ = static_cast<float*>(alloc_table(static_cast<size_t>(slots) * static_cast<size_t>(dim_) * sizeof(float)));
}

EmbeddingCacheCpu::~EmbeddingCacheCpu() {
  std::free(values_);
  std::free(hdr_);
  std::free(keys_);
}

uint32_t EmbeddingCacheCpu::lock_set(int64_t s) {
  std::atomic<uint32_t>& ver = version(s);
  for (;;) {
    uint32_t v = ver.load(std::memory_order_relaxed);
    if (!(v & 1u) && ver.compare_exchange_weak(v, v + 1, std::memory_order_acquire, std::memory_order_relaxed)) {
      // Readers that see any of the stores below also see the odd version (and retry).
      std::atomic_thread_fence(std::memory_order_release);
      return v + 1;
    }
    EL_CPU_RELAX();
  }
}

void EmbeddingCacheCpu::unlock_set(int64_t s, uint32_t odd) {
  version(s).store(odd + 1, std::memory_order_release);
}

int64_t EmbeddingCacheCpu::lookup(const int64_t* keys, int64_t n, float* out, int64_t* missing, ThreadPool& pool) {
  if (n <= 0) return 0;
  const bool touch = !static_;
  // Lookups do not advance the epoch (only insert() does): hits are stamped with its value.
  const uint32_t epoch = touch ? epoch_.load(std::memory_order_relaxed) : 0;
  const uint16_t epoch16 = static_cast<uint16_t>(epoch);
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> blocks;  // (begin, number of misses written at missing[begin..])
  int64_t total_hits = 0;
  pool.parallel_for(n, 10 + dim_ / 4, [&](int64_t b, int64_t e) {
    int64_t ring[kRing];
    int64_t nmiss = 0;
    std::vector<float> scratch(static_cast<size_t>(dim_));
    const int ways = ways_;
    auto prefetch_set = [&](int64_t i) {
      const int64_t s = cache_set_of(keys[i], num_sets_);
      ring[i & (kRing - 1)] = s;
      if (touch) __builtin_prefetch(hdr_ + s * hdr_stride_, 1, 1);  // a hit writes its stamp there
      else __builtin_prefetch(hdr_ + s * hdr_stride_, 0, 1);
      __builtin_prefetch(keys_ + s * ways, 0, 1);
    };
    for (int64_t i = b; i < std::min(e, b + kFar); ++i) prefetch_set(i);
    for (int64_t i = b; i < e; ++i) {
      if (i + kFar < e) prefetch_set(i + kFar);
      if (i + kNear < e) {  // the set's keys should be in cache by now: prefetch the row it holds
        const int64_t j = i + kNear;
        const int64_t s = ring[j & (kRing - 1)];
        const int64_t* sk = keys_ + s * ways;
        for (int w = 0; w < ways; ++w)
          if (load_key(sk + w) == keys[j]) {
            const char* row = reinterpret_cast<const char*>(values_ + (s * ways + w) * dim_);
            for (int64_t off = 0; off < dim_ * 4; off += 64) __builtin_prefetch(row + off, 0, 1);
            break;
          }
      }
      const int64_t key = keys[i];
      const int64_t s = ring[i & (kRing - 1)];
      const std::atomic<uint32_t>& ver = version(s);
      const std::atomic<uint32_t>& occ = occupied(s);
      const int64_t* sk = keys_ + s * ways;
      int way;
      for (;;) {
        const uint32_t v1 = ver.load(std::memory_order_acquire);
        if (v1 & 1u) {
          EL_CPU_RELAX();
          continue;
        }
        way = find_way(sk, occ.load(std::memory_order_relaxed), ways, key);
        // Copied to a scratch row first: a copy that the version check rejects must not reach
        // `out`, whose rows stay untouched for keys that end up missing.
        if (way >= 0) copy_row(scratch.data(), values_ + (s * ways + way) * dim_, dim_);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (ver.load(std::memory_order_relaxed) == v1) break;
      }
      if (way >= 0) copy_row(out + i * dim_, scratch.data(), dim_);
      if (way < 0) {
        missing[b + nmiss++] = i;
      } else if (touch) {
        uint16_t* st = stamps(s) + way;
        if (__atomic_load_n(st, __ATOMIC_RELAXED) != epoch16) __atomic_store_n(st, epoch16, __ATOMIC_RELAXED);
      }
    }
    std::lock_guard<std::mutex> l(mu);
    blocks.emplace_back(b, nmiss);
    total_hits += (e - b) - nmiss;
  });
  // Blocks wrote their misses in place at missing[begin ..]; compact them in position order.
  std::sort(blocks.begin(), blocks.end());
  int64_t m = 0;
  for (const auto& [b, cnt] : blocks) {
    if (b != m && cnt > 0) std::memmove(missing + m, missing + b, static_cast<size_t>(cnt) * sizeof(int64_t));
    m += cnt;
  }
  hits_.fetch_add(total_hits, std::memory_order_relaxed);
  misses_.fetch_add(m, std::memory_order_relaxed);
  return m;
}

template <typename Fn>
void EmbeddingCacheCpu::for_each_by_set(const int64_t* keys, int64_t n, ThreadPool& pool, int64_t cost, Fn&& fn,
                                        int64_t* totals) {
  if (n <= 0) return;
  const int64_t threads = std::min<int64_t>(pool.num_threads(), std::max<int64_t>(1, n / 256));
  if (threads <= 1) {
    int64_t c[kCounters] = {};
    for (int64_t i = 0; i < n; ++i) fn(i, cache_set_of(keys[i], num_sets_), c);
    for (int k = 0; k < kCounters; ++k) totals[k] += c[k];
    return;
  }
  std::vector<int64_t> sets(static_cast<size_t>(n));
  pool.parallel_for(n, 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sets[i] = cache_set_of(keys[i], num_sets_);
  });
  // Thread t owns sets [t * num_sets / threads, (t + 1) * num_sets / threads) and visits its
  // positions in input order: the outcome does not depend on the thread count.
  std::mutex mu;
  pool.parallel_for(threads, n * cost, [&](int64_t tb, int64_t te) {
    const int64_t lo = tb * num_sets_ / threads, hi = te * num_sets_ / threads;
    int64_t c[kCounters] = {};  // counted per thread, added once: no shared counter per key
    for (int64_t i = 0; i < n; ++i)
      if (sets[i] >= lo && sets[i] < hi) fn(i, sets[i], c);
    std::lock_guard<std::mutex> l(mu);
    for (int k = 0; k < kCounters; ++k) totals[k] += c[k];
  });
}

int64_t EmbeddingCacheCpu::insert(const int64_t* keys, const float* values, int64_t n, ThreadPool& pool) {
  if (n <= 0) return 0;  // an empty call leaves the epoch as it is (as on the GPU)
  // The epoch C advances by 2 per insert(); its rows are stamped C + 1 (embedding_cache.h).
  const uint16_t epoch16 = static_cast<uint16_t>(epoch_.fetch_add(2, std::memory_order_relaxed) + 1);
  const uint32_t full = ways_ == 32 ? 0xffffffffu : ((1u << ways_) - 1u);
  int64_t t[kCounters] = {};  // stored, evicted, added, rejected
  auto body = [&](int64_t i, int64_t s, int64_t* c) {
    const int64_t key = keys[i];
    int64_t* sk = keys_ + s * ways_;
    const uint32_t v = lock_set(s);
    uint32_t occ = occupied(s).load(std::memory_order_relaxed);
    uint16_t* st16 = stamps(s);
    int way = find_way(sk, occ, ways_, key);
    int64_t st = 0, ev = 0, ad = 0, rj = 0;
    if (way >= 0) {
      if (!static_) {
        copy_row(values_ + (s * ways_ + way) * dim_, values + i * dim_, dim_);
        __atomic_store_n(st16 + way, epoch16, __ATOMIC_RELAXED);
        st = 1;
      }
    } else {
      const uint32_t free_ways = ~occ & full;
      if (free_ways) {
        way = __builtin_ctz(free_ways);
        ad = 1;
      } else if (!static_) {
        way = 0;
        // Ages modulo 2^16 (unsigned distance from the current epoch: correct across the wrap).
        uint16_t oldest = static_cast<uint16_t>(epoch16 - __atomic_load_n(st16, __ATOMIC_RELAXED));
        for (int w = 1; w < ways_; ++w) {
          const uint16_t a = static_cast<uint16_t>(epoch16 - __atomic_load_n(st16 + w, __ATOMIC_RELAXED));
          if (a > oldest) {
            oldest = a;
            way = w;
          }
        }
        ev = 1;
      } else {
        rj = 1;
      }
      if (way >= 0) {
        store_key(sk + way, key);
        copy_row(values_ + (s * ways_ + way) * dim_, values + i * dim_, dim_);
        __atomic_store_n(st16 + way, epoch16, __ATOMIC_RELAXED);
        occupied(s).store(occ | (1u << way), std::memory_order_relaxed);
        st = 1;
      }
    }
    unlock_set(s, v);
    c[0] += st;
    c[1] += ev;
    c[2] += ad;
    c[3] += rj;
  };
  for_each_by_set(keys, n, pool, 4 + dim_ / 8, body, t);
  size_.fetch_add(t[2], std::memory_order_relaxed);
  inserts_.fetch_add(t[0], std::memory_order_relaxed);
  evictions_.fetch_add(t[1], std::memory_order_relaxed);
  rejected_.fetch_add(t[3], std::memory_order_relaxed);
  return t[0];
}

int64_t EmbeddingCacheCpu::update(const int64_t* keys, const float* values, int64_t n, ThreadPool& pool) {
  const uint16_t epoch16 = static_cast<uint16_t>(epoch_.load(std::memory_order_relaxed));  // like a lookup
  int64_t t[kCounters] = {};
  for_each_by_set(keys, n, pool, 4 + dim_ / 8, [&](int64_t i, int64_t s, int64_t* c) {
    const int64_t* sk = keys_ + s * ways_;
    // Unlocked probe first: an absent key (the common case for most callers) costs no lock.
    if (find_way(sk, occupied(s).load(std::memory_order_relaxed), ways_, keys[i]) < 0) {
      // A key inserted concurrently by another thread may be missed: the calls are not
      // ordered, so either outcome is one the caller could have seen.
      return;
    }
    const uint32_t v = lock_set(s);
    const int way = find_way(sk, occupied(s).load(std::memory_order_relaxed), ways_, keys[i]);
    if (way >= 0) {
      copy_row(values_ + (s * ways_ + way) * dim_, values + i * dim_, dim_);
      __atomic_store_n(stamps(s) + way, epoch16, __ATOMIC_RELAXED);
    }
    unlock_set(s, v);
    if (way >= 0) ++c[0];
  }, t);
  updates_.fetch_add(t[0], std::memory_order_relaxed);
  return t[0];
}

int64_t EmbeddingCacheCpu::erase(const int64_t* keys, int64_t n, ThreadPool& pool) {
  int64_t t[kCounters] = {};
  for_each_by_set(keys, n, pool, 4, [&](int64_t i, int64_t s, int64_t* c) {
    const int64_t* sk = keys_ + s * ways_;
    const uint32_t v = lock_set(s);
    const uint32_t occ = occupied(s).load(std::memory_order_relaxed);
    const int way = find_way(sk, occ, ways_, keys[i]);
    if (way >= 0) occupied(s).store(occ & ~(1u << way), std::memory_order_relaxed);
    unlock_set(s, v);
    if (way >= 0) ++c[0];
  }, t);
  size_.fetch_sub(t[0], std::memory_order_relaxed);
  erases_.fetch_add(t[0], std::memory_order_relaxed);
  return t[0];
}

void EmbeddingCacheCpu::clear() {
  for (int64_t s = 0; s < num_sets_; ++s) {
    const uint32_t v = lock_set(s);
    const uint32_t occ = occupied(s).load(std::memory_order_relaxed);
    occupied(s).store(0, std::memory_order_relaxed);
    unlock_set(s, v);
    size_.fetch_sub(__builtin_popcount(occ), std::memory_order_relaxed);
  }
}

EmbeddingCacheStats EmbeddingCacheCpu::stats() const {
  EmbeddingCacheStats s;
  s.hits = hits_.load();
  s.misses = misses_.load();
  s.inserts = inserts_.load();
  s.evictions = evictions_.load();
  s.updates = updates_.load();
  s.erases = erases_.load();
  s.rejected = rejected_.load();
  return s;
}

}  // namespace embedlab

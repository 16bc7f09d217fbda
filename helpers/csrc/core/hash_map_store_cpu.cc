// HPS hash_map / parallel_hash_map volatile database (see hash_map_store.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <mutex>
#include <numeric>
#include <shared_mutex>
#include <utility>

#include "embedding_cache.h"  // cache_mix64
#include "hash_map_store.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace embedlab {

bool parse_overflow_policy(const std::string& name, OverflowPolicy* out) {
  if (name == "evict_random") *out = OverflowPolicy::kEvictRandom;
  else if (name == "evict_least_used") *out = OverflowPolicy::kEvictLeastUsed;
  else if (name == "evict_oldest") *out = OverflowPolicy::kEvictOldest;
  else return false;
  return true;
}

const char* overflow_policy_name(OverflowPolicy p) {
  switch (p) {
    case OverflowPolicy::kEvictRandom: return "evict_random";
    case OverflowPolicy::kEvictLeastUsed: return "evict_least_used";
    case OverflowPolicy::kEvictOldest: return "evict_oldest";
  }
  return "?";
}

namespace {

// Vectors of 2 MiB and more are 2 MiB aligned and marked for transparent huge pages: a find
// touches the map's slot, its key and the row, in three random places; with 4 KiB pages each is
// also a TLB miss.
template <typename T>
struct TableAlloc {
  using value_type = T;
  TableAlloc() = default;
  template <typename U>
  TableAlloc(const TableAlloc<U>&) {}
  T* allocate(size_t n) {
    if (n > (size_t{1} << 56) / sizeof(T)) throw std::bad_alloc();
    constexpr size_t kHuge = size_t{2} << 20;
    size_t bytes = std::max<size_t>(n * sizeof(T), 64);
    const size_t align = bytes >= kHuge ? kHuge : 64;
    bytes = (bytes + align - 1) / align * align;
    void* p = std::aligned_alloc(align, bytes);
    if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (align == kHuge) madvise(p, bytes, MADV_HUGEPAGE);  // a hint: failure changes nothing
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <typename U>
  bool operator==(const TableAlloc<U>&) const { return true; }
  template <typename U>
  bool operator!=(const TableAlloc<U>&) const { return false; }
};
template <typename T>
using TableVec = std::vector<T, TableAlloc<T>>;

// Second mixing step for the in-partition index, so that it does not reuse the bits that chose
// the partition (multiply-high of the first mix).
inline uint64_t index_hash(int64_t key) { return cache_mix64(static_cast<uint64_t>(key) ^ 0x9e3779b97f4a7c15ULL); }
}  // namespace

// One partition: an open-addressing (linear probing, backward-shift deletion) key -> slot map
// and the rows by slot, kept dense: erase() moves the last row into the hole, eviction compacts.
struct HashMapStore::Partition {
  mutable std::shared_mutex mu;
  int64_t dim = 0;
  // map: key and slot side by side (one cache line per probe)
  struct Entry {
    int64_t key;
    int64_t slot;  // -1 = empty
  };
  TableVec<Entry> table;
  uint64_t mask = 0;
  // rows by slot
  TableVec<int64_t> keys;
  TableVec<float> values;
  TableVec<uint64_t> used;  // access counts (evict_least_used); read/bumped with relaxed atomics
  TableVec<uint64_t> last;  // last access epoch (evict_oldest)
  uint64_t rng = 0;
  std::atomic<int64_t> hits{0}, misses{0}, inserts{0}, overwrites{0}, evictions{0}, erases{0};

  explicit Partition(int64_t d, uint64_t seed) : dim(d), rng(seed | 1) { reset_map(16); }

  int64_t size() const { return static_cast<int64_t>(keys.size()); }

  void reset_map(uint64_t cap) {
    table.assign(cap, Entry{0, -1});
    mask = cap - 1;
  }

  const Entry* probe_start(int64_t key) const { return &table[index_hash(key) & mask]; }

  int64_t map_find(int64_t key) const {
    for (uint64_t i = index_hash(key) & mask;; i = (i + 1) & mask) {
      const Entry& e = table[i];
      if (e.slot < 0) return -1;
      if (e.key == key) return e.slot;
    }
  }
  // key must be absent
  void map_insert(int64_t key, int64_t slot) {
    if ((static_cast<uint64_t>(keys.size()) + 1) * 10 > (mask + 1) * 7) grow();
    uint64_t i = index_hash(key) & mask;
    while (table[i].slot >= 0) i = (i + 1) & mask;
    table[i] = Entry{key, slot};
  }
  void map_assign(int64_t key, int64_t slot) {
    for (uint64_t i = index_hash(key) & mask;; i = (i + 1) & mask)
      if (table[i].slot >= 0 && table[i].key == key) {
        table[i].slot = slot;
        return;
      }
  }
  // Removes key (must be present), shifting later members of its probe run back.
  void map_erase(int64_t key) {
    uint64_t i = index_hash(key) & mask;
    while (!(table[i].slot >= 0 && table[i].key == key)) i = (i + 1) & mask;
    uint64_t j = i;
    for (;;) {
      j = (j + 1) & mask;
      if (table[j].slot < 0) break;
      const uint64_t home = index_hash(table[j].key) & mask;
      // Move j back to i unless its home lies cyclically in (i, j].
      const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
      if (!stays) {
        table[i] = table[j];
        i = j;
      }
    }
    table[i].slot = -1;
  }
  void grow() {
    TableVec<Entry> old = std::move(table);
    reset_map((mask + 1) * 2);
    for (const Entry& e : old)
      if (e.slot >= 0) {
        uint64_t h = index_hash(e.key) & mask;
        while (table[h].slot >= 0) h = (h + 1) & mask;
        table[h] = e;
      }
  }

  uint64_t next_random() {  // xorshift64
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
  }

  void clear() {
    keys.clear();
    values.clear();
    used.clear();
    last.clear();
    reset_map(16);
  }

  // Removes the rows at the given slots (distinct), keeping the others in slot order.
  void remove_slots(std::vector<int64_t>& victims) {
    std::vector<uint8_t> dead(keys.size(), 0);
    for (int64_t v : victims) {
      dead[v] = 1;
      map_erase(keys[v]);
    }
    int64_t w = 0;
    for (int64_t r = 0; r < size(); ++r) {
      if (dead[r]) continue;
      if (w != r) {
        keys[w] = keys[r];
        std::memcpy(&values[w * dim], &values[r * dim], dim * sizeof(float));
        used[w] = used[r];
        last[w] = last[r];
        map_assign(keys[w], w);
      }
      ++w;
    }
    keys.resize(w);
    values.resize(w * dim);
    used.resize(w);
    last.resize(w);
  }

  void resolve_overflow(int64_t margin, double target, OverflowPolicy policy) {
    if (margin <= 0 || size() <= margin) return;
    const int64_t keep = static_cast<int64_t>(std::floor(static_cast<double>(margin) * target));
    const int64_t k = size() - std::max<int64_t>(0, std::min(keep, margin));
    std::vector<int64_t> victims;
    victims.reserve(k);
    if (policy == OverflowPolicy::kEvictRandom) {
      std::vector<int64_t> idx(size());
      std::iota(idx.begin(), idx.end(), 0);
      for (int64_t i = 0; i < k; ++i) {  // partial Fisher-Yates
        const int64_t j = i + static_cast<int64_t>(next_random() % static_cast<uint64_t>(size() - i));
        std::swap(idx[i], idx[j]);
        victims.push_back(idx[i]);
      }
    } else {
      const TableVec<uint64_t>& score = policy == OverflowPolicy::kEvictLeastUsed ? used : last;
      std::vector<std::pair<uint64_t, int64_t>> order(size());
      for (int64_t s = 0; s < size(); ++s) order[s] = {score[s], s};
      std::nth_element(order.begin(), order.begin() + (k - 1), order.end());
      for (int64_t i = 0; i < k; ++i) victims.push_back(order[i].second);
    }
    remove_slots(victims);
    evictions.fetch_add(k, std::memory_order_relaxed);
  }
};

HashMapStore::HashMapStore(int64_t dim, int num_partitions, int64_t overflow_margin, OverflowPolicy policy,
                           double overflow_resolution_target, bool parallel)
    : dim_(dim),
      num_partitions_(num_partitions),
      margin_(overflow_margin),
      policy_(policy),
      target_(overflow_resolution_target),
      parallel_(parallel) {
  for (int p = 0; p < num_partitions_; ++p)
    parts_.push_back(std::make_unique<Partition>(dim_, 0x2545f4914f6cdd1dULL * (p + 1)));
}

HashMapStore::~HashMapStore() = default;

int HashMapStore::partition_of(int64_t key) const {
  return static_cast<int>(cache_set_of(key, num_partitions_));
}

void HashMapStore::group(const int64_t* keys, int64_t n, std::vector<int64_t>* offsets,
                         std::vector<int64_t>* order) const {
  offsets->assign(num_partitions_ + 1, 0);
  order->resize(n);
  if (num_partitions_ == 1) {
    (*offsets)[1] = n;
    std::iota(order->begin(), order->end(), 0);
    return;
  }
  std::vector<int32_t> part(n);
  for (int64_t i = 0; i < n; ++i) {
    part[i] = partition_of(keys[i]);
    ++(*offsets)[part[i] + 1];
  }
  for (int p = 0; p < num_partitions_; ++p) (*offsets)[p + 1] += (*offsets)[p];
  std::vector<int64_t> next(offsets->begin(), offsets->end() - 1);
  for (int64_t i = 0; i < n; ++i) (*order)[next[part[i]]++] = i;
}

template <typename Fn>
void HashMapStore::for_partitions(const std::vector<int64_t>& offsets, ThreadPool& pool, int64_t cost_per_key,
                                  Fn&& fn) {
  auto run = [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p)
      if (offsets[p + 1] > offsets[p]) fn(static_cast<int>(p));
  };
  const int64_t n = offsets.back();
  if (!parallel_ || pool.num_threads() <= 1) {
    run(0, num_partitions_);
    return;
  }
  pool.parallel_for(num_partitions_, std::max<int64_t>(1, n * cost_per_key / num_partitions_), run);
}

int64_t HashMapStore::find(const int64_t* keys, int64_t n, float* out, int64_t* missing, ThreadPool& pool) {
  if (n <= 0) return 0;
  std::vector<int64_t> offsets, order;
  group(keys, n, &offsets, &order);
  std::vector<uint8_t> miss(n, 0);
  for_partitions(offsets, pool, 20 + dim_ / 4, [&](int p) {
    Partition& part = *parts_[p];
    const uint64_t epoch = policy_ == OverflowPolicy::kEvictOldest ? clock_.fetch_add(1, std::memory_order_relaxed) : 0;
    std::shared_lock<std::shared_mutex> l(part.mu);
    int64_t hits = 0;
    const int64_t b = offsets[p], e = offsets[p + 1];
    // Two-stage prefetch: the probe's line kFar keys ahead, then (that line now cached) the
    // row it points to kNear keys ahead.
    constexpr int64_t kFar = 16, kNear = 8;
    for (int64_t j = b; j < std::min(e, b + kFar); ++j) __builtin_prefetch(part.probe_start(keys[order[j]]), 0, 1);
    for (int64_t j = b; j < e; ++j) {
      if (j + kFar < e) __builtin_prefetch(part.probe_start(keys[order[j + kFar]]), 0, 1);
      if (j + kNear < e) {
        const int64_t s2 = part.map_find(keys[order[j + kNear]]);
        if (s2 >= 0) {
          const char* row = reinterpret_cast<const char*>(&part.values[s2 * dim_]);
          for (int64_t off = 0; off < dim_ * 4; off += 64) __builtin_prefetch(row + off, 0, 1);
        }
      }
      const int64_t i = order[j];
      const int64_t s = part.map_find(keys[i]);
      if (s < 0) {
        miss[i] = 1;
        continue;
      }
      std::memcpy(out + i * dim_, &part.values[s * dim_], dim_ * sizeof(float));
      if (policy_ == OverflowPolicy::kEvictLeastUsed) __atomic_fetch_add(&part.used[s], 1, __ATOMIC_RELAXED);
      else if (policy_ == OverflowPolicy::kEvictOldest) __atomic_store_n(&part.last[s], epoch, __ATOMIC_RELAXED);
      ++hits;
    }
    part.hits.fetch_add(hits, std::memory_order_relaxed);
    part.misses.fetch_add((e - b) - hits, std::memory_order_relaxed);
  });
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i)
    if (miss[i]) missing[m++] = i;
  return m;
}

int64_t HashMapStore::insert(const int64_t* keys, const float* values, int64_t n, ThreadPool& pool) {
  if (n <= 0) return 0;
  std::vector<int64_t> offsets, order;
  group(keys, n, &offsets, &order);
  std::atomic<int64_t> added{0};
  for_partitions(offsets, pool, 40 + dim_ / 2, [&](int p) {
    Partition& part = *parts_[p];
    const uint64_t epoch = clock_.fetch_add(1, std::memory_order_relaxed);
    std::unique_lock<std::shared_mutex> l(part.mu);
    int64_t new_rows = 0, over = 0;
    for (int64_t j = offsets[p]; j < offsets[p + 1]; ++j) {
      const int64_t i = order[j];
      int64_t s = part.map_find(keys[i]);
      if (s >= 0) {
        ++over;
        ++part.used[s];
      } else {
        s = part.size();
        part.map_insert(keys[i], s);
        part.keys.push_back(keys[i]);
        part.values.resize(part.values.size() + dim_);
        part.used.push_back(1);
        part.last.push_back(0);
        ++new_rows;
      }
      part.last[s] = epoch;
      std::memcpy(&part.values[s * dim_], values + i * dim_, dim_ * sizeof(float));
    }
    part.inserts.fetch_add(new_rows, std::memory_order_relaxed);
    part.overwrites.fetch_add(over, std::memory_order_relaxed);
    part.resolve_overflow(margin_, target_, policy_);
    added.fetch_add(new_rows, std::memory_order_relaxed);
  });
  return added.load();
}

int64_t HashMapStore::erase(const int64_t* keys, int64_t n, ThreadPool& pool) {
  if (n <= 0) return 0;
  std::vector<int64_t> offsets, order;
  group(keys, n, &offsets, &order);
  std::atomic<int64_t> removed{0};
  for_partitions(offsets, pool, 30, [&](int p) {
    Partition& part = *parts_[p];
    std::unique_lock<std::shared_mutex> l(part.mu);
    int64_t r = 0;
    for (int64_t j = offsets[p]; j < offsets[p + 1]; ++j) {
      const int64_t key = keys[order[j]];
      const int64_t s = part.map_find(key);
      if (s < 0) continue;
      part.map_erase(key);
      const int64_t lastslot = part.size() - 1;
      if (s != lastslot) {  // move the last row into the hole
        part.keys[s] = part.keys[lastslot];
        std::memcpy(&part.values[s * dim_], &part.values[lastslot * dim_], dim_ * sizeof(float));
        part.used[s] = part.used[lastslot];
        part.last[s] = part.last[lastslot];
        part.map_assign(part.keys[s], s);
      }
      part.keys.pop_back();
      part.values.resize(part.values.size() - dim_);
      part.used.pop_back();
      part.last.pop_back();
      ++r;
    }
    part.erases.fetch_add(r, std::memory_order_relaxed);
    removed.fetch_add(r, std::memory_order_relaxed);
  });
  return removed.load();
}

void HashMapStore::clear() {
  for (auto& p : parts_) {
    std::unique_lock<std::shared_mutex> l(p->mu);
    p->clear();
  }
}

int64_t HashMapStore::size() const {
  int64_t s = 0;
  for (const auto& p : parts_) {
    std::shared_lock<std::shared_mutex> l(p->mu);
    s += p->size();
  }
  return s;
}

std::vector<int64_t> HashMapStore::partition_sizes() const {
  std::vector<int64_t> out;
  for (const auto& p : parts_) {
    std::shared_lock<std::shared_mutex> l(p->mu);
    out.push_back(p->size());
  }
  return out;
}

void HashMapStore::export_entries(std::vector<int64_t>* keys, std::vector<float>* values) const {
  keys->clear();
  values->clear();
  for (const auto& p : parts_) {
    std::shared_lock<std::shared_mutex> l(p->mu);
    keys->insert(keys->end(), p->keys.begin(), p->keys.end());
    values->insert(values->end(), p->values.begin(), p->values.end());
  }
}

HashMapStoreStats HashMapStore::stats() const {
  HashMapStoreStats s;
  for (const auto& p : parts_) {
    s.hits += p->hits.load();
    s.misses += p->misses.load();
    s.inserts += p->inserts.load();
    s.overwrites += p->overwrites.load();
    s.evictions += p->evictions.load();
    s.erases += p->erases.load();
  }
  return s;
}

}  // namespace embedlab

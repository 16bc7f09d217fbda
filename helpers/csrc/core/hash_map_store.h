// The HPS in-process volatile database: HugeCTR's `hash_map` / `parallel_hash_map` backend.
//
// Rows of `dim` floats under int64 keys (any int64 value), spread over `num_partitions`
// partitions by key hash. Each partition owns an open-addressing key -> slot map, its rows stored
// contiguously by slot, and the bookkeeping its overflow policy needs. A call first groups its
// keys by partition (one counting pass); each partition is then handled under its own lock, in
// input order: with `parallel`, the partitions run on the pool (parallel_hash_map), otherwise one
// after the other on the calling thread (hash_map). Results never depend on the thread count.
//
// Overflow: with overflow_margin > 0, an insert() that leaves a partition holding more than
// overflow_margin rows evicts rows of that partition until it holds
// floor(overflow_margin * overflow_resolution_target) rows. Victims, by policy:
//   evict_random      uniformly random rows (a per-partition xorshift generator, fixed seed);
//   evict_least_used  the rows accessed fewest times (an insert counts 1, each find hit 1);
//   evict_oldest      the rows whose last access (insert, overwrite or find hit) is oldest;
// ties broken by the older slot (earlier insertion). The rows of the insert() that overflowed may
// be victims themselves. So after every call no partition holds more than overflow_margin rows.
//
// Why not the shared HashTable (hash_table.h): eviction and erase move rows (erase refills the
// hole from the partition's end, eviction compacts; rows stay dense for export and for the
// random choice), which needs the map to re-point a key to a new slot and to delete, under the same lock that guards
// the rows and counters. A small single-writer open-addressing map per partition does this with
// no second level of synchronisation; partitions are already the unit of locking.
//
// Thread safety: any method may be called from several threads. find() holds a partition's lock
// shared (hits bump the policy's counters with relaxed atomics); insert(), erase() and clear()
// hold it exclusively. export_entries() holds each partition's lock shared while it copies it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "thread_pool.h"

namespace embedlab {

enum class OverflowPolicy : int { kEvictRandom = 0, kEvictLeastUsed = 1, kEvictOldest = 2 };

// "evict_random" | "evict_least_used" | "evict_oldest"; false for anything else.
bool parse_overflow_policy(const std::string& name, OverflowPolicy* out);
const char* overflow_policy_name(OverflowPolicy p);

struct HashMapStoreStats {
  int64_t hits = 0;        // find() positions found
  int64_t misses = 0;      // find() positions not found
  int64_t inserts = 0;     // rows added by insert()
  int64_t overwrites = 0;  // insert() positions whose key was present (row replaced)
  int64_t evictions = 0;   // rows evicted by the overflow policy
  int64_t erases = 0;      // rows removed by erase()
};

class HashMapStore {
 public:
  // dim >= 1, num_partitions >= 1, overflow_margin >= 0 (0 = unlimited),
  // 0 < overflow_resolution_target <= 1 (callers validate).
  HashMapStore(int64_t dim, int num_partitions, int64_t overflow_margin, OverflowPolicy policy,
               double overflow_resolution_target, bool parallel);
  ~HashMapStore();
  HashMapStore(const HashMapStore&) = delete;
  HashMapStore& operator=(const HashMapStore&) = delete;

  int64_t dim() const { return dim_; }
  int num_partitions() const { return num_partitions_; }
  int64_t overflow_margin() const { return margin_; }
  OverflowPolicy overflow_policy() const { return policy_; }
  double overflow_resolution_target() const { return target_; }
  bool parallel() const { return parallel_; }

  // Found keys: row copied to out[i * dim ..]; the others' positions are written, ascending, to
  // missing[0 .. m) (room for n), out rows untouched. Returns m.
  int64_t find(const int64_t* keys, int64_t n, float* out, int64_t* missing, ThreadPool& pool);
  // Inserts or overwrites (a key repeated in one call: the last value wins), then resolves
  // overflow. Returns the number of new rows added (before eviction).
  int64_t insert(const int64_t* keys, const float* values, int64_t n, ThreadPool& pool);
  // Returns the number of rows removed.
  int64_t erase(const int64_t* keys, int64_t n, ThreadPool& pool);
  void clear();
  int64_t size() const;
  std::vector<int64_t> partition_sizes() const;
  // Every row, partition by partition (each partition a consistent snapshot).
  void export_entries(std::vector<int64_t>* keys, std::vector<float>* values) const;
  HashMapStoreStats stats() const;

  // The partition of a key (exposed for tests).
  int partition_of(int64_t key) const;

  struct Partition;  // defined in hash_map_store_cpu.cc

 private:
  // Groups positions by partition: order[offsets[p] .. offsets[p + 1]) are partition p's
  // positions, ascending.
  void group(const int64_t* keys, int64_t n, std::vector<int64_t>* offsets, std::vector<int64_t>* order) const;
  template <typename Fn>
  void for_partitions(const std::vector<int64_t>& offsets, ThreadPool& pool, int64_t cost_per_key, Fn&& fn);

  const int64_t dim_;
  const int num_partitions_;
  const int64_t margin_;
  const OverflowPolicy policy_;
  const double target_;
  const bool parallel_;
  std::vector<std::unique_ptr<Partition>> parts_;
  std::atomic<uint64_t> clock_{1};  // access epochs (evict_oldest): one per partition per call
};

}  // namespace embedlab

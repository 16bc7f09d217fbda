// EmbedLab core: a concurrent int64 -> int64 hash table (key -> row index), shared by SOK's
// DynamicVariable, the HPS hash_map tier and the Session's oversubscription working set.
// Plain data only: raw pointers, sizes, a ThreadPool. No TensorFlow or Python headers here.
//
// Layout: open addressing with linear probing over a power-of-two array of (key, value) slots
// (16 bytes, so a probe usually touches one cache line); the table doubles (full rehash) before
// its load would pass 1/2. Deletion is backward-shift (no tombstones), so probe sequences stay
// as short after erases as after inserts. Every int64 is a valid key: the slot array marks
// empty slots with kEmptyKey, and the one real key equal to kEmptyKey lives out of line
// (has_empty_key_ / empty_key_value_).
//
// Thread safety: one std::shared_mutex per table (a reader/writer lock).
//   * find, size, capacity, export_entries take it shared: any number run concurrently.
//   * insert_or_assign, erase, clear, reserve take it exclusive.
//   * find_or_insert first looks the batch up under the shared lock (in parallel over the
//     pool); only if some key is absent does it take the exclusive lock, look those keys up
//     again (a concurrent writer may have added them meanwhile) and insert the absent ones in
//     one serial pass in input order. A batch of known keys therefore never blocks readers.
//   Each call is atomic with respect to every other call on the same table.
//
// Errors: running out of memory while growing throws std::bad_alloc (a std::length_error past
// kMaxKeys); the table is then unchanged by find_or_insert and keeps what insert_or_assign had
// assigned before the failure. Adapters turn these into their own errors.
//
// Values given by find_or_insert: an absent key gets value = size() at its insertion, keys
// taken in order of their first occurrence in the input, so the same sequence of calls gives
// the same values whatever the thread count. Without erase (or insert_or_assign of arbitrary
// values) the values of a table are exactly 0 .. size()-1 (dense row indices). erase does not
// renumber: after erasing, the next new key gets value = size(), which can repeat a value
// still held by another key; callers that erase and need unique rows keep their own free list
// and use insert_or_assign.
#pragma once

#include <cstdint>
#include <limits>
#include <shared_mutex>
#include <vector>

#include "thread_pool.h"

namespace embedlab {

class HashTable {
 public:
  // Slots are allocated for at least initial_capacity keys (rounded up to a power of two at
  // twice that), at least 16 slots.
  explicit HashTable(int64_t initial_capacity = 1024);
  HashTable(const HashTable&) = delete;
  HashTable& operator=(const HashTable&) = delete;

  int64_t size() const;
  // Number of slots (a power of two; size() <= capacity() / 2).
  int64_t capacity() const;
  // Removes every key and gives the memory back (capacity returns to the initial one).
  void clear();
  // Grows (never shrinks) so that n keys fit without a rehash.
  void reserve(int64_t n);

  // values_out[i] = value of keys[i], or -1 where keys[i] is absent. Batches of at least
  // kParallelThreshold keys are split over pool (nullptr = calling thread only).
  void find(const int64_t* keys, int64_t n, int64_t* values_out, ThreadPool* pool) const;

  // Like find, then inserts the absent keys: an absent key gets value = size() at insertion,
  // the first occurrence in input order first (a key repeated in the batch gets one value).
  // Returns the number of keys inserted. If max_size > 0 and size() would pass max_size,
  // inserts nothing, writes the first key in input order that would not fit to
  // *first_overflow_key (if not null), leaves values_out as find would (-1 for absent keys)
  // and returns -1.
  int64_t find_or_insert(const int64_t* keys, int64_t n, int64_t* values_out, int64_t max_size,
                         ThreadPool* pool, int64_t* first_overflow_key);

  // table[keys[i]] = values[i] for i in order (a later duplicate wins); inserts absent keys.
  void insert_or_assign(const int64_t* keys, const int64_t* values, int64_t n);

  // Removes the keys present; returns how many were removed (a duplicate counts once).
  int64_t erase(const int64_t* keys, int64_t n);

  // Writes size() entries, ordered by ascending value then ascending key (deterministic:
  // independent of insertion history and capacity). Returns the count written.
  int64_t export_entries(int64_t* keys_out, int64_t* values_out) const;
  // export_entries for callers that size their buffers from an earlier size(): writes nothing
  // and returns false when size() != expected_size by the time the read lock is held (a writer
  // ran in between); the caller then retries with the new size.
  bool export_entries_if_size(int64_t* keys_out, int64_t* values_out, int64_t expected_size) const;

  static constexpr int64_t kEmptyKey = std::numeric_limits<int64_t>::min();
  static constexpr int64_t kParallelThreshold = 16384;
  // Most keys a table may hold (its slot array would be 32 TiB); more throws std::length_error.
  static constexpr int64_t kMaxKeys = int64_t{1} << 40;

 private:
  struct Slot {
    int64_t key;
    int64_t value;
  };

  static uint64_t hash(int64_t key) {
    // splitmix64's finalizer: sequential and strided keys spread over every bit.
    uint64_t x = static_cast<uint64_t>(key);
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
  }

  // All below assume the caller holds the lock (shared for lookups, exclusive for the rest).
  int64_t lookup_locked(int64_t key) const;
  const int64_t* value_ptr_locked(int64_t key) const;  // nullptr when absent
  void find_range_locked(const int64_t* keys, int64_t begin, int64_t end, int64_t* out) const;
  // Returns true if inserted (value set), false if present (value left unchanged).
  bool insert_locked(int64_t key, int64_t value, int64_t** value_slot);
  bool erase_locked(int64_t key);
  int64_t export_locked(int64_t* keys_out, int64_t* values_out) const;
  void rehash_locked(int64_t new_capacity);
  void grow_for_locked(int64_t n_keys);
  static int64_t capacity_for(int64_t n_keys);

  mutable std::shared_mutex mu_;
  int64_t initial_capacity_;
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  int64_t size_in_slots_ = 0;     // keys stored in slots_
  bool has_empty_key_ = false;    // the key equal to kEmptyKey, stored out of line
  int64_t empty_key_value_ = -1;
};

}  // namespace embedlab

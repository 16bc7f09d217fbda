// CPU implementation of the concurrent int64 hash table (contract and locking in hash_table.h).
#include "hash_table.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

namespace embedlab {

namespace {
// Rough nanoseconds per key of a lookup in a table larger than the caches (one miss).
constexpr int64_t kFindCostNs = 100;
// Keys whose slots are prefetched before any of them is probed: enough misses in flight to
// cover memory latency, few enough that the slots are still in L1 when probed.
constexpr int kPrefetchGroup = 16;
}  // namespace

int64_t HashTable::capacity_for(int64_t n_keys) {
  if (n_keys > kMaxKeys)
    throw std::length_error("HashTable: " + std::to_string(n_keys) + " keys exceed the maximum of " +
                            std::to_string(kMaxKeys));
  int64_t cap = 16;
  while (cap / 2 < n_keys) cap *= 2;
  return cap;
}

HashTable::HashTable(int64_t initial_capacity) : initial_capacity_(std::max<int64_t>(initial_capacity, 1)) {
  rehash_locked(capacity_for(initial_capacity_));
}

int64_t HashTable::size() const {
  std::shared_lock<std::shared_mutex> l(mu_);
  return size_in_slots_ + (has_empty_key_ ? 1 : 0);
}

int64_t HashTable::capacity() const {
  std::shared_lock<std::shared_mutex> l(mu_);
  return static_cast<int64_t>(slots_.size());
}

void HashTable::clear() {
  std::unique_lock<std::shared_mutex> l(mu_);
  std::vector<Slot>().swap(slots_);  // give the memory back before allocating the small array
  size_in_slots_ = 0;
  has_empty_key_ = false;
  empty_key_value_ = -1;
  rehash_locked(capacity_for(initial_capacity_));
}

void HashTable::reserve(int64_t n) {
  std::unique_lock<std::shared_mutex> l(mu_);
  grow_for_locked(n);
}

void HashTable::grow_for_locked(int64_t n_keys) {
  const int64_t cap = capacity_for(n_keys);
  if (cap > static_cast<int64_t>(slots_.size())) rehash_locked(cap);
}

void HashTable::rehash_locked(int64_t new_capacity) {
  std::vector<Slot> fresh(static_cast<size_t>(new_capacity), Slot{kEmptyKey, -1});
  const uint64_t mask = static_cast<uint64_t>(new_capacity) - 1;
  for (const Slot& s : slots_) {
    if (s.key == kEmptyKey) continue;
    uint64_t i = hash(s.key) & mask;
    while (fresh[i].key != kEmptyKey) i = (i + 1) & mask;
    fresh[i] = s;
  }
  slots_.swap(fresh);
  mask_ = mask;
}

const int64_t* HashTable::value_ptr_locked(int64_t key) const {
  if (key == kEmptyKey) return has_empty_key_ ? &empty_key_value_ : nullptr;
  uint64_t i = hash(key) & mask_;
  const Slot* slots = slots_.data();
  for (;;) {
    const Slot& s = slots[i];
    if (s.key == key) return &s.value;
    if (s.key == kEmptyKey) return nullptr;
    i = (i + 1) & mask_;
  }
}

int64_t HashTable::lookup_locked(int64_t key) const {
  const int64_t* p = value_ptr_locked(key);
  return p != nullptr ? *p : -1;
}

void HashTable::find_range_locked(const int64_t* keys, int64_t begin, int64_t end, int64_t* out) const {
  const Slot* slots = slots_.data();
  const uint64_t mask = mask_;
  uint64_t home[kPrefetchGroup];
  for (int64_t g = begin; g < end; g += kPrefetchGroup) {
    const int m = static_cast<int>(std::min<int64_t>(kPrefetchGroup, end - g));
    for (int j = 0; j < m; ++j) {
      home[j] = hash(keys[g + j]) & mask;
      __builtin_prefetch(&slots[home[j]], 0, 1);
    }
    for (int j = 0; j < m; ++j) {
      const int64_t key = keys[g + j];
      int64_t v = -1;
      if (key == kEmptyKey) {
        if (has_empty_key_) v = empty_key_value_;
      } else {
        uint64_t i = home[j];
        for (;;) {
          const Slot& s = slots[i];
          if (s.key == key) {
            v = s.value;
            break;
          }
          if (s.key == kEmptyKey) break;
          i = (i + 1) & mask;
        }
      }
      out[g + j] = v;
    }
  }
}

bool HashTable::insert_locked(int64_t key, int64_t value, int64_t** value_slot) {
  if (key == kEmptyKey) {
    if (has_empty_key_) {
      *value_slot = &empty_key_value_;
      return false;
    }
    has_empty_key_ = true;
    empty_key_value_ = value;
    *value_slot = &empty_key_value_;
    return true;
  }
  // Grow before probing so that the slot found stays valid.
  if ((size_in_slots_ + 1) * 2 > static_cast<int64_t>(slots_.size())) grow_for_locked(size_in_slots_ + 1);
  uint64_t i = hash(key) & mask_;
  Slot* slots = slots_.data();
  for (;;) {
    Slot& s = slots[i];
    if (s.key == key) {
      *value_slot = &s.value;
      return false;
    }
    if (s.key == kEmptyKey) {
      s.key = key;
      s.value = value;
      ++size_in_slots_;
      *value_slot = &s.value;
      return true;
    }
    i = (i + 1) & mask_;
  }
}

bool HashTable::erase_locked(int64_t key) {
  if (key == kEmptyKey) {
    const bool had = has_empty_key_;
    has_empty_key_ = false;
    empty_key_value_ = -1;
    return had;
  }
  Slot* slots = slots_.data();
  uint64_t i = hash(key) & mask_;
  for (;;) {
    if (slots[i].key == key) break;
    if (slots[i].key == kEmptyKey) return false;
    i = (i + 1) & mask_;
  }
  // Backward-shift deletion: pull later members of the probe run into the hole when their home
  // slot does not lie cyclically in (hole, j], so every key stays reachable from its home.
  uint64_t j = i;
  for (;;) {
    j = (j + 1) & mask_;
    if (slots[j].key == kEmptyKey) break;
    const uint64_t k = hash(slots[j].key) & mask_;
    const bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
    if (!stays) {
      slots[i] = slots[j];
      i = j;
    }
  }
  slots[i].key = kEmptyKey;
  slots[i].value = -1;
  --size_in_slots_;
  return true;
}

void HashTable::find(const int64_t* keys, int64_t n, int64_t* values_out, ThreadPool* pool) const {
  if (n <= 0) return;
  std::shared_lock<std::shared_mutex> l(mu_);
  if (pool != nullptr && pool->num_threads() > 1 && n >= kParallelThreshold) {
    pool->parallel_for(n, kFindCostNs,
                       [&](int64_t b, int64_t e) { find_range_locked(keys, b, e, values_out); });
  } else {
    find_range_locked(keys, 0, n, values_out);
  }
}

int64_t HashTable::find_or_insert(const int64_t* keys, int64_t n, int64_t* values_out, int64_t max_size,
                                  ThreadPool* pool, int64_t* first_overflow_key) {
  if (n <= 0) return 0;
  // Pass 1 (shared lock, parallel): most batches of a trained model hit known keys only.
  find(keys, n, values_out, pool);
  std::vector<int64_t> missing;
  for (int64_t i = 0; i < n; ++i)
    if (values_out[i] == -1) missing.push_back(i);
  if (missing.empty()) return 0;

  // Pass 2 (exclusive lock, serial, input order): values are assigned deterministically.
  // insert_locked probes again and keeps a key found present: a concurrent writer may have
  // added it since pass 1, a repeated key was inserted by its first occurrence, and a key
  // stored with value -1 (insert_or_assign) reads as absent in pass 1.
  std::unique_lock<std::shared_mutex> l(mu_);
  std::vector<int64_t> inserted_keys;
  inserted_keys.reserve(missing.size());  // push_back below never allocates
  constexpr size_t kAhead = 8;  // prefetch the home slot of the key kAhead misses ahead
  try {
    for (size_t m = 0; m < missing.size(); ++m) {
      if (m + kAhead < missing.size())
        __builtin_prefetch(&slots_[hash(keys[missing[m + kAhead]]) & mask_], 1, 1);
      const int64_t i = missing[m];
      const int64_t key = keys[i];
      const int64_t cur_size = size_in_slots_ + (has_empty_key_ ? 1 : 0);
      if (max_size > 0 && cur_size + 1 > max_size && value_ptr_locked(key) == nullptr) {
        if (first_overflow_key != nullptr) *first_overflow_key = key;
        for (int64_t k : inserted_keys) erase_locked(k);  // nothing of this call stays
        for (int64_t p : missing) values_out[p] = lookup_locked(keys[p]);
        return -1;
      }
      int64_t* slot = nullptr;
      if (insert_locked(key, cur_size, &slot)) inserted_keys.push_back(key);
      values_out[i] = *slot;
    }
  } catch (...) {  // out of memory in a rehash: the call inserts nothing (erase never allocates)
    for (int64_t k : inserted_keys) erase_locked(k);
    throw;
  }
  return static_cast<int64_t>(inserted_keys.size());
}

void HashTable::insert_or_assign(const int64_t* keys, const int64_t* values, int64_t n) {
  if (n <= 0) return;
  std::unique_lock<std::shared_mutex> l(mu_);
  for (int64_t i = 0; i < n; ++i) {
    int64_t* slot = nullptr;
    insert_locked(keys[i], values[i], &slot);
    *slot = values[i];
  }
}

int64_t HashTable::erase(const int64_t* keys, int64_t n) {
  if (n <= 0) return 0;
  std::unique_lock<std::shared_mutex> l(mu_);
  int64_t removed = 0;
  for (int64_t i = 0; i < n; ++i) removed += erase_locked(keys[i]) ? 1 : 0;
  return removed;
}

int64_t HashTable::export_entries(int64_t* keys_out, int64_t* values_out) const {
  std::shared_lock<std::shared_mutex> l(mu_);
  return export_locked(keys_out, values_out);
}

bool HashTable::export_entries_if_size(int64_t* keys_out, int64_t* values_out, int64_t expected_size) const {
  std::shared_lock<std::shared_mutex> l(mu_);
  if (size_in_slots_ + (has_empty_key_ ? 1 : 0) != expected_size) return false;
  export_locked(keys_out, values_out);
  return true;
}

int64_t HashTable::export_locked(int64_t* keys_out, int64_t* values_out) const {
  std::vector<std::pair<int64_t, int64_t>> entries;  // (value, key)
  entries.reserve(static_cast<size_t>(size_in_slots_ + 1));
  if (has_empty_key_) entries.emplace_back(empty_key_value_, kEmptyKey);
  for (const Slot& s : slots_)
    if (s.key != kEmptyKey) entries.emplace_back(s.value, s.key);
  std::sort(entries.begin(), entries.end());
  for (size_t i = 0; i < entries.size(); ++i) {
    keys_out[i] = entries[i].second;
    values_out[i] = entries[i].first;
  }
  return static_cast<int64_t>(entries.size());
}

}  // namespace embedlab

// What the two EmbeddingCache bindings (embedding_cache_bindings.cc on the CPU,
// embedding_cache_cuda_bindings.cc on the GPU) share: the constructor's checks and stats().
#pragma once
#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>

#include "common.h"
#include "embedding_cache.h"

namespace embedlab_py {

// The constructor arguments both bindings check first.
inline void check_cache_args(const char* fn, int64_t capacity, int64_t dim, int ways) {
  if (capacity < 1) fail(fn, "capacity must be >= 1, got " + std::to_string(capacity));
  if (dim < 1) fail(fn, "dim must be >= 1, got " + std::to_string(dim));
  if (ways < 1 || ways > embedlab::kEmbeddingCacheMaxWays)
    fail(fn, "ways must be in [1, " + std::to_string(embedlab::kEmbeddingCacheMaxWays) + "], got " +
                 std::to_string(ways));
}

// stats(): the counters, size and capacity.
inline nb::dict cache_stats_dict(const embedlab::EmbeddingCacheStats& s, int64_t size, int64_t capacity) {
  nb::dict d;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["inserts"] = s.inserts;
  d["evictions"] = s.evictions;
  d["updates"] = s.updates;
  d["erases"] = s.erases;
  d["rejected"] = s.rejected;
  d["size"] = size;
  d["capacity"] = capacity;
  return d;
}

}  // namespace embedlab_py

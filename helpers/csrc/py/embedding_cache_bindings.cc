// EmbeddingCache: the HPS set-associative embedding cache (csrc/core/embedding_cache.h) over
// NumPy arrays. Thin: validate, translate, call core with the GIL released, so several Python
// threads can look up and insert at once (the core's per-set seqlocks make that safe).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <string>

#include "common.h"
#include "embedding_cache.h"
#include "embedding_cache_bindings.h"
#include "registry.h"

namespace nb = nanobind;
using namespace embedlab;
using namespace embedlab_py;

namespace {

class PyEmbeddingCache {
 public:
  PyEmbeddingCache(int64_t capacity, int64_t dim, int ways, bool is_static, int num_threads) {
    const char* fn = "EmbeddingCache";
    check_cache_args(fn, capacity, dim, ways);
    if (num_threads < 0) fail(fn, "num_threads must be >= 0 (0 = all cores), got " + std::to_string(num_threads));
    cache_ = std::make_unique<EmbeddingCacheCpu>(capacity, dim, ways, is_static);
    pool_ = &pool(num_threads);
  }

  nb::ndarray<nb::numpy, int64_t> lookup(const In& keys, Arr out) {
    const int64_t n = expect_keys_rows("EmbeddingCache.lookup", keys, "out", out, cache_->dim(), false);
    Owned<int64_t> missing(static_cast<size_t>(n));
    int64_t m;
    {
      nb::gil_scoped_release r;
      m = cache_->lookup(static_cast<const int64_t*>(keys.data()), n, static_cast<float*>(out.data()),
                         missing.data.get(), *pool_);
    }
    return missing.release({static_cast<size_t>(m)});
  }

  int64_t insert(const In& keys, const In& values) {
    const int64_t n = expect_keys_rows("EmbeddingCache.insert", keys, "values", values, cache_->dim(), false);
    nb::gil_scoped_release r;
    return cache_->insert(static_cast<const int64_t*>(keys.data()), static_cast<const float*>(values.data()), n,
                          *pool_);
  }

  int64_t update(const In& keys, const In& values) {
    const char* fn = "EmbeddingCache.update";
    const int64_t n = expect_keys_rows(fn, keys, "values", values, cache_->dim(), false);
    if (cache_->is_static()) fail(fn, "this cache is static (read-only once filled); use a dynamic cache to update rows");
    nb::gil_scoped_release r;
    return cache_->update(static_cast<const int64_t*>(keys.data()), static_cast<const float*>(values.data()), n,
                          *pool_);
  }

  int64_t erase(const In& keys) {
    const char* fn = "EmbeddingCache.erase";
    expect<int64_t>(fn, "keys", keys, 1, false);
    if (cache_->is_static()) fail(fn, "this cache is static (read-only once filled); use a dynamic cache to erase rows");
    nb::gil_scoped_release r;
    return cache_->erase(static_cast<const int64_t*>(keys.data()), static_cast<int64_t>(keys.shape(0)), *pool_);
  }

  void clear() {
    nb::gil_scoped_release r;
    cache_->clear();
  }

  nb::dict stats() const {
    return cache_stats_dict(cache_->stats(), cache_->size(), cache_->capacity());
  }

  const EmbeddingCacheCpu& core() const { return *cache_; }

 private:
  std::unique_ptr<EmbeddingCacheCpu> cache_;
  ThreadPool* pool_ = nullptr;
};

}  // namespace

EMBEDLAB_PY_BINDINGS(embedding_cache) {
  nb::class_<PyEmbeddingCache>(
      m, "EmbeddingCache",
      "The HPS embedding cache on the CPU: a set-associative int64 key -> float32[dim] row cache.\n\n"
      "capacity is rounded up to a multiple of `ways` (see .capacity). A key lives in one set of\n"
      "`ways` slots chosen by its hash; a dynamic cache evicts the least recently used slot of a\n"
      "full set (LRU at the granularity of insert() calls: the lookups between two inserts count\n"
      "as one moment); a static cache (static=True) only fills free slots and is\n"
      "read-only afterwards (update/erase raise; lookups write nothing). Thread-safe: lookups and\n"
      "inserts may run from several threads at once and never return a torn or foreign row.\n\n"
      "Example:\n"
      "    c = EmbeddingCache(1024, 16)\n"
      "    c.insert(np.arange(10, dtype=np.int64), np.ones((10, 16), np.float32))\n"
      "    out = np.empty((3, 16), np.float32)\n"
      "    missing = c.lookup(np.array([1, 99, 2]), out)   # -> array([1]); out[0], out[2] written")
      .def(nb::init<int64_t, int64_t, int, bool, int>(), nb::arg("capacity"), nb::arg("dim"), nb::arg("ways") = 8,
           nb::arg("static") = false, nb::arg("num_threads") = 0)
      .def("lookup", &PyEmbeddingCache::lookup, nb::arg("keys"), nb::arg("out"),
           "Copies the cached rows of keys (int64[n]) into out (float32[n, dim]); returns the positions\n"
           "(int64[m], ascending) whose rows were NOT written (misses). Duplicates are looked up each time.")
      .def("insert", &PyEmbeddingCache::insert, nb::arg("keys"), nb::arg("values"),
           "Stores values[i] (float32[n, dim]) under keys[i]; a present key is overwritten (dynamic),\n"
           "a full set evicts its least recently used slot (dynamic) or stores nothing (static).\n"
           "A key repeated in one call: the last value wins. Returns the number of positions stored.")
      .def("update", &PyEmbeddingCache::update, nb::arg("keys"), nb::arg("values"),
           "Overwrites the rows of present keys only; returns how many positions were present.")
      .def("erase", &PyEmbeddingCache::erase, nb::arg("keys"), "Removes present keys; returns the number removed.")
      .def("clear", &PyEmbeddingCache::clear)
      .def("size", [](const PyEmbeddingCache& c) { return c.core().size(); }, "Number of cached rows.")
      .def("stats", &PyEmbeddingCache::stats,
           "dict: hits, misses, inserts, evictions, updates, erases, rejected, size, capacity.")
      .def_prop_ro("capacity", [](const PyEmbeddingCache& c) { return c.core().capacity(); })
      .def_prop_ro("dim", [](const PyEmbeddingCache& c) { return c.core().dim(); })
      .def_prop_ro("ways", [](const PyEmbeddingCache& c) { return c.core().ways(); })
      .def_prop_ro("num_sets", [](const PyEmbeddingCache& c) { return c.core().num_sets(); })
      .def_prop_ro("static", [](const PyEmbeddingCache& c) { return c.core().is_static(); })
      .def("__len__", [](const PyEmbeddingCache& c) { return c.core().size(); })
      .def("__repr__", [](const PyEmbeddingCache& c) {
        const auto& k = c.core();
        return "EmbeddingCache(capacity=" + std::to_string(k.capacity()) + ", dim=" + std::to_string(k.dim()) +
               ", ways=" + std::to_string(k.ways()) + ", static=" + (k.is_static() ? "True" : "False") +
               ", size=" + std::to_string(k.size()) + ")";
      });
}

// HashMapStore: the HPS in-process volatile database (HugeCTR's hash_map / parallel_hash_map,
// csrc/core/hash_map_store.h) over NumPy arrays. Thin: validate, translate, call core with the
// GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common.h"
#include "hash_map_store.h"
#include "registry.h"

namespace nb = nanobind;
using namespace embedlab;
using namespace embedlab_py;

namespace {

class PyHashMapStore {
 public:
  PyHashMapStore(int64_t dim, int num_partitions, int64_t overflow_margin, const std::string& overflow_policy,
                 double overflow_resolution_target, bool parallel, int num_threads) {
    const char* fn = "HashMapStore";
    if (dim < 1) fail(fn, "dim must be >= 1, got " + std::to_string(dim));
    if (num_partitions < 1 || num_partitions > 4096)
      fail(fn, "num_partitions must be in [1, 4096], got " + std::to_string(num_partitions));
    if (overflow_margin < 0)
      fail(fn, "overflow_margin must be >= 0 (0 = unlimited), got " + std::to_string(overflow_margin));
    OverflowPolicy policy;
    if (!parse_overflow_policy(overflow_policy, &policy))
      fail(fn, "overflow_policy must be 'evict_random', 'evict_least_used' or 'evict_oldest', got '" +
                   overflow_policy + "'");
    if (!(overflow_resolution_target > 0.0 && overflow_resolution_target <= 1.0))
      fail(fn, "overflow_resolution_target must be in (0, 1], got " + std::to_string(overflow_resolution_target));
    if (num_threads < 0) fail(fn, "num_threads must be >= 0 (0 = all cores), got " + std::to_string(num_threads));
    store_ = std::make_unique<HashMapStore>(dim, num_partitions, overflow_margin, policy, overflow_resolution_target,
                                            parallel);
    pool_ = &pool(num_threads);
  }

  nb::ndarray<nb::numpy, int64_t> find(const In& keys, Arr out) {
    const int64_t n = expect_keys_rows("HashMapStore.find", keys, "out", out, store_->dim(), false);
    Owned<int64_t> missing(static_cast<size_t>(n));
    int64_t m;
    {
      nb::gil_scoped_release r;
      m = store_->find(static_cast<const int64_t*>(keys.data()), n, static_cast<float*>(out.data()),
                       missing.data.get(), *pool_);
    }
    return missing.release({static_cast<size_t>(m)});
  }

  int64_t insert(const In& keys, const In& values) {
    const int64_t n = expect_keys_rows("HashMapStore.insert", keys, "values", values, store_->dim(), false);
    nb::gil_scoped_release r;
    return store_->insert(static_cast<const int64_t*>(keys.data()), static_cast<const float*>(values.data()), n,
                          *pool_);
  }

  int64_t erase(const In& keys) {
    expect<int64_t>("HashMapStore.erase", "keys", keys, 1, false);
    nb::gil_scoped_release r;
    return store_->erase(static_cast<const int64_t*>(keys.data()), static_cast<int64_t>(keys.shape(0)), *pool_);
  }

  std::tuple<nb::ndarray<nb::numpy, int64_t>, nb::ndarray<nb::numpy, float>> export_all() const {
    std::vector<int64_t> keys;
    std::vector<float> values;
    {
      nb::gil_scoped_release r;
      store_->export_entries(&keys, &values);
    }
    const size_t m = keys.size();
    auto k = from_vector(std::move(keys), {m});
    auto v = from_vector(std::move(values), {m, static_cast<size_t>(store_->dim())});
    return {k, v};
  }

  nb::dict stats() const {
    const HashMapStoreStats s = store_->stats();
    nb::dict d;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["inserts"] = s.inserts;
    d["overwrites"] = s.overwrites;
    d["evictions"] = s.evictions;
    d["erases"] = s.erases;
    d["size"] = store_->size();
    return d;
  }

  HashMapStore& core() { return *store_; }
  const HashMapStore& core() const { return *store_; }

 private:
  std::unique_ptr<HashMapStore> store_;
  ThreadPool* pool_ = nullptr;
};

}  // namespace

EMBEDLAB_PY_BINDINGS(hash_map_store) {
  nb::class_<PyHashMapStore>(
      m, "HashMapStore",
      "The HPS in-process volatile database (HugeCTR's hash_map / parallel_hash_map): rows of `dim`\n"
      "float32 under int64 keys, in `num_partitions` partitions chosen by key hash. With\n"
      "overflow_margin > 0, an insert that leaves a partition above overflow_margin rows evicts down\n"
      "to floor(overflow_margin * overflow_resolution_target) rows by overflow_policy:\n"
      "'evict_random', 'evict_least_used' (fewest accesses) or 'evict_oldest' (oldest last access).\n"
      "parallel=True runs the partitions of one call on a thread pool (parallel_hash_map).\n\n"
      "Example:\n"
      "    s = HashMapStore(16, num_partitions=4, overflow_margin=1000, overflow_policy='evict_oldest')\n"
      "    s.insert(keys, values)\n"
      "    missing = s.find(keys, out)")
      .def(nb::init<int64_t, int, int64_t, const std::string&, double, bool, int>(), nb::arg("dim"),
           nb::arg("num_partitions") = 16, nb::arg("overflow_margin") = 0, nb::arg("overflow_policy") = "evict_random",
           nb::arg("overflow_resolution_target") = 0.8, nb::arg("parallel") = true, nb::arg("num_threads") = 0)
      .def("find", &PyHashMapStore::find, nb::arg("keys"), nb::arg("out"),
           "Copies the stored rows of keys (int64[n]) into out (float32[n, dim]); returns the positions\n"
           "(int64[m], ascending) that were not found (their out rows are untouched).")
      .def("insert", &PyHashMapStore::insert, nb::arg("keys"), nb::arg("values"),
           "Inserts or overwrites (a key repeated in one call: the last value wins), then evicts per\n"
           "overflow_policy where a partition passed overflow_margin. Returns the number of new rows.")
      .def("erase", &PyHashMapStore::erase, nb::arg("keys"), "Removes present keys; returns the number removed.")
      .def("clear", [](PyHashMapStore& s) {
        nb::gil_scoped_release r;
        s.core().clear();
      })
      .def("size", [](const PyHashMapStore& s) { return s.core().size(); })
      .def("__len__", [](const PyHashMapStore& s) { return s.core().size(); })
      .def("partition_sizes", [](const PyHashMapStore& s) { return s.core().partition_sizes(); })
      .def("partition_of",
           [](const PyHashMapStore& s, const In& keys) {
             expect<int64_t>("HashMapStore.partition_of", "keys", keys, 1, false);
             Owned<int64_t> out(keys.shape(0));
             const int64_t* k = static_cast<const int64_t*>(keys.data());
             for (size_t i = 0; i < keys.shape(0); ++i) out.data[i] = s.core().partition_of(k[i]);
             return out.release({keys.shape(0)});
           },
           nb::arg("keys"), "The partition of each key (int64[n]).")
      .def("export", &PyHashMapStore::export_all, "Every row: (keys int64[m], values float32[m, dim]).")
      .def("stats", &PyHashMapStore::stats, "dict: hits, misses, inserts, overwrites, evictions, erases, size.")
      .def_prop_ro("dim", [](const PyHashMapStore& s) { return s.core().dim(); })
      .def_prop_ro("num_partitions", [](const PyHashMapStore& s) { return s.core().num_partitions(); })
      .def_prop_ro("overflow_margin", [](const PyHashMapStore& s) { return s.core().overflow_margin(); })
      .def_prop_ro("overflow_policy",
                   [](const PyHashMapStore& s) { return std::string(overflow_policy_name(s.core().overflow_policy())); })
      .def_prop_ro("overflow_resolution_target",
                   [](const PyHashMapStore& s) { return s.core().overflow_resolution_target(); })
      .def_prop_ro("parallel", [](const PyHashMapStore& s) { return s.core().parallel(); })
      .def("__repr__", [](const PyHashMapStore& s) {
        const auto& k = s.core();
        return "HashMapStore(dim=" + std::to_string(k.dim()) + ", num_partitions=" + std::to_string(k.num_partitions()) +
               ", overflow_margin=" + std::to_string(k.overflow_margin()) + ", overflow_policy='" +
               overflow_policy_name(k.overflow_policy()) + "', size=" + std::to_string(k.size()) + ")";
      });
}

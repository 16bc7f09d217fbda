// HashTable: the core concurrent int64 -> int64 table (csrc/core/hash_table.h) for callers
// without TensorFlow (the HPS server, the Session's working set, benchmarks). Inputs are 1-D
// C-contiguous int64 NumPy arrays (anything else is refused with a message naming the
// argument); outputs are new NumPy arrays. The GIL is released around every core call, so
// several Python threads can use one table at once (the table's own reader/writer lock keeps
// them consistent).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <string>
#include <tuple>

#include "common.h"
#include "hash_table.h"
#include "registry.h"

namespace nb = nanobind;
using embedlab_py::dtype_name;

namespace {

using AnyArray = nb::ndarray<nb::ro, nb::device::cpu>;
using OutI64 = nb::ndarray<nb::numpy, int64_t>;

struct KeyView {
  AnyArray array;  // keeps the NumPy array alive while the GIL is released
  const int64_t* data = nullptr;
  int64_t n = 0;
};

KeyView int64_vector(const char* fn, const char* arg, nb::handle obj) {
  KeyView v;
  if (!nb::try_cast(obj, v.array, /*convert=*/false)) {
    throw nb::type_error((std::string(fn) + ": " + arg + " must be a 1-D C-contiguous int64 NumPy array, got " +
                          nb::type_name(obj.type()).c_str())
                             .c_str());
  }
  if (v.array.dtype() != nb::dtype<int64_t>())
    throw nb::type_error((std::string(fn) + ": " + arg + " must have dtype int64, got " +
                          dtype_name(v.array.dtype()) + " (convert with np.asarray(" + arg +
                          ", dtype=np.int64))")
                             .c_str());
  if (v.array.ndim() != 1)
    throw nb::value_error((std::string(fn) + ": " + arg + " must be 1-D, got " + std::to_string(v.array.ndim()) +
                           "-D (flatten it with .reshape(-1))")
                              .c_str());
  if (v.array.shape(0) > 1 && v.array.stride(0) != 1)
    throw nb::value_error((std::string(fn) + ": " + arg +
                           " must be C-contiguous (use np.ascontiguousarray(" + arg + "))")
                              .c_str());
  v.data = static_cast<const int64_t*>(v.array.data());
  v.n = static_cast<int64_t>(v.array.shape(0));
  return v;
}

OutI64 new_int64(int64_t n) { return embedlab_py::new_array<int64_t>({static_cast<size_t>(n)}); }

class PyHashTable {
 public:
  PyHashTable(int64_t initial_capacity, int num_threads)
      : table_(initial_capacity), pool_(&embedlab_py::pool(num_threads)) {}

  OutI64 find(nb::handle keys_obj) {
    KeyView keys = int64_vector("HashTable.find", "keys", keys_obj);
    OutI64 out = new_int64(keys.n);
    int64_t* o = out.data();
    {
      nb::gil_scoped_release release;
      table_.find(keys.data, keys.n, o, pool_);
    }
    return out;
  }

  OutI64 find_or_insert(nb::handle keys_obj, int64_t max_size) {
    const char* fn = "HashTable.find_or_insert";
    if (max_size < 0)
      throw nb::value_error((std::string(fn) + ": max_size must be >= 0 (0 = unlimited), got " +
                             std::to_string(max_size))
                                .c_str());
    KeyView keys = int64_vector(fn, "keys", keys_obj);
    OutI64 out = new_int64(keys.n);
    int64_t* o = out.data();
    int64_t inserted, bad_key = 0, size_now;
    {
      nb::gil_scoped_release release;
      inserted = table_.find_or_insert(keys.data, keys.n, o, max_size, pool_, &bad_key);
      size_now = table_.size();
    }
    if (inserted < 0)
      throw nb::value_error((std::string(fn) + ": key " + std::to_string(bad_key) +
                             " does not fit: the table holds " + std::to_string(size_now) +
                             " keys and max_size is " + std::to_string(max_size) + "; nothing was inserted")
                                .c_str());
    return out;
  }

  void insert_or_assign(nb::handle keys_obj, nb::handle values_obj) {
    const char* fn = "HashTable.insert_or_assign";
    KeyView keys = int64_vector(fn, "keys", keys_obj);
    KeyView values = int64_vector(fn, "values", values_obj);
    if (keys.n != values.n)
      throw nb::value_error((std::string(fn) + ": keys has " + std::to_string(keys.n) + " entries but values has " +
                             std::to_string(values.n))
                                .c_str());
    nb::gil_scoped_release release;
    table_.insert_or_assign(keys.data, values.data, keys.n);
  }

  int64_t erase(nb::handle keys_obj) {
    KeyView keys = int64_vector("HashTable.erase", "keys", keys_obj);
    nb::gil_scoped_release release;
    return table_.erase(keys.data, keys.n);
  }

  std::tuple<OutI64, OutI64> export_entries() {
    // size() and export_entries() are two calls: a writer in another thread may change the
    // size in between, so allocate under the GIL for the size seen, then retry if it moved.
    for (;;) {
      const int64_t n = table_.size();
      OutI64 keys = new_int64(n), values = new_int64(n);
      int64_t *k = keys.data(), *v = values.data();
      bool ok;
      {
        nb::gil_scoped_release release;
        ok = table_.export_entries_if_size(k, v, n);
      }
      if (ok) return {keys, values};
    }
  }

  int64_t size() const { return table_.size(); }
  int64_t capacity() const { return table_.capacity(); }
  int num_threads() const { return pool_->num_threads(); }
  void clear() {
    nb::gil_scoped_release release;
    table_.clear();
  }
  void reserve(int64_t n) {
    if (n < 0) throw nb::value_error(("HashTable.reserve: n must be >= 0, got " + std::to_string(n)).c_str());
    nb::gil_scoped_release release;
    table_.reserve(n);
  }

 private:
  embedlab::HashTable table_;
  embedlab::ThreadPool* pool_;
};

}  // namespace

EMBEDLAB_PY_BINDINGS(hash_table) {
  nb::class_<PyHashTable>(m, "HashTable",
                          "Concurrent int64 -> int64 hash table (open addressing, linear probing).\n\n"
                          "Any int64 is a valid key. find_or_insert gives new keys dense values\n"
                          "(size() at insertion, first occurrence in input order first), the same\n"
                          "whatever the thread count. Thread-safe: reads share a reader/writer lock,\n"
                          "writes take it exclusively; the GIL is released during every call.\n\n"
                          "Args: initial_capacity: keys that fit before the first rehash;\n"
                          "  num_threads: threads for batches of >= 16384 keys (0: one per hardware\n"
                          "  thread; 1: the calling thread only), from the process-wide pool of that\n"
                          "  thread count that every table and kernel call of that count shares.")
      .def(
          "__init__",
          [](PyHashTable* self, int64_t initial_capacity, int num_threads) {
            if (initial_capacity < 1)
              throw nb::value_error(("HashTable: initial_capacity must be >= 1, got " +
                                     std::to_string(initial_capacity))
                                        .c_str());
            if (num_threads < 0)
              throw nb::value_error(("HashTable: num_threads must be >= 0, got " + std::to_string(num_threads)).c_str());
            new (self) PyHashTable(initial_capacity, num_threads);
          },
          nb::arg("initial_capacity") = 1024, nb::arg("num_threads") = 0)
      .def("find", &PyHashTable::find, nb::arg("keys"),
           "values[i] = value of keys[i], or -1 where keys[i] is absent.")
      .def("find_or_insert", &PyHashTable::find_or_insert, nb::arg("keys"), nb::arg("max_size") = 0,
           "Values of keys, inserting absent ones with dense values. max_size > 0 caps size();\n"
           "a batch that would pass it raises ValueError naming the first key that does not\n"
           "fit, and inserts nothing.")
      .def("insert_or_assign", &PyHashTable::insert_or_assign, nb::arg("keys"), nb::arg("values"),
           "table[keys[i]] = values[i] in order (a later duplicate wins).")
      .def("erase", &PyHashTable::erase, nb::arg("keys"), "Removes keys; returns how many were present.")
      .def("export", &PyHashTable::export_entries,
           "(keys, values) of every entry, ordered by ascending value, then key.")
      .def("size", &PyHashTable::size)
      .def("__len__", &PyHashTable::size)
      .def("capacity", &PyHashTable::capacity, "Slots allocated (a power of two, >= 2 * size()).")
      .def("reserve", &PyHashTable::reserve, nb::arg("n"), "Grows so that n keys fit without a rehash.")
      .def("clear", &PyHashTable::clear, "Removes every key and frees the memory.")
      .def_prop_ro("num_threads", &PyHashTable::num_threads);
}

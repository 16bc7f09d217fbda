// Argument checks and result arrays shared by the HPS bindings (embedding_cache_bindings.cc,
// hash_map_store_bindings.cc, embedding_cache_cuda_bindings.cc). Arrays are taken untyped so
// that a wrong dtype, rank, shape or device is a ValueError naming the argument and the value
// (a typed nanobind signature would give a TypeError listing overloads instead).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "embedding_cache.h"
#include "thread_pool.h"

namespace embedlab_py {
namespace hps {

namespace nb = nanobind;

using In = nb::ndarray<nb::ro>;  // any dtype/device; read-only arrays accepted
using Out = nb::ndarray<>;       // writable

[[noreturn]] inline void fail(const std::string& fn, const std::string& msg) {
  throw nb::value_error((fn + ": " + msg).c_str());
}

inline std::string dtype_name(nb::dlpack::dtype d) {
  std::string base;
  switch (static_cast<nb::dlpack::dtype_code>(d.code)) {
    case nb::dlpack::dtype_code::Int: base = "int"; break;
    case nb::dlpack::dtype_code::UInt: base = "uint"; break;
    case nb::dlpack::dtype_code::Float: base = "float"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    case nb::dlpack::dtype_code::Complex: base = "complex"; break;
    default: base = "dtype(code " + std::to_string(d.code) + ")";
  }
  return base + std::to_string(d.bits);
}

template <typename A>
std::string shape_str(const A& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  if (a.ndim() == 1) s += ",";
  return s + ")";
}

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, int64_t>) return "int64";
  else return "uint8";
}

// Checks device, dtype, rank and C-contiguity of `a` (named `name` in errors).
template <typename T, typename A>
void expect(const std::string& fn, const char* name, const A& a, size_t ndim, bool cuda) {
  const int want = cuda ? nb::device::cuda::value : nb::device::cpu::value;
  if (a.device_type() != want)
    fail(fn, std::string(name) + (cuda ? " must be a CUDA device array (a torch.cuda tensor or a CuPy array)"
                                       : " must be a host (NumPy) array, got one on another device"));
  if (a.dtype() != nb::dtype<T>())
    fail(fn, std::string(name) + " must have dtype " + type_name<T>() + ", got " + dtype_name(a.dtype()));
  if (a.ndim() != ndim)
    fail(fn, std::string(name) + " must be " + std::to_string(ndim) + "-D, got shape " + shape_str(a));
  if (a.size() == 0) return;
  int64_t expected = 1;
  for (size_t i = ndim; i-- > 0;) {
    if (a.shape(i) > 1 && a.stride(i) != expected)
      fail(fn, std::string(name) + " must be C-contiguous (use numpy.ascontiguousarray)");
    expected *= static_cast<int64_t>(a.shape(i));
  }
}

// keys int64[n] and rows float32[n, dim] (rows_name for the message).
template <typename K, typename R>
int64_t expect_keys_rows(const std::string& fn, const K& keys, const char* rows_name, const R& rows, int64_t dim,
                         bool cuda) {
  expect<int64_t>(fn, "keys", keys, 1, cuda);
  expect<float>(fn, rows_name, rows, 2, cuda);
  const int64_t n = static_cast<int64_t>(keys.shape(0));
  if (static_cast<int64_t>(rows.shape(0)) != n || static_cast<int64_t>(rows.shape(1)) != dim)
    fail(fn, std::string(rows_name) + " must have shape (" + std::to_string(n) + ", " + std::to_string(dim) +
                 ") = (len(keys), dim), got " + shape_str(rows));
  return n;
}

// A NumPy array over a heap buffer of `cap` elements of which the first `n` are shown.
template <typename T>
struct Owned {
  std::unique_ptr<T[]> data;
  explicit Owned(size_t cap) : data(new T[cap == 0 ? 1 : cap]) {}
  nb::ndarray<nb::numpy, T> release(std::vector<size_t> shape) {
    T* p = data.release();
    nb::capsule owner(p, [](void* q) noexcept { delete[] static_cast<T*>(q); });
    return nb::ndarray<nb::numpy, T>(p, shape.size(), shape.data(), owner);
  }
};

template <typename T>
nb::ndarray<nb::numpy, T> from_vector(std::vector<T>&& v, std::vector<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* q) noexcept { delete static_cast<std::vector<T>*>(q); });
  return nb::ndarray<nb::numpy, T>(heap->empty() ? nullptr : heap->data(), shape.size(), shape.data(), owner);
}

// EmbeddingCache.stats() of both bindings (CPU and CUDA): the counters, size and capacity.
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

// One std::thread pool per thread count, shared by every HPS object of the process (created on
// first use, never destroyed: worker threads must not be joined during interpreter shutdown).
// The constructor arguments every EmbeddingCache binding (CPU and CUDA) checks first.
inline void check_cache_args(const char* fn, int64_t capacity, int64_t dim, int ways) {
  if (capacity < 1) fail(fn, "capacity must be >= 1, got " + std::to_string(capacity));
  if (dim < 1) fail(fn, "dim must be >= 1, got " + std::to_string(dim));
  if (ways < 1 || ways > embedlab::kEmbeddingCacheMaxWays)
    fail(fn, "ways must be in [1, " + std::to_string(embedlab::kEmbeddingCacheMaxWays) + "], got " +
                 std::to_string(ways));
}

inline embedlab::ThreadPool* shared_pool(int num_threads) {
  static std::mutex mu;
  static auto* pools = new std::map<int, embedlab::ThreadPool*>();
  std::lock_guard<std::mutex> l(mu);
  auto& p = (*pools)[num_threads];
  if (!p) p = embedlab::make_thread_pool(num_threads).release();
  return p;
}

}  // namespace hps
}  // namespace embedlab_py

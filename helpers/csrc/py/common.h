// What every csrc/py/<capability>_bindings.cc shares: the error helper, the array checks (one
// wording for every binding), result arrays owned by Python, the process's thread pools and, in
// CUDA builds, the CUDA helpers. Bindings are thin: validate, translate, call csrc/core with the
// GIL released.
//
// Arrays are taken untyped where a wrong dtype, rank, layout or device must be a ValueError that
// names the argument and the value (a typed nanobind signature gives a TypeError listing the
// overloads instead).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "thread_pool.h"

#ifdef EMBEDLAB_WITH_CUDA
#include <cuda_runtime_api.h>

#include <stdexcept>
#endif

namespace embedlab_py {

namespace nb = nanobind;

using In = nb::ndarray<nb::ro>;  // any dtype / device; read-only arrays accepted
using Arr = nb::ndarray<>;       // any dtype / device; writable

// ValueError "<fn>: <msg>".
[[noreturn]] inline void fail(const std::string& fn, const std::string& msg) {
  throw nb::value_error((fn + ": " + msg).c_str());
}

// "float32", "int64", "bool", ... as NumPy names them.
inline std::string dtype_name(nb::dlpack::dtype d) {
  std::string base;
  switch (static_cast<nb::dlpack::dtype_code>(d.code)) {
    case nb::dlpack::dtype_code::Int: base = "int"; break;
    case nb::dlpack::dtype_code::UInt: base = "uint"; break;
    case nb::dlpack::dtype_code::Float: base = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: base = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: base = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: base = "dtype(code " + std::to_string(d.code) + ")";
  }
  return base + std::to_string(d.bits);
}

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, int64_t>) return "int64";
  else if constexpr (std::is_same_v<T, int32_t>) return "int32";
  else {
    static_assert(std::is_same_v<T, uint8_t>, "add the type's name here");
    return "uint8";
  }
}

// An array's shape as Python prints a tuple: "(3, 4)", "(5,)".
template <typename A>
std::string shape_str(const A& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  if (a.ndim() == 1) s += ",";
  return s + ")";
}

// Checks that `a` (called `name` in errors) is on the host (cuda=false) or on a CUDA device, has
// dtype T, `ndim` dimensions and a C-contiguous layout. Returns its device id. An empty array has
// no layout to get wrong (frameworks give such arrays arbitrary strides), so only non-empty ones
// are checked for contiguity.
template <typename T, typename A>
int expect(const std::string& fn, const std::string& name, const A& a, size_t ndim, bool cuda) {
  const int want = cuda ? nb::device::cuda::value : nb::device::cpu::value;
  if (a.device_type() != want)
    fail(fn, name + (cuda ? " must be a CUDA device array (a torch.cuda tensor or a CuPy array)"
                          : " must be a host (NumPy) array, got one on another device"));
  if (a.dtype() != nb::dtype<T>()) fail(fn, name + " must have dtype " + type_name<T>() + ", got " + dtype_name(a.dtype()));
  if (a.ndim() != ndim) fail(fn, name + " must be " + std::to_string(ndim) + "-D, got shape " + shape_str(a));
  if (a.size() == 0) return a.device_id();
  int64_t expected = 1;
  for (size_t i = ndim; i-- > 0;) {
    if (a.shape(i) > 1 && a.stride(i) != expected)
      fail(fn, name + (cuda ? " must be C-contiguous" : " must be C-contiguous (use numpy.ascontiguousarray)"));
    expected *= static_cast<int64_t>(a.shape(i));
  }
  return a.device_id();
}

// keys int64[n] and rows float32[n, dim] (rows_name in the message); returns n.
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

// A new NumPy array of `shape`, owned by Python (freed with the array). Never a null buffer,
// even when empty.
template <typename T>
nb::ndarray<nb::numpy, T> new_array(std::vector<size_t> shape) {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  T* data = new T[n == 0 ? 1 : n];
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  return nb::ndarray<nb::numpy, T>(data, shape.size(), shape.data(), owner);
}

// A heap buffer of `cap` elements, filled without the GIL, then handed to Python as a NumPy
// array of its first elements (`shape`).
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

// A NumPy array over a vector's buffer (moved, not copied).
template <typename T>
nb::ndarray<nb::numpy, T> from_vector(std::vector<T>&& v, std::vector<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* q) noexcept { delete static_cast<std::vector<T>*>(q); });
  return nb::ndarray<nb::numpy, T>(heap->empty() ? nullptr : heap->data(), shape.size(), shape.data(), owner);
}

// The thread pool of `num_threads` threads (<= 0: one per hardware thread), shared by every
// binding of the process. One pool per thread count, made on first use and never replaced nor
// destroyed: a caller runs on its pool with the GIL released while other threads call in with
// other counts, and worker threads must not be joined during interpreter shutdown. A pool runs
// one call's blocks at a time (concurrent callers of one count take turns).
inline embedlab::ThreadPool& pool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  static std::mutex mu;
  static auto* pools = new std::map<int, embedlab::ThreadPool*>();
  std::lock_guard<std::mutex> l(mu);
  embedlab::ThreadPool*& p = (*pools)[num_threads];
  if (!p) p = embedlab::make_thread_pool(num_threads).release();
  return *p;
}

#ifdef EMBEDLAB_WITH_CUDA
// The caller's cudaStream_t, passed from Python as an int (0 = the legacy default stream).
inline cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// RuntimeError "<fn>: <what> failed: <error name> (<error text>)" unless e is cudaSuccess.
inline void cuda_check(const std::string& fn, cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(fn + ": " + what + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                             ")");
}

// The number of visible CUDA devices; a RuntimeError that says so where there is none (the
// module itself imports fine on such machines).
inline int require_gpu(const std::string& fn) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    throw std::runtime_error(fn + ": no CUDA device is visible (" +
                             (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") +
                             "); the CUDA functions need an NVIDIA GPU and driver");
  }
  return n;
}

// Scratch memory for one call: `given` (the caller's device buffer, checked by the binding), or
// else a stream-ordered allocation of `bytes` on `stream`, freed the same way (no
// synchronization) when the scope ends.
class StreamScratch {
 public:
  StreamScratch(const std::string& fn, void* given, size_t bytes, cudaStream_t stream) : ptr_(given), stream_(stream) {
    if (ptr_) return;
    cuda_check(fn, cudaMallocAsync(&ptr_, bytes, stream), "cudaMallocAsync of the workspace");
    owned_ = true;
  }
  ~StreamScratch() {
    if (owned_) cudaFreeAsync(ptr_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_;
  cudaStream_t stream_;
  bool owned_ = false;
};
#endif

}  // namespace embedlab_py

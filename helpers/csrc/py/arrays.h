// Result arrays shared by the bindings (module.cc, routing_bindings.cc).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <vector>

namespace embedlab_py {

// A new NumPy array of `shape`, owned by Python (freed with the array). Never a null buffer,
// even when empty.
template <typename T>
nanobind::ndarray<nanobind::numpy, T> new_array(std::vector<size_t> shape) {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  T* data = new T[n == 0 ? 1 : n];
  nanobind::capsule owner(data, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  return nanobind::ndarray<nanobind::numpy, T>(data, shape.size(), shape.data(), owner);
}

}  // namespace embedlab_py

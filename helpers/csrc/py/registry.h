// Each csrc/py/<capability>_bindings.cc registers its functions here with a static
// EMBEDLAB_PY_BINDINGS(name) { ... } block, and module.cc runs every registered block on the new
// module, so a new capability adds a file and never edits module.cc. CUDA binding files end in
// _cuda_bindings.cc and are compiled only with CUDA. The blocks run in no set order (static
// initialization order across files is unspecified): none may rely on another's definitions.
#pragma once
#include <nanobind/nanobind.h>

#include <functional>
#include <vector>

namespace embedlab_py {

using BindFn = void (*)(nanobind::module_&);

inline std::vector<BindFn>& registry() {
  static std::vector<BindFn> fns;
  return fns;
}

struct Registrar {
  explicit Registrar(BindFn fn) { registry().push_back(fn); }
};

}  // namespace embedlab_py

#define EMBEDLAB_PY_CONCAT2(a, b) a##b
#define EMBEDLAB_PY_CONCAT(a, b) EMBEDLAB_PY_CONCAT2(a, b)
// Usage (at namespace scope):  EMBEDLAB_PY_BINDINGS(hash_table) { m.def(...); }
#define EMBEDLAB_PY_BINDINGS(name)                                                            \
  static void EMBEDLAB_PY_CONCAT(embedlab_bind_, name)(nanobind::module_ & m);               \
  static ::embedlab_py::Registrar EMBEDLAB_PY_CONCAT(embedlab_registrar_, name)(             \
      &EMBEDLAB_PY_CONCAT(embedlab_bind_, name));                                             \
  static void EMBEDLAB_PY_CONCAT(embedlab_bind_, name)(nanobind::module_ & m)

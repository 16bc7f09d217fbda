// _embedlab_core: the csrc/core kernels for callers without TensorFlow (NumPy arrays on the
// CPU; PyTorch / CuPy arrays on the GPU). Every capability binds itself from its own
// csrc/py/<capability>[_cuda]_bindings.cc (registry.h); this file only makes the module and runs
// them.
#include <nanobind/nanobind.h>

#include "registry.h"

namespace nb = nanobind;

NB_MODULE(_embedlab_core, m) {
  m.doc() = "EmbedLab core kernels without TensorFlow (see embedlab._native.core())";
  // Objects of this module (hash tables, caches) are often still referenced from TensorFlow's or
  // the Triton stub's own teardown when the interpreter shuts down; nanobind would then print a
  // "leaked instance/function" report at every exit that says nothing about the program.
  nb::set_leak_warnings(false);
#ifdef EMBEDLAB_WITH_CUDA
  m.attr("cuda_built") = true;  // the *_cuda_bindings.cc files are compiled in
#else
  m.attr("cuda_built") = false;
#endif
  for (auto bind : embedlab_py::registry()) bind(m);
}

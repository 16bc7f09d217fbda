// What the two embedding bindings (embedding_bindings.cc on the CPU, embedding_cuda_bindings.cc
// on the GPU) share: the combiner and optimizer names from Python.
#pragma once
#include <cstdint>
#include <string>

#include "common.h"
#include "embedding.h"
#include "sparse_optimizer.h"

namespace embedlab_py {

inline embedlab::Combiner combiner_of(const std::string& fn, const std::string& name) {
  embedlab::Combiner c;
  if (!embedlab::parse_combiner(name, &c)) fail(fn, "combiner must be 'sum' or 'mean', got '" + name + "'");
  return c;
}

inline embedlab::SparseOptimizer optimizer_of(const std::string& fn, const std::string& name, float lr, float eps,
                                              double beta_1, double beta_2, int64_t step) {
  embedlab::SparseOptimizer o;
  const std::string err = embedlab::make_optimizer(name, lr, eps, beta_1, beta_2, step, &o);
  if (!err.empty()) fail(fn, err);
  return o;
}

}  // namespace embedlab_py

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

// FTRL's hyperparameters other than lr, as the bindings' keyword arguments give them.
inline embedlab::FtrlParams ftrl_of(float lr_power, float l1, float l2, float l2_shrinkage, float beta) {
  embedlab::FtrlParams p;
  p.lr_power = lr_power;
  p.l1 = l1;
  p.l2 = l2;
  p.l2_shrinkage = l2_shrinkage;
  p.beta = beta;
  return p;
}

inline embedlab::SparseOptimizer optimizer_of(const std::string& fn, const std::string& name, float lr, float eps,
                                              double beta_1, double beta_2, int64_t step,
                                              const embedlab::FtrlParams& ftrl = {}) {
  embedlab::SparseOptimizer o;
  const std::string err = embedlab::make_optimizer(name, lr, eps, beta_1, beta_2, step, &o, &ftrl);
  if (!err.empty()) fail(fn, err);
  return o;
}

}  // namespace embedlab_py

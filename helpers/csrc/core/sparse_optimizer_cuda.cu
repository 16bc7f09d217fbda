// CUDA implementation of sparse_optimizer.h: the optimizers' epilogues for the backward engine
// of backward_cuda.cuh (what happens to a key's summed gradient row: SGD, Adagrad, Adam or FTRL
// applied to its table row and slots in place), the fused backward + optimizer over up to 32
// tables per launch group, and the standalone sparse updates, which run their (index, grad row)
// pairs through the same path as "one key per row" gradients (so duplicates are coalesced).
// Every update uses the CPU's float32 expression order (explicit __fadd_rn/__fmul_rn): the
// CPU's bits.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backward_cuda.cuh"
#include "embedding.h"
#include "sparse_optimizer.h"

namespace embedlab {
namespace {

// ---- the optimizers' epilogues (see EpiState in backward_cuda.cuh) ---------------------------

// A key's table row and its first `Slots` slot rows (0, 1 or 2) at column col: every
// epilogue's load().
template <int Slots, int V>
__device__ __forceinline__ EpiState<V> load_rows(const BwdTable& B, int64_t key, int64_t col) {
  const int64_t off = key * B.dim + col;
  EpiState<V> st;
  st.w = vld<V>(B.table + off);
  if constexpr (Slots >= 1) st.s1 = vld<V>(B.slot1 + off);
  if constexpr (Slots >= 2) st.s2 = vld<V>(B.slot2 + off);
  return st;
}

struct SgdEpi {  // w -= g * lr
  float lr;
  template <int V>
  __device__ __forceinline__ EpiState<V> load(const BwdTable& B, int64_t key, int64_t col) const {
    return load_rows<0, V>(B, key, col);
  }
  template <int V>
  __device__ __forceinline__ void apply(const BwdTable& B, int64_t key, int64_t, int64_t col, EpiState<V> st,
                                        const Vec<V>& g) const {
#pragma unroll
    for (int i = 0; i < V; ++i) st.w.v[i] = __fsub_rn(st.w.v[i], __fmul_rn(g.v[i], lr));
    vst<V>(B.table + key * B.dim + col, st.w);
  }
};

struct AdagradEpi {  // acc += g*g; w -= (lr*g) / sqrt(acc + eps)
  float lr, eps;
  template <int V>
  __device__ __forceinline__ EpiState<V> load(const BwdTable& B, int64_t key, int64_t col) const {
    return load_rows<1, V>(B, key, col);
  }
  template <int V>
  __device__ __forceinline__ void apply(const BwdTable& B, int64_t key, int64_t, int64_t col, EpiState<V> st,
                                        const Vec<V>& g) const {
    const int64_t off = key * B.dim + col;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      st.s1.v[i] = __fadd_rn(st.s1.v[i], __fmul_rn(g.v[i], g.v[i]));
      st.w.v[i] = __fsub_rn(st.w.v[i], __fdiv_rn(__fmul_rn(lr, g.v[i]), __fsqrt_rn(__fadd_rn(st.s1.v[i], eps))));
    }
    vst<V>(B.slot1 + off, st.s1);
    vst<V>(B.table + off, st.w);
  }
};

struct AdamEpi {  // Keras order: m += (g-m)(1-b1); v += (g*g-v)(1-b2); w -= (m*alpha)/(sqrt(v)+eps)
  float alpha, one_b1, one_b2, eps;
  template <int V>
  __device__ __forceinline__ EpiState<V> load(const BwdTable& B, int64_t key, int64_t col) const {
    return load_rows<2, V>(B, key, col);
  }
  template <int V>
  __device__ __forceinline__ void apply(const BwdTable& B, int64_t key, int64_t, int64_t col, EpiState<V> st,
                                        const Vec<V>& g) const {
    const int64_t off = key * B.dim + col;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      st.s1.v[i] = __fadd_rn(st.s1.v[i], __fmul_rn(__fsub_rn(g.v[i], st.s1.v[i]), one_b1));
      st.s2.v[i] = __fadd_rn(st.s2.v[i], __fmul_rn(__fsub_rn(__fmul_rn(g.v[i], g.v[i]), st.s2.v[i]), one_b2));
      st.w.v[i] =
          __fsub_rn(st.w.v[i], __fdiv_rn(__fmul_rn(st.s1.v[i], alpha), __fadd_rn(__fsqrt_rn(st.s2.v[i]), eps)));
    }
    vst<V>(B.slot1 + off, st.s1);
    vst<V>(B.slot2 + off, st.s2);
    vst<V>(B.table + off, st.w);
  }
};

// FTRL-Proximal (FtrlParams in sparse_optimizer.h; slot1 = n, slot2 = z), the CPU's FtrlRow
// expression by expression. mode 0: p = -0.5 (square root), 1: p = 0 (the constant 1), 2: pow in
// double rounded to float; the branch is uniform over the launch.
struct FtrlEpi {
  float lr, neg_p, two_l2s, l1, two_l2;
  int mode;
  __device__ __forceinline__ float power(float x) const {
    if (mode == 0) return __fsqrt_rn(x);
    if (mode == 1) return 1.f;
    return __double2float_rn(pow(static_cast<double>(x), static_cast<double>(neg_p)));
  }
  template <int V>
  __device__ __forceinline__ EpiState<V> load(const BwdTable& B, int64_t key, int64_t col) const {
    return load_rows<2, V>(B, key, col);
  }
  template <int V>
  __device__ __forceinline__ void apply(const BwdTable& B, int64_t key, int64_t, int64_t col, EpiState<V> st,
                                        const Vec<V>& g) const {
    const int64_t off = key * B.dim + col;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float w = st.w.v[i], n = st.s1.v[i];
      const float gs = __fadd_rn(g.v[i], __fmul_rn(two_l2s, w));
      const float n_new = __fadd_rn(n, __fmul_rn(g.v[i], g.v[i]));
      const float p_new = power(n_new);
      const float z =
          __fadd_rn(st.s2.v[i], __fsub_rn(gs, __fmul_rn(__fdiv_rn(__fsub_rn(p_new, power(n)), lr), w)));
      const float zm = z < -l1 ? -l1 : z;  // std::min(std::max(z, -l1), l1), the CPU's (NaN stays NaN)
      const float zc = l1 < zm ? l1 : zm;
      st.w.v[i] = __fdiv_rn(__fsub_rn(zc, z), __fadd_rn(__fdiv_rn(p_new, lr), two_l2));
      st.s1.v[i] = n_new;
      st.s2.v[i] = z;
    }
    vst<V>(B.slot1 + off, st.s1);
    vst<V>(B.slot2 + off, st.s2);
    vst<V>(B.table + off, st.w);
  }
};

// FTRL's constants, computed on the host exactly as the CPU's FtrlRow does.
FtrlEpi ftrl_epi(const FtrlParams& p) {
  FtrlEpi e;
  e.lr = p.lr;
  e.neg_p = -p.lr_power;
  e.two_l2s = 2.f * p.l2_shrinkage;
  e.l1 = p.l1;
  e.two_l2 = 2.f * (p.l2 + p.beta / (2.f * p.lr));
  e.mode = p.lr_power == -0.5f ? 0 : p.lr_power == 0.f ? 1 : 2;
  return e;
}

// Adam's step size, computed on the host exactly as sparse_adam_cpu does.
AdamEpi adam_epi(const AdamParams& p) {
  const float ts = static_cast<float>(p.step);
  const float b1p = std::pow(static_cast<float>(p.beta1), ts);
  const float b2p = std::pow(static_cast<float>(p.beta2), ts);
  AdamEpi e;
  e.alpha = p.lr * std::sqrt(1.f - b2p) / (1.f - b1p);
  e.one_b1 = static_cast<float>(1.0 - p.beta1);  // Keras: 1 - beta in double, rounded once
  e.one_b2 = static_cast<float>(1.0 - p.beta2);
  e.eps = p.epsilon;
  return e;
}

cudaError_t apply_group(const BwdGroup& G, const SparseOptimizer& opt, void* ws, size_t ws_bytes,
                        cudaStream_t stream) {
  for (int t = 0; t < G.T.n; ++t) {
    const BwdTable& B = G.T.t[t];
    if (B.table == nullptr || (opt.kind == OptimizerKind::kAdagrad && B.slot1 == nullptr) ||
        ((opt.kind == OptimizerKind::kAdam || opt.kind == OptimizerKind::kFtrl) &&
         (B.slot1 == nullptr || B.slot2 == nullptr)))
      return cudaErrorInvalidValue;
  }
  switch (opt.kind) {
    case OptimizerKind::kSgd:
      return backward_dispatch(G, G.rows, SgdEpi{opt.sgd.lr}, nullptr, nullptr, ws, ws_bytes, stream);
    case OptimizerKind::kAdagrad:
      return backward_dispatch(G, G.rows, AdagradEpi{opt.adagrad.lr, opt.adagrad.epsilon}, nullptr, nullptr, ws,
                               ws_bytes, stream);
    case OptimizerKind::kAdam:
      if (opt.adam.step < 1) return cudaErrorInvalidValue;
      return backward_dispatch(G, G.rows, adam_epi(opt.adam), nullptr, nullptr, ws, ws_bytes, stream);
    case OptimizerKind::kFtrl:
      if (!check_ftrl(opt.ftrl).empty()) return cudaErrorInvalidValue;
      return backward_dispatch(G, G.rows, ftrl_epi(opt.ftrl), nullptr, nullptr, ws, ws_bytes, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

size_t lookup_backward_apply_cuda_workspace(const LookupGradArgs* grads, const SparseUpdateArgs* targets,
                                            int num_tables, cudaError_t* err) {
  size_t most = 0;
  for (int t0 = 0; t0 < num_tables; t0 += kMaxTablesPerLaunch) {
    BwdGroup G;
    BwdLayout L;
    cudaError_t e = make_group(grads + t0, targets + t0, std::min(kMaxTablesPerLaunch, num_tables - t0), &G);
    if (e == cudaSuccess) e = bwd_layout(G.batch, G.nnz, G.stride, G.rows, &L);
    if (e != cudaSuccess) {
      if (err) *err = e;
      return 0;
    }
    most = std::max(most, L.total);
  }
  if (err) *err = cudaSuccess;
  return most;
}

cudaError_t lookup_backward_apply_cuda(const LookupGradArgs* grads, const SparseUpdateArgs* targets, int num_tables,
                                       const SparseOptimizer& opt, void* workspace, size_t workspace_bytes,
                                       cudaStream_t stream) {
  for (int t0 = 0; t0 < num_tables; t0 += kMaxTablesPerLaunch) {
    BwdGroup G;
    EL_TRY(make_group(grads + t0, targets + t0, std::min(kMaxTablesPerLaunch, num_tables - t0), &G));
    EL_TRY(apply_group(G, opt, workspace, workspace_bytes, stream));
  }
  return cudaSuccess;
}

cudaError_t lookup_backward_apply_cuda(const LookupGradArgs& grad, const SparseUpdateArgs& target,
                                       const SparseOptimizer& opt, void* workspace, size_t workspace_bytes,
                                       cudaStream_t stream) {
  return lookup_backward_apply_cuda(&grad, &target, 1, opt, workspace, workspace_bytes, stream);
}

namespace {
// The optimizers' (index, grad row) lists as "one key per row" gradient args.
std::vector<LookupGradArgs> index_grads(const SparseUpdateArgs* tables, int num_tables) {
  std::vector<LookupGradArgs> g(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    g[t].ids.row_offsets = nullptr;
    g[t].ids.keys = tables[t].indices;
    g[t].ids.batch = tables[t].n;
    g[t].ids.nnz = tables[t].n;
    g[t].combiner = Combiner::kSum;
    g[t].dim = tables[t].dim;
    g[t].grad_out = tables[t].grads;
  }
  return g;
}

cudaError_t sparse_update(const SparseUpdateArgs* tables, int num_tables, const SparseOptimizer& opt, void* ws,
                          size_t ws_bytes, cudaStream_t stream) {
  const std::vector<LookupGradArgs> g = index_grads(tables, num_tables);
  return lookup_backward_apply_cuda(g.data(), tables, num_tables, opt, ws, ws_bytes, stream);
}
}  // namespace

size_t sparse_update_cuda_workspace(const SparseUpdateArgs* tables, int num_tables, cudaError_t* err) {
  const std::vector<LookupGradArgs> g = index_grads(tables, num_tables);
  return lookup_backward_apply_cuda_workspace(g.data(), tables, num_tables, err);
}

cudaError_t sparse_sgd_cuda(const SparseUpdateArgs* tables, int num_tables, SgdParams p, void* ws, size_t ws_bytes,
                            cudaStream_t stream) {
  SparseOptimizer o;
  o.kind = OptimizerKind::kSgd;
  o.sgd = p;
  return sparse_update(tables, num_tables, o, ws, ws_bytes, stream);
}

cudaError_t sparse_adagrad_cuda(const SparseUpdateArgs* tables, int num_tables, AdagradParams p, void* ws,
                                size_t ws_bytes, cudaStream_t stream) {
  SparseOptimizer o;
  o.kind = OptimizerKind::kAdagrad;
  o.adagrad = p;
  return sparse_update(tables, num_tables, o, ws, ws_bytes, stream);
}

cudaError_t sparse_adam_cuda(const SparseUpdateArgs* tables, int num_tables, AdamParams p, void* ws, size_t ws_bytes,
                             cudaStream_t stream) {
  SparseOptimizer o;
  o.kind = OptimizerKind::kAdam;
  o.adam = p;
  return sparse_update(tables, num_tables, o, ws, ws_bytes, stream);
}

cudaError_t sparse_ftrl_cuda(const SparseUpdateArgs* tables, int num_tables, FtrlParams p, void* ws, size_t ws_bytes,
                             cudaStream_t stream) {
  SparseOptimizer o;
  o.kind = OptimizerKind::kFtrl;
  o.ftrl = p;
  return sparse_update(tables, num_tables, o, ws, ws_bytes, stream);
}

}  // namespace embedlab

// Multi-threaded CPU implementation of sparse_optimizer.h: the sparse optimizers' row updates
// (SGD, Adagrad, lazy Adam, FTRL), Global Adam and its deferred catch-up, the coalescing of duplicate
// indices, and the fused backward + optimizer (LookupGradCpu::apply of embedding.h: the
// backward's summed rows from embedding_cpu.cc, then the same row update). The kernels are
// compiled once per instruction set (cpu_isa_kernels.h); the entry points at the end of this file
// are compiled once, with the baseline copy, and call the copy that cpu_isa() chose.
//
// Where the time goes: the updates are scatters of random table rows (and their slots), bound
// by memory latency, so they prefetch the rows a few indices ahead with intent to write and
// parallelise over (table, index block). Every row update uses Keras' float32 expression order.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_isa.h"
#include "embedding.h"
#include "sparse_optimizer.h"
#include "cpu_isa_kernels.h"  // last: opens the instruction set's namespace and target

namespace embedlab {

// The entry points of one compiled copy of this file's kernels.
struct SparseOptimizerKernels {
  void (*grad_apply)(const LookupGradCpu::State& s, const SparseUpdateArgs& target, const SparseOptimizer& opt,
                     ThreadPool& pool);
  void (*sparse_sgd)(const SparseUpdateArgs* tables, int num_tables, SgdParams p, ThreadPool& pool);
  void (*sparse_adagrad)(const SparseUpdateArgs* tables, int num_tables, AdagradParams p, ThreadPool& pool);
  void (*sparse_adam)(const SparseUpdateArgs* tables, int num_tables, AdamParams p, ThreadPool& pool);
  void (*global_adam)(const SparseUpdateArgs* tables, const int64_t* rows_used, int num_tables, AdamParams p,
                      ThreadPool& pool);
  int64_t (*global_adam_catch_up)(float* table, float* m, float* v, int64_t* last, int64_t num_rows, int64_t dim,
                                  const int64_t* rows, int64_t n, int64_t all_rows, int64_t target,
                                  const float* lr_ring, int64_t ring, AdamParams p, ThreadPool& pool);
  void (*coalesce)(const int64_t* indices, const float* rows, int64_t n, int64_t dim, int64_t key_bound,
                   std::vector<int64_t>* out_indices, std::vector<float>* out_rows, ThreadPool& pool);
  void (*sparse_ftrl)(const SparseUpdateArgs* tables, int num_tables, FtrlParams p, ThreadPool& pool);
};

namespace EMBEDLAB_ISA_NS {
namespace {

// The optimizers' row updates, shared by sparse_sgd/adagrad/adam and the fused backward: each is called
// as update(width, w, slot1, slot2, g, dim) on one row. Same float32 expression order as Keras.
// kCost: rough ns per element, the thread pool's block-size hint.
struct SgdRow {
  static constexpr int64_t kCost = 1;
  float lr;
  template <typename W>
  void operator()(W, float* __restrict w, float*, float*, const float* __restrict g, int64_t dim_rt) const {
    const int64_t dim = Width<W::value>::get(dim_rt);
    for (int64_t d = 0; d < dim; ++d) w[d] -= g[d] * lr;
  }
};

struct AdagradRow {
  static constexpr int64_t kCost = 4;
  AdagradParams p;
  template <typename W>
  void operator()(W, float* __restrict w, float* __restrict acc, float*, const float* __restrict g,
                  int64_t dim_rt) const {
    const int64_t dim = Width<W::value>::get(dim_rt);
    for (int64_t d = 0; d < dim; ++d) {
      acc[d] += g[d] * g[d];
      w[d] -= (p.lr * g[d]) / std::sqrt(acc[d] + p.epsilon);
    }
  }
};

struct AdamRow {
  static constexpr int64_t kCost = 6;
  float alpha, one_b1, one_b2, eps;
  explicit AdamRow(const AdamParams& p) {
    // Same float32 expression order as Keras' Adam so that rows touched every step match it.
    const float t = static_cast<float>(p.step);
    const float b1p = std::pow(static_cast<float>(p.beta1), t);
    const float b2p = std::pow(static_cast<float>(p.beta2), t);
    alpha = p.lr * std::sqrt(1.f - b2p) / (1.f - b1p);
    one_b1 = static_cast<float>(1.0 - p.beta1);
    one_b2 = static_cast<float>(1.0 - p.beta2);
    eps = p.epsilon;
  }
  template <typename W>
  void operator()(W, float* __restrict w, float* __restrict m, float* __restrict v, const float* __restrict g,
                  int64_t dim_rt) const {
    const int64_t dim = Width<W::value>::get(dim_rt);
    for (int64_t d = 0; d < dim; ++d) {
      m[d] += (g[d] - m[d]) * one_b1;
      v[d] += (g[d] * g[d] - v[d]) * one_b2;
      w[d] -= (m[d] * alpha) / (std::sqrt(v[d]) + eps);
    }
  }
  // The same update with g = 0: a row no batch touched at this step (Global Adam). The full
  // pass and the deferred catch-up both use this one, which is what makes them the same bits.
  template <typename W>
  void zero_grad(W, float* __restrict w, float* __restrict m, float* __restrict v, int64_t dim_rt) const {
    const int64_t dim = Width<W::value>::get(dim_rt);
    for (int64_t d = 0; d < dim; ++d) {
      m[d] += (0.f - m[d]) * one_b1;
      v[d] += (0.f - v[d]) * one_b2;
      w[d] -= (m[d] * alpha) / (std::sqrt(v[d]) + eps);
    }
  }
};

// FTRL-Proximal (FtrlParams in sparse_optimizer.h), slot1 = n, slot2 = z, in Keras' float32
// order. The power n^-p is chosen once per call (kMode 0: p = -0.5, a square root; 1: p = 0,
// the constant 1; 2: pow in double rounded to float), so the loops carry no branch on p.
struct FtrlRow {
  static constexpr int64_t kCost = 8;
  float lr, neg_p, two_l2s, l1, two_l2;
  int mode;
  explicit FtrlRow(const FtrlParams& p) {
    lr = p.lr;
    neg_p = -p.lr_power;
    two_l2s = 2.f * p.l2_shrinkage;
    l1 = p.l1;
    // Keras: l2 + beta / (2 lr) in float32, doubled where the quadratic term uses it.
    two_l2 = 2.f * (p.l2 + p.beta / (2.f * p.lr));
    mode = p.lr_power == -0.5f ? 0 : p.lr_power == 0.f ? 1 : 2;
  }
  template <int kMode>
  static float power(float x, float neg_p) {
    if (kMode == 0) return std::sqrt(x);
    if (kMode == 1) return 1.f;
    return static_cast<float>(std::pow(static_cast<double>(x), static_cast<double>(neg_p)));
  }
  template <int kMode, typename W>
  void run(float* __restrict w, float* __restrict n, float* __restrict z, const float* __restrict g,
           int64_t dim_rt) const {
    const int64_t dim = Width<W::value>::get(dim_rt);
    for (int64_t d = 0; d < dim; ++d) {
      const float gs = g[d] + two_l2s * w[d];
      const float n_new = n[d] + g[d] * g[d];
      const float p_new = power<kMode>(n_new, neg_p);
      z[d] += gs - ((p_new - power<kMode>(n[d], neg_p)) / lr) * w[d];
      const float zc = std::min(std::max(z[d], -l1), l1);
      w[d] = (zc - z[d]) / (p_new / lr + two_l2);
      n[d] = n_new;
    }
  }
  template <typename W>
  void operator()(W width, float* __restrict w, float* __restrict n, float* __restrict z, const float* __restrict g,
                  int64_t dim_rt) const {
    switch (mode) {
      case 0: return run<0, W>(w, n, z, g, dim_rt);
      case 1: return run<1, W>(w, n, z, g, dim_rt);
      default: return run<2, W>(w, n, z, g, dim_rt);
    }
  }
};

template <typename RowUpdate>
void sparse_update(const SparseUpdateArgs* tables, int num_tables, ThreadPool& pool, RowUpdate update) {
  FlatIndex flat(num_tables, [&](int t) { return tables[t].n; });
  if (flat.total() == 0) return;
  int64_t dims = 0;
  for (int t = 0; t < num_tables; ++t) dims = std::max(dims, tables[t].dim);
  pool.parallel_for(flat.total(), dims * RowUpdate::kCost, [&](int64_t b, int64_t e) {
    flat.for_each(b, e, [&](int t, int64_t i0, int64_t i1) {
      const SparseUpdateArgs& a = tables[t];
      dispatch_dim(a.dim, [&](auto width) {
        for (int64_t i = i0; i < i1; ++i) {
          if (i + kPrefetchDistance < i1) {
            const int64_t kp = a.indices[i + kPrefetchDistance] * a.dim;
            prefetch_row_for_write(a.table + kp, a.dim);
            if (a.slot1) prefetch_row_for_write(a.slot1 + kp, a.dim);
            if (a.slot2) prefetch_row_for_write(a.slot2 + kp, a.dim);
          }
          const int64_t off = a.indices[i] * a.dim;
          update(width, a.table + off, a.slot1 ? a.slot1 + off : nullptr, a.slot2 ? a.slot2 + off : nullptr,
                 a.grads + i * a.dim, a.dim);
        }
      });
    });
  });
}

// Calls fn(row_update) with the update of `opt`.
template <typename F>
void with_update(const SparseOptimizer& opt, F fn) {
  switch (opt.kind) {
    case OptimizerKind::kSgd: return fn(SgdRow{opt.sgd.lr});
    case OptimizerKind::kAdagrad: return fn(AdagradRow{opt.adagrad});
    case OptimizerKind::kAdam: return fn(AdamRow(opt.adam));
    case OptimizerKind::kFtrl: return fn(FtrlRow(opt.ftrl));
  }
}

}  // namespace

void grad_apply(const LookupGradCpu::State& s, const SparseUpdateArgs& target, const SparseOptimizer& opt,
                ThreadPool& pool) {
  // Two passes over a reused buffer: the summed rows, then the update, row by row in key order
  // with write prefetches. Interleaving the two per key (or per chunk of 32 to 2,048 keys)
  // is slower: each loop keeps its own stream
  // of misses in flight, and every switch restarts the prefetch pipeline. Same code, so the same bits, as fill() followed
  // by sparse_<opt>_cpu; the difference to that is no output tensors, one op, no allocation.
  const int64_t nu = static_cast<int64_t>(s.unique_keys.size());
  if (nu <= 0) return;
  // The summed rows go to a buffer of the calling thread, not of this table: a thread that
  // applies many tables in turn (the TF op's many-table path) reuses one buffer that stays in
  // its L2 cache, instead of memsetting and filling a cold one per table (26 x 512 KiB a step
  // for the Criteo shape).
  thread_local std::vector<float> sums;
  if (static_cast<int64_t>(sums.size()) < nu * s.args.dim) sums.resize(nu * s.args.dim);
  sum_all_rows(s.args, s.slot_of_pos.data(), nu, sums.data(), pool);
  SparseUpdateArgs a = target;
  a.indices = s.unique_keys.data();
  a.grads = sums.data();
  a.n = nu;
  with_update(opt, [&](auto update) { sparse_update(&a, 1, pool, update); });
  trim_scratch(&sums);
}

void coalesce(const int64_t* indices, const float* rows, int64_t n, int64_t dim, int64_t key_bound,
              std::vector<int64_t>* out_indices, std::vector<float>* out_rows, ThreadPool& pool) {
  std::vector<int64_t> order, runs;
  sort_runs(indices, n, key_bound, &order, &runs, pool);
  const int64_t nu = static_cast<int64_t>(runs.size()) - 1;
  out_indices->resize(std::max<int64_t>(nu, 0));
  out_rows->assign(std::max<int64_t>(nu, 0) * dim, 0.f);
  pool.parallel_for(nu, dim * 2, [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      (*out_indices)[u] = indices[order[runs[u]]];
      float* out = out_rows->data() + u * dim;
      for (int64_t i = runs[u]; i < runs[u + 1]; ++i) add<0>(out, rows + order[i] * dim, dim);
    }
  });
}

void sparse_sgd(const SparseUpdateArgs* tables, int num_tables, SgdParams p, ThreadPool& pool) {
  sparse_update(tables, num_tables, pool, SgdRow{p.lr});
}

void sparse_adagrad(const SparseUpdateArgs* tables, int num_tables, AdagradParams p, ThreadPool& pool) {
  sparse_update(tables, num_tables, pool, AdagradRow{p});
}

void sparse_adam(const SparseUpdateArgs* tables, int num_tables, AdamParams p, ThreadPool& pool) {
  sparse_update(tables, num_tables, pool, AdamRow(p));
}

void sparse_ftrl(const SparseUpdateArgs* tables, int num_tables, FtrlParams p, ThreadPool& pool) {
  sparse_update(tables, num_tables, pool, FtrlRow(p));
}

void global_adam(const SparseUpdateArgs* tables, const int64_t* rows_used, int num_tables, AdamParams p,
                 ThreadPool& pool) {
  std::vector<int64_t> rows(num_tables);
  for (int t = 0; t < num_tables; ++t) {
    const SparseUpdateArgs& a = tables[t];
    rows[t] = std::min(a.num_rows, std::max(rows_used[t], a.n ? a.indices[a.n - 1] + 1 : int64_t{0}));
  }
  FlatIndex flat(num_tables, [&](int t) { return rows[t]; });
  if (flat.total() == 0) return;
  int64_t dims = 0;
  for (int t = 0; t < num_tables; ++t) dims = std::max(dims, tables[t].dim);
  const AdamRow update(p);
  pool.parallel_for(flat.total(), dims * AdamRow::kCost, [&](int64_t b, int64_t e) {
    flat.for_each(b, e, [&](int t, int64_t r0, int64_t r1) {
      const SparseUpdateArgs& a = tables[t];
      int64_t j = std::lower_bound(a.indices, a.indices + a.n, r0) - a.indices;
      dispatch_dim(a.dim, [&](auto width) {
        for (int64_t r = r0; r < r1; ++r) {
          float* w = a.table + r * a.dim;
          float* m = a.slot1 + r * a.dim;
          float* v = a.slot2 + r * a.dim;
          if (j < a.n && a.indices[j] == r) {
            update(width, w, m, v, a.grads + j * a.dim, a.dim);
            ++j;
          } else {
            update.zero_grad(width, w, m, v, a.dim);
          }
        }
      });
    });
  });
}

int64_t global_adam_catch_up(float* table, float* m, float* v, int64_t* last, int64_t num_rows, int64_t dim,
                             const int64_t* rows, int64_t n, int64_t all_rows, int64_t target,
                             const float* lr_ring, int64_t ring, AdamParams p, ThreadPool& pool) {
  const bool all = all_rows >= 0;
  const int64_t count = all ? std::min(all_rows, num_rows) : n;
  auto row_at = [&](int64_t i) { return all ? i : rows[i]; };
  const int64_t oldest = target - ring + 1;     // the first step the ring still holds
  // Check first, so that an error leaves every row as it was.
  std::atomic<int64_t> behind{-1};
  pool.parallel_for(count, 2, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = row_at(i);
      if (last[r] < target && last[r] + 1 < std::max<int64_t>(oldest, 1)) {
        int64_t none = -1;
        behind.compare_exchange_strong(none, r);
        return;
      }
    }
  });
  if (behind.load() >= 0) return behind.load();
  // Step j's update: AdamRow(lr of step j, step j), the expression global_adam_cpu uses.
  std::vector<AdamRow> steps;
  const int64_t first = std::max<int64_t>(oldest, 1);
  for (int64_t j = first; j <= target; ++j) {
    AdamParams q = p;
    q.lr = lr_ring[j % ring];
    q.step = j;
    steps.emplace_back(q);
  }
  pool.parallel_for(count, dim * AdamRow::kCost * 4, [&](int64_t b, int64_t e) {
    dispatch_dim(dim, [&](auto width) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t r = row_at(i);
        int64_t from = __atomic_load_n(&last[r], __ATOMIC_ACQUIRE);
        // Claim the row (a repeated row in `rows` is replayed by one thread only).
        while (from < target &&
               !__atomic_compare_exchange_n(&last[r], &from, target, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        }
        if (from >= target) continue;
        for (int64_t j = from + 1; j <= target; ++j)
          steps[j - first].zero_grad(width, table + r * dim, m + r * dim, v + r * dim, dim);
      }
    });
  });
  return -1;
}

extern const SparseOptimizerKernels kSparseOptimizerKernels = {
    &grad_apply, &sparse_sgd, &sparse_adagrad, &sparse_adam, &global_adam, &global_adam_catch_up, &coalesce,
    &sparse_ftrl,
};

}  // namespace EMBEDLAB_ISA_NS
}  // namespace embedlab

// ---- the entry points of sparse_optimizer.h (compiled once, in the baseline copy) -----------
#if EMBEDLAB_ISA_BASELINE_COPY
namespace embedlab {

EMBEDLAB_CPU_ISA_KERNELS(SparseOptimizerKernels, kSparseOptimizerKernels)

bool strictly_increasing(const int64_t* indices, int64_t n) {
  for (int64_t i = 1; i < n; ++i)
    if (indices[i] <= indices[i - 1]) return false;
  return true;
}

namespace {
// The shortest decimal that reads back as v (0.1f prints as "0.1", not "0.100000001").
std::string str_float(float v) {
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return buf;
}
}  // namespace

std::string check_ftrl(const FtrlParams& p) {
  const struct {
    const char* name;
    float value;
  } nonneg[] = {{"l1_regularization_strength", p.l1},
                {"l2_regularization_strength", p.l2},
                {"l2_shrinkage_regularization_strength", p.l2_shrinkage},
                {"beta", p.beta}};
  if (!(std::isfinite(p.lr) && p.lr > 0.f)) return "learning_rate must be a finite value > 0, got " + str_float(p.lr);
  if (!(std::isfinite(p.lr_power) && p.lr_power <= 0.f))
    return "learning_rate_power must be a finite value <= 0, got " + str_float(p.lr_power);
  for (const auto& h : nonneg)
    if (!(std::isfinite(h.value) && h.value >= 0.f))
      return std::string(h.name) + " must be a finite value >= 0, got " + str_float(h.value);
  return "";
}

std::string make_optimizer(const std::string& name, float lr, float epsilon, double beta1, double beta2,
                           int64_t step, SparseOptimizer* out, const FtrlParams* ftrl) {
  SparseOptimizer o;
  if (name == "sgd") {
    o.kind = OptimizerKind::kSgd;
    o.sgd = {lr};
  } else if (name == "adagrad") {
    o.kind = OptimizerKind::kAdagrad;
    o.adagrad = {lr, epsilon};
  } else if (name == "adam") {
    if (step < 1) return "step must be >= 1, got " + str(step);
    o.kind = OptimizerKind::kAdam;
    o.adam = {lr, beta1, beta2, epsilon, step};
  } else if (name == "ftrl") {
    if (ftrl == nullptr) return "ftrl needs its hyperparameters (FtrlParams)";
    o.kind = OptimizerKind::kFtrl;
    o.ftrl = *ftrl;
    o.ftrl.lr = lr;
    const std::string err = check_ftrl(o.ftrl);
    if (!err.empty()) return err;
  } else {
    return "optimizer must be 'sgd', 'adagrad', 'adam' or 'ftrl', got '" + name + "'";
  }
  *out = o;
  return "";
}

void LookupGradCpu::apply(const SparseUpdateArgs& target, const SparseOptimizer& opt, ThreadPool& pool) const {
  kernels().grad_apply(s_, target, opt, pool);
}

void coalesce_cpu(const int64_t* indices, const float* rows, int64_t n, int64_t dim, int64_t key_bound,
                  std::vector<int64_t>* out_indices, std::vector<float>* out_rows, ThreadPool& pool) {
  kernels().coalesce(indices, rows, n, dim, key_bound, out_indices, out_rows, pool);
}

void sparse_sgd_cpu(const SparseUpdateArgs* tables, int num_tables, SgdParams p, ThreadPool& pool) {
  kernels().sparse_sgd(tables, num_tables, p, pool);
}

void sparse_adagrad_cpu(const SparseUpdateArgs* tables, int num_tables, AdagradParams p, ThreadPool& pool) {
  kernels().sparse_adagrad(tables, num_tables, p, pool);
}

void sparse_adam_cpu(const SparseUpdateArgs* tables, int num_tables, AdamParams p, ThreadPool& pool) {
  kernels().sparse_adam(tables, num_tables, p, pool);
}

void sparse_ftrl_cpu(const SparseUpdateArgs* tables, int num_tables, FtrlParams p, ThreadPool& pool) {
  kernels().sparse_ftrl(tables, num_tables, p, pool);
}

void global_adam_cpu(const SparseUpdateArgs* tables, const int64_t* rows_used, int num_tables, AdamParams p,
                     ThreadPool& pool) {
  kernels().global_adam(tables, rows_used, num_tables, p, pool);
}

int64_t global_adam_catch_up_cpu(float* table, float* m, float* v, int64_t* last, int64_t num_rows, int64_t dim,
                                 const int64_t* rows, int64_t n, int64_t all_rows, int64_t target,
                                 const float* lr_ring, int64_t ring, AdamParams p, ThreadPool& pool) {
  return kernels().global_adam_catch_up(table, m, v, last, num_rows, dim, rows, n, all_rows, target,
                                                  lr_ring, ring, p, pool);
}

}  // namespace embedlab
#endif  // EMBEDLAB_ISA_BASELINE_COPY

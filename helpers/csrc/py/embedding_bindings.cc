// The embedding kernels (csrc/core embedding, sparse_optimizer, csr) over NumPy arrays on the
// CPU: pooled lookups, their backward, the fused backward + optimizer, the row optimizers and the
// COO -> CSR conversion. Inputs must be C-contiguous with the documented dtypes (typed nanobind
// signatures); nothing is copied. The GIL is released around every kernel.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "csr.h"
#include "embedding.h"
#include "embedding_bindings.h"
#include "registry.h"
#include "sparse_optimizer.h"

namespace nb = nanobind;
using namespace embedlab;
using embedlab_py::combiner_of;
using embedlab_py::fail;
using embedlab_py::new_array;
using embedlab_py::optimizer_of;
using embedlab_py::pool;

using F2 = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using F1 = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using CF2 = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using I1 = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I2 = nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

namespace {

CsrIds csr_of(const std::string& fn, size_t t, const I1& offsets, const I1& keys, const F1* weights) {
  CsrIds ids;
  if (offsets.shape(0) < 1) fail(fn, "row_offsets[" + std::to_string(t) + "] is empty; it needs batch + 1 entries");
  ids.row_offsets = offsets.data();
  ids.keys = keys.data();
  ids.batch = static_cast<int64_t>(offsets.shape(0)) - 1;
  ids.nnz = static_cast<int64_t>(keys.shape(0));
  if (weights) {
    if (weights->shape(0) != keys.shape(0))
      fail(fn, "weights[" + std::to_string(t) + "] has " + std::to_string(weights->shape(0)) +
                   " entries but keys[" + std::to_string(t) + "] has " + std::to_string(keys.shape(0)));
    ids.weights = weights->data();
  }
  return ids;
}

void lookup_forward(const std::vector<CF2>& tables, const std::vector<I1>& offsets, const std::vector<I1>& keys,
                    const std::optional<std::vector<F1>>& weights, const std::vector<std::string>& combiners,
                    std::vector<F2>& outs, int num_threads) {
  const char* fn = "lookup_forward";
  const size_t n = tables.size();
  if (offsets.size() != n || keys.size() != n || combiners.size() != n || outs.size() != n ||
      (weights && weights->size() != n))
    fail(fn, "tables, row_offsets, keys, combiners, outs (and weights) must have the same length");
  std::vector<LookupArgs> args(n);
  for (size_t t = 0; t < n; ++t) {
    LookupArgs& a = args[t];
    a.table = tables[t].data();
    a.num_rows = static_cast<int64_t>(tables[t].shape(0));
    a.dim = static_cast<int64_t>(tables[t].shape(1));
    a.ids = csr_of(fn, t, offsets[t], keys[t], weights ? &(*weights)[t] : nullptr);
    a.combiner = combiner_of(fn, combiners[t]);
    if (outs[t].shape(0) != static_cast<size_t>(a.ids.batch) || outs[t].shape(1) != static_cast<size_t>(a.dim))
      fail(fn, "outs[" + std::to_string(t) + "] must have shape [" + std::to_string(a.ids.batch) + ", " +
                   std::to_string(a.dim) + "]");
    a.out = outs[t].data();  // offsets and keys: checked inside the kernel
  }
  int bad;
  {
    nb::gil_scoped_release release;
    bad = lookup_forward_cpu(args.data(), static_cast<int>(n), pool(num_threads));
  }
  if (bad >= 0) fail(fn, "table " + std::to_string(bad) + ": " + check_ids(args[bad].ids, args[bad].num_rows));
}

// One table's forward straight from COO: (row_offsets it found, status: "ok" | "bad_key" |
// "unordered"). What lookup_forward_coo_cpu reports, without the adapter's fallback, so tests
// can see that canonical input takes the single pass.
std::tuple<nb::ndarray<nb::numpy, int64_t>, std::string> lookup_forward_coo(
    const CF2& table, const I2& indices, const I1& keys, const std::optional<F1>& weights, int64_t batch,
    const std::string& combiner, F2& out, int num_threads) {
  const char* fn = "lookup_forward_coo";
  if (batch < 0) fail(fn, "batch must be >= 0");
  if (indices.shape(0) != keys.shape(0) || indices.shape(1) < 1)
    fail(fn, "indices must be [nnz, rank >= 1] with one row per key");
  if (weights && weights->shape(0) != keys.shape(0)) fail(fn, "weights must be shaped like keys");
  if (out.shape(0) != static_cast<size_t>(batch) || out.shape(1) != table.shape(1))
    fail(fn, "out must have shape [batch, dim]");
  auto off = new_array<int64_t>({static_cast<size_t>(batch) + 1});
  LookupArgs a;
  a.table = table.data();
  a.num_rows = static_cast<int64_t>(table.shape(0));
  a.dim = static_cast<int64_t>(table.shape(1));
  a.ids.row_offsets = off.data();
  a.ids.keys = keys.data();
  a.ids.weights = weights ? weights->data() : nullptr;
  a.ids.batch = batch;
  a.ids.nnz = static_cast<int64_t>(keys.shape(0));
  a.combiner = combiner_of(fn, combiner);
  a.out = out.data();
  CooRows c;
  c.row_index = indices.data();
  c.stride = static_cast<int64_t>(indices.shape(1));
  c.row_offsets = off.data();
  std::vector<int> status;
  {
    nb::gil_scoped_release release;
    lookup_forward_coo_cpu(&a, &c, 1, pool(num_threads), &status);
  }
  const char* names[] = {"ok", "bad_key", "unordered"};
  return {off, names[status[0]]};
}

// One table's backward arguments (keys not yet checked).
LookupGradArgs grad_args_of(const char* fn, const I1& offsets, const I1& keys, const std::optional<F1>& weights,
                            const std::string& combiner, const CF2& grad_out) {
  LookupGradArgs g;
  g.ids = csr_of(fn, 0, offsets, keys, weights ? &*weights : nullptr);
  g.combiner = combiner_of(fn, combiner);
  g.dim = static_cast<int64_t>(grad_out.shape(1));
  if (grad_out.shape(0) != static_cast<size_t>(g.ids.batch))
    fail(fn, "grad_out has " + std::to_string(grad_out.shape(0)) + " rows, ids have " + std::to_string(g.ids.batch));
  g.grad_out = grad_out.data();
  return g;
}

std::tuple<nb::ndarray<nb::numpy, int64_t>, nb::ndarray<nb::numpy, float>> lookup_backward(
    const I1& offsets, const I1& keys, const std::optional<F1>& weights, const std::string& combiner,
    const CF2& grad_out, int64_t num_rows, int num_threads) {
  const char* fn = "lookup_backward";
  LookupGradArgs g = grad_args_of(fn, offsets, keys, weights, combiner, grad_out);
  const std::string err = check_ids(g.ids, num_rows);
  if (!err.empty()) fail(fn, err);
  LookupGradCpu grad;
  int64_t nu;
  {
    nb::gil_scoped_release release;
    nu = grad.prepare(g, pool(num_threads));
  }
  auto uk = new_array<int64_t>({static_cast<size_t>(nu)});
  auto rows = new_array<float>({static_cast<size_t>(nu), static_cast<size_t>(g.dim)});
  {
    nb::gil_scoped_release release;
    grad.fill(uk.data(), rows.data(), pool(num_threads));
  }
  return {uk, rows};
}

SparseUpdateArgs update_args(const char* fn, F2& table, const I1& indices, const CF2& grads) {
  SparseUpdateArgs a;
  a.table = table.data();
  a.num_rows = static_cast<int64_t>(table.shape(0));
  a.dim = static_cast<int64_t>(table.shape(1));
  a.indices = indices.data();
  a.n = static_cast<int64_t>(indices.shape(0));
  a.grads = grads.data();
  if (grads.shape(0) != indices.shape(0) || static_cast<int64_t>(grads.shape(1)) != a.dim)
    fail(fn, "grads must have shape [len(indices), table dim] = [" + std::to_string(a.n) + ", " +
                 std::to_string(a.dim) + "]");
  for (int64_t i = 0; i < a.n; ++i)
    if (a.indices[i] < 0 || a.indices[i] >= a.num_rows)
      fail(fn, "index " + std::to_string(a.indices[i]) + " at position " + std::to_string(i) +
                   " is outside the table of " + std::to_string(a.num_rows) + " rows");
  if (!strictly_increasing(a.indices, a.n))
    fail(fn, "indices must be unique and ascending (coalesce duplicates first, e.g. with lookup_backward)");
  return a;
}

void check_slot(const char* fn, const char* name, const F2& slot, const SparseUpdateArgs& a) {
  if (static_cast<int64_t>(slot.shape(0)) != a.num_rows || static_cast<int64_t>(slot.shape(1)) != a.dim)
    fail(fn, std::string(name) + " must have the table's shape");
}

void lookup_backward_apply(F2 table, const I1& offsets, const I1& keys, const std::optional<F1>& weights,
                           const std::string& combiner, const CF2& grad_out, const std::string& optimizer, float lr,
                           std::optional<F2> accumulator, std::optional<F2> m, std::optional<F2> v, float epsilon,
                           double beta_1, double beta_2, int64_t step, int num_threads, std::optional<F2> linear,
                           float lr_power, float l1, float l2, float l2_shrinkage, float beta) {
  const char* fn = "lookup_backward_apply";
  const SparseOptimizer opt = optimizer_of(fn, optimizer, lr, epsilon, beta_1, beta_2, step,
                                           embedlab_py::ftrl_of(lr_power, l1, l2, l2_shrinkage, beta));
  LookupGradArgs g = grad_args_of(fn, offsets, keys, weights, combiner, grad_out);
  if (static_cast<int64_t>(table.shape(1)) != g.dim)
    fail(fn, "table has dim " + std::to_string(table.shape(1)) + ", grad_out " + std::to_string(g.dim));
  SparseUpdateArgs t;
  t.table = table.data();
  t.num_rows = static_cast<int64_t>(table.shape(0));
  t.dim = g.dim;
  auto slot = [&](std::optional<F2>& a, const char* name, bool needed) -> float* {
    if (!needed) return nullptr;
    if (!a) fail(fn, optimizer + " needs " + name);
    check_slot(fn, name, *a, t);
    return a->data();
  };
  if (opt.kind == OptimizerKind::kFtrl) {  // accumulator n, linear z
    t.slot1 = slot(accumulator, "accumulator", true);
    t.slot2 = slot(linear, "linear", true);
  } else {
    t.slot1 = opt.kind == OptimizerKind::kAdagrad ? slot(accumulator, "accumulator", true)
                                                   : slot(m, "m", opt.kind == OptimizerKind::kAdam);
    t.slot2 = slot(v, "v", opt.kind == OptimizerKind::kAdam);
  }
  const std::string err = check_ids(g.ids, t.num_rows);  // before anything is written: the table stays as it was
  if (!err.empty()) fail(fn, err);
  nb::gil_scoped_release release;
  LookupGradCpu grad;
  grad.prepare(g, pool(num_threads));
  grad.apply(t, opt, pool(num_threads));
}

// lookup_backward_apply over many tables in one call, as the TensorFlow op does it: every
// table's offsets checked, keys sorted (in parallel, one table per thread when there are at
// least two per thread), keys checked from the sort's min / max (no separate pass; nothing is
// written before every table passed), then each table's gradient summed and applied. The
// per-table state keeps its buffers between calls (no page faults in steady state).
void lookup_backward_apply_many(std::vector<F2>& tables, const std::vector<I1>& offsets, const std::vector<I1>& keys,
                                const std::optional<std::vector<F1>>& weights, const std::vector<std::string>& combiners,
                                const std::vector<CF2>& grad_outs, const std::string& optimizer, float lr,
                                std::optional<std::vector<F2>> accumulators, std::optional<std::vector<F2>> ms,
                                std::optional<std::vector<F2>> vs, float epsilon, double beta_1, double beta_2,
                                int64_t step, int num_threads, std::optional<std::vector<F2>> linears, float lr_power,
                                float l1, float l2, float l2_shrinkage, float beta) {
  const char* fn = "lookup_backward_apply_many";
  const size_t n = tables.size();
  if (offsets.size() != n || keys.size() != n || combiners.size() != n || grad_outs.size() != n ||
      (weights && weights->size() != n))
    fail(fn, "tables, row_offsets, keys, combiners, grad_outs (and weights) must have the same length");
  const SparseOptimizer opt = optimizer_of(fn, optimizer, lr, epsilon, beta_1, beta_2, step,
                                           embedlab_py::ftrl_of(lr_power, l1, l2, l2_shrinkage, beta));
  auto slots = [&](std::optional<std::vector<F2>>& a, const char* name, bool needed) {
    if (needed && (!a || a->size() != n)) fail(fn, optimizer + " needs " + name + ", one per table");
  };
  slots(accumulators, "accumulators", opt.kind == OptimizerKind::kAdagrad || opt.kind == OptimizerKind::kFtrl);
  slots(linears, "linears", opt.kind == OptimizerKind::kFtrl);
  slots(ms, "ms", opt.kind == OptimizerKind::kAdam);
  slots(vs, "vs", opt.kind == OptimizerKind::kAdam);
  std::vector<LookupGradArgs> g(n);
  std::vector<SparseUpdateArgs> tg(n);
  for (size_t t = 0; t < n; ++t) {
    const std::string where = "table " + std::to_string(t) + ": ";
    g[t].ids = csr_of(fn, t, offsets[t], keys[t], weights ? &(*weights)[t] : nullptr);
    g[t].combiner = combiner_of(fn, combiners[t]);
    g[t].dim = static_cast<int64_t>(grad_outs[t].shape(1));
    g[t].grad_out = grad_outs[t].data();
    if (grad_outs[t].shape(0) != static_cast<size_t>(g[t].ids.batch))
      fail(fn, where + "grad_out has " + std::to_string(grad_outs[t].shape(0)) + " rows, ids have " +
                   std::to_string(g[t].ids.batch));
    if (static_cast<int64_t>(tables[t].shape(1)) != g[t].dim)
      fail(fn, where + "table has dim " + std::to_string(tables[t].shape(1)) + ", grad_out " + std::to_string(g[t].dim));
    const std::string err = check_offsets(g[t].ids);  // before any kernel reads them
    if (!err.empty()) fail(fn, where + err);
    SparseUpdateArgs& a = tg[t];
    a.table = tables[t].data();
    a.num_rows = static_cast<int64_t>(tables[t].shape(0));
    a.dim = g[t].dim;
    auto slot = [&](std::optional<std::vector<F2>>& v, const char* name) -> float* {
      F2& x = (*v)[t];
      check_slot(fn, name, x, a);
      return x.data();
    };
    if (opt.kind == OptimizerKind::kAdagrad) a.slot1 = slot(accumulators, "accumulators[t]");
    if (opt.kind == OptimizerKind::kFtrl) {
      a.slot1 = slot(accumulators, "accumulators[t]");
      a.slot2 = slot(linears, "linears[t]");
    }
    if (opt.kind == OptimizerKind::kAdam) {
      a.slot1 = slot(ms, "ms[t]");
      a.slot2 = slot(vs, "vs[t]");
    }
  }
  static std::mutex mu;  // the kept per-table state: one call at a time
  static std::vector<LookupGradCpu> grads;
  std::lock_guard<std::mutex> l(mu);
  if (grads.size() < n) grads.resize(n);
  ThreadPool& p = pool(num_threads);
  const bool per_thread = static_cast<int>(n) >= 2 * p.num_threads();
  auto for_each_table = [&](auto f) {
    if (per_thread) {
      p.parallel_for(static_cast<int64_t>(n), int64_t{1} << 20, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) f(static_cast<size_t>(t), inline_pool());
      });
    } else {
      for (size_t t = 0; t < n; ++t) f(t, p);
    }
  };
  {
    nb::gil_scoped_release release;
    for_each_table([&](size_t t, ThreadPool& tp) { grads[t].prepare(g[t], tp); });
  }
  for (size_t t = 0; t < n; ++t) {
    if (grads[t].min_key() < -1 || grads[t].max_key() >= tg[t].num_rows)
      fail(fn, "table " + std::to_string(t) + ": " + check_ids(g[t].ids, tg[t].num_rows));
  }
  nb::gil_scoped_release release;
  for_each_table([&](size_t t, ThreadPool& tp) { grads[t].apply(tg[t], opt, tp); });
}

}  // namespace

EMBEDLAB_PY_BINDINGS(embedding) {
  m.def("lookup_forward", &lookup_forward, nb::arg("tables"), nb::arg("row_offsets"), nb::arg("keys"),
        nb::arg("weights").none(), nb::arg("combiners"), nb::arg("outs"), nb::arg("num_threads") = 0,
        "Fused pooled lookup of several tables into preallocated outs[t] of shape [batch_t, dim_t].");
  m.def("lookup_forward_coo", &lookup_forward_coo, nb::arg("table"), nb::arg("indices"), nb::arg("keys"),
        nb::arg("weights").none(), nb::arg("batch"), nb::arg("combiner"), nb::arg("out"), nb::arg("num_threads") = 0,
        "One table's pooled lookup straight from COO [nnz, rank] indices in row order, into out [batch, dim]:\n"
        "(row_offsets found, status 'ok' | 'bad_key' | 'unordered'); 'unordered' leaves out unspecified.");
  m.def("lookup_backward", &lookup_backward, nb::arg("row_offsets"), nb::arg("keys"), nb::arg("weights").none(),
        nb::arg("combiner"), nb::arg("grad_out"), nb::arg("num_rows"), nb::arg("num_threads") = 0,
        "Backward of one table's lookup: (unique_keys ascending, summed gradient rows).");
  m.def("lookup_backward_apply", &lookup_backward_apply, nb::arg("table"), nb::arg("row_offsets"), nb::arg("keys"),
        nb::arg("weights").none(), nb::arg("combiner"), nb::arg("grad_out"), nb::arg("optimizer"), nb::arg("lr"),
        nb::arg("accumulator").none() = nb::none(), nb::arg("m").none() = nb::none(),
        nb::arg("v").none() = nb::none(), nb::arg("epsilon") = 1e-7f, nb::arg("beta_1") = 0.9,
        nb::arg("beta_2") = 0.999, nb::arg("step") = 1, nb::arg("num_threads") = 0,
        nb::arg("linear").none() = nb::none(), nb::arg("lr_power") = -0.5f, nb::arg("l1") = 0.f, nb::arg("l2") = 0.f,
        nb::arg("l2_shrinkage") = 0.f, nb::arg("beta") = 0.f,
        "Fused backward + optimizer ('sgd' | 'adagrad' | 'adam' | 'ftrl') on the touched rows of `table` (in\n"
        "place); the gradient is never materialized. Same bits as lookup_backward followed by sparse_<opt>.\n"
        "ftrl: accumulator (n), linear (z), lr_power, l1, l2, l2_shrinkage, beta (Keras 3's Ftrl).");
  m.def("lookup_backward_apply_many", &lookup_backward_apply_many, nb::arg("tables"), nb::arg("row_offsets"),
        nb::arg("keys"), nb::arg("weights").none(), nb::arg("combiners"), nb::arg("grad_outs"), nb::arg("optimizer"),
        nb::arg("lr"), nb::arg("accumulators").none() = nb::none(), nb::arg("ms").none() = nb::none(),
        nb::arg("vs").none() = nb::none(), nb::arg("epsilon") = 1e-7f, nb::arg("beta_1") = 0.9,
        nb::arg("beta_2") = 0.999, nb::arg("step") = 1, nb::arg("num_threads") = 0,
        nb::arg("linears").none() = nb::none(), nb::arg("lr_power") = -0.5f, nb::arg("l1") = 0.f,
        nb::arg("l2") = 0.f, nb::arg("l2_shrinkage") = 0.f, nb::arg("beta") = 0.f,
        "lookup_backward_apply for many tables in one call (lists; slots: accumulators / ms, vs / accumulators,\n"
        "linears, one per table):\n"
        "tables sorted in parallel and checked before anything is written. Same bits as table-by-table calls.");
  m.def(
      "sparse_sgd",
      [](F2 table, I1 indices, CF2 grads, float lr, int num_threads) {
        auto a = update_args("sparse_sgd", table, indices, grads);
        nb::gil_scoped_release r;
        sparse_sgd_cpu(&a, 1, SgdParams{lr}, pool(num_threads));
      },
      nb::arg("table"), nb::arg("indices"), nb::arg("grads"), nb::arg("lr"), nb::arg("num_threads") = 0);
  m.def(
      "sparse_adagrad",
      [](F2 table, F2 acc, I1 indices, CF2 grads, float lr, float eps, int num_threads) {
        auto a = update_args("sparse_adagrad", table, indices, grads);
        check_slot("sparse_adagrad", "accumulator", acc, a);
        a.slot1 = acc.data();
        nb::gil_scoped_release r;
        sparse_adagrad_cpu(&a, 1, AdagradParams{lr, eps}, pool(num_threads));
      },
      nb::arg("table"), nb::arg("accumulator"), nb::arg("indices"), nb::arg("grads"), nb::arg("lr"),
      nb::arg("epsilon"), nb::arg("num_threads") = 0);
  m.def(
      "sparse_adam",
      [](F2 table, F2 mo, F2 ve, I1 indices, CF2 grads, float lr, double b1, double b2, float eps, int64_t step,
         int num_threads) {
        auto a = update_args("sparse_adam", table, indices, grads);
        check_slot("sparse_adam", "m", mo, a);
        check_slot("sparse_adam", "v", ve, a);
        if (step < 1) fail("sparse_adam", "step must be >= 1, got " + std::to_string(step));
        a.slot1 = mo.data();
        a.slot2 = ve.data();
        nb::gil_scoped_release r;
        sparse_adam_cpu(&a, 1, AdamParams{lr, b1, b2, eps, step}, pool(num_threads));
      },
      nb::arg("table"), nb::arg("m"), nb::arg("v"), nb::arg("indices"), nb::arg("grads"), nb::arg("lr"),
      nb::arg("beta_1"), nb::arg("beta_2"), nb::arg("epsilon"), nb::arg("step"), nb::arg("num_threads") = 0);
  m.def(
      "sparse_ftrl",
      [](F2 table, F2 acc, F2 lin, I1 indices, CF2 grads, float lr, float lr_power, float l1, float l2,
         float l2_shrinkage, float beta, int num_threads) {
        const char* fn = "sparse_ftrl";
        auto a = update_args(fn, table, indices, grads);
        check_slot(fn, "accumulator", acc, a);
        check_slot(fn, "linear", lin, a);
        FtrlParams p = embedlab_py::ftrl_of(lr_power, l1, l2, l2_shrinkage, beta);
        p.lr = lr;
        const std::string err = check_ftrl(p);
        if (!err.empty()) fail(fn, err);
        a.slot1 = acc.data();
        a.slot2 = lin.data();
        nb::gil_scoped_release r;
        sparse_ftrl_cpu(&a, 1, p, pool(num_threads));
      },
      nb::arg("table"), nb::arg("accumulator"), nb::arg("linear"), nb::arg("indices"), nb::arg("grads"),
      nb::arg("lr"), nb::arg("lr_power") = -0.5f, nb::arg("l1") = 0.f, nb::arg("l2") = 0.f,
      nb::arg("l2_shrinkage") = 0.f, nb::arg("beta") = 0.f, nb::arg("num_threads") = 0,
      "Keras 3 FTRL on the given rows (unique, ascending; in place): accumulator n, linear z.");
  m.def(
      "coo_to_csr",
      [](I1 row_index, int64_t batch) {
        if (batch < 0) fail("coo_to_csr", "batch must be >= 0");
        auto off = new_array<int64_t>({static_cast<size_t>(batch) + 1});
        auto perm = new_array<int64_t>({row_index.shape(0)});
        const std::string err = coo_to_csr_cpu(row_index.data(), static_cast<int64_t>(row_index.shape(0)), batch,
                                               off.data(), perm.data());
        if (!err.empty()) fail("coo_to_csr", err);
        return std::make_tuple(off, perm);
      },
      nb::arg("row_index"), nb::arg("batch"));
}

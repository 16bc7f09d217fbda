// CPU OpKernels of the sparse optimizers, Global Adam and the fused backward + optimizer (ops:
// sparse_optimizer_ops.cc): validate, translate tensors to core structs, call csrc/core. Every
// check runs before anything is written, so bad input leaves tables and optimizer state
// unchanged.
#define EIGEN_USE_THREADS

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

#include "adapter.h"
#include "adapter_cpu.h"
#include "embedding.h"
#include "huge_pages.h"
#include "sparse_optimizer.h"
#include "tf_pool.h"

namespace tensorflow {
namespace {

using CPUDevice = Eigen::ThreadPoolDevice;

// ---- sparse optimizers -----------------------------------------------------------------------

// Shared by the three optimizer ops: `num_slots` resource inputs follow the variables
// (0 for SGD, 1 for Adagrad, 2 for Adam); then indices, grads, and the scalar hyperparameters.
// The variables of an in-place update: n tables and their optimizer slots, the resource
// inputs [first, first + n * (1 + slots)) (tables, then slot 1 of every table, then slot 2),
// locked exclusively in address order (TensorFlow's own helper) while this object lives, and
// checked: initialized float matrices, slots shaped like their table. sparse=true, as
// TensorFlow's own ResourceSparseApply* ops do: the variable switches once to copy-on-read mode
// and is then updated in place. The dense protocol (sparse=false) would copy the whole table on
// every update once any sparse op (e.g. tf.gather) has touched the variable.
class LockedState {
 public:
  absl::Status Lock(OpKernelContext* ctx, int first, int n, int slots, const char* slot1_name,
                    const char* slot2_name = "vs") {
    n_ = n;
    std::vector<int> inputs;
    for (int i = 0; i < n * (1 + slots); ++i) inputs.push_back(first + i);
    locks_.emplace(MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(ctx, /*do_lock=*/true, /*sparse=*/true,
                                                                          inputs));
    vars_.resize(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      TF_RETURN_IF_ERROR(GetInputTensorFromVariable<CPUDevice, float>(ctx, inputs[i], /*lock_held=*/true,
                                                                      /*sparse=*/true, &vars_[i]));
      if (vars_[i].IsInitialized()) embedlab::advise_huge_pages(vars_[i].tensor_data().data(), vars_[i].TotalBytes());
    }
    const std::string& op = ctx->op_kernel().type_string();
    const char* names[3] = {"vars", slot1_name, slot2_name};
    for (int t = 0; t < n; ++t) {
      const Tensor& w = vars_[t];
      if (!w.IsInitialized() || w.dims() != 2)
        return errors::InvalidArgument(Where(op, "vars", t), " must be an initialized float matrix, got ",
                                       w.shape().DebugString());
      for (int s = 1; s <= slots; ++s) {
        const Tensor& v = vars_[s * n + t];
        if (!v.IsInitialized() || v.shape() != w.shape())
          return errors::InvalidArgument(Where(op, names[s], t), " must be an initialized float matrix shaped like vars[",
                                         t, "] ", w.shape().DebugString(), ", got ", v.shape().DebugString());
      }
    }
    return absl::OkStatus();
  }

  int64_t rows(int t) const { return vars_[t].dim_size(0); }
  int64_t dim(int t) const { return vars_[t].dim_size(1); }
  // Table t as an update target (indices, grads and n left empty).
  embedlab::SparseUpdateArgs target(int t) {
    embedlab::SparseUpdateArgs a;
    a.table = vars_[t].flat<float>().data();
    const int slots = static_cast<int>(vars_.size()) / n_ - 1;
    a.slot1 = slots >= 1 ? vars_[n_ + t].flat<float>().data() : nullptr;
    a.slot2 = slots >= 2 ? vars_[2 * n_ + t].flat<float>().data() : nullptr;
    a.num_rows = rows(t);
    a.dim = dim(t);
    return a;
  }

 private:
  int n_ = 0;
  std::optional<VariableInputLockHolder> locks_;
  std::vector<Tensor> vars_;
};

template <int kSlots, typename Apply>
void ApplySparse(OpKernel* self, OpKernelContext* ctx, int n, Apply apply, const char* slot1_name = nullptr,
                 const char* slot2_name = "vs") {
  const std::string& op = self->type_string();
  LockedState state;
  OP_REQUIRES_OK(ctx, state.Lock(ctx, 0, n, kSlots, slot1_name ? slot1_name : kSlots == 1 ? "accumulators" : "ms",
                                 slot2_name));
  const int idx0 = n * (1 + kSlots), grad0 = idx0 + n;
  TfPool pool(ctx);
  std::vector<embedlab::SparseUpdateArgs> args(n);
  // Coalesced copies for tables whose indices repeat (kept alive until the update).
  std::vector<std::vector<int64_t>> co_idx(n);
  std::vector<std::vector<float>> co_rows(n);
  for (int t = 0; t < n; ++t) {
    const Tensor& idx = ctx->input(idx0 + t);
    const Tensor& g = ctx->input(grad0 + t);
    const int64_t rows = state.rows(t), dim = state.dim(t);
    OP_REQUIRES(ctx, idx.dims() == 1,
                errors::InvalidArgument(Where(op, "indices", t), " must be a vector, got ", idx.shape().DebugString()));
    OP_REQUIRES(ctx, g.dims() == 2 && g.dim_size(0) == idx.NumElements() && g.dim_size(1) == dim,
                errors::InvalidArgument(Where(op, "grads", t), " must have shape [", idx.NumElements(), ", ", dim,
                                        "], got ", g.shape().DebugString()));
    const int64_t* ip = idx.flat<int64_t>().data();
    const int64_t m = idx.NumElements();
    for (int64_t i = 0; i < m; ++i) {
      OP_REQUIRES(ctx, ip[i] >= 0 && ip[i] < rows,
                  errors::InvalidArgument(Where(op, "indices", t), ": index ", ip[i], " at position ", i,
                                          " is outside the table of ", rows, " rows; nothing was updated"));
    }
    embedlab::SparseUpdateArgs& a = args[t];
    a = state.target(t);
    if (embedlab::strictly_increasing(ip, m)) {
      a.indices = ip;
      a.grads = g.flat<float>().data();
      a.n = m;
    } else {
      embedlab::coalesce_cpu(ip, g.flat<float>().data(), m, dim, rows, &co_idx[t], &co_rows[t], pool);
      a.indices = co_idx[t].data();
      a.grads = co_rows[t].data();
      a.n = static_cast<int64_t>(co_idx[t].size());
    }
  }
  apply(args, pool);
}

bool Scalar(OpKernelContext* ctx, int i, const char* name, float* out) {
  const Tensor& t = ctx->input(i);
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    ctx->CtxFailure(errors::InvalidArgument(ctx->op_kernel().type_string(), ": ", name,
                                            " must be a scalar, got shape ", t.shape().DebugString()));
    return false;
  }
  *out = t.scalar<float>()();
  return true;
}
#define EMBEDLAB_SCALAR(var, i, name) \
  float var;                          \
  if (!Scalar(ctx, i, name, &var)) return;

// Adam's hyperparameters from inputs first .. first + 4: lr, beta_1 (double), beta_2 (double),
// epsilon, step (int64, 1-based). False (with the op failed) when one is malformed.
bool AdamInputs(OpKernelContext* ctx, int first, embedlab::AdamParams* p) {
  const std::string& op = ctx->op_kernel().type_string();
  float lr, eps;
  if (!Scalar(ctx, first, "lr", &lr) || !Scalar(ctx, first + 3, "epsilon", &eps)) return false;
  const Tensor& b1 = ctx->input(first + 1);
  const Tensor& b2 = ctx->input(first + 2);
  const Tensor& step = ctx->input(first + 4);
  if (!TensorShapeUtils::IsScalar(b1.shape()) || !TensorShapeUtils::IsScalar(b2.shape()) ||
      !TensorShapeUtils::IsScalar(step.shape())) {
    ctx->CtxFailure(errors::InvalidArgument(op, ": beta_1, beta_2 and step must be scalars"));
    return false;
  }
  const int64_t t = step.scalar<int64_t>()();
  if (t < 1) {
    ctx->CtxFailure(errors::InvalidArgument(op, ": step must be >= 1, got ", t));
    return false;
  }
  *p = {lr, b1.scalar<double>()(), b2.scalar<double>()(), eps, t};
  return true;
}

class SparseApplySgdOp : public OpKernel {
 public:
  explicit SparseApplySgdOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, c->GetAttr("num_tables", &n_)); }
  void Compute(OpKernelContext* ctx) override {
    EMBEDLAB_SCALAR(lr, 3 * n_, "lr");
    ApplySparse<0>(this, ctx, n_, [&](std::vector<embedlab::SparseUpdateArgs>& a, embedlab::ThreadPool& p) {
      embedlab::sparse_sgd_cpu(a.data(), n_, {lr}, p);
    });
  }

 private:
  int n_;
};

class SparseApplyAdagradOp : public OpKernel {
 public:
  explicit SparseApplyAdagradOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, c->GetAttr("num_tables", &n_)); }
  void Compute(OpKernelContext* ctx) override {
    EMBEDLAB_SCALAR(lr, 4 * n_, "lr");
    EMBEDLAB_SCALAR(eps, 4 * n_ + 1, "epsilon");
    ApplySparse<1>(this, ctx, n_, [&](std::vector<embedlab::SparseUpdateArgs>& a, embedlab::ThreadPool& p) {
      embedlab::sparse_adagrad_cpu(a.data(), n_, {lr, eps}, p);
    });
  }

 private:
  int n_;
};

class SparseApplyAdamOp : public OpKernel {
 public:
  explicit SparseApplyAdamOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, c->GetAttr("num_tables", &n_)); }
  void Compute(OpKernelContext* ctx) override {
    embedlab::AdamParams adam;
    if (!AdamInputs(ctx, 5 * n_, &adam)) return;
    ApplySparse<2>(this, ctx, n_, [&](std::vector<embedlab::SparseUpdateArgs>& a, embedlab::ThreadPool& p) {
      embedlab::sparse_adam_cpu(a.data(), n_, adam, p);
    });
  }

 private:
  int n_;
};

// FTRL's attributes (lr_power, l1, l2, l2_shrinkage, beta); lr is an input, set at Compute.
absl::Status FtrlAttrs(OpKernelConstruction* c, embedlab::FtrlParams* p) {
  TF_RETURN_IF_ERROR(c->GetAttr("lr_power", &p->lr_power));
  TF_RETURN_IF_ERROR(c->GetAttr("l1", &p->l1));
  TF_RETURN_IF_ERROR(c->GetAttr("l2", &p->l2));
  TF_RETURN_IF_ERROR(c->GetAttr("l2_shrinkage", &p->l2_shrinkage));
  return c->GetAttr("beta", &p->beta);
}

class SparseApplyFtrlOp : public OpKernel {
 public:
  explicit SparseApplyFtrlOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("num_tables", &n_));
    OP_REQUIRES_OK(c, FtrlAttrs(c, &ftrl_));
  }
  void Compute(OpKernelContext* ctx) override {
    EMBEDLAB_SCALAR(lr, 5 * n_, "lr");
    embedlab::FtrlParams p = ftrl_;
    p.lr = lr;
    const std::string err = embedlab::check_ftrl(p);
    OP_REQUIRES(ctx, err.empty(), errors::InvalidArgument(type_string(), ": ", err));
    ApplySparse<2>(
        this, ctx, n_,
        [&](std::vector<embedlab::SparseUpdateArgs>& a, embedlab::ThreadPool& tp) {
          embedlab::sparse_ftrl_cpu(a.data(), n_, p, tp);
        },
        "accumulators", "linears");
  }

 private:
  int n_;
  embedlab::FtrlParams ftrl_;
};

class GlobalApplyAdamOp : public OpKernel {
 public:
  explicit GlobalApplyAdamOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, c->GetAttr("num_tables", &n_)); }
  void Compute(OpKernelContext* ctx) override {
    embedlab::AdamParams adam;
    if (!AdamInputs(ctx, 5 * n_, &adam)) return;
    const Tensor& used_t = ctx->input(5 * n_ + 5);
    OP_REQUIRES(ctx, used_t.dims() == 1 && used_t.NumElements() == n_,
                errors::InvalidArgument(type_string(), ": rows_used must be a vector of ", n_, " entries, got shape ",
                                        used_t.shape().DebugString()));
    const int64_t* used = used_t.flat<int64_t>().data();
    ApplySparse<2>(this, ctx, n_, [&](std::vector<embedlab::SparseUpdateArgs>& a, embedlab::ThreadPool& p) {
      for (int t = 0; t < n_; ++t) {
        OP_REQUIRES(ctx, used[t] >= 0 && used[t] <= a[t].num_rows,
                    errors::InvalidArgument(type_string(), ": rows_used[", t, "] = ", used[t], " is outside [0, ",
                                            a[t].num_rows, "]; nothing was updated"));
      }
      embedlab::global_adam_cpu(a.data(), used, n_, adam, p);
    });
  }

 private:
  int n_;
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabGlobalApplyAdam").Device(DEVICE_CPU), GlobalApplyAdamOp);

class GlobalAdamCatchUpOp : public OpKernel {
 public:
  explicit GlobalAdamCatchUpOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const std::string& op = type_string();
    const Tensor& rows_t = ctx->input(4);
    const Tensor& all_t = ctx->input(5);
    const Tensor& target_t = ctx->input(6);
    const Tensor& ring_t = ctx->input(7);
    OP_REQUIRES(ctx, rows_t.dims() == 1, errors::InvalidArgument(op, ": rows must be a vector, got ", rows_t.shape().DebugString()));
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(all_t.shape()) && TensorShapeUtils::IsScalar(target_t.shape()),
                errors::InvalidArgument(op, ": all_rows and target must be scalars"));
    OP_REQUIRES(ctx, ring_t.dims() == 1 && ring_t.NumElements() >= 1,
                errors::InvalidArgument(op, ": lr_ring must be a non-empty vector, got ", ring_t.shape().DebugString()));
    const Tensor& b1_t = ctx->input(8);
    const Tensor& b2_t = ctx->input(9);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(b1_t.shape()) && TensorShapeUtils::IsScalar(b2_t.shape()),
                errors::InvalidArgument(op, ": beta_1 and beta_2 must be scalars"));
    EMBEDLAB_SCALAR(eps, 10, "epsilon");
    const int64_t target = target_t.scalar<int64_t>()(), all_rows = all_t.scalar<int64_t>()();
    OP_REQUIRES(ctx, target >= 0, errors::InvalidArgument(op, ": target must be >= 0, got ", target));
    LockedState state;
    OP_REQUIRES_OK(ctx, state.Lock(ctx, 0, 1, 2, "m"));
    VariableInputLockHolder lock =
        MaybeLockVariableInputMutexesInOrder<CPUDevice, int64_t>(ctx, /*do_lock=*/true, /*sparse=*/true, {3});
    Tensor last;
    OP_REQUIRES_OK(ctx, GetInputTensorFromVariable<CPUDevice, int64_t>(ctx, 3, /*lock_held=*/true, /*sparse=*/true, &last));
    const int64_t num_rows = state.rows(0);
    OP_REQUIRES(ctx, last.IsInitialized() && last.dims() == 1 && last.dim_size(0) == num_rows,
                errors::InvalidArgument(op, ": last must be an int64 vector of the table's ", num_rows,
                                        " rows, got ", last.shape().DebugString()));
    OP_REQUIRES(ctx, all_rows <= num_rows,
                errors::InvalidArgument(op, ": all_rows ", all_rows, " is more than the table's ", num_rows, " rows"));
    const int64_t* rows = rows_t.flat<int64_t>().data();
    const int64_t n = rows_t.NumElements();
    if (all_rows < 0) {
      for (int64_t i = 0; i < n; ++i) {
        OP_REQUIRES(ctx, rows[i] >= 0 && rows[i] < num_rows,
                    errors::InvalidArgument(op, ": row ", rows[i], " at position ", i, " is outside the table of ",
                                            num_rows, " rows; nothing was updated"));
      }
    }
    embedlab::SparseUpdateArgs a = state.target(0);
    TfPool pool(ctx);
    embedlab::AdamParams p{0.f, b1_t.scalar<double>()(), b2_t.scalar<double>()(), eps, 0};
    const int64_t behind = embedlab::global_adam_catch_up_cpu(
        a.table, a.slot1, a.slot2, last.flat<int64_t>().data(), num_rows, a.dim, rows, n, all_rows, target,
        ring_t.flat<float>().data(), ring_t.NumElements(), p, pool);
    OP_REQUIRES(ctx, behind < 0,
                errors::InvalidArgument(op, ": row ", behind, " is current only through step ",
                                        last.flat<int64_t>()(behind), ", more than ", ring_t.NumElements() - 1,
                                        " steps before step ", target, " (the learning-rate ring's reach); "
                                        "nothing was updated"));
  }
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabGlobalAdamCatchUp").Device(DEVICE_CPU), GlobalAdamCatchUpOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabSparseApplySGD").Device(DEVICE_CPU), SparseApplySgdOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabSparseApplyAdagrad").Device(DEVICE_CPU), SparseApplyAdagradOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabSparseApplyAdam").Device(DEVICE_CPU), SparseApplyAdamOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabSparseApplyFtrl").Device(DEVICE_CPU), SparseApplyFtrlOp);

// ---- fused backward + optimizer --------------------------------------------------------------

class FusedLookupGradApplyOp : public OpKernel {
 public:
  explicit FusedLookupGradApplyOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, prep_.Init(c));
    OP_REQUIRES_OK(c, c->GetAttr("num_weights", &nw_));
    OP_REQUIRES_OK(c, c->GetAttr("num_slots", &ns_));
    OP_REQUIRES_OK(c, c->GetAttr("optimizer", &optimizer_));
    OP_REQUIRES_OK(c, FtrlAttrs(c, &ftrl_));
    const int per_table = optimizer_ == "adam" || optimizer_ == "ftrl" ? 2 : optimizer_ == "adagrad" ? 1 : 0;
    OP_REQUIRES(c, ns_ == per_table * prep_.n(),
                errors::InvalidArgument(c->def().op(), ": ", optimizer_, " needs ", per_table * prep_.n(),
                                        " slot variables for ", prep_.n(), " tables, got ", ns_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int n = prep_.n();
    const int var0 = 3 * n + nw_, hyper0 = var0 + n + ns_;
    EMBEDLAB_SCALAR(lr, hyper0, "lr");
    EMBEDLAB_SCALAR(eps, hyper0 + 1, "epsilon");
    const Tensor& b1 = ctx->input(hyper0 + 2);
    const Tensor& b2 = ctx->input(hyper0 + 3);
    const Tensor& step = ctx->input(hyper0 + 4);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(b1.shape()) && TensorShapeUtils::IsScalar(b2.shape()) &&
                         TensorShapeUtils::IsScalar(step.shape()),
                errors::InvalidArgument(type_string(), ": beta_1, beta_2 and step must be scalars"));
    embedlab::SparseOptimizer opt;
    const std::string err = embedlab::make_optimizer(optimizer_, lr, eps, b1.scalar<double>()(), b2.scalar<double>()(),
                                                     step.scalar<int64_t>()(), &opt, &ftrl_);
    OP_REQUIRES(ctx, err.empty(), errors::InvalidArgument(type_string(), ": ", err));

    LockedState state;
    const bool ftrl = optimizer_ == "ftrl";
    OP_REQUIRES_OK(ctx, state.Lock(ctx, var0, n, ns_ / n, optimizer_ == "adagrad" || ftrl ? "accumulators" : "ms",
                                   ftrl ? "linears" : "vs"));
    std::vector<int64_t> rows(n);
    for (int t = 0; t < n; ++t) rows[t] = state.rows(t);
    TfPool pool(ctx);
    mutex_lock lock(prep_.mu);
    OP_REQUIRES_OK(ctx, prep_.Run(ctx, pool, rows));  // every key checked against its table
    for (int t = 0; t < n; ++t) {
      OP_REQUIRES(ctx, state.dim(t) == prep_.args(t).dim,
                  errors::InvalidArgument(Where(type_string(), "grads", t), " has dim ", prep_.args(t).dim,
                                          " but vars[", t, "] has dim ", state.dim(t)));
    }
    std::vector<embedlab::LookupGradCpu>& grads = prep_.grads();
    ForEachTable(pool, n, [&](int t, embedlab::ThreadPool& p) { grads[t].apply(state.target(t), opt, p); });
  }

 private:
  GradPrep prep_;
  int nw_, ns_;
  std::string optimizer_;
  embedlab::FtrlParams ftrl_;
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabFusedLookupGradApply").Device(DEVICE_CPU), FusedLookupGradApplyOp);

}  // namespace
}  // namespace tensorflow

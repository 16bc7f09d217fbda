// CPU OpKernels: validate, translate tensors to core structs, call csrc/core. Every check
// runs before anything is written, so bad input leaves tables and optimizer state unchanged.
#define EIGEN_USE_THREADS

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/kernels/training_op_helpers.h"
#include "tensorflow/core/platform/blocking_counter.h"

#include "adapter.h"
#include "embedding.h"
#include "memory.h"
#include "tf_pool.h"

namespace tensorflow {
namespace {

using CPUDevice = Eigen::ThreadPoolDevice;

using embedlab_tf::TfPool;

using embedlab_tf::LookupAttrs;
using embedlab_tf::SharedLocks;
using embedlab_tf::Where;

// The lookup ops' CSR inputs, checked on the CPU.
class LookupInputs : public LookupAttrs {
 public:
  // Fills ids[t] (shapes checked). With check_offsets, row_offsets are validated here (what
  // the backward needs before it reads them); the forward passes false: its kernel validates
  // offsets and keys in the same pass as the lookup. Keys are never checked here.
  absl::Status Read(OpKernelContext* ctx, bool check_offsets, std::vector<embedlab::CsrIds>* ids) {
    const std::string& op = ctx->op_kernel().type_string();
    ids->resize(n());
    for (int t = 0; t < n(); ++t) {
      embedlab::CsrIds& c = (*ids)[t];
      TF_RETURN_IF_ERROR(ReadIds(ctx, t, &c));
      const std::string err = check_offsets ? embedlab::check_offsets(c) : "";
      if (!err.empty()) return errors::InvalidArgument(Where(op, "ids", t), ": ", err);
    }
    return absl::OkStatus();
  }
};

// ---- COO -> CSR ------------------------------------------------------------------------------

// Several [batch, max_nnz] SparseTensors (and their weights) as CSR ids, written to an op's
// outputs: the inputs of table t are indices at in0 + t, values at in0 + n + t, dense_shape at
// in0 + 2n + t and weights at in0 + 3n + t; the outputs row_splits at out0 + t, keys at
// out0 + n + t and weights at out0 + 2n + t. Shared by EmbedLabSparseToCsr and the forward that
// reads SparseTensors itself.
class CooToCsr {
 public:
  absl::Status Init(OpKernelConstruction* c) {
    TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &n_));
    return c->GetAttr("num_weights", &nw_);
  }

  absl::Status Convert(OpKernelContext* ctx, TfPool& pool, int in0, int out0) const {
    // Shapes checked and row_splits allocated on this thread; the row offsets (one sequential
    // pass over each table's indices, bound by memory bandwidth) computed for all tables in
    // parallel: on one thread the other core sat idle for ~0.3 ms per step (2-core VM).
    std::vector<int64_t*> off(n_);
    int64_t nnz = 0;
    for (int t = 0; t < n_; ++t) {
      TF_RETURN_IF_ERROR(Check(ctx, t, in0, out0, &off[t]));
      nnz += ctx->input(in0 + t).dim_size(0);
    }
    std::vector<std::string> err(n_);
    std::vector<char> in_order(n_, 0);
    pool.parallel_for(n_, std::max<int64_t>(1, nnz / n_), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const Tensor& indices = ctx->input(in0 + t);
        bool ordered = false;
        err[t] = embedlab::coo_row_offsets_cpu(indices.flat<int64_t>().data(), indices.dim_size(0),
                                               ctx->input(in0 + 2 * n_ + t).flat<int64_t>()(0), off[t], &ordered,
                                               indices.dim_size(1));
        in_order[t] = ordered;
      }
    });
    for (int t = 0; t < n_; ++t) {
      if (!err[t].empty()) return errors::InvalidArgument(Ids(ctx, t), ": SparseTensor ", err[t]);
      TF_RETURN_IF_ERROR(Keys(ctx, t, in0, out0, in_order[t] != 0));
    }
    return absl::OkStatus();
  }

  int n() const { return n_; }
  int nw() const { return nw_; }

  // Worded only on an error: these ops run every step.
  std::string Ids(OpKernelContext* ctx, int t) const { return Where(ctx->op_kernel().type_string(), "ids", t); }

  // Checks table t's shapes and allocates its row_splits output (*off).
  absl::Status Check(OpKernelContext* ctx, int t, int in0, int out0, int64_t** off) const {
    const Tensor& indices = ctx->input(in0 + t);
    const Tensor& values = ctx->input(in0 + n_ + t);
    const Tensor& shape = ctx->input(in0 + 2 * n_ + t);
    const Tensor* weights = nw_ > 0 ? &ctx->input(in0 + 3 * n_ + t) : nullptr;
    if (indices.dims() != 2 || indices.dim_size(1) < 1)
      return errors::InvalidArgument(Ids(ctx, t), ": SparseTensor indices must be [nnz, rank], got ",
                                     indices.shape().DebugString());
    const int64_t nnz = indices.dim_size(0), rank = indices.dim_size(1);
    if (values.dims() != 1 || values.dim_size(0) != nnz)
      return errors::InvalidArgument(Ids(ctx, t), ": SparseTensor has ", nnz, " indices but values of shape ",
                                     values.shape().DebugString());
    if (shape.dims() != 1 || shape.NumElements() != rank)
      return errors::InvalidArgument(Ids(ctx, t), ": dense_shape must have ", rank, " entries");
    if (weights && (weights->dims() != 1 || weights->dim_size(0) != nnz))
      return errors::InvalidArgument(Where(ctx->op_kernel().type_string(), "weights", t), " have shape ",
                                     weights->shape().DebugString(), " but ids have ", nnz,
                                     " values; weights must be shaped like ids");
    const int64_t batch = shape.flat<int64_t>()(0);
    if (batch < 0) return errors::InvalidArgument(Ids(ctx, t), ": dense_shape[0] must be >= 0, got ", batch);
    Tensor* splits = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(out0 + t, TensorShape({batch + 1}), &splits));
    *off = splits->flat<int64_t>().data();
    return absl::OkStatus();
  }

  // Table t's keys (and weights) in row order: the inputs themselves when they already are
  // (any canonical SparseTensor: no copy), else a stable counting sort by row.
  absl::Status Keys(OpKernelContext* ctx, int t, int in0, int out0, bool in_order) const {
    const Tensor& indices = ctx->input(in0 + t);
    const Tensor& values = ctx->input(in0 + n_ + t);
    const Tensor* weights = nw_ > 0 ? &ctx->input(in0 + 3 * n_ + t) : nullptr;
    if (in_order) {
      ctx->set_output(out0 + n_ + t, values);
      if (weights) ctx->set_output(out0 + 2 * n_ + t, *weights);
      return absl::OkStatus();
    }
    const int64_t nnz = indices.dim_size(0);
    Tensor *keys_out = nullptr, *w_out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(out0 + n_ + t, values.shape(), &keys_out));
    if (weights) TF_RETURN_IF_ERROR(ctx->allocate_output(out0 + 2 * n_ + t, weights->shape(), &w_out));
    Tensor* splits = ctx->mutable_output(out0 + t);
    std::vector<int64_t> perm(nnz);
    const std::string err = embedlab::coo_to_csr_cpu(indices.flat<int64_t>().data(), nnz, splits->NumElements() - 1,
                                                     splits->flat<int64_t>().data(), perm.data(), indices.dim_size(1));
    if (!err.empty()) return errors::InvalidArgument(Ids(ctx, t), ": SparseTensor ", err);
    const int64_t* v = values.flat<int64_t>().data();
    int64_t* k = keys_out->flat<int64_t>().data();
    for (int64_t j = 0; j < nnz; ++j) k[j] = v[perm[j]];
    if (weights) {
      const float* w = weights->flat<float>().data();
      float* wo = w_out->flat<float>().data();
      for (int64_t j = 0; j < nnz; ++j) wo[j] = w[perm[j]];
    }
    return absl::OkStatus();
  }

 private:
  int n_ = 0, nw_ = 0;
};

class SparseToCsrOp : public OpKernel {
 public:
  explicit SparseToCsrOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, coo_.Init(c)); }

  void Compute(OpKernelContext* ctx) override {
    TfPool pool(ctx);
    OP_REQUIRES_OK(ctx, coo_.Convert(ctx, pool, /*in0=*/0, /*out0=*/0));
  }

 private:
  CooToCsr coo_;
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabSparseToCsr").Device(DEVICE_CPU), SparseToCsrOp);

// ---- forward ---------------------------------------------------------------------------------

// The forward's arguments for a lookup of tables[t] (variables read in place, or input tensors)
// by ids[t], with outputs 0..n allocated as [batch_t, dim_t].
absl::Status ForwardArgs(OpKernelContext* ctx, const LookupAttrs& attrs, const std::vector<Tensor>& tables,
                         const std::vector<embedlab::CsrIds>& ids, std::vector<embedlab::LookupArgs>* args) {
  args->resize(attrs.n());
  for (int t = 0; t < attrs.n(); ++t) {
    embedlab::LookupArgs& a = (*args)[t];
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(t, TensorShape({ids[t].batch, tables[t].dim_size(1)}), &out));
    a.table = tables[t].flat<float>().data();
    a.num_rows = tables[t].dim_size(0);
    a.dim = tables[t].dim_size(1);
    a.ids = ids[t];
    a.combiner = attrs.combiner(t);
    a.out = out->flat<float>().data();
  }
  return absl::OkStatus();
}

// The pooled lookup of tables[t] by ids[t] into freshly allocated outputs 0..n; offsets and
// keys are validated inside the kernel's pass.
void RunForward(OpKernelContext* ctx, const LookupAttrs& attrs, const std::vector<Tensor>& tables,
                const std::vector<embedlab::CsrIds>& ids, TfPool& pool) {
  std::vector<embedlab::LookupArgs> args;
  OP_REQUIRES_OK(ctx, ForwardArgs(ctx, attrs, tables, ids, &args));
  const int bad = embedlab::lookup_forward_cpu(args.data(), attrs.n(), pool);
  OP_REQUIRES(ctx, bad < 0,
              errors::InvalidArgument(Where(ctx->op_kernel().type_string(), "ids", bad), ": ",
                                      embedlab::check_ids(ids[bad], args[bad].num_rows)));
}

// Long-lived variables only (a transient tensor is not worth collapsing): huge pages.
void AdviseHugePages(const std::vector<Tensor>& tables) {
  for (const Tensor& t : tables) embedlab::advise_huge_pages(t.tensor_data().data(), t.TotalBytes());
}

template <bool kResource>
class FusedLookupOp : public OpKernel {
 public:
  explicit FusedLookupOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, in_.Init(c)); }

  void Compute(OpKernelContext* ctx) override {
    std::vector<core::RefCountPtr<Var>> vars;
    SharedLocks locks;
    std::vector<Tensor> tables;
    OP_REQUIRES_OK(ctx, embedlab_tf::ReadTables(ctx, in_.n(), kResource, &vars, &locks, &tables));
    if (kResource) AdviseHugePages(tables);
    std::vector<embedlab::CsrIds> ids;
    OP_REQUIRES_OK(ctx, in_.Read(ctx, /*check_offsets=*/false, &ids));  // the kernel checks offsets and keys
    TfPool pool(ctx);
    RunForward(ctx, in_, tables, ids, pool);
  }

 private:
  LookupInputs in_;
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabFusedLookup").Device(DEVICE_CPU), FusedLookupOp<false>);
REGISTER_KERNEL_BUILDER(Name("EmbedLabFusedResourceLookup").Device(DEVICE_CPU), FusedLookupOp<true>);

// EmbedLabSparseToCsr and EmbedLabFusedResourceLookup in one op, without the conversion pass:
// the kernel reads each entry's row from the SparseTensor indices as it looks the key up, and
// writes the CSR offsets (outputs, for the backward) on the way. Entries in row order (any
// canonical SparseTensor) need nothing else; a table whose entries are not is converted by a
// counting sort afterwards and looked up again from CSR.
class FusedSparseLookupOp : public OpKernel {
 public:
  explicit FusedSparseLookupOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, attrs_.Init(c));
    OP_REQUIRES_OK(c, coo_.Init(c));
  }

  void Compute(OpKernelContext* ctx) override {
    const int n = attrs_.n();
    // Inputs: tables, then indices, values, dense_shape and weights (n each, from input n on).
    std::vector<core::RefCountPtr<Var>> vars;
    SharedLocks locks;
    std::vector<Tensor> tables;
    OP_REQUIRES_OK(ctx, embedlab_tf::ReadTables(ctx, n, /*resource=*/true, &vars, &locks, &tables));
    AdviseHugePages(tables);
    std::vector<embedlab::CsrIds> ids(n);
    std::vector<embedlab::CooRows> coo(n);
    for (int t = 0; t < n; ++t) {
      int64_t* off = nullptr;
      OP_REQUIRES_OK(ctx, coo_.Check(ctx, t, /*in0=*/n, /*out0=*/n, &off));  // shapes; allocates row_splits
      const Tensor& indices = ctx->input(n + t);
      const Tensor& values = ctx->input(2 * n + t);
      ids[t].row_offsets = off;  // written by the kernel
      ids[t].keys = values.flat<int64_t>().data();
      ids[t].weights = coo_.nw() > 0 ? ctx->input(4 * n + t).flat<float>().data() : nullptr;
      ids[t].batch = ctx->mutable_output(n + t)->NumElements() - 1;
      ids[t].nnz = values.NumElements();
      coo[t] = {indices.flat<int64_t>().data(), indices.dim_size(1), off};
    }
    std::vector<embedlab::LookupArgs> args;
    OP_REQUIRES_OK(ctx, ForwardArgs(ctx, attrs_, tables, ids, &args));
    TfPool pool(ctx);
    std::vector<int> status;
    embedlab::lookup_forward_coo_cpu(args.data(), coo.data(), n, pool, &status);
    std::vector<int> redo;  // tables whose entries were not in row order
    for (int t = 0; t < n; ++t) {
      if (status[t] == embedlab::kCooUnordered) {
        OP_REQUIRES_OK(ctx, coo_.Keys(ctx, t, n, n, /*in_order=*/false));  // counting sort; checks the rows
        args[t].ids.keys = ctx->mutable_output(2 * n + t)->flat<int64_t>().data();
        if (coo_.nw() > 0) args[t].ids.weights = ctx->mutable_output(3 * n + t)->flat<float>().data();
        redo.push_back(t);
        continue;
      }
      OP_REQUIRES(ctx, status[t] == embedlab::kCooOk,
                  errors::InvalidArgument(coo_.Ids(ctx, t), ": ", embedlab::check_ids(args[t].ids, args[t].num_rows)));
      OP_REQUIRES_OK(ctx, coo_.Keys(ctx, t, n, n, /*in_order=*/true));  // the values are the CSR keys
    }
    if (redo.empty()) return;
    std::vector<embedlab::LookupArgs> csr;
    for (int t : redo) csr.push_back(args[t]);
    const int bad = embedlab::lookup_forward_cpu(csr.data(), static_cast<int>(csr.size()), pool);
    OP_REQUIRES(ctx, bad < 0,
                errors::InvalidArgument(coo_.Ids(ctx, redo[bad]), ": ",
                                        embedlab::check_ids(csr[bad].ids, csr[bad].num_rows)));
  }

 private:
  LookupAttrs attrs_;
  CooToCsr coo_;
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabFusedResourceSparseLookup").Device(DEVICE_CPU), FusedSparseLookupOp);

// ---- backward --------------------------------------------------------------------------------

// Runs fn(t, pool) for every table. Many tables: one table per task, each on one thread. Few:
// the tables in turn, each with the whole pool. The result is the same bits either way.
void ForEachTable(TfPool& pool, int n, const std::function<void(int, embedlab::ThreadPool&)>& fn) {
  if (n >= 2 * pool.num_threads()) {
    pool.parallel_for(n, 1 << 20, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) fn(static_cast<int>(t), embedlab::inline_pool());
    });
  } else {
    for (int t = 0; t < n; ++t) fn(t, pool);
  }
}

// The first half of every backward op: output gradients (inputs 0..n) and CSR ids read and
// checked, each table's keys sorted (LookupGradCpu::prepare), keys validated from prepare's
// min/max (no separate pass). The sort buffers live here and keep their capacity, so steady
// state allocates nothing (fresh buffers on worker threads cost ~1,000 page faults a call);
// callers hold `mu` while they use grads().
class GradPrep {
 public:
  absl::Status Init(OpKernelConstruction* c) { return in_.Init(c); }
  int n() const { return in_.n(); }

  // num_rows[t] < 0: no table to check against (only keys below -1 are errors).
  absl::Status Run(OpKernelContext* ctx, TfPool& pool, const std::vector<int64_t>& num_rows)
      TF_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const int n = in_.n();
    const std::string& op = ctx->op_kernel().type_string();
    std::vector<embedlab::CsrIds> ids;
    TF_RETURN_IF_ERROR(in_.Read(ctx, /*check_offsets=*/true, &ids));  // keys are checked below
    args_.resize(n);
    for (int t = 0; t < n; ++t) {
      const Tensor& g = ctx->input(t);
      if (g.dims() != 2 || g.dim_size(0) != ids[t].batch)
        return errors::InvalidArgument(Where(op, "grads", t), " must have shape [", ids[t].batch, ", dim], got ",
                                       g.shape().DebugString());
      args_[t].ids = ids[t];
      args_[t].combiner = in_.combiner(t);
      args_[t].dim = g.dim_size(1);
      args_[t].grad_out = g.flat<float>().data();
    }
    grads_.resize(n);
    pool.parallel_for(n, 1 << 20, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) grads_[t].prepare(args_[t], embedlab::inline_pool());
    });
    for (int t = 0; t < n; ++t) {
      const int64_t rows = num_rows[t] < 0 ? INT64_MAX : num_rows[t];
      if (grads_[t].min_key() < -1 || grads_[t].max_key() >= rows)
        return errors::InvalidArgument(Where(op, "ids", t), ": ", embedlab::check_ids(ids[t], rows));
    }
    return absl::OkStatus();
  }

  std::vector<embedlab::LookupGradCpu>& grads() TF_EXCLUSIVE_LOCKS_REQUIRED(mu) { return grads_; }
  const embedlab::LookupGradArgs& args(int t) const { return args_[t]; }

  mutex mu;

 private:
  LookupInputs in_;
  std::vector<embedlab::LookupGradArgs> args_ TF_GUARDED_BY(mu);
  std::vector<embedlab::LookupGradCpu> grads_ TF_GUARDED_BY(mu);
};

class FusedLookupGradOp : public OpKernel {
 public:
  explicit FusedLookupGradOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, prep_.Init(c)); }

  void Compute(OpKernelContext* ctx) override {
    const int n = prep_.n();
    TfPool pool(ctx);
    mutex_lock lock(prep_.mu);
    OP_REQUIRES_OK(ctx, prep_.Run(ctx, pool, std::vector<int64_t>(n, -1)));
    std::vector<embedlab::LookupGradCpu>& grads = prep_.grads();
    std::vector<int64_t*> keys_out(n);
    std::vector<float*> rows_out(n);
    for (int t = 0; t < n; ++t) {
      Tensor *k = nullptr, *r = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(t, TensorShape({grads[t].num_unique()}), &k));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(n + t, TensorShape({grads[t].num_unique(), prep_.args(t).dim}), &r));
      keys_out[t] = k->flat<int64_t>().data();
      rows_out[t] = r->flat<float>().data();
    }
    ForEachTable(pool, n, [&](int t, embedlab::ThreadPool& p) { grads[t].fill(keys_out[t], rows_out[t], p); });
  }

 private:
  GradPrep prep_;
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabFusedLookupGrad").Device(DEVICE_CPU), FusedLookupGradOp);

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
  absl::Status Lock(OpKernelContext* ctx, int first, int n, int slots, const char* slot1_name) {
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
    const char* names[3] = {"vars", slot1_name, "vs"};
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
void ApplySparse(OpKernel* self, OpKernelContext* ctx, int n, Apply apply) {
  const std::string& op = self->type_string();
  LockedState state;
  OP_REQUIRES_OK(ctx, state.Lock(ctx, 0, n, kSlots, kSlots == 1 ? "accumulators" : "ms"));
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

// ---- fused backward + optimizer --------------------------------------------------------------

class FusedLookupGradApplyOp : public OpKernel {
 public:
  explicit FusedLookupGradApplyOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, prep_.Init(c));
    OP_REQUIRES_OK(c, c->GetAttr("num_weights", &nw_));
    OP_REQUIRES_OK(c, c->GetAttr("num_slots", &ns_));
    OP_REQUIRES_OK(c, c->GetAttr("optimizer", &optimizer_));
    const int per_table = optimizer_ == "adam" ? 2 : optimizer_ == "adagrad" ? 1 : 0;
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
                                                     step.scalar<int64_t>()(), &opt);
    OP_REQUIRES(ctx, err.empty(), errors::InvalidArgument(type_string(), ": ", err));

    LockedState state;
    OP_REQUIRES_OK(ctx, state.Lock(ctx, var0, n, ns_ / n, optimizer_ == "adagrad" ? "accumulators" : "ms"));
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
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabFusedLookupGradApply").Device(DEVICE_CPU), FusedLookupGradApplyOp);

}  // namespace
}  // namespace tensorflow

// CPU OpKernels: validate, translate tensors to core structs, call csrc/core. Every check
// runs before anything is written, so bad input leaves tables and optimizer state unchanged.
#define EIGEN_USE_THREADS

#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

#include "adapter.h"
#include "embedding.h"
#include "memory.h"

namespace tensorflow {
namespace {

using CPUDevice = Eigen::ThreadPoolDevice;

// Adapts TensorFlow's intra-op pool to the core ThreadPool interface.
class TfPool final : public embedlab::ThreadPool {
 public:
  explicit TfPool(OpKernelContext* ctx) : pool_(ctx->device()->tensorflow_cpu_worker_threads()->workers) {}
  int num_threads() const override { return pool_->NumThreads(); }
  void parallel_for(int64_t n, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) override {
    if (n <= 0) return;
    const int threads = pool_->NumThreads();
    // Below ~20 us of work, waking threads costs more than it saves.
    if (threads <= 1 || n * std::max<int64_t>(cost, 1) < 20000) {
      fn(0, n);
      return;
    }
    // A fixed number of equal contiguous blocks, kBlocksPerThread per thread, taken by whichever
    // thread is free. Eigen's cost model splits by the estimated cycles per unit, but our units
    // are DRAM-latency bound (a random row each), so its estimate is off by an order of magnitude
    // and it under-splits. One block per thread was better than that, but a thread that is late
    // (busy with another op, or its vCPU descheduled) then holds up the whole op; with 8 blocks
    // per thread the others take over its share. (2-core VM, dim-16 train step, interleaved
    // in one process: 1 block/thread 12.25 ms, 2: 11.08, 4: 10.34, 8: 10.17, 16: 10.07.)
    constexpr int64_t kBlocksPerThread = 8;
    const int64_t blocks = std::min<int64_t>(threads * kBlocksPerThread, n);
    const int64_t per = (n + blocks - 1) / blocks;
    pool_->ParallelFor(blocks, /*cost_per_unit=*/int64_t{1} << 30, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t lo = i * per, hi = std::min(n, lo + per);
        if (lo < hi) fn(lo, hi);
      }
    });
  }

 private:
  thread::ThreadPool* pool_;
};

using embedlab_tf::LookupAttrs;
using embedlab_tf::SharedLocks;
using embedlab_tf::Where;

// The lookup ops' CSR inputs, checked on the CPU.
class LookupInputs : public LookupAttrs {
 public:
  // Fills ids[t] and checks row_offsets. With num_rows given, keys are checked too (otherwise
  // the caller's kernel checks them on the fly: the forward); num_rows[t] < 0 checks only that
  // no key is below -1 (the backward, which has no table).
  absl::Status Read(OpKernelContext* ctx, const std::vector<int64_t>* num_rows, std::vector<embedlab::CsrIds>* ids) {
    const std::string& op = ctx->op_kernel().type_string();
    ids->resize(n());
    for (int t = 0; t < n(); ++t) {
      embedlab::CsrIds& c = (*ids)[t];
      TF_RETURN_IF_ERROR(ReadIds(ctx, t, &c));
      const std::string err = num_rows == nullptr ? embedlab::check_offsets(c)
                              : embedlab::check_ids(c, (*num_rows)[t] < 0 ? INT64_MAX : (*num_rows)[t]);
      if (!err.empty()) return errors::InvalidArgument(Where(op, "ids", t), ": ", err);
    }
    return absl::OkStatus();
  }
};

// ---- forward ---------------------------------------------------------------------------------

template <bool kResource>
class FusedLookupOp : public OpKernel {
 public:
  explicit FusedLookupOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, in_.Init(c)); }

  void Compute(OpKernelContext* ctx) override {
    const int n = in_.n();
    std::vector<core::RefCountPtr<Var>> vars;
    SharedLocks locks;
    std::vector<Tensor> tables;
    OP_REQUIRES_OK(ctx, embedlab_tf::ReadTables(ctx, n, kResource, &vars, &locks, &tables));
    if (kResource) {
      // Long-lived variables only (a transient tensor is not worth collapsing): huge pages.
      for (const Tensor& t : tables) embedlab::advise_huge_pages(t.tensor_data().data(), t.TotalBytes());
    }
    std::vector<int64_t> rows(n);
    for (int t = 0; t < n; ++t) rows[t] = tables[t].dim_size(0);
    std::vector<embedlab::CsrIds> ids;
    OP_REQUIRES_OK(ctx, in_.Read(ctx, nullptr, &ids));  // keys are checked inside the kernel
    std::vector<embedlab::LookupArgs> args(n);
    for (int t = 0; t < n; ++t) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(t, TensorShape({ids[t].batch, tables[t].dim_size(1)}), &out));
      args[t].table = tables[t].flat<float>().data();
      args[t].num_rows = rows[t];
      args[t].dim = tables[t].dim_size(1);
      args[t].ids = ids[t];
      args[t].combiner = in_.combiner(t);
      args[t].out = out->flat<float>().data();
    }
    TfPool pool(ctx);
    const int bad = embedlab::lookup_forward_cpu(args.data(), n, pool);
    OP_REQUIRES(ctx, bad < 0,
                errors::InvalidArgument(Where(type_string(), "ids", bad), ": ", embedlab::check_ids(ids[bad], rows[bad])));
  }

 private:
  LookupInputs in_;
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabFusedLookup").Device(DEVICE_CPU), FusedLookupOp<false>);
REGISTER_KERNEL_BUILDER(Name("EmbedLabFusedResourceLookup").Device(DEVICE_CPU), FusedLookupOp<true>);

// ---- backward --------------------------------------------------------------------------------

class FusedLookupGradOp : public OpKernel {
 public:
  explicit FusedLookupGradOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, in_.Init(c)); }

  void Compute(OpKernelContext* ctx) override {
    const int n = in_.n();
    std::vector<embedlab::CsrIds> ids;
    const std::vector<int64_t> no_table(n, -1);
    OP_REQUIRES_OK(ctx, in_.Read(ctx, &no_table, &ids));
    std::vector<embedlab::LookupGradArgs> args(n);
    for (int t = 0; t < n; ++t) {
      const Tensor& g = ctx->input(t);
      OP_REQUIRES(ctx, g.dims() == 2 && g.dim_size(0) == ids[t].batch,
                  errors::InvalidArgument(Where(type_string(), "grads", t), " must have shape [", ids[t].batch,
                                          ", dim], got ", g.shape().DebugString()));
      args[t].ids = ids[t];
      args[t].combiner = in_.combiner(t);
      args[t].dim = g.dim_size(1);
      args[t].grad_out = g.flat<float>().data();
    }
    TfPool pool(ctx);
    // The per-table sort buffers live in the kernel object and keep their capacity, so steady
    // state allocates nothing (fresh buffers on worker threads cost ~1,000 page faults a call).
    mutex_lock lock(mu_);
    std::vector<embedlab::LookupGradCpu>& grads = grads_;
    grads.resize(n);
    // Many tables: one table per task, each sorted and summed on one thread. Few tables: the
    // tables in turn, each with the whole pool. The result is the same bits either way.
    const bool per_table = n >= 2 * pool.num_threads();
    auto prepare = [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) grads[t].prepare(args[t], embedlab::inline_pool());
    };
    pool.parallel_for(n, 1 << 20, prepare);
    std::vector<int64_t*> keys_out(n);
    std::vector<float*> rows_out(n);
    for (int t = 0; t < n; ++t) {
      Tensor *k = nullptr, *r = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(t, TensorShape({grads[t].num_unique()}), &k));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(n + t, TensorShape({grads[t].num_unique(), args[t].dim}), &r));
      keys_out[t] = k->flat<int64_t>().data();
      rows_out[t] = r->flat<float>().data();
    }
    if (per_table) {
      pool.parallel_for(n, 1 << 20, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) grads[t].fill(keys_out[t], rows_out[t], embedlab::inline_pool());
      });
    } else {
      for (int t = 0; t < n; ++t) grads[t].fill(keys_out[t], rows_out[t], pool);
    }
  }

 private:
  LookupInputs in_;
  mutex mu_;
  std::vector<embedlab::LookupGradCpu> grads_ TF_GUARDED_BY(mu_);
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabFusedLookupGrad").Device(DEVICE_CPU), FusedLookupGradOp);

// ---- COO -> CSR ------------------------------------------------------------------------------

class SparseToCsrOp : public OpKernel {
 public:
  explicit SparseToCsrOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("num_tables", &n_));
    OP_REQUIRES_OK(c, c->GetAttr("num_weights", &nw_));
  }

  void Compute(OpKernelContext* ctx) override {
    // Every table's work is a few microseconds: checking and allocating here, one thread.
    for (int t = 0; t < n_; ++t) OP_REQUIRES_OK(ctx, Convert(ctx, t));
  }

 private:
  absl::Status Convert(OpKernelContext* ctx, int t) {
    const Tensor& indices = ctx->input(t);
    const Tensor& values = ctx->input(n_ + t);
    const Tensor& shape = ctx->input(2 * n_ + t);
    const Tensor* weights = nw_ > 0 ? &ctx->input(3 * n_ + t) : nullptr;
    const std::string& op = type_string();
    const std::string ids = Where(op, "ids", t);
    if (indices.dims() != 2 || indices.dim_size(1) < 1)
      return errors::InvalidArgument(ids, ": SparseTensor indices must be [nnz, rank], got ", indices.shape().DebugString());
    const int64_t nnz = indices.dim_size(0), rank = indices.dim_size(1);
    if (values.dims() != 1 || values.dim_size(0) != nnz)
      return errors::InvalidArgument(ids, ": SparseTensor has ", nnz, " indices but values of shape ",
                                     values.shape().DebugString());
    if (shape.dims() != 1 || shape.NumElements() != rank)
      return errors::InvalidArgument(ids, ": dense_shape must have ", rank, " entries");
    if (weights && (weights->dims() != 1 || weights->dim_size(0) != nnz))
      return errors::InvalidArgument(Where(op, "weights", t), " have shape ", weights->shape().DebugString(),
                                     " but ids have ", nnz, " values; weights must be shaped like ids");
    const int64_t batch = shape.flat<int64_t>()(0);
    if (batch < 0) return errors::InvalidArgument(ids, ": dense_shape[0] must be >= 0, got ", batch);
    Tensor* splits = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(t, TensorShape({batch + 1}), &splits));
    int64_t* off = splits->flat<int64_t>().data();
    const int64_t* idx = indices.flat<int64_t>().data();
    std::fill(off, off + batch + 1, 0);
    bool in_order = true;
    int64_t prev = 0;
    for (int64_t i = 0; i < nnz; ++i) {
      const int64_t r = idx[i * rank];
      if (static_cast<uint64_t>(r) >= static_cast<uint64_t>(batch))
        return errors::InvalidArgument(ids, ": SparseTensor row index ", r, " at indices[", i, ", 0] is outside [0, ",
                                       batch, ")");
      in_order &= (r >= prev);
      prev = r;
      ++off[r + 1];
    }
    for (int64_t r = 0; r < batch; ++r) off[r + 1] += off[r];
    if (in_order) {  // the common case: forward the buffers, no copy
      ctx->set_output(n_ + t, values);
      if (weights) ctx->set_output(2 * n_ + t, *weights);
      return absl::OkStatus();
    }
    Tensor *keys_out = nullptr, *w_out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(n_ + t, values.shape(), &keys_out));
    if (weights) TF_RETURN_IF_ERROR(ctx->allocate_output(2 * n_ + t, weights->shape(), &w_out));
    std::vector<int64_t> perm(nnz);
    const std::string err = embedlab::coo_to_csr_cpu(idx, nnz, batch, off, perm.data(), rank);
    if (!err.empty()) return errors::InvalidArgument(ids, ": SparseTensor ", err);
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

  int n_, nw_;
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabSparseToCsr").Device(DEVICE_CPU), SparseToCsrOp);

// ---- sparse optimizers -----------------------------------------------------------------------

// Shared by the three optimizer ops: `num_slots` resource inputs follow the variables
// (0 for SGD, 1 for Adagrad, 2 for Adam); then indices, grads, and the scalar hyperparameters.
template <int kSlots, typename Apply>
void ApplySparse(OpKernel* self, OpKernelContext* ctx, int n, Apply apply) {
  const std::string& op = self->type_string();
  std::vector<int> var_inputs;
  for (int i = 0; i < n * (1 + kSlots); ++i) var_inputs.push_back(i);
  // Exclusive locks in address order (TF's own helper). sparse=true, as TensorFlow's own
  // ResourceSparseApply* ops do: the variable switches once to copy-on-read mode and is then
  // updated in place. The dense protocol (sparse=false) would copy the whole table on every
  // update once any sparse op (e.g. tf.gather) has touched the variable.
  auto locks = MaybeLockVariableInputMutexesInOrder<CPUDevice, float>(ctx, /*do_lock=*/true, /*sparse=*/true,
                                                                       var_inputs);
  std::vector<Tensor> vars(n * (1 + kSlots));
  for (int i = 0; i < n * (1 + kSlots); ++i) {
    OP_REQUIRES_OK(ctx, GetInputTensorFromVariable<CPUDevice, float>(ctx, i, /*lock_held=*/true, /*sparse=*/true,
                                                                     &vars[i]));
    if (vars[i].IsInitialized()) embedlab::advise_huge_pages(vars[i].tensor_data().data(), vars[i].TotalBytes());
  }
  const int idx0 = n * (1 + kSlots), grad0 = idx0 + n;
  TfPool pool(ctx);
  std::vector<embedlab::SparseUpdateArgs> args(n);
  // Coalesced copies for tables whose indices repeat (kept alive until the update).
  std::vector<std::vector<int64_t>> co_idx(n);
  std::vector<std::vector<float>> co_rows(n);
  for (int t = 0; t < n; ++t) {
    const Tensor& w = vars[t];
    const char* names[3] = {"vars", kSlots == 1 ? "accumulators" : "ms", "vs"};
    for (int s = 0; s <= kSlots; ++s) {
      const Tensor& v = vars[s * n + t];
      OP_REQUIRES(ctx, v.IsInitialized() && v.dims() == 2 && v.shape() == w.shape(),
                  errors::InvalidArgument(Where(op, names[s], t), " must be an initialized float matrix shaped like vars[",
                                          t, "] ", w.shape().DebugString(), ", got ", v.shape().DebugString()));
    }
    const Tensor& idx = ctx->input(idx0 + t);
    const Tensor& g = ctx->input(grad0 + t);
    const int64_t rows = w.dim_size(0), dim = w.dim_size(1);
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
    a.table = vars[t].flat<float>().data();
    a.slot1 = kSlots >= 1 ? vars[n + t].flat<float>().data() : nullptr;
    a.slot2 = kSlots >= 2 ? vars[2 * n + t].flat<float>().data() : nullptr;
    a.num_rows = rows;
    a.dim = dim;
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
    EMBEDLAB_SCALAR(lr, 5 * n_, "lr");
    const Tensor& b1_t = ctx->input(5 * n_ + 1);
    const Tensor& b2_t = ctx->input(5 * n_ + 2);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(b1_t.shape()) && TensorShapeUtils::IsScalar(b2_t.shape()),
                errors::InvalidArgument(type_string(), ": beta_1 and beta_2 must be scalars"));
    const double b1 = b1_t.scalar<double>()(), b2 = b2_t.scalar<double>()();
    EMBEDLAB_SCALAR(eps, 5 * n_ + 3, "epsilon");
    const Tensor& step_t = ctx->input(5 * n_ + 4);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(step_t.shape()),
                errors::InvalidArgument(type_string(), ": step must be a scalar"));
    const int64_t step = step_t.scalar<int64_t>()();
    OP_REQUIRES(ctx, step >= 1, errors::InvalidArgument(type_string(), ": step must be >= 1, got ", step));
    ApplySparse<2>(this, ctx, n_, [&](std::vector<embedlab::SparseUpdateArgs>& a, embedlab::ThreadPool& p) {
      embedlab::sparse_adam_cpu(a.data(), n_, {lr, b1, b2, eps, step}, p);
    });
  }

 private:
  int n_;
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabSparseApplySGD").Device(DEVICE_CPU), SparseApplySgdOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabSparseApplyAdagrad").Device(DEVICE_CPU), SparseApplyAdagradOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabSparseApplyAdam").Device(DEVICE_CPU), SparseApplyAdamOp);

}  // namespace
}  // namespace tensorflow

// What the CPU OpKernel files share (embedding_kernels.cc, sparse_optimizer_kernels.cc,
// csr_kernels.cc): the lookup ops' CSR inputs checked on the CPU (LookupInputs), the first half
// of every backward op (GradPrep, ForEachTable: EmbedLabFusedLookupGrad and the fused backward +
// optimizer EmbedLabFusedLookupGradApply), and the COO -> CSR conversion (CooToCsr:
// EmbedLabSparseToCsr and EmbedLabFusedResourceSparseLookup). Internal to each kernel file
// (an anonymous namespace), as they were when one file held them all.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

#include "adapter.h"
#include "csr.h"
#include "embedding.h"
#include "tf_pool.h"

namespace tensorflow {
namespace {

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
    // parallel, so that no core sits idle while one thread converts them all.
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

// ---- the backward's first half -------------------------------------------------------------

// Runs fn(t, pool) for every table. Many tables: one table per task, each on one thread. Few:
// the tables in turn, each with the whole pool. The result is the same bits either way.
inline void ForEachTable(TfPool& pool, int n, const std::function<void(int, embedlab::ThreadPool&)>& fn) {
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

}  // namespace
}  // namespace tensorflow

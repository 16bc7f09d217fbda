// Pieces shared by the CPU (*_kernels.cc) and GPU (*_kernels_gpu.cc) adapters of csrc/tf:
// error locations, reader locks, the lookup ops' attributes and the reading of their tables
// and CSR inputs. Validation that depends on the device (key ranges) stays in each adapter.
#pragma once

#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

#include "embedding.h"

namespace tensorflow {
namespace embedlab_tf {

// "Op: arg[t]", the prefix of every error message about one table's input.
inline std::string Where(const std::string& op, const char* arg, int t) {
  return op + ": " + arg + "[" + std::to_string(t) + "]";
}

// Shared (reader) locks on several variables, released on scope exit.
class SharedLocks {
 public:
  SharedLocks() = default;
  SharedLocks(const SharedLocks&) = delete;
  SharedLocks& operator=(const SharedLocks&) = delete;
  void add(mutex* mu) {
    mu->lock_shared();
    held_.push_back(mu);
  }
  ~SharedLocks() {
    for (mutex* mu : held_) mu->unlock_shared();
  }

 private:
  std::vector<mutex*> held_;
};

// The attributes of the lookup ops: num_tables, num_weights (0 or num_tables), combiners.
class LookupAttrs {
 public:
  absl::Status Init(OpKernelConstruction* c) {
    TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &n_));
    TF_RETURN_IF_ERROR(c->GetAttr("num_weights", &nw_));
    std::vector<std::string> names;
    TF_RETURN_IF_ERROR(c->GetAttr("combiners", &names));
    if (nw_ != 0 && nw_ != n_)
      return errors::InvalidArgument(c->def().op(), ": num_weights must be 0 or num_tables (", n_, "), got ", nw_);
    if (static_cast<int>(names.size()) != n_)
      return errors::InvalidArgument(c->def().op(), ": combiners has ", names.size(), " entries for ", n_, " tables");
    combiners_.resize(n_);
    for (int t = 0; t < n_; ++t)
      if (!embedlab::parse_combiner(names[t], &combiners_[t]))
        return errors::InvalidArgument(c->def().op(), ": combiners[", t, "] must be 'sum' or 'mean', got '",
                                       names[t], "'");
    return absl::OkStatus();
  }

  int n() const { return n_; }
  embedlab::Combiner combiner(int t) const { return combiners_[t]; }

  // Table t's CSR ids from the op's inputs (row_splits at n + t, keys at 2n + t, weights at
  // 3n + t): shapes checked, pointers filled; offsets and keys not yet validated.
  absl::Status ReadIds(OpKernelContext* ctx, int t, embedlab::CsrIds* c) const {
    const std::string& op = ctx->op_kernel().type_string();
    const Tensor& splits = ctx->input(n_ + t);
    const Tensor& keys = ctx->input(2 * n_ + t);
    if (splits.dims() != 1 || splits.NumElements() < 1)
      return errors::InvalidArgument(Where(op, "row_splits", t), " must be a vector of batch + 1 offsets, got shape ",
                                     splits.shape().DebugString());
    if (keys.dims() != 1)
      return errors::InvalidArgument(Where(op, "keys", t), " must be a vector, got shape ", keys.shape().DebugString());
    c->row_offsets = splits.flat<int64_t>().data();
    c->keys = keys.flat<int64_t>().data();
    c->batch = splits.NumElements() - 1;
    c->nnz = keys.NumElements();
    c->weights = nullptr;
    if (nw_ > 0) {
      const Tensor& w = ctx->input(3 * n_ + t);
      if (w.dims() != 1 || w.NumElements() != c->nnz)
        return errors::InvalidArgument(Where(op, "weights", t), " has shape ", w.shape().DebugString(), " but keys[", t,
                                       "] has ", c->nnz, " entries; weights must be shaped like ids");
      c->weights = w.flat<float>().data();
    }
    return absl::OkStatus();
  }

 private:
  int n_ = 0, nw_ = 0;
  std::vector<embedlab::Combiner> combiners_;
};

// The n float32 [rows, dim] tables of a lookup op: input tensors, or resource variables read in
// place under their reader locks (held by `locks` until it goes out of scope), as
// ResourceGather does.
inline absl::Status ReadTables(OpKernelContext* ctx, int n, bool resource, std::vector<core::RefCountPtr<Var>>* vars,
                               SharedLocks* locks, std::vector<Tensor>* tables) {
  const std::string& op = ctx->op_kernel().type_string();
  vars->resize(resource ? n : 0);
  tables->resize(n);
  for (int t = 0; t < n; ++t) {
    if (resource) {
      TF_RETURN_IF_ERROR(LookupResource(ctx, HandleFromInput(ctx, t), &(*vars)[t]));
      locks->add((*vars)[t]->mu());
      if ((*vars)[t]->tensor()->dtype() != DT_FLOAT)
        return errors::InvalidArgument(Where(op, "tables", t), " must be float32, got ",
                                       DataTypeString((*vars)[t]->tensor()->dtype()));
      (*tables)[t] = *(*vars)[t]->tensor();
    } else {
      (*tables)[t] = ctx->input(t);
    }
    if ((*tables)[t].dims() != 2)
      return errors::InvalidArgument(Where(op, "tables", t), " must be a matrix [rows, dim], got shape ",
                                     (*tables)[t].shape().DebugString());
  }
  return absl::OkStatus();
}

}  // namespace embedlab_tf
}  // namespace tensorflow

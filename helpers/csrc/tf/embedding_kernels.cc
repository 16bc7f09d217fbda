// CPU OpKernels of the lookup and its backward (ops: embedding_ops.cc): validate, translate
// tensors to core structs, call csrc/core. Every check runs before anything is written.
#define EIGEN_USE_THREADS

#include <cstdint>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

#include "adapter.h"
#include "adapter_cpu.h"
#include "embedding.h"
#include "huge_pages.h"
#include "tf_pool.h"

namespace tensorflow {
namespace {

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

}  // namespace
}  // namespace tensorflow

// GPU OpKernels of the lookup and its backward (ops: embedding_ops.cc): validate, translate
// tensors to the core structs, call the CUDA kernels in csrc/core/embedding_cuda.cu on
// TensorFlow's stream. Compiled only when TensorFlow itself was built with CUDA (CMake defines
// GOOGLE_CUDA=1 then); the ops exist either way, so a CPU-only build still runs on the CPU.
// The toolkit/driver rule: adapter_gpu.h.
//
// Host syncs (documented, as TF's own Unique op does): key validation reads a 24-byte status
// back (one sync per table), and EmbedLabFusedLookupGrad must read the number of unique keys
// before it can allocate its outputs (one sync per table, plus a device copy of the rows).
#if GOOGLE_CUDA
#define EIGEN_USE_GPU

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/kernels/training_op_helpers.h"

#include "adapter.h"
#include "adapter_gpu.h"
#include "embedding.h"

namespace tensorflow {
namespace {

using embedlab_tf::LookupAttrs;
using embedlab_tf::SharedLocks;
using embedlab_tf::Where;

// The lookup ops' CSR inputs, validated on the device; see embedding_ops.cc.
class LookupInputs : public LookupAttrs {
 public:
  absl::Status Init(OpKernelConstruction* c) {
    TF_RETURN_IF_ERROR(LookupAttrs::Init(c));
    return CheckCudaVersions(c->def().op());
  }

  // Fills ids[t] (device pointers) and validates them on the device against num_rows[t]
  // (< 0: no bound). max_keys (optional) receives each table's largest key.
  absl::Status Read(OpKernelContext* ctx, const std::vector<int64_t>& num_rows, std::vector<embedlab::CsrIds>* ids,
                    std::vector<int64_t>* max_keys = nullptr) {
    const std::string& op = ctx->op_kernel().type_string();
    ids->resize(n());
    if (max_keys) max_keys->assign(n(), -1);
    for (int t = 0; t < n(); ++t) {
      embedlab::CsrIds& c = (*ids)[t];
      TF_RETURN_IF_ERROR(ReadIds(ctx, t, &c));
      if (c.nnz >= (int64_t{1} << 31) - 1 || c.batch >= (int64_t{1} << 31) - 1)
        return errors::InvalidArgument(Where(op, "keys", t), ": the GPU kernels take fewer than 2^31 keys and rows "
                                       "per table, got ", c.nnz, " keys and ", c.batch, " rows");
      TF_RETURN_IF_ERROR(CheckIds(ctx, Where(op, "ids", t), c, num_rows[t], /*allow_missing=*/true,
                                  max_keys ? &(*max_keys)[t] : nullptr));
    }
    return absl::OkStatus();
  }
};

// ---- forward ---------------------------------------------------------------------------------

template <bool kResource>
class FusedLookupGpuOp : public OpKernel {
 public:
  explicit FusedLookupGpuOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, in_.Init(c)); }

  void Compute(OpKernelContext* ctx) override {
    const int n = in_.n();
    std::vector<core::RefCountPtr<Var>> vars;
    SharedLocks locks;
    std::vector<Tensor> tables;
    OP_REQUIRES_OK(ctx, embedlab_tf::ReadTables(ctx, n, kResource, &vars, &locks, &tables));
    std::vector<int64_t> rows(n);
    for (int t = 0; t < n; ++t) rows[t] = tables[t].dim_size(0);
    std::vector<embedlab::CsrIds> ids;
    OP_REQUIRES_OK(ctx, in_.Read(ctx, rows, &ids));
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
    OP_REQUIRES_OK(ctx, CudaStatus(type_string(), embedlab::lookup_forward_cuda(args.data(), n, StreamOf(ctx)),
                                   "the forward kernel"));
  }

 private:
  LookupInputs in_;
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabFusedLookup").Device(DEVICE_GPU), FusedLookupGpuOp<false>);
REGISTER_KERNEL_BUILDER(Name("EmbedLabFusedResourceLookup").Device(DEVICE_GPU), FusedLookupGpuOp<true>);

// ---- backward --------------------------------------------------------------------------------

class FusedLookupGradGpuOp : public OpKernel {
 public:
  explicit FusedLookupGradGpuOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, in_.Init(c)); }

  void Compute(OpKernelContext* ctx) override {
    const int n = in_.n();
    const cudaStream_t stream = StreamOf(ctx);
    std::vector<embedlab::CsrIds> ids;
    std::vector<int64_t> max_keys;
    OP_REQUIRES_OK(ctx, in_.Read(ctx, std::vector<int64_t>(n, -1), &ids, &max_keys));
    for (int t = 0; t < n; ++t) {
      const Tensor& g = ctx->input(t);
      OP_REQUIRES(ctx, g.dims() == 2 && g.dim_size(0) == ids[t].batch,
                  errors::InvalidArgument(Where(type_string(), "grads", t), " must have shape [", ids[t].batch,
                                          ", dim], got ", g.shape().DebugString()));
      embedlab::LookupGradArgs a;
      a.ids = ids[t];
      a.combiner = in_.combiner(t);
      a.dim = g.dim_size(1);
      a.grad_out = g.flat<float>().data();
      // No table input here, so the key range comes from the validation pass (largest key):
      // the radix sort then runs over only the bits that bound needs.
      const int64_t key_bound = max_keys[t] + 1;
      cudaError_t e = cudaSuccess;
      const size_t ws_bytes = embedlab::lookup_backward_cuda_workspace(a.ids.batch, a.ids.nnz, a.dim, key_bound, &e);
      OP_REQUIRES_OK(ctx, CudaStatus(type_string(), e, "the workspace size query"));
      Tensor ws_t, keys_t, rows_t, count_t;
      void* ws = nullptr;
      OP_REQUIRES_OK(ctx, Scratch(ctx, ws_bytes, &ws_t, &ws));
      const int64_t cap = std::max<int64_t>(a.ids.nnz, 1);
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_INT64, TensorShape({cap}), &keys_t));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_FLOAT, TensorShape({cap, a.dim}), &rows_t));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_INT64, TensorShape({1}), &count_t));
      OP_REQUIRES_OK(ctx, CudaStatus(type_string(),
                                     embedlab::lookup_backward_cuda(a, key_bound, keys_t.flat<int64_t>().data(),
                                                                    rows_t.flat<float>().data(),
                                                                    count_t.flat<int64_t>().data(), ws, ws_bytes,
                                                                    stream),
                                     "the backward kernels"));
      int64_t nu = 0;
      OP_REQUIRES_OK(ctx, CudaStatus(type_string(),
                                     cudaMemcpyAsync(&nu, count_t.flat<int64_t>().data(), sizeof(nu),
                                                     cudaMemcpyDeviceToHost, stream),
                                     "reading the unique-key count"));
      OP_REQUIRES_OK(ctx, CudaStatus(type_string(), cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
      Tensor *k = nullptr, *r = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(t, TensorShape({nu}), &k));
      OP_REQUIRES_OK(ctx, ctx->allocate_output(n + t, TensorShape({nu, a.dim}), &r));
      if (nu > 0) {
        OP_REQUIRES_OK(ctx, CudaStatus(type_string(),
                                       cudaMemcpyAsync(k->flat<int64_t>().data(), keys_t.flat<int64_t>().data(),
                                                       nu * sizeof(int64_t), cudaMemcpyDeviceToDevice, stream),
                                       "copying unique keys"));
        if (a.dim > 0)
          OP_REQUIRES_OK(ctx, CudaStatus(type_string(),
                                         cudaMemcpyAsync(r->flat<float>().data(), rows_t.flat<float>().data(),
                                                         nu * a.dim * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                                         "copying gradient rows"));
      }
    }
  }

 private:
  LookupInputs in_;
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabFusedLookupGrad").Device(DEVICE_GPU), FusedLookupGradGpuOp);

// EmbedLabSparseToCsr has no GPU kernel: TensorFlow places it on the CPU (its inputs are small
// index vectors), and the GPU kernels above read the resulting CSR from device memory.

}  // namespace
}  // namespace tensorflow

#endif  // GOOGLE_CUDA

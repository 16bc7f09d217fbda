// GPU OpKernels of the sparse optimizers (ops: sparse_optimizer_ops.cc): validate, translate
// tensors to the core structs, call the CUDA kernels in csrc/core/sparse_optimizer_cuda.cu on
// TensorFlow's stream. Compiled only when TensorFlow itself was built with CUDA (CMake defines
// GOOGLE_CUDA=1 then); Global Adam, its catch-up and the fused backward + optimizer have CPU
// kernels only. The toolkit/driver rule: adapter_gpu.h.
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
#include "sparse_optimizer.h"

namespace tensorflow {
namespace {

using embedlab_tf::Where;

// ---- sparse optimizers -----------------------------------------------------------------------

// `kSlots` resource inputs per table follow the variables (0 SGD, 1 Adagrad, 2 Adam or FTRL); then
// indices, grads and the scalar hyperparameters (host memory). Duplicate indices are summed
// on the device (sort-based, deterministic) before the update.
template <int kSlots>
void ApplySparseGpu(OpKernel* self, OpKernelContext* ctx, int n, const embedlab::SparseOptimizer& opt) {
  const std::string& op = self->type_string();
  std::vector<int> var_inputs;
  for (int i = 0; i < n * (1 + kSlots); ++i) var_inputs.push_back(i);
  // sparse=true, as the CPU kernels and TensorFlow's ResourceSparseApply* do: updated in place,
  // no whole-table copy once a sparse read (gather) has touched the variable.
  auto locks = MaybeLockVariableInputMutexesInOrder<GPUDevice, float>(ctx, /*do_lock=*/true, /*sparse=*/true,
                                                                      var_inputs);
  std::vector<Tensor> vars(n * (1 + kSlots));
  for (int i = 0; i < n * (1 + kSlots); ++i) {
    OP_REQUIRES_OK(ctx, GetInputTensorFromVariable<GPUDevice, float>(ctx, i, /*lock_held=*/true, /*sparse=*/true,
                                                                     &vars[i]));
  }
  const int idx0 = n * (1 + kSlots), grad0 = idx0 + n;
  std::vector<embedlab::SparseUpdateArgs> args(n);
  size_t ws_bytes = 0;  // all tables share one sort (up to 32 per launch group)
  for (int t = 0; t < n; ++t) {
    const Tensor& w = vars[t];
    const bool ftrl = opt.kind == embedlab::OptimizerKind::kFtrl;
    const char* names[3] = {"vars", kSlots == 1 || ftrl ? "accumulators" : "ms", ftrl ? "linears" : "vs"};
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
    OP_REQUIRES(ctx, idx.NumElements() < (int64_t{1} << 31) - 1,
                errors::InvalidArgument(Where(op, "indices", t), ": the GPU kernels take fewer than 2^31 indices"));
    embedlab::SparseUpdateArgs& a = args[t];
    a.table = vars[t].flat<float>().data();
    a.slot1 = kSlots >= 1 ? vars[n + t].flat<float>().data() : nullptr;
    a.slot2 = kSlots >= 2 ? vars[2 * n + t].flat<float>().data() : nullptr;
    a.num_rows = rows;
    a.dim = dim;
    a.indices = idx.flat<int64_t>().data();
    a.grads = g.flat<float>().data();
    a.n = idx.NumElements();
    embedlab::CsrIds as_ids;  // indices as "one key per row" ids, for the device check
    as_ids.keys = a.indices;
    as_ids.batch = as_ids.nnz = a.n;
    OP_REQUIRES_OK(ctx, CheckIds(ctx, Where(op, "indices", t), as_ids, rows, /*allow_missing=*/false));
  }
  {
    cudaError_t e = cudaSuccess;
    ws_bytes = embedlab::sparse_update_cuda_workspace(args.data(), n, &e);
    OP_REQUIRES_OK(ctx, CudaStatus(op, e, "the workspace size query"));
  }
  Tensor ws_t;
  void* ws = nullptr;
  OP_REQUIRES_OK(ctx, Scratch(ctx, ws_bytes, &ws_t, &ws));
  cudaError_t e = cudaErrorInvalidValue;
  switch (opt.kind) {
    case embedlab::OptimizerKind::kSgd:
      e = embedlab::sparse_sgd_cuda(args.data(), n, opt.sgd, ws, ws_bytes, StreamOf(ctx));
      break;
    case embedlab::OptimizerKind::kAdagrad:
      e = embedlab::sparse_adagrad_cuda(args.data(), n, opt.adagrad, ws, ws_bytes, StreamOf(ctx));
      break;
    case embedlab::OptimizerKind::kAdam:
      e = embedlab::sparse_adam_cuda(args.data(), n, opt.adam, ws, ws_bytes, StreamOf(ctx));
      break;
    case embedlab::OptimizerKind::kFtrl:
      e = embedlab::sparse_ftrl_cuda(args.data(), n, opt.ftrl, ws, ws_bytes, StreamOf(ctx));
      break;
  }
  OP_REQUIRES_OK(ctx, CudaStatus(op, e, "the update kernels"));
}

absl::Status HostScalar(OpKernelContext* ctx, int i, const char* name, float* out) {
  const Tensor& t = ctx->input(i);
  if (!TensorShapeUtils::IsScalar(t.shape()))
    return errors::InvalidArgument(ctx->op_kernel().type_string(), ": ", name, " must be a scalar, got shape ",
                                   t.shape().DebugString());
  *out = t.scalar<float>()();
  return absl::OkStatus();
}

class SparseApplySgdGpuOp : public OpKernel {
 public:
  explicit SparseApplySgdGpuOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("num_tables", &n_));
    OP_REQUIRES_OK(c, CheckCudaVersions(c->def().op()));
  }
  void Compute(OpKernelContext* ctx) override {
    embedlab::SparseOptimizer o;
    o.kind = embedlab::OptimizerKind::kSgd;
    OP_REQUIRES_OK(ctx, HostScalar(ctx, 3 * n_, "lr", &o.sgd.lr));
    ApplySparseGpu<0>(this, ctx, n_, o);
  }

 private:
  int n_;
};

class SparseApplyAdagradGpuOp : public OpKernel {
 public:
  explicit SparseApplyAdagradGpuOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("num_tables", &n_));
    OP_REQUIRES_OK(c, CheckCudaVersions(c->def().op()));
  }
  void Compute(OpKernelContext* ctx) override {
    embedlab::SparseOptimizer o;
    o.kind = embedlab::OptimizerKind::kAdagrad;
    OP_REQUIRES_OK(ctx, HostScalar(ctx, 4 * n_, "lr", &o.adagrad.lr));
    OP_REQUIRES_OK(ctx, HostScalar(ctx, 4 * n_ + 1, "epsilon", &o.adagrad.epsilon));
    ApplySparseGpu<1>(this, ctx, n_, o);
  }

 private:
  int n_;
};

class SparseApplyAdamGpuOp : public OpKernel {
 public:
  explicit SparseApplyAdamGpuOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("num_tables", &n_));
    OP_REQUIRES_OK(c, CheckCudaVersions(c->def().op()));
  }
  void Compute(OpKernelContext* ctx) override {
    embedlab::SparseOptimizer o;
    o.kind = embedlab::OptimizerKind::kAdam;
    OP_REQUIRES_OK(ctx, HostScalar(ctx, 5 * n_, "lr", &o.adam.lr));
    // The betas are double inputs (1 - beta rounds like Keras' Python floats), as on the CPU.
    const Tensor& b1_t = ctx->input(5 * n_ + 1);
    const Tensor& b2_t = ctx->input(5 * n_ + 2);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(b1_t.shape()) && TensorShapeUtils::IsScalar(b2_t.shape()),
                errors::InvalidArgument(type_string(), ": beta_1 and beta_2 must be scalars"));
    o.adam.beta1 = b1_t.scalar<double>()();
    o.adam.beta2 = b2_t.scalar<double>()();
    OP_REQUIRES_OK(ctx, HostScalar(ctx, 5 * n_ + 3, "epsilon", &o.adam.epsilon));
    const Tensor& step_t = ctx->input(5 * n_ + 4);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(step_t.shape()),
                errors::InvalidArgument(type_string(), ": step must be a scalar"));
    o.adam.step = step_t.scalar<int64_t>()();
    OP_REQUIRES(ctx, o.adam.step >= 1, errors::InvalidArgument(type_string(), ": step must be >= 1, got ", o.adam.step));
    ApplySparseGpu<2>(this, ctx, n_, o);
  }

 private:
  int n_;
};

class SparseApplyFtrlGpuOp : public OpKernel {
 public:
  explicit SparseApplyFtrlGpuOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("num_tables", &n_));
    OP_REQUIRES_OK(c, c->GetAttr("lr_power", &ftrl_.lr_power));
    OP_REQUIRES_OK(c, c->GetAttr("l1", &ftrl_.l1));
    OP_REQUIRES_OK(c, c->GetAttr("l2", &ftrl_.l2));
    OP_REQUIRES_OK(c, c->GetAttr("l2_shrinkage", &ftrl_.l2_shrinkage));
    OP_REQUIRES_OK(c, c->GetAttr("beta", &ftrl_.beta));
    OP_REQUIRES_OK(c, CheckCudaVersions(c->def().op()));
  }
  void Compute(OpKernelContext* ctx) override {
    embedlab::SparseOptimizer o;
    o.kind = embedlab::OptimizerKind::kFtrl;
    o.ftrl = ftrl_;
    OP_REQUIRES_OK(ctx, HostScalar(ctx, 5 * n_, "lr", &o.ftrl.lr));
    const std::string err = embedlab::check_ftrl(o.ftrl);
    OP_REQUIRES(ctx, err.empty(), errors::InvalidArgument(type_string(), ": ", err));
    ApplySparseGpu<2>(this, ctx, n_, o);
  }

 private:
  int n_;
  embedlab::FtrlParams ftrl_;
};

// Hyperparameters are read on the host: keep them in host memory (no device round trip).
REGISTER_KERNEL_BUILDER(Name("EmbedLabSparseApplySGD").Device(DEVICE_GPU).HostMemory("lr"), SparseApplySgdGpuOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabSparseApplyAdagrad").Device(DEVICE_GPU).HostMemory("lr").HostMemory("epsilon"),
                        SparseApplyAdagradGpuOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabSparseApplyAdam")
                            .Device(DEVICE_GPU)
                            .HostMemory("lr")
                            .HostMemory("beta_1")
                            .HostMemory("beta_2")
                            .HostMemory("epsilon")
                            .HostMemory("step"),
                        SparseApplyAdamGpuOp);
REGISTER_KERNEL_BUILDER(Name("EmbedLabSparseApplyFtrl").Device(DEVICE_GPU).HostMemory("lr"), SparseApplyFtrlGpuOp);

}  // namespace
}  // namespace tensorflow

#endif  // GOOGLE_CUDA

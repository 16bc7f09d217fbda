// GPU OpKernels for the ops registered in embedding_ops.cc: validate, translate tensors to the
// core structs, call the CUDA kernels in csrc/core/embedding_cuda.cu on TensorFlow's stream.
// Compiled only when TensorFlow itself was built with CUDA (CMake defines GOOGLE_CUDA=1 then);
// the ops exist either way (embedding_ops.cc), so a CPU-only build still runs on the CPU.
//
// Matching the CUDA toolkit to TensorFlow's (the rule):
//   * Build with an nvcc whose MAJOR version equals the CUDA TensorFlow was built with:
//       python -c "import tensorflow as tf; print(tf.sysconfig.get_build_info()['cuda_version'])"
//     (TF 2.21 GPU wheels: CUDA 12.x). Our kernels link cudart statically and share TF's
//     primary context and streams through the driver API, so the minor version may differ,
//     but a different major version is refused: mixed majors have broken stream/event interop
//     and library (CUB) ABI assumptions.
//   * The installed driver must support our toolkit: cudaDriverGetVersion() >= CUDART_VERSION.
//     Each kernel checks this once at construction and fails with an error that names both
//     versions and the fix, instead of failing later with "invalid device function".
//   * Architectures: EMBEDLAB_CUDA_ARCHITECTURES (default 80;90) must include the GPU's
//     compute capability (or a lower one with PTX); an unsupported GPU gets the launch error
//     "no kernel image is available", reported with the op name.
//   The Python loader (embedlab/_native.py) is the place to compare the two version strings
//   before loading the library; build_info()["cuda_version"] holds ours.
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
#include "embedding.h"

namespace tensorflow {
namespace {

using embedlab_tf::LookupAttrs;
using embedlab_tf::SharedLocks;
using embedlab_tf::Where;

using GPUDevice = Eigen::GpuDevice;

cudaStream_t StreamOf(OpKernelContext* ctx) { return ctx->eigen_device<GPUDevice>().stream(); }

absl::Status CudaStatus(const std::string& op, cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return errors::Internal(op, ": ", what, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

// The toolkit/driver rule above, checked once per kernel construction.
absl::Status CheckCudaVersions(const std::string& op) {
  int driver = 0;
  const cudaError_t e = cudaDriverGetVersion(&driver);
  if (e != cudaSuccess) return CudaStatus(op, e, "cudaDriverGetVersion");
  if (driver < CUDART_VERSION)
    return errors::FailedPrecondition(op, ": EmbedLab's CUDA kernels were built with CUDA ", CUDART_VERSION / 1000,
                                      ".", (CUDART_VERSION % 1000) / 10, " but the driver supports only ",
                                      driver / 1000, ".", (driver % 1000) / 10,
                                      "; update the NVIDIA driver or rebuild EmbedLab with the CUDA toolkit that "
                                      "TensorFlow uses (tf.sysconfig.get_build_info()['cuda_version'])");
  return absl::OkStatus();
}

// Scratch memory from TensorFlow's allocator (stream ordered with the op's work).
absl::Status Scratch(OpKernelContext* ctx, size_t bytes, Tensor* t, void** ptr) {
  TF_RETURN_IF_ERROR(ctx->allocate_temp(DT_INT8, TensorShape({static_cast<int64_t>(std::max<size_t>(bytes, 256))}), t));
  *ptr = t->flat<int8>().data();
  return absl::OkStatus();
}

// Device-side key check; synchronizes the stream. num_rows < 0: no upper bound (the backward).
absl::Status CheckIds(OpKernelContext* ctx, const std::string& what, const embedlab::CsrIds& ids, int64_t num_rows,
                      bool allow_missing, int64_t* max_key = nullptr) {
  Tensor scratch;
  void* ws = nullptr;
  TF_RETURN_IF_ERROR(Scratch(ctx, embedlab::check_ids_cuda_workspace(), &scratch, &ws));
  cudaError_t e = cudaSuccess;
  const std::string msg =
      embedlab::check_ids_cuda(ids, num_rows < 0 ? INT64_MAX - 1 : num_rows, allow_missing, ws, StreamOf(ctx), &e,
                               max_key);
  TF_RETURN_IF_ERROR(CudaStatus(what, e, "key validation"));
  if (!msg.empty()) return errors::InvalidArgument(what, ": ", msg, "; nothing was changed");
  return absl::OkStatus();
}

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

// ---- sparse optimizers -----------------------------------------------------------------------

// `kSlots` resource inputs per table follow the variables (0 SGD, 1 Adagrad, 2 Adam); then
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

// EmbedLabSparseToCsr has no GPU kernel: TensorFlow places it on the CPU (its inputs are small
// index vectors), and the GPU kernels above read the resulting CSR from device memory.

}  // namespace
}  // namespace tensorflow

#endif  // GOOGLE_CUDA

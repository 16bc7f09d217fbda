// GPU kernel of EmbedLabHpsLookup (op: hps_ops.cc). Compiled only when TensorFlow itself was
// built with CUDA (CMake defines GOOGLE_CUDA=1 then); chosen by TensorFlow when the op is placed
// on a GPU. The keys stay on the device: the kernel hands their device pointer, the output's
// device pointer, the CUDA device ordinal and TensorFlow's stream to the device callback that
// embedlab.hps registers (hps_callbacks.h), which runs the parameter server's GPU tier
// (ParameterServer.lookup(..., device=ordinal)) with TensorFlow's stream as its current stream
// and writes the rows into the output on that stream. The host syncs are the server's (one per
// lookup, two with cache misses; none here). A table that is not on the GPU tier of this device
// (no GPU cache for the model, or the device not in its deployed_device_list, or no PyTorch /
// CuPy in the process) is served through the host callback instead: HostPath() below.
// The toolkit/driver rule: adapter_gpu.h.
//
// int32 ids: TensorFlow keeps int32 tensors of GPU ops in host memory (MTypeFromDType), so the
// int32 kernel declares HostMemory("ids"), copies the 4-byte keys to the device on the op's
// stream (one copy) and the callback widens them to int64 there. int64 ids arrive on the device.
#if GOOGLE_CUDA
#define EIGEN_USE_GPU

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

#include "adapter_gpu.h"
#include "hps_callbacks.h"
#include "hps_op.h"

namespace tensorflow {
namespace {

template <typename Tid>
class HpsLookupGpuOp : public HpsLookupKernel {
 public:
  explicit HpsLookupGpuOp(OpKernelConstruction* c) : HpsLookupKernel(c) {
    OP_REQUIRES_OK(c, CheckCudaVersions("EmbedLabHpsLookup"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateRows(ctx, &out));
    const int64_t n = ids.NumElements();
    if (n == 0) return;
    EmbedLabHpsDeviceLookupFn fn = embedlab_hps_device_lookup_callback();
    OP_REQUIRES(ctx, fn != nullptr,
                errors::FailedPrecondition("EmbedLabHpsLookup on a GPU: no device lookup callback is registered in "
                                           "this process; `import embedlab.hps` (after TensorFlow) before running "
                                           "or loading a model that holds HPS layers"));
    const std::string where = Where();
    cudaStream_t stream = StreamOf(ctx);
    float* out_ptr = out->flat<float>().data();

    // The CUDA device of TensorFlow's output buffer: the ordinal PyTorch and CuPy use (TensorFlow's
    // own GPU numbering may differ under visible_device_list).
    cudaPointerAttributes attr;
    OP_REQUIRES_OK(ctx, CudaStatus(where, cudaPointerGetAttributes(&attr, out_ptr), "cudaPointerGetAttributes"));
    OP_REQUIRES(ctx, attr.type == cudaMemoryTypeDevice,
                errors::Internal(where, ": the output is not in device memory (cudaPointerGetAttributes type ",
                                 static_cast<int>(attr.type), ")"));
    const int64_t device = attr.device;

    const void* keys = nullptr;
    Tensor keys_dev;
    if constexpr (std::is_same<Tid, int64_t>::value) {
      keys = ids.flat<int64_t>().data();
    } else {
      // Host int32 keys (HostMemory) to the device, on the op's stream; widened by the callback.
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_INT32, TensorShape({n}), &keys_dev));
      OP_REQUIRES_OK(ctx, CudaStatus(where,
                                     cudaMemcpyAsync(keys_dev.flat<int32_t>().data(), ids.flat<int32_t>().data(),
                                                     n * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
                                     "cudaMemcpyAsync of the int32 keys"));
      keys = keys_dev.flat<int32_t>().data();
    }
    char err[2048];
    err[0] = '\0';
    const int rc = fn(config_.c_str(), model_.c_str(), table_id_, global_batch_size_, keys,
                      static_cast<int64_t>(sizeof(Tid)), n, out_ptr, dim_, device, static_cast<void*>(stream), err,
                      sizeof(err));
    if (rc == kEmbedLabHpsHostPath) {
      OP_REQUIRES_OK(ctx, HostPath(ids, keys, n, out_ptr, stream));
      return;
    }
    OP_REQUIRES(ctx, rc == 0, errors::InvalidArgument(where, ": ", err[0] ? err : "the parameter server failed"));
  }

 private:
  // The table is not on the GPU tier of this device (the callback said why, and logs it once):
  // the keys come to the host in one copy, the host callback (the CPU kernel's) looks them up,
  // and the rows go to `out` in one copy. Both copies are waited for (the host buffers are
  // freed on return); int32 keys are already on the host (HostMemory) and are widened there.
  absl::Status HostPath(const Tensor& ids, const void* dev_keys, int64_t n, float* out, cudaStream_t stream) {
    const std::string where = Where();
    EmbedLabHpsLookupFn host = embedlab_hps_lookup_callback();
    if (host == nullptr)
      return errors::FailedPrecondition(where, ": the table is served through the host path, but no host lookup "
                                        "callback is registered; `import embedlab.hps` first");
    std::vector<int64_t> keys(n);
    if constexpr (std::is_same<Tid, int64_t>::value) {
      TF_RETURN_IF_ERROR(CudaStatus(where, cudaMemcpyAsync(keys.data(), dev_keys, n * sizeof(int64_t),
                                                           cudaMemcpyDeviceToHost, stream),
                                    "cudaMemcpyAsync of the keys to the host"));
      TF_RETURN_IF_ERROR(CudaStatus(where, cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    } else {
      auto src = ids.flat<int32_t>();
      for (int64_t i = 0; i < n; ++i) keys[i] = src(i);
    }
    std::vector<float> rows(n * dim_);
    char err[2048];
    err[0] = '\0';
    const int rc = host(config_.c_str(), model_.c_str(), table_id_, global_batch_size_, keys.data(), n, rows.data(),
                        dim_, err, sizeof(err));
    if (rc != 0) return errors::InvalidArgument(where, ": ", err[0] ? err : "the parameter server failed");
    TF_RETURN_IF_ERROR(CudaStatus(where, cudaMemcpyAsync(out, rows.data(), rows.size() * sizeof(float),
                                                         cudaMemcpyHostToDevice, stream),
                                  "cudaMemcpyAsync of the rows to the device"));
    return CudaStatus(where, cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }

  std::string Where() const {
    return strings::StrCat("EmbedLabHpsLookup(model_name='", model_, "', table_id=", table_id_, ") on a GPU");
  }
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabHpsLookup").Device(DEVICE_GPU).TypeConstraint<int64_t>("Tid"),
                        HpsLookupGpuOp<int64_t>);
REGISTER_KERNEL_BUILDER(
    Name("EmbedLabHpsLookup").Device(DEVICE_GPU).TypeConstraint<int32_t>("Tid").HostMemory("ids"),
    HpsLookupGpuOp<int32_t>);

}  // namespace
}  // namespace tensorflow

#endif  // GOOGLE_CUDA

// What the GPU OpKernel files share (embedding_kernels_gpu.cc, sparse_optimizer_kernels_gpu.cc,
// hps_kernels_gpu.cc):
// TensorFlow's stream, CUDA errors as statuses, the toolkit/driver check, scratch memory from
// TensorFlow's allocator, and the device-side key check. Included only under GOOGLE_CUDA, after
// EIGEN_USE_GPU; internal to each kernel file (an anonymous namespace).
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
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

#include "embedding.h"

namespace tensorflow {
namespace {

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
// [[maybe_unused]]: not every kernel file checks CSR ids (hps_kernels_gpu.cc does not).
[[maybe_unused]] absl::Status CheckIds(OpKernelContext* ctx, const std::string& what, const embedlab::CsrIds& ids, int64_t num_rows,
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

}  // namespace
}  // namespace tensorflow

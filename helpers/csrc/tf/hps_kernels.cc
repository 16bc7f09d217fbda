// Host kernel of EmbedLabHpsLookup. The parameter server (embedlab.hps.ParameterServer, with its
// Redis and RocksDB clients) is Python, so the kernel calls a C callback that embedlab.hps
// registers through embedlab_hps_set_lookup_callback() (ctypes) at import. The callback takes
// the GIL, finds or starts the server for ps_config_file and fills the output. Keeping the tiers
// in one Python implementation means the layers, the Triton python backend and the notebooks
// all see the same server, its statistics and its fault handling. The GPU kernel (CUDA builds,
// hps_kernels_gpu.cc) calls the second callback, registered through
// embedlab_hps_set_device_lookup_callback(), which is kept here so that every build accepts it.
#include <atomic>
#include <cstdint>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

#include "hps_callbacks.h"
#include "hps_op.h"

namespace {
std::atomic<EmbedLabHpsLookupFn> g_lookup{nullptr};
std::atomic<EmbedLabHpsDeviceLookupFn> g_device_lookup{nullptr};
}

extern "C" __attribute__((visibility("default"))) void embedlab_hps_set_lookup_callback(EmbedLabHpsLookupFn fn) {
  g_lookup.store(fn);
}

extern "C" __attribute__((visibility("default"))) int embedlab_hps_has_lookup_callback() {
  return g_lookup.load() != nullptr;
}

extern "C" __attribute__((visibility("default"))) void embedlab_hps_set_device_lookup_callback(
    EmbedLabHpsDeviceLookupFn fn) {
  g_device_lookup.store(fn);
}

extern "C" __attribute__((visibility("default"))) int embedlab_hps_has_device_lookup_callback() {
  return g_device_lookup.load() != nullptr;
}

extern "C" EmbedLabHpsLookupFn embedlab_hps_lookup_callback() { return g_lookup.load(); }

extern "C" EmbedLabHpsDeviceLookupFn embedlab_hps_device_lookup_callback() { return g_device_lookup.load(); }

// 1 where this library holds the GPU kernel of EmbedLabHpsLookup (a CUDA build of the op library).
extern "C" __attribute__((visibility("default"))) int embedlab_hps_has_gpu_kernel() {
#if GOOGLE_CUDA
  return 1;
#else
  return 0;
#endif
}

namespace tensorflow {
namespace {

class HpsLookupOp : public HpsLookupKernel {
 public:
  explicit HpsLookupOp(OpKernelConstruction* c) : HpsLookupKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& ids = ctx->input(0);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateRows(ctx, &out));
    const int64_t n = ids.NumElements();
    if (n == 0) return;
    EmbedLabHpsLookupFn fn = g_lookup.load();
    OP_REQUIRES(ctx, fn != nullptr,
                errors::FailedPrecondition("EmbedLabHpsLookup: no parameter server callback is registered in this "
                                           "process; `import embedlab.hps` (after TensorFlow) before running or "
                                           "loading a model that holds HPS layers"));
    Tensor keys64;
    const int64_t* keys = nullptr;
    if (ids.dtype() == DT_INT64) {
      keys = ids.flat<int64_t>().data();
    } else {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_INT64, TensorShape({n}), &keys64));
      auto src = ids.flat<int32_t>();
      auto dst = keys64.flat<int64_t>();
      for (int64_t i = 0; i < n; ++i) dst(i) = src(i);
      keys = dst.data();
    }
    char err[2048];
    err[0] = '\0';
    const int rc = fn(config_.c_str(), model_.c_str(), table_id_, global_batch_size_, keys, n,
                      out->flat<float>().data(), dim_, err, sizeof(err));
    OP_REQUIRES(ctx, rc == 0,
                errors::InvalidArgument("EmbedLabHpsLookup(model_name='", model_, "', table_id=", table_id_,
                                        "): ", err[0] ? err : "the parameter server failed"));
  }
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabHpsLookup").Device(DEVICE_CPU), HpsLookupOp);

}  // namespace
}  // namespace tensorflow

// CPU OpKernel of the COO -> CSR conversion (op: csr_ops.cc); the conversion itself (CooToCsr,
// adapter_cpu.h) is shared with EmbedLabFusedResourceSparseLookup.
#define EIGEN_USE_THREADS

#include <cstdint>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

#include "adapter_cpu.h"
#include "tf_pool.h"

namespace tensorflow {
namespace {

class SparseToCsrOp : public OpKernel {
 public:
  explicit SparseToCsrOp(OpKernelConstruction* c) : OpKernel(c) { OP_REQUIRES_OK(c, coo_.Init(c)); }

  void Compute(OpKernelContext* ctx) override {
    TfPool pool(ctx);
    OP_REQUIRES_OK(ctx, coo_.Convert(ctx, pool, /*in0=*/0, /*out0=*/0));
  }

 private:
  CooToCsr coo_;
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabSparseToCsr").Device(DEVICE_CPU), SparseToCsrOp);

}  // namespace
}  // namespace tensorflow

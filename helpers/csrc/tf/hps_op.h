// What the host kernel (hps_kernels.cc) and the GPU kernel (hps_kernels_gpu.cc) of
// EmbedLabHpsLookup share: the op's attributes and its output of the ids' shape plus [dim].
#pragma once

#include <cstdint>
#include <string>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tensorflow {

class HpsLookupKernel : public OpKernel {
 public:
  explicit HpsLookupKernel(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("model_name", &model_));
    OP_REQUIRES_OK(c, c->GetAttr("table_id", &table_id_));
    OP_REQUIRES_OK(c, c->GetAttr("emb_vec_size", &dim_));
    OP_REQUIRES_OK(c, c->GetAttr("ps_config_file", &config_));
    OP_REQUIRES_OK(c, c->GetAttr("global_batch_size", &global_batch_size_));
    OP_REQUIRES(c, !model_.empty(), errors::InvalidArgument("EmbedLabHpsLookup: model_name must not be empty"));
  }

 protected:
  // Output 0: input 0's shape plus [dim].
  absl::Status AllocateRows(OpKernelContext* ctx, Tensor** out) const {
    TensorShape shape = ctx->input(0).shape();
    shape.AddDim(dim_);
    return ctx->allocate_output(0, shape, out);
  }

  std::string model_, config_;
  int64_t table_id_ = 0, dim_ = 1, global_batch_size_ = 1;
};

}  // namespace tensorflow

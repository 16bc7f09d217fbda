// CPU kernels of EmbedLabAlignedTable, EmbedLabZerosTable, EmbedLabAssignTable and EmbedLabTableAddress
// (ops: table_placement_ops.cc).
#define EIGEN_USE_THREADS

#include <cstdint>
#include <cstring>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

#include "table_placement.h"
#include "tf_pool.h"

namespace tensorflow {
namespace {

class AlignedTableOp : public OpKernel {
 public:
  explicit AlignedTableOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& value = ctx->input(0);
    // Copied even when already aligned: the variable must own its buffer (one adopted from NumPy or
    // DLPack is not TensorFlow's, and TensorFlow copies such a table at its first sparse update).
    if (!embedlab_tf::IsLargeTable(value)) {
      ctx->set_output(0, value);
      return;
    }
    Tensor out;
    embedlab_tf::TfPool pool(ctx);
    OP_REQUIRES_OK(ctx, embedlab_tf::AlignedCopy("EmbedLabAlignedTable", value, pool, &out));
    ctx->set_output(0, out);
  }
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabAlignedTable").Device(DEVICE_CPU).TypeConstraint<float>("T"), AlignedTableOp);

class ZerosTableOp : public OpKernel {
 public:
  explicit ZerosTableOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& shape_t = ctx->input(0);
    OP_REQUIRES(ctx, shape_t.dims() == 1 && shape_t.NumElements() == 2,
                errors::InvalidArgument("EmbedLabZerosTable: shape must be [rows, dim], got a tensor of shape ",
                                        shape_t.shape().DebugString()));
    const auto dims = shape_t.vec<int64_t>();
    OP_REQUIRES(ctx, dims(0) >= 0 && dims(1) >= 0,
                errors::InvalidArgument("EmbedLabZerosTable: shape must be [rows, dim] with rows, dim >= 0, got [",
                                        dims(0), ", ", dims(1), "]"));
    TensorShape shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape({dims(0), dims(1)}, &shape));
    if (embedlab_tf::IsLargeTableBytes(static_cast<uint64_t>(shape.num_elements()) * sizeof(float))) {
      Tensor t;   // a fresh mapping reads as zeros
      OP_REQUIRES_OK(ctx, embedlab_tf::MapTable("EmbedLabZerosTable", DT_FLOAT, shape, &t));
      ctx->set_output(0, t);
      return;
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out));
    std::memset(const_cast<char*>(out->tensor_data().data()), 0, out->TotalBytes());
  }
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabZerosTable").Device(DEVICE_CPU).TypeConstraint<float>("T").HostMemory("shape"),
                        ZerosTableOp);

class AssignTableOp : public OpKernel {
 public:
  explicit AssignTableOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<Var> var;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &var));
    const Tensor& value = ctx->input(1);
    OP_REQUIRES(ctx, embedlab_tf::IsLargeTable(value),
                errors::InvalidArgument("EmbedLabAssignTable: value of ", value.TotalBytes(),
                                        " bytes is no large table, or EMBEDLAB_ALIGNED_TABLES=0 turned table "
                                        "placement off (assign it with AssignVariableOp)"));
    OP_REQUIRES_OK(ctx, embedlab_tf::AssignTable(ctx, var.get(), value));
  }
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabAssignTable").Device(DEVICE_CPU).TypeConstraint<float>("T"), AssignTableOp);

class TableAddressOp : public OpKernel {
 public:
  explicit TableAddressOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    core::RefCountPtr<Var> var;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &var));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    tf_shared_lock l(*var->mu());
    out->scalar<int64_t>()() = static_cast<int64_t>(reinterpret_cast<uintptr_t>(var->tensor()->tensor_data().data()));
  }
};

REGISTER_KERNEL_BUILDER(Name("EmbedLabTableAddress").Device(DEVICE_CPU), TableAddressOp);

}  // namespace
}  // namespace tensorflow

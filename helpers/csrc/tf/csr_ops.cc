// Op registration and shape function of the COO -> CSR conversion (kernel: csr_kernels.cc).
// Always compiled, like every *_ops.cc.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

#include "shapes.h"

namespace tensorflow {
namespace embedlab_shapes {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// See shapes.h.
absl::Status CooToCsrShapes(InferenceContext* c, int in0, int out0) {
  int n, nw;
  TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &n));
  TF_RETURN_IF_ERROR(c->GetAttr("num_weights", &nw));
  if (nw != 0 && nw != n) return errors::InvalidArgument("num_weights must be 0 or num_tables");
  for (int t = 0; t < n; ++t) {
    ShapeHandle idx, vals;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(in0 + t), 2, &idx));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(in0 + n + t), 1, &vals));
    c->set_output(out0 + t, c->Vector(c->UnknownDim()));
    c->set_output(out0 + n + t, vals);
    if (nw) c->set_output(out0 + 2 * n + t, vals);
  }
  return absl::OkStatus();
}

}  // namespace embedlab_shapes

REGISTER_OP("EmbedLabSparseToCsr")
    .Input("indices: num_tables * int64")
    .Input("values: num_tables * int64")
    .Input("dense_shape: num_tables * int64")
    .Input("weights: num_weights * float")
    .Output("row_splits: num_tables * int64")
    .Output("keys: num_tables * int64")
    .Output("weights_out: num_weights * float")
    .Attr("num_tables: int >= 1 = 1")
    .Attr("num_weights: int >= 0 = 0")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      return embedlab_shapes::CooToCsrShapes(c, /*in0=*/0, /*out0=*/0);
    })
    .Doc(R"doc(
Several [batch, max_nnz] SparseTensors (and their weights) as CSR, in one op: per table,
row_splits [batch + 1] and the keys in row order. Stable counting sort by row; when the entries
are already in row order (any canonical SparseTensor) the keys and weights are forwarded without
a copy. One op for all tables: on a small CPU each extra op costs tens of microseconds.
)doc");

}  // namespace tensorflow

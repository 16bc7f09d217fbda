// Op registrations and shape functions of the lookup and its backward (kernels:
// embedding_kernels.cc, embedding_kernels_gpu.cc). Always compiled: an op exists whether or not
// the library was built with CUDA (only GPU kernel registrations depend on GOOGLE_CUDA).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

#include "shapes.h"

namespace tensorflow {
namespace embedlab_shapes {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// Inputs: tables (N x [rows, dim] tensors or N resources), row_splits (N x [batch+1]), ...
// Outputs: N x [batch, dim].
// The row width of table t (input t: a [rows, dim] tensor, or a resource whose handle data
// carries its shape); unknown when a resource's shape is not known while building the graph.
absl::Status TableDim(InferenceContext* c, int t, bool resource, DimensionHandle* dim) {
  *dim = c->UnknownDim();
  ShapeHandle table;
  if (!resource) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(t), 2, &table));
    *dim = c->Dim(table, 1);
    return absl::OkStatus();
  }
  auto* handle_data = c->input_handle_shapes_and_types(t);
  if (handle_data != nullptr && !handle_data->empty()) {
    TF_RETURN_IF_ERROR(c->WithRank((*handle_data)[0].shape, 2, &table));
    *dim = c->Dim(table, 1);
  }
  return absl::OkStatus();
}

absl::Status FusedLookupShape(InferenceContext* c, bool resource_tables) {
  int n;
  TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &n));
  for (int t = 0; t < n; ++t) {
    ShapeHandle splits;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(n + t), 1, &splits));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(2 * n + t), 1, &splits /*unused*/));
    DimensionHandle batch;
    TF_RETURN_IF_ERROR(c->Subtract(c->Dim(c->input(n + t), 0), 1, &batch));
    DimensionHandle dim;
    TF_RETURN_IF_ERROR(TableDim(c, t, resource_tables, &dim));
    c->set_output(t, c->Matrix(batch, dim));
  }
  return absl::OkStatus();
}

absl::Status FusedLookupGradShape(InferenceContext* c) {
  int n;
  TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &n));
  for (int t = 0; t < n; ++t) {
    ShapeHandle grad;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(t), 2, &grad));
    c->set_output(t, c->Vector(c->UnknownDim()));
    c->set_output(n + t, c->Matrix(c->UnknownDim(), c->Dim(grad, 1)));
  }
  return absl::OkStatus();
}

}  // namespace embedlab_shapes

REGISTER_OP("EmbedLabFusedLookup")
    .Input("tables: num_tables * float")
    .Input("row_splits: num_tables * int64")
    .Input("keys: num_tables * int64")
    .Input("weights: num_weights * float")
    .Output("outputs: num_tables * float")
    .Attr("num_tables: int >= 1")
    .Attr("num_weights: int >= 0")
    .Attr("combiners: list(string)")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      return embedlab_shapes::FusedLookupShape(c, /*resource_tables=*/false);
    })
    .Doc(R"doc(
Pooled lookup of several tables in one kernel. Per table t: CSR ids (row_splits[t], keys[t]),
key -1 skipped, optional per-key weights (num_weights is 0 or num_tables), combiner "sum" or
"mean"; outputs[t] has shape [len(row_splits[t]) - 1, dim_t]; empty rows give zeros.
)doc");

REGISTER_OP("EmbedLabFusedResourceLookup")
    .Input("tables: num_tables * resource")
    .Input("row_splits: num_tables * int64")
    .Input("keys: num_tables * int64")
    .Input("weights: num_weights * float")
    .Output("outputs: num_tables * float")
    .Attr("num_tables: int >= 1")
    .Attr("num_weights: int >= 0")
    .Attr("combiners: list(string)")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      return embedlab_shapes::FusedLookupShape(c, /*resource_tables=*/true);
    })
    .Doc(R"doc(
EmbedLabFusedLookup reading resource variables in place (like ResourceGather): no copy of the
table is made, and the gradient is an IndexedSlices on the variable.
)doc");

REGISTER_OP("EmbedLabFusedResourceSparseLookup")
    .Input("tables: num_tables * resource")
    .Input("indices: num_tables * int64")
    .Input("values: num_tables * int64")
    .Input("dense_shape: num_tables * int64")
    .Input("weights: num_weights * float")
    .Output("outputs: num_tables * float")
    .Output("row_splits: num_tables * int64")
    .Output("keys: num_tables * int64")
    .Output("weights_out: num_weights * float")
    .Attr("num_tables: int >= 1")
    .Attr("num_weights: int >= 0")
    .Attr("combiners: list(string)")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      int n;
      TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &n));
      TF_RETURN_IF_ERROR(embedlab_shapes::CooToCsrShapes(c, /*in0=*/n, /*out0=*/n));
      for (int t = 0; t < n; ++t) {
        // The batch is dense_shape[0] when that is known while building the graph.
        shape_inference::ShapeHandle dense;
        shape_inference::DimensionHandle batch = c->UnknownDim(), dim;
        if (c->MakeShapeFromShapeTensor(3 * n + t, &dense).ok() && c->RankKnown(dense) && c->Rank(dense) >= 1)
          batch = c->Dim(dense, 0);
        TF_RETURN_IF_ERROR(embedlab_shapes::TableDim(c, t, /*resource=*/true, &dim));
        c->set_output(t, c->Matrix(batch, dim));
      }
      return absl::OkStatus();
    })
    .Doc(R"doc(
EmbedLabSparseToCsr followed by EmbedLabFusedResourceLookup, in one op: per table a
[batch, max_nnz] SparseTensor (indices, values, dense_shape) and optional weights; outputs the
pooled rows and the CSR ids (row_splits, keys, weights_out), which the gradient reads. Entries
in row order (any canonical SparseTensor) are looked up in a single pass that reads each
entry's row from the indices (keys and weights are then the inputs, not copies); a table out of
order is sorted by row first. CPU kernel only.
)doc");

REGISTER_OP("EmbedLabFusedLookupGrad")
    .Input("grads: num_tables * float")
    .Input("row_splits: num_tables * int64")
    .Input("keys: num_tables * int64")
    .Input("weights: num_weights * float")
    .Output("unique_keys: num_tables * int64")
    .Output("rows: num_tables * float")
    .Attr("num_tables: int >= 1")
    .Attr("num_weights: int >= 0")
    .Attr("combiners: list(string)")
    .SetShapeFn(embedlab_shapes::FusedLookupGradShape)
    .Doc(R"doc(
Backward of EmbedLabFusedLookup: per table, the ascending unique keys touched and the summed
gradient rows (the parts of an IndexedSlices). Deterministic for any thread count.
)doc");

}  // namespace tensorflow

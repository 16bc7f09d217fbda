// Op registrations and shape functions. Always compiled: an op exists whether or not the
// library was built with CUDA (only GPU kernel registrations depend on GOOGLE_CUDA).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

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

// The CSR outputs of a COO conversion: row_splits[t] (length unknown) at out0 + t, keys[t] and
// weights_out[t] shaped like values[t] at out0 + n + t and out0 + 2n + t; the inputs indices[t]
// at in0 + t ([nnz, rank]) and values[t] at in0 + n + t.
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

REGISTER_OP("EmbedLabFusedLookupGradApply")
    .Input("grads: num_tables * float")
    .Input("row_splits: num_tables * int64")
    .Input("keys: num_tables * int64")
    .Input("weights: num_weights * float")
    .Input("vars: num_tables * resource")
    .Input("slots: num_slots * resource")
    .Input("lr: float")
    .Input("epsilon: float")
    .Input("beta_1: double")
    .Input("beta_2: double")
    .Input("step: int64")
    .Attr("num_tables: int >= 1")
    .Attr("num_weights: int >= 0")
    .Attr("num_slots: int >= 0")
    .Attr("combiners: list(string)")
    .Attr("optimizer: {'sgd', 'adagrad', 'adam'}")
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc(R"doc(
Backward of EmbedLabFusedResourceLookup fused with a sparse optimizer update (FBGEMM's
"optimizer in backward"): per table, each touched key's gradient row is summed exactly as
EmbedLabFusedLookupGrad sums it (into a buffer the kernel reuses, not an output tensor) and the
optimizer is applied to those table rows in place. Same bits as EmbedLabFusedLookupGrad followed by
EmbedLabSparseApply<optimizer>. slots: none for sgd, the accumulators for adagrad, m then v
(num_tables each) for adam. Hyperparameters an optimizer does not use are ignored; step is
Adam's 1-based step. Every check runs before anything is written.
)doc");

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

REGISTER_OP("EmbedLabSparseApplySGD")
    .Input("vars: num_tables * resource")
    .Input("indices: num_tables * int64")
    .Input("grads: num_tables * float")
    .Input("lr: float")
    .Attr("num_tables: int >= 1")
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("w[i] -= lr * g for the given rows only; duplicate indices are summed first.");

REGISTER_OP("EmbedLabSparseApplyAdagrad")
    .Input("vars: num_tables * resource")
    .Input("accumulators: num_tables * resource")
    .Input("indices: num_tables * int64")
    .Input("grads: num_tables * float")
    .Input("lr: float")
    .Input("epsilon: float")
    .Attr("num_tables: int >= 1")
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("Keras Adagrad on the given rows only: acc += g*g; w -= lr*g/sqrt(acc+eps).");

REGISTER_OP("EmbedLabSparseApplyAdam")
    .Input("vars: num_tables * resource")
    .Input("ms: num_tables * resource")
    .Input("vs: num_tables * resource")
    .Input("indices: num_tables * int64")
    .Input("grads: num_tables * float")
    .Input("lr: float")
    .Input("beta_1: double")
    .Input("beta_2: double")
    .Input("epsilon: float")
    .Input("step: int64")
    .Attr("num_tables: int >= 1")
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("Lazy Adam (Keras expression order) on the given rows only; step is the 1-based step. "
         "The betas are double so that 1 - beta rounds like Keras' Python-float arithmetic.");

REGISTER_OP("EmbedLabGlobalApplyAdam")
    .Input("vars: num_tables * resource")
    .Input("ms: num_tables * resource")
    .Input("vs: num_tables * resource")
    .Input("indices: num_tables * int64")
    .Input("grads: num_tables * float")
    .Input("lr: float")
    .Input("beta_1: double")
    .Input("beta_2: double")
    .Input("epsilon: float")
    .Input("step: int64")
    .Input("rows_used: int64")
    .Attr("num_tables: int >= 1")
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("Global Adam (HugeCTR's update_type Global) in one pass over rows [0, rows_used[t]) of each "
         "table: the given rows with their gradients (duplicates summed first), every other row with a "
         "zero gradient; rows past rows_used (m = v = 0, never touched) do not move and are not read. "
         "rows_used: [num_tables] int64 in [0, rows]. Same expression order as EmbedLabSparseApplyAdam.");

REGISTER_OP("EmbedLabGlobalAdamCatchUp")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("last: resource")
    .Input("rows: int64")
    .Input("all_rows: int64")
    .Input("target: int64")
    .Input("lr_ring: float")
    .Input("beta_1: double")
    .Input("beta_2: double")
    .Input("epsilon: float")
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("Deferred exact Global Adam (csrc/core/embedding.h, global_adam_catch_up_cpu): brings rows "
         "(any order, repeats allowed) or, when all_rows >= 0, rows [0, all_rows) up to step target by "
         "replaying the zero-gradient updates they missed since last[row] (int64 variable, one entry "
         "per table row), with the learning rate of step j at lr_ring[j % len(lr_ring)]. A row too far "
         "behind for the ring is an error and nothing is written.");

}  // namespace tensorflow

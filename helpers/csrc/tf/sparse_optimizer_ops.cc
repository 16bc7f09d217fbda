// Op registrations of the sparse optimizers, Global Adam and the fused backward + optimizer
// (kernels: sparse_optimizer_kernels.cc, sparse_optimizer_kernels_gpu.cc). None has outputs.
// Always compiled, like every *_ops.cc.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"

namespace tensorflow {

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
    .Attr("optimizer: {'sgd', 'adagrad', 'adam', 'ftrl'}")
    .Attr("lr_power: float = -0.5")
    .Attr("l1: float = 0.0")
    .Attr("l2: float = 0.0")
    .Attr("l2_shrinkage: float = 0.0")
    .Attr("beta: float = 0.0")
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc(R"doc(
Backward of EmbedLabFusedResourceLookup fused with a sparse optimizer update (FBGEMM's
"optimizer in backward"): per table, each touched key's gradient row is summed exactly as
EmbedLabFusedLookupGrad sums it (into a buffer the kernel reuses, not an output tensor) and the
optimizer is applied to those table rows in place. Same bits as EmbedLabFusedLookupGrad followed by
EmbedLabSparseApply<optimizer>. slots: none for sgd, the accumulators for adagrad, m then v
(num_tables each) for adam, accumulators then linears for ftrl. Hyperparameters an optimizer does
not use are ignored; step is Adam's 1-based step; lr_power, l1, l2, l2_shrinkage and beta are
FTRL's (EmbedLabSparseApplyFtrl). Every check runs before anything is written.
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

REGISTER_OP("EmbedLabSparseApplyFtrl")
    .Input("vars: num_tables * resource")
    .Input("accumulators: num_tables * resource")
    .Input("linears: num_tables * resource")
    .Input("indices: num_tables * int64")
    .Input("grads: num_tables * float")
    .Input("lr: float")
    .Attr("num_tables: int >= 1")
    .Attr("lr_power: float = -0.5")
    .Attr("l1: float = 0.0")
    .Attr("l2: float = 0.0")
    .Attr("l2_shrinkage: float = 0.0")
    .Attr("beta: float = 0.0")
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc("Keras 3 FTRL (keras.optimizers.Ftrl; the update is written out at FtrlParams in "
         "csrc/core/sparse_optimizer.h) on the given rows only, duplicates summed first: "
         "accumulators = n, linears = z. lr > 0, lr_power <= 0, l1, l2, l2_shrinkage, beta >= 0.");

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
    .Doc("Deferred exact Global Adam (csrc/core/sparse_optimizer.h, global_adam_catch_up_cpu): brings rows "
         "(any order, repeats allowed) or, when all_rows >= 0, rows [0, all_rows) up to step target by "
         "replaying the zero-gradient updates they missed since last[row] (int64 variable, one entry "
         "per table row), with the learning rate of step j at lr_ring[j % len(lr_ring)]. A row too far "
         "behind for the ring is an error and nothing is written.");

}  // namespace tensorflow

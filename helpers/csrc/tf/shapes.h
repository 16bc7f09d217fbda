// Named shape functions that more than one *_ops.cc uses.
#pragma once

#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace embedlab_shapes {

// The CSR outputs of a COO conversion (csr_ops.cc): row_splits[t] (length unknown) at out0 + t,
// keys[t] and weights_out[t] shaped like values[t] at out0 + n + t and out0 + 2n + t; the inputs
// indices[t] at in0 + t ([nnz, rank]) and values[t] at in0 + n + t. EmbedLabSparseToCsr and
// EmbedLabFusedResourceSparseLookup (embedding_ops.cc) share it.
absl::Status CooToCsrShapes(shape_inference::InferenceContext* c, int in0, int out0);

}  // namespace embedlab_shapes
}  // namespace tensorflow

// Op registrations and shape functions of the int64 -> int64 hash table resource
// (csrc/core/hash_table.h). Always compiled; the kernels are in hash_table_kernels.cc (CPU).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

absl::Status TableScalar(InferenceContext* c) {
  ShapeHandle unused;
  return c->WithRank(c->input(0), 0, &unused);
}

// values shaped like keys (input 1).
absl::Status ValuesLikeKeys(InferenceContext* c) {
  TF_RETURN_IF_ERROR(TableScalar(c));
  c->set_output(0, c->input(1));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("EmbedLabHashTableHandle")
    .Output("table: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("initial_capacity: int = 1024")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
Creates (or finds, by container and shared_name) an int64 -> int64 hash table and returns its
resource handle, like MutableHashTableV2. An empty shared_name shares by node name.
initial_capacity: keys that fit before the first rehash (>= 1).
)doc");

REGISTER_OP("EmbedLabHashTableAnonymousHandle")
    .Output("table: resource")
    .Attr("initial_capacity: int = 1024")
    .Attr("debug_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
Creates a new int64 -> int64 hash table owned by the returned handle (a ref-counting handle,
like AnonymousHashTable): the table is freed when the last copy of the handle is gone. Every
execution creates a new table. debug_name appears in error messages.
)doc");

REGISTER_OP("EmbedLabHashTableFind")
    .Input("table: resource")
    .Input("keys: int64")
    .Output("values: int64")
    .SetIsStateful()
    .SetShapeFn(ValuesLikeKeys)
    .Doc(R"doc(
values[i] = the value of keys[i], or -1 where keys[i] is absent. keys of any shape.
)doc");

REGISTER_OP("EmbedLabHashTableFindOrInsert")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("max_size: int64")
    .Output("values: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &unused));
      return ValuesLikeKeys(c);
    })
    .Doc(R"doc(
The values of keys, inserting absent keys with value = size() at insertion (first occurrence in
row-major order first; deterministic). max_size > 0 caps the table's size: a batch that would
pass it fails with InvalidArgument naming the first key that does not fit, and inserts nothing.
)doc");

REGISTER_OP("EmbedLabHashTableInsert")
    .Input("table: resource")
    .Input("keys: int64")
    .Input("values: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(TableScalar(c));
      ShapeHandle unused;
      return c->Merge(c->input(1), c->input(2), &unused);
    })
    .Doc(R"doc(
table[keys[i]] = values[i] in row-major order (a later duplicate wins); inserts absent keys.
)doc");

REGISTER_OP("EmbedLabHashTableErase")
    .Input("table: resource")
    .Input("keys: int64")
    .Output("num_erased: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(TableScalar(c));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Removes the keys present; num_erased counts them (a duplicate counts once).
)doc");

REGISTER_OP("EmbedLabHashTableSize")
    .Input("table: resource")
    .Output("size: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(TableScalar(c));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc("Number of keys in the table.");

REGISTER_OP("EmbedLabHashTableExport")
    .Input("table: resource")
    .Output("keys: int64")
    .Output("values: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(TableScalar(c));
      auto n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Vector(n));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Every entry as (keys, values) vectors, ordered by ascending value, then ascending key.
)doc");

REGISTER_OP("EmbedLabHashTableClear")
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return TableScalar(c); })
    .Doc("Removes every key and frees the table's memory.");

}  // namespace tensorflow

// Op registrations and shape functions of EmbedLabRouteCount / EmbedLabRouteScatter
// (kernels: routing_kernels.cc), csrc/core/routing.h for embedlab.sok's exchange. Always
// compiled, like every *_ops.cc.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

using shape_inference::InferenceContext;

REGISTER_OP("EmbedLabRouteCount")
    .Input("keys: num_tables * int64")
    .Output("counts: int64")
    .Output("bad: int64")
    .Attr("num_tables: int >= 1")
    .Attr("num_workers: int >= 1")
    .Attr("modes: list(int)")
    .Attr("rows: list(int)")
    .Attr("ranks: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      int n, T;
      TF_RETURN_IF_ERROR(c->GetAttr("num_workers", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &T));
      c->set_output(0, c->Matrix(n, T));
      c->set_output(1, c->Vector(3));
      return absl::OkStatus();
    })
    .Doc("counts[o, t]: keys of table t that worker o owns. bad: (table, position, key) of the "
         "first key outside its table's rule, or (-1, -1, -1).");

REGISTER_OP("EmbedLabRouteScatter")
    .Input("keys: num_tables * int64")
    .Input("counts: int64")
    .Input("stride: int64")
    .Output("send: int64")
    .Output("inverse: num_tables * int64")
    .Attr("num_tables: int >= 1")
    .Attr("num_workers: int >= 1")
    .Attr("modes: list(int)")
    .Attr("rows: list(int)")
    .Attr("ranks: list(int)")
    .SetShapeFn([](InferenceContext* c) {
      int T;
      TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &T));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      for (int t = 0; t < T; ++t) c->set_output(1 + t, c->input(t));
      return absl::OkStatus();
    })
    .Doc("send: [num_workers * stride] local rows (keys for hashed tables), owner o's at o * stride, "
         "-1 where unused. inverse[t]: position in send of each key of keys[t], -1 for padding.");

}  // namespace tensorflow

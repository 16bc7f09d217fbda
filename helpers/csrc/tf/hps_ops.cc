// The HPS lookup op (registration and shape function). Always compiled: the op exists with or
// without CUDA. Its host kernel (hps_kernels.cc) is always built; a CUDA build adds a GPU kernel
// (hps_kernels_gpu.cc) that hands device keys to the parameter server's GPU tier.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// ids: any shape, int32 or int64. embeddings: ids.shape + [emb_vec_size].
// Stateful: the answer depends on the parameter server's contents (never constant-folded or
// deduplicated by Grappler).
REGISTER_OP("EmbedLabHpsLookup")
    .Input("ids: Tid")
    .Output("embeddings: dtype")
    .Attr("Tid: {int32, int64}")
    .Attr("dtype: {float} = DT_FLOAT")
    .Attr("model_name: string")
    .Attr("table_id: int >= 0")
    .Attr("emb_vec_size: int >= 1")
    .Attr("ps_config_file: string = ''")
    .Attr("global_batch_size: int >= 1 = 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("emb_vec_size", &dim));
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->Concatenate(c->input(0), c->Vector(dim), &out));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Looks ids up in table `table_id` of `model_name` on EmbedLab's Hierarchical Parameter Server
(embedlab.hps). The server runs in the Python process; `import embedlab.hps` registers the
callback this kernel calls. When no server runs for `ps_config_file`, one is started from it
(HugeCTR's implicit initialisation), so a SavedModel holding this op initialises itself.
On a GPU (CUDA builds) the keys stay on the device when the table is on the server's GPU tier
of that device; otherwise they are looked up through the host (one copy each way).
)doc");

}  // namespace tensorflow

// Op registrations of the tables' placement (kernels: table_placement_kernels.cc, CPU only).
// Always compiled, like every op registration of the library.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

// value, copied into a mapping of its own that starts on a 2 MiB boundary and is advised onto
// huge pages (tables of 32 MiB and more; smaller ones, and any table when
// EMBEDLAB_ALIGNED_TABLES=0, come back as they are). A variable built from the output keeps
// that buffer (TensorFlow's variables adopt their initial value's buffer). Stateful, so that a
// graph never folds it into a constant of TensorFlow's own allocation.
REGISTER_OP("EmbedLabAlignedTable")
    .Input("value: T")
    .Output("table: T")
    .Attr("T: {float}")
    .SetIsStateful()
    .SetShapeFn(shape_inference::UnchangedShape);

// A [rows, dim] table of zeros: of 32 MiB and more (and EMBEDLAB_ALIGNED_TABLES not 0), a fresh
// mapping as EmbedLabAlignedTable gives, which is zero as mapped: nothing is allocated
// elsewhere, copied or touched (pages come in when first written); smaller ones in TensorFlow's
// buffer. For tables and optimizer state that start at zero (EmbedLabAlignedTable of tf.zeros
// would hold the table twice while it copies, and touch every page).
REGISTER_OP("EmbedLabZerosTable")
    .Input("shape: int64")
    .Output("table: T")
    .Attr("T: {float}")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle s;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &s));
      shape_inference::DimensionHandle n;
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(s, 0), 2, &n));
      shape_inference::ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(0, &out));
      c->set_output(0, out);
      return absl::OkStatus();
    });

// table := value (a float table of the variable's shape), keeping a large table in such a
// mapping: copied into the variable's own mapping in place when no one else holds it, else into
// a new one. Smaller tables are assigned as AssignVariableOp would (EmbedLab's Python wrapper
// calls AssignVariableOp for them).
REGISTER_OP("EmbedLabAssignTable")
    .Input("table: resource")
    .Input("value: T")
    .Attr("T: {float}")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs);

// The address of a variable's buffer now (an integer; for checks of where tables lie).
REGISTER_OP("EmbedLabTableAddress")
    .Input("table: resource")
    .Output("address: int64")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);

}  // namespace tensorflow

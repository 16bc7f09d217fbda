// Op registrations of the tables' placement (kernels: table_memory_kernels.cc, CPU only).
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

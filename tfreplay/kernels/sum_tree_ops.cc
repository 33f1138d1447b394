// TF ops over a sum tree held in a float64 resource variable (loops in sum_tree.h):
//
// TfreplaySumTreeDescend(tree, targets) -> (rows, mass): the row whose leaf holds each target mass, and that
//   leaf's value. Reads the variable under its shared lock.
// TfreplaySumTreeSet(tree, rows, values): writes leaves and repairs their ancestors in place, under the
//   variable's exclusive lock. Like TF's scatter ops it first makes the variable copy-on-read, so a tensor a
//   reader still holds is never changed under it.
//
// Callers serialize against other writers with the buffer's own mutex, as for every other update.

#include <cstring>
#include <vector>

#include "sum_tree.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

REGISTER_OP("TfreplaySumTreeDescend")
    .Input("tree: resource")
    .Input("targets: float64")
    .Output("rows: int64")
    .Output("mass: float64")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(1));
      return absl::OkStatus();
    });

REGISTER_OP("TfreplaySumTreeSet")
    .Input("tree: resource")
    .Input("rows: int64")
    .Input("values: float64")
    .SetIsStateful()
    .SetShapeFn(shape_inference::NoOutputs);

// The tree's number of leaves, after checking it is a float64 vector of 2 * (a power of two) entries.
absl::Status Leaves(const Tensor& tree, int64_t* leaves) {
  if (tree.dtype() != DT_DOUBLE || tree.dims() != 1 || tree.dim_size(0) < 2 ||
      (tree.dim_size(0) & (tree.dim_size(0) - 1)) != 0) {
    return errors::InvalidArgument("the sum tree must be a float64 vector of 2 * (a power of two) entries; got ",
                                   DataTypeString(tree.dtype()), " ", tree.shape().DebugString());
  }
  *leaves = tree.dim_size(0) / 2;
  return absl::OkStatus();
}

class DescendOp : public OpKernel {
 public:
  explicit DescendOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* c) override {
    core::RefCountPtr<Var> var;
    OP_REQUIRES_OK(c, LookupResource(c, HandleFromInput(c, 0), &var));
    tf_shared_lock guard(*var->mu());
    const Tensor& tree = *var->tensor();
    int64_t leaves = 0;
    OP_REQUIRES_OK(c, Leaves(tree, &leaves));
    const Tensor& targets = c->input(1);
    const int64_t size = targets.NumElements();
    Tensor* rows = nullptr;
    Tensor* mass = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, targets.shape(), &rows));
    OP_REQUIRES_OK(c, c->allocate_output(1, targets.shape(), &mass));
    std::vector<double> rest(size);
    int64_t* out = rows->flat<int64_t>().data();
    tfreplay::SumTreeDescend(tree.flat<double>().data(), leaves, targets.flat<double>().data(), size, out,
                             rest.data(), out, mass->flat<double>().data());
  }
};

class SetOp : public OpKernel {
 public:
  explicit SetOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* c) override {
    core::RefCountPtr<Var> var;
    OP_REQUIRES_OK(c, LookupResource(c, HandleFromInput(c, 0), &var));
    const Tensor& rows = c->input(1);
    const Tensor& values = c->input(2);
    OP_REQUIRES(c, rows.shape() == values.shape(),
                errors::InvalidArgument("rows ", rows.shape().DebugString(), " and values ",
                                        values.shape().DebugString(), " must have one shape"));
    mutex_lock guard(*var->mu());
    int64_t leaves = 0;
    OP_REQUIRES_OK(c, Leaves(*var->tensor(), &leaves));
    const int64_t size = rows.NumElements();
    const int64_t* row = rows.flat<int64_t>().data();
    for (int64_t i = 0; i < size; ++i) {
      OP_REQUIRES(c, row[i] >= 0 && row[i] < leaves,
                  errors::InvalidArgument("rows[", i, "] = ", row[i], " is not in [0, ", leaves, ")"));
    }
    if (!var->copy_on_read_mode.load() && !var->tensor()->RefCountIsOne()) {  // a reader holds the buffer: copy
      Tensor copy;
      OP_REQUIRES_OK(c, c->allocate_temp(DT_DOUBLE, var->tensor()->shape(), &copy));
      std::memcpy(copy.flat<double>().data(), var->tensor()->flat<double>().data(), 2 * leaves * sizeof(double));
      *var->tensor() = copy;
    }
    var->copy_on_read_mode.store(true);  // later reads copy, so this update never shows in a reader's tensor
    std::vector<int64_t> node(size);
    tfreplay::SumTreeSet(var->tensor()->flat<double>().data(), leaves, row, values.flat<double>().data(), size,
                         node.data());
  }
};

REGISTER_KERNEL_BUILDER(Name("TfreplaySumTreeDescend").Device(DEVICE_CPU), DescendOp);
REGISTER_KERNEL_BUILDER(Name("TfreplaySumTreeSet").Device(DEVICE_CPU), SetOp);

}  // namespace
}  // namespace tensorflow

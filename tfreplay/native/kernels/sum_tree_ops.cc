// TF ops over a sum tree held in a float64 resource variable (loops in sum_tree.h):
//
// TfreplaySumTreeDescend(tree, targets) -> (rows, mass): the row whose leaf holds each target mass, and that
//   leaf's value. Reads the variable under its shared lock.
// TfreplaySumTreeSet(tree, rows, values): writes leaves and repairs their ancestors in place, under the
//   variable's exclusive lock. Like TF's scatter ops it first makes the variable copy-on-read, so a tensor a
//   reader still holds is never changed under it.
//
// TfreplayRingDraw(tree, num_adds, uniform) -> (segment, t, leaf, ok, all_ok) and TfreplayRingUpdate(tree, max_priority,
//   num_adds variable, ids, values, priorities) -> stale: a prioritized draw and update for ring windows in one op each
//   (RingDraw, RingUpdate in sum_tree.h). The update checks the priorities first (a bad one raises
//   InvalidArgument and changes nothing), writes the live ids' leaves and raises the max_priority variable.
// TfreplayRingSample(tree, num_adds, uniform) -> (segment, t, leaf, ok, all_ok, probs, count): single items of
//   ring windows, RingDraw plus each draw's probability and whether anything can be drawn, from one read of the
//   tree (RingSample): a sample that hits needs no other op.
//
// Callers serialize against other writers with the buffer's own mutex, as for every other update, except
// TfreplayRingUpdate.
//
// Without the buffer's lock: TfreplayRingUpdate reads the buffer's num_adds variable (which ids are live) while
// it holds the tree's exclusive lock, and a writer moves num_adds before it sets the new rows' leaves (which
// takes that lock too). An update that saw the old count therefore writes before the new item's leaf is set, and
// that leaf overwrites it; one that saw the new count finds the overwritten item stale. Either way an update
// never lands on an item other than its own. (A clear zeroes num_adds before the tree, the same way.)

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

REGISTER_OP("TfreplayRingDraw")
    .Input("tree: resource")
    .Input("num_adds: int64")
    .Input("uniform: float64")
    .Output("segment: int64")
    .Output("t: int64")
    .Output("leaf: float64")
    .Output("ok: bool")
    .Output("all_ok: bool")
    .Attr("max_length: int >= 1")
    .Attr("num_steps: int >= 1")
    .Attr("stratified: bool")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      for (int i = 0; i < 4; ++i) c->set_output(i, c->input(2));
      c->set_output(4, c->Scalar());
      return absl::OkStatus();
    });

REGISTER_OP("TfreplayRingSample")
    .Input("tree: resource")
    .Input("num_adds: int64")
    .Input("uniform: float64")
    .Output("segment: int64")
    .Output("t: int64")
    .Output("leaf: float64")
    .Output("ok: bool")
    .Output("all_ok: bool")
    .Output("probs: float")
    .Output("count: int64")
    .Attr("max_length: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      for (int i = 0; i < 4; ++i) c->set_output(i, c->input(2));
      c->set_output(4, c->Scalar());
      c->set_output(5, c->input(2));
      c->set_output(6, c->Scalar());
      return absl::OkStatus();
    });

REGISTER_OP("TfreplayRingUpdate")
    .Input("tree: resource")
    .Input("max_priority: resource")
    .Input("num_adds: resource")
    .Input("ids: int64")
    .Input("values: float64")
    .Input("priorities: float64")
    .Output("stale: int64")
    .Attr("max_length: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    });

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

// Makes the variable's buffer safe to change in place (the caller holds its exclusive lock): a buffer a
// reader still holds is copied first, and the variable turns copy-on-read, as TF's own scatter ops do.
absl::Status Writable(OpKernelContext* c, Var* var, int64_t leaves) {
  if (!var->copy_on_read_mode.load() && !var->tensor()->RefCountIsOne()) {
    Tensor copy;
    TF_RETURN_IF_ERROR(c->allocate_temp(DT_DOUBLE, var->tensor()->shape(), &copy));
    std::memcpy(copy.flat<double>().data(), var->tensor()->flat<double>().data(), 2 * leaves * sizeof(double));
    *var->tensor() = copy;
  }
  var->copy_on_read_mode.store(true);
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
    OP_REQUIRES_OK(c, Writable(c, var.get(), leaves));
    std::vector<int64_t> node(size);
    tfreplay::SumTreeSet(var->tensor()->flat<double>().data(), leaves, row, values.flat<double>().data(), size,
                         node.data());
  }
};

// The tree may have more leaves than rows, never fewer.
absl::Status CheckRows(int64_t leaves, const Tensor& num_adds, int64_t max_length) {
  if (num_adds.dims() != 1 || num_adds.NumElements() < 1 || num_adds.NumElements() * max_length > leaves) {
    return errors::InvalidArgument("num_adds ", num_adds.shape().DebugString(), " x max_length ", max_length,
                                   " rows do not fit the sum tree's ", leaves, " leaves");
  }
  return absl::OkStatus();
}

class RingDrawOp : public OpKernel {
 public:
  explicit RingDrawOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("max_length", &max_length_));
    OP_REQUIRES_OK(c, c->GetAttr("num_steps", &num_steps_));
    OP_REQUIRES_OK(c, c->GetAttr("stratified", &stratified_));
  }

  void Compute(OpKernelContext* c) override {
    core::RefCountPtr<Var> var;
    OP_REQUIRES_OK(c, LookupResource(c, HandleFromInput(c, 0), &var));
    tf_shared_lock guard(*var->mu());
    const Tensor& tree = *var->tensor();
    int64_t leaves = 0;
    OP_REQUIRES_OK(c, Leaves(tree, &leaves));
    const Tensor& num_adds = c->input(1);
    OP_REQUIRES_OK(c, CheckRows(leaves, num_adds, max_length_));
    const Tensor& uniform = c->input(2);
    const int64_t size = uniform.NumElements();
    Tensor* out[5];
    for (int i = 0; i < 4; ++i) OP_REQUIRES_OK(c, c->allocate_output(i, uniform.shape(), &out[i]));
    OP_REQUIRES_OK(c, c->allocate_output(4, TensorShape({}), &out[4]));
    std::vector<int64_t> node(size);
    std::vector<double> rest(size);
    out[4]->scalar<bool>()() = tfreplay::RingDraw(tree.flat<double>().data(), leaves, num_adds.flat<int64_t>().data(), num_adds.NumElements(),
                       max_length_, num_steps_, uniform.flat<double>().data(), size, stratified_, node.data(),
                       rest.data(), out[0]->flat<int64_t>().data(), out[1]->flat<int64_t>().data(),
                       out[2]->flat<double>().data(), out[3]->flat<bool>().data());
  }

 private:
  int64_t max_length_, num_steps_;
  bool stratified_;
};

class RingSampleOp : public OpKernel {
 public:
  explicit RingSampleOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("max_length", &max_length_));
  }

  void Compute(OpKernelContext* c) override {
    core::RefCountPtr<Var> var;
    OP_REQUIRES_OK(c, LookupResource(c, HandleFromInput(c, 0), &var));
    tf_shared_lock guard(*var->mu());
    const Tensor& tree = *var->tensor();
    int64_t leaves = 0;
    OP_REQUIRES_OK(c, Leaves(tree, &leaves));
    const Tensor& num_adds = c->input(1);
    OP_REQUIRES_OK(c, CheckRows(leaves, num_adds, max_length_));
    const Tensor& uniform = c->input(2);
    const int64_t size = uniform.NumElements();
    Tensor* out[7];
    for (int i = 0; i < 7; ++i) {
      const bool scalar = i == 4 || i == 6;
      OP_REQUIRES_OK(c, c->allocate_output(i, scalar ? TensorShape({}) : uniform.shape(), &out[i]));
    }
    std::vector<int64_t> node(size);
    std::vector<double> rest(size);
    out[4]->scalar<bool>()() = tfreplay::RingSample(
        tree.flat<double>().data(), leaves, num_adds.flat<int64_t>().data(), num_adds.NumElements(), max_length_,
        uniform.flat<double>().data(), size, node.data(), rest.data(), out[0]->flat<int64_t>().data(),
        out[1]->flat<int64_t>().data(), out[2]->flat<double>().data(), out[3]->flat<bool>().data(),
        out[5]->flat<float>().data(), &out[6]->scalar<int64_t>()());
  }

 private:
  int64_t max_length_;
};

class RingUpdateOp : public OpKernel {
 public:
  explicit RingUpdateOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("max_length", &max_length_));
  }

  void Compute(OpKernelContext* c) override {
    core::RefCountPtr<Var> var, top, adds;
    OP_REQUIRES_OK(c, LookupResource(c, HandleFromInput(c, 0), &var));
    OP_REQUIRES_OK(c, LookupResource(c, HandleFromInput(c, 1), &top));
    OP_REQUIRES_OK(c, LookupResource(c, HandleFromInput(c, 2), &adds));
    const Tensor& ids = c->input(3);
    const Tensor& values = c->input(4);
    const Tensor& priorities = c->input(5);
    OP_REQUIRES(c, ids.shape() == values.shape() && ids.shape() == priorities.shape(),
                errors::InvalidArgument("ids, values and priorities must have one shape"));
    const int64_t size = ids.NumElements();
    mutex_lock guard(*var->mu());
    mutex_lock top_guard(*top->mu());  // always taken after the tree's: no other op holds both
    // num_adds is read here, under the tree's lock: see "Without the buffer's lock" above.
    tf_shared_lock adds_guard(*adds->mu());
    const Tensor& num_adds = *adds->tensor();
    OP_REQUIRES(c, num_adds.dtype() == DT_INT64, errors::InvalidArgument("num_adds must be an int64 vector"));
    int64_t leaves = 0;
    OP_REQUIRES_OK(c, Leaves(*var->tensor(), &leaves));
    // The words of PRIORITIES_RULE (tfreplay/_src/write.py), which the eager path raises as a ValueError.
    OP_REQUIRES(c,
                tfreplay::PrioritiesOk(priorities.flat<double>().data(), values.flat<double>().data(), size, leaves),
                errors::InvalidArgument("update_priorities: every priority must be finite and non-negative, and "
                                        "small enough that priority ** alpha summed over every row stays finite; "
                                        "nothing was updated."));
    OP_REQUIRES_OK(c, CheckRows(leaves, num_adds, max_length_));
    OP_REQUIRES(c, top->tensor()->dtype() == DT_DOUBLE && top->tensor()->NumElements() == 1,
                errors::InvalidArgument("max_priority must be a float64 scalar"));
    OP_REQUIRES_OK(c, Writable(c, var.get(), leaves));
    Tensor* stale = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({}), &stale));
    Tensor raised;  // a new tensor, as AssignVariableOp does: a reader may still hold the old one
    OP_REQUIRES_OK(c, c->allocate_temp(DT_DOUBLE, top->tensor()->shape(), &raised));
    double* most = raised.flat<double>().data();
    *most = top->tensor()->flat<double>()(0);
    std::vector<int64_t> rows(size), node(size);
    std::vector<double> kept(size);
    stale->scalar<int64_t>()() = tfreplay::RingUpdate(
        var->tensor()->flat<double>().data(), leaves, num_adds.flat<int64_t>().data(), num_adds.NumElements(),
        max_length_, ids.flat<int64_t>().data(), values.flat<double>().data(), priorities.flat<double>().data(), size,
        rows.data(), kept.data(), node.data(), most);
    *top->tensor() = raised;
  }

 private:
  int64_t max_length_;
};

REGISTER_KERNEL_BUILDER(Name("TfreplayRingDraw").Device(DEVICE_CPU), RingDrawOp);
REGISTER_KERNEL_BUILDER(Name("TfreplayRingSample").Device(DEVICE_CPU), RingSampleOp);
REGISTER_KERNEL_BUILDER(Name("TfreplayRingUpdate").Device(DEVICE_CPU), RingUpdateOp);
REGISTER_KERNEL_BUILDER(Name("TfreplaySumTreeDescend").Device(DEVICE_CPU), DescendOp);
REGISTER_KERNEL_BUILDER(Name("TfreplaySumTreeSet").Device(DEVICE_CPU), SetOp);

}  // namespace
}  // namespace tensorflow

// The TF twin's plan of padded windows (n-step returns, padded sequences) over rows storage: the functions of
// windows.cc (the NumPy twin's, through ctypes) as two TF ops, so a graph plans such a sample in two op calls
// instead of an XLA-compiled function of some hundred ops.
//
// TfreplayPaddedCounts(num_adds, newest) -> (start, counts, total): per segment the first start and how many
//   starts follow (its live items less `episodes.young_starts`), and their sum (tfreplay_padded_counts).
// TfreplayWindowPlan(draws, counts, start, num_adds, pos) -> (segment, t, rows, ids, mask, last, last_rows):
//   each draw located among the segments, and its window's rows and mask (`[num_steps, size]`, time-major as
//   the array-op path lays them out), first item's id, last real step and that step's row
//   (tfreplay_window_plan). `pos` is the index's int32 variable, read under its shared lock without a copy.
//
// Both are pure functions of their inputs and of `pos`: the caller orders them like any other read of the
// index (the buffer's versioned read, or its lock).

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "windows.cc"

namespace tensorflow {
namespace {

REGISTER_OP("TfreplayPaddedCounts")
    .Input("num_adds: int64")
    .Input("newest: int32")
    .Output("start: int64")
    .Output("counts: int64")
    .Output("total: int64")
    .Attr("max_length: int >= 1")
    .Attr("num_steps: int >= 1")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(0));
      c->set_output(2, c->Scalar());
      return absl::OkStatus();
    });

REGISTER_OP("TfreplayWindowPlan")
    .Input("draws: int64")
    .Input("counts: int64")
    .Input("start: int64")
    .Input("num_adds: int64")
    .Input("pos: resource")
    .Output("segment: int64")
    .Output("t: int64")
    .Output("rows: int64")
    .Output("ids: int64")
    .Output("mask: bool")
    .Output("last: int64")
    .Output("last_rows: int64")
    .Attr("num_steps: int >= 1")
    .Attr("max_length: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      int64_t n = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_steps", &n));
      shape_inference::ShapeHandle window;
      TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(n), c->input(0), &window));
      for (int i : {0, 1, 3, 5, 6}) c->set_output(i, c->input(0));
      c->set_output(2, window);
      c->set_output(4, window);
      return absl::OkStatus();
    });

absl::Status SegmentVector(const Tensor& t, const char* name, int64_t segments) {
  if (t.dims() != 1 || t.dim_size(0) != segments) {
    return errors::InvalidArgument(name, " must be a vector of ", segments, " entries; got ", t.shape().DebugString());
  }
  return absl::OkStatus();
}

class PaddedCountsOp : public OpKernel {
 public:
  explicit PaddedCountsOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("max_length", &max_length_));
    OP_REQUIRES_OK(c, c->GetAttr("num_steps", &num_steps_));
  }

  void Compute(OpKernelContext* c) override {
    const Tensor& num_adds = c->input(0);
    const Tensor& newest = c->input(1);
    OP_REQUIRES(c, num_adds.dims() == 1, errors::InvalidArgument("num_adds must be a vector"));
    const int64_t segments = num_adds.dim_size(0);
    OP_REQUIRES(c, newest.dims() == 2 && newest.dim_size(0) == segments && newest.dim_size(1) == 2,
                errors::InvalidArgument("newest must be [", segments, ", 2]; got ", newest.shape().DebugString()));
    Tensor *start, *counts, *total;
    OP_REQUIRES_OK(c, c->allocate_output(0, num_adds.shape(), &start));
    OP_REQUIRES_OK(c, c->allocate_output(1, num_adds.shape(), &counts));
    OP_REQUIRES_OK(c, c->allocate_output(2, TensorShape({}), &total));
    total->scalar<int64_t>()() = tfreplay_padded_counts(
        num_adds.flat<int64_t>().data(), segments, max_length_, num_steps_, newest.flat<int32_t>().data(),
        start->flat<int64_t>().data(), counts->flat<int64_t>().data());
  }

 private:
  int64_t max_length_, num_steps_;
};

class WindowPlanOp : public OpKernel {
 public:
  explicit WindowPlanOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("num_steps", &num_steps_));
    OP_REQUIRES_OK(c, c->GetAttr("max_length", &max_length_));
  }

  void Compute(OpKernelContext* c) override {
    const Tensor& draws = c->input(0);
    const Tensor& num_adds = c->input(3);
    OP_REQUIRES(c, draws.dims() == 1, errors::InvalidArgument("draws must be a vector"));
    OP_REQUIRES(c, num_adds.dims() == 1, errors::InvalidArgument("num_adds must be a vector"));
    const int64_t segments = num_adds.dim_size(0), size = draws.dim_size(0);
    OP_REQUIRES_OK(c, SegmentVector(c->input(1), "counts", segments));
    OP_REQUIRES_OK(c, SegmentVector(c->input(2), "start", segments));
    OP_REQUIRES(c, num_steps_ <= max_length_, errors::InvalidArgument("num_steps must be at most max_length"));
    core::RefCountPtr<Var> var;
    OP_REQUIRES_OK(c, LookupResource(c, HandleFromInput(c, 4), &var));
    tf_shared_lock guard(*var->mu());
    const Tensor& pos = *var->tensor();
    OP_REQUIRES(c, pos.dtype() == DT_INT32 && pos.dims() == 1 && pos.dim_size(0) == segments * max_length_,
                errors::InvalidArgument("pos must be an int32 vector of ", segments * max_length_, " entries; got ",
                                        DataTypeString(pos.dtype()), " ", pos.shape().DebugString()));
    Tensor* out[7];
    const TensorShape window({num_steps_, size});
    for (int i = 0; i < 7; ++i) {
      OP_REQUIRES_OK(c, c->allocate_output(i, i == 2 || i == 4 ? window : draws.shape(), &out[i]));
    }
    tfreplay_window_plan(draws.flat<int64_t>().data(), c->input(1).flat<int64_t>().data(),
                         c->input(2).flat<int64_t>().data(), out[0]->flat<int64_t>().data(),
                         out[1]->flat<int64_t>().data(), size, num_steps_, max_length_, segments,
                         num_adds.flat<int64_t>().data(), pos.flat<int32_t>().data(), out[2]->flat<int64_t>().data(),
                         out[3]->flat<int64_t>().data(), out[4]->flat<bool>().data(), out[5]->flat<int64_t>().data(),
                         out[6]->flat<int64_t>().data());
  }

 private:
  int64_t num_steps_, max_length_;
};

REGISTER_KERNEL_BUILDER(Name("TfreplayPaddedCounts").Device(DEVICE_CPU), PaddedCountsOp);
REGISTER_KERNEL_BUILDER(Name("TfreplayWindowPlan").Device(DEVICE_CPU), WindowPlanOp);

}  // namespace
}  // namespace tensorflow

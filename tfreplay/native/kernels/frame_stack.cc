// TfreplayFrameStack: gathers history frames from a frame variable and stacks
// them on a new last axis, in one pass.
//
// XLA and TF's own kernels gather the 160 frames of a 32-transition batch at
// about half NumPy's speed (a loop per element) and then need a second pass to
// move the frames to the last axis. This kernel reads each frame row once and
// writes the stacks directly: when one pixel's stack fills a 2-, 4- or 8-byte
// word (4 uint8 frames do), as that word, built with shifts and ors.
//
// Inputs: `frames`, a resource variable [num_rows, *frame_shape] of dtype T;
// `rows`, int64 [batch, history_len + num_steps], as `FrameStorage.plan` (tfreplay/_src/storage.py)
// returns. Outputs: observation and next observation, each
// [batch, (num_steps,) *frame_shape, history_len]; without `time_axis`,
// num_steps must be 1 and has no axis. The variable is read under its shared
// lock; callers serialize against writers with the buffer's own mutex.

#include <cstdint>
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

REGISTER_OP("TfreplayFrameStack")
    .Input("frames: resource")
    .Input("rows: int64")
    .Output("observation: T")
    .Output("next_observation: T")
    .Attr("T: type")
    .Attr("history_len: int >= 1")
    .Attr("time_axis: bool")
    .SetIsStateful()
    .SetShapeFn(shape_inference::UnknownShape);

constexpr bool kLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

// Stacks `H` frames of one-byte pixels: pixel p's stack is one little-endian word.
template <typename Word, int H>
void PackBytes(const uint8_t* const* frames, int64_t pixels, Word* out) {
  const uint8_t* src[H];
  for (int k = 0; k < H; ++k) src[k] = frames[k];
  for (int64_t p = 0; p < pixels; ++p) {
    Word word = 0;
    for (int k = 0; k < H; ++k) word |= static_cast<Word>(src[k][p]) << (8 * k);
    out[p] = word;
  }
}

// Any dtype and history length: element by element.
void CopyElements(const uint8_t* const* frames, int h, int64_t pixels, int64_t size, uint8_t* out) {
  for (int64_t p = 0; p < pixels; ++p) {
    for (int k = 0; k < h; ++k) std::memcpy(out + (p * h + k) * size, frames[k] + p * size, size);
  }
}

class FrameStackOp : public OpKernel {
 public:
  explicit FrameStackOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("history_len", &history_len_));
    OP_REQUIRES_OK(c, c->GetAttr("time_axis", &time_axis_));
    OP_REQUIRES_OK(c, c->GetAttr("T", &dtype_));
  }

  void Compute(OpKernelContext* c) override {
    core::RefCountPtr<Var> var;
    OP_REQUIRES_OK(c, LookupResource(c, HandleFromInput(c, 0), &var));
    tf_shared_lock guard(*var->mu());
    const Tensor& frames = *var->tensor();
    const Tensor& rows = c->input(1);
    const int h = history_len_;
    OP_REQUIRES(c, frames.dtype() == dtype_,
                errors::InvalidArgument("frames dtype ", DataTypeString(frames.dtype()), " is not T ",
                                        DataTypeString(dtype_)));
    OP_REQUIRES(c, frames.dims() >= 1 && rows.dims() == 2,
                errors::InvalidArgument("frames must have rank >= 1 and rows rank 2; got ", frames.dims(), " and ",
                                        rows.dims()));
    const int64_t batch = rows.dim_size(0), span = rows.dim_size(1), steps = span - h;
    OP_REQUIRES(c, steps >= 1 && (time_axis_ || steps == 1),
                errors::InvalidArgument("rows has ", span, " columns; it needs history_len + num_steps (",
                                        h, " + ", time_axis_ ? ">= 1" : "1", ")"));
    TensorShape shape({batch});
    if (time_axis_) shape.AddDim(steps);
    int64_t pixels = 1;
    for (int d = 1; d < frames.dims(); ++d) {
      shape.AddDim(frames.dim_size(d));
      pixels *= frames.dim_size(d);
    }
    shape.AddDim(h);
    const auto index = rows.matrix<int64_t>();
    const int64_t num_rows = frames.dim_size(0);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t k = 0; k < span; ++k) {
        OP_REQUIRES(c, index(b, k) >= 0 && index(b, k) < num_rows,
                    errors::InvalidArgument("rows[", b, ", ", k, "] = ", index(b, k), " is not in [0, ", num_rows,
                                            ")"));
      }
    }
    Tensor* obs = nullptr;
    Tensor* next = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, shape, &obs));
    OP_REQUIRES_OK(c, c->allocate_output(1, shape, &next));
    if (shape.num_elements() == 0) return;

    const int64_t size = DataTypeSize(dtype_);
    const int64_t frame_bytes = pixels * size, stack_bytes = frame_bytes * h;
    const uint8_t* base = reinterpret_cast<const uint8_t*>(frames.tensor_data().data());
    uint8_t* outs[2] = {reinterpret_cast<uint8_t*>(const_cast<char*>(obs->tensor_data().data())),
                        reinterpret_cast<uint8_t*>(const_cast<char*>(next->tensor_data().data()))};
    std::vector<const uint8_t*> window(span);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t k = 0; k < span; ++k) window[k] = base + index(b, k) * frame_bytes;
      for (int64_t j = 0; j < steps; ++j) {
        for (int which = 0; which < 2; ++which) {  // observation: frames j..j+h-1; next: one later
          const uint8_t* const* src = window.data() + j + which;
          uint8_t* out = outs[which] + (b * steps + j) * stack_bytes;
          if (kLittleEndian && size == 1 && h == 4) {
            PackBytes<uint32_t, 4>(src, pixels, reinterpret_cast<uint32_t*>(out));
          } else if (kLittleEndian && size == 1 && h == 2) {
            PackBytes<uint16_t, 2>(src, pixels, reinterpret_cast<uint16_t*>(out));
          } else if (kLittleEndian && size == 1 && h == 8) {
            PackBytes<uint64_t, 8>(src, pixels, reinterpret_cast<uint64_t*>(out));
          } else {
            CopyElements(src, h, pixels, size, out);
          }
        }
      }
    }
  }

 private:
  int history_len_;
  bool time_axis_;
  DataType dtype_;
};

REGISTER_KERNEL_BUILDER(Name("TfreplayFrameStack").Device(DEVICE_CPU), FrameStackOp);

}  // namespace
}  // namespace tensorflow

// Pooling: max (with the same backend's indices into its backward), average (padding, ceil_mode,
// count_include_pad) and global average, each with its backward.
#include "op_case.h"

namespace trainer::op_cases {
namespace {

std::string pool_text(const Pool2dParams& p) {
  return std::to_string(p.kernel_h) + "x" + std::to_string(p.kernel_w) + " stride " +
         std::to_string(p.stride_h) + " pad " + std::to_string(p.pad_h) + (p.ceil_mode ? " ceil" : "") +
         (p.count_include_pad ? "" : " exclude pad");
}

Shape pooled(const Shape& x, const Pool2dParams& p) {
  return {x[0], x[1], pool_output_size(x[2], p.kernel_h, p.stride_h, p.pad_h, p.ceil_mode),
          pool_output_size(x[3], p.kernel_w, p.stride_w, p.pad_w, p.ceil_mode)};
}

// Inputs x and dy; the run returns y and the backward of dy (max pool: through this backend's own
// indices, whose encoding is the backend's choice, so they are not compared themselves).
OpCase max_pool_case(const Shape& x, const Pool2dParams& p) {
  OpCase c;
  c.name = "max_pool2d " + pool_text(p) + " " + shape_str(x);
  c.inputs = {image(x, InputSpec::Values::distinct), image(pooled(x, p))};
  c.run = [p](Backend& b, Tensors& in) {
    const auto [y, indices] = b.max_pool2d(in[0], p);
    return Tensors{y, b.max_pool2d_backward(in[1], indices, in[0].shape(), p)};
  };
  c.gradient = [p](Backend& b, Tensors& in, const Tensor& g) {
    const auto [y, indices] = b.max_pool2d(in[0], p);
    return Tensors{b.max_pool2d_backward(g, indices, in[0].shape(), p)};
  };
  c.differentiable = {0};
  c.device_dtypes = {DType::f32, DType::bf16};
  c.channels_last = true;
  return c;
}

OpCase avg_pool_case(const Shape& x, const Pool2dParams& p) {
  OpCase c;
  c.name = "avg_pool2d " + pool_text(p) + " " + shape_str(x);
  c.inputs = {image(x), image(pooled(x, p))};
  c.run = [p](Backend& b, Tensors& in) {
    return Tensors{b.avg_pool2d(in[0], p), b.avg_pool2d_backward(in[1], in[0].shape(), p)};
  };
  c.gradient = [p](Backend& b, Tensors& in, const Tensor& g) {
    return Tensors{b.avg_pool2d_backward(g, in[0].shape(), p)};
  };
  c.differentiable = {0};
  c.device_dtypes = {DType::f32, DType::bf16};
  c.channels_last = true;
  return c;
}

}  // namespace

std::vector<OpCase> pool_cases() {
  std::vector<OpCase> cases;
  for (const Pool2dParams& p :
       {pool_params(2, 2), pool_params(3, 2, 1), pool_params(3, 2, 0, true), pool_params(2, 1)})
    cases.push_back(max_pool_case({2, 8, 7, 6}, p));
  for (const Pool2dParams& p : {pool_params(2, 2), pool_params(3, 2, 1), pool_params(3, 2, 1, true, false),
                                pool_params(3, 1, 1, false, false)})
    cases.push_back(avg_pool_case({2, 8, 7, 6}, p));
  {
    OpCase c;
    c.name = "global_avg_pool and its backward";
    c.inputs = {image({3, 8, 5, 4}), uniform({3, 8})};
    c.run = [](Backend& b, Tensors& in) {
      const MemoryFormat format =
          in[0].is_contiguous() ? MemoryFormat::contiguous : MemoryFormat::channels_last;
      return Tensors{b.global_avg_pool(in[0]), b.global_avg_pool_backward(in[1], in[0].shape(), format)};
    };
    c.gradient = [](Backend& b, Tensors& in, const Tensor& g) {
      return Tensors{b.global_avg_pool_backward(g, in[0].shape(), MemoryFormat::contiguous)};
    };
    c.differentiable = {0};
    c.device_dtypes = {DType::f32, DType::bf16};
    c.channels_last = true;
    cases.push_back(c);
  }
  return cases;
}

}  // namespace trainer::op_cases

// Elementwise and memory kernels: copy, fill, binary (broadcasting), binary_scalar, unary and its
// backward, axpy, scale, relu_backward_of_sum, add_to_counter.
#include "op_case.h"

namespace trainer::op_cases {
namespace {

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add:
      return "add";
    case BinaryOp::sub:
      return "sub";
    case BinaryOp::mul:
      return "mul";
    default:
      return "div";
  }
}

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg:
      return "neg";
    case UnaryOp::relu:
      return "relu";
    case UnaryOp::sigmoid:
      return "sigmoid";
    case UnaryOp::exp:
      return "exp";
    case UnaryOp::log:
      return "log";
    case UnaryOp::sqrt:
      return "sqrt";
    case UnaryOp::square:
      return "square";
    case UnaryOp::gelu_erf:
      return "gelu_erf";
    case UnaryOp::gelu_tanh:
      return "gelu_tanh";
    default:
      return "abs";
  }
}

// The gradient of binary(op, a, b) for seed g, summed back over broadcast dimensions, with the
// backend's own kernels (as nn/functional does).
Tensor reduce_to(Backend& b, const Tensor& g, const Shape& shape) {
  std::vector<int> dims;
  const int lead = g.dim() - static_cast<int>(shape.size());
  for (int d = 0; d < g.dim(); ++d)
    if (d < lead || shape[static_cast<size_t>(d - lead)] == 1) dims.push_back(d);
  if (dims.empty()) return g;
  return b.sum(g, dims, true).reshape(shape);
}

OpCase binary_case(BinaryOp op, Shape a, Shape bshape) {
  OpCase c;
  c.name = std::string("binary ") + binary_name(op) + " " + shape_str(a) + " with " + shape_str(bshape);
  // Division: denominators kept away from 0.
  c.inputs = {uniform(a),
              op == BinaryOp::div ? InputSpec{bshape, InputSpec::Values::away_from_zero} : uniform(bshape)};
  c.run = [op](Backend& b, Tensors& in) { return Tensors{b.binary(op, in[0], in[1])}; };
  c.gradient = [op](Backend& b, Tensors& in, const Tensor& g) {
    const Tensor& x = in[0];
    const Tensor& y = in[1];
    Tensor gx = g, gy = g;
    if (op == BinaryOp::sub) gy = b.unary(UnaryOp::neg, g);
    if (op == BinaryOp::mul) gx = b.binary(BinaryOp::mul, g, y), gy = b.binary(BinaryOp::mul, g, x);
    if (op == BinaryOp::div) {
      gx = b.binary(BinaryOp::div, g, y);
      // -g * x / y^2
      gy = b.unary(UnaryOp::neg,
                   b.binary(BinaryOp::div, b.binary(BinaryOp::mul, g, x), b.unary(UnaryOp::square, y)));
    }
    return Tensors{reduce_to(b, gx, x.shape()), reduce_to(b, gy, y.shape())};
  };
  c.differentiable = {0, 1};
  c.device_dtypes = {DType::f32, DType::bf16};
  return c;
}

OpCase binary_scalar_case(BinaryOp op, bool scalar_first) {
  OpCase c;
  c.name = std::string("binary_scalar ") + binary_name(op) + (scalar_first ? " (scalar first)" : "");
  const bool divides_by_input = op == BinaryOp::div && scalar_first;
  c.inputs = {divides_by_input ? InputSpec{{3, 17}, InputSpec::Values::away_from_zero} : uniform({3, 17})};
  c.run = [op, scalar_first](Backend& b, Tensors& in) {
    return Tensors{b.binary_scalar(op, in[0], 1.75, scalar_first)};
  };
  c.gradient = [op, scalar_first](Backend& b, Tensors& in, const Tensor& g) {
    if (op == BinaryOp::add) return Tensors{g};
    if (op == BinaryOp::sub) return Tensors{scalar_first ? b.unary(UnaryOp::neg, g) : g};
    if (op == BinaryOp::mul) return Tensors{b.binary_scalar(BinaryOp::mul, g, 1.75, false)};
    if (!scalar_first) return Tensors{b.binary_scalar(BinaryOp::div, g, 1.75, false)};
    // d(s / x) = -s / x^2
    const Tensor x2 = b.unary(UnaryOp::square, in[0]);
    return Tensors{b.binary_scalar(BinaryOp::mul, b.binary(BinaryOp::div, g, x2), -1.75, false)};
  };
  c.differentiable = {0};
  c.device_dtypes = {DType::f32, DType::bf16};
  return c;
}

OpCase unary_case(UnaryOp op) {
  OpCase c;
  c.name = std::string("unary ") + unary_name(op) + " and unary_backward";
  const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt;
  const bool kink = op == UnaryOp::relu || op == UnaryOp::abs;
  c.inputs = {positive ? uniform({4, 3, 5, 6}, 0.2, 2.0)
              : kink   ? image({4, 3, 5, 6}, InputSpec::Values::away_from_zero)
                       : image({4, 3, 5, 6})};
  c.inputs[0].image = true;
  c.run = [op](Backend& b, Tensors& in) { return Tensors{b.unary(op, in[0])}; };
  c.gradient = [op](Backend& b, Tensors& in, const Tensor& g) {
    const Tensor y = b.unary(op, in[0]);
    return Tensors{b.unary_backward(op, g, in[0], y)};
  };
  c.differentiable = {0};
  c.device_dtypes = {DType::f32, DType::bf16};
  c.channels_last = true;
  return c;
}

// unary_backward alone on the device (the unary case compares only the forward across backends).
OpCase unary_backward_case(UnaryOp op) {
  OpCase c;
  c.name = std::string("unary_backward ") + unary_name(op);
  const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt;
  c.inputs = {uniform({5, 7}),
              positive ? uniform({5, 7}, 0.2, 2.0) : InputSpec{{5, 7}, InputSpec::Values::away_from_zero}};
  c.run = [op](Backend& b, Tensors& in) {
    return Tensors{b.unary_backward(op, in[0], in[1], b.unary(op, in[1]))};
  };
  c.device_dtypes = {DType::f32, DType::bf16};
  return c;
}

}  // namespace

std::vector<OpCase> elementwise_cases() {
  std::vector<OpCase> cases;
  {
    OpCase c;
    c.name = "copy between layouts and dtypes";
    c.inputs = {image({2, 3, 4, 5})};
    c.run = [](Backend& b, Tensors& in) {
      // A channels-last copy of the input (any layout to any layout), then a f32 copy of that.
      Tensor cl = Tensor::empty(in[0].shape(), in[0].dtype(), in[0].device(), MemoryFormat::channels_last);
      b.copy(cl, in[0]);
      Tensor f = Tensor::empty(in[0].shape(), DType::f32, in[0].device());
      b.copy(f, cl);
      return Tensors{cl, f};
    };
    c.device_dtypes = {DType::f32, DType::bf16};
    c.channels_last = true;
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "fill";
    c.inputs = {uniform({7, 9})};
    c.run = [](Backend& b, Tensors& in) {
      Tensor view = in[0].slice(1, 2, 7);  // a strided part
      b.fill(view, -0.375);
      return Tensors{in[0]};
    };
    c.device_dtypes = {DType::f32, DType::bf16};
    cases.push_back(c);
  }
  for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div}) {
    cases.push_back(binary_case(op, {3, 4, 5}, {3, 4, 5}));
    cases.push_back(binary_case(op, {2, 3, 4, 5}, {1, 3, 1, 1}));  // a per-channel operand
    cases.push_back(binary_case(op, {4, 1}, {5}));                 // both sides broadcast
  }
  // A transformer's residual add under autocast: an f32 stream plus a bf16 branch, widened as it is
  // read. b holds bf16 values on both sides (the f64 reference adds the same values in f64). 5x13: the
  // GPU's four-at-a-time path and a one-element tail.
  for (const Shape& shape : {Shape{3, 4, 5}, Shape{5, 13}}) {
    OpCase c;
    c.name = "binary add of an f32 " + shape_str(shape) + " and a bf16 one";
    c.inputs = {uniform(shape), uniform(shape)};
    c.run = [](Backend& b, Tensors& in) {
      const Tensor half = in[1].to(DType::bf16);
      return Tensors{
          b.binary(BinaryOp::add, in[0], in[0].dtype() == DType::f32 ? half : half.to(in[0].dtype()))};
    };
    cases.push_back(c);
  }
  for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div})
    for (bool first : {false, true}) cases.push_back(binary_scalar_case(op, first));
  for (UnaryOp op : {UnaryOp::neg, UnaryOp::relu, UnaryOp::sigmoid, UnaryOp::exp, UnaryOp::log, UnaryOp::sqrt,
                     UnaryOp::square, UnaryOp::abs, UnaryOp::gelu_erf, UnaryOp::gelu_tanh}) {
    cases.push_back(unary_case(op));
    cases.push_back(unary_backward_case(op));
  }
  {
    OpCase c;
    c.name = "axpy";
    c.inputs = {uniform({6, 11}), uniform({6, 11})};
    c.run = [](Backend& b, Tensors& in) {
      b.axpy(in[0], in[1], -0.5);
      return Tensors{in[0]};
    };
    c.gradient = [](Backend& b, Tensors&, const Tensor& g) {
      return Tensors{g, b.binary_scalar(BinaryOp::mul, g, -0.5, false)};
    };
    c.differentiable = {0, 1};
    c.device_dtypes = {DType::f32, DType::bf16};
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "scale";
    c.inputs = {uniform({6, 11})};
    c.run = [](Backend& b, Tensors& in) {
      b.scale(in[0], 3.25);
      return Tensors{in[0]};
    };
    c.gradient = [](Backend& b, Tensors&, const Tensor& g) {
      return Tensors{b.binary_scalar(BinaryOp::mul, g, 3.25, false)};
    };
    c.differentiable = {0};
    c.device_dtypes = {DType::f32, DType::bf16};
    cases.push_back(c);
  }
  {
    // The gradient of relu(a + b) for a seed: relu_out > 0 passes the sum of the two gradients.
    OpCase c;
    c.name = "relu_backward_of_sum";
    c.inputs = {image({2, 8, 5, 4}), image({2, 8, 5, 4}), image({2, 8, 5, 4})};
    c.run = [](Backend& b, Tensors& in) {
      const Tensor relu_out = b.unary(UnaryOp::relu, in[2]);
      return Tensors{b.relu_backward_of_sum(in[0], in[1], relu_out)};
    };
    c.device_dtypes = {DType::f32, DType::bf16};
    c.channels_last = true;
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "add_to_counter";
    c.inputs = {fixed({}, DType::i64)};
    c.run = [](Backend& b, Tensors& in) {
      b.add_to_counter(in[0], 3);
      b.add_to_counter(in[0], 4);
      return Tensors{in[0]};
    };
    cases.push_back(c);
  }
  return cases;
}

}  // namespace trainer::op_cases

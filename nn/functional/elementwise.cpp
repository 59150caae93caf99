#include "nn/functional.h"

namespace trainer::F {
namespace {

Backend& be(const Variable& v) { return backend_for(v.data()); }

Variable binary_op(const char* name, BinaryOp op, const Variable& a, const Variable& b) {
  // add of a half and an f32 tensor of one shape (a residual stream under autocast): the f32 operand
  // first, as Backend::binary takes them; the half one's gradient is rounded to its dtype.
  if (op == BinaryOp::add && is_half(a.dtype()) && b.dtype() == DType::f32) return binary_op(name, op, b, a);
  Tensor y = be(a).binary(op, a.data(), b.data());
  const DType b_dtype = b.dtype();
  // add and sub need only the shapes: keeping their inputs would hold a residual block's batch-norm
  // output alive until backward (one activation per block; 240 MiB for resnet18-cifar at batch 512).
  const bool needs_values = op == BinaryOp::mul || op == BinaryOp::div;
  const Tensor ta = needs_values ? a.data() : Tensor(), tb = needs_values ? b.data() : Tensor();
  const Shape a_shape = a.shape(), b_shape = b.shape();
  return record_op(
      name, y, {a, b}, [op, ta, tb, a_shape, b_shape, b_dtype](const Tensor& g) -> std::vector<Tensor> {
        Backend& k = backend_for(g);
        Tensor ga, gb;
        switch (op) {
          case BinaryOp::add:
            ga = g;
            gb = g.to(b_dtype);
            break;
          case BinaryOp::sub:
            ga = g;
            gb = k.unary(UnaryOp::neg, g);
            break;
          case BinaryOp::mul:
            ga = k.binary(BinaryOp::mul, g, tb);
            gb = k.binary(BinaryOp::mul, g, ta);
            break;
          case BinaryOp::div: {
            ga = k.binary(BinaryOp::div, g, tb);  // d(a/b)/db = -a/b^2 = -(g/b) * (a/b)
            gb = k.unary(UnaryOp::neg, k.binary(BinaryOp::mul, ga, k.binary(BinaryOp::div, ta, tb)));
            break;
          }
        }
        return {sum_to_shape(ga, a_shape), sum_to_shape(gb, b_shape)};
      });
}

Variable scalar_op(const char* name, BinaryOp op, const Variable& a, double s, bool scalar_first) {
  Tensor y = be(a).binary_scalar(op, a.data(), s, scalar_first);
  const bool reciprocal = op == BinaryOp::div && scalar_first;  // only s / a needs values in backward
  const Tensor ta = reciprocal ? a.data() : Tensor(), saved_y = reciprocal ? y : Tensor();
  return record_op(
      name, y, {a}, [op, s, scalar_first, ta, y = saved_y](const Tensor& g) -> std::vector<Tensor> {
        Backend& k = backend_for(g);
        switch (op) {
          case BinaryOp::add:
            return {g};
          case BinaryOp::sub:
            return {scalar_first ? k.unary(UnaryOp::neg, g) : g};
          case BinaryOp::mul:
            return {k.binary_scalar(BinaryOp::mul, g, s, false)};
          case BinaryOp::div:
            if (!scalar_first) return {k.binary_scalar(BinaryOp::div, g, s, false)};
            // d(s/a)/da = -s/a^2 = -y/a
            return {k.unary(UnaryOp::neg, k.binary(BinaryOp::mul, g, k.binary(BinaryOp::div, y, ta)))};
        }
        return {Tensor()};
      });
}

Variable unary_op(const char* name, UnaryOp op, const Variable& a) {
  Tensor y = be(a).unary(op, a.data());
  // Each backward keeps only what its formula reads (elementwise_math.h): relu's needs y alone, and
  // keeping x too would hold an extra activation alive until backward.
  const bool needs_x = op == UnaryOp::log || op == UnaryOp::square || op == UnaryOp::abs ||
                       op == UnaryOp::gelu_erf || op == UnaryOp::gelu_tanh;
  const bool needs_y =
      op == UnaryOp::relu || op == UnaryOp::sigmoid || op == UnaryOp::exp || op == UnaryOp::sqrt;
  Tensor saved_x = needs_x ? a.data() : Tensor(), saved_y = needs_y ? y : Tensor();
  return record_op(name, y, {a}, [op, saved_x, saved_y](const Tensor& g) -> std::vector<Tensor> {
    return {backend_for(g).unary_backward(op, g, saved_x, saved_y)};
  });
}

}  // namespace

Variable add(const Variable& a, const Variable& b) { return binary_op("add", BinaryOp::add, a, b); }
Variable sub(const Variable& a, const Variable& b) { return binary_op("sub", BinaryOp::sub, a, b); }
Variable mul(const Variable& a, const Variable& b) { return binary_op("mul", BinaryOp::mul, a, b); }
Variable div(const Variable& a, const Variable& b) { return binary_op("div", BinaryOp::div, a, b); }
Variable add(const Variable& a, double s) { return scalar_op("add_scalar", BinaryOp::add, a, s, false); }
Variable sub(const Variable& a, double s) { return scalar_op("sub_scalar", BinaryOp::sub, a, s, false); }
Variable rsub(double s, const Variable& a) { return scalar_op("rsub_scalar", BinaryOp::sub, a, s, true); }
Variable mul(const Variable& a, double s) { return scalar_op("mul_scalar", BinaryOp::mul, a, s, false); }
Variable div(const Variable& a, double s) { return scalar_op("div_scalar", BinaryOp::div, a, s, false); }
Variable rdiv(double s, const Variable& a) { return scalar_op("rdiv_scalar", BinaryOp::div, a, s, true); }
Variable neg(const Variable& a) { return unary_op("neg", UnaryOp::neg, a); }
Variable relu(const Variable& a) { return unary_op("relu", UnaryOp::relu, a); }
Variable sigmoid(const Variable& a) { return unary_op("sigmoid", UnaryOp::sigmoid, a); }
Variable exp(const Variable& a) { return unary_op("exp", UnaryOp::exp, a); }
Variable log(const Variable& a) { return unary_op("log", UnaryOp::log, a); }
Variable sqrt(const Variable& a) { return unary_op("sqrt", UnaryOp::sqrt, a); }
Variable square(const Variable& a) { return unary_op("square", UnaryOp::square, a); }
Variable gelu(const Variable& a, GeluApproximation approximate) {
  return approximate == GeluApproximation::tanh ? unary_op("gelu_tanh", UnaryOp::gelu_tanh, a)
                                                : unary_op("gelu", UnaryOp::gelu_erf, a);
}

}  // namespace trainer::F

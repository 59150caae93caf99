// Elementwise kernels: numpy-style broadcasting binary ops, scalar forms, unary ops and their
// gradients, axpy and scale.
#include <cmath>

#include "nn/amp/loss_scale_rule.h"
#include "nn/cpu/cpu_backend.h"
#include "nn/cpu/parallel.h"
#include "nn/cpu/relu_mask.h"
#include "nn/cpu/strided.h"
#include "nn/elementwise_math.h"
#include "nn/kernel_checks.h"

namespace trainer {
namespace {

// Strides that read `t` as if broadcast to `shape` (0 along broadcast dims).
Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  const size_t n = shape.size(), k = t.shape().size();
  Shape strides(n, 0);
  for (size_t i = 0; i < k; ++i) {
    const size_t o = n - k + i;
    strides[o] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  }
  return strides;
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  if (a.dtype() != b.dtype())
    throw std::invalid_argument(std::string(op) + ": dtype mismatch " + std::string(dtype_name(a.dtype())) +
                                " vs " + std::string(dtype_name(b.dtype())));
}

}  // namespace

Tensor CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  if (check_binary_dtypes(op, a, b, "binary op")) return binary(op, a, b.to(a.dtype()));
  const Shape shape = broadcast_shape(a.shape(), b.shape());
  Tensor out = Tensor::empty(shape, a.dtype());
  TRAINER_DISPATCH_FLOAT(a.dtype(), "binary op", [&] {
    scalar_t* o = out.data<scalar_t>();
    const scalar_t* pa = a.data<scalar_t>();
    const scalar_t* pb = b.data<scalar_t>();
    if (a.shape() == b.shape() && a.is_contiguous() && b.is_contiguous()) {
      const int64_t n = out.numel();
      cpu::parallel_ranges(n, n, [&](int64_t i0, int64_t i1) {
        switch (op) {  // the common cases, written so the compiler vectorises them
          case BinaryOp::add:
            for (int64_t i = i0; i < i1; ++i) o[i] = pa[i] + pb[i];
            return;
          case BinaryOp::mul:
            for (int64_t i = i0; i < i1; ++i) o[i] = pa[i] * pb[i];
            return;
          default:
            for (int64_t i = i0; i < i1; ++i) o[i] = binary_value(op, pa[i], pb[i]);
            return;
        }
      });
      return;
    }
    int64_t i = 0;
    cpu::for_each_index<2>(shape, {broadcast_strides(a, shape), broadcast_strides(b, shape)},
                           [&](int64_t oa, int64_t ob) { o[i++] = binary_value(op, pa[oa], pb[ob]); });
  });
  return out;
}

Tensor CpuBackend::binary_scalar(BinaryOp op, const Tensor& a, double s, bool scalar_first) {
  Tensor src = a.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype());
  TRAINER_DISPATCH_FLOAT(a.dtype(), "scalar op", [&] {
    const scalar_t* p = src.data<scalar_t>();
    scalar_t* o = out.data<scalar_t>();
    const scalar_t v = static_cast<scalar_t>(s);
    cpu::parallel_ranges(out.numel(), out.numel(), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        o[i] = scalar_first ? binary_value(op, v, p[i]) : binary_value(op, p[i], v);
    });
  });
  return out;
}

Tensor CpuBackend::unary(UnaryOp op, const Tensor& a) {
  Tensor src = a.contiguous();
  Tensor out = Tensor::empty(a.shape(), a.dtype());
  TRAINER_DISPATCH_FLOAT(a.dtype(), "unary op", [&] {
    const scalar_t* p = src.data<scalar_t>();
    scalar_t* o = out.data<scalar_t>();
    cpu::parallel_ranges(out.numel(), out.numel(), [&](int64_t i0, int64_t i1) {
      if (op == UnaryOp::relu) {
        for (int64_t i = i0; i < i1; ++i) o[i] = p[i] > scalar_t(0) ? p[i] : scalar_t(0);
        return;
      }
      for (int64_t i = i0; i < i1; ++i) o[i] = unary_value(op, p[i]);
    });
  });
  return out;
}

Tensor CpuBackend::unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y) {
  Tensor g = grad.contiguous();
  Tensor xs = x.defined() ? x.contiguous() : Tensor();
  Tensor ys = y.defined() ? y.contiguous() : Tensor();
  Tensor out = Tensor::empty(grad.shape(), grad.dtype());
  TRAINER_DISPATCH_FLOAT(grad.dtype(), "unary backward", [&] {
    const scalar_t* pg = g.data<scalar_t>();
    const scalar_t* px = xs.defined() ? xs.data<scalar_t>() : nullptr;
    const scalar_t* py = ys.defined() ? ys.data<scalar_t>() : nullptr;
    scalar_t* o = out.data<scalar_t>();
    const int64_t n = out.numel();
    cpu::parallel_ranges(n, n, [&](int64_t i0, int64_t i1) {
      if (op == UnaryOp::relu) {  // the hot one: a branch-free loop the compiler vectorises
        for (int64_t i = i0; i < i1; ++i) o[i] = cpu::relu_mask(py[i], pg[i]);
        return;
      }
      for (int64_t i = i0; i < i1; ++i)
        o[i] = unary_backward_value(op, pg[i], px ? px[i] : scalar_t(0), py ? py[i] : scalar_t(0));
    });
  });
  return out;
}

void CpuBackend::axpy(Tensor& dst, const Tensor& src, double alpha) {
  check_same_dtype(dst, src, "axpy");
  if (dst.shape() != src.shape()) throw std::invalid_argument("axpy: shape mismatch");
  // Any dense destination (a channels-last gradient too): the source is brought to its layout.
  const MemoryFormat format = dst.suggest_memory_format();
  if (!dst.is_contiguous(format)) throw std::invalid_argument("axpy: destination must be contiguous");
  Tensor s = src.contiguous(format);
  TRAINER_DISPATCH_FLOAT(dst.dtype(), "axpy", [&] {
    scalar_t* d = dst.data<scalar_t>();
    const scalar_t* p = s.data<scalar_t>();
    const scalar_t a = static_cast<scalar_t>(alpha);
    cpu::parallel_ranges(dst.numel(), dst.numel(), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) d[i] += a * p[i];
    });
  });
}

Tensor CpuBackend::relu_backward_of_sum(const Tensor& a, const Tensor& b, const Tensor& relu_out) {
  if (a.dtype() != b.dtype() || a.dtype() != relu_out.dtype() || a.shape() != b.shape() ||
      a.shape() != relu_out.shape() || !a.is_contiguous() || !b.is_contiguous() || !relu_out.is_contiguous())
    return unary_backward(UnaryOp::relu, binary(BinaryOp::add, a, b), Tensor(), relu_out);
  // The residual join's gradient in one pass rather than two: the same add, then the same select.
  Tensor out = Tensor::empty(a.shape(), a.dtype());
  TRAINER_DISPATCH_FLOAT(a.dtype(), "relu_backward_of_sum", [&] {
    const scalar_t* pa = a.data<scalar_t>();
    const scalar_t* pb = b.data<scalar_t>();
    const scalar_t* py = relu_out.data<scalar_t>();
    scalar_t* o = out.data<scalar_t>();
    cpu::parallel_ranges(out.numel(), out.numel(), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) o[i] = cpu::relu_mask(py[i], pa[i] + pb[i]);
    });
  });
  return out;
}

void CpuBackend::scale(Tensor& dst, double alpha) {
  if (!dst.is_contiguous(dst.suggest_memory_format()))  // any dense layout: elementwise in memory order
    throw std::invalid_argument("scale: destination must be contiguous");
  TRAINER_DISPATCH_FLOAT(dst.dtype(), "scale", [&] {
    scalar_t* d = dst.data<scalar_t>();
    const scalar_t a = static_cast<scalar_t>(alpha);
    cpu::parallel_ranges(dst.numel(), dst.numel(), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) d[i] *= a;
    });
  });
}

void CpuBackend::add_to_counter(Tensor& counter, int64_t amount) {
  check_counter(counter, "add_to_counter");
  counter.data<int64_t>()[0] += amount;
}

void CpuBackend::scale_and_flag_nonfinite(Tensor& dst, double alpha, Tensor& flag) {
  check_flag(flag, dst.device(), "scale_and_flag_nonfinite");
  scale(dst, alpha);
  if (!all_finite(dst)) flag.data<int64_t>()[0] = 1;
}

void CpuBackend::unscale_and_flag_nonfinite(Tensor& dst, const Tensor& scale, Tensor& flag) {
  check_loss_scale(scale, dst.device(), "unscale_and_flag_nonfinite");
  // 1/scale in double, rounded once to the gradient's precision by scale(): as the host's scaler does.
  scale_and_flag_nonfinite(dst, 1.0 / static_cast<double>(scale.data<float>()[0]), flag);
}

void CpuBackend::update_loss_scale(Tensor& scale, Tensor& tracker, Tensor& skipped, Tensor& flag,
                                   const LossScaleRule& rule) {
  check_loss_scale_state(scale, tracker, skipped, flag, rule, "update_loss_scale");
  int64_t& f = flag.data<int64_t>()[0];
  if (apply_loss_scale_rule(rule, f != 0, scale.data<float>()[0], tracker.data<int64_t>()[0]))
    skipped.data<double>()[0] += 1.0;
  f = 0;
}

}  // namespace trainer

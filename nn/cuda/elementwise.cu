// Elementwise kernels: broadcasting binary ops, scalar forms, unary ops and their gradients, axpy and
// scale. Half types compute in f32. Dense inputs keep their memory format (so channels-last
// activations stay channels-last); broadcasting binary ops return contiguous tensors, as on the CPU.
#include "nn/amp/loss_scale_rule.h"
#include "nn/cuda/kernels.cuh"
#include "nn/elementwise_math.h"
#include "nn/kernel_checks.h"

namespace trainer {
namespace cuda {
namespace {

Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  const size_t n = shape.size(), k = t.shape().size();
  Shape strides(n, 0);
  for (size_t i = 0; i < k; ++i) strides[n - k + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  return strides;
}

MemoryFormat format_of(const Tensor& t) { return is_dense(t) ? dense_format(t) : MemoryFormat::contiguous; }

}  // namespace

void add_channel_bias(Tensor& y, const Tensor& bias_in) {
  check_device(bias_in, "conv2d", "bias");
  check_same_dtype(y, bias_in, "conv2d");
  if (!is_dense(y) || y.dim() < 2)
    throw std::invalid_argument("add_channel_bias: y must be dense [N, C, ...]");
  const Tensor bias = bias_in.contiguous();
  const int64_t C = y.size(1);
  int64_t inner = 1;
  if (dense_format(y) == MemoryFormat::contiguous)
    for (int d = 2; d < y.dim(); ++d) inner *= y.size(d);
  CUDA_DISPATCH_FLOAT(y.dtype(), "conv2d bias", [&] {
    scalar_t* py = static_cast<scalar_t*>(y.raw_data());
    const scalar_t* pb = static_cast<const scalar_t*>(bias.raw_data());
    for_each(y.numel(), [=] __device__(int64_t i) {
      py[i] = store<scalar_t>(to_acc(py[i]) + to_acc(pb[(i / inner) % C]));
    });
  });
}

}  // namespace cuda

namespace cuda {
namespace {

// C when the coalesced layout is a dense [rows, C] output whose operands are each either dense [rows, C]
// or one [C] row repeated (stride 0 over rows); 0 otherwise.
int64_t row_broadcast_columns(const Shape& shape, const std::vector<Shape>& strides) {
  if (shape.size() != 2) return 0;
  const int64_t cols = shape[1];
  if (strides[0] != Shape{cols, 1}) return 0;
  for (size_t k = 1; k < strides.size(); ++k)
    if (strides[k] != Shape{cols, 1} && strides[k] != Shape{0, 1}) return 0;
  return cols;
}

}  // namespace
}  // namespace cuda

namespace cuda {
namespace {

// Four half values, read or written as one 8-byte access.
template <class H>
struct alignas(8) HalfQuad {
  H v[4];
};

// f32 a + half b, both dense in the same layout: b widened as it is read (Backend::binary's one mixed
// case). Four elements per thread (16 bytes of a and out, 8 of b) where the buffers are aligned, as
// map() reads its operands; the tail and unaligned views one element at a time.
Tensor add_half_to_f32(const Tensor& a, const Tensor& b) {
  Tensor out = empty(a.shape(), DType::f32, dense_format(a));
  const float* pa = static_cast<const float*>(a.raw_data());
  float* o = static_cast<float*>(out.raw_data());
  const int64_t n = out.numel();
  CUDA_DISPATCH_FLOAT(b.dtype(), "add", [&] {
    if constexpr (std::is_same_v<scalar_t, __half> || std::is_same_v<scalar_t, __nv_bfloat16>) {
      const scalar_t* pb = static_cast<const scalar_t*>(b.raw_data());
      const int64_t quads = aligned16(pa) && aligned16(o) && aligned16(pb) ? n / 4 : 0;
      if (quads > 0)
        for_each(quads, [=] __device__(int64_t q) {
          const float4 av = reinterpret_cast<const float4*>(pa)[q];
          const HalfQuad<scalar_t> bv = reinterpret_cast<const HalfQuad<scalar_t>*>(pb)[q];
          reinterpret_cast<float4*>(o)[q] = make_float4(av.x + to_acc(bv.v[0]), av.y + to_acc(bv.v[1]),
                                                        av.z + to_acc(bv.v[2]), av.w + to_acc(bv.v[3]));
        });
      const int64_t done = quads * 4;
      if (n > done)
        for_each(n - done, [=] __device__(int64_t t) { o[done + t] = pa[done + t] + to_acc(pb[done + t]); });
    }
  });
  return out;
}

}  // namespace
}  // namespace cuda

Tensor CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  using namespace cuda;
  check_device(a, "binary op", "lhs");
  check_device(b, "binary op", "rhs");
  const bool mixed = check_binary_dtypes(op, a, b, "binary op");
  const Shape shape = broadcast_shape(a.shape(), b.shape());
  const bool flat = a.shape() == b.shape() && same_layout(a, b) && is_dense(a);
  if (mixed) return flat ? add_half_to_f32(a, b) : binary(op, a, b.to(a.dtype()));
  Tensor out = empty(shape, a.dtype(), flat ? dense_format(a) : MemoryFormat::contiguous);
  Shape sh = shape;
  std::vector<Shape> st{out.strides(), broadcast_strides(a, shape), broadcast_strides(b, shape)};
  coalesce(sh, st);
  const Indexer io = make_indexer(sh, st[0], "binary op"), ia = make_indexer(sh, st[1], "binary op"),
                ib = make_indexer(sh, st[2], "binary op");
  CUDA_DISPATCH_FLOAT(a.dtype(), "binary op", [&] {
    scalar_t* o = static_cast<scalar_t*>(out.raw_data());
    const scalar_t* pa = static_cast<const scalar_t*>(a.raw_data());
    const scalar_t* pb = static_cast<const scalar_t*>(b.raw_data());
    using acc = acc_t<scalar_t>;
    if (flat) {
      map(out.numel(), o, pa, pb, static_cast<const scalar_t*>(nullptr),
          [=] __device__(acc x, acc y, acc) { return binary_value(op, x, y); });
    } else if (const int64_t cols = row_broadcast_columns(sh, st); cols > 0) {
      // [rows, C] with a [C] operand (a bias, a layer scale): one modulo instead of an offset division
      // per dim and operand.
      const bool a_rows = st[1][0] != 0, b_rows = st[2][0] != 0;
      for_each(out.numel(), [=] __device__(int64_t i) {
        const int64_t c = i % cols;
        o[i] = store<scalar_t>(binary_value(op, to_acc(pa[a_rows ? i : c]), to_acc(pb[b_rows ? i : c])));
      });
    } else
      for_each(out.numel(), [=] __device__(int64_t i) {
        o[offset_of(io, i)] =
            store<scalar_t>(binary_value(op, to_acc(pa[offset_of(ia, i)]), to_acc(pb[offset_of(ib, i)])));
      });
  });
  return out;
}

Tensor CudaBackend::binary_scalar(BinaryOp op, const Tensor& a_in, double s, bool scalar_first) {
  using namespace cuda;
  check_device(a_in, "scalar op", "input");
  const Tensor a = a_in.contiguous(format_of(a_in));
  Tensor out = empty(a.shape(), a.dtype(), format_of(a));
  CUDA_DISPATCH_FLOAT(a.dtype(), "scalar op", [&] {
    using acc = acc_t<scalar_t>;
    const scalar_t* p = static_cast<const scalar_t*>(a.raw_data());
    scalar_t* o = static_cast<scalar_t*>(out.raw_data());
    const acc v = static_cast<acc>(s);
    map(out.numel(), o, p, static_cast<const scalar_t*>(nullptr), static_cast<const scalar_t*>(nullptr),
        [=] __device__(acc x, acc, acc) {
          return scalar_first ? binary_value(op, v, x) : binary_value(op, x, v);
        });
  });
  return out;
}

Tensor CudaBackend::unary(UnaryOp op, const Tensor& a_in) {
  using namespace cuda;
  check_device(a_in, "unary op", "input");
  const Tensor a = a_in.contiguous(format_of(a_in));
  Tensor out = empty(a.shape(), a.dtype(), format_of(a));
  CUDA_DISPATCH_FLOAT(a.dtype(), "unary op", [&] {
    const scalar_t* p = static_cast<const scalar_t*>(a.raw_data());
    scalar_t* o = static_cast<scalar_t*>(out.raw_data());
    using acc = acc_t<scalar_t>;
    map(out.numel(), o, p, static_cast<const scalar_t*>(nullptr), static_cast<const scalar_t*>(nullptr),
        [=] __device__(acc x, acc, acc) { return unary_value(op, x); });
  });
  return out;
}

Tensor CudaBackend::unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y) {
  using namespace cuda;
  check_device(grad, "unary backward", "grad");
  const MemoryFormat f = format_of(grad);
  const Tensor g = grad.contiguous(f);
  Tensor xs, ys;
  if (x.defined()) {
    check_device(x, "unary backward", "x");
    check_same_dtype(grad, x, "unary backward");
    xs = x.contiguous(f);
  }
  if (y.defined()) {
    check_device(y, "unary backward", "y");
    check_same_dtype(grad, y, "unary backward");
    ys = y.contiguous(f);
  }
  Tensor out = empty(g.shape(), g.dtype(), f);
  CUDA_DISPATCH_FLOAT(g.dtype(), "unary backward", [&] {
    using acc = acc_t<scalar_t>;
    const scalar_t* pg = static_cast<const scalar_t*>(g.raw_data());
    const scalar_t* px = xs.defined() ? static_cast<const scalar_t*>(xs.raw_data()) : nullptr;
    const scalar_t* py = ys.defined() ? static_cast<const scalar_t*>(ys.raw_data()) : nullptr;
    scalar_t* o = static_cast<scalar_t*>(out.raw_data());
    map(out.numel(), o, pg, px, py,
        [=] __device__(acc g, acc x, acc y) { return unary_backward_value(op, g, x, y); });
  });
  return out;
}

Tensor CudaBackend::relu_backward_of_sum(const Tensor& a, const Tensor& b, const Tensor& relu_out) {
  using namespace cuda;
  check_device(a, "relu_backward_of_sum", "a");
  check_device(b, "relu_backward_of_sum", "b");
  check_device(relu_out, "relu_backward_of_sum", "relu_out");
  check_same_dtype(a, b, "relu_backward_of_sum");
  check_same_dtype(a, relu_out, "relu_backward_of_sum");
  if (a.shape() != b.shape() || a.shape() != relu_out.shape())
    throw std::invalid_argument("relu_backward_of_sum: shapes " + shape_str(a.shape()) + ", " +
                                shape_str(b.shape()) + " and " + shape_str(relu_out.shape()) + " differ");
  const MemoryFormat f = format_of(relu_out);
  const Tensor pa = a.contiguous(f), pb = b.contiguous(f), py = relu_out.contiguous(f);
  Tensor out = empty(a.shape(), a.dtype(), f);
  CUDA_DISPATCH_FLOAT(a.dtype(), "relu_backward_of_sum", [&] {
    using acc = acc_t<scalar_t>;
    map(out.numel(), static_cast<scalar_t*>(out.raw_data()), static_cast<const scalar_t*>(pa.raw_data()),
        static_cast<const scalar_t*>(pb.raw_data()), static_cast<const scalar_t*>(py.raw_data()),
        [=] __device__(acc x, acc y, acc r) {
          // The sum rounded to the storage type first, as binary(add) stores it before the mask.
          const acc sum = to_acc(store<scalar_t>(binary_value(BinaryOp::add, x, y)));
          return unary_backward_value(UnaryOp::relu, sum, acc(0), r);
        });
  });
  return out;
}

void CudaBackend::axpy(Tensor& dst, const Tensor& src, double alpha) {
  using namespace cuda;
  check_device(dst, "axpy", "destination");
  check_device(src, "axpy", "source");
  check_same_dtype(dst, src, "axpy");
  if (dst.shape() != src.shape()) throw std::invalid_argument("axpy: shape mismatch");
  if (!is_dense(dst)) throw std::invalid_argument("axpy: destination must be contiguous");
  const Tensor s = src.contiguous(dense_format(dst));
  CUDA_DISPATCH_FLOAT(dst.dtype(), "axpy", [&] {
    using acc = acc_t<scalar_t>;
    scalar_t* d = static_cast<scalar_t*>(dst.raw_data());
    const scalar_t* p = static_cast<const scalar_t*>(s.raw_data());
    const acc a = static_cast<acc>(alpha);
    map(dst.numel(), d, static_cast<const scalar_t*>(d), p, static_cast<const scalar_t*>(nullptr),
        [=] __device__(acc x, acc y, acc) { return x + a * y; });
  });
}

void CudaBackend::scale_and_flag_nonfinite(Tensor& dst, double alpha, Tensor& flag) {
  using namespace cuda;
  check_device(dst, "scale_and_flag_nonfinite", "destination");
  check_flag(flag, dst.device(), "scale_and_flag_nonfinite");
  if (!is_dense(dst)) throw std::invalid_argument("scale_and_flag_nonfinite: destination must be contiguous");
  int64_t* pf = static_cast<int64_t*>(flag.raw_data());
  CUDA_DISPATCH_FLOAT(dst.dtype(), "scale_and_flag_nonfinite", [&] {
    using acc = acc_t<scalar_t>;
    scalar_t* d = static_cast<scalar_t*>(dst.raw_data());
    const acc a = static_cast<acc>(alpha);
    for_each(dst.numel(), [=] __device__(int64_t i) {
      d[i] = from_acc<scalar_t>(to_acc(d[i]) * a);
      if (!isfinite(to_acc(d[i])))
        *pf = 1;  // the stored value: rounding to half may overflow; racing writers all store 1
    });
  });
}

void CudaBackend::unscale_and_flag_nonfinite(Tensor& dst, const Tensor& scale, Tensor& flag) {
  using namespace cuda;
  check_device(dst, "unscale_and_flag_nonfinite", "destination");
  check_loss_scale(scale, dst.device(), "unscale_and_flag_nonfinite");
  check_flag(flag, dst.device(), "unscale_and_flag_nonfinite");
  if (!is_dense(dst))
    throw std::invalid_argument("unscale_and_flag_nonfinite: destination must be contiguous");
  int64_t* pf = static_cast<int64_t*>(flag.raw_data());
  const float* ps = static_cast<const float*>(scale.raw_data());
  CUDA_DISPATCH_FLOAT(dst.dtype(), "unscale_and_flag_nonfinite", [&] {
    using acc = acc_t<scalar_t>;
    scalar_t* d = static_cast<scalar_t*>(dst.raw_data());
    for_each(dst.numel(), [=] __device__(int64_t i) {
      // 1/scale in double, rounded once to acc: the host scaler's factor (scale_and_flag_nonfinite).
      const acc a = static_cast<acc>(__drcp_rn(static_cast<double>(*ps)));
      d[i] = from_acc<scalar_t>(to_acc(d[i]) * a);
      if (!isfinite(to_acc(d[i]))) *pf = 1;
    });
  });
}

void CudaBackend::update_loss_scale(Tensor& scale, Tensor& tracker, Tensor& skipped, Tensor& flag,
                                    const LossScaleRule& rule) {
  using namespace cuda;
  check_device(scale, "update_loss_scale", "scale");
  check_loss_scale_state(scale, tracker, skipped, flag, rule, "update_loss_scale");
  float* s = static_cast<float*>(scale.raw_data());
  int64_t* t = static_cast<int64_t*>(tracker.raw_data());
  double* skips = static_cast<double*>(skipped.raw_data());
  int64_t* f = static_cast<int64_t*>(flag.raw_data());
  for_each(1, [=] __device__(int64_t) {
    if (apply_loss_scale_rule(rule, *f != 0, *s, *t)) *skips += 1.0;
    *f = 0;
  });
}

void CudaBackend::add_to_counter(Tensor& counter, int64_t amount) {
  using namespace cuda;
  check_device(counter, "add_to_counter", "counter");
  check_counter(counter, "add_to_counter");
  int64_t* pc = static_cast<int64_t*>(counter.raw_data());
  for_each(1, [=] __device__(int64_t) { *pc += amount; });
}

void CudaBackend::scale(Tensor& dst, double alpha) {
  using namespace cuda;
  check_device(dst, "scale", "destination");
  if (!is_dense(dst)) throw std::invalid_argument("scale: destination must be contiguous");
  CUDA_DISPATCH_FLOAT(dst.dtype(), "scale", [&] {
    using acc = acc_t<scalar_t>;
    scalar_t* d = static_cast<scalar_t*>(dst.raw_data());
    const acc a = static_cast<acc>(alpha);
    map(dst.numel(), d, static_cast<const scalar_t*>(d), static_cast<const scalar_t*>(nullptr),
        static_cast<const scalar_t*>(nullptr), [=] __device__(acc x, acc, acc) { return x * a; });
  });
}

}  // namespace trainer

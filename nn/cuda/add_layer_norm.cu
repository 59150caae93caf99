// A pre-norm transformer's residual join fused with the layer norm after it (Backend::add_layer_norm):
// the forward reads x and the block's branch once and writes the stream h = x + branch and the norm's
// output; the backward reads grad_y, h and the gradient h's other consumer sent, and writes x's
// gradient and branch's (its half copy too, when the branch is half). Composed, each join costs an add
// pass, a norm pass that reads h again, an add of h's two gradients and a cast pass: per element of a
// ViT's f32 stream beside bf16 branches 44 bytes of traffic against 28 fused.
//
// The numbers are the composed ops' own: h rounds x + branch once, the norm reads that rounded h, and
// x's gradient rounds the norm's gradient to h's dtype before it adds the other part, as the autograd
// engine's add would. Rows of up to 1024 values (a warp per row, layer_norm_rows.cuh); longer rows and
// other dtype pairs are left to the composed ops (nullopt).
#include <string>
#include <type_traits>

#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/layer_norm_rows.cuh"
#include "nn/kernel_checks.h"

namespace trainer {
namespace cuda {
namespace {

// T: x and h; B: branch and y (T, or a half dtype beside an f32 T).
template <class T, class B, class A, int kPerLane>
__global__ void add_layer_norm_kernel(const T* x, const B* branch, const A* gamma, const A* beta, T* h, B* y,
                                      A* mean_out, A* rstd_out, int64_t rows, int64_t C, A eps) {
  using std::sqrt;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (r >= rows) return;
  const int lane = threadIdx.x;
  const int64_t row = r * C;
  A v[kPerLane];
  A sum = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    v[j] = 0;
    if (c < C) {
      const T sum_rounded = store<T>(to_acc(x[row + c]) + to_acc(branch[row + c]));
      h[row + c] = sum_rounded;
      v[j] = to_acc(sum_rounded);
    }
    sum += v[j];
  }
  const A mean = warp_sum(sum) / static_cast<A>(C);
  A squares = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + 32 * j < C) squares += (v[j] - mean) * (v[j] - mean);
  const A rstd = A(1) / sqrt(warp_sum(squares) / static_cast<A>(C) + eps);
  if (lane == 0) mean_out[r] = mean, rstd_out[r] = rstd;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    if (c >= C) continue;
    const A xhat = (v[j] - mean) * rstd;
    y[row + c] = store<B>(gamma ? xhat * gamma[c] + (beta ? beta[c] : A(0)) : xhat);
  }
}

__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// grad_x = round_T(the norm's gradient) + grad_h_in (null: none), and grad_branch = grad_x in B (null:
// B is T and grad_x serves both). D: grad_y's dtype.
template <class D, class T, class B, class A, int kPerLane>
__global__ void add_layer_norm_backward_kernel(const D* dy, const T* grad_h_in, const T* h, const A* mean,
                                               const A* rstd, const A* gamma, T* grad_x, B* grad_branch,
                                               int64_t rows, int64_t C) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  if (r >= rows) return;
  const int lane = threadIdx.x;
  const int64_t row = r * C;
  const A m = mean[r], s = rstd[r];
  A dxhat[kPerLane], xhat[kPerLane];
  A sum_dxhat = 0, sum_dxhat_xhat = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    const bool in = c < C;
    dxhat[j] = in ? (gamma ? to_acc(dy[row + c]) * gamma[c] : to_acc(dy[row + c])) : A(0);
    xhat[j] = in ? (to_acc(h[row + c]) - m) * s : A(0);
    sum_dxhat += dxhat[j];
    sum_dxhat_xhat += dxhat[j] * xhat[j];
  }
  const A mean_dxhat = warp_sum(sum_dxhat) / static_cast<A>(C);
  const A mean_dxhat_xhat = warp_sum(sum_dxhat_xhat) / static_cast<A>(C);
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t c = lane + 32 * j;
    if (c >= C) continue;
    // The product rounded on its own (an explicit _rn multiply, which the compiler never contracts into
    // a fused multiply-add with the sum below), as layer_norm's kernel stores it before the engine adds.
    A g = to_acc(store<T>(mul_rn(s, dxhat[j] - mean_dxhat - xhat[j] * mean_dxhat_xhat)));
    if (grad_h_in) g = to_acc(store<T>(g + to_acc(grad_h_in[row + c])));
    grad_x[row + c] = store<T>(g);
    if (grad_branch) grad_branch[row + c] = store<B>(g);
  }
}

// Whether the fused kernels take these rows: some, dense and contiguous, at most 1024 values each (the
// warp kernels), and few enough for one grid. (No rows: the composed ops, whose backward knows the row
// length without statistics.)
bool rows_fusable(const Tensor& x, int64_t C) {
  return C > 0 && x.numel() > 0 && x.dim() >= 1 && x.size(-1) == C && x.is_contiguous() &&
         per_lane_for(C) != 0 && x.numel() / C <= 0x7fffffff;
}

// And these dtypes: branch in x's or a half one beside f32, y stored in branch's (the two pairs a
// transformer has: all f32, or autocast's f32 stream with half branches).
bool dtypes_fusable(DType x, DType branch, DType y) {
  return (branch == x || (x == DType::f32 && is_half(branch))) && y == branch;
}

template <class T, class B>
void launch_add_layer_norm(const Tensor& x, const Tensor& branch, const Tensor& g, const Tensor& b,
                           AddLayerNormForward& out, int64_t rows, int64_t C, double eps) {
  using A = acc_t<T>;
  const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  with_per_lane(per_lane_for(C), [&](auto k) {
    add_layer_norm_kernel<T, B, A, decltype(k)::value><<<blocks, dim3(32, kRowsPerBlock), 0, cuda_stream()>>>(
        static_cast<const T*>(x.raw_data()), static_cast<const B*>(branch.raw_data()), data_or_null<A>(g),
        data_or_null<A>(b), static_cast<T*>(out.h.raw_data()), static_cast<B*>(out.y.raw_data()),
        static_cast<A*>(out.mean.raw_data()), static_cast<A*>(out.rstd.raw_data()), rows, C,
        static_cast<A>(eps));
    CUDA_CHECK_LAUNCH();
  });
}

template <class D, class T, class B>
void launch_add_layer_norm_backward(const Tensor& dy, const Tensor& grad_h_in, const Tensor& h,
                                    const Tensor& mean, const Tensor& rstd, const Tensor& g,
                                    AddLayerNormGrads& out, int64_t rows, int64_t C) {
  using A = acc_t<T>;
  const D* pdy = static_cast<const D*>(dy.raw_data());
  const T* ph = static_cast<const T*>(h.raw_data());
  const A *pmean = static_cast<const A*>(mean.raw_data()), *prstd = static_cast<const A*>(rstd.raw_data());
  B* pbranch = std::is_same_v<B, T> ? nullptr : static_cast<B*>(out.grad_branch.raw_data());
  const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  with_per_lane(per_lane_for(C), [&](auto k) {
    add_layer_norm_backward_kernel<D, T, B, A, decltype(k)::value>
        <<<blocks, dim3(32, kRowsPerBlock), 0, cuda_stream()>>>(
            pdy, grad_h_in.defined() ? static_cast<const T*>(grad_h_in.raw_data()) : nullptr, ph, pmean,
            prstd, data_or_null<A>(g), static_cast<T*>(out.grad_x.raw_data()), pbranch, rows, C);
    CUDA_CHECK_LAUNCH();
  });
  if (g.defined())
    launch_layer_norm_param_grads<D, T>(pdy, ph, pmean, prstd, out.grad_gamma, out.grad_beta, rows, C);
}

}  // namespace
}  // namespace cuda

std::optional<AddLayerNormForward> CudaBackend::add_layer_norm(const Tensor& x, const Tensor& branch,
                                                               int64_t normalized_size, const Tensor& gamma,
                                                               const Tensor& beta, double eps,
                                                               DType y_dtype) {
  using namespace cuda;
  check_device(x, "add_layer_norm", "input");
  const bool fused = rows_fusable(x, normalized_size) && branch.shape() == x.shape() &&
                     branch.is_contiguous() && branch.device() == x.device() &&
                     dtypes_fusable(x.dtype(), branch.dtype(), y_dtype);
  if (!fused) return std::nullopt;
  const int64_t rows = check_layer_norm(x, normalized_size, gamma, beta, "add_layer_norm");
  const DType stats = accumulate_dtype(x.dtype());
  AddLayerNormForward out{empty(x.shape(), x.dtype()), empty(x.shape(), y_dtype), empty({rows}, stats),
                          empty({rows}, stats)};
  const Tensor g = as_compute_dtype(gamma, x.dtype()), b = as_compute_dtype(beta, x.dtype());
  CUDA_DISPATCH_FLOAT(x.dtype(), "add_layer_norm", [&] {
    with_half_or_same<scalar_t>(branch.dtype(), [&](auto half_or_same) {
      launch_add_layer_norm<scalar_t, decltype(half_or_same)>(x, branch, g, b, out, rows, normalized_size,
                                                              eps);
    });
  });
  return out;
}

std::optional<AddLayerNormGrads> CudaBackend::add_layer_norm_backward(const Tensor& grad_y,
                                                                      const Tensor& grad_h_in,
                                                                      const Tensor& h, const Tensor& mean,
                                                                      const Tensor& rstd, const Tensor& gamma,
                                                                      DType branch_dtype) {
  using namespace cuda;
  check_device(h, "add_layer_norm_backward", "input");
  const int64_t C = check_layer_norm_backward(grad_y, h, mean, rstd, gamma, "add_layer_norm_backward");
  if (!rows_fusable(h, C) || !dtypes_fusable(h.dtype(), branch_dtype, branch_dtype)) return std::nullopt;
  const bool grad_h_ok =
      !grad_h_in.defined() ||
      (grad_h_in.shape() == h.shape() && grad_h_in.dtype() == h.dtype() && grad_h_in.device() == h.device());
  if (!grad_h_ok)
    throw std::invalid_argument("add_layer_norm_backward: the stream's gradient must be a " +
                                std::string(dtype_name(h.dtype())) + " " + shape_str(h.shape()) +
                                " tensor on its device, got " + std::string(dtype_name(grad_h_in.dtype())) +
                                " " + shape_str(grad_h_in.shape()));
  const int64_t rows = mean.numel();
  const Tensor dy = grad_y.contiguous(), dh = grad_h_in.defined() ? grad_h_in.contiguous() : Tensor();
  const Tensor g = as_compute_dtype(gamma, h.dtype());
  const DType stats = accumulate_dtype(h.dtype());
  AddLayerNormGrads out;
  out.grad_x = empty(h.shape(), h.dtype());
  out.grad_branch = branch_dtype == h.dtype() ? out.grad_x : empty(h.shape(), branch_dtype);
  if (gamma.defined()) out.grad_gamma = empty({C}, stats), out.grad_beta = empty({C}, stats);
  CUDA_DISPATCH_FLOAT(h.dtype(), "add_layer_norm_backward", [&] {
    with_half_or_same<scalar_t>(dy.dtype(), [&](auto d) {
      with_half_or_same<scalar_t>(branch_dtype, [&](auto branch_type) {
        launch_add_layer_norm_backward<decltype(d), scalar_t, decltype(branch_type)>(dy, dh, h, mean, rstd, g,
                                                                                     out, rows, C);
      });
    });
  });
  return out;
}

}  // namespace trainer

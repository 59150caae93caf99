// Softmax over the last dimension on the GPU: one block per row, the row's maximum subtracted before
// exp (no overflow for large logits), sums in f32 (f64 for f64 inputs); half inputs and outputs.
#include <cmath>

#include "nn/cuda/kernels.cuh"
#include "nn/kernel_checks.h"

namespace trainer {
namespace cuda {
namespace {

struct RowMaxOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};

template <class T, class A>
__global__ void softmax_kernel(const T* x, T* y, int64_t n) {
  using std::exp;
  const T* xr = x + blockIdx.x * n;
  T* yr = y + blockIdx.x * n;
  A row_max = -INFINITY;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) row_max = RowMaxOp{}(row_max, to_acc(xr[c]));
  row_max = block_reduce(row_max, RowMaxOp{}, A(-INFINITY));
  A sum = 0;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) sum += exp(to_acc(xr[c]) - row_max);
  const A inv = A(1) / block_sum(sum);
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) yr[c] = store<T>(exp(to_acc(xr[c]) - row_max) * inv);
}

template <class T, class A>
__global__ void softmax_backward_kernel(const T* dy, const T* y, T* dx, int64_t n) {
  const int64_t base = blockIdx.x * n;
  A dot = 0;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) dot += to_acc(dy[base + c]) * to_acc(y[base + c]);
  dot = block_sum(dot);
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x)
    dx[base + c] = store<T>(to_acc(y[base + c]) * (to_acc(dy[base + c]) - dot));
}

int64_t rows_of(const Tensor& t, int64_t n, const char* op) {
  const int64_t rows = n == 0 ? 0 : t.numel() / n;
  if (rows > 0x7fffffff)
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(rows) + " rows exceed one grid");
  return rows;
}

}  // namespace
}  // namespace cuda

Tensor CudaBackend::softmax(const Tensor& x_in) {
  using namespace cuda;
  check_device(x_in, "softmax", "input");
  const int64_t n = check_softmax(x_in, "softmax");
  const Tensor x = x_in.contiguous();
  Tensor y = empty(x.shape(), x.dtype());
  const int64_t rows = rows_of(x, n, "softmax");
  if (rows == 0) return y;
  CUDA_DISPATCH_FLOAT(x.dtype(), "softmax", [&] {
    softmax_kernel<scalar_t, acc_t<scalar_t>>
        <<<static_cast<unsigned>(rows), row_block_threads(n), 0, cuda_stream()>>>(
            static_cast<const scalar_t*>(x.raw_data()), static_cast<scalar_t*>(y.raw_data()), n);
    CUDA_CHECK_LAUNCH();
  });
  return y;
}

Tensor CudaBackend::softmax_backward(const Tensor& grad_y, const Tensor& y_in) {
  using namespace cuda;
  check_device(y_in, "softmax_backward", "y");
  const int64_t n = check_softmax_backward(grad_y, y_in, "softmax_backward");
  const Tensor dy = grad_y.contiguous(), y = y_in.contiguous();
  Tensor dx = empty(y.shape(), y.dtype());
  const int64_t rows = rows_of(y, n, "softmax_backward");
  if (rows == 0) return dx;
  CUDA_DISPATCH_FLOAT(y.dtype(), "softmax_backward", [&] {
    softmax_backward_kernel<scalar_t, acc_t<scalar_t>>
        <<<static_cast<unsigned>(rows), row_block_threads(n), 0, cuda_stream()>>>(
            static_cast<const scalar_t*>(dy.raw_data()), static_cast<const scalar_t*>(y.raw_data()),
            static_cast<scalar_t*>(dx.raw_data()), n);
    CUDA_CHECK_LAUNCH();
  });
  return dx;
}

}  // namespace trainer

// Sums over dimensions (accumulated in double, like the CPU), materialised broadcasts and the
// finiteness check. Inputs may have any strides.
#include <algorithm>

#include "nn/cuda/kernels.cuh"

namespace trainer {
namespace cuda {
namespace {

constexpr int kReduceThreads = 256;

// Block (o, p) sums part p of output o's reduced elements into partial[o * parts + p].
template <class T>
__global__ void sum_partial_kernel(const T* a, Indexer kept, Indexer reduced, int64_t n_reduced, int parts,
                                   double* partial) {
  const int64_t o = blockIdx.x / parts;
  const int p = static_cast<int>(blockIdx.x % parts);
  const int64_t chunk = (n_reduced + parts - 1) / parts;
  const int64_t begin = p * chunk, end = min(n_reduced, begin + chunk);
  const T* base = a + offset_of(kept, o);
  double acc = 0.0;
  for (int64_t r = begin + threadIdx.x; r < end; r += blockDim.x) acc += to_acc(base[offset_of(reduced, r)]);
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// Column sums: output c (kept elements at stride 1, so a warp reads 32 neighbours) sums the reduced
// elements of rows [part * rows_per_part, ...) of its column; block (tile, part) is 32 columns x
// kColumnRows row strides, combined in row order through shared memory. A bias gradient ([rows, C]
// summed over rows, C ~ 1e3, rows ~ 1e4-1e5 in a ViT) needs this: one thread per column would leave
// most of the GPU idle and read memory a column at a time.
constexpr int kColumnRows = 8;

template <class T>
__global__ void column_sum_partial_kernel(const T* a, Indexer reduced, int64_t n_cols, int64_t n_red,
                                          int64_t rows_per_part, double* partial) {
  __shared__ double rows[kColumnRows][33];  // 33: no bank conflicts
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_part;
  const int64_t end = min(n_red, begin + rows_per_part);
  double acc = 0.0;
  if (c < n_cols)
    for (int64_t r = begin + threadIdx.y; r < end; r += kColumnRows)
      acc += to_acc(a[offset_of(reduced, r) + c]);
  rows[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= n_cols) return;
  for (int k = 1; k < kColumnRows; ++k) acc += rows[k][threadIdx.x];
  partial[blockIdx.y * n_cols + c] = acc;
}

// Sums `a` over `red` into `po` when the kept elements coalesce to one dimension of stride 1.
template <class T>
void column_sum(const T* pa, const Indexer& red, int64_t n_cols, int64_t n_red, T* po) {
  const int64_t tiles = (n_cols + 31) / 32;
  const int64_t target_blocks = static_cast<int64_t>(cuda_context().sm_count) * 4;
  const int parts = static_cast<int>(
      std::clamp<int64_t>((target_blocks + tiles - 1) / tiles, 1, std::max<int64_t>(1, n_red / 256)));
  const int64_t rows_per_part = (n_red + parts - 1) / parts;
  Tensor partial = empty({parts * n_cols}, DType::f64);
  double* pp = static_cast<double*>(partial.raw_data());
  const dim3 block(32, kColumnRows), grid(static_cast<unsigned>(tiles), static_cast<unsigned>(parts));
  column_sum_partial_kernel<<<grid, block, 0, cuda_stream()>>>(pa, red, n_cols, n_red, rows_per_part, pp);
  CUDA_CHECK_LAUNCH();
  for_each(n_cols, [=] __device__(int64_t c) {
    double acc = 0.0;
    for (int p = 0; p < parts; ++p) acc += pp[p * n_cols + c];
    po[c] = from_acc<T>(acc);
  });
}

}  // namespace
}  // namespace cuda

Tensor CudaBackend::sum(const Tensor& a, const std::vector<int>& dims_in, bool keepdim) {
  using namespace cuda;
  check_device(a, "sum", "input");
  const int nd = a.dim();
  std::vector<bool> reduce(nd, dims_in.empty());
  for (int d : dims_in) {
    const int dd = d < 0 ? d + nd : d;
    if (dd < 0 || dd >= nd) throw std::invalid_argument("sum: dim out of range for " + shape_str(a.shape()));
    reduce[dd] = true;
  }
  Shape kept_shape(nd), out_shape, kept_dims, kept_strides, red_dims, red_strides;
  for (int d = 0; d < nd; ++d) {
    kept_shape[d] = reduce[d] ? 1 : a.size(d);
    (reduce[d] ? red_dims : kept_dims).push_back(a.size(d));
    (reduce[d] ? red_strides : kept_strides).push_back(a.stride(d));
    if (!reduce[d]) out_shape.push_back(a.size(d));
  }
  Tensor out = empty(kept_shape, a.dtype());
  const int64_t n_out = out.numel(), n_red = shape_numel(red_dims);
  std::vector<Shape> ks{kept_strides}, rs{red_strides};
  coalesce(kept_dims, ks);
  coalesce(red_dims, rs);
  const Indexer kept = make_indexer(kept_dims, ks[0], "sum"), red = make_indexer(red_dims, rs[0], "sum");
  if (n_out == 0) return keepdim ? out : out.view(out_shape);
  CUDA_DISPATCH_FLOAT(a.dtype(), "sum", [&] {
    const scalar_t* pa = static_cast<const scalar_t*>(a.raw_data());
    scalar_t* po = static_cast<scalar_t*>(out.raw_data());
    if (kept_dims.size() == 1 && ks[0][0] == 1 && n_red > 64) {  // columns: bias gradients and the like
      column_sum(pa, red, n_out, n_red, po);
      return;
    }
    if (n_out >= 1024 || n_red <= 64) {  // enough outputs to fill the GPU with one thread each
      for_each(n_out, [=] __device__(int64_t o) {
        const scalar_t* base = pa + offset_of(kept, o);
        double acc = 0.0;
        for (int64_t r = 0; r < n_red; ++r) acc += to_acc(base[offset_of(red, r)]);
        po[o] = from_acc<scalar_t>(acc);
      });
      return;
    }
    // Few outputs: each is split over `parts` blocks, then the partials are added in a fixed order.
    const int64_t target_blocks = static_cast<int64_t>(cuda_context().sm_count) * 4;
    const int parts = static_cast<int>(
        std::clamp<int64_t>((target_blocks + n_out - 1) / n_out, 1, std::max<int64_t>(1, n_red / 4096)));
    Tensor partial = empty({n_out * parts}, DType::f64);
    double* pp = static_cast<double*>(partial.raw_data());
    sum_partial_kernel<<<static_cast<unsigned>(n_out * parts), kReduceThreads, 0, cuda_stream()>>>(
        pa, kept, red, n_red, parts, pp);
    CUDA_CHECK_LAUNCH();
    for_each(n_out, [=] __device__(int64_t o) {
      double acc = 0.0;
      for (int p = 0; p < parts; ++p) acc += pp[o * parts + p];
      po[o] = from_acc<scalar_t>(acc);
    });
  });
  return keepdim ? out : out.view(out_shape);
}

Tensor CudaBackend::broadcast_to(const Tensor& a, const Shape& shape) {
  using namespace cuda;
  check_device(a, "broadcast_to", "input");
  if (a.dim() > static_cast<int>(shape.size()))
    throw std::invalid_argument("broadcast_to: " + shape_str(a.shape()) + " has more dims than " +
                                shape_str(shape));
  Shape strides(shape.size(), 0);
  const size_t off = shape.size() - a.dim();
  for (int i = 0; i < a.dim(); ++i) {
    if (a.size(i) != 1 && a.size(i) != shape[off + i])
      throw std::invalid_argument("broadcast_to: cannot broadcast " + shape_str(a.shape()) + " to " +
                                  shape_str(shape));
    strides[off + i] = a.size(i) == 1 ? 0 : a.stride(i);
  }
  Tensor out = empty(shape, a.dtype());
  launch_copy(out.raw_data(), out.dtype(), out.strides(), a.raw_data(), a.dtype(), strides, shape);
  return out;
}

bool CudaBackend::all_finite(const Tensor& a) {
  using namespace cuda;
  check_device(a, "all_finite", "input");
  if (a.numel() == 0) return true;
  Shape shape = a.shape();
  std::vector<Shape> st{a.strides()};
  coalesce(shape, st);
  const Indexer ix = make_indexer(shape, st[0], "all_finite");
  Tensor flag = Tensor::zeros({1}, DType::i64, current_device());
  int64_t* pf = static_cast<int64_t*>(flag.raw_data());
  CUDA_DISPATCH_FLOAT(a.dtype(), "all_finite", [&] {
    const scalar_t* p = static_cast<const scalar_t*>(a.raw_data());
    for_each(a.numel(), [=] __device__(int64_t i) {
      if (!isfinite(to_acc(p[offset_of(ix, i)]))) *pf = 1;  // racing writers all store 1
    });
  });
  int64_t host = 0;
  CUDA_CHECK(cudaMemcpyAsync(&host, pf, sizeof(host), cudaMemcpyDeviceToHost, cuda_stream()));
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
  return host == 0;
}

}  // namespace trainer

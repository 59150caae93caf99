// Copies between any layouts and dtypes on the GPU, host <-> device transfers, and fill.
//
// Host <-> device: bytes move with cudaMemcpyAsync on the compute stream; layout and dtype changes
// happen on the device. A host tensor that is not dense is first made contiguous on the host; a
// device -> host copy waits for the stream before returning, so the host may read the data at once.
#include <cstring>

#include "nn/cuda/kernels.cuh"

namespace trainer {
namespace cuda {
namespace {

__device__ __forceinline__ double load_any(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::f32:
      return static_cast<const float*>(base)[i];
    case DType::f64:
      return static_cast<const double*>(base)[i];
    case DType::f16:
      return __half2float(static_cast<const __half*>(base)[i]);
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::i64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::u8:
      return static_cast<const uint8_t*>(base)[i];
  }
  return 0;
}

// The same conversions as the CPU backend's store(): through float for the half types.
__device__ __forceinline__ void store_any(void* base, DType dtype, int64_t i, double v) {
  switch (dtype) {
    case DType::f32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case DType::f64:
      static_cast<double*>(base)[i] = v;
      break;
    case DType::f16:
      static_cast<__half*>(base)[i] = __float2half_rn(static_cast<float>(v));
      break;
    case DType::bf16:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(static_cast<float>(v));
      break;
    case DType::i64:
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      break;
    case DType::u8:
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v);
      break;
  }
}

template <class U>
void copy_elements(void* dst, const Indexer& di, const void* src, const Indexer& si, int64_t n) {
  U* d = static_cast<U*>(dst);
  const U* s = static_cast<const U*>(src);
  if (is_flat(di) && is_flat(si))
    for_each(n, [=] __device__(int64_t i) { d[i] = s[i]; });
  else
    for_each(n, [=] __device__(int64_t i) { d[offset_of(di, i)] = s[offset_of(si, i)]; });
}

// A same-dtype copy whose innermost dim is contiguous on both sides (a flat copy, or attention's head
// split and merge: runs of 64 elements) moves 16 bytes per thread: the shape and strides are
// rescaled to 16-byte units when every run, stride and base address allows it. That is 8 bf16
// elements per offset computation instead of 1. Returns false (nothing done) otherwise.
bool copy_in_16_byte_units(void* dst, const void* src, int64_t elem_size, const Shape& shape,
                           const std::vector<Shape>& strides) {
  if (shape.empty() || 16 % elem_size != 0) return false;
  const int64_t per = 16 / elem_size;
  if (strides[0].back() != 1 || strides[1].back() != 1 || shape.back() % per != 0) return false;
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) return false;
  Shape wide = shape;
  std::vector<Shape> wide_strides = strides;
  wide.back() /= per;
  for (Shape& st : wide_strides)
    for (size_t d = 0; d + 1 < st.size(); ++d) {
      if (st[d] % per != 0) return false;
      st[d] /= per;
    }
  const Indexer di = make_indexer(wide, wide_strides[0], "copy"),
                si = make_indexer(wide, wide_strides[1], "copy");
  copy_elements<uint4>(dst, di, src, si, shape_numel(wide));
  return true;
}

// Dense conversion between f32 and a half type, 4 elements per thread (autocast's weight casts and
// the casts of their gradients back, every step): the same rounding as store_any, without its
// per-element dtype switch through double.
template <class D, class S>
void convert_flat(void* dst, const void* src, int64_t n) {
  D* d = static_cast<D*>(dst);
  const S* s = static_cast<const S*>(src);
  struct alignas(4 * sizeof(S)) In {
    S v[4];
  };
  struct alignas(4 * sizeof(D)) Out {
    D v[4];
  };
  const bool vec =
      reinterpret_cast<uintptr_t>(d) % sizeof(Out) == 0 && reinterpret_cast<uintptr_t>(s) % sizeof(In) == 0;
  const int64_t n4 = vec ? n / 4 : 0;
  if (n4 > 0)
    for_each(n4, [=] __device__(int64_t q) {
      const In in = reinterpret_cast<const In*>(s)[q];
      Out out;
#pragma unroll
      for (int j = 0; j < 4; ++j) out.v[j] = from_f<D>(to_acc(in.v[j]));
      reinterpret_cast<Out*>(d)[q] = out;
    });
  const int64_t done = n4 * 4;
  if (done < n)
    for_each(n - done, [=] __device__(int64_t i) { d[done + i] = from_f<D>(to_acc(s[done + i])); });
}

// Whether a flat copy from src_dtype to dst_dtype has a convert_flat kernel; runs it if so.
bool try_convert_flat(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) {
  if (src_dtype == DType::f32 && dst_dtype == DType::bf16)
    return convert_flat<__nv_bfloat16, float>(dst, src, n), true;
  if (src_dtype == DType::f32 && dst_dtype == DType::f16)
    return convert_flat<__half, float>(dst, src, n), true;
  if (src_dtype == DType::bf16 && dst_dtype == DType::f32)
    return convert_flat<float, __nv_bfloat16>(dst, src, n), true;
  if (src_dtype == DType::f16 && dst_dtype == DType::f32)
    return convert_flat<float, __half>(dst, src, n), true;
  return false;
}

template <class U>
void fill_elements(void* dst, const Indexer& di, U bits, int64_t n) {
  U* d = static_cast<U*>(dst);
  if (is_flat(di))
    for_each(n, [=] __device__(int64_t i) { d[i] = bits; });
  else
    for_each(n, [=] __device__(int64_t i) { d[offset_of(di, i)] = bits; });
}

// The bit pattern of `value` stored as dtype, exactly as the CPU backend stores it.
uint64_t fill_bits(DType dtype, double value) {
  uint64_t bits = 0;
  switch (dtype) {
    case DType::f32: {
      const float f = static_cast<float>(value);
      std::memcpy(&bits, &f, 4);
      break;
    }
    case DType::f64:
      std::memcpy(&bits, &value, 8);
      break;
    case DType::f16:
      bits = float_to_half(static_cast<float>(value));
      break;
    case DType::bf16:
      bits = float_to_bfloat16(static_cast<float>(value));
      break;
    case DType::i64: {
      const int64_t v = static_cast<int64_t>(value);
      std::memcpy(&bits, &v, 8);
      break;
    }
    case DType::u8:
      bits = static_cast<uint8_t>(value);
      break;
  }
  return bits;
}

void check_ours(const Tensor& t, const char* what) {
  if (t.device().is_cuda() && t.device() != current_device())
    throw std::invalid_argument(std::string("copy: ") + what + " is on " + t.device().str() +
                                " but this process drives " + current_device().str());
}

// A device copy of dense host tensor `host` (same shape, dtype and strides) with the bytes moved in.
Tensor upload(const Tensor& host) {
  Tensor dev = empty(host.shape(), host.dtype(), dense_format(host));
  CUDA_CHECK(
      cudaMemcpyAsync(dev.raw_data(), host.raw_data(), host.nbytes(), cudaMemcpyHostToDevice, cuda_stream()));
  return dev;
}

void device_to_device(Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && same_layout(dst, src) && is_dense(dst)) {
    CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDeviceToDevice,
                               cuda_stream()));
    return;
  }
  launch_copy(dst.raw_data(), dst.dtype(), dst.strides(), src.raw_data(), src.dtype(), src.strides(),
              dst.shape());
}

}  // namespace

void launch_copy(void* dst, DType dst_dtype, const Shape& dst_strides, const void* src, DType src_dtype,
                 const Shape& src_strides, const Shape& shape_in) {
  Shape shape = shape_in;
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  std::vector<Shape> strides{dst_strides, src_strides};
  order_by_destination_strides(shape, strides);
  coalesce(shape, strides);
  if (dst_dtype == src_dtype && copy_in_16_byte_units(dst, src, dtype_size(dst_dtype), shape, strides))
    return;
  const Indexer di = make_indexer(shape, strides[0], "copy"), si = make_indexer(shape, strides[1], "copy");
  if (dst_dtype == src_dtype) {
    switch (dtype_size(dst_dtype)) {
      case 1:
        return copy_elements<uint8_t>(dst, di, src, si, n);
      case 2:
        return copy_elements<uint16_t>(dst, di, src, si, n);
      case 4:
        return copy_elements<uint32_t>(dst, di, src, si, n);
      case 8:
        return copy_elements<uint64_t>(dst, di, src, si, n);
    }
  }
  if (is_flat(di) && is_flat(si)) {
    if (try_convert_flat(dst, dst_dtype, src, src_dtype, n)) return;
    for_each(n, [=] __device__(int64_t i) { store_any(dst, dst_dtype, i, load_any(src, src_dtype, i)); });
  } else
    for_each(n, [=] __device__(int64_t i) {
      store_any(dst, dst_dtype, offset_of(di, i), load_any(src, src_dtype, offset_of(si, i)));
    });
}

}  // namespace cuda

void CudaBackend::copy(Tensor& dst, const Tensor& src) {
  using namespace cuda;
  if (dst.shape() != src.shape())
    throw std::invalid_argument("copy: shape " + shape_str(src.shape()) + " into " + shape_str(dst.shape()));
  check_ours(dst, "destination");
  check_ours(src, "source");
  if (dst.numel() == 0) return;
  const bool to_dev = dst.device().is_cuda(), from_dev = src.device().is_cuda();
  if (to_dev && from_dev) return device_to_device(dst, src);
  if (!to_dev && !from_dev) return cpu_backend().copy(dst, src);
  cudaStream_t stream = cuda_stream();
  if (to_dev) {
    // Bytes go over as they are (made dense on the host first when needed); the device converts.
    const Tensor host = is_dense(src) ? src : src.contiguous();
    if (host.dtype() == dst.dtype() && same_layout(host, dst) && is_dense(dst)) {
      CUDA_CHECK(
          cudaMemcpyAsync(dst.raw_data(), host.raw_data(), dst.nbytes(), cudaMemcpyHostToDevice, stream));
      return;
    }
    device_to_device(dst, upload(host));  // the staging buffer is freed stream-ordered
    return;
  }
  // Device -> host: convert and lay out on the device as dst wants, move the bytes, then wait.
  // Bytes of src can go over as they are when the dtype matches and src is dense, unless dst is
  // dense in another layout (then the device reorders them, not the host).
  Tensor staged = src;
  if (!(src.dtype() == dst.dtype() && is_dense(src) && (same_layout(src, dst) || !is_dense(dst)))) {
    staged = empty(src.shape(), dst.dtype(), is_dense(dst) ? dense_format(dst) : MemoryFormat::contiguous);
    device_to_device(staged, src);
  }
  if (is_dense(dst) && same_layout(staged, dst)) {
    CUDA_CHECK(
        cudaMemcpyAsync(dst.raw_data(), staged.raw_data(), dst.nbytes(), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  Tensor host = Tensor::empty(staged.shape(), staged.dtype(), Device::cpu(), dense_format(staged));
  CUDA_CHECK(
      cudaMemcpyAsync(host.raw_data(), staged.raw_data(), host.nbytes(), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  cpu_backend().copy(dst, host);
}

void CudaBackend::fill(Tensor& dst, double value) {
  using namespace cuda;
  check_device(dst, "fill", "destination");
  const int64_t n = dst.numel();
  if (n == 0) return;
  Shape shape = dst.shape();
  std::vector<Shape> strides{dst.strides()};
  order_by_destination_strides(shape, strides);
  coalesce(shape, strides);
  const Indexer di = make_indexer(shape, strides[0], "fill");
  const uint64_t bits = fill_bits(dst.dtype(), value);
  void* d = dst.raw_data();
  if (bits == 0 && is_flat(di)) {
    CUDA_CHECK(cudaMemsetAsync(d, 0, static_cast<size_t>(n) * dtype_size(dst.dtype()), cuda_stream()));
    return;
  }
  switch (dtype_size(dst.dtype())) {
    case 1:
      return fill_elements<uint8_t>(d, di, static_cast<uint8_t>(bits), n);
    case 2:
      return fill_elements<uint16_t>(d, di, static_cast<uint16_t>(bits), n);
    case 4:
      return fill_elements<uint32_t>(d, di, static_cast<uint32_t>(bits), n);
    case 8:
      return fill_elements<uint64_t>(d, di, bits, n);
  }
}

}  // namespace trainer

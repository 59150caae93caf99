// Copy between any layouts and dtypes on the host, and fill.
#include <cstring>

#include "nn/cpu/cpu_backend.h"
#include "nn/cpu/strided.h"

namespace trainer {
namespace {

double load(const void* base, int64_t i, DType dtype) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f64: return static_cast<const double*>(base)[i];
    case DType::f16: return half_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::bf16: return bfloat16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::i64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::u8: return static_cast<const uint8_t*>(base)[i];
  }
  return 0;
}

void store(void* base, int64_t i, DType dtype, double v) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::f64: static_cast<double*>(base)[i] = v; break;
    case DType::f16: static_cast<uint16_t*>(base)[i] = float_to_half(static_cast<float>(v)); break;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = float_to_bfloat16(static_cast<float>(v)); break;
    case DType::i64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    case DType::u8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); break;
  }
}

template <class T> void copy_same_dtype(Tensor& dst, const Tensor& src) {
  T* d = static_cast<T*>(dst.raw_data());
  const T* s = static_cast<const T*>(src.raw_data());
  cpu::for_each_index<2>(dst.shape(), {dst.strides(), src.strides()},
                         [&](int64_t od, int64_t os) { d[od] = s[os]; });
}

}  // namespace

void CpuBackend::copy(Tensor& dst, const Tensor& src) {
  if (!dst.device().is_cpu() || !src.device().is_cpu())
    throw std::runtime_error("CPU backend asked to copy a device tensor");
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype()) {
    const bool same_layout = dst.strides() == src.strides() || dst.numel() == 1;
    if (same_layout && (dst.is_contiguous() || dst.is_contiguous(MemoryFormat::channels_last))) {
      std::memmove(dst.raw_data(), src.raw_data(), dst.nbytes());
      return;
    }
    switch (dtype_size(dst.dtype())) {
      case 1: return copy_same_dtype<uint8_t>(dst, src);
      case 2: return copy_same_dtype<uint16_t>(dst, src);
      case 4: return copy_same_dtype<uint32_t>(dst, src);
      case 8: return copy_same_dtype<uint64_t>(dst, src);
    }
  }
  void* d = dst.raw_data();
  const void* s = src.raw_data();
  const DType dd = dst.dtype(), sd = src.dtype();
  cpu::for_each_index<2>(dst.shape(), {dst.strides(), src.strides()},
                         [&](int64_t od, int64_t os) { store(d, od, dd, load(s, os, sd)); });
}

void CpuBackend::fill(Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  void* d = dst.raw_data();
  const DType dtype = dst.dtype();
  if (dst.is_contiguous() || dst.is_contiguous(MemoryFormat::channels_last)) {
    if (dtype == DType::f32) {
      std::fill_n(static_cast<float*>(d), dst.numel(), static_cast<float>(value));
      return;
    }
    for (int64_t i = 0; i < dst.numel(); ++i) store(d, i, dtype, value);
    return;
  }
  cpu::for_each_index<1>(dst.shape(), {dst.strides()}, [&](int64_t o) { store(d, o, dtype, value); });
}

}  // namespace trainer

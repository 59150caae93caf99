#pragma once
// Element types a tensor can hold and the scalar conversions between them. f16/bf16 are stored as
// raw 16-bit patterns; the CPU computes in f32/f64 and only converts half types on copy.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace trainer {

enum class DType : uint8_t { f32, f64, f16, bf16, i64, u8 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
DType dtype_from_name(std::string_view name);  // throws on an unknown name
bool is_floating(DType dtype);
bool is_half(DType dtype);  // f16 or bf16
// The dtype statistics and reductions of `dtype` values are kept in: f32 for the half types (their
// 8- or 11-bit mantissas lose batch-norm means and variances), the dtype itself otherwise.
DType accumulate_dtype(DType dtype);

uint16_t float_to_half(float value);
float half_to_float(uint16_t bits);
uint16_t float_to_bfloat16(float value);  // round to nearest even, like PyTorch
float bfloat16_to_float(uint16_t bits);

// Maps a C++ type to its DType, for typed accessors such as Tensor::data<T>().
template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::u8;
};

}  // namespace trainer

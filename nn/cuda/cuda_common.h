#pragma once
// Host-side helpers shared by the CUDA backend's files: device checks, layout tests and the strided
// index descriptor that kernels receive by value. Plain C++ (no kernels), so .cpp files use it too.
#include <cstdint>
#include <string>
#include <vector>

#include "nn/cuda/cuda_backend.h"

namespace trainer::cuda {

// Most dims a strided kernel walks after coalescing (covers every tensor the trainer makes).
constexpr int kMaxDims = 8;

// Maps a linear (row-major) index over `size` to an element offset through `stride`. Trivially
// copyable: kernels take it by value.
struct Indexer {
  int nd = 0;
  int64_t size[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
};

// Drops size-1 dims and merges neighbouring dims that are contiguous in every one of `strides`
// (each the same length as shape), so that common layouts reach the kernels as one or two dims.
void coalesce(Shape& shape, std::vector<Shape>& strides);
// Reorders dims (the same permutation for shape and every stride list) from the largest stride of
// strides[0] to the smallest, for kernels where element order does not matter (copy, fill): a
// channels-last tensor then coalesces to one flat run instead of an offset division per element.
void order_by_destination_strides(Shape& shape, std::vector<Shape>& strides);
// An Indexer of shape/strides; throws when more than kMaxDims dims remain.
Indexer make_indexer(const Shape& shape, const Shape& strides, const char* op);
// Whether an Indexer walks memory contiguously from its base (so offset == index).
bool is_flat(const Indexer& ix);

Device current_device();  // Device::cuda(context device)
Tensor empty(const Shape& shape, DType dtype, MemoryFormat format = MemoryFormat::contiguous);

// Throws unless t is defined and on this process's GPU.
void check_device(const Tensor& t, const char* op, const char* name);
// Throws unless dtype is f32, f64, f16 or bf16.
void check_floating(DType dtype, const char* op);
// Throws unless a and b have the same dtype.
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op);

// Whether t covers numel() consecutive elements in the contiguous or the channels-last order.
bool is_dense(const Tensor& t);
// The dense format t is in (channels_last only for a 4-D NHWC tensor that is not also NCHW).
MemoryFormat dense_format(const Tensor& t);
// Same strides on every dim of size > 1.
bool same_layout(const Tensor& a, const Tensor& b);

// Blocks for a grid-stride loop over n items.
unsigned grid_size(int64_t n, int threads);

// Strided copy with dtype conversion, on the compute stream: dst[i] = src[i] for i over shape.
void launch_copy(void* dst, DType dst_dtype, const Shape& dst_strides, const void* src, DType src_dtype,
                 const Shape& src_strides, const Shape& shape);

// y[n, c, ...] += bias[c] in place; y dense (NCHW or NHWC), bias [C] of y's dtype.
void add_channel_bias(Tensor& y, const Tensor& bias);

}  // namespace trainer::cuda

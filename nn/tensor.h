#pragma once
// A tensor is a handle to shared storage plus shape, strides (in elements), offset, dtype and device.
// Copying a Tensor copies the handle; views (reshape of a contiguous tensor, permute, slice) share
// storage. It knows nothing of autograd: Variable (nn/autograd/variable.h) adds that.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "nn/device.h"
#include "nn/dtype.h"
#include "nn/storage.h"

namespace trainer {

using Shape = std::vector<int64_t>;

enum class MemoryFormat : uint8_t { contiguous, channels_last };

std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
// Strides of a 4-D [N, C, H, W] tensor laid out as NHWC in memory.
Shape channels_last_strides(const Shape& shape);
// Numpy broadcasting: the shape of a op b; throws std::invalid_argument when they do not broadcast.
Shape broadcast_shape(const Shape& a, const Shape& b);

class Tensor {
 public:
  Tensor() = default;  // undefined; defined() is false

  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu(),
                      MemoryFormat format = MemoryFormat::contiguous);
  // A contiguous host tensor whose storage comes from `allocator` instead of the CPU default: page-locked
  // memory lets the GPU copy from it asynchronously (data/device_prefetcher.h).
  static Tensor empty_from(Allocator& allocator, const Shape& shape, DType dtype);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = DType::f32, Device device = Device::cpu());
  // Copies host values into a new tensor of the given shape (element count must match).
  template <class T> static Tensor from_vector(const std::vector<T>& values, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t size(int dim) const;  // negative dims count from the end
  int64_t stride(int dim) const;
  int dim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int64_t offset() const { return offset_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  bool is_contiguous(MemoryFormat format = MemoryFormat::contiguous) const;
  MemoryFormat suggest_memory_format() const;

  // Typed pointer to the first element; checks the dtype matches T.
  template <class T> T* data() const;
  void* raw_data() const;

  // Copies into fresh storage unless already laid out in `format`.
  Tensor contiguous(MemoryFormat format = MemoryFormat::contiguous) const;
  // A view when the layout allows it, a contiguous copy otherwise. One dim may be -1.
  Tensor reshape(const Shape& shape) const;
  Tensor view(const Shape& shape) const;  // like reshape but throws instead of copying
  Tensor permute(const std::vector<int>& order) const;
  Tensor slice(int dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor squeeze(int dim) const;
  Tensor unsqueeze(int dim) const;
  Tensor clone(MemoryFormat format = MemoryFormat::contiguous) const;
  Tensor to(DType dtype) const;   // a copy converted to dtype (this tensor when already dtype)
  Tensor to(Device device) const;  // a copy on device (this tensor when already there)

  // In-place: copies src (same shape, any layout/dtype/device) into this tensor.
  void copy_(const Tensor& src);
  void fill_(double value);
  void zero_() { fill_(0.0); }

  double item() const;  // the value of a one-element tensor
  template <class T> std::vector<T> to_vector() const;  // contiguous host copy converted to T
  std::string str() const;  // short description: shape, dtype, device

  bool same_storage(const Tensor& other) const { return storage_ == other.storage_; }

 private:
  Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype);
  Tensor with_layout(Shape shape, Shape strides, int64_t offset) const;

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  Device device_;
};

}  // namespace trainer

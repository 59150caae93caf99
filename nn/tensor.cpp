#include "nn/tensor.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "nn/backend.h"

namespace trainer {

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

int64_t shape_numel(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

Shape channels_last_strides(const Shape& shape) {
  if (shape.size() != 4)
    throw std::invalid_argument("channels_last needs a 4-D shape, got " + shape_str(shape));
  const int64_t c = std::max<int64_t>(shape[1], 1), h = std::max<int64_t>(shape[2], 1),
                w = std::max<int64_t>(shape[3], 1);
  return {h * w * c, 1, w * c, c};
}

Shape broadcast_shape(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw std::invalid_argument("cannot broadcast " + shape_str(a) + " with " + shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype)
    : storage_(std::move(storage)),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset),
      numel_(shape_numel(shape_)),
      dtype_(dtype),
      device_(storage_->device()) {}

Tensor Tensor::with_layout(Shape shape, Shape strides, int64_t offset) const {
  return Tensor(storage_, std::move(shape), std::move(strides), offset, dtype_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemoryFormat format) {
  for (int64_t d : shape)
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_str(shape));
  auto storage =
      std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  Shape strides =
      format == MemoryFormat::channels_last ? channels_last_strides(shape) : contiguous_strides(shape);
  return Tensor(std::move(storage), shape, std::move(strides), 0, dtype);
}

Tensor Tensor::empty_from(Allocator& allocator, const Shape& shape, DType dtype) {
  for (int64_t d : shape)
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_str(shape));
  auto storage = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype),
                                           Device::cpu(), allocator);
  return Tensor(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}
Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor Tensor::scalar(double value, DType dtype, Device device) { return full({}, value, dtype, device); }

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  if (static_cast<int64_t>(values.size()) != shape_numel(shape))
    throw std::invalid_argument("from_vector: " + std::to_string(values.size()) + " values for shape " +
                                shape_str(shape));
  Tensor t = empty(shape, DTypeOf<T>::value);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  return t;
}
template Tensor Tensor::from_vector(const std::vector<float>&, const Shape&);
template Tensor Tensor::from_vector(const std::vector<double>&, const Shape&);
template Tensor Tensor::from_vector(const std::vector<int64_t>&, const Shape&);
template Tensor Tensor::from_vector(const std::vector<uint8_t>&, const Shape&);

int64_t Tensor::size(int dim) const {
  const int d = dim < 0 ? dim + this->dim() : dim;
  if (d < 0 || d >= this->dim())
    throw std::out_of_range("dim " + std::to_string(dim) + " out of range for shape " + shape_str(shape_));
  return shape_[d];
}

int64_t Tensor::stride(int dim) const {
  const int d = dim < 0 ? dim + this->dim() : dim;
  if (d < 0 || d >= this->dim()) throw std::out_of_range("dim out of range");
  return strides_[d];
}

bool Tensor::is_contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::channels_last && dim() != 4) return false;
  const Shape expected =
      format == MemoryFormat::channels_last ? channels_last_strides(shape_) : contiguous_strides(shape_);
  for (int i = 0; i < dim(); ++i)
    if (shape_[i] != 1 && strides_[i] != expected[i]) return false;
  return true;
}

MemoryFormat Tensor::suggest_memory_format() const {
  if (dim() != 4 || !is_contiguous(MemoryFormat::channels_last)) return MemoryFormat::contiguous;
  if (!is_contiguous()) return MemoryFormat::channels_last;
  // Both formats give the same memory order (a dimension of size 1, e.g. a one-channel image batch).
  // The strides of the size-1 dimensions then say which one the tensor was made in, as in PyTorch:
  // otherwise a grey-scale batch asked for channels-last would run the whole network in NCHW.
  const Shape cl = channels_last_strides(shape_);
  return strides_ == cl && cl != contiguous_strides(shape_) ? MemoryFormat::channels_last
                                                            : MemoryFormat::contiguous;
}

void* Tensor::raw_data() const {
  if (!storage_) throw std::logic_error("access to an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

template <class T>
T* Tensor::data() const {
  if (dtype_ != DTypeOf<T>::value)
    throw std::invalid_argument("data<" + std::string(dtype_name(DTypeOf<T>::value)) + ">() on a " +
                                std::string(dtype_name(dtype_)) + " tensor");
  return static_cast<T*>(raw_data());
}
template float* Tensor::data() const;
template double* Tensor::data() const;
template int64_t* Tensor::data() const;
template uint8_t* Tensor::data() const;

Tensor Tensor::contiguous(MemoryFormat format) const {
  if (!is_contiguous(format)) return clone(format);
  // Same memory order in both formats: restride the size-1 dimensions (no copy) so the result also
  // says which format it was asked for (see suggest_memory_format).
  if (dim() == 4 && suggest_memory_format() != format)
    return with_layout(
        shape_,
        format == MemoryFormat::channels_last ? channels_last_strides(shape_) : contiguous_strides(shape_),
        offset_);
  return *this;
}

Tensor Tensor::clone(MemoryFormat format) const {
  Tensor out = empty(shape_, dtype_, device_, format);
  out.copy_(*this);
  return out;
}

Tensor Tensor::view(const Shape& requested) const {
  Shape shape = requested;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw std::invalid_argument("reshape: more than one -1 in " + shape_str(requested));
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) shape[infer] = known == 0 ? 0 : numel_ / known;
  if (shape_numel(shape) != numel_)
    throw std::invalid_argument("reshape: cannot view " + shape_str(shape_) + " as " + shape_str(requested));
  if (!is_contiguous()) throw std::invalid_argument("view: tensor is not contiguous");
  return with_layout(shape, contiguous_strides(shape), offset_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  return (is_contiguous() ? *this : contiguous()).view(shape);
}

Tensor Tensor::permute(const std::vector<int>& order) const {
  if (static_cast<int>(order.size()) != dim()) throw std::invalid_argument("permute: wrong number of dims");
  Shape shape(order.size()), strides(order.size());
  std::vector<bool> seen(order.size(), false);
  for (size_t i = 0; i < order.size(); ++i) {
    const int d = order[i] < 0 ? order[i] + dim() : order[i];
    if (d < 0 || d >= dim() || seen[d]) throw std::invalid_argument("permute: invalid order");
    seen[d] = true;
    shape[i] = shape_[d];
    strides[i] = strides_[d];
  }
  return with_layout(shape, strides, offset_);
}

Tensor Tensor::slice(int dim, int64_t start, int64_t end, int64_t step) const {
  const int d = dim < 0 ? dim + this->dim() : dim;
  if (d < 0 || d >= this->dim() || step <= 0) throw std::invalid_argument("slice: invalid dim or step");
  const int64_t n = shape_[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = shape_, strides = strides_;
  shape[d] = (end - start + step - 1) / step;
  strides[d] = strides_[d] * step;
  return with_layout(shape, strides, offset_ + start * strides_[d]);
}

Tensor Tensor::squeeze(int dim) const {
  const int d = dim < 0 ? dim + this->dim() : dim;
  if (size(d) != 1) throw std::invalid_argument("squeeze: dim is not of size 1");
  Shape shape = shape_, strides = strides_;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return with_layout(shape, strides, offset_);
}

Tensor Tensor::unsqueeze(int dim) const {
  const int d = dim < 0 ? dim + this->dim() + 1 : dim;
  if (d < 0 || d > this->dim()) throw std::invalid_argument("unsqueeze: dim out of range");
  Shape shape = shape_, strides = strides_;
  const int64_t s = d < this->dim() ? strides_[d] * shape_[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, s);
  return with_layout(shape, strides, offset_);
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = empty(shape_, dtype, device_, suggest_memory_format());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device device) const {
  if (device == device_) return *this;
  Tensor out = empty(shape_, dtype_, device, suggest_memory_format());
  out.copy_(*this);
  return out;
}

void Tensor::copy_(const Tensor& src) {
  if (src.shape_ != shape_)
    throw std::invalid_argument("copy_: shape " + shape_str(src.shape_) + " into " + shape_str(shape_));
  // A device backend handles every copy that touches its device, including host <-> device.
  backend_for(device_.is_cpu() ? src.device_ : device_).copy(*this, src);
}

void Tensor::fill_(double value) { backend_for(device_).fill(*this, value); }

double Tensor::item() const {
  if (numel_ != 1) throw std::invalid_argument("item() on a tensor of shape " + shape_str(shape_));
  return to(Device::cpu()).to_vector<double>()[0];
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = to(Device::cpu()).to(DTypeOf<T>::value).contiguous();
  const T* p = host.data<T>();
  return std::vector<T>(p, p + numel_);
}
template std::vector<float> Tensor::to_vector() const;
template std::vector<double> Tensor::to_vector() const;
template std::vector<int64_t> Tensor::to_vector() const;
template std::vector<uint8_t> Tensor::to_vector() const;

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor(" + shape_str(shape_) + ", " + std::string(dtype_name(dtype_)) + ", " + device_.str() + ")";
}

}  // namespace trainer

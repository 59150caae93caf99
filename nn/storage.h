#pragma once
// A reference-counted block of memory on one device. Tensors are views into a Storage.
#include <cstddef>
#include <memory>

#include "nn/allocator.h"

namespace trainer {

class Storage {
 public:
  Storage(size_t nbytes, Device device)
      : nbytes_(nbytes), device_(device), allocator_(&allocator_for(device)),
        data_(allocator_->allocate(nbytes)) {}
  // Memory from a given allocator rather than the device's default (pinned host memory, say).
  Storage(size_t nbytes, Device device, Allocator& allocator)
      : nbytes_(nbytes), device_(device), allocator_(&allocator), data_(allocator_->allocate(nbytes)) {}
  ~Storage() { allocator_->deallocate(data_, nbytes_); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  size_t nbytes_;
  Device device_;
  Allocator* allocator_;
  void* data_;
};

}  // namespace trainer

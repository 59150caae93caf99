#pragma once
// Activations already reordered into a oneDNN convolution's blocked layout (nChw16c), kept from the
// call that made them for a later call that needs the same tensor in the same layout, so that
// reorder is not run twice. On resnet18-cifar the reorders cost about as much as a third of the
// convolutions themselves (DNNL_VERBOSE, bench/results/2026-12-03_cpu2_resnet18_levers.txt), and two
// of them repeat work done earlier in the same step:
//   - the weight gradient reorders the layer's input x again, which the forward already did;
//   - the weight gradient reorders grad_y again, which the data gradient did just before.
//
// A copy is found again by the identity of its source (the same storage, offset, shape and strides)
// and the layout, never by address alone: the cache holds only a weak reference to the source's
// storage, and an entry whose storage was freed is dead, so a new tensor at a reused address never
// matches. What identity cannot see is a source written in place between the two calls; the
// convolution's callers never do that (autograd's saved x and grad_y are read-only between the
// forward and the backward, as they must be for the im2col path too), and the tests in
// tests/nn/dnnl_conv_test.cpp check that a new forward after an in-place change replaces the copy.
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "nn/tensor.h"

namespace trainer {

class BlockedCopies {
 public:
  // Keeps `blocked`, the values of `source` in layout `desc`, for a later take(); replaces any copy
  // of the same source. Entries whose source has been freed are dropped here.
  void keep(const Tensor& source, const dnnl::memory::desc& desc, Tensor blocked);
  // The copy of `source` in layout `desc`, handed over and forgotten; undefined when none is kept.
  Tensor take(const Tensor& source, const dnnl::memory::desc& desc);
  // Drops every copy of `source` (a call that read it without keeping a copy: what an older call
  // kept may predate an in-place write).
  void forget(const Tensor& source);
  void clear() { entries_.clear(); }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::weak_ptr<Storage> storage;  // weak: a kept copy must not keep the activation alive
    const Storage* address;          // valid for comparison while `storage` has not expired
    int64_t offset;
    Shape shape, strides;
    dnnl::memory::desc desc;
    Tensor blocked;
  };
  bool matches(const Entry& e, const Tensor& source) const;
  std::vector<Entry> entries_;
};

}  // namespace trainer

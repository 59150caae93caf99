#include "nn/cpu/dnnl_blocked_copies.h"

#include <algorithm>

namespace trainer {

bool BlockedCopies::matches(const Entry& e, const Tensor& source) const {
  return !e.storage.expired() && e.address == source.storage().get() && e.offset == source.offset() &&
         e.shape == source.shape() && e.strides == source.strides();
}

void BlockedCopies::keep(const Tensor& source, const dnnl::memory::desc& desc, Tensor blocked) {
  std::erase_if(entries_, [&](const Entry& e) { return e.storage.expired() || matches(e, source); });
  entries_.push_back({source.storage(), source.storage().get(), source.offset(), source.shape(),
                      source.strides(), desc, std::move(blocked)});
}

void BlockedCopies::forget(const Tensor& source) {
  std::erase_if(entries_, [&](const Entry& e) { return e.storage.expired() || matches(e, source); });
}

Tensor BlockedCopies::take(const Tensor& source, const dnnl::memory::desc& desc) {
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return matches(e, source) && e.desc == desc; });
  if (it == entries_.end()) return {};
  Tensor blocked = std::move(it->blocked);
  entries_.erase(it);
  return blocked;
}

}  // namespace trainer

#include "nn/channel_layout.h"

#include <stdexcept>
#include <string>

namespace trainer {

ChannelLayout channel_layout(const Tensor& x, const char* op) {
  if (x.dim() < 2)
    throw std::invalid_argument(std::string(op) + ": input must be [N, C, ...], got shape " +
                                shape_str(x.shape()));
  ChannelLayout l;
  l.channels = x.size(1);
  if (x.suggest_memory_format() == MemoryFormat::channels_last) {
    l.format = MemoryFormat::channels_last;
    l.outer = x.size(0) * x.size(2) * x.size(3);
  } else {
    l.outer = x.size(0);
    for (int d = 2; d < x.dim(); ++d) l.inner *= x.size(d);
  }
  return l;
}

}  // namespace trainer

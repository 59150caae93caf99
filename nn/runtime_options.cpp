// The backend options' one log line, the same in every build.
#include <string>

#include "nn/runtime.h"

namespace trainer::runtime {

std::string describe_backend_options(const BackendOptions& o) {
  const auto on_off = [](bool on) { return on ? "on" : "off"; };
  std::string line =
      std::string("tf32 ") + on_off(o.allow_tf32) + ", deterministic " + on_off(o.deterministic) +
      ", cuDNN fusion " + (o.conv_stats_fusion ? "where faster" : "off") + ", cuDNN batch norm " +
      (o.cudnn_batch_norm ? (o.cudnn_batch_norm_forward ? "on (forward where faster)" : "on (backward)")
                          : "off") +
      ", fused attention " + on_off(o.fused_attention);
  if (o.force_conv_stats_fusion || o.force_cudnn_batch_norm_forward || o.force_im2col_conv)
    line += std::string(", forced (tests):") + (o.force_conv_stats_fusion ? " fusion" : "") +
            (o.force_cudnn_batch_norm_forward ? " cudnn-bn-forward" : "") +
            (o.force_im2col_conv ? " im2col" : "");
  return line;
}

}  // namespace trainer::runtime

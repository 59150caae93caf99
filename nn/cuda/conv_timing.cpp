#include "nn/cuda/conv_timing.h"

namespace trainer::cudnn_conv {

int choose_timed(const std::vector<Timed>& t) {
  if (t.empty()) return -1;
  float best = std::numeric_limits<float>::infinity();
  for (const Timed& c : t) best = std::min(best, c.ms);
  int pick = -1;
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i].ms <= best * kWorkspaceSlack && (pick < 0 || t[i].workspace < t[pick].workspace))
      pick = static_cast<int>(i);
  return t[pick].index;
}

}  // namespace trainer::cudnn_conv

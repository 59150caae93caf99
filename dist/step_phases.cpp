#include "dist/step_phases.h"

namespace trainer {

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::data_wait:
      return "data_wait";
    case Phase::h2d:
      return "h2d";
    case Phase::forward:
      return "forward";
    case Phase::backward:
      return "backward";
    case Phase::allreduce_exposed:
      return "allreduce_exposed";
    case Phase::optimizer:
      return "optimizer";
    case Phase::graph:
      return "graph";
    case Phase::allreduce_total:
      return "allreduce_total";
    case Phase::step:
      return "step";
    case Phase::other:
      return "other";
  }
  return "unknown";
}

}  // namespace trainer

#include "nn/cuda/cudnn_switches.h"

#include <cstdlib>
#include <string>

namespace trainer {
namespace {

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::string(v) == value;
}

CudnnSwitches read_switches() {
  CudnnSwitches s;
  if (env_is("TRAINER_CUDNN_API", "legacy")) s.api = CudnnSwitches::Api::legacy;
  if (env_is("TRAINER_CUDNN_API", "graph")) s.api = CudnnSwitches::Api::graph;
  s.runtime_compiled_engines = env_is("TRAINER_CUDNN_RTC", "1");
  s.debug = env_is("TRAINER_CUDNN_DEBUG", "1");
  s.single_call_timing = env_is("TRAINER_CUDNN_TIMING", "single");
  return s;
}

}  // namespace

const CudnnSwitches& cudnn_switches() {
  static const CudnnSwitches switches = read_switches();
  return switches;
}

}  // namespace trainer

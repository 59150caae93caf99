#pragma once
// What this binary was built with, for start-up logs, bench records and the cross-rank build check.
#include <string>

namespace trainer {

struct BuildInfo {
  std::string version;
  bool cuda = false;
  std::string compiler;
};

BuildInfo build_info();

}  // namespace trainer

#pragma once
// printf-style formatting into a std::string, for short messages, numbers and paths (at most 511
// characters; longer results are cut).
#include <cstdio>
#include <string>

namespace trainer {

std::string fmt(const char* format, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

}  // namespace trainer

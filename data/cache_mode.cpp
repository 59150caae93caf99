#include "data/cache_mode.h"

#include <stdexcept>

namespace trainer {

CacheMode parse_cache_mode(const std::string& value) {
  if (value == "none") return CacheMode::none;
  if (value == "encoded") return CacheMode::encoded;
  if (value == "decoded") return CacheMode::decoded;
  throw std::invalid_argument("data.cache must be \"none\", \"encoded\" or \"decoded\", not \"" + value +
                              "\"");
}

const char* to_string(CacheMode mode) {
  switch (mode) {
    case CacheMode::encoded:
      return "encoded";
    case CacheMode::decoded:
      return "decoded";
    case CacheMode::none:
      break;
  }
  return "none";
}

}  // namespace trainer

#pragma once
// data.cache, parsed once: what an image folder keeps in memory after a file's first good read.
#include <string>

namespace trainer {

enum class CacheMode {
  none,
  encoded,  // the file's bytes as stored (JPEG/PNG): every epoch still decodes
  decoded,  // its pixels, downscaled to a bound (data/decoded_cache.h): later epochs only crop and resize
};

// "none" | "encoded" | "decoded"; throws std::invalid_argument naming the value otherwise.
CacheMode parse_cache_mode(const std::string& value);
const char* to_string(CacheMode mode);

}  // namespace trainer

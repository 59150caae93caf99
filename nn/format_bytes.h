#pragma once
// One way to write a size in messages, for every folder (the communicators' tensor sizes, the host
// limits' memory figures): 1536 -> "1.5 KiB", 16 -> "16 B", 3 << 30 -> "3.0 GiB".
#include <string>

namespace trainer {

std::string format_bytes(double bytes);

}  // namespace trainer

#pragma once
// Small, portable hashes. FNV-1a fingerprints dataset contents so ranks can check they read the same
// bytes; splitmix64 turns (seed, epoch, index) tuples into independent generator seeds, so random
// streams never depend on which thread or in which order samples are produced.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace trainer {

inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;

// The two have different names because, as overloads, fnv1a64("text", hash) chose the bytes one (a
// string literal converts to const void* more readily than to string_view) and read `hash` bytes.
inline uint64_t fnv1a64_bytes(const void* data, size_t size, uint64_t hash = kFnv1a64Offset) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ull;
  }
  return hash;
}

inline uint64_t fnv1a64_text(std::string_view text, uint64_t hash = kFnv1a64Offset) {
  return fnv1a64_bytes(text.data(), text.size(), hash);
}

// The splitmix64 finaliser: a bijection on 64-bit values with good avalanche.
inline constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Mixes values in order: mix_seed(a, b) != mix_seed(b, a), and (seed 1, epoch 0) does not collide
// with (seed 0, epoch 1) as seed + epoch would.
inline constexpr uint64_t mix_seed(uint64_t a, uint64_t b) { return splitmix64(splitmix64(a) ^ b); }
inline constexpr uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c) { return mix_seed(mix_seed(a, b), c); }

}  // namespace trainer

#include "data/hash.h"

#include <gtest/gtest.h>

#include <cstring>

namespace trainer {
namespace {

// fnv1a64_text and fnv1a64_bytes have different names so that a string literal with a running hash can
// only mean the text (issue 30: as overloads, the literal picked the bytes one and read `hash` bytes).
TEST(Hash, TextAndBytesHashTheSameCharacters) {
  EXPECT_EQ(fnv1a64_text(""), kFnv1a64Offset);
  EXPECT_EQ(fnv1a64_text("a"), 0xaf63dc4c8601ec8cull);  // the published FNV-1a 64 test vector
  const uint64_t running = fnv1a64_text("prefix");
  EXPECT_EQ(fnv1a64_text("<unreadable>", running),
            fnv1a64_bytes("<unreadable>", std::strlen("<unreadable>"), running));
  EXPECT_NE(fnv1a64_text("<unreadable>", running), fnv1a64_text("<unreadable>"));
}

}  // namespace
}  // namespace trainer

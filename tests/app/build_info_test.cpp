// The build line every rank compares at start-up: a CUDA build also names the versions this host
// loads at run time (driver, CUDA runtime, cuDNN, NCCL), which the seed guides say must match across
// nodes and which the headers' versions alone cannot show; a CPU-only build says so.
#include "app/common/build_info.h"

#include <gtest/gtest.h>

#include <string>

namespace trainer {
namespace {

TEST(TrainerBuild, NamesTheLibrariesThisHostLoads) {
  const TrainerBuild b = trainer_build();
  const std::string s = b.str();
  EXPECT_EQ(s.rfind("trainer " + b.version + " (" + b.revision + ", ", 0), 0u) << s;
  if (!b.cuda) {
    EXPECT_NE(s.find("CPU only"), std::string::npos) << s;
    EXPECT_TRUE(b.loaded.empty()) << b.loaded;
    return;
  }
  for (const char* part : {"; loaded: driver ", ", runtime ", ", cuDNN ", ", NCCL "})
    EXPECT_NE(s.find(part), std::string::npos) << part << " in " << s;
  // Decoded as "major.minor.patch" with the headers' major version (a newer minor may be loaded).
  auto major = [](const std::string& v) { return v.substr(0, v.find('.') + 1); };
  EXPECT_NE(b.loaded.find("cuDNN " + major(b.cudnn_version)), std::string::npos) << b.loaded;
  EXPECT_NE(b.loaded.find("NCCL " + major(b.nccl_version)), std::string::npos) << b.loaded;
}

// The build names the commit it was built from (12 hex digits, then "+dirty.<8 hex>" for uncommitted
// changes), so nodes built from different sources differ in the start-up check even when their version
// numbers agree. This test's binary is built from the same tree as the one it checks.
TEST(TrainerBuild, NamesTheSourceRevision) {
  const std::string r = trainer_build().revision;
  if (r == "unknown") GTEST_SKIP() << "built outside a git checkout";
  ASSERT_GE(r.size(), 12u) << r;
  EXPECT_EQ(r.find_first_not_of("0123456789abcdef"), r.size() > 12 ? 12u : std::string::npos) << r;
  if (r.size() > 12) {
    EXPECT_EQ(r.substr(12, 7), "+dirty.") << r;
    EXPECT_EQ(r.size(), 12u + 7u + 8u) << r;
  }
}

}  // namespace
}  // namespace trainer

// The build line every rank compares at start-up: a CUDA build also names the versions this host
// loads at run time (driver, CUDA runtime, cuDNN, NCCL), which the seed guides say must match across
// nodes and which the headers' versions alone cannot show; a CPU-only build says so.
#include "app/build_info.h"

#include <gtest/gtest.h>

#include <string>

namespace trainer {
namespace {

TEST(TrainerBuild, NamesTheLibrariesThisHostLoads) {
  const TrainerBuild b = trainer_build();
  const std::string s = b.str();
  EXPECT_EQ(s.rfind("trainer " + b.version + " (", 0), 0u) << s;
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

}  // namespace
}  // namespace trainer

// dist.nccl_debug and dist.socket_ifname reach NCCL as NCCL_DEBUG and NCCL_SOCKET_IFNAME (the seed
// guides' "turn on NCCL's logs" and "NCCL picks the wrong network interface"), set before the
// communicator exists; empty keys leave what the user exported alone.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "app/config/config.h"
#include "app/train/run_start.h"
#include "app/trainer_process.h"

namespace trainer {
namespace {

using trainer::testing::ScopedEnv;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "<unset>";
}

TEST(NcclSettings, ConfigKeysBecomeNcclsEnvironmentAndEmptyKeysLeaveItAlone) {
  ScopedEnv debug("NCCL_DEBUG"), ifname("NCCL_SOCKET_IFNAME");
  ::setenv("NCCL_DEBUG", "WARN", 1);
  ::setenv("NCCL_SOCKET_IFNAME", "eth9", 1);
  Config c;  // both keys empty by default
  export_nccl_settings(c);
  EXPECT_EQ(env("NCCL_DEBUG"), "WARN");
  EXPECT_EQ(env("NCCL_SOCKET_IFNAME"), "eth9");
  c.dist.nccl_debug = "INFO";
  c.dist.socket_ifname = "ib0";
  export_nccl_settings(c);
  EXPECT_EQ(env("NCCL_DEBUG"), "INFO");
  EXPECT_EQ(env("NCCL_SOCKET_IFNAME"), "ib0");
}

}  // namespace
}  // namespace trainer

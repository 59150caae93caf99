// data.workers against a node's cores: the default shares them between the node's ranks, and an
// explicit count that would start more loader threads than the node has cores is warned about (the
// seed guides' pitfall: "the total worker count balloons and exhausts the CPU's memory").
#include "app/loader_workers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "app/run_start.h"
#include "app/trainer_process.h"

namespace trainer {
namespace {

// LOCAL_WORLD_SIZE set to n for a scope.
struct LocalWorldSize : trainer::testing::ScopedEnv {
  explicit LocalWorldSize(unsigned n) : ScopedEnv("LOCAL_WORLD_SIZE", std::to_string(n)) {}
};

TEST(LoaderWorkers, TheDefaultSharesTheCoresBetweenTheNodesRanks) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  {
    const LocalWorldSize one(1);
    EXPECT_EQ(default_loader_workers(), static_cast<int>(std::max(1u, cores / 2)));
  }
  {
    const LocalWorldSize four(4);
    EXPECT_EQ(default_loader_workers(), static_cast<int>(std::max(1u, cores / 4 / 2)));
  }
  const LocalWorldSize per_core(cores);  // a rank per core still gets one loader thread
  EXPECT_EQ(default_loader_workers(), 1);
}

TEST(LoaderWorkers, AnExplicitCountAboveTheCoresIsWarnedAbout) {
  EXPECT_EQ(loader_workers_warning(-1, 8, 16), "");  // the default
  EXPECT_EQ(loader_workers_warning(2, 8, 16), "");   // 16 threads for 16 cores
  const std::string w = loader_workers_warning(8, 8, 16);
  EXPECT_NE(w.find("data.workers = 8 on each of this node's 8 ranks starts 64 loader threads for 16 cores"),
            std::string::npos)
      << w;
  EXPECT_NE(w.find("HINT: set data.workers = -1"), std::string::npos) << w;
  EXPECT_NE(loader_workers_warning(4, 1, 2), "");  // one rank can oversubscribe too
}

}  // namespace
}  // namespace trainer

// data.workers against a node's cores: the default shares them between the node's ranks, and an
// explicit count that would start more loader threads than the node has cores is warned about (the
// seed guides' pitfall: "the total worker count balloons and exhausts the CPU's memory").
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "app/run_start.h"
#include "app/train_loop.h"

namespace trainer {
namespace {

// Sets LOCAL_WORLD_SIZE for a scope and puts back what was there.
class LocalWorldSize {
 public:
  explicit LocalWorldSize(unsigned n) {
    if (const char* v = std::getenv("LOCAL_WORLD_SIZE")) old_ = v;
    ::setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
  }
  ~LocalWorldSize() {
    if (old_)
      ::setenv("LOCAL_WORLD_SIZE", old_->c_str(), 1);
    else
      ::unsetenv("LOCAL_WORLD_SIZE");
  }

 private:
  std::optional<std::string> old_;
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

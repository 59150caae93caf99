// data.workers against a node's cores: the default shares them between the node's ranks (less the
// training thread on a GPU rank, half on a CPU rank), and an
// explicit count that would start more loader threads than the node has cores is warned about (the
// seed guides' pitfall: "the total worker count balloons and exhausts the CPU's memory").
#include "app/run/loader_workers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "app/train/run_start.h"

namespace trainer {
namespace {

TEST(LoaderWorkers, ACpuRankTakesHalfItsShareOfTheNodesCores) {
  EXPECT_EQ(default_loader_workers(false, 1, 16), 8);  // the other half is the math library's
  EXPECT_EQ(default_loader_workers(false, 4, 16), 2);
  EXPECT_EQ(default_loader_workers(false, 16, 16), 1);  // a rank per core still gets one loader thread
  EXPECT_EQ(default_loader_workers(false, 1, 1), 1);
}

TEST(LoaderWorkers, AGpuRankTakesItsShareLessTheTrainingThread) {
  // Issue 24: one H200 with 16 cores fed 2.8k img/s with 8 loader threads, 68% of each step waiting.
  EXPECT_EQ(default_loader_workers(true, 1, 16), 15);
  EXPECT_EQ(default_loader_workers(true, 8, 128), 15);
  EXPECT_EQ(default_loader_workers(true, 8, 16), 1);
  EXPECT_EQ(default_loader_workers(true, 16, 16), 1);  // never zero
  EXPECT_EQ(default_loader_workers(true, 1, 1), 1);
}

TEST(LoaderWorkers, TheConfigChoosesByTrainDeviceAndLocalWorldSize) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  Config cpu;
  cpu.train.device = DeviceChoice::cpu;
  Config gpu;
  gpu.train.device = DeviceChoice::cuda;
  EXPECT_EQ(default_loader_workers(cpu, 1), static_cast<int>(std::max(1u, cores / 2)));
  EXPECT_EQ(default_loader_workers(gpu, 1), std::max(1, static_cast<int>(cores) - 1));
  const int per_core = static_cast<int>(cores);  // a rank per core still gets one loader thread
  EXPECT_EQ(default_loader_workers(cpu, per_core), 1);
  EXPECT_EQ(default_loader_workers(gpu, per_core), 1);
}

TEST(LoaderWorkers, TheLogLineSaysHowManyAndWhy) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  Config gpu;
  gpu.train.device = DeviceChoice::cuda;
  const std::string g = loader_workers_reason(gpu, 2);
  EXPECT_NE(g.find(std::to_string(default_loader_workers(true, 2, cores)) + " worker threads per rank"),
            std::string::npos)
      << g;
  EXPECT_NE(g.find(std::to_string(cores) + " cores / 2 ranks on this node, less 1 for the training thread"),
            std::string::npos)
      << g;
  Config cpu;
  cpu.train.device = DeviceChoice::cpu;
  EXPECT_NE(loader_workers_reason(cpu, 2).find("halved for the CPU math library"), std::string::npos);
  cpu.data.workers = 3;
  EXPECT_NE(loader_workers_reason(cpu, 2).find("3 worker threads per rank (data.workers;"), std::string::npos)
      << loader_workers_reason(cpu, 2);
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

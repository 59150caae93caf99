#include "dist/process_group.h"

#include <gtest/gtest.h>

#include "dist/consistency.h"
#include "dist/error.h"
#include "dist/gradient_reducer.h"
#include "multi_process.h"

namespace trainer {
namespace {

using namespace testing;

EnvMap torchrun_env(int rank, int world, int port) {
  return {{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"},         {"MASTER_PORT", std::to_string(port)}};
}

TEST(ProcessGroup, SingleProcessOpensNothing) {
  auto pg = ProcessGroup::init(process_env_from({}));
  EXPECT_EQ(pg->world_size(), 1);
  EXPECT_EQ(pg->store(), nullptr);
  EXPECT_EQ(pg->comm().backend_name(), "single");
  Tensor t = Tensor::ones({3});
  pg->comm().all_reduce(t, ReduceOp::avg);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 1, 1}));
  pg->shutdown();
}

TEST(ProcessGroup, StartUpAsTheTrainingLoopWill) {
  const int port = free_port();
  const auto out = run_processes(3, [&](int rank) {
    const ProcessEnv env = process_env_from(torchrun_env(rank, 3, port));
    DistOptions options;
    options.timeout = 5s;
    auto pg = ProcessGroup::init(env, options);
    RunIdentity id{"trainer test", content_hash("config"), "data", 10};
    check_consistency(*pg->store(), pg->rank(), pg->world_size(), run_identity_items(id), options.timeout);
    Variable w(Tensor::full({4}, rank), true);  // differs per rank until the broadcast
    Tensor* data = &w.data();
    broadcast_state(pg->comm(), {{"w", data, false}});
    GradientReducer reducer(pg->comm_ptr(), {{"w", w}});
    check_epoch_steps(pg->comm(), 0, 10);
    w.backward(Tensor::full({4}, rank + 1.0));  // d(w)/dw seeded with rank+1: mean = 2
    reducer.finish();
    if (w.grad().to_vector<float>() != std::vector<float>(4, 2.0f)) throw std::runtime_error("wrong average");
    if (w.data().to_vector<float>() != std::vector<float>(4, 0.0f)) throw std::runtime_error("not broadcast");
    pg->shutdown();
  });
  for (const auto& o : out) EXPECT_TRUE(o.ok()) << all_errors(out);
}

TEST(ProcessGroup, UnderTorchrunOurStoreSitsNextToTorchrunsOwn) {
  // Stand-in for torchrun's agent store holding MASTER_PORT: ours must use MASTER_PORT+1.
  const int port = free_port(2);
  TcpStore torchrun_store(store_options(port, true));
  const auto out = run_processes(2, [&](int rank) {
    EnvMap env = torchrun_env(rank, 2, port);
    env["TORCHELASTIC_RUN_ID"] = "test";
    auto pg = ProcessGroup::init(process_env_from(env));
    pg->comm().barrier();
    pg->shutdown();
  });
  for (const auto& o : out) EXPECT_TRUE(o.ok()) << all_errors(out);
}

TEST(ProcessGroup, DifferentBuildsStopBeforeConnecting) {
  const int port = free_port();
  const auto out = run_processes(2, [&](int rank) {
    DistOptions options;
    options.build = rank == 0 ? "trainer 0.1.0 (b51c007)" : "trainer 0.1.0 (dirty)";
    ProcessGroup::init(process_env_from(torchrun_env(rank, 2, port)), options);
  });
  for (const auto& o : out) {
    EXPECT_NE(
        o.error.find(
            "trainer build: 'trainer 0.1.0 (b51c007)' on rank(s) 0; 'trainer 0.1.0 (dirty)' on rank(s) 1"),
        std::string::npos)
        << all_errors(out);
  }
}

// A rank whose model sits on another kind of device (a node where train.device = "auto" found no GPU)
// would open another kind of communicator; the ranks stop before connecting, naming both. In this
// CPU-only build the GPU rank is one with dist.backend = "tcp" and its model on a GPU.
TEST(ProcessGroup, RanksOnDifferentDeviceKindsStopBeforeConnecting) {
  const int port = free_port();
  const auto out = run_processes(2, [&](int rank) {
    DistOptions options;
    options.backend = "tcp";
    options.device = rank == 0 ? Device::cpu() : Device::cuda(0);
    ProcessGroup::init(process_env_from(torchrun_env(rank, 2, port)), options);
  });
  for (const auto& o : out) {
    EXPECT_NE(
        o.error.find("communicator: 'tcp, model on CPU' on rank(s) 0; 'tcp, model on GPU' on rank(s) 1"),
        std::string::npos)
        << all_errors(out);
    EXPECT_NE(o.error.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << all_errors(out);
  }
}

// Two ranks on one GPU (the seed guides' "every rank on GPU 0": LOCAL_RANK set alike by hand) stop
// before connecting, naming the GPU and both ranks; ranks on GPUs of their own connect. The GPU ids are
// given here (a CPU-only build has none to read); `trainer train` passes each rank's GPU UUID.
TEST(ProcessGroup, TwoRanksOnOneGpuStopBeforeConnecting) {
  for (const bool shared : {true, false}) {
    const int port = free_port();
    const auto out = run_processes(2, [&](int rank) {
      DistOptions options;
      options.backend = "tcp";
      options.gpu_id = shared || rank == 0 ? "GPU-5f3e" : "GPU-77aa";
      ProcessGroup::init(process_env_from(torchrun_env(rank, 2, port)), options)->shutdown();
    });
    for (const auto& o : out) {
      if (!shared) {
        EXPECT_EQ(o.error, "") << all_errors(out);
        continue;
      }
      EXPECT_NE(o.error.find("GPU shared: 'GPU-5f3e' on rank(s) 0, 1"), std::string::npos) << all_errors(out);
      EXPECT_NE(o.error.find("each rank needs a GPU of its own"), std::string::npos) << all_errors(out);
    }
  }
}

TEST(ProcessGroup, PortInUseNamesThePort) {
  TcpStore other(store_options(0, true));
  std::string e;
  try {
    ProcessGroup::init(process_env_from(torchrun_env(0, 2, other.port())));
  } catch (const DistError& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("MASTER_PORT " + std::to_string(other.port()) + " is already in use on this host"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace trainer

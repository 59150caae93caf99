#pragma once
// A real NCCL communicator of one rank (rank 0 of 1), its unique id shared through a TcpStore on a
// free loopback port: what the GPU suite can run NCCL with on a one-GPU machine.
#include <chrono>
#include <memory>

#include "dist/nccl_comm.h"
#include "dist/store.h"
#include "tests/gpu/gpu_test_util.h"

namespace trainer::gpu_test {

struct OneRankNccl {
  std::unique_ptr<TcpStore> store;
  std::shared_ptr<NcclComm> comm;
};

// `watchdog_store`: give the communicator's watchdog a store connection of its own (as the trainer does).
inline OneRankNccl one_rank_nccl(bool watchdog_store) {
  using namespace std::chrono_literals;
  OneRankNccl n;
  TcpStoreOptions so;
  so.host = "127.0.0.1";
  so.bind_host = "127.0.0.1";
  so.port = 0;  // any free port
  so.is_server = true;
  so.world_size = 1;
  n.store = std::make_unique<TcpStore>(so);
  NcclCommOptions o;
  o.device = 0;
  o.timeout = 60s;
  o.connect_timeout = 60s;
  if (watchdog_store) {
    TcpStoreOptions wo = so;
    wo.port = n.store->port();
    wo.is_server = false;
    o.watchdog_store = std::make_shared<TcpStore>(wo);
  }
  n.comm = NcclComm::create(*n.store, 0, 1, o);
  return n;
}

// A test fixture holding one_rank_nccl(watchdog_store) (skipped without a GPU), shut down after each test.
class OneRankNcclTest : public ::testing::Test {
 protected:
  explicit OneRankNcclTest(bool watchdog_store) : watchdog_store_(watchdog_store) {}
  void SetUp() override {
    REQUIRE_GPU();
    OneRankNccl nccl = one_rank_nccl(watchdog_store_);
    store_ = std::move(nccl.store);
    comm_ = std::move(nccl.comm);
  }
  void TearDown() override {
    if (comm_) comm_->shutdown();
    comm_.reset();
    store_.reset();
  }

  bool watchdog_store_;
  std::unique_ptr<TcpStore> store_;
  std::shared_ptr<NcclComm> comm_;
};

}  // namespace trainer::gpu_test

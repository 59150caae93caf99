#pragma once
// Everything a rank needs to take part in a distributed run, set up in one call: the environment
// (dist/process_env.h), the rendezvous store served by rank 0 (dist/store.h) and the communicator
// (dist/comm.h). At world size 1 it opens no socket and hands out a SingleProcessComm, so the
// training loop needs no special case.
//
// The communicator follows where the tensors live: backend "auto" picks NCCL (dist/nccl_comm.h) when
// `device` is a CUDA device and the TCP communicator (dist/cpu_comm.h) otherwise; "nccl" and "tcp"
// force one. For NCCL, init_cuda_backend(device.index) must have run first.
#include <chrono>
#include <memory>
#include <string>

#include "dist/comm.h"
#include "dist/heartbeat.h"
#include "dist/process_env.h"
#include "dist/store.h"
#include "nn/device.h"

namespace trainer {

struct DistOptions {
  // Start-up: how long ranks wait for rank 0's store and for each other to arrive.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(30)};
  // Each collective, and store waits after start-up (consistency checks).
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // This binary's version; when set, ranks compare it through the store before they open their
  // peer connections (whose protocol a different build might not share). "" skips the check.
  std::string build;
  // "auto" (NCCL for a CUDA device, our TCP collectives otherwise), "nccl" or "tcp" (CpuComm). "nccl" without
  // a CUDA device (or in a build without CUDA) is a DistError with a HINT.
  std::string backend = "auto";
  // NCCL: a peer whose heartbeat (reported every second) has not changed for this long while a
  // collective waits is dead, and the communicator fails naming it (NcclCommOptions::peer_silent_after).
  // The CPU communicator notices dead peers through their closed sockets and does not need it.
  std::chrono::milliseconds peer_silent_after{std::chrono::seconds(4)};
  // Where this rank's model and gradients live: Device::cuda(LOCAL_RANK) on GPUs.
  Device device = Device::cpu();
  // What names this rank's GPU across hosts (its UUID), or "" for no check (the CPU; `trainer train`
  // sets it under NCCL only). Ranks compare it before they connect: two ranks on one GPU (LOCAL_RANK
  // set by hand, or CUDA_VISIBLE_DEVICES alike on both) stop naming it, instead of running out of
  // memory or crawling while another GPU idles.
  std::string gpu_id;
};

// The communicator backend init() will use for these options: "nccl" or "tcp" (whatever the world
// size; at world size 1 the communicator itself is a SingleProcessComm). Throws DistError with a HINT
// for an unknown backend or "nccl" without CUDA.
std::string resolve_comm_backend(const DistOptions& options);

class ProcessGroup {
 public:
  // Throws DistError with the cause and a HINT (port in use, rank 0 unreachable, ranks missing).
  static std::unique_ptr<ProcessGroup> init(const ProcessEnv& env, const DistOptions& options = {});
  ~ProcessGroup();

  const ProcessEnv& env() const { return env_; }
  const DistOptions& options() const { return options_; }
  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  // Null at world size 1.
  Store* store() { return store_.get(); }
  // What this rank reports to the others (dist/heartbeat.h); nullptr at world size 1.
  Heartbeat* heartbeat() { return heartbeat_.get(); }
  Comm& comm() { return *comm_; }
  const std::shared_ptr<Comm>& comm_ptr() const { return comm_; }

  // Orderly end after the last collective (see Comm::shutdown); rank 0 keeps serving the store until
  // every rank got here. Not calling it (an error is unwinding) tells the peers this rank failed.
  void shutdown();

 private:
  ProcessGroup() = default;
  ProcessEnv env_;
  DistOptions options_;
  std::unique_ptr<Store> store_;
  std::shared_ptr<Comm> comm_;
  std::unique_ptr<Heartbeat> heartbeat_;
  bool shut_down_ = false;  // shutdown() ran: an orderly end
};

}  // namespace trainer

#pragma once
// What the trainer asks of NCCL in every build: a communicator created without naming its class, and the
// versions the build line shows. With the CUDA backend, dist/nccl_backend.cpp answers (through
// dist/nccl_comm.h); without it, dist/nccl_unavailable.cpp, whose communicator factory throws DistError
// saying so. CMake picks the file, so no caller needs the preprocessor.
#include <chrono>
#include <memory>
#include <string>

#include "dist/comm.h"

namespace trainer {

class Store;

struct NcclCommOptions {
  // Store keys live under "nccl/<name>/": several communicators can share one store.
  std::string name = "default";
  // The CUDA device of this rank (LOCAL_RANK); init_cuda_backend(device) must have run.
  int device = 0;
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};          // each collective
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(30)};  // the rendezvous + NCCL set-up
  // A store connection of the watchdog's own (the main one can be held for minutes by a blocking wait):
  // used to publish this rank's failure and to notice another rank's. Null: failures still end every
  // wait, but other ranks only notice through their own timeout.
  std::shared_ptr<Store> watchdog_store;
  std::chrono::milliseconds watchdog_interval{std::chrono::milliseconds(50)};
  // Dead peers (needs watchdog_store and every rank's dist/heartbeat.h records in it; 0 = off): while a
  // collective has been pending for over a second, the watchdog reads the heartbeats once a second, and
  // a rank whose record has not changed for this long (or rank 0, when its store stops answering) fails
  // the communicator at once with a message naming it. NCCL itself never notices a peer killed while
  // its kernels wait on NVLink or shared memory.
  std::chrono::milliseconds peer_silent_after{0};
  // Bound on ncclCommAbort (it blocks); past it the rank goes on with its error without it.
  std::chrono::milliseconds abort_limit{std::chrono::seconds(10)};
};

// NcclComm::create (dist/nccl_comm.h): collective over the store, every rank with the same name and world
// size. Throws DistError (no NCCL in this build, no CUDA backend on that device, a rank that did not
// arrive within connect_timeout, NCCL errors).
std::shared_ptr<Comm> create_nccl_comm(Store& store, int rank, int world_size,
                                       const NcclCommOptions& options);

// "2.28.9": the NCCL headers this trainer was compiled with; "" without NCCL.
std::string nccl_compiled_version();
// The NCCL library loaded at run time; "" without NCCL or when it cannot say.
std::string nccl_loaded_version();

}  // namespace trainer

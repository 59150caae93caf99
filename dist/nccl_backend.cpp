// dist/nccl_backend.h with NCCL (CUDA builds): the factory is NcclComm::create, the versions NCCL's own.
#include "dist/nccl_backend.h"

#include <nccl.h>

#include "dist/nccl_comm.h"

namespace trainer {
namespace {

// "x.y.z" from NCCL's code x * 10000 + y * 100 + z (NCCL >= 2.9).
std::string dotted(int v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace

std::shared_ptr<Comm> create_nccl_comm(Store& store, int rank, int world_size,
                                       const NcclCommOptions& options) {
  return NcclComm::create(store, rank, world_size, options);
}

std::string nccl_compiled_version() {
  return std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH);
}

std::string nccl_loaded_version() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? dotted(v) : "";
}

}  // namespace trainer

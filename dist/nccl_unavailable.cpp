// dist/nccl_backend.h and the NCCL smoke test in a build without CUDA (CMake compiles this file instead of
// nccl_backend.cpp, nccl_comm.cpp and collective_smoke_nccl.cpp): asking for NCCL is an error that says
// why and what to do, never a silent fallback.
#include "dist/collective_smoke.h"
#include "dist/error.h"
#include "dist/nccl_backend.h"

namespace trainer {
namespace {

[[noreturn]] void no_nccl(const std::string& what) {
  throw DistError(what +
                  ": this trainer was built without CUDA, so NCCL is not available. HINT: rebuild with "
                  "-DTRAINER_CUDA=ON on a host with the CUDA toolkit, or use the \"tcp\" backend");
}

}  // namespace

std::shared_ptr<Comm> create_nccl_comm(Store&, int, int, const NcclCommOptions&) {
  no_nccl("an NCCL communicator");
}

std::string nccl_compiled_version() { return ""; }
std::string nccl_loaded_version() { return ""; }

CollectiveSmoke nccl_all_reduce_smoke(const std::vector<size_t>&, int, std::chrono::milliseconds) {
  no_nccl("the NCCL all-reduce smoke test");
}

}  // namespace trainer

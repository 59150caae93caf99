#include "app/train/phase_clock.h"

#ifdef TRAINER_WITH_CUDA
#include "dist/nccl_comm.h"
#include "metrics/cuda_event_clock.h"
#include "nn/cuda/cuda_backend.h"
#endif

namespace trainer {

std::unique_ptr<PhaseClock> phase_clock_for(const Device& device, const Comm& comm) {
#ifdef TRAINER_WITH_CUDA
  if (device.is_cuda()) {
    // Without NCCL (world size 1, or the CPU communicator) no gradient work runs on another stream.
    const auto* nccl = dynamic_cast<const NcclComm*>(&comm);
    cudaStream_t compute = cuda_stream();
    cudaStream_t comm_stream = nccl ? static_cast<cudaStream_t>(nccl->stream()) : compute;
    return std::make_unique<CudaEventClock>(compute, comm_stream);
  }
#else
  (void)device;
  (void)comm;
#endif
  return std::make_unique<SteadyPhaseClock>();
}

}  // namespace trainer

#pragma once
// GPU utilisation as NVML reports it: the fraction of its last sample period (1/6 s to 1 s, by GPU) in
// which a kernel was running on the GPU, for trainer_gpu_utilization_ratio (the seed guides' "watch GPU
// utilisation" next to the per-phase step times). NVML is loaded at run time from libnvidia-ml.so.1,
// which the NVIDIA driver installs, so the binary has no link dependency on it; on the CPU, or where
// the library or the GPU cannot be opened, the reader is unavailable and says why.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace trainer {

class GpuUtilization {
 public:
  // The GPU with this PCI bus id ("0000:1b:00.0", as cudaDeviceGetPCIBusId gives it); "" = none.
  explicit GpuUtilization(const std::string& pci_bus_id);
  ~GpuUtilization();
  GpuUtilization(const GpuUtilization&) = delete;
  GpuUtilization& operator=(const GpuUtilization&) = delete;

  bool available() const { return nvml_ != nullptr; }
  // Why not, when unavailable: "no GPU", "libnvidia-ml.so.1 not found (...)", an NVML error.
  const std::string& why_unavailable() const { return why_; }
  // The latest utilisation, a ratio in [0, 1]; nothing when unavailable or when the read fails.
  std::optional<double> read() const;

 private:
  struct Nvml;
  std::unique_ptr<Nvml> nvml_;
  std::string why_;
};

// Calls `read` every `period` on a thread of its own and hands each reading to `publish` (NaN when a
// read gives nothing), until destroyed. A thread of its own, not the training loop: pauses (an
// evaluation, a checkpoint, a stalled loader) are then measured while they happen, instead of by the
// first step after them, and steady training by reads during training.
class PeriodicReader {
 public:
  PeriodicReader(std::function<std::optional<double>()> read, std::function<void(double)> publish,
                 std::chrono::milliseconds period);
  ~PeriodicReader();
  PeriodicReader(const PeriodicReader&) = delete;
  PeriodicReader& operator=(const PeriodicReader&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace trainer

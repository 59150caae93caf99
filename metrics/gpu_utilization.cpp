#include "metrics/gpu_utilization.h"

#include <dlfcn.h>

#include <limits>

namespace trainer {
namespace {

// The few NVML types used, as nvml.h declares them (its ABI is stable; the header is not needed).
using NvmlReturn = int;  // nvmlReturn_t; 0 = NVML_SUCCESS
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlUtilization {
  unsigned int gpu;     // percent of the sample period a kernel ran
  unsigned int memory;  // percent of it device memory was read or written
};

}  // namespace

struct GpuUtilization::Nvml {
  void* library = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*utilization_rates)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlDevice device = nullptr;
  ~Nvml() {
    if (shutdown) shutdown();
    if (library) ::dlclose(library);
  }
};

GpuUtilization::GpuUtilization(const std::string& pci_bus_id) {
  if (pci_bus_id.empty()) {
    why_ = "no GPU";
    return;
  }
  auto nvml = std::make_unique<Nvml>();
  nvml->library = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!nvml->library) {
    const char* e = ::dlerror();
    why_ = std::string("libnvidia-ml.so.1 not found (") + (e ? e : "dlopen failed") +
           "); it comes with the NVIDIA driver";
    return;
  }
  auto symbol = [&](const char* name) { return ::dlsym(nvml->library, name); };
  auto init = reinterpret_cast<NvmlReturn (*)()>(symbol("nvmlInit_v2"));
  auto by_bus_id =
      reinterpret_cast<NvmlReturn (*)(const char*, NvmlDevice*)>(symbol("nvmlDeviceGetHandleByPciBusId_v2"));
  auto error_string = reinterpret_cast<const char* (*)(NvmlReturn)>(symbol("nvmlErrorString"));
  nvml->utilization_rates =
      reinterpret_cast<NvmlReturn (*)(NvmlDevice, NvmlUtilization*)>(symbol("nvmlDeviceGetUtilizationRates"));
  if (!init || !by_bus_id || !error_string || !nvml->utilization_rates || !symbol("nvmlShutdown")) {
    why_ = "libnvidia-ml.so.1 lacks the functions needed (an old driver?)";
    return;
  }
  if (NvmlReturn r = init(); r != 0) {
    why_ = std::string("nvmlInit: ") + error_string(r);
    return;
  }
  nvml->shutdown = reinterpret_cast<NvmlReturn (*)()>(symbol("nvmlShutdown"));
  if (NvmlReturn r = by_bus_id(pci_bus_id.c_str(), &nvml->device); r != 0) {
    why_ = "NVML has no GPU at PCI bus id " + pci_bus_id + ": " + error_string(r);
    return;
  }
  nvml_ = std::move(nvml);
}

GpuUtilization::~GpuUtilization() = default;

std::optional<double> GpuUtilization::read() const {
  if (!nvml_) return std::nullopt;
  NvmlUtilization u{};
  if (nvml_->utilization_rates(nvml_->device, &u) != 0) return std::nullopt;
  return u.gpu / 100.0;
}

PeriodicReader::PeriodicReader(std::function<std::optional<double>()> read,
                               std::function<void(double)> publish, std::chrono::milliseconds period)
    : thread_([this, read = std::move(read), publish = std::move(publish), period] {
        std::unique_lock<std::mutex> lock(mutex_);
        while (!wake_.wait_for(lock, period, [this] { return stop_; })) {
          lock.unlock();
          const std::optional<double> value = read();
          publish(value ? *value : std::numeric_limits<double>::quiet_NaN());
          lock.lock();
        }
      }) {}

PeriodicReader::~PeriodicReader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

}  // namespace trainer

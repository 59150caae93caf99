// nn/runtime.h in a build without the CUDA backend (CMake compiles this file instead of
// nn/cuda/runtime_cuda*.cpp): nothing is queued, so events read the steady clock and scalars are read at
// once; what needs a GPU throws std::logic_error that says the build lacks it.
#include <chrono>
#include <stdexcept>
#include <string>

#include "nn/runtime.h"

namespace trainer::runtime {
namespace {

[[noreturn]] void no_cuda(const std::string& what) {
  throw std::logic_error(what + " needs a GPU, but this trainer was built without the CUDA backend");
}

}  // namespace

bool cuda_built() { return false; }
int device_count() { return 0; }
void init_device(int index) { no_cuda("GPU " + std::to_string(index)); }
void synchronize() {}
// Kept for backend_options() and ScopedBackendOptions; no CPU kernel reads them.
BackendOptions& cpu_backend_options() {
  static BackendOptions options;
  return options;
}
void apply_backend_options(const BackendOptions& options) { cpu_backend_options() = options; }
const BackendOptions& backend_options() { return cpu_backend_options(); }
Stream compute_stream() { return {}; }

// ---- Event

struct Event::Impl {
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
};

Event::Event(bool) : impl_(std::make_unique<Impl>()) {}
Event::~Event() = default;
Event::Event(Event&&) noexcept = default;
Event& Event::operator=(Event&&) noexcept = default;

void Event::record(Stream) {
  impl_->recorded = true;
  impl_->when = std::chrono::steady_clock::now();
}

bool Event::recorded() const { return impl_->recorded; }
void Event::wait(const FailurePoll&) const {}

double seconds_between(const Event& from, const Event& to) {
  return std::chrono::duration<double>(to.impl_->when - from.impl_->when).count();
}

// ---- ScalarReadback

struct ScalarReadback::Impl {
  double value = 0.0;
};

ScalarReadback::ScalarReadback() : impl_(std::make_unique<Impl>()) {}
ScalarReadback::~ScalarReadback() = default;

void ScalarReadback::copy_from(const Tensor& scalar) {
  if (scalar.numel() != 1 || (scalar.dtype() != DType::f32 && scalar.dtype() != DType::f64))
    throw std::invalid_argument("ScalarReadback: expected one f32/f64 element, got " + scalar.str());
  impl_->value = scalar.item();
}

double ScalarReadback::value(const FailurePoll&) const { return impl_->value; }

// ---- Device memory

DeviceMemoryStats device_memory_stats() { return {}; }
std::string convolution_summary() { return ""; }
void reset_peak_device_memory() {}
std::optional<int64_t> device_total_memory() { return std::nullopt; }

// ---- Graph

struct Graph::Impl {};

Graph::Graph() : impl_(std::make_unique<Impl>()) {}
Graph::~Graph() = default;
void Graph::capture(const std::function<void()>&) { no_cuda("capturing a graph"); }
void Graph::replay() { no_cuda("replaying a graph"); }
bool Graph::captured() const { return false; }
size_t Graph::nodes() const { return 0; }

// ---- Input uploads

Allocator* pinned_host_allocator() { return nullptr; }

struct Upload::Impl {};

Upload::Upload() = default;
Upload::~Upload() = default;
Upload::Upload(Upload&&) noexcept = default;
Upload& Upload::operator=(Upload&&) noexcept = default;
const std::vector<Tensor>& Upload::device_tensors_for_compute() { no_cuda("a host -> device upload"); }

struct CopyStream::Impl {};

CopyStream::CopyStream() { no_cuda("a copy stream"); }
CopyStream::~CopyStream() = default;
Upload CopyStream::upload(std::vector<Tensor>) { no_cuda("a host -> device upload"); }

Tensor normalize_u8_nhwc(const Tensor&, const std::vector<float>&, const std::vector<float>&, MemoryFormat) {
  no_cuda("normalising a batch on the device");
}

// ---- The GPU's identity and versions: there is no GPU

std::optional<GpuProperties> gpu_properties(int) { return std::nullopt; }
std::string gpu_uuid(int) { return ""; }
std::string pci_bus_id(int index) { no_cuda("the PCI bus id of GPU " + std::to_string(index)); }
PeerAccess peer_access(int, int) { no_cuda("a peer link"); }
BackendVersions backend_versions() { return {}; }

}  // namespace trainer::runtime

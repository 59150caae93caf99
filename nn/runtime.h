#pragma once
// The device runtime: what code outside nn/ needs of the device beyond tensors and kernels (which GPUs
// there are, the compute stream, events, scalars read back without stopping the device, memory
// statistics, graph capture, input uploads, the GPU's identity and the backend's switches), behind one
// interface for every build. CMake compiles nn/runtime_cpu.cpp into a build without the CUDA backend
// and nn/cuda/runtime_cuda.cpp into one with it, so no caller outside nn/ asks the preprocessor which
// build it is in: it asks cuda_built(), or a device (flashlight's device-neutral Stream, ggml's backend
// interface).
//
// On the CPU everything is synchronous: an event records the steady clock when recorded, a scalar is
// read when it is queued, memory statistics are zero; what only a GPU can do (init_device, Graph's
// capture, uploads) throws std::logic_error naming the missing backend.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/allocator.h"
#include "nn/tensor.h"

namespace trainer::runtime {

// ---- Devices and the backend

// Whether this build has the CUDA backend: "auto" falls back to the CPU only in a build that has it not.
bool cuda_built();
// Visible CUDA devices; 0 without the CUDA backend, a driver or a device (never throws).
int device_count();
// Selects GPU `index` (LOCAL_RANK) and sets up its backend, before any tensor lives there; throws, with a
// HINT, when there is no such GPU or no CUDA backend.
void init_device(int index);
// Waits for the work queued on the compute stream: what measures a step must not measure half of it.
void synchronize();

// The backend's kernel choices: state of the CUDA backend, set once per run from its PrecisionPolicy
// (app/run/device_setup.h) and logged as one line (describe_backend_options). Tests and benchmarks set
// them the same way, through a whole options value (ScopedBackendOptions), never a switch of their own.
struct BackendOptions {
  bool allow_tf32 = false;         // TF32 tensor-core math for f32 matmul and convolution
  bool deterministic = false;      // train.deterministic: bitwise reproducible kernels
  bool conv_stats_fusion = false;  // BatchNorm statistics in cuDNN convolution epilogues, where faster
  bool cudnn_batch_norm = false;   // BatchNorm's backward through cuDNN's NHWC kernels
  bool cudnn_batch_norm_forward =
      true;  // with cudnn_batch_norm: its forward too, shape by shape where faster
  // Attention through cuDNN's fused flash-attention graphs where they apply (nn/cuda/fused_attention.h);
  // off: composed of bmm and softmax everywhere (tests and nn_bench --fused-attention 0 compare the two).
  bool fused_attention = true;
  // Tests: take the path wherever it applies, without timing it against ours.
  bool force_conv_stats_fusion = false;
  bool force_cudnn_batch_norm_forward = false;
  bool force_im2col_conv = false;
  bool operator==(const BackendOptions&) const = default;
};
// Sets them on the CUDA backend: one call, so the run's policy is applied in one place. Kept (and
// ignored) on the CPU.
void apply_backend_options(const BackendOptions& options);
const BackendOptions& backend_options();
// "tf32 off, deterministic off, cuDNN fusion where faster, cuDNN batch norm on (forward where faster),
// fused attention on".
std::string describe_backend_options(const BackendOptions& options);

// Options for a scope: `change` edits a copy of the current ones, which apply until the scope ends.
class ScopedBackendOptions {
 public:
  template <class Change>
  explicit ScopedBackendOptions(Change change) : saved_(backend_options()) {
    BackendOptions options = saved_;
    change(options);
    apply_backend_options(options);
  }
  ~ScopedBackendOptions() { apply_backend_options(saved_); }
  ScopedBackendOptions(const ScopedBackendOptions&) = delete;
  ScopedBackendOptions& operator=(const ScopedBackendOptions&) = delete;

 private:
  BackendOptions saved_;
};

// ---- Streams and events

// A device queue of work, opaque to callers (a cudaStream_t in a CUDA build). The default is none: on
// the CPU there is no queue, and a Comm that runs on no stream of its own says so with it.
class Stream {
 public:
  Stream() = default;
  explicit Stream(void* handle) : handle_(handle) {}
  void* handle() const { return handle_; }
  explicit operator bool() const { return handle_ != nullptr; }
  bool operator==(const Stream&) const = default;

 private:
  void* handle_ = nullptr;
};

// The compute stream every kernel runs on (the current device's); none on the CPU, where work is not
// queued.
Stream compute_stream();

// Called between polls while the host waits for the device, so that a wait which depends on a
// communicator's work ends with that communicator's error (Comm::throw_if_failed) instead of hanging
// when a peer died. Without one, waits block in the driver.
using FailurePoll = std::function<void()>;

// A point in a stream's work: recorded behind what the stream has queued, complete when the stream
// passes it. Created on the device at its first record(), so constructing one costs nothing on the CPU
// and needs no device. Move-only.
class Event {
 public:
  // timing: whether seconds_between may read it (timing events cost the device a little more).
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&&) noexcept;
  Event& operator=(Event&&) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Records "now" on `stream` (the host does not wait). On the CPU: the steady clock's now.
  void record(Stream stream);
  bool recorded() const;
  // Blocks the host until the stream has passed the event; with `failed`, polls and calls it between
  // polls (naps of at most 50 us, so the host resumes promptly).
  void wait(const FailurePoll& failed = {}) const;

 private:
  friend double seconds_between(const Event& from, const Event& to);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Seconds of device time from `from` to `to`, two timing events recorded in that order; waits for
// both to complete first (normally long done) rather than report a wrong time.
double seconds_between(const Event& from, const Event& to);

// ---- Scalars read back without stopping the device

// One f32 or f64 device scalar copied into pinned host memory behind an event on the compute stream:
// the host reads it a step later instead of waiting for the device now (app/train/host_readback.h).
// A CPU scalar is read at once. Reusable: each copy_from() overwrites the last.
class ScalarReadback {
 public:
  ScalarReadback();
  ~ScalarReadback();
  ScalarReadback(const ScalarReadback&) = delete;
  ScalarReadback& operator=(const ScalarReadback&) = delete;

  // Queues the copy of `scalar` (one f32 or f64 element) on the compute stream.
  void copy_from(const Tensor& scalar);
  // The value, once the copy has completed (waiting for it, polling `failed` when given).
  double value(const FailurePoll& failed = {}) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- Device memory

// The caching allocator's counts for the current GPU, for the exporter's memory gauges and `trainer
// plan`'s measured activations; zeros without the CUDA backend.
struct DeviceMemoryStats {
  int64_t allocated_bytes = 0;       // in blocks handed out
  int64_t reserved_bytes = 0;        // in segments obtained from the driver
  int64_t peak_allocated_bytes = 0;  // since start or the last reset_peak_device_memory()
  int64_t peak_reserved_bytes = 0;
  int64_t device_mallocs = 0;  // segments obtained from the driver so far (nn_bench: should stay flat)
  int64_t device_frees = 0;
};
DeviceMemoryStats device_memory_stats();
// One line on how the convolutions seen so far run (cuDNN graph-API plans, legacy algorithms,
// workspace), for nn_bench; "" on the CPU.
std::string convolution_summary();
void reset_peak_device_memory();
// The current GPU's total memory, for `trainer plan`'s default budget; nullopt without one.
std::optional<int64_t> device_total_memory();

// ---- Graph capture

// Work on the compute stream recorded once and replayed as one launch (nn/cuda/cuda_graph.h says what
// the captured callable may do). On the CPU there is nothing to capture: capture() and replay() throw
// std::logic_error, captured() is false.
class Graph {
 public:
  Graph();
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Runs f with its device work recorded, not executed; throws std::runtime_error naming the CUDA error
  // when f does something a capture forbids (the graph is then left empty).
  void capture(const std::function<void()>& f);
  // Queues the recorded work on the compute stream and returns.
  void replay();
  bool captured() const;
  size_t nodes() const;  // kernels and copies in the graph

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- Input uploads (data/device_prefetcher.h)

// Page-locked host memory for batches bound for the GPU, so their copies are DMA transfers that overlap
// with kernels; null without the CUDA backend (batches then use pageable memory).
Allocator* pinned_host_allocator();

// A host -> device copy in flight (nn/cuda/copy_stream.h): it owns the host tensors until the copy has
// completed, and its destruction waits for that.
class Upload {
 public:
  Upload();
  ~Upload();
  Upload(Upload&&) noexcept;
  Upload& operator=(Upload&&) noexcept;

  // Makes the compute stream wait for the copy (the host does not) and returns the device tensors, in
  // the order given to CopyStream::upload.
  const std::vector<Tensor>& device_tensors_for_compute();

 private:
  friend class CopyStream;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Host -> device copies on a stream of their own, so the next batch's upload overlaps with this batch's
// kernels. Throws std::logic_error without the CUDA backend. Its destruction waits for its copies.
class CopyStream {
 public:
  CopyStream();
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  // Queues a copy of each contiguous host tensor into a new device tensor; returns at once.
  Upload upload(std::vector<Tensor> host);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// u8 [B, H, W, C] on the GPU -> f32 [B, C, H, W] in `format`, (x / 255 - mean[c]) / std[c] on the
// compute stream, bit-identical to data/normalize.h's CPU path (nn/cuda/normalize_input.h): the input
// crosses the bus as bytes. Throws std::logic_error without the CUDA backend.
Tensor normalize_u8_nhwc(const Tensor& u8_nhwc, const std::vector<float>& mean, const std::vector<float>& std,
                         MemoryFormat format);

// ---- The GPU's identity and the CUDA stack's versions

// What `trainer doctor` and the run's system facts show of GPU `index`; nullopt when the query fails.
struct GpuProperties {
  std::string name;
  int64_t total_memory_bytes = 0;
  int major = 0, minor = 0;  // compute capability
};
std::optional<GpuProperties> gpu_properties(int index);
// "GPU-" + the UUID, as nvidia-smi -L shows it: ranks compare it so that no two train on one GPU.
// Throws on a failed query; "" without the CUDA backend.
std::string gpu_uuid(int index);
// "0000:1b:00.0", for NVML and the topology; throws std::runtime_error naming the failed call.
std::string pci_bus_id(int index);

// How GPU `from` reaches GPU `to`, for `trainer doctor`'s topology table.
struct PeerAccess {
  bool access = false;        // peer-to-peer transfers at all
  int performance_rank = -1;  // the driver's relative rank of the link (0 = best); -1 without access
  bool native_atomics = false;
};
// Throws std::runtime_error naming the failed call.
PeerAccess peer_access(int from, int to);

// CUDA's version codes (13.0 = 13000; cuDNN 9.1.2 = 90102), for the build line and the system facts;
// 0 when unknown, and everywhere without the CUDA backend.
struct BackendVersions {
  int cuda_compiled = 0;     // the CUDA runtime headers the trainer was compiled with
  int cudnn_compiled = 0;    // the cuDNN headers likewise
  int cuda_driver = 0;       // the installed driver's (0: none installed)
  int cuda_runtime = 0;      // the loaded CUDA runtime's
  int64_t cudnn_loaded = 0;  // the loaded cuDNN's
};
BackendVersions backend_versions();

}  // namespace trainer::runtime

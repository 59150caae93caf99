#pragma once
// cuDNN's graph (backend) API in small pieces: an owning descriptor handle, attribute setting with a
// status check, tensor descriptors in NCHW or NHWC, the heuristics' engine configurations and their
// knob choices. Shared by the convolutions (nn/cuda/conv_graph_api.h), the fused statistics
// (nn/cuda/conv_stats_graph.h) and the probes of bench/cudnn.
//
// A failed graph-API call means "this way does not work" (the caller moves on): the helpers return
// false or an empty descriptor, and print the call and cuDNN's status under TRAINER_CUDNN_DEBUG=1.
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nn/backend.h"
#include "nn/tensor.h"

namespace trainer::cudnn_graph {

// TRAINER_CUDNN_DEBUG=1 (nn/cuda/cudnn_switches.h): print every failed call, candidate and choice.
bool debug();

// A backend descriptor, destroyed with its owner unless released.
class BackendDesc {
 public:
  BackendDesc() = default;
  explicit BackendDesc(cudnnBackendDescriptorType_t type) {
    if (cudnnBackendCreateDescriptor(type, &d_) != CUDNN_STATUS_SUCCESS) d_ = nullptr;
  }
  ~BackendDesc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  BackendDesc(BackendDesc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  BackendDesc& operator=(BackendDesc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  BackendDesc(const BackendDesc&) = delete;
  BackendDesc& operator=(const BackendDesc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* addr() { return &d_; }
  cudnnBackendDescriptor_t release() {
    cudnnBackendDescriptor_t d = d_;
    d_ = nullptr;
    return d;
  }
  explicit operator bool() const { return d_ != nullptr; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// True on success; otherwise prints `what` and the status under TRAINER_CUDNN_DEBUG.
bool ok(cudnnStatus_t status, const char* what);
#define GRAPH_OK(call) ::trainer::cudnn_graph::ok((call), #call)

template <class T>
bool set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
         int64_t count, const T* values) {
  return GRAPH_OK(cudnnBackendSetAttribute(d, name, type, count, values));
}

// The attributes that are deprecated in cuDNN 9 but still the documented way to give a handle.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
constexpr cudnnBackendAttributeName_t kGraphHandle = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
constexpr cudnnBackendAttributeName_t kPlanHandle = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

// Dense strides of a 4-D tensor of shape s in NCHW or NHWC.
std::array<int64_t, 4> dense_strides(const Shape& s, bool nhwc);

// A finalised 4-D tensor descriptor (dense, NCHW or NHWC); `is_virtual`: an intermediate of a fused
// graph that never reaches memory. Empty when cuDNN refuses it.
BackendDesc tensor_desc(int64_t uid, cudnnDataType_t dt, const Shape& shape, bool nhwc, int64_t alignment,
                        bool is_virtual = false);
// How a tensor of a graph is held: in memory, never (virtual), or as a host scalar passed at execution.
enum class Residence { memory, is_virtual, by_value };
// The same with any 4-D dims and strides (attention's strided views of a packed projection).
BackendDesc strided_tensor_desc(int64_t uid, cudnnDataType_t dt, const std::array<int64_t, 4>& dims,
                                const std::array<int64_t, 4>& strides, int64_t alignment,
                                Residence residence = Residence::memory);

// A finalised 2-D cross-correlation descriptor (stride, padding, dilation of p; groups are not set)
// accumulating in `compute`. Empty when cuDNN refuses it.
BackendDesc convolution_desc(const Conv2dParams& p, cudnnDataType_t compute);

// What an engine configuration's engine is and promises: its global index, whether it compiles its
// kernel at run time, and its numerical notes. `known` is false when cuDNN did not say (the engine or
// its numerical notes could not be read): such an engine is not used.
struct EngineInfo {
  int64_t index = -1;
  bool known = false;
  bool runtime_compiled = false;
  bool nondeterministic = false;
  bool reduced_precision = false;  // down-converted inputs or reduced-precision reductions
  bool tensor_core = false;
};
EngineInfo engine_info(cudnnBackendDescriptor_t cfg);

// The descriptors of type `type` that attribute `name` of d holds (at most max_count), read into
// fresh descriptors; empty when cuDNN refuses.
std::vector<BackendDesc> read_descriptors(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                                          cudnnBackendDescriptorType_t type, int64_t max_count);

// The engine configurations the heuristics suggest for graph, best first.
std::vector<BackendDesc> engine_configs(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode);

// No engine has more knobs than there are knob types.
constexpr int64_t kMaxKnobs = CUDNN_KNOB_TYPE_COUNTS;

// Attribute `name` of d as one int64, or `fallback` when cuDNN refuses.
int64_t read_int(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, int64_t fallback);
// Attribute `name` of d as a knob type, or -1 when cuDNN refuses.
int64_t read_knob_type(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name);

// cfg's knob choices (tile shape, split-K, kernel variant...) as (knob type, value) pairs, in cuDNN's
// order; empty when none or unreadable.
std::vector<std::pair<int64_t, int64_t>> knob_choices(cudnnBackendDescriptor_t cfg);

// "engine 12 [24=3 17=1]": the engine's global index and the knob choices, to tell configurations
// apart and to print them.
std::string config_signature(cudnnBackendDescriptor_t cfg);

}  // namespace trainer::cudnn_graph

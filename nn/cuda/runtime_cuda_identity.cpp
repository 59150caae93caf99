// nn/runtime.h's GPU identity and CUDA stack versions on the CUDA backend: device properties, UUIDs,
// PCI bus ids, peer links and version codes, for the run's start-up checks and `trainer doctor`.
#include <cudnn_version.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "nn/cuda/cuda_backend.h"
#include "nn/runtime.h"

namespace trainer::runtime {
namespace {

// Throws "<call>: <CUDA's message>" for a failed query: the topology table shows it as its error.
void query_or_throw(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // a failed query leaves no sticky error for the next call to be blamed for
  throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(e));
}

}  // namespace

std::optional<GpuProperties> gpu_properties(int index) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) return std::nullopt;
  return GpuProperties{p.name, static_cast<int64_t>(p.totalGlobalMem), p.major, p.minor};
}

std::string gpu_uuid(int index) {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  // nvidia-smi's form: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
  std::string id = "GPU-";
  for (int i = 0; i < 16; ++i) {
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(prop.uuid.bytes[i]));
    id += hex;
    if (i == 3 || i == 5 || i == 7 || i == 9) id += '-';
  }
  return id;
}

std::string pci_bus_id(int index) {
  char id[32] = {};
  query_or_throw(cudaDeviceGetPCIBusId(id, sizeof id, index), "cudaDeviceGetPCIBusId");
  return id;
}

PeerAccess peer_access(int from, int to) {
  PeerAccess link;
  int v = 0;
  query_or_throw(cudaDeviceCanAccessPeer(&v, from, to), "cudaDeviceCanAccessPeer");
  link.access = v != 0;
  if (!link.access) return link;
  query_or_throw(cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrPerformanceRank, from, to),
                 "cudaDeviceGetP2PAttribute");
  link.performance_rank = v;
  query_or_throw(cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrNativeAtomicSupported, from, to),
                 "cudaDeviceGetP2PAttribute");
  link.native_atomics = v != 0;
  return link;
}

BackendVersions backend_versions() {
  BackendVersions v;
  v.cuda_compiled = CUDART_VERSION;
  v.cudnn_compiled = CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL;
  if (cudaDriverGetVersion(&v.cuda_driver) != cudaSuccess) v.cuda_driver = 0;
  if (cudaRuntimeGetVersion(&v.cuda_runtime) != cudaSuccess) v.cuda_runtime = 0;
  v.cudnn_loaded = static_cast<int64_t>(cudnnGetVersion());
  return v;
}

}  // namespace trainer::runtime

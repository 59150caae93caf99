#include "app/commands/doctor/gpu_topology.h"

#ifdef TRAINER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace trainer {

GpuTopology gpu_topology() {
  GpuTopology t;
#ifdef TRAINER_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return t;
  auto failed = [&](cudaError_t e, const char* what) {
    if (e == cudaSuccess) return false;
    t = GpuTopology{};
    t.error = std::string(what) + ": " + cudaGetErrorString(e);
    return true;
  };
  for (int d = 0; d < n; ++d) {
    char bus[32] = {};
    if (failed(cudaDeviceGetPCIBusId(bus, sizeof bus, d), "cudaDeviceGetPCIBusId")) return t;
    t.pci_bus_ids.emplace_back(bus);
  }
  t.links.assign(n, std::vector<PeerLink>(n));
  for (int from = 0; from < n; ++from)
    for (int to = 0; to < n; ++to) {
      if (from == to) continue;
      PeerLink& l = t.links[from][to];
      int v = 0;
      if (failed(cudaDeviceCanAccessPeer(&v, from, to), "cudaDeviceCanAccessPeer")) return t;
      l.access = v != 0;
      if (!l.access) continue;
      if (failed(cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrPerformanceRank, from, to),
                 "cudaDeviceGetP2PAttribute"))
        return t;
      l.performance_rank = v;
      if (failed(cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrNativeAtomicSupported, from, to),
                 "cudaDeviceGetP2PAttribute"))
        return t;
      l.native_atomics = v != 0;
    }
#endif
  return t;
}

}  // namespace trainer

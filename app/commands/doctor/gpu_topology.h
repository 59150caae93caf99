#pragma once
// Which local GPUs can reach each other directly (peer-to-peer), as the CUDA runtime reports it:
// cudaDeviceCanAccessPeer and cudaDeviceGetP2PAttribute. The runtime does not say NVLink or PCIe; its
// performance rank orders the links of this host (0 = the best kind present), and NVML, which would
// name the link, is not linked into trainer. The all-reduce bus bandwidth `trainer doctor` measures
// next to it is the practical answer (NVLink: hundreds of GB/s; PCIe: tens).
#include <string>
#include <vector>

namespace trainer {

struct PeerLink {
  bool access = false;          // cudaDeviceCanAccessPeer(from, to)
  int performance_rank = -1;    // cudaDevP2PAttrPerformanceRank; -1 without access
  bool native_atomics = false;  // cudaDevP2PAttrNativeAtomicSupported
};

struct GpuTopology {
  std::vector<std::string> pci_bus_ids;      // by device index
  std::vector<std::vector<PeerLink>> links;  // links[from][to]; the diagonal is unused
  std::string error;                         // a runtime call failed (the matrix is then empty)
  int devices() const { return static_cast<int>(pci_bus_ids.size()); }
};

// Empty in a CPU-only build or without a visible GPU.
GpuTopology gpu_topology();

}  // namespace trainer

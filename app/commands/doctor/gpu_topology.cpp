#include "app/commands/doctor/gpu_topology.h"

#include <stdexcept>

#include "nn/runtime.h"

namespace trainer {

GpuTopology gpu_topology() {
  GpuTopology t;
  const int n = runtime::device_count();
  try {
    for (int d = 0; d < n; ++d) t.pci_bus_ids.push_back(runtime::pci_bus_id(d));
    t.links.assign(n, std::vector<PeerLink>(n));
    for (int from = 0; from < n; ++from)
      for (int to = 0; to < n; ++to) {
        if (from == to) continue;
        const runtime::PeerAccess a = runtime::peer_access(from, to);
        t.links[from][to] = {a.access, a.performance_rank, a.native_atomics};
      }
  } catch (const std::runtime_error& e) {
    t = GpuTopology{};
    t.error = e.what();  // "<the CUDA call>: <its error>"
  }
  return t;
}

}  // namespace trainer

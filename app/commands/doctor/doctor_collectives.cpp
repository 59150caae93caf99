#include "app/commands/doctor/doctor_collectives.h"

#include <cstdio>
#include <string>
#include <vector>

#include "app/commands/doctor/gpu_topology.h"
#include "dist/collective_smoke.h"
#include "nn/runtime.h"

namespace trainer {
namespace {

std::string size_text(size_t bytes) {
  char buf[32];
  if (bytes >= (1u << 20))
    std::snprintf(buf, sizeof buf, "%zu MiB", bytes >> 20);
  else
    std::snprintf(buf, sizeof buf, "%zu KiB", bytes >> 10);
  return buf;
}

void report_smoke(DoctorReport& r, const CollectiveSmoke& s, const std::string& how,
                  const std::string& hint) {
  const std::string what = s.backend == "nccl" ? "nccl allreduce" : "allreduce";
  if (!s.correct) {
    r.fail(what, how + ": " + s.error, hint);
    return;
  }
  r.pass(what, how + ": sum and average correct on every rank");
  r.detail("size        time/op     bus bandwidth");
  for (const CollectiveTiming& t : s.timings) {
    char row[96];
    std::snprintf(row, sizeof row, "%-10s %8.3f ms %10.2f GB/s", size_text(t.bytes).c_str(), t.seconds * 1e3,
                  t.bus_gb_per_s);
    r.detail(row);
  }
}

}  // namespace

void check_peer_topology(DoctorReport& r, const SystemInfo& s) {
  if (!s.cuda_build) {
    r.skip("peer-to-peer", "CPU-only build: no GPUs to connect");
    return;
  }
  const GpuTopology t = gpu_topology();
  if (!t.error.empty()) {
    r.warn("peer-to-peer", "cannot read the GPU topology: " + t.error, "nvidia-smi topo -m shows the links");
    return;
  }
  if (t.devices() < 2) {
    r.skip("peer-to-peer", std::to_string(t.devices()) + " GPU(s) visible: nothing to connect");
    return;
  }
  std::string missing;
  for (int a = 0; a < t.devices(); ++a)
    for (int b = 0; b < t.devices(); ++b)
      if (a != b && !t.links[a][b].access)
        missing += (missing.empty() ? "" : ", ") + std::to_string(a) + "->" + std::to_string(b);
  if (missing.empty())
    r.pass("peer-to-peer", "every pair of the " + std::to_string(t.devices()) +
                               " GPUs has direct access (rank: CUDA's link performance rank, 0 = best on "
                               "this host; NVLink vs PCIe: see the bus bandwidth below)");
  else
    r.warn("peer-to-peer",
           "no direct access " + missing + ": NCCL stages those transfers through host memory",
           "nvidia-smi topo -m shows the links; VMs and containers may hide P2P (ACS, IOMMU); "
           "NCCL_P2P_DISABLE must not be set by accident");
  std::string header = "          ";
  for (int b = 0; b < t.devices(); ++b) header += "  GPU" + std::to_string(b) + "        ";
  r.detail(header);
  for (int a = 0; a < t.devices(); ++a) {
    std::string row = "GPU" + std::to_string(a) + "      ";
    for (int b = 0; b < t.devices(); ++b) {
      char cell[24];
      const PeerLink& l = t.links[a][b];
      if (a == b)
        std::snprintf(cell, sizeof cell, "  %-13s", "-");
      else if (!l.access)
        std::snprintf(cell, sizeof cell, "  %-13s", "no P2P");
      else
        std::snprintf(cell, sizeof cell, "  P2P rank %d%-2s", l.performance_rank,
                      l.native_atomics ? " A" : "");
      row += cell;
    }
    r.detail(row + " " + t.pci_bus_ids[a]);
  }
  r.detail("A: native atomics across the link");
}

void check_collectives(DoctorReport& r, const SystemInfo& s, std::chrono::milliseconds timeout) {
  const int gpus = static_cast<int>(s.gpus.size());
  const CollectiveSmoke smoke = local_all_reduce_smoke(gpus, timeout);
  if (smoke.backend == "nccl") {
    report_smoke(r, smoke, "NCCL across " + std::to_string(smoke.ranks) + " GPUs of this process",
                 "multi-GPU training uses NCCL the same way; fix this before a long run");
    return;
  }
  if (runtime::cuda_built())
    r.skip("nccl allreduce",
           std::to_string(gpus) + " GPU(s) visible, needs 2 or more; testing the tcp communicator instead");
  else
    r.skip("nccl allreduce", "CPU-only build; testing the tcp communicator instead");
  report_smoke(r, smoke, "tcp communicator, 2 ranks (threads of this process, on 127.0.0.1)",
               "CPU data parallelism uses this communicator: check that loopback TCP works (firewall, "
               "ulimit -n) and that the machine is not overloaded");
}

}  // namespace trainer

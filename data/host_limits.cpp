#include "data/host_limits.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

namespace trainer {

namespace {

// MemAvailable (kB) from /proc/meminfo: what can be allocated without swapping, page cache included.
int64_t mem_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

}  // namespace

HostLimits this_host_limits() {
  HostLimits limits;
  limits.available_memory = mem_available_bytes();
  limits.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  rlimit nproc{};
  if (::getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY)
    limits.max_user_threads = static_cast<int64_t>(nproc.rlim_cur);
  return limits;
}

int64_t max_loader_workers(const HostLimits& limits) {
  int64_t most = std::max<int64_t>(64, 8 * static_cast<int64_t>(limits.cores));
  // The rank's own threads (the math library's, the metrics server's) count against RLIMIT_NPROC too.
  if (limits.max_user_threads > 0) most = std::min(most, limits.max_user_threads / 2);
  return std::max<int64_t>(most, 1);
}

}  // namespace trainer

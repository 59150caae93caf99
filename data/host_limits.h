#pragma once
// What this host can give a run, read once at start-up so that sizes that cannot fit (a sampler
// permutation larger than memory, a batch that cannot be allocated, more loader threads than the system
// lets a user start) stop the run at once with the config key to change, instead of swapping, dying by
// std::bad_alloc or "Resource temporarily unavailable" after seconds or minutes (issue 30).
#include <cstdint>
#include <string>

#include "nn/format_bytes.h"  // format_bytes, for messages about these limits

namespace trainer {

struct HostLimits {
  int64_t available_memory = 0;  // bytes: /proc/meminfo MemAvailable, else free pages; 0 = unknown
  int cores = 1;                 // std::thread::hardware_concurrency, at least 1
  int64_t max_user_threads = 0;  // RLIMIT_NPROC's soft limit (threads count against it); 0 = unlimited
};

HostLimits this_host_limits();

// The most loader threads (data.workers) a rank may start: 8 per core, at least 64, and below
// RLIMIT_NPROC. More only time-slice the same cores and cost a stack each.
int64_t max_loader_workers(const HostLimits& limits);

}  // namespace trainer

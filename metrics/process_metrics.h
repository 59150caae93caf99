#pragma once
// The process metrics node-exporter and the official client libraries export for a process
// (process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, process_max_fds), read
// from /proc at scrape time. Debian's prometheus-cpp 1.0 has no process collector; these names are the
// ones Grafana's stock "process" panels and users' existing alerts already query.
#include <prometheus/collectable.h>
#include <prometheus/labels.h>

#include <memory>
#include <optional>

namespace trainer {

struct ProcessStats {
  double cpu_seconds = 0.0;     // user + system, /proc/self/stat
  double resident_bytes = 0.0;  // /proc/self/statm
  double open_fds = 0.0;        // entries of /proc/self/fd
  double max_fds = 0.0;         // RLIMIT_NOFILE's soft limit
};

// This process's figures; nullopt where /proc cannot be read (not Linux, a restricted container).
std::optional<ProcessStats> read_process_stats();

// A collectable that reads read_process_stats() on every Collect(), with `labels` on every series. It
// returns no family when /proc cannot be read (absent, rather than a misleading 0).
std::shared_ptr<prometheus::Collectable> make_process_collector(const prometheus::Labels& labels);

}  // namespace trainer

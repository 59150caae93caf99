#pragma once
// The command line of the cuDNN probes (bench/cudnn_fusion_probe, bench/cudnn_bn_probe,
// bench/cudnn_prologue_probe):
//   [--batch 512] [--dtype bf16|f16|both]
#include <cstdlib>
#include <cstring>
#include <string>

namespace trainer::bench {

struct ProbeArgs {
  int batch = 512;
  std::string dtypes = "both";
  // Whether the run covers the dtype named `name` (dtype_name's spelling).
  bool wants(const std::string& name) const { return dtypes == "both" || dtypes == name; }
};

inline ProbeArgs parse_probe_args(int argc, char** argv) {
  ProbeArgs a;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--batch") == 0) a.batch = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--dtype") == 0) a.dtypes = argv[i + 1];
  }
  return a;
}

}  // namespace trainer::bench

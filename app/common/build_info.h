#pragma once
// What this binary was built with, for start-up logs, metrics, bench records and the cross-rank
// build check.
#include <string>

namespace trainer {

struct TrainerBuild {
  std::string version;
  // The git commit the binary was built from, "+dirty.<hash of the diff>" when the tree had
  // uncommitted changes, "unknown" when built outside a git checkout (cmake/source_revision.cmake).
  std::string revision;
  bool cuda = false;
  std::string cuda_version;   // "13.0", or "" without the CUDA backend
  std::string cudnn_version;  // "9.19.0", or ""
  std::string nccl_version;   // nccl.h's, in CUDA builds; "" otherwise
  std::string compiler;
  // What this host loads at run time (CUDA builds; "" otherwise): "driver 13.0, runtime 13.0, cuDNN
  // 9.19.0, NCCL 2.28.9". The headers' versions above can agree across nodes whose installed driver
  // or libraries differ; the cross-rank build check compares these too.
  std::string loaded;
  std::string str() const;  // one line for logs
};

TrainerBuild trainer_build();

}  // namespace trainer

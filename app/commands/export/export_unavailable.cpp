// `trainer export` in a build without ONNX: CMake compiles this file instead of the exporter when
// Debian's libonnx-dev or libprotobuf-dev is missing, so the command says why it does nothing.
#include <cstdio>

#include "app/commands/export/export_command.h"

namespace trainer {

int export_command(const std::vector<std::string>&) {
  std::fputs(
      "trainer export: not built in: this trainer was built without ONNX's protobuf classes. HINT: "
      "apt-get install libonnx-dev libprotobuf-dev (scripts/install-deps.sh), then configure and build "
      "again\n",
      stderr);
  return kExportNotBuiltIn;
}

}  // namespace trainer

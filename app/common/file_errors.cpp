#include "app/common/file_errors.h"

namespace trainer {

std::string describe_filesystem_error(const std::filesystem::filesystem_error& e) {
  // libstdc++'s what() is "filesystem error: <operation>: <reason> [<path1>] [<path2>]".
  const std::string what = e.what(), prefix = "filesystem error: ";
  const size_t begin = what.rfind(prefix, 0) == 0 ? prefix.size() : 0;
  const size_t end = what.find(": ", begin);
  const std::string operation =
      what.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  std::string where = e.path1().string();
  if (!e.path2().empty()) where += " -> " + e.path2().string();
  return operation + " " + where + ": " + e.code().message() + ". HINT: " + file_error_hint(e.code().value());
}

}  // namespace trainer

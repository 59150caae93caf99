#include "app/common/file_errors.h"

#include <cerrno>

namespace trainer {

std::string file_error_hint(const std::error_code& code) {
  switch (code.value()) {
    case EACCES:
    case EPERM:
      return "this user may not write there: choose a directory it owns (train.run_dir, checkpoint.dir) or "
             "fix the permissions";
    case EROFS:
      return "that file system is mounted read-only: choose a directory on a writable one (train.run_dir, "
             "checkpoint.dir)";
    case ENOSPC:
    case EDQUOT:
      return "free space there, or choose a directory on a larger disk (train.run_dir, checkpoint.dir)";
    case ENOTDIR:
    case EEXIST:
      return "a file stands where a directory is expected: remove or rename it, or choose another path";
    case ENOENT:
      return "a part of the path does not exist: check its spelling";
    case ENAMETOOLONG:
      return "choose a shorter path";
    default:
      return "check the path, its permissions and the disk it is on";
  }
}

std::string describe_filesystem_error(const std::filesystem::filesystem_error& e) {
  // libstdc++'s what() is "filesystem error: <operation>: <reason> [<path1>] [<path2>]".
  const std::string what = e.what(), prefix = "filesystem error: ";
  const size_t begin = what.rfind(prefix, 0) == 0 ? prefix.size() : 0;
  const size_t end = what.find(": ", begin);
  const std::string operation =
      what.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  std::string where = e.path1().string();
  if (!e.path2().empty()) where += " -> " + e.path2().string();
  return operation + " " + where + ": " + e.code().message() + ". HINT: " + file_error_hint(e.code());
}

}  // namespace trainer

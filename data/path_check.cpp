#include "data/path_check.h"

#include <cerrno>
#include <system_error>

namespace trainer {

namespace {

PathCheck check(const std::filesystem::path& path, bool directory) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_status status = fs::status(path, error);  // follows links, as opening does
  if (error) {
    // status() reports a path that does not exist as not_found without an error on most systems, but
    // ENOTDIR (a file on the way) and ENOENT may still come back as errors.
    if (error == std::errc::no_such_file_or_directory || error == std::errc::not_a_directory)
      return {PathProblem::missing, "does not exist"};
    return {PathProblem::unreachable, "cannot be read: " + error.message()};
  }
  if (status.type() == fs::file_type::not_found) return {PathProblem::missing, "does not exist"};
  if (directory && status.type() != fs::file_type::directory)
    return {PathProblem::wrong_kind, "is not a directory"};
  if (!directory && status.type() != fs::file_type::regular)
    return {PathProblem::wrong_kind, "is not a regular file"};
  return {};
}

}  // namespace

PathCheck check_directory(const std::filesystem::path& path) { return check(path, true); }
PathCheck check_regular_file(const std::filesystem::path& path) { return check(path, false); }

}  // namespace trainer

#pragma once
// Why a dataset path cannot be used, told apart the way a user needs: a path that does not exist gets an
// install or download hint, one that exists but cannot be reached (permission denied, a symbolic-link
// loop, an I/O error) gets the system's reason and no hint that would send the user to reinstall
// (issue 30: a directory without permission was reported as missing, "apt-get install ...").
#include <filesystem>
#include <string>

namespace trainer {

enum class PathProblem {
  none,         // the path is what was asked for
  missing,      // it, or a directory on the way to it, does not exist (ENOENT, ENOTDIR)
  wrong_kind,   // it exists but is not a directory / not a regular file
  unreachable,  // it cannot be examined: the reason is in PathCheck::reason
};

struct PathCheck {
  PathProblem problem = PathProblem::none;
  // "does not exist", "is not a directory", "is not a regular file", or "cannot be read: <strerror>";
  // empty when problem is none.
  std::string reason;
  explicit operator bool() const { return problem == PathProblem::none; }
};

PathCheck check_directory(const std::filesystem::path& path);
PathCheck check_regular_file(const std::filesystem::path& path);

}  // namespace trainer

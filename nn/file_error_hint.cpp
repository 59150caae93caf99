#include "nn/file_error_hint.h"

#include <cerrno>

namespace trainer {

std::string file_error_hint(int error) {
  switch (error) {
    case EACCES:
    case EPERM:
      return "this user may not write there: choose a path it can write (train.run_dir, checkpoint.dir, or "
             "the path given on the command line) or fix the permissions";
    case EROFS:
      return "that file system is mounted read-only: choose a path on a writable one";
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return "free space there (or raise the quota or the file-size limit), or choose a path on a larger "
             "disk";
    case ENOTDIR:
    case EEXIST:
    case EISDIR:
      return "a file stands where a directory is expected (or a directory where a file is): remove or rename "
             "it, or choose another path";
    case ENOENT:
      return "a directory on the path does not exist: create it, or check the spelling";
    case ENAMETOOLONG:
      return "choose a shorter path";
    default:
      return "check the path, its permissions and the disk it is on";
  }
}

}  // namespace trainer

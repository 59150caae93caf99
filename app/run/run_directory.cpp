#include "app/run/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "app/common/file_errors.h"
#include "nn/format_bytes.h"

namespace trainer {
namespace {

namespace fs = std::filesystem;

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "?";
  return host;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

[[noreturn]] void fail(const std::string& what, const std::string& dir, const std::string& setting,
                       const std::error_code& code) {
  throw RunDirectoryError(what + " " + dir + " (" + setting + "): " + code.message() +
                          ". HINT: " + file_error_hint(code.value()));
}

// What the holder wrote into the lock file: "pid 123 on host h, since <time>: <command>".
std::string holder_of(int fd) {
  char text[1024] = {};
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  std::string holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : "";
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\r')) holder.pop_back();
  return holder.empty() ? "a process that has not written its name yet" : holder;
}

}  // namespace

bool same_directory(const std::string& a, const std::string& b) {
  std::error_code error;
  // The same inode when both exist (bind mounts and links included), else the same normalised path.
  const bool same = fs::equivalent(a, b, error);
  if (!error) return same;
  const fs::path ca = fs::weakly_canonical(a, error);
  if (error) return fs::path(a).lexically_normal() == fs::path(b).lexically_normal();
  const fs::path cb = fs::weakly_canonical(b, error);
  return !error && ca == cb;
}

void create_run_directory(const std::string& dir, const std::string& setting) {
  std::error_code code;
  fs::create_directories(dir, code);
  if (code) fail("cannot create the directory", dir, setting, code);
  if (!fs::is_directory(dir, code))
    fail("cannot use", dir, setting, std::make_error_code(std::errc::not_a_directory));
}

void check_writable(const std::string& dir, const std::string& setting) {
  const std::string probe = (fs::path(dir) / (".trainer-write-test." + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot write into", dir, setting, std::error_code(errno, std::generic_category()));
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int write_errno = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote) fail("cannot write into", dir, setting, std::error_code(write_errno, std::generic_category()));
}

int64_t free_bytes(const std::string& dir) {
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return -1;
  return static_cast<int64_t>(s.f_bavail) * static_cast<int64_t>(s.f_frsize);
}

std::string room_problem(const std::string& dir, const std::string& setting, int64_t needed,
                         const std::string& what) {
  const int64_t free = free_bytes(dir);
  if (free < 0 || free >= needed) return "";
  return "not enough free space in " + dir + " (" + setting + ") for " + what + ": " +
         format_bytes(static_cast<double>(free)) + " free, " + format_bytes(static_cast<double>(needed)) +
         " needed. HINT: free space there, or set checkpoint.dir to a directory on a larger disk";
}

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& setting, const std::string& command) {
  const std::string path = (fs::path(dir) / kFileName).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    fail("cannot create the lock file in", dir, setting, std::error_code(errno, std::generic_category()));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    const std::string holder = e == EWOULDBLOCK ? holder_of(fd_) : "";
    ::close(fd_);
    fd_ = -1;
    if (e != EWOULDBLOCK) fail("cannot lock", dir, setting, std::error_code(e, std::generic_category()));
    throw RunDirectoryError(dir + " (" + setting + ") is in use by another run: " + holder +
                            ". HINT: two runs in one directory overwrite each other's logs and checkpoints; "
                            "give this run its own " +
                            setting + " (train.run_dir = \"\" makes a new one), or stop the other run first");
  }
  const std::string me = "pid " + std::to_string(::getpid()) + " on host " + host_name() + ", since " +
                         utc_now() + ": " + command + "\n";
  // Best effort: the lock itself is the flock, the text only names its holder.
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t n = ::pwrite(fd_, me.data(), me.size(), 0);
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

}  // namespace trainer

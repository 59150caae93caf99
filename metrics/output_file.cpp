#include "metrics/output_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <utility>

#include "nn/file_error_hint.h"

namespace trainer {
namespace {

// Lines are small; a step's worth of them is written at once, well below this.
constexpr size_t kFlushAtBytes = 64 * 1024;

}  // namespace

std::string FullDiskHook::target(const std::string& path) const {
  return names.count(std::filesystem::path(path).filename().string()) ? "/dev/full" : path;
}

FullDiskHook full_disk_hook_from(std::string_view names) {
  FullDiskHook hook;
  std::stringstream list{std::string(names)};
  for (std::string name; std::getline(list, name, ',');)
    if (!name.empty()) hook.names.insert(name);
  return hook;
}

OutputFile::~OutputFile() { release(); }

void OutputFile::release() noexcept {
  if (fd_ < 0) return;
  try {
    flush();
  } catch (...) {  // the owner did not close(): it chose not to learn of a failure
  }
  ::close(std::exchange(fd_, -1));
}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)), buffer_(std::move(other.buffer_)) {}

OutputFile& OutputFile::operator=(OutputFile&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

void OutputFile::fail(const char* what, int error) const {
  throw OutputFileError("cannot " + std::string(what) + " " + path_ + ": " + std::strerror(error) +
                        ". HINT: " +
                        (error == ENOSPC || error == EDQUOT || error == EFBIG
                             ? std::string("free space under the run directory (or raise the quota), then "
                                           "resume with --resume auto from the last checkpoint")
                             : file_error_hint(error)));
}

void OutputFile::open(const std::string& path, Mode mode, const FullDiskHook& hook) {
  open_as(path, hook.target(path), mode);
}

void OutputFile::open_as(const std::string& path, const std::string& write_to, Mode mode) {
  if (fd_ >= 0) close();
  path_ = path;
  buffer_.clear();
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (mode == Mode::append ? O_APPEND : O_TRUNC);
  fd_ = ::open(write_to.c_str(), flags, 0644);
  if (fd_ < 0) fail("open", errno);
}

void OutputFile::write(std::string_view text) {
  buffer_.append(text);
  if (buffer_.size() >= kFlushAtBytes) flush();
}

void OutputFile::flush() {
  if (fd_ < 0) return;
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : EIO;
      buffer_.erase(0, done);
      fail("write", error);
    }
    done += static_cast<size_t>(n);
  }
  buffer_.clear();
}

void OutputFile::sync() {
  flush();
  // Devices and pipes cannot be synced (EINVAL/EROFS): nothing is lost by that.
  if (fd_ >= 0 && ::fsync(fd_) != 0 && errno != EINVAL && errno != EROFS) fail("sync", errno);
}

void OutputFile::close() {
  if (fd_ < 0) return;
  try {
    sync();
  } catch (...) {
    ::close(std::exchange(fd_, -1));
    throw;
  }
  if (::close(std::exchange(fd_, -1)) != 0 && errno != EINTR) fail("close", errno);
}

void write_whole_file(const std::string& path, std::string_view text, const FullDiskHook& hook) {
  const bool hooked = hook.target(path) != path;
  const std::string tmp = hooked ? hook.target(path) : path + ".tmp";
  try {
    OutputFile file;
    file.open_as(path, tmp, OutputFile::Mode::truncate);
    file.write(text);
    file.close();
  } catch (const OutputFileError&) {
    if (!hooked) ::unlink(tmp.c_str());
    throw;
  }
  if (!hooked && ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    throw OutputFileError("cannot replace " + path + ": " + std::strerror(error) +
                          ". HINT: " + file_error_hint(error));
  }
  if (hooked) return;
  // The rename is durable once the directory is: a power loss must not bring the old file back.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace trainer

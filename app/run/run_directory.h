#pragma once
// The directories a run writes (train.run_dir, checkpoint.dir), made safe before the first step:
// created with the trainer's own errors, held by one run at a time, and checked writable with room for
// its checkpoints, so that a mistake costs seconds at start instead of a run's whole length.
//
// One run per directory: a run holds flock() on <dir>/.trainer.lock for its whole life, and writes its
// pid, host and start time into it. A second run (or a --resume into a live run) is refused naming the
// holder; a lock whose holder died is free again, because the kernel drops a dead process's flock.
#include <cstdint>
#include <stdexcept>
#include <string>

namespace trainer {

// A directory a run needs is unusable: the message names it, the setting behind it and a HINT.
class RunDirectoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Whether two paths name one directory: the same inode where both exist, else the same path after
// resolving links and dots.
bool same_directory(const std::string& a, const std::string& b);

// Creates `dir` (and its parents) if missing; `setting` names the config key it comes from.
void create_run_directory(const std::string& dir, const std::string& setting);

// Creates and removes a file in `dir`: throws RunDirectoryError unless this process can write there.
void check_writable(const std::string& dir, const std::string& setting);

// Bytes an unprivileged writer may still use on the file system of `dir`.
int64_t free_bytes(const std::string& dir);

// "" when `dir` has room for `needed` more bytes, else why not, with a HINT. `what` says what the
// bytes are for ("two checkpoints of 1.2 GiB each").
std::string room_problem(const std::string& dir, const std::string& setting, int64_t needed,
                         const std::string& what);

// The exclusive lock of one directory, held from construction to destruction.
class DirectoryLock {
 public:
  // Takes <dir>/.trainer.lock or throws RunDirectoryError naming the holder's pid, host and start.
  // `setting` names the config key of `dir`, `command` is what this run is (for the next one's
  // message).
  DirectoryLock(const std::string& dir, const std::string& setting, const std::string& command);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  static constexpr const char* kFileName = ".trainer.lock";

 private:
  int fd_ = -1;
};

}  // namespace trainer

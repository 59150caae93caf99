#pragma once
// A file the run writes for the user (train.log, train_steps.csv, step_times.csv, summary.json) whose
// every write is checked. A full disk or a quota makes write(2) fail with ENOSPC/EDQUOT, and an
// unchecked stream then drops lines silently or leaves a truncated file while the run exits 0;
// OutputFile throws OutputFileError instead, naming the file and the reason.
//
// Writes are buffered; flush() hands them to the kernel and sync() makes them durable (fsync), which a
// checkpoint needs so that the files agree with it after a crash.
//
// Test hook TRAINER_TEST_FULL_DISK=NAME[,NAME...] (read once at start-up into FaultInjection,
// app/train/fault_injection.h, and passed to each OutputFile): files with these names (train_steps.csv,
// summary.json, ...) are written to /dev/full, where every write fails with ENOSPC, to exercise the full-disk
// path without filling a disk.
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>

namespace trainer {

class OutputFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct FullDiskHook {
  std::set<std::string> names;  // file names (no directory) that go to /dev/full
  // Where a write of `path` goes: /dev/full when hooked, else `path`.
  std::string target(const std::string& path) const;
};
// The hook for a TRAINER_TEST_FULL_DISK value: comma-separated file names.
FullDiskHook full_disk_hook_from(std::string_view names);

class OutputFile {
 public:
  enum class Mode { append, truncate };
  OutputFile() = default;
  ~OutputFile();  // flushes what it can; never throws (call close() to learn of a failure)
  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&& other) noexcept;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Opens `path` (its directory must exist); writes go to hook.target(path).
  void open(const std::string& path, Mode mode, const FullDiskHook& hook = {});
  // Opens `write_to` but names `path` in errors (a temp file that will be renamed to `path`).
  void open_as(const std::string& path, const std::string& write_to, Mode mode);
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  void write(std::string_view text);  // buffered; flushes when the buffer is large
  void flush();                       // the buffer to the kernel
  void sync();                        // flush() + fsync
  void close();                       // sync() and close

 private:
  [[noreturn]] void fail(const char* what, int error) const;
  void release() noexcept;  // flush what can be, close, never throw
  int fd_ = -1;
  std::string path_;
  std::string buffer_;
};

// Writes `text` as the whole of `path` (summary.json, config.toml, a resumed run's CSV) and fsyncs it:
// into `path`.tmp, renamed over `path` once complete, so a failed write leaves the previous file as it
// was instead of a truncated one.
void write_whole_file(const std::string& path, std::string_view text, const FullDiskHook& hook = {});

}  // namespace trainer

#pragma once
// The run's log: every line goes to stdout and, once a run directory exists, to <run_dir>/train.log.
// Progress-bar redraws go to the terminal only, so the file stays one line per event. In the file every
// line starts with its UTC time in ISO 8601 ("2026-12-03T15:04:05.123Z "), so that a log can be lined up
// with metrics, other ranks' logs and the system's; the console keeps the bare lines.
//
// A failed write of the file (a full disk) does not stop training: the console still has every line,
// and stopping would lose the steps since the last checkpoint. The first failure is reported once on
// stderr, the file is closed, and file_failure() says why, so that the run ends with a non-zero exit
// status (its train.log is incomplete).
#include <cstdint>
#include <mutex>
#include <string>

#include "metrics/output_file.h"

namespace trainer {

// "2026-12-03T15:04:05.123Z": `unix_ms` (milliseconds since the epoch) in UTC.
std::string iso8601_utc(int64_t unix_ms);
// `text` with "<stamp> " before each of its lines (a multi-line message, a table).
std::string stamp_lines(const std::string& text, const std::string& stamp);

class Log {
 public:
  static Log& instance();
  // Appends; creates parent directories. Writes go where `hook` says (a test hook, see output_file.h).
  void open_file(const std::string& path, const FullDiskHook& hook = {});
  void close_file();
  void line(const std::string& text);       // stdout + file
  void error(const std::string& text);      // stderr + file
  void transient(const std::string& text);  // a terminal status line redrawn in place (\r), not logged
  bool stdout_is_terminal() const { return tty_; }
  // Ranks other than 0 keep their log in their file and print only errors, so the console shows one
  // copy of every line.
  void set_print_lines(bool on) { print_lines_ = on; }
  // "" while every line reached the file; else why the file is incomplete.
  std::string file_failure() const;

 private:
  Log();
  void end_transient();
  void to_file(const std::string& text);  // with mutex_ held
  mutable std::mutex mutex_;
  OutputFile file_;
  std::string file_failure_;
  bool tty_ = false;
  bool transient_shown_ = false;
  bool print_lines_ = true;
};

}  // namespace trainer

#pragma once
// The run's log: every line goes to stdout and, once a run directory exists, to <run_dir>/train.log.
// Progress-bar redraws go to the terminal only, so the file stays one line per event.
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>

namespace trainer {

class Log {
 public:
  static Log& instance();
  void open_file(const std::string& path);  // appends; creates parent directories
  void close_file();
  void line(const std::string& text);       // stdout + file
  void error(const std::string& text);      // stderr + file
  void transient(const std::string& text);  // a terminal status line redrawn in place (\r), not logged
  bool stdout_is_terminal() const { return tty_; }
  // Ranks other than 0 keep their log in their file and print only errors, so the console shows one
  // copy of every line.
  void set_print_lines(bool on) { print_lines_ = on; }

 private:
  Log();
  void end_transient();
  std::mutex mutex_;
  std::ofstream file_;
  bool tty_ = false;
  bool transient_shown_ = false;
  bool print_lines_ = true;
};

}  // namespace trainer

#include "metrics/log.h"

#include <unistd.h>

#include <filesystem>
#include <iostream>

namespace trainer {

Log& Log::instance() {
  static Log log;
  return log;
}

Log::Log() : tty_(::isatty(STDOUT_FILENO) == 1) {}

void Log::open_file(const std::string& path, const FullDiskHook& hook) {
  std::lock_guard lock(mutex_);
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  file_failure_.clear();
  try {
    file_.open(path, OutputFile::Mode::append, hook);
  } catch (const OutputFileError& e) {
    throw std::runtime_error(std::string("cannot open the log file: ") + e.what());
  }
}

void Log::close_file() {
  std::lock_guard lock(mutex_);
  try {
    file_.close();
  } catch (const OutputFileError& e) {
    if (file_failure_.empty()) file_failure_ = e.what();
  }
}

std::string Log::file_failure() const {
  std::lock_guard lock(mutex_);
  return file_failure_;
}

void Log::to_file(const std::string& text) {
  if (!file_.is_open()) return;
  try {
    file_.write(text);
    file_.write("\n");
    file_.flush();  // a line per write: a crash loses no line, and a failure is seen at once
  } catch (const OutputFileError& e) {
    // Once: the console keeps every line, training goes on, the exit status reports it.
    file_failure_ = e.what();
    file_ = OutputFile();
    end_transient();
    std::cerr << "warning: " << file_failure_
              << "; the log continues on the console only, and the run will exit with status 1\n"
              << std::flush;
  }
}

void Log::end_transient() {
  if (transient_shown_) {
    std::cout << "\r\033[K";
    transient_shown_ = false;
  }
}

void Log::line(const std::string& text) {
  std::lock_guard lock(mutex_);
  end_transient();
  if (print_lines_) std::cout << text << '\n' << std::flush;
  to_file(text);
}

void Log::error(const std::string& text) {
  std::lock_guard lock(mutex_);
  end_transient();
  std::cout << std::flush;
  std::cerr << text << '\n' << std::flush;
  to_file(text);
}

void Log::transient(const std::string& text) {
  std::lock_guard lock(mutex_);
  if (!print_lines_) return;
  std::cout << "\r\033[K" << text << std::flush;
  transient_shown_ = true;
}

}  // namespace trainer

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

void Log::open_file(const std::string& path) {
  std::lock_guard lock(mutex_);
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  file_.open(path, std::ios::app);
  if (!file_) throw std::runtime_error("cannot open log file " + path);
}

void Log::close_file() {
  std::lock_guard lock(mutex_);
  file_.close();
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
  if (file_.is_open()) file_ << text << '\n' << std::flush;
}

void Log::error(const std::string& text) {
  std::lock_guard lock(mutex_);
  end_transient();
  std::cout << std::flush;
  std::cerr << text << '\n' << std::flush;
  if (file_.is_open()) file_ << text << '\n' << std::flush;
}

void Log::transient(const std::string& text) {
  std::lock_guard lock(mutex_);
  if (!print_lines_) return;
  std::cout << "\r\033[K" << text << std::flush;
  transient_shown_ = true;
}

}  // namespace trainer

#include "metrics/log.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>

namespace trainer {

std::string iso8601_utc(int64_t unix_ms) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<int>(unix_ms % 1000));
  return buf;
}

std::string stamp_lines(const std::string& text, const std::string& stamp) {
  std::string out = stamp + ' ';
  for (std::size_t i = 0; i < text.size(); ++i) {
    out += text[i];
    if (text[i] == '\n' && i + 1 < text.size()) out += stamp + ' ';
  }
  return out;
}

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
    using namespace std::chrono;
    const int64_t now_ms = duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
    file_.write(stamp_lines(text, iso8601_utc(now_ms)));
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

#pragma once
// The lines `trainer doctor` prints: one verdict per check (PASS, WARN, FAIL, or SKIP for a check this
// machine cannot run), the detail, and for WARN and FAIL a HINT the user can act on. Shared by the
// doctor's check files so they all print the same way.
#include <cstdio>
#include <string>

namespace trainer {

class DoctorReport {
 public:
  void pass(const std::string& what, const std::string& detail) { line("PASS", what, detail, ""); }
  void skip(const std::string& what, const std::string& detail) { line("SKIP", what, detail, ""); }
  void warn(const std::string& what, const std::string& detail, const std::string& hint) {
    line("WARN", what, detail, hint);
  }
  void fail(const std::string& what, const std::string& detail, const std::string& hint) {
    line("FAIL", what, detail, hint);
    ++failures_;
  }
  // A line under the previous check (a table row), indented past the verdict column.
  void detail(const std::string& text) { std::printf("      %-14s %s\n", "", text.c_str()); }
  int failures() const { return failures_; }

 private:
  void line(const char* verdict, const std::string& what, const std::string& detail,
            const std::string& hint) {
    std::printf("%s  %-14s %s\n", verdict, what.c_str(), detail.c_str());
    // Errors from the config and launcher code carry their own HINT already.
    if (!hint.empty() && detail.find("HINT:") == std::string::npos)
      std::printf("      %-14s HINT: %s\n", "", hint.c_str());
    std::fflush(stdout);  // a later check that crashes must not swallow the lines before it
  }
  int failures_ = 0;
};

}  // namespace trainer

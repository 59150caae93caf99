#pragma once
// A null-terminated array of C strings (argv, envp) for posix_spawn and exec, owning its strings:
// the pointers stay valid as long as the object lives.
#include <string>
#include <utility>
#include <vector>

namespace trainer {

class CStringArray {
 public:
  explicit CStringArray(std::vector<std::string> strings) : strings_(std::move(strings)) {
    for (std::string& s : strings_) pointers_.push_back(s.data());
    pointers_.push_back(nullptr);
  }
  CStringArray(const CStringArray&) = delete;
  CStringArray& operator=(const CStringArray&) = delete;
  char** data() { return pointers_.data(); }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> pointers_;
};

}  // namespace trainer

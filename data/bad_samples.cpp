#include "data/bad_samples.h"

#include <cstdio>

#include "data/data_error.h"

namespace trainer {

BadSamplePolicy parse_bad_sample_policy(std::string_view text) {
  if (text == "error") return BadSamplePolicy::error;
  if (text == "skip") return BadSamplePolicy::skip;
  throw DataError("bad_samples: unknown policy '" + std::string(text) + "': expected \"error\" or \"skip\"");
}

const char* to_string(BadSamplePolicy policy) { return policy == BadSamplePolicy::skip ? "skip" : "error"; }

BadSampleTracker::BadSampleTracker(BadSampleWarn warn) : warn_(std::move(warn)) {
  if (!warn_) warn_ = [](const std::string& message) { std::fprintf(stderr, "%s\n", message.c_str()); };
}

bool BadSampleTracker::known_bad(int64_t index) const {
  std::lock_guard lock(mutex_);
  return bad_.count(index) > 0;
}

void BadSampleTracker::mark_bad(int64_t index, const std::string& message) {
  bool first = false;
  {
    std::lock_guard lock(mutex_);
    first = bad_.insert(index).second;
  }
  if (first) warn_(message);  // outside the lock: the callback may take its own
}

int64_t BadSampleTracker::bad_files() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(bad_.size());
}

}  // namespace trainer

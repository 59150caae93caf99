#pragma once
// What a dataset of one file per sample does when a file cannot be used (truncated or corrupt image,
// unknown format, unreadable file): config key data.bad_samples.
//   error: stop with a DataError naming the file and what is wrong (the default: a broken file is
//          usually a broken copy of the whole dataset, better found at once);
//   skip:  in training, replace the sample by the next good index (index + 1, index + 2, ..., wrapping
//          around), which depends only on the files, never on threads or timing, so runs stay
//          reproducible; warn once per bad file and count every replacement. In evaluation
//          (ImageFolderOptions::drop_bad_samples), leave the sample out (kDroppedSample,
//          data/dataset.h) instead, so every readable image counts exactly once.
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>

namespace trainer {

enum class BadSamplePolicy { error, skip };

// "error" or "skip"; throws DataError otherwise.
BadSamplePolicy parse_bad_sample_policy(std::string_view text);
const char* to_string(BadSamplePolicy policy);

// Receives one line per bad file. The default writes it to stderr.
using BadSampleWarn = std::function<void(const std::string& message)>;

// The bookkeeping of "skip": which indices are known bad (so they are not decoded again), the
// one-time warnings and the replacement count. Thread-safe.
class BadSampleTracker {
 public:
  explicit BadSampleTracker(BadSampleWarn warn);

  bool known_bad(int64_t index) const;
  // Records index as bad; the first time, warns with `message`.
  void mark_bad(int64_t index, const std::string& message);
  void count_replacement() { replacements_.fetch_add(1, std::memory_order_relaxed); }

  int64_t replacements() const { return replacements_.load(std::memory_order_relaxed); }
  int64_t bad_files() const;

 private:
  BadSampleWarn warn_;
  mutable std::mutex mutex_;
  std::unordered_set<int64_t> bad_;
  std::atomic<int64_t> replacements_{0};
};

}  // namespace trainer

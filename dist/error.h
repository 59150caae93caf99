#pragma once
// The one exception type of dist/: every failure of the environment, the store or a collective. The
// message is complete on its own (what failed, on which rank, with which peer) and ends with a HINT
// where the user can act, so the training loop can print it and exit.
#include <stdexcept>
#include <string>

namespace trainer {

class DistError : public std::runtime_error {
 public:
  explicit DistError(const std::string& message) : std::runtime_error(message) {}
};

// A wait in the rendezvous store ended by a stop signal (set_store_wait_interrupt in dist/store.h)
// rather than by the others or its timeout: nothing failed, and the process exits as the signal asks.
class WaitInterrupted : public DistError {
 public:
  WaitInterrupted(const std::string& message, int signal) : DistError(message), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

}  // namespace trainer

#include <algorithm>
#include <vector>

namespace trainer {

// "0, 2-5, 7": a compact list of ranks for messages.
inline std::string format_ranks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace trainer

#pragma once
// The one exception data/ throws for bad input: a missing, truncated or corrupt file, or a dataset
// that does not match what was asked for. Messages name the file and what is wrong, and end with a
// HINT the user can act on when there is one.
#include <stdexcept>
#include <string>

namespace trainer {

class DataError : public std::runtime_error {
 public:
  explicit DataError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace trainer

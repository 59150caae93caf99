#pragma once
// The message of the `Error` that fn throws, or "" when it throws none: the data tests check what the
// error of a bad file or argument says.
#include <string>

#include "data/data_error.h"

namespace trainer::testing {

template <class Error = DataError, class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace trainer::testing

#pragma once
// A model's state-dict names and tensors by name, for the model tests.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nn/modules/module.h"

namespace trainer::testing {

inline std::vector<std::string> keys_of(Module& m) {
  std::vector<std::string> out;
  for (const auto& nt : m.state_dict()) out.push_back(nt.name);
  return out;
}

// The tensor named `key`; a test failure (and a dummy) when the model has none.
inline Tensor find(Module& m, const std::string& key) {
  for (const auto& nt : m.state_dict())
    if (nt.name == key) return *nt.tensor;
  ADD_FAILURE() << "no key " << key;
  return Tensor::zeros({1});
}

}  // namespace trainer::testing

#include "nn/modules/sequential.h"

namespace trainer {

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& m : modules) push_back(m);
}

Variable Sequential::forward(const Variable& x) {
  Variable y = x;
  for (const auto& [name, child] : children()) y = child->forward(y);
  return y;
}

Variable NamedSequential::forward(const Variable& x) {
  Variable y = x;
  for (const auto& [name, child] : children()) y = child->forward(y);
  return y;
}

}  // namespace trainer

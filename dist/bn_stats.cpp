#include "dist/bn_stats.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nn/modules/batch_norm.h"

namespace trainer {

int average_bn_running_stats(Module& model, Comm& comm) {
  std::vector<Tensor*> stats;  // running_mean, running_var of each layer, in module order
  for (auto& [name, m] : model.named_modules()) {
    if (auto* bn = dynamic_cast<BatchNorm2d*>(m)) {
      stats.push_back(&bn->running_mean());
      stats.push_back(&bn->running_var());
    }
  }
  const int layers = static_cast<int>(stats.size() / 2);
  if (comm.world_size() == 1 || stats.empty()) return layers;
  // One flat buffer per (dtype, device); the same grouping and order on every rank.
  std::map<std::pair<int, std::string>, std::vector<Tensor*>> groups;
  for (Tensor* t : stats) groups[{static_cast<int>(t->dtype()), t->device().str()}].push_back(t);
  for (auto& [key, tensors] : groups) {
    int64_t total = 0;
    for (Tensor* t : tensors) total += t->numel();
    Tensor flat = Tensor::empty({total}, tensors.front()->dtype(), tensors.front()->device());
    int64_t at = 0;
    for (Tensor* t : tensors) {
      flat.slice(0, at, at + t->numel()).copy_(t->reshape({t->numel()}));
      at += t->numel();
    }
    comm.all_reduce(flat, ReduceOp::avg);
    at = 0;
    for (Tensor* t : tensors) {
      t->copy_(flat.slice(0, at, at + t->numel()).reshape(t->shape()));
      at += t->numel();
    }
  }
  return layers;
}

}  // namespace trainer

#include "dist/comm.h"

#include "dist/error.h"

namespace trainer {
namespace {

class CompletedWork : public Work {
 public:
  void wait() override {}
  bool completed() const override { return true; }
};

}  // namespace

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
  }
  return "?";
}

Tensor Comm::all_gather_cat(const Tensor& tensor) {
  std::vector<Tensor> parts = all_gather(tensor);
  if (tensor.dim() == 0) throw DistError("all_gather_cat needs tensors with at least one dim, got a scalar");
  Shape shape = parts[0].shape();
  shape[0] = 0;
  for (const Tensor& p : parts) shape[0] += p.size(0);
  Tensor out = Tensor::empty(shape, tensor.dtype(), tensor.device());
  int64_t row = 0;
  for (const Tensor& p : parts) {
    if (p.size(0) == 0) continue;
    Tensor dst = out.slice(0, row, row + p.size(0));
    dst.copy_(p);
    row += p.size(0);
  }
  return out;
}

std::shared_ptr<Work> SingleProcessComm::all_reduce_async(Tensor, ReduceOp) {
  return std::make_shared<CompletedWork>();
}

void SingleProcessComm::broadcast(Tensor&, int root) {
  if (root != 0) throw DistError("broadcast from root " + std::to_string(root) + " in a world of size 1");
}

std::vector<Tensor> SingleProcessComm::all_gather(const Tensor& tensor) { return {tensor.contiguous()}; }

}  // namespace trainer

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

void check_reduce_scatter_shapes(const Tensor& input, const Tensor& output, int world_size) {
  if (input.dtype() != output.dtype() || input.numel() != output.numel() * world_size || output.dim() != 1)
    throw DistError("reduce_scatter: the input " + input.str() + " must hold world_size (" +
                    std::to_string(world_size) + ") x the output's elements, and the output " + output.str() +
                    " must be 1-D of the same dtype");
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

void SingleProcessComm::reduce_scatter(Tensor& input, Tensor& output, ReduceOp) {
  check_reduce_scatter_shapes(input, output, 1);
  if (output.raw_data() != input.raw_data()) output.copy_(input.reshape({input.numel()}));
}

void SingleProcessComm::broadcast(Tensor&, int root) {
  if (root != 0) throw DistError("broadcast from root " + std::to_string(root) + " in a world of size 1");
}

std::vector<Tensor> SingleProcessComm::all_gather(const Tensor& tensor) { return {tensor.contiguous()}; }

}  // namespace trainer

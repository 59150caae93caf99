#include "dist/comm.h"

#include <algorithm>

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

std::vector<int64_t> gather_meta(const Tensor& t) {
  if (t.dim() > kGatherMetaWords - 2)
    throw DistError("all_gather supports tensors of up to " + std::to_string(kGatherMetaWords - 2) + " dims");
  std::vector<int64_t> meta(kGatherMetaWords, 0);
  meta[0] = static_cast<int64_t>(t.dtype());
  meta[1] = t.dim();
  for (int d = 0; d < t.dim(); ++d) meta[2 + d] = t.size(d);
  return meta;
}

std::vector<Shape> check_gather_meta(const int64_t* metas, int world_size, const std::string& what) {
  std::vector<Shape> shapes(world_size);
  std::vector<DType> dtypes(world_size);
  for (int p = 0; p < world_size; ++p) {
    const int64_t* m = metas + kGatherMetaWords * p;
    dtypes[p] = static_cast<DType>(m[0]);
    shapes[p].assign(m + 2, m + 2 + std::clamp<int64_t>(m[1], 0, kGatherMetaWords - 2));
  }
  auto same_but_dim0 = [&](int p) {
    if (dtypes[p] != dtypes[0] || shapes[p].size() != shapes[0].size()) return false;
    return shapes[0].empty() || std::equal(shapes[p].begin() + 1, shapes[p].end(), shapes[0].begin() + 1);
  };
  bool agree = true;
  for (int p = 1; p < world_size; ++p) agree = agree && same_but_dim0(p);
  if (agree) return shapes;
  std::string list;
  for (int p = 0; p < world_size; ++p)
    list += (p ? ", rank " : "rank ") + std::to_string(p) + ": " + shape_str(shapes[p]) + " " +
            std::string(dtype_name(dtypes[p]));
  // Every rank sees the same words, so every rank throws this same error.
  throw DistError(what + ": the ranks' tensors differ in dtype or in a dim other than dim 0 (" + list +
                  "). HINT: only dim 0 (the number of samples) may differ between ranks");
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

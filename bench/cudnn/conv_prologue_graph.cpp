#include "bench/cudnn/conv_prologue_graph.h"

#include "nn/cuda/conv_plan.h"

namespace trainer::bench {

using namespace cudnn_graph;
using namespace cuda::conv_stats;

OpGraph build_prologue(cudnnHandle_t handle, DType dtype, cudnnDataType_t coefficients, const Shape& xs,
                       const Shape& ws, const Shape& ys, const Conv2dParams& p, bool with_genstats) {
  OpGraph g;
  const cudnnDataType_t dt = cudnn_conv::cudnn_type(dtype, "build_prologue");
  const Shape channels_x{1, xs[1], 1, 1}, channels_y{1, ys[1], 1, 1};
  cudnnBackendDescriptor_t x = g.keep(tensor_desc(kX, dt, xs, true, 16)).get();
  cudnnBackendDescriptor_t scale = g.keep(tensor_desc(kScale, coefficients, channels_x, true, 16)).get();
  cudnnBackendDescriptor_t bias = g.keep(tensor_desc(kBias, coefficients, channels_x, true, 16)).get();
  cudnnBackendDescriptor_t scaled =
      g.keep(tensor_desc(kAfterScale, CUDNN_DATA_FLOAT, xs, true, 16, true)).get();
  cudnnBackendDescriptor_t biased =
      g.keep(tensor_desc(kAfterBias, CUDNN_DATA_FLOAT, xs, true, 16, true)).get();
  cudnnBackendDescriptor_t relu = g.keep(tensor_desc(kAfterRelu, CUDNN_DATA_FLOAT, xs, true, 16, true)).get();
  cudnnBackendDescriptor_t w = g.keep(tensor_desc(kW, dt, ws, true, 16)).get();
  cudnnBackendDescriptor_t y = g.keep(tensor_desc(kY, dt, ys, true, 16)).get();
  cudnnBackendDescriptor_t sum = g.keep(tensor_desc(kSum, CUDNN_DATA_FLOAT, channels_y, true, 16)).get();
  cudnnBackendDescriptor_t sqsum = g.keep(tensor_desc(kSqSum, CUDNN_DATA_FLOAT, channels_y, true, 16)).get();
  bool good = x && scale && bias && scaled && biased && relu && w && y && sum && sqsum &&
              add_pointwise(g, CUDNN_POINTWISE_MUL, x, scale, scaled) &&
              add_pointwise(g, CUDNN_POINTWISE_ADD, scaled, bias, biased) &&
              add_pointwise(g, CUDNN_POINTWISE_RELU_FWD, biased, nullptr, relu) &&
              add_conv_forward(g, relu, w, y, p);
  if (with_genstats) good = good && add_genstats(g, y, sum, sqsum);
  if (!good || !g.finalize(handle)) return OpGraph();
  return g;
}

std::vector<int64_t> prologue_pack_uids(bool with_genstats) {
  if (with_genstats) return {kX, kScale, kBias, kW, kY, kSum, kSqSum};
  return {kX, kScale, kBias, kW, kY};
}

}  // namespace trainer::bench

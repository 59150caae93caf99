#include "nn/functional.h"

namespace trainer::F {

Variable max_pool2d(const Variable& x, const Pool2dParams& p) {
  std::pair<Tensor, Tensor> r = backend_for(x.data()).max_pool2d(x.data(), p);
  const Tensor indices = r.second;  // the backend's: i64 into each H*W plane, or u8 within the window
  const Shape x_shape = x.shape();
  return record_op("max_pool2d", r.first, {x}, [indices, x_shape, p](const Tensor& g) -> std::vector<Tensor> {
    return {backend_for(g).max_pool2d_backward(g, indices, x_shape, p)};
  });
}

Variable avg_pool2d(const Variable& x, const Pool2dParams& p) {
  Tensor y = backend_for(x.data()).avg_pool2d(x.data(), p);
  const Shape x_shape = x.shape();
  return record_op("avg_pool2d", y, {x}, [x_shape, p](const Tensor& g) -> std::vector<Tensor> {
    return {backend_for(g).avg_pool2d_backward(g, x_shape, p)};
  });
}

Variable global_avg_pool(const Variable& x) {
  Tensor y = backend_for(x.data()).global_avg_pool(x.data());  // [N, C]
  const Shape x_shape = x.shape();
  // The gradient goes back in the input's layout: a channels-last network would otherwise run the
  // backward of its last block in NCHW and convert at every kernel that wants NHWC.
  const MemoryFormat format = x.data().suggest_memory_format();
  return record_op("global_avg_pool", y, {x}, [x_shape, format](const Tensor& g) -> std::vector<Tensor> {
    return {backend_for(g).global_avg_pool_backward(g, x_shape, format)};
  });
}

}  // namespace trainer::F

// TEMPORARY: placeholders until nn/cpu/conv.cpp and nn/cpu/pool.cpp land. Delete this file then.
#include "nn/cpu/cpu_backend.h"
namespace trainer {
[[noreturn]] static void pending(const char* what) { throw std::logic_error(std::string(what) + ": not yet implemented"); }
Tensor CpuBackend::conv2d(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) { pending("conv2d"); }
Tensor CpuBackend::conv2d_backward_input(const Tensor&, const Tensor&, const Shape&, const Conv2dParams&) { pending("conv2d"); }
Tensor CpuBackend::conv2d_backward_weight(const Tensor&, const Tensor&, const Shape&, const Conv2dParams&) { pending("conv2d"); }
std::pair<Tensor, Tensor> CpuBackend::max_pool2d(const Tensor&, const Pool2dParams&) { pending("pool"); }
Tensor CpuBackend::max_pool2d_backward(const Tensor&, const Tensor&, const Shape&) { pending("pool"); }
Tensor CpuBackend::avg_pool2d(const Tensor&, const Pool2dParams&) { pending("pool"); }
Tensor CpuBackend::avg_pool2d_backward(const Tensor&, const Shape&, const Pool2dParams&) { pending("pool"); }
Tensor CpuBackend::global_avg_pool(const Tensor&) { pending("pool"); }
Tensor CpuBackend::global_avg_pool_backward(const Tensor&, const Shape&) { pending("pool"); }
}  // namespace trainer

// TEMPORARY: placeholders until nn/cpu/batch_norm.cpp, loss.cpp and random.cpp land. Delete this file then.
#include "nn/cpu/cpu_backend.h"
namespace trainer {
[[noreturn]] static void pending(const char* what) { throw std::logic_error(std::string(what) + ": not yet implemented"); }
std::pair<Tensor, Tensor> CpuBackend::bn_mean_var(const Tensor&) { pending("bn"); }
Tensor CpuBackend::bn_apply(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) { pending("bn"); }
std::pair<Tensor, Tensor> CpuBackend::bn_backward_reduce(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { pending("bn"); }
Tensor CpuBackend::bn_backward_input(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t) { pending("bn"); }
std::pair<Tensor, Tensor> CpuBackend::cross_entropy(const Tensor&, const Tensor&, double) { pending("loss"); }
Tensor CpuBackend::cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, double) { pending("loss"); }
Tensor CpuBackend::topk_correct(const Tensor&, const Tensor&, int) { pending("loss"); }
Tensor CpuBackend::argmax(const Tensor&) { pending("loss"); }
Tensor CpuBackend::dropout_mask(const Shape&, double, DType, Generator&) { pending("dropout"); }
}  // namespace trainer

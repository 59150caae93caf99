// TEMPORARY: placeholders until nn/cpu/optim.cpp lands. Delete this file then.
#include "nn/cpu/cpu_backend.h"
namespace trainer {
[[noreturn]] static void pending(const char* what) { throw std::logic_error(std::string(what) + ": not yet implemented"); }
void CpuBackend::sgd_step(Tensor&, const Tensor&, Tensor&, bool, const SgdParams&) { pending("sgd"); }
void CpuBackend::adamw_step(Tensor&, const Tensor&, Tensor&, Tensor&, const AdamWParams&) { pending("adamw"); }
}  // namespace trainer

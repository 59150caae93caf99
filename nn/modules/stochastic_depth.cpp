#include "nn/modules/stochastic_depth.h"

#include <stdexcept>
#include <string>

#include "nn/backend.h"
#include "nn/functional.h"

namespace trainer {

StochasticDepth::StochasticDepth(double p, std::shared_ptr<Generator> gen) : p_(p), gen_(std::move(gen)) {
  if (!(p >= 0.0 && p < 1.0))
    throw std::invalid_argument("StochasticDepth: p must be in [0, 1), got " + std::to_string(p));
  if (!gen_ && p > 0.0) throw std::invalid_argument("StochasticDepth: a Generator is required when p > 0");
}

Variable StochasticDepth::forward(const Variable& x) {
  if (!training_ || p_ == 0.0) return x;
  return F::multiply_by_mask("drop_path", x, mask_for(x));
}

Variable StochasticDepth::add_scaled_branch(const Variable& x, const Variable& branch,
                                            const Variable& scale) {
  const bool drops = training_ && p_ > 0.0;
  return F::scaled_residual_add(x, branch, scale, drops ? mask_for(branch) : Tensor());
}

void StochasticDepth::stage_mask(int64_t batch, int64_t capacity, DType dtype, Device device) {
  if (batch < 1 || batch > capacity)
    throw std::invalid_argument("StochasticDepth::stage_mask: a batch of " + std::to_string(batch) +
                                " for a staging buffer of " + std::to_string(capacity));
  if (dtype != DType::f32 && dtype != DType::f64)
    throw std::invalid_argument("StochasticDepth::stage_mask: stages f32 or f64 masks");
  if (!gen_) throw std::logic_error("StochasticDepth::stage_mask: no Generator (p = 0 draws nothing)");
  const Tensor drawn = cpu_backend().dropout_mask({batch}, p_, dtype, *gen_);
  if (!staged_.defined() || staged_.numel() != capacity || staged_.dtype() != dtype ||
      staged_.device() != device)
    staged_ =
        Tensor::empty({capacity}, dtype, device);  // once per run: the trainer's arguments do not change
  Tensor slot = staged_.slice(0, 0, batch);
  slot.copy_(drawn);  // queued on the device's stream ahead of the step that reads it
  staged_batch_ = batch;
}

Tensor StochasticDepth::mask_for(const Variable& x) {
  if (x.dim() < 1 || staged_batch_ != x.size(0) || staged_.device() != x.device())
    return F::drop_path_mask(x, p_, *gen_);
  staged_batch_ = -1;
  Shape shape(x.dim(), 1);
  shape[0] = x.size(0);
  const Tensor mask = staged_.slice(0, 0, x.size(0)).reshape(shape);
  return mask.dtype() == x.dtype() ? mask : mask.to(x.dtype());
}

DropPathStager::DropPathStager(Module& model, int64_t max_batch) : max_batch_(max_batch) {
  if (max_batch < 1) throw std::invalid_argument("DropPathStager: max_batch must be positive");
  for (const auto& [name, module] : model.named_modules())
    if (auto* depth = dynamic_cast<StochasticDepth*>(module); depth && depth->p() > 0.0)
      modules_.push_back(depth);
  const std::vector<Variable> params = model.parameters();
  if (!params.empty() && params.front().dtype() == DType::f64) dtype_ = DType::f64;
}

void DropPathStager::stage(int64_t batch, Device device) {
  for (StochasticDepth* depth : modules_)
    if (depth->is_training()) depth->stage_mask(batch, max_batch_, dtype_, device);
}

}  // namespace trainer

#pragma once
// Stochastic depth as torchvision.ops.StochasticDepth(p, mode="row"): in training, drops a residual
// branch for each sample with probability p (the sample's branch output becomes 0) and scales the kept
// ones by 1/(1-p); identity in evaluation. It has no parameters, so a model's state dict is the same
// with it or without it. The masks come from a Generator shared with the owner, as Dropout's do.
//
// A training step recorded as a CUDA graph cannot draw on the host inside the step: a replay would read
// the capture's mask again, or a host buffer long since reused. So the trainer stages each step's masks
// ahead (DropPathStager): drawn on the host in module order -- the order the forward draws them --
// and copied into a buffer at one device address that the forward reads (and a graph captures). A
// forward with nothing staged draws as before.
#include <memory>
#include <vector>

#include "nn/modules/module.h"
#include "nn/random.h"

namespace trainer {

class StochasticDepth : public Module {
 public:
  StochasticDepth(double p, std::shared_ptr<Generator> gen);
  Variable forward(const Variable& x) override;  // [N, ...] -> same
  double p() const { return p_; }
  // x + forward(branch) with a scale per channel applied to the branch first, in one op
  // (F::scaled_residual_add; ConvNeXt's block end): the same mask draws as forward.
  Variable add_scaled_branch(const Variable& x, const Variable& branch, const Variable& scale);
  // Draws the mask of the next forward, for a batch of `batch`, and copies it into the staging buffer
  // on `device` (in `dtype`: f32, or f64 for an f64 model; converted to the branch's dtype when read).
  // The buffer is allocated once, for `capacity` samples, and keeps its address (a captured graph reads
  // it); a larger batch throws.
  void stage_mask(int64_t batch, int64_t capacity, DType dtype, Device device);

 private:
  // The mask for x: the staged one when it is x's batch (then consumed), else drawn now.
  Tensor mask_for(const Variable& x);

  double p_;
  std::shared_ptr<Generator> gen_;
  Tensor staged_;              // [capacity] on the staging device
  int64_t staged_batch_ = -1;  // the batch staged for the next forward; -1: none
};

// The StochasticDepth modules of a model that draw masks (p > 0), in module order, found once: stages
// each step's masks ahead of its forward (the trainer's, for its CUDA graph).
class DropPathStager {
 public:
  // max_batch: the largest batch a forward will see (the per-rank data.batch_size).
  DropPathStager(Module& model, int64_t max_batch);
  bool empty() const { return modules_.empty(); }
  // Stages the next forward's mask of each of them in training mode (stage_mask), for a batch of
  // `batch` on `device`, in the model's precision (f64 for an f64 model, else f32).
  void stage(int64_t batch, Device device);

 private:
  std::vector<StochasticDepth*> modules_;
  int64_t max_batch_;
  DType dtype_ = DType::f32;
};

}  // namespace trainer

#pragma once
// Batch normalisation over N, H, W per channel, as torch.nn.BatchNorm2d: parameters weight/bias [C]
// (affine), buffers running_mean/running_var [C] and num_batches_tracked (i64 scalar), so that
// state dicts match torchvision's. Training mode normalises with batch statistics and updates the
// running ones; evaluation mode uses the running statistics.
#include <cstdint>
#include <functional>
#include <utility>

#include "nn/modules/module.h"

namespace trainer {

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = true);
  Variable forward(const Variable& x) override;  // [N, C, H, W] -> same
  // relu(bn(x) + residual) (residual may be undefined), fused into the normalisation's pass where
  // the backend can; a training-forward hook (SyncBatchNorm) runs the tail as separate ops.
  Variable forward(const Variable& x, const Variable& residual, bool relu);
  void reset_parameters();     // weight 1, bias 0
  void reset_running_stats();  // mean 0, var 1, count 0

  // Replaces the training-mode normalisation (not the bookkeeping: forward still counts the batch),
  // e.g. with batch statistics over all ranks (dist/sync_batch_norm.h). A hook rather than a subclass
  // swap because models call their typed BatchNorm2d members directly, and converting in place keeps
  // the parameters the optimizer and the gradient reducer already hold. Evaluation mode never uses it.
  using TrainingForward = std::function<Variable(BatchNorm2d&, const Variable&)>;
  void set_training_forward(TrainingForward f) { training_forward_ = std::move(f); }
  bool has_training_forward() const { return static_cast<bool>(training_forward_); }

  int64_t num_features() const { return num_features_; }
  double eps() const { return eps_; }
  double momentum() const { return momentum_; }
  Variable& weight() { return weight_; }  // undefined when !affine
  Variable& bias() { return bias_; }
  Tensor& running_mean() { return *running_mean_; }
  Tensor& running_var() { return *running_var_; }
  Tensor& num_batches_tracked() { return *num_batches_tracked_; }

 private:
  void count_batch();

  int64_t num_features_;
  double eps_, momentum_;
  Variable weight_, bias_;
  Tensor* running_mean_;  // buffers owned by Module; addresses are stable
  Tensor* running_var_;
  Tensor* num_batches_tracked_;
  TrainingForward training_forward_;  // empty: this process's batch statistics
};

}  // namespace trainer

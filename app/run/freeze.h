#pragma once
// model.freeze and model.freeze_epochs: the parameters a fine-tuning run leaves untrained, and for how
// many epochs. A frozen parameter does not require a gradient, so backward computes none for it (nor
// for the layers before it when they are all frozen), the optimizer skips it (no update, no weight
// decay, no state: torch.optim's treatment of a parameter whose grad is None) and the data-parallel
// reducer leaves it out of its buckets. Whether a parameter is frozen depends on the epoch alone, so a
// resumed run is frozen exactly as the uninterrupted one was. BatchNorm layers keep training mode
// (configs/reference.toml says why).
#include <cstdint>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "nn/modules/module.h"

namespace trainer {

class FrozenParameters {
 public:
  FrozenParameters() = default;  // nothing frozen
  // Matches model.freeze against `model`'s parameter names: a name given is a prefix ending at a dot
  // ("layer1" is layer1.* but not layer10.*), "backbone" everything outside `head_prefix` (the
  // registry's classifier_prefix). Throws ConfigError at model.freeze for a name that matches no
  // parameter (listing the model's top-level groups) and for a freeze that leaves nothing to train.
  FrozenParameters(const Config& config, const Module& model, const std::string& head_prefix);

  bool any() const { return !params_.empty(); }
  // Whether the parameters are frozen in `epoch` (0-based): in the first model.freeze_epochs epochs,
  // or in every epoch when it is 0.
  bool frozen_in(int64_t epoch) const { return any() && (epochs_ == 0 || epoch < epochs_); }
  // Sets the parameters' requires_grad to !frozen. Call between steps, with no gradient pending.
  void set_frozen(bool frozen) const;

  int64_t tensors() const { return static_cast<int64_t>(params_.size()); }
  int64_t elements() const { return elements_; }
  // For the log when the freeze starts: what is frozen, until when, and what trains.
  std::string describe() const;
  // For the log when the freeze ends at `epoch` (0-based).
  std::string describe_end(int64_t epoch) const;

 private:
  std::vector<NamedParameter> params_;  // the frozen ones, in registration order
  std::vector<std::string> names_;      // model.freeze as written
  int epochs_ = 0;                      // model.freeze_epochs
  int64_t elements_ = 0;
  int64_t trained_tensors_ = 0, trained_elements_ = 0;  // what the freeze leaves trainable
};

}  // namespace trainer

#pragma once
// Everything a run is made of, built from a resolved Config: datasets, model, optimizer and LR
// schedule. `trainer train` and `trainer eval` share this so they build identical models.
#include <memory>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/run/datasets.h"
#include "app/run/device_setup.h"
#include "app/run/freeze.h"
#include "nn/models/registry.h"
#include "nn/modules/module.h"
#include "nn/optim/ema.h"
#include "nn/optim/lr_schedule.h"
#include "nn/optim/optimizer.h"
#include "nn/random.h"

namespace trainer {

struct Experiment {
  Config config;
  Datasets data;
  Normalization normalization;
  std::shared_ptr<Generator> dropout_generator;
  std::shared_ptr<Module> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<LrSchedule> schedule;
  // ema.enabled (and decay > 0): the weight average, made by make_model_ema once the model holds the
  // weights every rank starts from; null otherwise.
  std::unique_ptr<ModelEma> ema;
  Device device;
  PrecisionPolicy precision;  // decided once for the device (RunDevice)
  int world_size = 1;
  int rank = 0;
  int local_world_size = 1;     // this node's ranks, which share its cores and memory
  int64_t steps_per_epoch = 0;  // optimizer steps per epoch on this rank
  int64_t total_steps = 0;      // optimizer steps of the whole run (max_steps applied)
  // The LR schedule spans train.epochs whatever train.max_steps says: max_steps only stops the run, so
  // a short run follows the exact LR curve of the full one (as timm and torchrun users expect).
  int64_t schedule_steps = 0;
  int64_t warmup_steps = 0;                 // the schedule's linear warm-up (after cut_warmup_to_fit)
  std::vector<std::string> schedule_notes;  // for the log: warm-up cut, run stopped before the schedule ends
  std::string pretrained_note;              // for the log: what model.pretrained loaded; "" without one
  FrozenParameters frozen;                  // model.freeze (with the optimizer only); applied per epoch
  double base_lr = 0.0;                     // after linear scaling
};

// The samples of one optimizer step over all ranks: data.batch_size x grad_accum_steps x world_size.
int64_t global_batch(const Config& config, int world_size);

// The options create_model gets for `config` on images of `channels` x image_size x image_size in
// `num_classes` classes (the dataset's, unless model.in_channels / num_classes set them): what
// build_experiment builds, and `trainer predict` / `export` rebuild from a model card without the data.
ModelOptions model_options_for(const Config& config, int64_t channels, int64_t num_classes,
                               int64_t image_size);

// The weight average of `model` that the config asks for (ema.*), or null.
std::unique_ptr<ModelEma> make_model_ema(const Config& config, Module& model);

// Builds everything with the model on `device`; with_optimizer=false skips the optimizer and schedule
// (evaluation). local_world_size: the ranks on this node (ProcessEnv::local_world_size, read at start-up).
Experiment build_experiment(const Config& config, const RunDevice& run_device, bool with_optimizer,
                            int world_size = 1, int rank = 0, int local_world_size = 1);

}  // namespace trainer

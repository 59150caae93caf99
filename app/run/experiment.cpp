#include "app/run/experiment.h"

#include <cmath>

#include "app/common/format.h"
#include "app/run/device_setup.h"
#include "app/run/pretrained.h"
#include "data/distributed_sampler.h"
#include "data/repeated_aug_sampler.h"
#include "nn/models/registry.h"
#include "nn/optim/adamw.h"
#include "nn/optim/lamb.h"
#include "nn/optim/lars.h"
#include "nn/optim/sgd.h"

namespace trainer {
namespace {

// timm's Lamb and Lars; betas, eps, weight decay and its groups as the other optimizers read them.
std::unique_ptr<Optimizer> make_layerwise_optimizer(const OptimConfig& o, Module& model, double lr) {
  if (o.name == OptimizerKind::lamb) {
    LambOptions l;
    l.lr = lr;
    l.beta1 = o.betas.at(0);
    l.beta2 = o.betas.at(1);
    l.eps = o.eps;
    l.weight_decay = o.weight_decay;
    l.max_grad_norm = o.max_grad_norm;
    l.trust_clip = o.trust_clip;
    l.no_decay_bn_bias = o.no_decay_bn_bias;
    l.layer_decay = o.layer_decay;
    return std::make_unique<Lamb>(model.named_parameters(), l);
  }
  LarsOptions l;
  l.lr = lr;
  l.momentum = o.momentum;
  l.dampening = o.dampening;
  l.nesterov = o.nesterov;
  l.weight_decay = o.weight_decay;
  l.trust_coeff = o.trust_coeff;
  l.eps = o.eps;
  l.trust_clip = o.trust_clip;
  l.no_decay_bn_bias = o.no_decay_bn_bias;
  l.layer_decay = o.layer_decay;
  return std::make_unique<Lars>(model.named_parameters(), l);
}

std::unique_ptr<Optimizer> make_optimizer(const Config& c, Module& model, double lr) {
  const OptimConfig& o = c.optim;
  if (o.name == OptimizerKind::lamb || o.name == OptimizerKind::lars)
    return make_layerwise_optimizer(o, model, lr);
  if (o.name == OptimizerKind::sgd) {
    SgdOptions s;
    s.lr = lr;
    s.momentum = o.momentum;
    s.nesterov = o.nesterov;
    s.weight_decay = o.weight_decay;
    s.no_decay_bn_bias = o.no_decay_bn_bias;
    s.layer_decay = o.layer_decay;
    return std::make_unique<Sgd>(model.named_parameters(), s);
  }
  AdamWOptions a;
  a.lr = lr;
  a.beta1 = o.betas.at(0);
  a.beta2 = o.betas.at(1);
  a.eps = o.eps;
  a.weight_decay = o.weight_decay;
  a.no_decay_bn_bias = o.no_decay_bn_bias;
  a.layer_decay = o.layer_decay;
  return std::make_unique<AdamW>(model.named_parameters(), a);
}

// Cuts a warm-up longer than the whole schedule (cut_warmup_to_fit) and says so; says too when
// train.max_steps stops the run before the schedule ends, since the LR then never reaches its end.
std::vector<std::string> schedule_notes(const Config& c, const Experiment& e, ScheduleOptions& s) {
  std::vector<std::string> notes;
  const int64_t configured_warmup = s.warmup_steps;
  if (cut_warmup_to_fit(s))
    notes.push_back(
        fmt("schedule.warmup_epochs = %g (%lld steps) is not shorter than the whole %lld-step "
            "schedule (train.epochs %d x %lld steps/epoch): warm-up cut to %lld steps, half "
            "the schedule",
            c.schedule.warmup_epochs, static_cast<long long>(configured_warmup),
            static_cast<long long>(s.total_steps), c.train.epochs, static_cast<long long>(e.steps_per_epoch),
            static_cast<long long>(s.warmup_steps)));
  if (e.total_steps < e.schedule_steps)
    notes.push_back(fmt(
        "train.max_steps = %d stops the run at step %lld of the %lld-step LR schedule "
        "(train.epochs %d x %lld steps/epoch): the LR follows the full run's curve and "
        "does not reach its end. HINT: lower train.epochs to shorten the schedule itself",
        c.train.max_steps, static_cast<long long>(e.total_steps), static_cast<long long>(e.schedule_steps),
        c.train.epochs, static_cast<long long>(e.steps_per_epoch)));
  return notes;
}

void open_data(Experiment& e, const Config& config) {
  e.data = open_datasets(config, e.local_world_size);
  const Dataset& train = *e.data.train;
  e.normalization = resolved_normalization(config, train);
  if (!e.normalization.mean.empty() && e.normalization.mean.size() != 1 &&
      static_cast<int64_t>(e.normalization.mean.size()) != train.channels())
    throw config_error_at(config, "data.normalize_mean",
                          "has " + std::to_string(e.normalization.mean.size()) +
                              " values but the dataset has " + std::to_string(train.channels()) +
                              " channels");
}

// The ViT's and ConvNeXt's sizes where the config sets them (0, empty or -1: the model's own).
void set_transformer_options(ModelOptions& m, const ModelConfig& c) {
  if (c.patch_size > 0) m.patch_size = c.patch_size;
  if (c.depth > 0) m.depth = c.depth;
  if (c.heads > 0) m.heads = c.heads;
  if (c.width > 0) m.width = c.width;
  if (c.mlp_dim > 0) m.mlp_dim = c.mlp_dim;
  m.depths.assign(c.depths.begin(), c.depths.end());
  m.widths.assign(c.widths.begin(), c.widths.end());
  m.stem_patch = c.stem_patch;
  if (c.drop_path >= 0) m.drop_path = c.drop_path;
  m.layer_scale = c.layer_scale;
}

}  // namespace

ModelOptions model_options_for(const Config& config, int64_t channels, int64_t num_classes,
                               int64_t image_size) {
  ModelOptions m;
  m.name = config.model.name;
  m.in_channels = config.model.in_channels > 0 ? config.model.in_channels : channels;
  m.num_classes = config.model.num_classes > 0 ? config.model.num_classes : num_classes;
  m.image_size = image_size;
  // "auto" picks a ResNet's stem by image size; other models have no stem choice (a set one reaches
  // them, and ConvNeXt refuses it).
  const bool has_stem = model_has_stem_choice(config.model.name);
  const StemChoice stem = config.model.stem != StemChoice::automatic ? config.model.stem
                          : !has_stem                                ? StemChoice::imagenet
                          : image_size <= 64                         ? StemChoice::cifar
                                                                     : StemChoice::imagenet;
  m.stem = setting_name(stem);
  m.dropout = config.model.dropout;
  set_transformer_options(m, config.model);
  m.seed = static_cast<uint64_t>(config.train.seed);
  return m;
}

namespace {

void build_model(Experiment& e, const Config& config) {
  const Dataset& train = *e.data.train;
  ModelOptions m = model_options_for(config, train.channels(), train.num_classes(), train.height());
  e.dropout_generator =
      std::make_shared<Generator>(static_cast<uint64_t>(config.train.seed) ^ 0x9e3779b97f4a7c15ull);
  m.dropout_generator = e.dropout_generator;
  if (m.in_channels != train.channels())
    throw config_error_at(config, "model.in_channels",
                          "is " + std::to_string(m.in_channels) + " but the dataset has " +
                              std::to_string(train.channels()) + " channels");
  try {
    e.model = create_model(m);
  } catch (const std::invalid_argument& err) {
    throw config_error_at(config, "model.name", err.what());
  }
  if (!config.model.pretrained.empty()) {
    try {
      e.pretrained_note = load_pretrained(config.model.pretrained, *e.model, classifier_prefix(m.name))
                              .summary(config.model.pretrained);
    } catch (const std::exception& err) {
      throw config_error_at(config, "model.pretrained", err.what());
    }
  }
  e.model->to(e.device);
  // A channels-last network keeps its convolution weights channels-last too (see Module::to).
  if (e.precision.input_format == MemoryFormat::channels_last) e.model->to(MemoryFormat::channels_last);
}

// This rank's share of an epoch's samples, as the sampler will deal them (the same on every rank).
int64_t samples_per_rank(const Experiment& e, const Config& config) {
  if (config.data.repeated_augmentations == 1)
    return DistributedSampler(e.data.train->size(), e.world_size, e.rank, config.data.shuffle, 0,
                              config.data.drop_last)
        .num_samples();
  try {
    return RepeatedAugSampler(e.data.train->size(), e.world_size, e.rank, config.data.shuffle, 0,
                              config.data.repeated_augmentations)
        .num_samples();
  } catch (const std::invalid_argument& err) {
    throw config_error_at(config, "data.repeated_augmentations", err.what());
  }
}

// Steps per epoch come from this rank's share of the samples, as the sampler will deal them.
void count_steps(Experiment& e, const Config& config) {
  const int64_t per_rank = samples_per_rank(e, config);
  const int64_t batches = steps_per_epoch(per_rank, config.data.batch_size, config.data.drop_last);
  e.steps_per_epoch = batches / config.train.grad_accum_steps;
  if (e.steps_per_epoch < 1)
    throw config_error_at(config, "data.batch_size",
                          "leaves no optimizer step in an epoch (" + std::to_string(batches) +
                              " batches, grad_accum_steps " + std::to_string(config.train.grad_accum_steps) +
                              ")");
  e.schedule_steps = e.steps_per_epoch * config.train.epochs;
  e.total_steps = e.schedule_steps;
  if (config.train.max_steps > 0) e.total_steps = std::min<int64_t>(e.total_steps, config.train.max_steps);
}

double scaled_base_lr(const Config& config, int world_size) {
  double lr = config.optim.lr;
  if (config.optim.lr_scaling == LrScaling::linear)
    lr *= static_cast<double>(global_batch(config, world_size)) / config.optim.base_batch_size;
  return lr;
}

void build_optimizer_and_schedule(Experiment& e, const Config& config) {
  e.optimizer = make_optimizer(config, *e.model, e.base_lr);
  ScheduleOptions s;
  s.kind = config.schedule.name;
  s.total_steps = e.schedule_steps;
  s.steps_per_epoch = e.steps_per_epoch;
  s.warmup_steps = static_cast<int64_t>(std::llround(config.schedule.warmup_epochs * e.steps_per_epoch));
  e.schedule_notes = schedule_notes(config, e, s);
  e.warmup_steps = s.warmup_steps;
  s.warmup_start_factor = config.schedule.warmup_start_factor;
  s.step_epochs = config.schedule.step_epochs;
  s.milestones.assign(config.schedule.milestones.begin(), config.schedule.milestones.end());
  s.gamma = config.schedule.gamma;
  s.min_lr_factor = config.schedule.min_lr_factor;
  e.schedule = make_lr_schedule(s);
}

}  // namespace

std::unique_ptr<ModelEma> make_model_ema(const Config& config, Module& model) {
  const EmaConfig& c = config.ema;
  if (!c.active()) return nullptr;
  EmaOptions o;
  o.decay = c.decay;
  o.warmup = c.warmup;
  o.warmup_gamma = c.warmup_gamma;
  o.warmup_power = c.warmup_power;
  o.min_decay = c.min_decay;
  o.every_steps = c.every_steps;
  o.average_buffers = c.average_buffers;
  try {
    return std::make_unique<ModelEma>(model, o);
  } catch (const std::invalid_argument& err) {
    throw config_error_at(config, "ema.decay", err.what());
  }
}

int64_t global_batch(const Config& config, int world_size) {
  return static_cast<int64_t>(config.data.batch_size) * config.train.grad_accum_steps * world_size;
}

Experiment build_experiment(const Config& config, const RunDevice& run_device, bool with_optimizer,
                            int world_size, int rank, int local_world_size) {
  Experiment e;
  e.config = config;
  e.device = run_device.device;
  e.precision = run_device.precision;
  e.world_size = world_size;
  e.rank = rank;
  e.local_world_size = local_world_size;
  open_data(e, config);
  build_model(e, config);
  count_steps(e, config);
  e.base_lr = scaled_base_lr(config, e.world_size);
  if (with_optimizer) {
    build_optimizer_and_schedule(e, config);
    e.frozen = FrozenParameters(config, *e.model, classifier_prefix(config.model.name));
  }
  return e;
}

}  // namespace trainer

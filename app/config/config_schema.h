#pragma once
// The configuration schema, internal to app/config/config*.cpp: the list of every key with its rule. One
// list drives loading, validation, config_to_toml and config_table, so a new key is one line here
// plus its struct member (config.h) and its documentation (configs/reference.toml).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "app/config/config.h"

namespace trainer::config_schema {

// An old value a string key still accepts: read as `value`, with a warning that says `why` and asks
// for the new name (e.g. dist.backend "gloo" -> "tcp").
struct Alias {
  std::string old_value;
  std::string value;
  std::string why;
};

// What a key allows beyond its type. Numbers are checked as doubles (exact for every bound we use);
// array rules apply to every element.
struct Rule {
  std::vector<std::string> one_of;  // strings: the allowed values; empty = any string
  std::optional<double> min, max;
  bool min_exclusive = false;
  bool max_exclusive = false;
  std::optional<double> special;     // a value allowed outside [min, max], e.g. workers = -1
  std::string special_meaning;       // what the special value means, for the message
  std::size_t exact_size = 0;        // arrays: required length; 0 = any
  bool strictly_increasing = false;  // arrays
  std::vector<Alias> aliases;        // strings: old values still accepted; not listed in messages
};

inline Rule any() { return {}; }
Rule one_of(std::vector<std::string> allowed);
Rule at_least(double min);                 // [min, inf)
Rule greater_than(double min);             // (min, inf)
Rule closed(double min, double max);       // [min, max]
Rule half_open(double min, double max);    // [min, max)
Rule open_closed(double min, double max);  // (min, max]
// `rule`, plus `value` (meaning `meaning`, e.g. "auto") allowed as well.
Rule or_special(Rule rule, double value, std::string meaning);
Rule exactly(std::size_t size, Rule element);
Rule increasing(Rule element);
// `rule`, plus the old value of `alias` accepted as its new one.
Rule with_alias(Rule rule, Alias alias);
// The alias of `rule` whose old value is `value`, or nullptr.
const Alias* find_alias(const Rule& rule, const std::string& value);

// What is wrong with a value, or "" when the rule allows it: "must be >= 1, got 0".
std::string check_number(const Rule& rule, double value);
std::string check_string(const Rule& rule, const std::string& value);

// Formatting shared by messages and writers.
std::string format_number(double value);          // shortest text that reads back to the same double
std::string toml_float(double value);             // format_number, always a TOML float ("1.0", "1e-08")
std::string toml_quote(const std::string& text);  // a TOML basic string with escapes
// " (did you mean 'optim.lr'?)" for an unknown dotted key, or a pointer to the reference config.
std::string suggest_key(const std::string& dotted, const std::vector<std::string>& keys);
// " (did you mean '[optim]'?)" for an unknown section, or the list of sections.
std::string suggest_section(const std::string& name);
// The closest of `candidates` to `word` by edit distance, or "" when none is close enough.
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

// Config::origin of a key that was not written anywhere.
inline constexpr const char* kDefaultOrigin = "(default)";

inline constexpr const char* kSections[] = {"model", "data",       "augment", "train", "optim", "schedule",
                                            "dist",  "checkpoint", "metrics", "mixup", "ema"};

// One visitor per [table], each taking that table's struct (const or not) and calling
// visit(section, key, member, rule) for its keys in schema (and file) order.
template <typename Model, typename Visit>
void visit_model_fields(Model& m, Visit&& visit) {
  visit("model", "name", m.name,
        one_of({"mlp", "cnn", "resnet18", "resnet34", "resnet50", "vit_b_16", "vit_s_16", "vit",
                "convnext_tiny", "convnext"}));
  visit("model", "stem", m.stem, one_of(setting_names<StemChoice>()));
  visit("model", "num_classes", m.num_classes, or_special(at_least(2), 0, "from the dataset"));
  visit("model", "in_channels", m.in_channels, or_special(at_least(1), 0, "from the dataset"));
  visit("model", "dropout", m.dropout, half_open(0, 1));
  visit("model", "pretrained", m.pretrained, any());
  visit("model", "freeze", m.freeze, any());  // prefixes checked against the model (app/run/freeze.h)
  visit("model", "freeze_epochs", m.freeze_epochs, or_special(at_least(1), 0, "the whole run"));
  visit("model", "patch_size", m.patch_size, or_special(at_least(1), 0, "the model's own"));
  visit("model", "depth", m.depth, or_special(at_least(1), 0, "the model's own"));
  visit("model", "heads", m.heads, or_special(at_least(1), 0, "the model's own"));
  visit("model", "width", m.width, or_special(at_least(1), 0, "the model's own"));
  visit("model", "mlp_dim", m.mlp_dim, or_special(at_least(1), 0, "the model's own"));
  visit("model", "depths", m.depths, at_least(1));
  visit("model", "widths", m.widths, at_least(1));
  visit("model", "stem_patch", m.stem_patch, or_special(at_least(1), 0, "the model's own"));
  visit("model", "drop_path", m.drop_path, or_special(half_open(0, 1), -1, "the model's own"));
  visit("model", "layer_scale", m.layer_scale, greater_than(0));
  visit("model", "sync_bn", m.sync_bn, any());
  visit("model", "bn_stats_sync", m.bn_stats_sync, one_of(setting_names<BnStatsSync>()));
}

template <typename Data, typename Visit>
void visit_data_fields(Data& d, Visit&& visit) {
  visit("data", "dataset", d.dataset,
        one_of({"fashion_mnist", "cifar10", "cifar100", "image_folder", "synthetic"}));
  visit("data", "root", d.root, any());
  visit("data", "batch_size", d.batch_size, at_least(1));
  visit("data", "eval_batch_size", d.eval_batch_size, at_least(1));
  visit("data", "workers", d.workers, or_special(at_least(0), -1, "auto"));
  visit("data", "prefetch_batches", d.prefetch_batches, at_least(1));
  visit("data", "gpu_input_pipeline", d.gpu_input_pipeline, any());
  visit("data", "shuffle", d.shuffle, any());
  visit("data", "drop_last", d.drop_last, any());
  visit("data", "random_crop_padding", d.random_crop_padding, at_least(0));
  visit("data", "hflip", d.hflip, any());
  visit("data", "normalize_mean", d.normalize_mean, any());
  visit("data", "normalize_std", d.normalize_std, greater_than(0));
  visit("data", "image_size", d.image_size, or_special(at_least(1), 0, "native"));
  visit("data", "synthetic_samples", d.synthetic_samples, at_least(1));
  visit("data", "synthetic_image_size", d.synthetic_image_size, at_least(1));
  visit("data", "synthetic_classes", d.synthetic_classes, at_least(2));
  visit("data", "bad_samples", d.bad_samples, one_of(setting_names<BadSamplePolicy>()));
  visit("data", "cache", d.cache, one_of(setting_names<CacheMode>()));
  visit("data", "cache_bytes", d.cache_bytes, or_special(at_least(0), -1, "a quarter of MemAvailable"));
  visit("data", "repeated_augmentations", d.repeated_augmentations, at_least(1));
}

template <typename Augment, typename Visit>
void visit_augment_fields(Augment& a, Visit&& visit) {
  visit("augment", "policy", a.policy, one_of(setting_names<AugmentPolicy>()));
  visit("augment", "randaugment_ops", a.randaugment_ops, at_least(0));
  visit("augment", "randaugment_magnitude", a.randaugment_magnitude, at_least(0));
  visit("augment", "magnitude_bins", a.magnitude_bins, at_least(2));
  visit("augment", "color_jitter", a.color_jitter, at_least(0));  // [] or 4 values: check_augment_keys
  visit("augment", "random_erasing", a.random_erasing, closed(0, 1));
  visit("augment", "erasing_scale", a.erasing_scale, exactly(2, open_closed(0, 1)));
  visit("augment", "erasing_ratio", a.erasing_ratio, exactly(2, greater_than(0)));
  visit("augment", "erasing_value", a.erasing_value, one_of(setting_names<ErasingValue>()));
}

template <typename Train, typename Visit>
void visit_train_fields(Train& t, Visit&& visit) {
  visit("train", "epochs", t.epochs, at_least(1));
  visit("train", "max_steps", t.max_steps, or_special(at_least(1), 0, "no limit"));
  visit("train", "device", t.device, one_of(setting_names<DeviceChoice>()));
  visit("train", "precision", t.precision, one_of(setting_names<Precision>()));
  visit("train", "deterministic", t.deterministic, any());
  visit("train", "cuda_graph", t.cuda_graph, any());
  visit("train", "cudnn_fusion", t.cudnn_fusion, any());
  visit("train", "cudnn_batchnorm", t.cudnn_batchnorm, any());
  visit("train", "fused_attention", t.fused_attention, any());
  visit("train", "seed", t.seed, at_least(0));
  visit("train", "grad_accum_steps", t.grad_accum_steps, at_least(1));
  visit("train", "label_smoothing", t.label_smoothing, half_open(0, 1));
  visit("train", "loss", t.loss, one_of(setting_names<LossKind>()));
  visit("train", "loss_scale_init", t.loss_scale_init, open_closed(0, 1e38));
  visit("train", "log_every_steps", t.log_every_steps, at_least(1));
  visit("train", "eval_every_epochs", t.eval_every_epochs, at_least(0));
  visit("train", "target_accuracy", t.target_accuracy, closed(0, 1));
  visit("train", "run_dir", t.run_dir, any());
}

template <typename Optim, typename Visit>
void visit_optim_fields(Optim& o, Visit&& visit) {
  visit("optim", "name", o.name, one_of(setting_names<OptimizerKind>()));
  visit("optim", "lr", o.lr, greater_than(0));
  visit("optim", "momentum", o.momentum, half_open(0, 1));
  visit("optim", "nesterov", o.nesterov, any());
  visit("optim", "weight_decay", o.weight_decay, at_least(0));
  visit("optim", "no_decay_bn_bias", o.no_decay_bn_bias, any());
  visit("optim", "betas", o.betas, exactly(2, half_open(0, 1)));
  visit("optim", "eps", o.eps, greater_than(0));
  visit("optim", "clip_grad_norm", o.clip_grad_norm, at_least(0));
  visit("optim", "lr_scaling", o.lr_scaling, one_of(setting_names<LrScaling>()));
  visit("optim", "base_batch_size", o.base_batch_size, at_least(1));
  visit("optim", "layer_decay", o.layer_decay, or_special(open_closed(0, 1), 0, "off"));
  visit("optim", "max_grad_norm", o.max_grad_norm, at_least(0));
  visit("optim", "trust_clip", o.trust_clip, any());
  visit("optim", "trust_coeff", o.trust_coeff, greater_than(0));
  visit("optim", "dampening", o.dampening, half_open(0, 1));
}

template <typename Schedule, typename Visit>
void visit_schedule_fields(Schedule& s, Visit&& visit) {
  visit("schedule", "name", s.name, one_of(setting_names<ScheduleKind>()));
  visit("schedule", "warmup_epochs", s.warmup_epochs, at_least(0));
  visit("schedule", "warmup_start_factor", s.warmup_start_factor, open_closed(0, 1));
  visit("schedule", "step_epochs", s.step_epochs, at_least(1));
  visit("schedule", "milestones", s.milestones, increasing(at_least(1)));
  visit("schedule", "gamma", s.gamma, greater_than(0));
  visit("schedule", "min_lr_factor", s.min_lr_factor, closed(0, 1));
}

template <typename Dist, typename Visit>
void visit_dist_fields(Dist& d, Visit&& visit) {
  visit("dist", "backend", d.backend,
        with_alias(one_of(setting_names<CommBackendChoice>()),
                   {"gloo", "tcp", "the CPU communicator is our own TCP code, not Gloo (dist/README.md)"}));
  visit("dist", "timeout_seconds", d.timeout_seconds, at_least(1));
  visit("dist", "zero_stage", d.zero_stage, closed(0, 2));
  visit("dist", "nccl_debug", d.nccl_debug, one_of({"", "VERSION", "WARN", "INFO", "TRACE"}));
  visit("dist", "socket_ifname", d.socket_ifname, any());
  visit("dist", "cuda_graph", d.cuda_graph, any());
}

template <typename Checkpoint, typename Visit>
void visit_checkpoint_fields(Checkpoint& k, Visit&& visit) {
  visit("checkpoint", "dir", k.dir, any());
  visit("checkpoint", "every_steps", k.every_steps, at_least(0));
  visit("checkpoint", "every_epochs", k.every_epochs, at_least(0));
  visit("checkpoint", "keep_last", k.keep_last, at_least(1));
  visit("checkpoint", "save_final", k.save_final, any());
  visit("checkpoint", "save_initial", k.save_initial, any());
  visit("checkpoint", "keep_best", k.keep_best, at_least(0));
  visit("checkpoint", "keep_best_on", k.keep_best_on, one_of(setting_names<KeepBestOn>()));
  visit("checkpoint", "on_signal", k.on_signal, any());
  visit("checkpoint", "allow_world_size_change", k.allow_world_size_change, any());
  visit("checkpoint", "on_error", k.on_error, one_of(setting_names<OnCheckpointError>()));
}

template <typename Metrics, typename Visit>
void visit_metrics_fields(Metrics& m, Visit&& visit) {
  visit("metrics", "port", m.port, closed(0, 65535));
  visit("metrics", "host_label", m.host_label, any());
  visit("metrics", "bind", m.bind, any());
  visit("metrics", "run", m.run, any());
}

template <typename Mixup, typename Visit>
void visit_mixup_fields(Mixup& m, Visit&& visit) {
  visit("mixup", "mixup_alpha", m.mixup_alpha, at_least(0));
  visit("mixup", "cutmix_alpha", m.cutmix_alpha, at_least(0));
  visit("mixup", "prob", m.prob, closed(0, 1));
  visit("mixup", "switch_prob", m.switch_prob, closed(0, 1));
}

template <typename Ema, typename Visit>
void visit_ema_fields(Ema& e, Visit&& visit) {
  visit("ema", "enabled", e.enabled, any());
  visit("ema", "decay", e.decay, half_open(0, 1));
  visit("ema", "warmup", e.warmup, any());
  visit("ema", "warmup_gamma", e.warmup_gamma, greater_than(0));
  visit("ema", "warmup_power", e.warmup_power, greater_than(0));
  visit("ema", "min_decay", e.min_decay, half_open(0, 1));
  visit("ema", "every_steps", e.every_steps, at_least(1));
  visit("ema", "average_buffers", e.average_buffers, any());
}

// Calls visit(section, key, member, rule) for every key in schema (and file) order. C is Config or
// const Config, so one list serves readers and writers.
template <typename C, typename Visit>
void visit_fields(C& c, Visit&& visit) {
  visit_model_fields(c.model, visit);
  visit_data_fields(c.data, visit);
  visit_augment_fields(c.augment, visit);
  visit_train_fields(c.train, visit);
  visit_optim_fields(c.optim, visit);
  visit_schedule_fields(c.schedule, visit);
  visit_dist_fields(c.dist, visit);
  visit_checkpoint_fields(c.checkpoint, visit);
  visit_metrics_fields(c.metrics, visit);
  visit_mixup_fields(c.mixup, visit);
  visit_ema_fields(c.ema, visit);
}

}  // namespace trainer::config_schema

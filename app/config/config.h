#pragma once
// The typed training configuration: one struct per TOML section, every key with its default.
// load_config() is the only way in: it parses the file, applies --set overrides, validates every key
// and remembers where each value came from, so that any later error about a setting (a missing
// dataset directory, say) can point at the line the user has to edit. configs/reference.toml documents
// every key; keep it, the structs below and the schema in config_schema.h in step.
#include <cstdint>
#include <ctime>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "app/config/settings.h"
#include "nn/amp/precision_policy.h"

namespace trainer {

struct ModelConfig {
  std::string name =
      "cnn";  // mlp | cnn | resnet18/34/50 | vit_b_16 | vit_s_16 | vit | convnext_tiny | convnext
  StemChoice stem = StemChoice::automatic;  // auto | imagenet | cifar; auto = cifar for images <= 64 px
  int num_classes = 0;                      // 0 = from the dataset
  int in_channels = 0;                      // 0 = from the dataset
  double dropout = 0.0;                     // [0, 1)
  // Weights to start from (fine-tuning): a safetensors file with torchvision's names; empty = none.
  std::string pretrained;
  // Fine-tuning: parameter-name prefixes ("layer1", "layer2.0") or "backbone" (all but the classifier
  // head) left untrained for the first freeze_epochs epochs (0 = the whole run); app/run/freeze.h.
  std::vector<std::string> freeze;
  int freeze_epochs = 0;
  // The small ViT ("vit"; 0 = its default): patch size, encoder layers, heads, width, MLP width.
  int patch_size = 0;
  int depth = 0;
  int heads = 0;
  int width = 0;
  int mlp_dim = 0;
  // ConvNeXt: blocks and channels per stage ("convnext"; empty = its default), the stem's patch size
  // (0 = the model's), stochastic depth's largest probability (-1 = the model's), the initial layer scale.
  std::vector<int> depths;
  std::vector<int> widths;
  int stem_patch = 0;
  double drop_path = -1.0;
  double layer_scale = 1e-6;
  bool sync_bn = false;                              // all-reduce BatchNorm batch statistics across ranks
  BnStatsSync bn_stats_sync = BnStatsSync::average;  // average | none: running stats at checkpoint/eval time
  bool operator==(const ModelConfig&) const = default;
};

struct DataConfig {
  std::string dataset = "fashion_mnist";  // fashion_mnist | cifar10 | cifar100 | image_folder | synthetic
  std::string root;                       // empty = the dataset's default directory
  int batch_size = 128;                   // per rank
  int eval_batch_size = 512;
  int workers = -1;  // -1 = auto
  int prefetch_batches = 4;
  bool gpu_input_pipeline = true;  // pinned batches, copy stream, normalisation on the GPU
  bool shuffle = true;
  bool drop_last = true;
  int random_crop_padding = 0;
  bool hflip = false;
  std::vector<double> normalize_mean;  // empty = dataset default
  std::vector<double> normalize_std;   // same length as normalize_mean
  int image_size = 0;                  // 0 = native
  int synthetic_samples = 50000;
  int synthetic_image_size = 32;
  int synthetic_classes = 10;
  BadSamplePolicy bad_samples = BadSamplePolicy::error;  // error | skip: what an unreadable image does
  CacheMode cache = CacheMode::none;  // none | encoded | decoded: image_folder files kept in memory
  std::int64_t cache_bytes = -1;      // per node; -1 = a quarter of MemAvailable
  int repeated_augmentations = 1;     // DeiT's RASampler: each sample k times per epoch; 1 = off
  bool operator==(const DataConfig&) const = default;
};

// [augment]: training augmentations on the uint8 images in the loader threads (data/augment/), after
// data.random_crop_padding / the random resized crop and data.hflip. Training split only.
struct AugmentSection {
  AugmentPolicy policy = AugmentPolicy::none;  // none | randaugment | trivialaugment | autoaugment
  int randaugment_ops = 2;                     // RandAugment's num_ops
  int randaugment_magnitude = 9;               // a bin in [0, magnitude_bins)
  int magnitude_bins = 31;                     // RandAugment's and TrivialAugmentWide's num_magnitude_bins
  std::vector<double> color_jitter;            // [] = off, or [brightness, contrast, saturation, hue]
  double random_erasing = 0.0;                 // probability; 0 = off
  std::vector<double> erasing_scale = {0.02, 0.33};  // area fraction, [min, max]
  std::vector<double> erasing_ratio = {0.3, 3.3};    // aspect ratio h / w, [min, max]
  ErasingValue erasing_value = ErasingValue::zero;   // zero | random
  bool operator==(const AugmentSection&) const = default;
};

struct TrainConfig {
  int epochs = 4;
  int max_steps = 0;                              // 0 = no limit
  DeviceChoice device = DeviceChoice::automatic;  // auto | cpu | cuda
  Precision precision = Precision::fp32;          // TOML: fp32 | tf32 | bf16 | fp16
  bool deterministic = false;   // bitwise reproducible GPU runs (BackendOptions::deterministic)
  bool cuda_graph = true;       // replay each full-size step as a CUDA graph where the run allows it
  bool cudnn_fusion = false;    // BatchNorm statistics in the convolutions' epilogues where faster
  bool cudnn_batchnorm = true;  // BatchNorm's backward through cuDNN's NHWC batch-norm kernels
  bool fused_attention = true;  // attention through cuDNN's fused flash-attention graphs (ViTs)
  std::int64_t seed = 0;
  int grad_accum_steps = 1;
  double label_smoothing = 0.0;
  LossKind loss = LossKind::cross_entropy;  // cross_entropy | bce; training only
  double loss_scale_init = 65536.0;  // fp16: the dynamic loss scale's first value (GradScaler's init_scale)
  int log_every_steps = 50;
  int eval_every_epochs = 1;  // 0 = only at the end
  // Stop after the evaluation that reaches this test top-1 (0 = off): `trainer bench --to-accuracy`.
  double target_accuracy = 0.0;
  std::string run_dir;  // empty = default_run_dir()
  bool operator==(const TrainConfig&) const = default;
};

struct OptimConfig {
  OptimizerKind name = OptimizerKind::sgd;  // sgd | adamw | lamb | lars
  double lr = 0.1;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 5e-4;
  bool no_decay_bn_bias = true;  // no weight decay on BatchNorm parameters and biases
  std::vector<double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double clip_grad_norm = 0.0;             // 0 = off
  LrScaling lr_scaling = LrScaling::none;  // none | linear
  int base_batch_size = 128;               // linear scaling: lr * global_batch / base_batch_size
  double layer_decay = 0.0;                // (0, 1]: layer-wise LR decay (timm's); 0 = off
  double max_grad_norm = 1.0;              // lamb: its global gradient-norm clipping; 0 = off
  bool trust_clip = false;                 // lamb: LAMBC (trust ratio <= 1); lars: LARC
  double trust_coeff = 1e-3;               // lars
  double dampening = 0.0;                  // lars: momentum dampening
  bool operator==(const OptimConfig&) const = default;
};

// The exponential moving average of the weights (timm's ModelEmaV3; nn/optim/ema.h).
struct EmaConfig {
  bool enabled = false;
  double decay = 0.9999;  // [0, 1); 0 = off
  bool warmup = false;    // ModelEmaV3's warm-up of the decay
  double warmup_gamma = 1.0;
  double warmup_power = 2.0 / 3.0;
  double min_decay = 0.0;
  int every_steps = 1;
  bool average_buffers = true;  // false: BatchNorm's running statistics are copied
  bool active() const { return enabled && decay > 0.0; }
  bool operator==(const EmaConfig&) const = default;
};

struct ScheduleConfig {
  ScheduleKind name = ScheduleKind::cosine;  // constant | step | multistep | cosine | onecycle
  double warmup_epochs = 0.0;
  double warmup_start_factor = 0.1;
  int step_epochs = 30;
  std::vector<int> milestones;  // epochs, strictly increasing
  double gamma = 0.1;
  double min_lr_factor = 0.0;
  bool operator==(const ScheduleConfig&) const = default;
};

struct DistConfig {
  CommBackendChoice backend = CommBackendChoice::automatic;  // auto | nccl | tcp ("gloo" is read as "tcp")
  int timeout_seconds = 300;
  int zero_stage = 0;         // 0..2
  std::string nccl_debug;     // NCCL_DEBUG for this run ("" = leave the environment alone)
  std::string socket_ifname;  // NCCL_SOCKET_IFNAME for this run ("" = leave the environment alone)
  bool cuda_graph = false;    // several ranks: capture the step with its all-reduce (train.cuda_graph too)
  bool operator==(const DistConfig&) const = default;
};

struct CheckpointConfig {
  std::string dir;  // empty = <run_dir>/checkpoints
  int every_steps = 0;
  int every_epochs = 1;
  int keep_last = 3;
  bool save_final = true;
  bool save_initial = false;                    // initial.safetensors before a fresh run's step 1
  int keep_best = 0;                            // also keep the N checkpoints with the best test top-1
  KeepBestOn keep_best_on = KeepBestOn::model;  // whose top-1 keep_best ranks: model | ema
  bool on_signal = true;                        // SIGINT/SIGTERM write a checkpoint before exiting
  bool allow_world_size_change = false;         // resume at another world size, remapped by samples seen
  // a periodic checkpoint not written (full disk...): continue | stop
  OnCheckpointError on_error = OnCheckpointError::keep_training;
  bool operator==(const CheckpointConfig&) const = default;
};

// Mixup / CutMix per batch with timm's semantics (nn/batch_mix.h); off while both alphas are 0.
struct MixupConfig {
  double mixup_alpha = 0.0;
  double cutmix_alpha = 0.0;
  double prob = 1.0;         // of mixing a batch
  double switch_prob = 0.5;  // of CutMix rather than Mixup when both alphas are set
  bool operator==(const MixupConfig&) const = default;
};

struct MetricsConfig {
  int port = 0;            // 0 = off; rank r serves on port + LOCAL_RANK
  std::string host_label;  // empty = hostname
  // The address the exporter listens on: loopback, since a training host's metrics need not be public;
  // "0.0.0.0" for a Prometheus server on another host.
  std::string bind = "127.0.0.1";
  std::string run;  // the run label on every series; empty = the run directory's name
  bool operator==(const MetricsConfig&) const = default;
};

struct Config {
  ModelConfig model;
  DataConfig data;
  AugmentSection augment;
  TrainConfig train;
  OptimConfig optim;
  ScheduleConfig schedule;
  DistConfig dist;
  CheckpointConfig checkpoint;
  MetricsConfig metrics;
  MixupConfig mixup;
  EmaConfig ema;

  // Provenance, filled by load_config. Not part of the settings, so operator== ignores it.
  std::string source_path;  // the config file as given on the command line
  // dotted key -> where its value came from: "configs/x.toml:7:10", "--set train.epochs=3" or
  // "(default)". Every schema key has an entry after load_config.
  std::map<std::string, std::string> origin;
  // What load_config accepted but the user should change (an old value's name), each with where it was
  // written. config_table() ends with them, so the run log shows each once.
  std::vector<std::string> warnings;

  // Equal settings, wherever they came from.
  bool operator==(const Config& other) const;
};

// Every configuration error: the message starts with where the offending value was written
// ("file:line:column: ", "--set key=value: ") and names the dotted key.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses `path`, applies `overrides` ("section.key=value", later ones win) and validates. The value
// of an override is parsed as TOML; one that does not parse (or any value of a string key that is not
// a quoted string) is taken verbatim as a string, so `optim.name=adamw` works. Throws ConfigError
// listing every problem found, one per line. An empty `path` means no file: defaults plus overrides.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// An error about `dotted_key` that points at where its value came from, for checks made after
// loading (e.g. "configs/x.toml:5:8: data.root: directory '/nope' does not exist").
ConfigError config_error_at(const Config& config, const std::string& dotted_key, const std::string& message);

// The resolved configuration as TOML: every section and key in schema order. load_config() of the
// result gives back an equal Config; it is what checkpoints store.
std::string config_to_toml(const Config& config);

// config_to_toml for people to read and edit (`trainer config --format toml`): the same keys and values,
// a special value followed by its meaning ("workers = -1  # auto"), and no line naming the file it was
// loaded from, so printing its own output again gives the same text.
std::string config_to_editable_toml(const Config& config);

// A human table, one line per key: "section.key  value  [source]", source being the file position,
// "default" or "--set". Printed by rank 0 at start-up and by `trainer config`.
std::string config_table(const Config& config);

// Every dotted key of the schema, in schema order.
std::vector<std::string> config_keys();

// The run directory used when train.run_dir is empty: "runs/<config file stem>-<YYYYmmdd-HHMMSS>"
// (local time). Decide it once, on rank 0, and share it: ranks start at different seconds.
std::string default_run_dir(const Config& config, std::time_t now);

}  // namespace trainer
